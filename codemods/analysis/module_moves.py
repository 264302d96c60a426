"""Where a model was moved: the device of the last ``.to(...)`` that runs
before a given read of its name.

``model.to(device)`` moves a module in place, so it is no binding and the
dataflow (:mod:`codemods.analysis.dataflow`) does not see it; the rules
that must know that a model already sits on a device (XLA423: an
``AveragedModel`` made on that same device needs no ``device=``) ask
:func:`moved_to`.  It walks back from the statement holding the name over
the statements that run before it -- its own block, then each enclosing
block, up to its function or the module -- and answers with the device
expression of the first move it meets:

* ``m = m.to(d)``, ``m = Net(...).to(d)`` (a binding whose value ends in
  ``.to(d)``);
* ``m.to(d)`` as a statement (``m.cpu()``, ``m.cuda()`` and the other
  in-place moves of ``MOVES`` end the walk: they name no device here).

Anything else that binds the name first (``m = Net()``, a ``for`` or
``with`` target, a parameter), a compound statement in between that binds
or moves it (on some paths only), or a loop around the read that binds or
moves it after the read (the next pass meets that first), ends the walk
with no answer.
"""

from __future__ import annotations

from typing import Optional, Sequence, Set, Union

import libcst as cst

from codemods.analysis.bindings import target_names
from codemods.analysis.step_tail import bound_names
from codemods.syntax.tree import TreeCache, find_all

# the methods that move a module in place (``model.cuda()``, ``model.cpu()``): of these only ``.to(d)`` names
# the device here; any other is a move elsewhere, or to a device not named
MOVES = frozenset({"to", "cuda", "cpu", "to_empty", "xpu", "mps"})
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
_STOP = object()  # the walk ends: bound or moved some other way


def moved_to(tree: TreeCache, name: cst.Name) -> Optional[cst.BaseExpression]:
    """The device expression ``d`` of the last ``.to(d)`` that moved the
    module ``name`` before this read of it, or None (see the module doc)."""
    stmt: cst.CSTNode = tree.statement_of(name)
    while True:
        block = tree.parents.get(id(stmt))
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return None  # a one-line body (`if x: ema = ...`): not walked
        before = list(block.body)[: _index(block.body, stmt)]
        for st in reversed(before):
            found = _move(st, name.value)
            if found is _STOP:
                return None
            if found is not None:
                return found  # type: ignore[return-value]
        if isinstance(block, cst.Module):
            return None
        owner = _owner(tree, block)
        if owner is None or isinstance(owner, _SCOPES):
            return None
        if isinstance(owner, (cst.For, cst.While)) and _move(owner, name.value) is _STOP:
            return None  # bound or moved later in the loop: the next pass meets that first
        stmt = owner


def _index(body: Sequence[cst.CSTNode], stmt: cst.CSTNode) -> int:
    return next(i for i, st in enumerate(body) if st is stmt)


def _owner(tree: TreeCache, block: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The compound statement whose body (or ``else``/``except``/``finally``) ``block`` is."""
    cur = tree.parents.get(id(block))
    while cur is not None and not isinstance(cur, cst.BaseCompoundStatement):
        cur = tree.parents.get(id(cur))
    return cur


def _move(st: cst.CSTNode, name: str) -> Union[None, object, cst.BaseExpression]:
    """What ``st`` says about the module ``name``: the device it was moved to,
    ``_STOP`` (bound or moved some other way), or None (nothing)."""
    if isinstance(st, cst.SimpleStatementLine):
        for small in reversed(st.body):
            found = _small(small, name)
            if found is not None:
                return found
        return None
    if isinstance(st, _SCOPES):
        return _STOP if getattr(st, "name", None) is not None and st.name.value == name else None  # type: ignore[attr-defined]
    if name in _binds(st) or any(_moved(c) == name for c in find_all(st, cst.Call, stop=_SCOPES)):
        return _STOP  # bound or moved on some path only
    return None


def _small(small: cst.BaseSmallStatement, name: str) -> Union[None, object, cst.BaseExpression]:
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and _moved(small.value) == name:
        call = small.value
        return (_device(call) if call.func.attr.value == "to" else None) or _STOP  # type: ignore[attr-defined]
    value: Optional[cst.BaseExpression] = None
    if isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name
                                             for t in small.targets):
        value = small.value
    elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.target.value == name:
        value = small.value
    elif name in bound_names(small):
        return _STOP
    if value is None:
        return None
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "to":
        return _device(value) or _STOP
    return _STOP


def _binds(st: cst.CSTNode) -> Set[str]:
    """The names a compound statement binds anywhere in it (assignments, ``for`` and ``with ... as`` targets)."""
    out = bound_names(st)
    for loop in find_all(st, (cst.For, cst.CompFor), stop=_SCOPES):
        out |= {n.value for n in target_names(loop.target)}  # type: ignore[attr-defined]
    for item in find_all(st, cst.WithItem, stop=_SCOPES):
        if item.asname is not None:  # type: ignore[attr-defined]
            out |= {n.value for n in target_names(item.asname.name)}  # type: ignore[attr-defined]
    return out


def _moved(call: cst.Call) -> Optional[str]:
    """``m`` for ``m.to(...)``, ``m.cuda()``, ``m.cpu()`` (``MOVES``)."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in MOVES and isinstance(func.value, cst.Name):
        return func.value.value
    return None


def _device(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The device ``.to(d)``/``.to(device=d)`` names (not a dtype: the caller compares it with another device)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "device":
            return arg.value
    if call.args and call.args[0].keyword is None and not call.args[0].star:
        return call.args[0].value
    return None


__all__ = ["MOVES", "moved_to"]
