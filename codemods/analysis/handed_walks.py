"""Pairs of a device tensor's elements that a function hands back, each
caller using those elements only on the host.

minRF's ``RF.forward`` ends with ``ttloss = [(tv, tloss) for tv, tloss in
zip(t, tlist)]`` and ``return batchwise_mse.mean(), ttloss``; its training
loop unpacks ``loss, blsct = rf.forward(x, c)`` and walks ``for t, l in
blsct: lossbin[int(t * 10)] += l``.  Each ``tv`` is an element of device
tensor ``t``: a graph and a host read of its own in the caller (256 a step,
two executions each).  Where every caller in the program uses the element
only on the host (``element_walks.host_only``), the comprehension may walk
``t.cpu()``: the same elements, tensors of the same values and dtypes, from
one read.

A *handed-back walk* holds only where that is certain:

* the comprehension only regroups what it walks: ``[(a, b) for a, b in
  zip(X, Y)]``, no condition, no other loop, each name once;
* it is the whole value of ``name = [...]``, the last statement before a
  ``return`` that hands ``name`` back, alone or at one place of a tuple, and
  the function reads ``name`` nowhere else;
* each tensor walked is one the function made (``t = torch.sigmoid(nt)``,
  ``torch.rand(b).to(x.device)``, arithmetic): its elements are views of it,
  and a caller's optimizer step would show in the views of a parameter or a
  buffer, not in a copy;
* the function is a method of a plain class of the module (``objects``) or a
  function of the module, the module no other project module imports
  (``importers.imported_elsewhere``), and every mention of it is a call
  whose result is bound to one name (``loss, blsct = rf.forward(x, c)``, at
  the place the function hands it back) that is only walked, by ``for``
  loops that unpack each pair into names and use the device elements only
  on the host, those names read nowhere else.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import libcst as cst

from codemods.analysis.bindings import assigned_value, binding_nodes
from codemods.analysis.cuda import scope_of
from codemods.analysis.element_walks import (Elements, HostWalk, element_pairs, host_only, pair_of_tensors,
                                             pure_walked, read_elsewhere, root)
from codemods.analysis.importers import imported_elsewhere
from codemods.analysis.objects import instance_class
from codemods.syntax.tree import TreeCache, find_all

Predicate = Callable[[cst.BaseExpression], bool]


def handed_back_walk(tree: TreeCache, comp: cst.ListComp, fn: cst.FunctionDef, is_tensor: Predicate,
                     on_host: Predicate) -> Optional[HostWalk]:
    """The host walk of ``comp`` (in ``fn``) as a handed-back walk (see the module doc), or None."""
    first = comp.for_in
    if first.asynchronous is not None or first.ifs or first.inner_for_in is not None:
        return None
    pairs = element_pairs(first.target, first.iter)
    if not pairs or not isinstance(comp.elt, cst.Tuple):
        return None
    names = [e.value.value if isinstance(e.value, cst.Name) else None for e in comp.elt.elements]
    targets = [e.value.value for e in first.target.elements] if isinstance(first.target, cst.Tuple) else []
    if None in names or sorted(names) != sorted(targets) or len(set(names)) != len(names):  # type: ignore[type-var]
        return None  # (not a regrouping of what it walks)
    walked = [(names.index(name), tensor) for name, tensor in pairs if is_tensor(tensor)]
    if not walked or not all(pure_walked(t) and not pair_of_tensors(t) for _, t in walked):
        return None
    handed = _handed_back(tree, comp, fn)
    if handed is None or not all(_made_here(tree, t, fn) for _, t in walked):
        return None
    place, name = handed
    calls = _calls_of(tree, fn)
    if not calls or imported_elsewhere(tree.filename):
        return None
    for call in calls:
        if not _walked_on_host(tree, call, place, [k for k, _ in walked], len(names), on_host):
            return None
    iterable = first.iter
    wrapped = isinstance(iterable, cst.Call)
    places = tuple(i for i, a in enumerate(iterable.args) if any(a.value is t for _, t in walked)) if wrapped else ()
    return HostWalk(tuple(t for _, t in walked), places)


def _handed_back(tree: TreeCache, comp: cst.ListComp, fn: cst.FunctionDef) -> Optional[Tuple[Optional[int], str]]:
    """(its place in the tuple handed back, or None for the whole value; the name) for ``name = [...]`` followed
    by the ``return`` that hands ``name`` back; the name read nowhere else in ``fn``."""
    assign = tree.parents.get(id(comp))
    line = tree.parents.get(id(assign))
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target,
                                                                                        cst.Name)):
        return None
    body = fn.body.body if isinstance(fn.body, cst.IndentedBlock) else ()
    at = next((i for i, st in enumerate(body) if st is line), None)
    if at is None or at + 1 >= len(body) or not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    after = body[at + 1]
    ret = after.body[0] if isinstance(after, cst.SimpleStatementLine) and len(after.body) == 1 else None
    if not isinstance(ret, cst.Return) or ret.value is None:
        return None
    name = assign.targets[0].target.value
    if isinstance(ret.value, cst.Name) and ret.value.value == name:
        place: Optional[int] = None
    elif isinstance(ret.value, cst.Tuple):
        at_places = [i for i, e in enumerate(ret.value.elements) if isinstance(e.value, cst.Name) and e.value.value == name]
        if len(at_places) != 1 or any(isinstance(e, cst.StarredElement) for e in ret.value.elements):
            return None
        place = at_places[0]
    else:
        return None
    reads = [n for n in find_all(fn, cst.Name) if n.value == name]
    return (place, name) if len(reads) == 2 else None  # (the binding and the return)


def _made_here(tree: TreeCache, walked: cst.BaseExpression, fn: cst.FunctionDef) -> bool:
    """The walked tensor's name is bound in ``fn`` only to tensors made there."""
    name = root(walked)
    if name is None:
        return False
    bindings = binding_nodes(tree, name)
    values = [assigned_value(tree, b) for b in bindings]
    return bool(bindings) and all(v is not None and _new_tensor(v) and scope_of(v, tree) is fn for v in values)


