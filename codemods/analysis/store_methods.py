"""Which method calls of the program only store what they compute in their object.

pytorch/examples' imagenet records ``top1.update(acc1[0], images.size(0))``
after its optimizer step; ``AverageMeter.update`` keeps the value and sums
it (``self.val = val; self.sum += val * n; self.count += n; self.avg =
self.sum / self.count``).  Handed a tensor, it computes on the device: after
the barrier, a graph of its own, which the progress line's read of
``top1.avg`` runs (one a meter).  Before the barrier it joins the step's
graph, and the reads only copy (``analysis.step_tail``).

A *store call* is ``obj.m(args)`` where

* ``obj`` is a name bound only to ``C(...)``, ``C`` a class of the module
  or imported from a module of the project (SupContrast's ``from util
  import AverageMeter``), with no base but ``object``, no decorator, no
  property setter and no attribute hook (``__setattr__``, ``__getattr__``,
  ``__getattribute__``);
* ``m`` is a plain method of ``C`` whose lines only compute, as a tensor
  function's do, and store into its own attributes
  (:func:`~codemods.analysis.tensor_functions.store_method`);
* one of ``args`` at least is a tensor, and every call in them computes a
  tensor or a number of one (``images.size(0)``), none a host read.

Such a call changes nothing but ``obj``'s attributes: moved over lines that
do not name ``obj`` and reach no other object but through another store call,
it computes the same values.
"""

from __future__ import annotations

from typing import Optional, Sequence, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.placement import host_read
from codemods.analysis.tensor_functions import (
    BUILTINS,
    QualNames,
    draws_random,
    handed_tensors,
    imported_def,
    quick_qualnames,
    store_method,
)
from codemods.analysis.tensors import is_tensor_expr
from codemods.syntax.tree import TreeCache, find_all

_HOOKS = frozenset({"__setattr__", "__getattr__", "__getattribute__", "__delattr__"})


def store_call(tree: TreeCache, call: cst.Call, tensors: Set[str], qualnames: QualNames) -> bool:
    """``call`` is a store call (see the module doc)."""
    return (any(is_tensor_expr(a.value, tensors, qualnames) for a in call.args)
            and all(_computes(tree, a.value, tensors, qualnames) for a in call.args)
            and stores_only(tree, call, tensors, qualnames))


def stores_only(tree: TreeCache, call: cst.Call, tensors: Set[str], qualnames: QualNames) -> bool:
    """``call`` runs a store method of a plain object (the first two points
    of the module doc; its arguments anything: ``losses.update(loss.item(), n)``)."""
    if any(a.star for a in call.args):
        return False
    found = method_of(tree, call, qualnames)
    if found is None:
        return False
    owner, method, own = found
    params = handed_tensors(_without_self(method), call, tensors, qualnames)
    return params is not None and store_method(owner, method, own, params)


def method_of(tree: TreeCache, call: cst.Call, qualnames: QualNames,
              or_none: bool = False) -> Optional[Tuple[TreeCache, cst.FunctionDef, QualNames]]:
    """For ``obj.m(...)``, ``obj`` a plain object of the program
    (:func:`instance_class`): the tree its class is defined in, the method
    ``m`` there, and the qualified names to read that tree with."""
    func = call.func
    if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Name):
        return None
    found = instance_class(tree, func.value, or_none)
    if found is None:
        return None
    owner, cls = found
    method = next((s for s in _body(cls) if isinstance(s, cst.FunctionDef) and s.name.value == func.attr.value), None)
    return None if method is None else (owner, method, qualnames if owner is tree else quick_qualnames(owner))


def reach_no_object(tree: TreeCache, stmts: Sequence[cst.CSTNode], tensors: Set[str], qualnames: QualNames) -> bool:
    """Every call in ``stmts`` is a torch op, a method of a tensor (a host
    read among them), a size, a builtin of a tensor function's or a store
    method of another plain object: none can see an object's attributes
    through an alias (a progress line printing the meters it holds)."""
    for stmt in stmts:
        for call in find_all(stmt, cst.Call):
            func = call.func  # type: ignore[attr-defined]
            if isinstance(func, cst.Name) and func.value in BUILTINS and not binding_nodes(tree, func):
                continue
            if not _computes(tree, call, tensors, qualnames, reads=True) and not stores_only(  # type: ignore[arg-type]
                    tree, call, tensors, qualnames):  # type: ignore[arg-type]
                return False
    return True


def store_receiver(call: cst.Call) -> str:
    """The name a store call is made on (``top1``)."""
    return call.func.value.value  # type: ignore[attr-defined,no-any-return]


