"""Start positions of a few nodes, for a fraction of a full position pass.

LibCST's ``PositionProvider`` generates the module's code once and records a
range for every node -- about 0.2 s per thousand lines, paid again for every
tree a rewrite produces.  A finding needs the start of one node, so the
codemods record their findings first and place them all in one pass over the
tree that records only the nodes asked for (``start_positions``).  The
positions are the same as ``PositionProvider``'s: the same code generation,
with the same syntactic rules (an indented block starts at its first
statement and ends with its last); ``tests/test_prefilter.py``
compares the two on real files.

Where the engine knows the module's text, not even the whole module is
generated: Python's ``ast`` gives the line each statement of the module (and
of its classes' and functions' bodies) starts on, and only the innermost
such statements that hold the nodes asked for are generated, from that line
and with the indentation of the blocks around them.

This leans on LibCST's code generation state (``PositionProvidingCodegenState``,
a public class in a private module), as LibCST's own providers do.
"""

from __future__ import annotations

import ast
import re
from contextlib import contextmanager, nullcontext
from typing import (
    ContextManager,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
)

import libcst as cst
from libcst._position import CodePosition, CodeRange
from libcst.metadata import PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from codemods.syntax.nodes import walk


class IndexedTree(Protocol):
    """What :func:`tree_positions` reads of an indexed tree (``tree.TreeCache``
    is one): the module, its text where known, each node's parent, and
    where its statements start."""

    module: cst.Module
    text: Optional[str]
    parents: Dict[int, cst.CSTNode]

    def statement_positions(self) -> Dict[int, Tuple[int, int, int, int]]: ...

    def statement_starts(self) -> Optional[Dict[int, int]]: ...


_NOTHING = nullcontext()


class _StartsOnly(PositionProvidingCodegenState):
    wanted: Set[int]

    def _update_position(self, value: str) -> None:
        if "\n" in value or "\r" in value:
            super()._update_position(value)
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted:
            super().before_codegen(node)

    def after_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted:
            super().after_codegen(node)

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None,
                                  end_node: Optional[cst.CSTNode] = None) -> ContextManager[None]:
        # called for most nodes: a shared no-op context for those not asked
        # for is several times cheaper than entering a generator each time
        if id(node) not in self.wanted:
            return _NOTHING
        return self._record(node, start_node, end_node)

    @contextmanager
    def _record(self, node: cst.CSTNode, start_node: Optional[cst.CSTNode],
                end_node: Optional[cst.CSTNode]) -> Iterator[None]:
        start = CodePosition(self.line, self.column)
        try:
            yield
        finally:
            end = CodePosition(self.line, self.column)
            computed = self.provider._computed
            if start_node is not None and start_node in computed:
                start = computed[start_node].start
            if end_node is not None and end_node in computed:
                end = computed[end_node].end
            computed[node] = CodeRange(start, end)


Position = Tuple[int, int, int, int]


def start_positions(module: cst.Module, nodes: Iterable[cst.CSTNode],
                    anchors: Optional[Dict[int, Tuple[cst.CSTNode, Tuple[str, ...], List[cst.CSTNode]]]] = None,
                    text: Optional[str] = None, starts: Optional[Dict[int, int]] = None) -> Dict[int, Position]:
    """``id(node) -> (line, column, end line, end column)`` (lines 1-based,
    columns 1-based, the end exclusive) for each of ``nodes`` in ``module``.

    With ``anchors`` (id of a statement -> (the statement, the indentation
    around it, the nodes asked for in it); statements of the module, or of
    the bodies of its classes and functions) and ``text`` (the module's
    code), only those statements are generated, each from the line where it
    starts: Python's own ``ast`` says where each statement's code begins (a
    parse several times cheaper than generating a large module's code)."""
    nodes = list(nodes)
    if anchors is not None and text is not None:
        if starts is None:
            starts = statement_starts(module, text)
        if starts is not None and all(key in starts for key in anchors):
            out: Dict[int, Position] = {}
            for key, (stmt, indents, asked) in anchors.items():
                out.update(_generate(module, stmt, asked, starts[key], indents))
            return out
    return _generate(module, module, nodes, 1, ())


