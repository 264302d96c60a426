"""Which numbers a training step reads on the host before its optimizer step
and uses only after it.

pytorch/examples' DCGAN (and the PyTorch DCGAN tutorial) reads ``D_x =
output.mean().item()`` after the discriminator's backward, ``D_G_z1`` after
the fake batch's and ``D_G_z2`` after the generator's, and prints them at the
end of the step.  On XLA each read runs the part of the step it needs as a
graph of its own, the forwards again: four executions a step.  The mean is
computed where it is (``D_x_step = output.mean()``, part of the step's graph)
and read once the step is computed (``D_x = D_x_step.item()`` after its
barrier): one execution, the same numbers (``codemods/deferred_reads.py``).

A read is deferred when its line is ``name = <tensor>.item()`` at the
loop's own level before the optimizer step, where

* the tensor is computed on the line (a torch op or a method of a tensor
  that computes, ``output.mean()``; not a view, whose values the step could
  change in place), and draws no random numbers; or it is a name the body
  bound to such a computation, or to a loss of ``torch.nn``, before (``loss
  = criterion(out, y)``, then ``value = loss.item()``), that nothing from
  there to the step's end touches but its ``backward()``;
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

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.cuda import scope_of
from codemods.analysis.loops import body_statements
from codemods.analysis.pass_reads import has_exit
from codemods.analysis.step_tail import VIEWS, QualNames, computes, step_end
from codemods.analysis.objects import made_by
from codemods.analysis.tensor_functions import draws_random
from codemods.syntax.tree import TreeCache, find_all

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
        if isinstance(tensor, cst.Name) and not _fresh(tree, stmts[:i], between, tensor.value, tensors, qualnames):
            continue
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
    if isinstance(tensor, cst.Name):
        return (small.targets[0].target.value, tensor) if tensor.value in tensors else None
    if not _computed(tensor) or draws_random(tensor) or not computes(tree, tensor, tensors, qualnames):
        return None
    return small.targets[0].target.value, tensor


def _fresh(tree: TreeCache, before: Sequence[cst.CSTNode], between: Sequence[cst.CSTNode], name: str,
           tensors: Set[str], qualnames: QualNames) -> bool:
    """``name`` was last bound, at the body's own level, to a tensor computed
    there (no view: nothing else holds it), and the lines ``between`` name it
    only to call its ``backward()``."""
    binding = None
    for stmt in before:
        if _named_binding(stmt, name):
            binding = stmt
    if binding is None or not isinstance(binding, cst.SimpleStatementLine) or len(binding.body) != 1:
        return False
    small = binding.body[0]
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
            and _computed(small.value) and (computes(tree, small.value, tensors, qualnames)
                                            or _loss(tree, small.value, qualnames))):
        return False
    backward = {id(c.func.value) for s in between for c in find_all(s, cst.Call)  # type: ignore[attr-defined]
                if isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"}  # type: ignore[attr-defined]
    return all(id(n) in backward for s in between for n in find_all(s, cst.Name) if n.value == name)  # type: ignore[attr-defined]


def _loss(tree: TreeCache, value: cst.BaseExpression, qualnames: QualNames) -> bool:
    """``criterion(out, y)``, ``criterion`` bound only to a loss of ``torch.nn``
    (``nn.CrossEntropyLoss()``): a new tensor, no module's parameter."""
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
        return False
    bindings = binding_nodes(tree, value.func)
    made = [made_by(tree, b) for b in bindings]
    return bool(made) and all(m is not None and any(q.startswith("torch.nn.") and q.endswith("Loss")
                                                    for q in qualnames(m.func)) for m in made)


def _named_binding(stmt: cst.CSTNode, name: str) -> bool:
    """``stmt`` binds ``name`` (an assignment, a loop, a ``with ... as``, a ``del``...), at any depth."""
    for node in find_all(stmt, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.WithItem, cst.Del,
                                cst.NamedExpr, cst.CompFor)):
        target = getattr(node, "target", None) or getattr(getattr(node, "asname", None), "name", None)
        if target is not None and any(n.value == name for n in find_all(target, cst.Name)):  # type: ignore[attr-defined]
            return True
    return False


def _computed(expr: cst.BaseExpression) -> bool:
    """The tensor is made on the line, not a name, an attribute or a view of one."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in VIEWS:
        expr = expr.func.value
    while isinstance(expr, cst.Attribute) and expr.attr.value in VIEWS:
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