def instance_class(tree: TreeCache, name: cst.Name, or_none: bool = False) -> Optional[Tuple[TreeCache, cst.ClassDef]]:
    """(the tree it is defined in, the class) where every binding of ``name``
    is ``name = C(...)`` of one plain class ``C`` of the program (or, with
    ``or_none``, ``name = None``: ermongroup/ddim's ``ema_helper`` where the
    average is turned off); else None."""
    found: Optional[Tuple[TreeCache, cst.ClassDef]] = None
    bindings = binding_nodes(tree, name)
    for bound in bindings:
        if or_none and _bound_to_none(tree, bound):
            continue
        made = made_by(tree, bound)
        cls = _class_of(tree, made.func) if made is not None and isinstance(made.func, cst.Name) else None
        if cls is None or found is not None and found[1] is not cls[1]:
            return None
        found = cls
    return found if bindings and found is not None and _plain(found[1]) else None


def _bound_to_none(tree: TreeCache, bound: cst.CSTNode) -> bool:
    """``name = None``."""
    target = tree.parents.get(id(bound))
    assign = tree.parents.get(id(target)) if isinstance(target, cst.AssignTarget) else None
    return (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Name)
            and assign.value.value == "None")


def made_by(tree: TreeCache, bound: cst.CSTNode) -> Optional[cst.Call]:
    """The call a binding of a name is: ``top1 = C(...)``, or its place in
    ``losses, top1 = C(...), C(...)``; None for any other binding."""
    parent = tree.parents.get(id(bound))
    index = None
    if isinstance(parent, cst.Element):
        names = tree.parents.get(id(parent))
        if not isinstance(names, (cst.Tuple, cst.List)):
            return None
        index = next(i for i, e in enumerate(names.elements) if e is parent)
        parent = tree.parents.get(id(names))
    assign = tree.parents.get(id(parent)) if isinstance(parent, cst.AssignTarget) else None
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    value = assign.value
    if index is not None:
        size = len(names.elements)  # type: ignore[union-attr]
        if not isinstance(value, (cst.Tuple, cst.List)) or len(value.elements) != size or any(
                isinstance(e, cst.StarredElement) for e in (*value.elements, *names.elements)):  # type: ignore[union-attr]
            return None
        value = value.elements[index].value
    return value if isinstance(value, cst.Call) else None


def _class_of(tree: TreeCache, name: cst.Name) -> Optional[Tuple[TreeCache, cst.ClassDef]]:
    classes = [b for b in binding_nodes(tree, name) if isinstance(b, cst.ClassDef)]
    if len(classes) == 1 and len(binding_nodes(tree, name)) == 1:
        return tree, classes[0]
    found = imported_def(tree, name, cst.ClassDef)
    return found  # type: ignore[return-value]


def _plain(cls: cst.ClassDef) -> bool:
    """No base but ``object``, no decorator, no attribute hook, no property setter."""
    if cls.decorators or cls.keywords or any(
            not (isinstance(b.value, cst.Name) and b.value.value == "object") for b in cls.bases):
        return False
    for stmt in _body(cls):
        if isinstance(stmt, cst.FunctionDef) and (stmt.name.value in _HOOKS or any(
                isinstance(d.decorator, cst.Attribute) and d.decorator.attr.value in ("setter", "deleter")
                for d in stmt.decorators)):
            return False
    return True


def _body(cls: cst.ClassDef):  # type: ignore[no-untyped-def]
    return cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()


def _without_self(method: cst.FunctionDef) -> cst.FunctionDef:
    """The method as its callers see it: ``self`` not among its parameters."""
    params = method.params
    if params.posonly_params:
        return method.with_changes(params=params.with_changes(posonly_params=params.posonly_params[1:]))
    return method.with_changes(params=params.with_changes(params=params.params[1:]))


# what gives a number of a tensor's shape (``images.size(0)``), whatever the name is known to hold
_SIZES = frozenset({"size", "dim", "numel"})


def _computes(tree: TreeCache, expr: cst.BaseExpression, tensors: Set[str], qualnames: QualNames,
              reads: bool = False) -> bool:
    """Every call in ``expr`` is a torch op, a method of a tensor or a size
    (``images.size(0)``, ``len(x)``), none a host read (unless ``reads``) or a random draw."""
    for call in find_all(expr, cst.Call):
        func = call.func  # type: ignore[attr-defined]
        torch_op = any(q.startswith("torch.") for q in qualnames(func))
        method = isinstance(func, cst.Attribute) and (is_tensor_expr(func.value, tensors, qualnames)
                                                      or func.attr.value in _SIZES)
        size = isinstance(func, cst.Name) and func.value == "len" and not binding_nodes(tree, func)
        if not (torch_op or method or size) or not reads and host_read(tree, call, tensors, qualnames):  # type: ignore[arg-type]
            return False
    return reads or not draws_random(expr)


__all__ = ["instance_class", "made_by", "method_of", "reach_no_object", "store_call", "store_receiver", "stores_only"]
