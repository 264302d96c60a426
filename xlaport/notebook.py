"""Jupyter notebooks: convert each code cell on its own.

IPython syntax (``%magic``, ``!shell``) is not Python; such lines are masked
before a cell is parsed and put back afterwards, byte for byte.  A cell that
still does not parse is reported with its number and left as it was.
"""

from __future__ import annotations

import json
import re
from typing import List, Tuple

from codemods.base import Finding
from xlaport.engine import Settings, SourceError, transform

_MAGIC_RE = re.compile(r"^([ \t]*)([%!].*|.*\?\?\s*)$")
_MASK = "__xlaport_magic_{}__"
_UNMASK_RE = re.compile(r"^([ \t]*)__xlaport_magic_(\d+)__$", re.MULTILINE)


def _mask(source: str) -> Tuple[str, List[str]]:
    saved: List[str] = []
    lines = []
    for line in source.split("\n"):
        m = _MAGIC_RE.match(line)
        if m:
            lines.append(m.group(1) + _MASK.format(len(saved)))
            saved.append(m.group(2))
        else:
            lines.append(line)
    return "\n".join(lines), saved


def _unmask(source: str, saved: List[str]) -> str:
    return _UNMASK_RE.sub(lambda m: m.group(1) + saved[int(m.group(2))], source)


def transform_notebook(
    data: bytes, settings: Settings, filename: str = ""
) -> Tuple[bytes, List[Finding], List[str], Tuple[int, int]]:
    """Returns (new bytes, findings with ``cell`` set, per-cell problems,
    CUDA references found and left)."""
    import nbformat  # imported here: only notebooks pay for it

    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=nbformat.NO_CONVERT)
    except Exception as exc:  # nbformat raises many kinds
        raise SourceError(f"not a readable notebook: {exc}") from None
    findings: List[Finding] = []
    problems: List[str] = []
    changed = False
    found = left = 0
    for index, cell in enumerate(nb.cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        masked, saved = _mask(source)
        try:
            outcome = transform(masked.encode("utf-8"), settings, filename)
        except SourceError as exc:
            where = f", line {exc.line}" if exc.line else ""
            problems.append(f"cell {index}{where}: {exc.message}")
            continue
        found, left = found + outcome.cuda[0], left + outcome.cuda[1]
        for f in outcome.findings:
            f.cell = index
            findings.append(f)
        new = _unmask(outcome.code.decode("utf-8"), saved)
        if new != source:
            cell.source = new
            changed = True
    if not changed:
        return data, findings, problems, (found, left)
    text = nbformat.writes(nb)
    # keep the file's own indentation style when it is the common 1-space one
    if not data.lstrip().startswith(b"{\n "):
        text = json.dumps(json.loads(text), ensure_ascii=False)
    if data.endswith(b"\n") and not text.endswith("\n"):
        text += "\n"
    return text.encode("utf-8"), findings, problems, (found, left)
