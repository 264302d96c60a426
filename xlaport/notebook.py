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
import hashlib
import json
import re
import uuid
import warnings
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from codemods.base import Finding
from xlaport.engine import Settings, SourceError, transform

_MAGIC_RE = re.compile(r"^([ \t]*)([%!].*|.*\?\?\s*)$")
# a line magic followed by Python: `%time y = model.cuda()`, `%timeit -n 3 f(x)`
_CODE_MAGIC_RE = re.compile(r"^([ \t]*)(%(?:time|timeit|prun)\b(?:[ \t]+-[A-Za-z]+(?:[ \t]*\d+)?)*[ \t]+)(\S.*)$")


class _Markers:
    """The lines xlaport puts into the joined program: a marker before each
    cell, a stand-in for each IPython line, a statement before the first
    cell (imports the conversion adds land above it).  Each carries a token
    that occurs in no cell, so no user text can be taken for one."""

    def __init__(self, texts: List[str]) -> None:
        joined = "\n".join(texts)
        token = uuid.uuid4().hex[:12]
        while token in joined:
            token = uuid.uuid4().hex[:12]
        self.cell = f"# xlaport-cell-{token} {{}}"
        self.cell_re = re.compile(rf"^# xlaport-cell-{token} (\d+)$", re.MULTILINE)
        self.mask = f"__xlaport_magic_{token}_{{}}__"
        self.unmask_re = re.compile(rf"^([ \t]*)__xlaport_magic_{token}_(\d+)__$", re.MULTILINE)
        self.head = f"__xlaport_notebook_{token}__ = None\n"
        # the code after a line magic stays code; its magic waits in a comment
        self.prefix = f"  # __xlaport_prefix_{token}_{{}}__"
        self.prefix_re = re.compile(rf"^([ \t]*)(.*?)[ \t]*# __xlaport_prefix_{token}_(\d+)__$", re.MULTILINE)

    def hide(self, source: str) -> Tuple[str, List[str]]:
        saved: List[str] = []
        lines = []
        for line in source.split("\n"):
            code = _CODE_MAGIC_RE.match(line)
            if code and _is_python(code.group(3)):
                lines.append(code.group(1) + code.group(3) + self.prefix.format(len(saved)))
                saved.append(code.group(2))
                continue
            m = _MAGIC_RE.match(line)
            if m:
                lines.append(m.group(1) + self.mask.format(len(saved)))
                saved.append(m.group(2))
            else:
                lines.append(line)
        return "\n".join(lines), saved

    def show(self, source: str, saved: List[str]) -> str:
        source = self.prefix_re.sub(lambda m: m.group(1) + saved[int(m.group(3))] + m.group(2), source)
        return self.unmask_re.sub(lambda m: m.group(1) + saved[int(m.group(2))], source)


