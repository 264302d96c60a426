"""Jupyter notebooks: the code cells, in order, converted as one program.

A notebook is one program run cell after cell: a name imported in cell 3 is
known in cell 5.  The code cells are joined (each after a marker line), the
program is converted once, and the result is cut back into the cells; imports
the conversion adds go into one new code cell before the first one.
IPython syntax (``%magic``, ``!shell``) is not Python; such lines are masked
before parsing and put back afterwards, byte for byte.  A cell that does not
parse is reported with its number, left as it was and kept out of the
program.  Findings carry their cell and the line inside it.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from dataclasses import replace
from typing import List, Optional, Tuple

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


_CELL = "# xlaport-cell {}"
# A statement before the first cell: imports the conversion adds land above it
# (a module's leading comments are its header, which imports go below).
_HEAD = "__xlaport_notebook__ = None\n"
_CELL_RE = re.compile(r"^# xlaport-cell (\d+)$", re.MULTILINE)

Result = Tuple[bytes, List[Finding], List[str], Tuple[int, int]]


def _read(data: bytes):
    import nbformat  # imported here: only notebooks pay for it

    try:
        return nbformat.reads(data.decode("utf-8"), as_version=nbformat.NO_CONVERT)
    except Exception as exc:  # nbformat raises many kinds
        raise SourceError(f"not a readable notebook: {exc}") from None


def _source(cell) -> str:
    return cell.source if isinstance(cell.source, str) else "".join(cell.source)


def _code_cells(nb):
    """(cell number, cell, source, source with magics masked, the magics)."""
    for index, cell in enumerate(nb.cells, start=1):
        if cell.get("cell_type") == "code":
            source = _source(cell)
            masked, saved = _mask(source)
            yield index, cell, source, masked, saved


def transform_notebook(data: bytes, settings: Settings, filename: str = "") -> Result:
    """Returns (new bytes, findings with ``cell`` set, per-cell problems,
    CUDA references found and left)."""
    nb = _read(data)
    settings = replace(settings, changed_lines=None)  # --diff-base: a changed notebook is read whole
    problems: List[str] = []
    cells = []  # (cell index, cell, original source, masked-out magics, first program line)
    parts: List[str] = [_HEAD]
    line = 2
    for index, cell, source, masked, saved in _code_cells(nb):
        try:
            ast.parse(masked)
        except SyntaxError as exc:
            where = f", line {exc.lineno}" if exc.lineno else ""
            problems.append(f"cell {index}{where}: cannot parse: {exc.msg}")
            continue
        text = masked if masked.endswith("\n") else masked + "\n"
        parts.append(_CELL.format(index) + "\n" + text)
        cells.append((index, cell, source, saved, line + 1))
        line += 1 + text.count("\n")
    if not cells:
        return data, [], problems, (0, 0)
    try:
        outcome = transform("".join(parts).encode("utf-8"), settings, filename)
    except SourceError:  # LibCST and ast disagree about some cell: one cell at a time
        return _cell_by_cell(data, nb, settings, filename)
    findings = _place(outcome.findings, cells)
    new_text = outcome.code.decode("utf-8")
    pieces = _CELL_RE.split(new_text)
    added, segments = pieces[0].replace(_HEAD, ""), dict(zip(map(int, pieces[1::2]), pieces[2::2]))
    changed = False
    for index, cell, source, saved, _ in cells:
        new = segments.get(index)
        if new is None:
            continue
        new = new[1:] if new.startswith("\n") else new
        if not source.endswith("\n") and new.endswith("\n"):
            new = new[:-1]
        new = _unmask(new, saved)
        if new != source:
            cell.source = new
            changed = True
    if added.strip():
        import nbformat

        first = next(k for k, c in enumerate(nb.cells) if c.get("cell_type") == "code")
        nb.cells.insert(first, nbformat.v4.new_code_cell(added.strip("\n")))
        changed = True
    if not changed:
        return data, findings, problems, outcome.cuda
    return _write(nb, data), findings, problems, outcome.cuda


def _place(findings: List[Finding], cells) -> List[Finding]:
    """Program lines -> (cell, line inside the cell)."""
    starts = [c[4] for c in cells]
    for f in findings:
        k = max(0, _last_at_or_before(starts, f.line))
        first = starts[k]
        f.cell = cells[k][0]
        f.line = max(1, f.line - first + 1)
        if f.end_line:
            f.end_line = max(f.line, f.end_line - first + 1)
    return findings


def _last_at_or_before(starts: List[int], line: int) -> int:
    import bisect

    return bisect.bisect_right(starts, line) - 1


def _write(nb, data: bytes) -> bytes:
    import nbformat

    text = nbformat.writes(nb)
    # keep the file's own indentation style when it is the common 1-space one
    if not data.lstrip().startswith(b"{\n "):
        text = json.dumps(json.loads(text), ensure_ascii=False)
    if data.endswith(b"\n") and not text.endswith("\n"):
        text += "\n"
    return text.encode("utf-8")


def _cell_by_cell(data: bytes, nb, settings: Settings, filename: str) -> Result:
    findings: List[Finding] = []
    problems: List[str] = []
    changed = False
    found = left = 0
    for index, cell, source, masked, saved in _code_cells(nb):
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
    return (_write(nb, data) if changed else data), findings, problems, (found, left)


def file_line(data: bytes, cell: int, line: int) -> int:
    """The line of the notebook *file* that holds ``line`` of cell number
    ``cell``, for annotations that point into the file (GitHub, SARIF): the
    cell's ``"source": [`` line plus ``line`` when the JSON is laid out one
    source line per JSON line (as Jupyter writes it); else the key's line."""
    text = data.decode("utf-8", "replace").splitlines()
    starts = [k for k, t in enumerate(text) if t.lstrip().startswith('"cell_type":')]
    if not starts:
        return 1
    indent = len(text[starts[0]]) - len(text[starts[0]].lstrip())
    keys = [k for k, t in enumerate(text)
            if t.startswith(" " * indent + '"source":') and len(t) - len(t.lstrip()) == indent]
    if cell - 1 >= len(keys) or len(keys) != len(starts):
        return 1
    k = keys[cell - 1]
    return k + 1 + (line if text[k].rstrip().endswith("[") else 0)


def cell_diff(old: bytes, new: bytes, path: str) -> Optional[str]:
    """A unified diff per changed code cell (``path:cell N``), not of the JSON."""
    try:
        before = [(k, c) for k, c in enumerate(_read(old).cells, start=1) if c.get("cell_type") == "code"]
        after = [c for c in _read(new).cells if c.get("cell_type") == "code"]
    except SourceError:
        return None
    out: List[str] = []
    shift = len(after) - len(before)
    if shift not in (0, 1):
        return None
    pairs = [("", _source(after[0]), "/dev/null", f"b/{path}:new cell (added imports)")] if shift else []
    for k, (number, cell) in enumerate(before):
        pairs.append((_source(cell), _source(after[k + shift]), f"a/{path}:cell {number}", f"b/{path}:cell {number}"))
    for a, b, name_a, name_b in pairs:
        if a != b:
            lines = difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                         fromfile=name_a, tofile=name_b)
            out += [x if x.endswith("\n") else x + "\n" for x in lines]
    return "".join(out)
