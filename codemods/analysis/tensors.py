"""Which names hold tensors: from torch calls, model calls, loader batches,
or arithmetic on other tensors (as far as a syntactic look can tell)."""

from __future__ import annotations

import re
from typing import Callable, Iterable, Optional, Set

import libcst as cst

from codemods.analysis.kinds import NON_TENSOR_METHODS, NON_TENSOR_TORCH
from codemods.analysis.project import TENSOR, returned
from codemods.syntax.tree import call_name, dotted, find_all

QualNames = Callable[[cst.CSTNode], Set[str]]
_DEFS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)

_MODEL_RE = re.compile(
    r"(^|_|\.)(model|net|criterion|loss_fn|loss_func|lossfn|unet|vae|encoder|decoder|"
    r"transformer|classifier|head|backbone|generator|discriminator)s?(\.|$|_)",
    re.IGNORECASE,
)


def is_tensor_expr(node: cst.CSTNode, tensors: Set[str], qualnames: QualNames, values: object = None) -> bool:
    """``node`` evaluates to a tensor: a tensor name, a torch op, a tensor
    method, a model's output (a callee the dataflow knows holds a model --
    ``codemods.analysis.values`` -- or, failing that, named like one: a name
    of this module, or a project module's function that returns a tensor)."""
    if isinstance(node, cst.Name):
        return node.value in tensors
    if isinstance(node, cst.Call):
        q = qualnames(node.func)
        if any(n.startswith("torch.") and not n.startswith(NON_TENSOR_TORCH) for n in q):
            return True
        func = node.func
        if isinstance(func, cst.Attribute):
            if func.attr.value in NON_TENSOR_METHODS:
                return False
            if is_tensor_expr(func.value, tensors, qualnames, values):
                return True
        callee = dotted(func) or ""
        # named like a model: a name of this module, or a function of another
        # project module that returns a tensor (TCN's `data_generator` gives
        # tensors in one program, loaders in another; a library's
        # `is_deepspeed_zero3_enabled` or `MODEL_NAMES.values()` none)
        if callee and _MODEL_RE.search(callee) and (not q or (values is not None and returned(
                values.tree, values.tree.filename, node, TENSOR))):  # type: ignore[attr-defined]
            return True
        if values is not None and (isinstance(func, cst.Name) or callee.startswith("self.")):
            return bool(values.of(func) & {"module", "loaded"})  # type: ignore[attr-defined]
        return False
    if isinstance(node, cst.Subscript):
        return is_tensor_expr(node.value, tensors, qualnames, values)
    if isinstance(node, cst.BinaryOperation):
        return is_tensor_expr(node.left, tensors, qualnames, values) or is_tensor_expr(node.right, tensors, qualnames, values)
    if isinstance(node, cst.UnaryOperation):
        return is_tensor_expr(node.expression, tensors, qualnames, values)
    if isinstance(node, cst.Comparison):  # `out.argmax(1) == y`: elementwise (not `is`, `in`)
        return all(isinstance(c.operator, _ELEMENTWISE) for c in node.comparisons) and any(
            is_tensor_expr(n, tensors, qualnames, values) for n in (node.left, *(c.comparator for c in node.comparisons)))
    if isinstance(node, cst.Attribute):
        return node.attr.value in {"grad", "data", "T", "mT", "real", "imag"} and is_tensor_expr(
            node.value, tensors, qualnames, values
        )
    return False


_ELEMENTWISE = (cst.Equal, cst.NotEqual, cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)

# methods a name is called with that only a tensor has: a NumPy array's
# ``size`` is an int, not a method, and it has no ``dim``/``narrow``/``numel``
_TENSOR_ONLY_CALLS = frozenset({"size", "dim", "narrow", "numel", "nelement", "ndimension", "unsqueeze",
                                "contiguous", "index_select", "masked_fill"})


def used_as_tensor(fn: cst.FunctionDef, name: str) -> bool:
    """Does ``fn`` call a method on its ``name`` that only a tensor has
    (``source.size(1)``, TCN's ``get_batch``)?"""
    return any(isinstance(c.func, cst.Attribute) and c.func.attr.value in _TENSOR_ONLY_CALLS  # type: ignore[attr-defined]
               and isinstance(c.func.value, cst.Name) and c.func.value.value == name  # type: ignore[attr-defined]
               for c in find_all(fn.body, cst.Call, stop=_DEFS))


