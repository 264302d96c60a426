"""Which numbers a training step reads on the host before its optimizer step
and uses only after it.

pytorch/examples' DCGAN (and the PyTorch DCGAN tutorial) reads ``D_x =
output.mean().item()`` after the discriminator's backward, ``D_G_z1`` after
the fake batch's and ``D_G_z2`` after the generator's, and prints them at the
end of the step.  On XLA each read runs the part of the step it needs as a
graph of its own, the forwards again: four executions a step.  The mean is
computed where it is (``D_x = output.mean()``, part of the step's graph) and
read once the step is computed (``D_x = D_x.item()`` after its barrier):
one execution, the same numbers.

A read is deferred when its line is ``name = <tensor>.item()`` at the
loop's own level before the optimizer step, where

* the tensor is computed on the line (a torch op or a method of a tensor
  that computes, ``output.mean()``; not a name or a view of one, whose
  values the step could change in place), and draws no random numbers;
* ``name`` is neither used nor bound from the line to the step's end
  (``analysis.step_tail.step_end``), and no function, lambda or class of its
  scope outside the lines after the step names it (one could run between
  and read the name); no ``global``/``nonlocal`` names it;
* nothing between can leave the body (``continue``, ``break``,
  ``return``, ``raise``).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Set

import libcst as cst

from codemods.analysis.cuda import scope_of
from codemods.analysis.loops import body_statements
from codemods.analysis.pass_reads import has_exit
from codemods.analysis.step_tail import QualNames, computes, step_end
from codemods.analysis.tensor_functions import draws_random
from codemods.syntax.tree import TreeCache, find_all

# methods that give another view of a tensor's values (its values are the viewed tensor's, not computed)
_VIEWS = frozenset({"flatten", "view", "reshape", "squeeze", "unsqueeze", "t", "contiguous", "detach", "ravel",
                    "view_as", "expand", "expand_as", "permute", "transpose", "narrow", "select", "data"})
_EXITS = (cst.Continue, cst.Break, cst.Return, cst.Raise)


class DeferredRead(NamedTuple):
    """A read to defer: the line's index in the body, the name it binds, the tensor it reads."""
    index: int
    name: str
    tensor: cst.BaseExpression


class Deferred(NamedTuple):
    """Where the deferred reads go (the step's end) and which they are, in the body's order."""
    end: int
    reads: List[DeferredRead]


def deferred_reads(tree: TreeCache, loop: cst.CSTNode, steps: Set[str], tensors: Set[str],
                   qualnames: QualNames) -> Optional[Deferred]:
    """The reads of a training step loop to defer (see the module doc), or None."""
    end = step_end(tree, loop, steps, qualnames)
    if end is None:
        return None
    stmts = body_statements(loop)  # type: ignore[arg-type]
    scope = scope_of(loop, tree)
    reads: List[DeferredRead] = []
    for i, stmt in enumerate(stmts[:end]):
        found = _read_line(tree, stmt, tensors, qualnames)
        if found is None:
            continue
        name, tensor = found
        between = stmts[i + 1:end]
        if has_exit(between, _EXITS) or _named(between, name) or _seen_elsewhere(scope, stmts[end:], name):
            continue
        reads.append(DeferredRead(i, name, tensor))
    return Deferred(end, reads) if reads else None


def _read_line(tree: TreeCache, stmt: cst.CSTNode, tensors: Set[str],
               qualnames: QualNames) -> Optional[tuple]:
    """(name, tensor) of a line ``name = <tensor>.item()`` whose tensor is computed on it."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 or not isinstance(small.targets[0].target, cst.Name):
        return None
    call = small.value
    if not (isinstance(call, cst.Call) and not call.args and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "item"):
        return None
    tensor = call.func.value
    if not _computed(tensor) or draws_random(tensor) or not computes(tree, tensor, tensors, qualnames):
        return None
    return small.targets[0].target.value, tensor


def _computed(expr: cst.BaseExpression) -> bool:
    """The tensor is made on the line, not a name, an attribute or a view of one."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _VIEWS:
        expr = expr.func.value
    while isinstance(expr, cst.Attribute) and expr.attr.value in _VIEWS:
        expr = expr.value
    return not isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript))


def _named(stmts: Sequence[cst.CSTNode], name: str) -> bool:
    return any(n.value == name for s in stmts for n in find_all(s, cst.Name))  # type: ignore[attr-defined]


def _seen_elsewhere(scope: cst.CSTNode, after: Sequence[cst.CSTNode], name: str) -> bool:
    """A function, lambda or class of ``scope`` (not one of the lines ``after``
    the step, which run once the read is made) names ``name``, or a
    ``global``/``nonlocal`` does."""
    later = {id(n) for s in after for n in find_all(s, (cst.FunctionDef, cst.Lambda, cst.ClassDef))}
    inner = scope.body if isinstance(scope, cst.FunctionDef) else scope
    for node in find_all(inner, (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Global, cst.Nonlocal)):
        if id(node) in later:
            continue
        if isinstance(node, (cst.Global, cst.Nonlocal)):
            if any(n.name.value == name for n in node.names):
                return True
        elif _named([node], name):
            return True
    return False


__all__ = ["Deferred", "DeferredRead", "deferred_reads"]
