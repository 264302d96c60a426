"""Which method calls of the program only store what they compute in their object.

pytorch/examples' imagenet records ``top1.update(acc1[0], images.size(0))``
after its optimizer step; ``AverageMeter.update`` keeps the value and sums
it (``self.val = val; self.sum += val * n; self.count += n; self.avg =
self.sum / self.count``).  Handed a tensor, it computes on the device: after
the barrier, a graph of its own, which the progress line's read of
``top1.avg`` runs (one a meter).  Before the barrier it joins the step's
graph, and the reads only copy (``analysis.step_tail``).

A *store call* is ``obj.m(args)`` where

* ``obj`` is a plain object (``codemods.analysis.objects``): a name bound
  only to ``C(...)``, ``C`` a class of the module or imported from a module
  of the project (SupContrast's ``from util import AverageMeter``), with no
  base but ``object``, no decorator, no property setter and no attribute
  hook (``__setattr__``, ``__getattr__``, ``__getattribute__``);
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

from typing import Sequence, Set

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.placement import host_read
from codemods.analysis.tensor_functions import (
    BUILTINS,
    QualNames,
    draws_random,
    handed_tensors,
    store_method,
)
from codemods.analysis.objects import method_of
from codemods.analysis.tensors import is_tensor_expr
from codemods.syntax.tree import TreeCache, find_all

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


__all__ = ["reach_no_object", "store_call", "store_receiver", "stores_only"]
