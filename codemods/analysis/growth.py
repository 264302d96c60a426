"""Tensors a loop grows: ``x = torch.cat((x, new), ...)`` in a loop's body,
with no other assignment there that makes ``x`` afresh, lengthens ``x`` by
one piece an iteration -- a new shape (and graph) at every step (XLA408),
and a length that starts short (XLA160: a slice of its last ``n`` is out of
range on XLA until it has grown to ``n``)."""

from __future__ import annotations

from typing import Callable, Set

import libcst as cst

from codemods.syntax.tree import call_name, find_all

_CATS = ("cat", "concat", "concatenate")


def grown_by(node: cst.Assign, loop: cst.CSTNode, qualnames: Callable[[cst.CSTNode], Set[str]]) -> Set[str]:
    """The names the assignment ``node`` (in ``loop``'s body) grows."""
    value = node.value
    if not (isinstance(value, cst.Call) and call_name(value) in _CATS and value.args
            and any(q.startswith("torch.") for q in qualnames(value.func))):
        return set()
    parts = value.args[0].value
    if not isinstance(parts, (cst.Tuple, cst.List)):
        return set()
    grown = {t.target.value for t in node.targets if isinstance(t.target, cst.Name)}
    names = {e.value.value for e in parts.elements if isinstance(e.value, cst.Name)}
    # grown only when carried from the last iteration: no other assignment
    # in the loop makes it afresh (`x = torch.cat([zeros_like(x), x])`
    # after `x = controlnet(...)` doubles this step's value once)
    for other in find_all(loop.body, (cst.Assign, cst.AnnAssign), stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda)):  # type: ignore[attr-defined]
        if other is not node:
            targets = other.targets if isinstance(other, cst.Assign) else [other]  # type: ignore[attr-defined]
            grown -= {n.value for t in targets for n in find_all(t.target, cst.Name)}
    return grown & names


def grown_in(loop: cst.CSTNode, qualnames: Callable[[cst.CSTNode], Set[str]]) -> Set[str]:
    """Every name ``loop`` grows."""
    return {name for a in find_all(loop.body, cst.Assign, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda))  # type: ignore[attr-defined]
            for name in grown_by(a, loop, qualnames)}  # type: ignore[arg-type]
