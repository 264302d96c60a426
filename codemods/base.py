"""What every xlaport codemod shares: rule metadata, findings, suppressions.

A *rule* is a stable code (``XLA101``) with a name and three-part docs (what it
does, why it matters on XLA, an example before/after).  A *codemod* is one
LibCST transform for one concern (devices, progress bars, loops, host reads);
it owns the rules of that concern and checks each rule's code before it
rewrites or reports anything, so ``--select``/``--ignore`` and suppression
comments work per rule.

Findings go to ``context.scratch[FINDINGS_KEY]`` so that both xlaport's engine
and LibCST's own runner (``python -m libcst.tool codemod``) can run these
classes unchanged.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import (
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from codemods.target import DEFAULT_TARGET, Import, Target, get_target

FINDINGS_KEY = "xlaport.findings"
SOURCE_KEY = "xlaport.source"
SELECT_KEY = "xlaport.select"
OPTIONS_KEY = "xlaport.options"
TARGET_KEY = "xlaport.target"


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

    @property
    def fix(self) -> bool:
        return self.after is not None


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
        return d


# ---------------------------------------------------------------- suppressions

_SUPPRESS_RE = re.compile(r"#\s*xlaport:\s*ignore(?:\[([A-Za-z0-9_,\s]*)\])?")
ALL = "*"


def parse_suppressions(source: str) -> Dict[int, FrozenSet[str]]:
    """Map line number -> codes silenced there (``{"*"}`` for all).

    Reads real comments with ``tokenize`` so that the marker inside a string
    does not count.
    """
    if "xlaport:" not in source:
        return {}
    result: Dict[int, FrozenSet[str]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return result
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        m = _SUPPRESS_RE.search(tok.string)
        if not m:
            continue
        codes = (
            frozenset(c.strip().upper() for c in m.group(1).split(",") if c.strip())
            if m.group(1) is not None
            else frozenset({ALL})
        )
        result[tok.start[0]] = result.get(tok.start[0], frozenset()) | codes
    return result


def code_matches(code: str, patterns: Iterable[str]) -> bool:
    """True when a code is named by any pattern (a code, a prefix, or ALL)."""
    return any(p == ALL or code.startswith(p) for p in patterns)


# ---------------------------------------------------------------- the base class


class XlaCodemod(VisitorBasedCodemodCommand):
    """Base class for xlaport codemods.

    Subclasses set ``DESCRIPTION`` (one line), ``RULES`` and ``TRIGGERS``
    (byte strings; a file that contains none of them cannot need this codemod
    and is skipped before it is parsed).
    """

    DESCRIPTION: str = ""
    RULES: Tuple[Rule, ...] = ()
    TRIGGERS: Tuple[bytes, ...] = ()
    METADATA_DEPENDENCIES = (
        PositionProvider,
        QualifiedNameProvider,
        ParentNodeProvider,
        ScopeProvider,
    )

    def __init__(
        self,
        context: CodemodContext,
        target: Optional[str] = None,
        select: Optional[Sequence[str]] = None,
        **options: object,
    ) -> None:
        super().__init__(context)
        scratch = context.scratch
        self.target: Target = get_target(
            target or scratch.get(TARGET_KEY) or DEFAULT_TARGET  # type: ignore[arg-type]
        )
        sel = select if select is not None else scratch.get(SELECT_KEY)
        self._selected: Set[str] = {
            r.code for r in self.RULES if sel is None or code_matches(r.code, sel)  # type: ignore[arg-type]
        }
        self.options: Dict[str, object] = dict(scratch.get(OPTIONS_KEY, {}))  # type: ignore[arg-type]
        self.options.update({k: v for k, v in options.items() if v is not None})
        self._suppressed: Dict[int, FrozenSet[str]] = {}

    # -- LibCST entry point ------------------------------------------------
    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        source = self.context.scratch.get(SOURCE_KEY)
        if not isinstance(source, str):
            source = tree.code
        self._suppressed = parse_suppressions(source)
        return super().transform_module_impl(tree)

    # -- helpers for subclasses --------------------------------------------
    def enabled(self, code: str) -> bool:
        return code in self._selected

    def option(self, name: str, default: object) -> object:
        return self.options.get(name, default)

    def position(self, node: cst.CSTNode) -> Tuple[int, int, int]:
        pos = self.get_metadata(PositionProvider, node)
        return pos.start.line, pos.start.column + 1, pos.end.line

    def is_suppressed(self, node: cst.CSTNode, code: str) -> bool:
        if not self._suppressed:
            return False
        start, _, end = self.position(node)
        for line in {start, end}:
            codes = self._suppressed.get(line)
            if codes and code_matches(code, codes):
                return True
        return False

    def flag(
        self,
        node: cst.CSTNode,
        code: str,
        message: str,
        fix: bool,
        hot: Optional[bool] = None,
    ) -> bool:
        """Record a finding on ``node`` (an *original* node).

        Returns True when the rule is enabled and not suppressed on that line,
        i.e. when the caller may go on and rewrite.
        """
        if not self.enabled(code) or self.is_suppressed(node, code):
            return False
        line, col, _ = self.position(node)
        findings: List[Finding] = self.context.scratch.setdefault(FINDINGS_KEY, [])  # type: ignore[assignment]
        findings.append(Finding(code, message, line, col, fix, hot))
        return True

    def add_imports(self, imports: Iterable[Import]) -> None:
        for module, obj, asname in imports:
            AddImportsVisitor.add_needed_import(self.context, module, obj, asname)

    def qualnames(self, node: cst.CSTNode) -> Set[str]:
        try:
            return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}
        except KeyError:
            return set()

    def is_qualname(self, node: cst.CSTNode, *names: str) -> bool:
        return bool(self.qualnames(node) & set(names))

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        try:
            return self.get_metadata(ParentNodeProvider, node)
        except KeyError:
            return None

    def ancestors(self, node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        cur = self.parent(node)
        while cur is not None:
            yield cur
            cur = self.parent(cur)


# ---------------------------------------------------------------- CST helpers


def string_value(node: cst.CSTNode) -> Optional[str]:
    """The value of a plain string literal, else None."""
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:  # pragma: no cover - malformed literal
            return None
        return value if isinstance(value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        left, right = string_value(node.left), string_value(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def call_name(node: cst.CSTNode) -> Optional[str]:
    """The last name of a call's callee: ``a.b.c(...)`` -> ``c``."""
    if not isinstance(node, cst.Call):
        return None
    func = node.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def dotted(node: cst.CSTNode) -> Optional[str]:
    """``a.b.c`` as a string for Name/Attribute chains, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def find_all(node: cst.CSTNode, kind: type, stop: Tuple[type, ...] = ()) -> List[cst.CSTNode]:
    """All descendants of ``node`` (itself included) of type ``kind``.

    Does not descend into nodes of the ``stop`` types (other than ``node``).
    """
    found: List[cst.CSTNode] = []

    class _V(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if isinstance(n, kind):
                found.append(n)
            return not (stop and n is not node and isinstance(n, stop))

    node.visit(_V())
    return found


def statement(expr: cst.BaseExpression) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(body=[cst.Expr(expr)])
