"""Which in-place ops write the tensor a function hands back, on a tensor it has just made.

pytorch/examples' imagenet ``accuracy`` (copied into MoCo, SupContrast and
many more) ends with ``res.append(correct_k.mul_(100.0 / batch_size))``; the
caller keeps a view of the result (``top1.update(acc1[0], n)``) and prints it
after the step.  On XLA a view of a tensor written in place is computed from
that write again each time it is read, after the step's barrier too: a graph
execution for every read (imagenet at ``--print-freq 1``: 20 executions over
6 batches; 8 with ``correct_k.mul(...)``).  The out-of-place op gives the
same values in a new tensor, of which a view read after the barrier only
copies.

An *in-place result* is a call ``t.op_(args)`` in a function where

* ``op_`` is an elementwise in-place op with an out-of-place twin of the
  same arguments (``mul_`` and ``mul``: :data:`TWINS`);
* its value is what the function returns (``return t.mul_(c)``) or appends
  to a list (``res.append(t.mul_(c))``);
* ``t`` is a name of the function (no parameter; no ``global``/``nonlocal``;
  named by no function, lambda or class inside it) bound only to a tensor the
  function has just computed, a new one (a reduction, arithmetic, a clone:
  :func:`_fresh`), and read nowhere but as this call's receiver: nothing
  else holds the tensor, so nothing could see it change;
* every argument is a number: constants and names the function binds only
  to numbers (``batch_size = target.size(0)``), never a tensor, whose type
  could make the out-of-place result another dtype than the in-place one.
"""

from __future__ import annotations

from typing import Callable, Iterable, List

import libcst as cst

from codemods.analysis.bindings import binding_nodes, binding_scope
from codemods.syntax.tree import TreeCache, find_all

QualNames = Callable[[cst.CSTNode], Iterable[str]]

# elementwise in-place ops -> their out-of-place twins (the same arguments)
TWINS = {f"{op}_": op for op in ("add", "sub", "mul", "div", "true_divide", "pow", "clamp", "clamp_min", "clamp_max",
                                 "neg", "abs", "exp", "log", "sqrt", "sigmoid", "tanh", "floor", "ceil", "round")}
# what makes a new tensor of a tensor (never the tensor itself, nor a view of it)
_FRESH_METHODS = frozenset({"sum", "mean", "prod", "norm", "std", "var", "amax", "amin", "logsumexp", "cumsum",
                            "clone", "add", "sub", "mul", "div", "pow", "exp", "log", "sqrt", "abs", "neg",
                            "softmax", "log_softmax", "matmul", "mm", "bmm", "eq", "ne", "lt", "le", "gt", "ge"})
_FRESH_TORCH = frozenset({f"torch.{n}" for n in (*_FRESH_METHODS, "zeros", "ones", "full", "tensor", "stack", "cat",
                                                  "zeros_like", "ones_like", "full_like", "arange")})
_NUMBER_METHODS = frozenset({"size", "numel", "dim", "nelement"})
_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def inplace_results(tree: TreeCache, fn: cst.FunctionDef, qualnames: QualNames) -> List[cst.Call]:
    """The in-place results of ``fn`` (see the module doc), in its own body."""
    key = ("inplace_results", id(fn))
    if key not in tree.memo:
        tree.memo[key] = _find(tree, fn, qualnames)
    return tree.memo[key]  # type: ignore[no-any-return]


def _find(tree: TreeCache, fn: cst.FunctionDef, qualnames: QualNames) -> List[cst.Call]:
    found: List[cst.Call] = []
    for call in find_all(fn.body, cst.Call, stop=_SCOPES):
        func = call.func  # type: ignore[attr-defined]
        if (isinstance(func, cst.Attribute) and func.attr.value in TWINS and isinstance(func.value, cst.Name)
                and _handed_back(tree, call) and _only_here(tree, fn, func.value, call, qualnames)
                and all(a.keyword is None and _number(tree, fn, a.value) for a in call.args)):  # type: ignore[attr-defined]
            found.append(call)  # type: ignore[arg-type]
    return found


