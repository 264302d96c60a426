"""The code of a rewritten tree, generating only the statements that changed.

A codemod pass shares every subtree it leaves unchanged with the tree it read
(``codemods.syntax.traverse``).  So the new module's code is the old text with the
lines of the replaced statements swapped for the code of their replacements:
Python's ``ast`` gives the line each statement starts on (``positions.
statement_starts``: the statements of the module and of its classes' and
functions' bodies, and of the loops, ``with`` and ``if`` blocks there), and a
statement runs up to where the next one of the same body starts.  A class,
function, loop, ``with`` or ``if`` (without ``else``) whose header is
unchanged is descended into; anything else that changed is generated with the indentation of the
blocks around it, which is exactly what generating the whole module would
give.  Whatever cannot be matched this way answers None, and the caller
generates the whole module.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst
from libcst._nodes.internal import CodegenState

from codemods.syntax.positions import BODY_STATEMENTS

# statements whose body is descended into when nothing else of them changed
# (those statement_starts reads; a loop or an `if` only without an `else`: its
# body must end where it does)
_DEFS = BODY_STATEMENTS
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # lines as Python's tokenizer counts them
_FIELDS: Dict[type, Tuple[str, ...]] = {}

Piece = Tuple[int, int, str]  # replace old lines [start, end) (0-based) by this text


def spliced_code(old: cst.Module, old_text: str, new: cst.Module,
                 starts: Optional[Dict[int, int]]) -> Optional[str]:
    """``new.code``, where ``new`` is ``old`` (whose code is ``old_text`` and
    whose statements start on the lines ``starts`` gives) after a transform
    that shared what it did not change; None when it cannot tell."""
    if new is old:
        return old_text
    if starts is None or not new.has_trailing_newline or any(
            not _same(getattr(new, f), getattr(old, f)) for f in _fields(cst.Module) if f != "body"):
        return None
    lines = _LINE.findall(old_text)
    pieces: List[Piece] = []
    if not _splice(old.body, new.body, len(lines) - len(old.footer), (), starts, new, pieces):
        return None
    out: List[str] = []
    at = 0
    for start, end, text in sorted(pieces, key=lambda p: p[0]):
        out.extend(lines[at:start])
        out.append(text)
        at = end
    out.extend(lines[at:])
    return "".join(out)


def _splice(old: Sequence[cst.CSTNode], new: Sequence[cst.CSTNode], end: int, indents: Tuple[str, ...],
            starts: Dict[int, int], module: cst.Module, pieces: List[Piece]) -> bool:
    """Record the pieces that turn the statements ``old`` (a body whose last
    line ends before line ``end``) into ``new``."""
    if old is new:
        return True
    where = {id(s): i for i, s in enumerate(old)}
    o = n = 0
    for k, stmt in enumerate(list(new) + [None]):
        j = len(old) if stmt is None else where.get(id(stmt))
        if j is None:
            continue  # a new statement: part of the region before the next kept one
        if j < o:
            return False  # kept statements out of order
        # old[o:j] became new[n:k]
        if j > o or k > n:
            if any(id(s) not in starts for s in old[o:j]):
                return False
            first = starts[id(old[o])] - 1 if j > o else _start(old, j, end, starts)
            last = _start(old, j, end, starts)
            if first is None or last is None:
                return False
            if j - o == k - n:  # one for one: each pair on its own
                for i in range(j - o):
                    if not _replace(old, o + i, new[n + i], _start(old, o + i + 1, end, starts), indents,  # type: ignore[arg-type]
                                    starts, module, pieces):
                        return False
            else:
                pieces.append((first, last, _generate(new[n:k], indents, module)))
        o, n = j + 1, k + 1
    return True


def _replace(old: Sequence[cst.CSTNode], i: int, new: cst.CSTNode, last: int, indents: Tuple[str, ...],
             starts: Dict[int, int], module: cst.Module, pieces: List[Piece]) -> bool:
    """``old[i]`` (which ends before line ``last``) became ``new``: descend
    into a class, function, loop, ``with`` or ``if`` whose header is
    unchanged, else generate it."""
    if not _same_header(old[i], new) or not new.body.body:  # type: ignore[attr-defined]
        # (an emptied body is generated whole: LibCST writes `pass` into it)
        pieces.append((starts[id(old[i])] - 1, last, _generate([new], indents, module)))
        return True
    inner = old[i].body  # type: ignore[attr-defined]
    return _splice(inner.body, new.body.body, last - len(inner.footer),  # type: ignore[attr-defined]
                   indents + (inner.indent if inner.indent is not None else module.default_indent,),
                   starts, module, pieces)


def _start(body: Sequence[cst.CSTNode], j: int, end: int, starts: Dict[int, int]) -> Optional[int]:
    """The 0-based line where ``body[j]`` starts (``end`` past the last)."""
    if j >= len(body):
        return end
    line = starts.get(id(body[j]))
    return None if line is None else line - 1


def _same_header(old: cst.CSTNode, new: cst.CSTNode) -> bool:
    """A class, function, loop, ``with`` or ``if`` (without ``else``) whose
    every part but its block's statements is the same object in both trees:
    only its body changed."""
    kind = type(old)
    if kind is not type(new) or kind not in _DEFS or getattr(old, "orelse", None) is not None:
        return False
    if type(old.body) is not cst.IndentedBlock or type(new.body) is not cst.IndentedBlock:  # type: ignore[attr-defined]
        return False
    return all(getattr(old, f) is getattr(new, f) for f in _fields(kind) if f != "body") and all(
        getattr(old.body, f) is getattr(new.body, f)  # type: ignore[attr-defined]
        for f in _fields(cst.IndentedBlock) if f != "body")


def _same(a: object, b: object) -> bool:
    """The same object, or sequences of the same objects (a visitor that
    passes the module's header through gives back a new list of it)."""
    if a is b:
        return True
    return type(a) in (list, tuple) and type(b) in (list, tuple) and len(a) == len(b) and all(  # type: ignore[arg-type]
        x is y for x, y in zip(a, b))  # type: ignore[call-overload]


def _fields(kind: type) -> Tuple[str, ...]:
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(kind))
    return names


def _generate(stmts: Sequence[cst.CSTNode], indents: Tuple[str, ...], module: cst.Module) -> str:
    """The code of ``stmts`` inside blocks indented by ``indents``."""
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    state.indent_tokens = list(indents)
    for stmt in stmts:
        stmt._codegen(state)
    return "".join(state.tokens)