def tree_positions(tree: IndexedTree, nodes: List[cst.CSTNode]) -> Dict[int, Position]:
    """``TreeCache.start_positions`` where no full position metadata was
    computed: a statement's position is read from ast; only the innermost
    statements that hold the other nodes and whose start ast gives are
    generated (see :func:`statement_starts`)."""
    if tree.text is None:
        return start_positions(tree.module, nodes)
    known = tree.statement_positions()
    found = {id(n): known[id(n)] for n in nodes if id(n) in known}
    nodes = [n for n in nodes if id(n) not in found]
    if not nodes:
        return found
    parents = tree.parents
    starts = tree.statement_starts()
    known_starts = starts or {}
    anchors: Dict[int, Tuple[cst.CSTNode, Tuple[str, ...], List[cst.CSTNode]]] = {}
    for n in nodes:
        chain = [n]
        up = parents.get(id(n))
        while up is not None and up is not tree.module:
            chain.append(up)
            up = parents.get(id(up))
        if up is None:  # the module itself, or a node not in this tree
            return {**found, **start_positions(tree.module, nodes)}
        chain.reverse()
        k, indents = 0, ()  # type: Tuple[int, Tuple[str, ...]]
        # down to the innermost statement whose start ast gives (statement_starts)
        while (type(chain[k]) in BODY_STATEMENTS and k + 2 < len(chain)
               and chain[k + 1] is chain[k].body and type(chain[k + 1]) is cst.IndentedBlock  # type: ignore[attr-defined]
               and id(chain[k + 2]) in known_starts and any(s is chain[k + 2] for s in chain[k + 1].body)):  # type: ignore[attr-defined]
            block = chain[k + 1]
            indents += (block.indent if block.indent is not None else tree.module.default_indent,)  # type: ignore[attr-defined]
            k += 2
        anchor = chain[k]
        anchors.setdefault(id(anchor), (anchor, indents, []))[2].append(n)
    return {**found, **start_positions(tree.module, nodes, anchors, tree.text, starts)}


def _generate(module: cst.Module, root: cst.CSTNode, nodes: List[cst.CSTNode], line: int,
              indents: Tuple[str, ...]) -> Dict[int, Position]:
    """Generate the code of ``root`` (the module, or a statement starting at
    ``line`` inside blocks indented by ``indents``), recording the ranges
    of ``nodes`` only."""
    # a node's range can come from its children's (an indented block starts at
    # its first statement and ends with its last): record those too
    wanted = {id(d) for n in nodes for d in walk(n)}
    provider = PositionProvider()
    state = _StartsOnly(default_indent=module.default_indent, default_newline=module.default_newline,
                        provider=provider)
    state.wanted = wanted
    state.line = line
    state.indent_tokens = list(indents)
    root._codegen(state)
    out: Dict[int, Position] = {}
    for n in nodes:
        rng = provider._computed.get(n)
        if rng is not None:
            out[id(n)] = (rng.start.line, rng.start.column + 1, rng.end.line, rng.end.column + 1)
    return out


def statement_starts(module: cst.Module, text: str, parsed: Optional[ast.Module] = None) -> Optional[Dict[int, int]]:
    """``id(statement) -> the line its code starts on`` (its leading blank
    and comment lines included, as LibCST generates it) for the statements
    of the module and of its classes' and functions' bodies (and of the
    bodies of loops, ``with`` and ``if`` statements there), from an
    ``ast`` parse of ``text`` (``parsed``, where the caller has one); None
    when the two parses do not line up."""
    if parsed is not None:
        body = parsed.body
    else:
        try:
            body = ast.parse(text).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
    starts: Dict[int, int] = {}
    return starts if _align(list(module.body), body, starts) else None


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# the other statements whose body's statements get their lines too (the body only)
# (and where a position is looked for, below a class or function)
_BLOCKS = {cst.For: (ast.For, ast.AsyncFor), cst.While: (ast.While,), cst.With: (ast.With, ast.AsyncWith),
           cst.If: (ast.If,)}
# every statement whose body's statements statement_starts gives (splicing and
# positions go down into these)
BODY_STATEMENTS = frozenset({cst.FunctionDef, cst.ClassDef, *_BLOCKS})