def _handed_back(tree: TreeCache, call: cst.CSTNode) -> bool:
    """``return <call>`` or ``<list>.append(<call>)``."""
    parent = tree.parents.get(id(call))
    if isinstance(parent, cst.Return):
        return True
    if not isinstance(parent, cst.Arg) or parent.keyword is not None:
        return False
    outer = tree.parents.get(id(parent))
    return (isinstance(outer, cst.Call) and isinstance(outer.func, cst.Attribute) and outer.func.attr.value == "append"
            and len(outer.args) == 1 and isinstance(outer.func.value, cst.Name))


def _only_here(tree: TreeCache, fn: cst.FunctionDef, name: cst.Name, call: cst.CSTNode, qualnames: QualNames) -> bool:
    """``name`` is a local of ``fn`` bound only to new tensors, read only as ``call``'s receiver."""
    if binding_scope(tree, name) is not fn or find_all(fn.body, (cst.Global, cst.Nonlocal)):
        return False
    if any(n.value == name.value for scope in find_all(fn.body, _SCOPES) for n in find_all(scope, cst.Name)):
        return False  # (a function inside could hold it)
    bindings = binding_nodes(tree, name)
    if not bindings or not all(_bound_fresh(tree, b, qualnames) for b in bindings):
        return False
    bound = {id(b) for b in bindings}
    receiver = call.func.value  # type: ignore[attr-defined]
    return all(id(n) in bound or n is receiver
               for n in find_all(fn.body, cst.Name, stop=_SCOPES) if n.value == name.value)  # type: ignore[attr-defined]


def _bound_fresh(tree: TreeCache, bound: cst.CSTNode, qualnames: QualNames) -> bool:
    """A binding ``name = <a new tensor>`` (one target, a plain name)."""
    target = tree.parents.get(id(bound))
    assign = tree.parents.get(id(target)) if isinstance(target, cst.AssignTarget) else None
    return (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.targets[0].target is bound
            and _fresh(assign.value, qualnames))


def _fresh(value: cst.BaseExpression, qualnames: QualNames) -> bool:
    """A tensor made new by the expression: arithmetic, a reduction, a clone
    (``correct[:k].reshape(-1).float().sum(0, keepdim=True)``) -- never the
    tensor it starts from or a view of it (``x.float()`` of a float tensor is
    ``x`` itself).  (That it is a tensor, the in-place call on it says.)"""
    if isinstance(value, cst.BinaryOperation):
        return True
    if isinstance(value, cst.Call):
        if isinstance(value.func, cst.Attribute) and value.func.attr.value in _FRESH_METHODS:
            return True
        return bool(set(qualnames(value.func)) & _FRESH_TORCH)
    return False


def _number(tree: TreeCache, fn: cst.FunctionDef, expr: cst.BaseExpression) -> bool:
    """A number: constants, arithmetic, and names ``fn`` binds only to numbers (``target.size(0)``)."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _number(tree, fn, expr.expression)
    if isinstance(expr, cst.BinaryOperation):
        return _number(tree, fn, expr.left) and _number(tree, fn, expr.right)
    if isinstance(expr, cst.Name):
        if binding_scope(tree, expr) is not fn:
            return False
        bindings = binding_nodes(tree, expr)
        return bool(bindings) and all(_bound_number(tree, fn, b) for b in bindings)
    return False


def _bound_number(tree: TreeCache, fn: cst.FunctionDef, bound: cst.CSTNode) -> bool:
    """A binding ``name = <a number>`` (``batch_size = target.size(0)``)."""
    target = tree.parents.get(id(bound))
    assign = tree.parents.get(id(target)) if isinstance(target, cst.AssignTarget) else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.targets[0].target is bound):
        return False
    value = assign.value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _NUMBER_METHODS:
        args = value.args  # (`x.size(0)`: a number whatever `x` is; `x.size()` is a shape)
        return all(a.keyword is None and isinstance(a.value, cst.Integer) for a in args) and (
            len(args) == 1 if value.func.attr.value == "size" else not args)
    return _number(tree, fn, value)


__all__ = ["TWINS", "inplace_results"]