def tensor_names(scope_node: cst.CSTNode, qualnames: QualNames, loader_loops: Iterable[cst.For] = (),
                 values: object = None, known: Iterable[str] = ()) -> Set[str]:
    """Names that hold tensors inside a function (or module) body; ``known``:
    names known to hold tensors there already (a function's parameters that
    a call hands tensors)."""
    tensors: Set[str] = set(known)
    for loop in loader_loops:
        target = loop.target
        if (isinstance(loop.iter, cst.Call) and call_name(loop.iter) == "enumerate"
                and isinstance(target, cst.Tuple) and len(target.elements) == 2):
            target = target.elements[1].value  # the counter is an int
        tensors |= {n.value for n in find_all(target, cst.Name)}
    for call in find_all(scope_node, cst.Call, stop=_DEFS):
        if call_name(call) == "backward" and isinstance(call.func, cst.Attribute):  # type: ignore[attr-defined]
            # `loss.backward()`: loss is a tensor; `accelerator.backward(loss)`:
            # the argument is, not the object (accelerate, Lightning fabric)
            positional = [a for a in call.args if a.keyword is None]  # type: ignore[attr-defined]
            base = positional[0].value if positional else call.func.value  # type: ignore[attr-defined]
            if isinstance(base, cst.Name):
                tensors.add(base.value)
    assigns = find_all(scope_node, cst.Assign, stop=_DEFS) + find_all(scope_node, cst.AugAssign, stop=_DEFS)
    for _ in range(3):  # a few rounds reach a fixed point for straight-line code
        before = len(tensors)
        for a in assigns:
            value = a.value  # type: ignore[attr-defined]
            if isinstance(a, cst.Assign):  # `x, y = batch["x"], batch["y"]`: pair by pair
                for t in a.targets:
                    for name, item in _pairs(t.target, value):
                        if is_tensor_expr(item, tensors, qualnames, values):
                            tensors.add(name)
            if not is_tensor_expr(value, tensors, qualnames, values):
                continue
            if isinstance(a, cst.AugAssign):
                if isinstance(a.target, cst.Name):
                    tensors.add(a.target.value)
                continue
            for t in a.targets:  # type: ignore[attr-defined]
                if isinstance(t.target, cst.Name):
                    tensors.add(t.target.value)
                elif isinstance(t.target, cst.Tuple):
                    tensors |= {e.value.value for e in t.target.elements if isinstance(e.value, cst.Name)}
        if len(tensors) == before:
            break
    return tensors


def annotated_tensors(fn: cst.FunctionDef, qualnames: QualNames) -> Set[str]:
    """The parameters of ``fn`` annotated as tensors (``x: torch.Tensor``,
    ``x: Tensor`` imported from torch)."""
    params = [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]
    return {p.name.value for p in params
            if p.annotation is not None and "torch.Tensor" in qualnames(p.annotation.annotation)}


def _pairs(target: cst.BaseExpression, value: cst.BaseExpression):  # type: ignore[no-untyped-def]
    """``(name, expression)`` for each name a tuple assignment binds from a
    tuple of the same length (``a, b = x, y``); nothing otherwise."""
    if not (isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List))):
        return []
    names, items = target.elements, value.elements
    if len(names) != len(items) or any(isinstance(e, cst.StarredElement) for e in (*names, *items)):
        return []
    return [(n.value.value, v.value) for n, v in zip(names, items) if isinstance(n.value, cst.Name)]


def reads_tensor_value(node: cst.CSTNode, tensors: Set[str], qualnames: QualNames) -> Optional[cst.CSTNode]:
    """Like :func:`reads_tensor`, but a tensor only used for its metadata
    (``t.shape``, ``t.dtype``, ``len(t)``, ``t.size()``) does not count."""
    hit = None

    class _V(cst.CSTVisitor):
        def visit_Attribute(self, n: cst.Attribute) -> bool:
            if n.attr.value not in {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "names"}:
                n.value.visit(self)  # (`meter.loss`: the attribute's name is no read of a `loss`)
            return False

        def visit_Arg(self, n: cst.Arg) -> bool:
            n.value.visit(self)  # (`.format(loss=losses)`: the keyword is no read of a `loss`)
            return False

        def visit_Call(self, n: cst.Call) -> bool:
            nonlocal hit
            name = call_name(n)
            if isinstance(n.func, cst.Attribute) and name in {"item", "tolist", "numpy"} and hit is None:
                hit = n
            if name in {"len", "isinstance", "type", "id", "hasattr"}:
                return False
            if isinstance(n.func, cst.Attribute) and name in {"size", "dim", "numel"}:
                return False
            return True

        def visit_Name(self, n: cst.Name) -> None:
            nonlocal hit
            if hit is None and n.value in tensors:
                hit = n

    node.visit(_V())
    return hit