def _align(stmts: List[cst.CSTNode], body: List[ast.stmt], starts: Dict[int, int]) -> bool:
    i = 0
    for stmt in stmts:
        if i >= len(body):
            return False
        first = body[i]
        line = first.lineno
        decorators = getattr(first, "decorator_list", None)
        if decorators:
            line = min(d.lineno for d in decorators)
        lead = len(stmt.leading_lines)  # type: ignore[attr-defined]
        if getattr(stmt, "decorators", None):
            lead += len(stmt.decorators[0].leading_lines)  # type: ignore[attr-defined]
        starts[id(stmt)] = line - lead
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            if not isinstance(first, _DEFS):
                return False
            if isinstance(stmt.body, cst.IndentedBlock) and not _align(list(stmt.body.body), first.body, starts):
                return False
        elif type(stmt) in _BLOCKS and isinstance(stmt.body, cst.IndentedBlock) and isinstance(  # type: ignore[attr-defined]
                first, _BLOCKS[type(stmt)]):
            inner: Dict[int, int] = {}  # (a body that does not line up is left out, not the module)
            if _align(list(stmt.body.body), first.body, inner):  # type: ignore[attr-defined]
                starts.update(inner)
        i += len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
    return i == len(body)


# ------------------------------------------------------------ statements, from ast

# compound statements whose ast node has the same blocks (``body``, and an
# ``else`` that is a block of its own, not an ``elif``)
_COMPOUND = {cst.For: (ast.For, ast.AsyncFor), cst.While: (ast.While,), cst.With: (ast.With, ast.AsyncWith),
             cst.If: (ast.If,), cst.Try: (ast.Try,), cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
             cst.ClassDef: (ast.ClassDef,)}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def statement_positions(module: cst.Module, text: str, parsed: ast.Module) -> Dict[int, Position]:
    """``id(statement) -> (line, column, end line, end column)``, as
    :func:`start_positions` gives them, for the statements of ``module`` in
    indented blocks at any depth, read from Python's ``ast`` parse of the
    same ``text`` instead of generated: ``ast`` knows where each statement
    starts and ends (in bytes of UTF-8, turned into characters here).  A
    block whose statements do not line up with ``ast``'s is left out (and
    so is every statement in it): those are generated as before."""
    out: Dict[int, Position] = {}
    lines: List[str] = []

    def column(line: int, offset: int) -> int:
        if not lines:
            lines.extend(_LINE_BREAK.split(text))
        code = lines[line - 1] if 0 < line <= len(lines) else ""
        if code.isascii():
            return offset + 1
        return len(code.encode("utf-8")[:offset].decode("utf-8", "replace")) + 1

    def block(stmts: Sequence[cst.CSTNode], body: List[ast.stmt]) -> None:
        pairs: List[Tuple[cst.CSTNode, ast.stmt, ast.stmt]] = []
        i = 0
        for stmt in stmts:
            if isinstance(stmt, cst.SimpleStatementLine):
                n = len(stmt.body)
                if n == 0 or i + n > len(body) or not isinstance(stmt.body[-1].semicolon, cst.MaybeSentinel):
                    return
                pairs.append((stmt, body[i], body[i + n - 1]))
                i += n
                continue
            kinds = _COMPOUND.get(type(stmt))
            if i >= len(body) or not (isinstance(body[i], kinds) if kinds else
                                      type(body[i]).__name__ == type(stmt).__name__):  # Match, TryStar: not entered
                return
            pairs.append((stmt, body[i], body[i]))
            i += 1
        if i != len(body):
            return
        for stmt, first, last in pairs:
            if last.end_lineno is None or last.end_col_offset is None:
                continue
            out[id(stmt)] = (first.lineno, column(first.lineno, first.col_offset), last.end_lineno,
                             column(last.end_lineno, last.end_col_offset))
            if type(stmt) in _COMPOUND:
                _inner(stmt, first)

    def inner_block(node: cst.CSTNode, body: List[ast.stmt]) -> None:
        if isinstance(node, cst.IndentedBlock):
            block(node.body, body)

    def _inner(stmt: cst.CSTNode, node: ast.stmt) -> None:
        inner_block(stmt.body, node.body)  # type: ignore[attr-defined]
        orelse = getattr(stmt, "orelse", None)
        if isinstance(orelse, cst.Else):  # (an elif is an If of its own: left out)
            inner_block(orelse.body, node.orelse)  # type: ignore[attr-defined]
        if isinstance(stmt, cst.Try) and len(stmt.handlers) == len(node.handlers):  # type: ignore[attr-defined]
            for handler, h in zip(stmt.handlers, node.handlers):  # type: ignore[attr-defined]
                inner_block(handler.body, h.body)
            if stmt.finalbody is not None:
                inner_block(stmt.finalbody.body, node.finalbody)  # type: ignore[attr-defined]

    try:
        block(module.body, parsed.body)
        return out
    finally:
        # the nested functions call each other, a reference cycle holding the
        # tree: let go of them, so that the tree is freed as soon as it is done
        block = inner_block = _inner = None  # type: ignore[assignment]
