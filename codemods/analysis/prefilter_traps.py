"""The prefilter's facts for two report-and-fix rules that speak only where
a file holds one rare statement, at ``ast`` level (no LibCST here):

* ``caught_index`` -- a ``try`` whose handler catches IndexError (bare,
  or one of :data:`CATCHING_INDEX_ERROR`) holds ``name = <call>[...]`` in
  its body (``codemods.index_errors``, XLA161);
* ``from_the_end`` -- a slice bound counts from the end by something that is
  not a number (``x[-n:]``; ``codemods.xla_limits``, XLA160).

Each is looser than what its rule rewrites (no dataflow, any depth), so a
file without it cannot concern the rule: most ported files are read for
neither, and LibCST need not parse them for these two."""

from __future__ import annotations

import ast

CAUGHT_INDEX = "caught_index"
FROM_THE_END = "from_the_end"
# what an ``except`` names that catches IndexError (the one definition: index_errors reads it)
CATCHING_INDEX_ERROR = frozenset({"IndexError", "LookupError", "Exception", "BaseException"})
TRIES = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)


def caught_index(node: ast.AST) -> bool:
    """``node`` (a ``try``) catches IndexError and assigns a subscript of a call in its body."""
    if not any(_catches(h) for h in node.handlers):  # type: ignore[attr-defined]
        return False
    return any(type(n) is ast.Assign and type(n.value) is ast.Subscript and type(n.value.value) is ast.Call
               for stmt in node.body for n in ast.walk(stmt))  # type: ignore[attr-defined]


def _catches(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((isinstance(k, ast.Name) and k.id in CATCHING_INDEX_ERROR)
               or (isinstance(k, ast.Attribute) and k.attr in CATCHING_INDEX_ERROR) for k in kinds)


def from_the_end(node: ast.Slice) -> bool:
    """A bound of ``node`` is ``-<something that is not a number>``."""
    return any(type(b) is ast.UnaryOp and type(b.op) is ast.USub and type(b.operand) is not ast.Constant
               for b in (node.lower, node.upper))