def _is_python(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except SyntaxError:
        return False


Result = Tuple[bytes, List[Finding], List[str], Tuple[int, int]]


def _read(data: bytes):
    import nbformat  # imported here: only notebooks pay for it

    try:
        with warnings.catch_warnings():  # (nbformat warns about ids and versions: not ours to print)
            warnings.simplefilter("ignore")
            return nbformat.reads(data.decode("utf-8"), as_version=nbformat.NO_CONVERT)
    except Exception as exc:  # nbformat raises many kinds
        raise SourceError(f"not a readable notebook: {exc}") from None


def _source(cell) -> str:
    return cell.source if isinstance(cell.source, str) else "".join(cell.source)


def _code_cells(nb, markers: "_Markers"):
    """(cell number, cell, source, source with magics masked, the magics)."""
    for index, cell in enumerate(nb.cells, start=1):
        if cell.get("cell_type") == "code":
            source = _source(cell)
            masked, saved = markers.hide(source)
            yield index, cell, source, masked, saved


def transform_notebook(data: bytes, settings: Settings, filename: str = "") -> Result:
    """Returns (new bytes, findings with ``cell`` set, per-cell problems,
    CUDA references found and left)."""
    nb = _read(data)
    markers = _Markers([_source(c) for c in nb.cells])
    settings = replace(settings, changed_lines=None)  # --diff-base: a changed notebook is read whole
    problems: List[str] = []
    cells = []  # (cell index, cell, original source, masked-out magics, first program line)
    parts: List[str] = [markers.head]
    line = 2
    for index, cell, source, masked, saved in _code_cells(nb, markers):
        try:
            ast.parse(masked)
        except SyntaxError as exc:
            where = f", line {exc.lineno}" if exc.lineno else ""
            problems.append(f"cell {index}{where}: cannot parse: {exc.msg}")
            continue
        text = masked if masked.endswith("\n") else masked + "\n"
        parts.append(markers.cell.format(index) + "\n" + text)
        cells.append((index, cell, source, saved, line + 1))
        line += 1 + text.count("\n")
    if not cells:
        return data, [], problems, (0, 0)
    try:
        outcome = transform("".join(parts).encode("utf-8"), settings, filename)
    except SourceError:  # LibCST and ast disagree about some cell: one cell at a time
        return _cell_by_cell(data, nb, settings, filename, markers)
    findings = _place(outcome.findings, cells)
    new_text = outcome.code.decode("utf-8")
    split = _split(new_text, markers, [c[0] for c in cells])
    if split is None:
        problems.append("the converted program could not be cut back into its cells; the notebook is left as it is")
        return data, findings, problems, outcome.cuda
    added, segments = split
    new_sources: Dict[int, str] = {}
    for index, cell, source, saved, _ in cells:
        new = segments[index]
        new = new[1:] if new.startswith("\n") else new
        if not source.endswith("\n") and new.endswith("\n"):
            new = new[:-1]
        new = markers.show(new, saved)
        if not source.startswith("\n"):  # (its first statement went: the blank lines after it lead now)
            new = new.lstrip("\n")
        if new != source:
            new_sources[index] = new
    if not new_sources and not added.strip():
        return data, findings, problems, outcome.cuda
    return _write(data, new_sources, added.strip("\n")), findings, problems, outcome.cuda


def _split(text: str, markers: _Markers, expected: List[int]) -> Optional[Tuple[str, Dict[int, str]]]:
    """(what precedes the first cell, the text of each cell) of the converted
    program; None unless its markers are exactly the cells put in, in order,
    and the pieces join back into the program."""
    pieces = markers.cell_re.split(text)
    numbers = [int(n) for n in pieces[1::2]]
    if numbers != expected or pieces[0].count(markers.head) != 1:
        return None
    rebuilt = pieces[0] + "".join(markers.cell.format(n) + body for n, body in zip(numbers, pieces[2::2]))
    if rebuilt != text:
        return None
    return pieces[0].replace(markers.head, ""), dict(zip(numbers, pieces[2::2]))


def _place(findings: List[Finding], cells) -> List[Finding]:
    """Program lines -> (cell, line inside the cell)."""
    starts = [c[4] for c in cells]
    for f in findings:
        k = max(0, _last_at_or_before(starts, f.line))
        first = starts[k]
        f.cell = cells[k][0]
        f.map_lines(lambda line: max(1, line - first + 1))
    return findings


def _last_at_or_before(starts: List[int], line: int) -> int:
    import bisect

    return bisect.bisect_right(starts, line) - 1


def _write(data: bytes, sources: Dict[int, str], added: str) -> bytes:
    """The notebook file with new cell sources (by cell number) and, when
    ``added``, a new code cell before the first one -- edited in the JSON as
    it was read: key order, layout and every other field stay as they were,
    and the new cell has an ``id`` only where the notebook's version
    (nbformat >= 4.5) defines one."""
    raw = json.loads(data.decode("utf-8"))
    cells = raw["cells"]
    for number, text in sources.items():
        cell = cells[number - 1]
        cell["source"] = text.splitlines(keepends=True) if isinstance(cell.get("source"), list) else text
    if added:
        new: Dict[str, object] = {"cell_type": "code", "execution_count": None}
        if (raw.get("nbformat", 4), raw.get("nbformat_minor", 0)) >= (4, 5):
            # derived from the notebook, not drawn: converting it again writes the same bytes
            taken = {c.get("id") for c in cells}
            seed = hashlib.sha256(data + added.encode("utf-8"))
            token = seed.hexdigest()[:8]
            while token in taken:
                seed.update(b"\0")
                token = seed.hexdigest()[:8]
            new["id"] = token
        new["metadata"] = {}
        new["outputs"] = []
        first = next(c for c in cells if c.get("cell_type") == "code")
        new["source"] = added.splitlines(keepends=True) if isinstance(first.get("source"), list) else added
        cells.insert(cells.index(first), new)
    head = data.lstrip()[:64]
    indent: Optional[int] = None
    if head.startswith(b"{\n"):
        rest = head[2:]
        indent = len(rest) - len(rest.lstrip(b" "))
    text = json.dumps(raw, indent=indent, ensure_ascii=False)
    if data.endswith(b"\n") and not text.endswith("\n"):
        text += "\n"
    return text.encode("utf-8")


def _cell_by_cell(data: bytes, nb, settings: Settings, filename: str, markers: _Markers) -> Result:
    findings: List[Finding] = []
    problems: List[str] = []
    sources: Dict[int, str] = {}
    found = left = 0
    for index, cell, source, masked, saved in _code_cells(nb, markers):
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
        new = markers.show(outcome.code.decode("utf-8"), saved)
        if new != source:
            sources[index] = new
    return (_write(data, sources, "") if sources else data), findings, problems, (found, left)


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
