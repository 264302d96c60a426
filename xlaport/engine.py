"""Run the codemods over one source text.

The engine parses a file once, runs each applicable codemod on the tree in
turn, adds the imports they asked for once at the end, and maps every finding
back to a line of the *original* file (rules run on each other's output, so
their own positions shift when an earlier rule inserts or removes lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.codemod import Codemod, CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from codemods import registry
from codemods.analysis.cuda import count_references
from codemods.coverage import CATCH_ALL, COVERAGE_KEY, CudaCatchAll
from codemods.base import (
    FINDINGS_KEY,
    ORIGINAL_LINE_KEY,
    OPTIONS_KEY,
    SELECT_KEY,
    SOURCE_KEY,
    TARGET_KEY,
    TREE_KEY,
    Finding,
    TreeCache,
    unique,
)
from codemods.tree import dotted, walk
from xlaport.settings import Settings  # noqa: F401 -- re-exported
from xlaport.linemap import line_map


class SourceError(Exception):
    """A source that cannot be converted; ``line``/``col`` where known."""

    def __init__(self, message: str, line: Optional[int] = None, col: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.line = line
        self.col = col


@dataclass
class Outcome:
    code: bytes  # the converted source (== input when nothing changed)
    findings: List[Finding]
    cuda: Tuple[int, int] = (0, 0)  # CUDA references (in the input, left in the output)

    def changed(self, original: bytes) -> bool:
        return self.code != original


def applicable(source: bytes, settings: Settings, codes: Sequence[str]) -> List[type]:
    """The codemods worth parsing the file for: enabled, and triggered."""
    return [info.load() for info in registry.applicable(source, codes, settings.options, settings.prefilter)]


def parse(source: bytes) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise SourceError(
            f"cannot parse: {exc.message}", exc.raw_line, exc.raw_column + 1
        ) from None
    except (UnicodeDecodeError, LookupError) as exc:
        raise SourceError(f"cannot decode: {exc}") from None
    except (SyntaxError, RecursionError, ValueError) as exc:
        raise SourceError(f"cannot parse: {exc}") from None


def _text_of(source: bytes, tree: cst.Module) -> str:
    """``tree.code`` without generating it: LibCST's trees give back their
    source exactly, so it is the source decoded as LibCST decoded it (a
    byte-order mark is the one case left to the code generator)."""
    if source.startswith(b"\xef\xbb\xbf"):
        return tree.code
    try:
        return source.decode(tree.encoding)
    except (UnicodeDecodeError, LookupError):
        return tree.code


def _add_imports(context: CodemodContext, tree: cst.Module) -> cst.Module:
    """Run LibCST's AddImportsVisitor on the only part of the module it reads
    and writes -- the docstring and the block of imports at the top, plus one
    statement -- and put the rest of the body back untouched.  Running it on a
    4,000-line module would rebuild every node of it to change two lines."""
    body = list(tree.body)
    k = 0
    while k < len(body) and (_is_import_line(body[k]) or (k == 0 and _is_docstring(body[k]))):
        k += 1
    head = tree.with_changes(body=body[: k + 1], footer=())
    new_head = Codemod.transform_module(AddImportsVisitor(context), head)
    return tree.with_changes(header=new_head.header, body=[*new_head.body, *body[k + 1 :]])


def _may_remove(context: CodemodContext, tree: cst.Module) -> bool:
    """Whether LibCST's RemoveImportsVisitor can remove anything asked of
    it: an import of what was asked for, whose name no code outside the
    imports uses any more.  The visitor runs a whole scope analysis to find
    that out (seconds on a large module) and most requests are moot: the
    rule that asked left other uses of the name.  In doubt, it runs."""
    bound: List[Tuple[str, str]] = []  # (what an import names, the local name it binds)
    used: Set[str] = set()
    for node in walk(tree, stop=(cst.Import, cst.ImportFrom)):
        if isinstance(node, cst.Name):
            used.add(node.value)
        elif isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                name = dotted(alias.name) or ""
                local = dotted(alias.asname.name) if alias.asname is not None else name.split(".")[0]
                bound.append((name, local or ""))
    for module, obj, asname in context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY, ()):  # type: ignore[union-attr]
        wanted = obj or module
        for name, local in bound:
            if name in (wanted, module) and (asname is None or local == asname) and local not in used:
                return True
    return False


def _is_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def transform(source: bytes, settings: Settings, filename: str = "") -> Outcome:
    """Convert one source text. Raises SourceError for code it cannot parse."""
    settings = settings.for_file(filename, source)
    codes = settings.selected_codes()
    codemods = applicable(source, settings, codes)
    if not codemods:
        return Outcome(source, [])
    tree = parse(source)
    original_text = _text_of(source, tree)
    context = CodemodContext(
        filename=filename or None,
        scratch={
            SELECT_KEY: codes,
            TARGET_KEY: settings.target,
            OPTIONS_KEY: dict(settings.options),
            FINDINGS_KEY: [],
        },
    )
    maps: List[Callable[[int], int]] = []  # maps[k]: lines after rule k -> before
    findings: List[Finding] = []
    text = original_text
    context.scratch[TREE_KEY] = TreeCache(tree, source)
    found = count_references(context.scratch[TREE_KEY]) if CudaCatchAll in codemods else 0  # type: ignore[arg-type]
    for cls in codemods:
        # One TreeCache per tree holds the metadata and analyses that every
        # codemod running on it shares; a codemod that changes the tree starts
        # a new one.
        cache: TreeCache = context.scratch[TREE_KEY]  # type: ignore[assignment]
        if not cls.wanted(cache, context.scratch[OPTIONS_KEY]):
            continue
        context.scratch[SOURCE_KEY] = text
        context.scratch[FINDINGS_KEY] = []
        context.scratch[ORIGINAL_LINE_KEY] = _back_through(list(maps))
        new_tree = cls(context).transform_module_impl(tree)
        new = context.scratch[FINDINGS_KEY]
        for f in new:
            for back in reversed(maps):
                f.line = back(f.line)
                if f.end_line:
                    f.end_line = max(back(f.end_line), f.line)
        findings.extend(new)
        # A codemod changes the tree only where it records a fix; without
        # one, the rebuilt tree equals the old one and the old tree (with its
        # metadata) is kept.
        if any(f.fix for f in new):
            new_text = new_tree.code
            if new_text != text:
                maps.append(line_map(text, new_text))
                text = new_text
                tree = unique(new_tree)
                context.scratch[TREE_KEY] = TreeCache(tree, source)
    rebuilt = bool(maps)
    if context.scratch.get(AddImportsVisitor.CONTEXT_KEY):
        tree, rebuilt = _add_imports(context, tree), True
    if context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY) and _may_remove(context, tree):
        tree, rebuilt = Codemod.transform_module(RemoveImportsVisitor(context), tree), True
    out = source
    if rebuilt:  # otherwise the tree is the one parsed: no code to generate
        code = tree.code
        if code != original_text:
            out = code.encode(tree.encoding)
    findings = _without_repeats(findings)
    findings.sort(key=lambda f: (f.line, f.col, f.code))
    left = int(context.scratch.get(COVERAGE_KEY, 0))  # type: ignore[call-overload]
    return Outcome(out, findings, (found, left))


def _back_through(maps: List[Callable[[int], int]]) -> Callable[[int], int]:
    def back(line: int) -> int:
        for m in reversed(maps):
            line = m(line)
        return line

    return back


def _without_repeats(findings: List[Finding]) -> List[Finding]:
    """The catch-all (XLA199) speaks only where no CUDA rule reported the line."""
    reported = {f.line for f in findings if not f.fix and f.code.startswith("XLA1") and f.code != CATCH_ALL.code}
    return [f for f in findings if f.code != CATCH_ALL.code or f.line not in reported]
