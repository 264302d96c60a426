"""Rules, findings and suppression comments: what the command line needs
without importing LibCST (see ``codemods.registry``)."""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, Iterable, Optional, Tuple


@dataclass(frozen=True)
class Rule:
    """One rule: a stable code, a name and its documentation.

    ``before``/``after`` is the example that ``xlaport explain`` prints and the
    tests run: the codemod must turn ``before`` into ``after`` (for a rule that
    only reports, ``after`` is None and ``before`` must be reported).  ``valid``
    holds code the rule must leave alone and not report.
    """

    code: str
    name: str
    summary: str
    why: str
    before: str
    after: Optional[str]
    valid: Tuple[str, ...] = ()
    options: Tuple[Tuple[str, str], ...] = ()  # (option, what it does)
    example_options: Tuple[Tuple[str, object], ...] = ()  # options the example runs with
    example_target: str = ""  # the target the example converts to (default: the default target)
    # rules whose rewrites this one judges: selected with it when its examples run
    requires: Tuple[str, ...] = ()
    # its rewrite changes what the program computes: made only when asked
    # (``--unsafe-fixes``, Ruff's name; option ``unsafe_fixes``), else reported
    unsafe: bool = False

    @property
    def fix(self) -> bool:
        return self.after is not None

    @property
    def fixes_by_default(self) -> bool:
        """``convert`` rewrites it unless told otherwise (not an unsafe fix)."""
        return self.fix and not self.unsafe


@dataclass
class Finding:
    """A change made (``fix=True``) or a problem reported (``fix=False``)."""

    code: str
    message: str
    line: int
    col: int  # 1-based, like ruff
    fix: bool
    hot: Optional[bool] = None  # host reads: runs every step?
    path: str = ""
    cell: Optional[int] = None  # notebooks: 1-based cell number
    end_line: int = 0  # where the flagged code ends (0: not known)
    end_col: int = 0
    # other lines of the same file the finding is about, as (first, last)
    # spans: the callee's line a trap is reached through, the loop a value
    # grows in (SARIF's relatedLocations; verify ties run-time events to them)
    related: Tuple[Tuple[int, int], ...] = ()
    # a problem reported (``fix=False``) that ``--unsafe-fixes`` would
    # rewrite: what Ruff's summary counts as a hidden fix
    unsafe_fix: bool = False

    def map_lines(self, move: Callable[[int], int]) -> None:
        """Move every line the finding holds through ``move`` (a line map),
        and its columns where the map says a line moved in or out
        (``xlaport.linemap.LineMap.indent_delta``)."""
        shift = getattr(move, "indent_delta", None)
        end = getattr(move, "end", None)
        if shift is not None:
            self.col = max(1, self.col + shift(self.line))
        self.line = move(self.line)
        if self.end_line:
            moved = end(self.end_line, self.end_col) if end is not None else (move(self.end_line), self.end_col)
            # (never before the start: a span of added lines alone)
            self.end_line, self.end_col = max(moved, (self.line, self.col))
        self.related = tuple((move(a), max(move(a), move(b))) for a, b in self.related)

    def covers(self, line: int) -> bool:
        """``line`` is the finding's own or one of its related lines."""
        return line == self.line or any(a <= line <= b for a, b in self.related)

    def as_dict(self) -> Dict[str, object]:
        d: Dict[str, object] = {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "message": self.message,
            "fix": self.fix,
        }
        if self.hot is not None:
            d["hot"] = self.hot
        if self.cell is not None:
            d["cell"] = self.cell
        if self.end_line:
            d["end_line"] = self.end_line
            d["end_col"] = self.end_col
        if self.related:
            d["related"] = [list(span) for span in self.related]
        if self.unsafe_fix:
            d["unsafe_fix"] = True
        return d


# ---------------------------------------------------------------- suppressions

_SUPPRESS_RE = re.compile(r"#\s*xlaport:\s*ignore(?!-file)(?:\[([A-Za-z0-9_,\s]*)\])?")
# flake8/Ruff style, for xlaport's own codes only: `# noqa: XLA101, XLA4`
_NOQA_RE = re.compile(r"#\s*noqa\s*:\s*((?:XLA\d*[\s,]*)+)", re.IGNORECASE)
# the whole file: `# xlaport: ignore-file` or `# xlaport: ignore-file[XLA3]`
FILE_SUPPRESS_RE = re.compile(rb"#\s*xlaport:\s*ignore-file(?:\[([A-Za-z0-9_,\s]*)\])?")
ALL = "*"


def parse_suppressions(source: str) -> Dict[int, FrozenSet[str]]:
    """Map line number -> codes silenced there (``{"*"}`` for all).

    Reads real comments with ``tokenize`` so that the marker inside a string
    does not count.
    """
    if not (_SUPPRESS_RE.search(source) or _NOQA_RE.search(source)):
        return {}  # no comment can hold a marker (most files: a `# noqa: E501` is not one)
    result: Dict[int, FrozenSet[str]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return result
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        m = _SUPPRESS_RE.search(tok.string)
        noqa = _NOQA_RE.search(tok.string)
        if not (m or noqa):
            continue
        codes: FrozenSet[str] = frozenset()
        if m:
            codes = (
                frozenset(c.strip().upper() for c in m.group(1).split(",") if c.strip())
                if m.group(1) is not None
                else frozenset({ALL})
            )
        if noqa:
            codes |= frozenset(c.upper() for c in re.findall(r"XLA\d*", noqa.group(1), re.IGNORECASE))
        result[tok.start[0]] = result.get(tok.start[0], frozenset()) | codes
    return result


def file_suppressions(source: bytes) -> Optional[FrozenSet[str]]:
    """Codes silenced for the whole file by ``# xlaport: ignore-file[...]``
    (``{"*"}`` without a list), or None."""
    m = FILE_SUPPRESS_RE.search(source)
    if m is None:
        return None
    if m.group(1) is None:
        return frozenset({ALL})
    return frozenset(c.strip().upper() for c in m.group(1).decode().split(",") if c.strip())


def code_matches(code: str, patterns: Iterable[str]) -> bool:
    """True when a code is named by any pattern (a code, a prefix, or ALL)."""
    return any(p == ALL or code.startswith(p) for p in patterns)