# tensor functions and methods whose result may share the storage of what they are handed
_VIEWS = frozenset({"view", "view_as", "reshape", "flatten", "squeeze", "unsqueeze", "narrow", "select", "t",
                    "transpose", "permute", "expand", "expand_as", "chunk", "split", "unbind", "as_strided",
                    "diagonal", "movedim", "swapaxes", "detach", "to", "cuda", "cpu", "type", "float", "double",
                    "half", "long", "int", "bfloat16", "contiguous", "requires_grad_", "data"})


def _new_tensor(value: cst.BaseExpression) -> bool:
    """A tensor made by this expression, sharing no storage it was handed: arithmetic, a torch function or a
    method that computes (``torch.sigmoid(nt)``, ``x.sum(1)``), or one that may return its input
    (``.to(device)``, ``.view(-1)``) of such a tensor."""
    if isinstance(value, (cst.BinaryOperation, cst.UnaryOperation)):
        return True
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "torch":
        return func.attr.value not in _VIEWS
    if isinstance(func, cst.Attribute):
        return _new_tensor(func.value) if func.attr.value in _VIEWS else not isinstance(func.value, cst.Name) or \
            func.value.value != "self"
    return False


def _calls_of(tree: TreeCache, fn: cst.FunctionDef) -> List[cst.Call]:
    """Every call of ``fn`` in the module, where every mention of it is one: ``obj.m(...)`` of a plain object of
    its class, or ``f(...)`` of a module function; [] where any mention is something else."""
    cls = tree.parents.get(id(tree.parents.get(id(fn))))
    method = isinstance(cls, cst.ClassDef)
    if not method and tree.parents.get(id(fn)) is not tree.module:
        return []
    calls: List[cst.Call] = []
    if method:
        for attr in find_all(tree.module, cst.Attribute):
            if attr.attr.value != fn.name.value:
                continue
            call = tree.parents.get(id(attr))
            if not (isinstance(call, cst.Call) and call.func is attr and isinstance(attr.value, cst.Name)):
                return []
            owner = instance_class(tree, attr.value)
            if owner is None or owner[1] is not cls:
                return []
            calls.append(call)
    else:
        for name in find_all(tree.module, cst.Name):
            if name.value != fn.name.value or name is fn.name:
                continue
            call = tree.parents.get(id(name))
            if not (isinstance(call, cst.Call) and call.func is name):
                return []
            calls.append(call)
    return calls


def _walked_on_host(tree: TreeCache, call: cst.Call, place: Optional[int], elements: List[int], size: int,
                    on_host: Predicate) -> bool:
    """The call's result (at ``place``) bound to one name only walked by ``for`` loops that unpack ``size`` names
    and use those at ``elements`` only on the host."""
    assign = tree.parents.get(id(call))
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.value is call):
        return False
    target = assign.targets[0].target
    if place is None:
        bound = target
    elif isinstance(target, (cst.Tuple, cst.List)) and place < len(target.elements) and not any(
            isinstance(e, cst.StarredElement) for e in target.elements):
        bound = target.elements[place].value
    else:
        return False
    if not isinstance(bound, cst.Name) or len(binding_nodes(tree, bound)) != 1:
        return False
    scope = scope_of(assign, tree)
    for read in (n for part in _own_statements(scope) for n in find_all(part, cst.Name)):
        if read.value != bound.value or read is bound:
            continue
        loop = tree.parents.get(id(read))
        if not (isinstance(loop, cst.For) and loop.iter is read and loop.asynchronous is None and loop.orelse is None
                and isinstance(loop.target, cst.Tuple) and len(loop.target.elements) == size
                and all(isinstance(e.value, cst.Name) for e in loop.target.elements)):
            return False
        names = {loop.target.elements[k].value.value for k in elements}  # type: ignore[attr-defined]
        if not host_only(loop.body, Elements(names), on_host) or any(
                read_elsewhere(part, n, loop) for part in _own_statements(scope) for n in names):
            return False
    return True


def _own_statements(scope: cst.CSTNode) -> List[cst.CSTNode]:
    """A scope's statements, less the functions and classes the module defines (names of their own)."""
    if isinstance(scope, cst.Module):
        return [st for st in scope.body if not isinstance(st, (cst.FunctionDef, cst.ClassDef))]
    return [scope]


__all__ = ["handed_back_walk"]
