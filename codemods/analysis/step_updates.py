"""What follows a training step's optimizer step and only updates tensors on the device.

Diffusion and GAN trainers keep an exponential moving average of the weights
and update it right after the optimizer step: w86763777/pytorch-ddpm's
``ema(net_model, ema_model, decay)`` (``target_dict[key].data.copy_(...)``
over two ``state_dict()``s), ermongroup/ddim's ``ema_helper.update(model)``
(``self.shadow[name].data = ...`` over ``named_parameters()``), rosinality's
``accumulate(g_ema, generator)`` (``par1[k].data.mul_(decay).add_(...)``).
When the body reads the host after the step, its barrier went right after
the step (``codemods.barrier_sites``), and the average was a graph of its
own, run by the next barrier or loader sync: two executions a step.  Such an
update reads nothing on the host, so the barrier may as well follow it: the
average then joins the step's graph.  The barrier moves; no line does, and
no value changes.

An *update call* is a line ``f(args)`` or ``obj.m(args)`` where

* ``f`` is a function of the module, or one imported from a module of the
  project, and ``m`` a method of a plain class of the program that ``obj``
  is bound to (``analysis.objects.instance_class``);
* every call in ``args`` is a torch op or a builtin, none a host read;
* the function is an *update function*: a tensor function's statements
  (``analysis.tensor_functions``), but that it may store into attributes and
  items (``self.shadow[name].data = ...``), change tensors in place
  (``copy_``, ``mul_``, ``torch._foreach_lerp_``), walk a model's tensors
  (``parameters()``, ``named_buffers()``, ``state_dict()`` and the ``keys``,
  ``values`` and ``items`` of what it binds to those), copy one model's
  tensors into another (``load_state_dict``), and call other update
  functions, or other methods of its object (dome272's ``EMA.step_ema``); nothing in it reads a tensor on the host, prints, logs, saves
  or draws random numbers;
* or ``obj.update_parameters(model)`` of a library object, in a module whose
  torch ``AveragedModel``s all keep their step counter on the host
  (``analysis.averages``: made without ``device=``, as XLA423 leaves them).
"""

from __future__ import annotations

from typing import FrozenSet, Optional, Set

import libcst as cst

from codemods.analysis.averages import UPDATE, averages_count_on_host
from codemods.analysis.bindings import binding_nodes
from codemods.analysis.calls import called_functions
from codemods.analysis.cuda import scope_of
from codemods.analysis.placement import host_read
from codemods.analysis.steps import RANDOM_FILLS
from codemods.analysis.objects import QualNames, imported_def, method_of, quick_qualnames
from codemods.analysis.tensor_functions import (
    BUILTINS,
    FunctionCheck,
    names_only,
    torch_op,
)
from codemods.analysis.tensors import is_tensor_expr, tensor_names
from codemods.syntax.tree import TreeCache, find_all

# a model's methods that walk its tensors: one by one, in (name, tensor) pairs, or as a dict
_WALKS = frozenset({"parameters", "buffers"})
_NAMED_WALKS = frozenset({"named_parameters", "named_buffers"})
_DICTS = frozenset({"state_dict"})
# a model's methods that copy tensors into its own (``ema_model.load_state_dict(model.state_dict())``)
_COPIES = frozenset({"load_state_dict"})
# what a dict of tensors gives
_DICT_VIEWS = frozenset({"keys", "values", "items"})
# in-place methods only a tensor has (whatever the analysis knows of what they are called on)
_TENSOR_IN_PLACE = frozenset({"copy_", "lerp_", "mul_", "add_", "sub_", "div_", "addcmul_", "addcdiv_", "clamp_",
                              "zero_", "fill_", "masked_fill_"})
# in-place methods that draw random numbers or do more than compute
_NOT_IN_PLACE = RANDOM_FILLS | {"requires_grad_", "share_memory_"}
# builtins an update function may call besides a tensor function's
_MORE_BUILTINS = frozenset({"dict", "hasattr"})


def update_call(tree: TreeCache, stmt: cst.CSTNode, qualnames: QualNames) -> bool:
    """``stmt`` is a line of one update call (see the module doc), an ``if``
    of such lines decided without a call (``if config.model.ema:
    ema_helper.update(model)``), or a ``for`` or ``with torch.no_grad():``
    block whose lines are an update function's (:class:`_BlockCheck`)."""
    if isinstance(stmt, cst.If):
        # (a test that reads a tensor would run the step's graph before the
        # barrier, which then runs the update: two executions, as before)
        if find_all(stmt.test, cst.Call) or isinstance(stmt.orelse, cst.If):
            return False
        branches = [stmt.body] + ([stmt.orelse.body] if stmt.orelse is not None else [])
        return all(isinstance(b, cst.IndentedBlock) and all(update_call(tree, s, qualnames) for s in b.body)
                   for b in branches)
    if isinstance(stmt, (cst.For, cst.With)):
        return _BlockCheck(tree, stmt, qualnames).block()
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.Call)):
        return False
    call = stmt.body[0].value
    if any(a.star for a in call.args) or not all(_plain_argument(tree, a.value, qualnames) for a in call.args):
        return False
    func = call.func
    if isinstance(func, cst.Name):
        fns = called_functions(tree, call)
        if fns == []:
            found = imported_def(tree, func, cst.FunctionDef)
            return found is not None and update_function(found[0], found[1], quick_qualnames(found[0]))  # type: ignore[arg-type]
        return bool(fns) and all(update_function(tree, fn, qualnames) for fn in fns)
    found = method_of(tree, call, qualnames, or_none=True)  # (bound to None: the call would fail whatever the barrier)
    if found is None:  # a library object's: torch's AveragedModel, where its counter is on the host
        return isinstance(func, cst.Attribute) and func.attr.value == UPDATE and averages_count_on_host(tree, qualnames)
    return update_function(found[0], found[1], found[2], method=True)


def _plain_argument(tree: TreeCache, expr: cst.BaseExpression, qualnames: QualNames) -> bool:
    """Every call in an argument is a torch op or a builtin, none a host read."""
    for call in find_all(expr, cst.Call):
        func = call.func  # type: ignore[attr-defined]
        builtin = isinstance(func, cst.Name) and func.value in BUILTINS and not binding_nodes(tree, func)
        if host_read(tree, call, set(), qualnames) or not (builtin or torch_op(qualnames(func))):  # type: ignore[arg-type]
            return False
    return True


def update_function(tree: TreeCache, fn: cst.FunctionDef, qualnames: QualNames, method: bool = False,
                    depth: int = 2) -> bool:
    """``fn`` is an update function (see the module doc); ``method``: a
    method, its first parameter the object."""
    key = ("update_function", id(fn), method, depth)
    if key not in tree.memo:
        tree.memo[key] = _UpdateCheck(tree, fn, qualnames, depth, method).function()
    return tree.memo[key]  # type: ignore[no-any-return]


class _UpdateCheck(FunctionCheck):
    """A tensor function's check, widened to what an update function may do."""

    def __init__(self, tree: TreeCache, fn: cst.FunctionDef, qualnames: QualNames, depth: int, method: bool) -> None:
        self.method = method
        super().__init__(tree, fn, qualnames, frozenset(), depth)
        self.walks = _walked(fn.body, self.tensors)  # names bound to a model's tensors, or to a dict of them
        self.tensors |= self.walks

    def _small(self, small: cst.CSTNode) -> bool:
        if isinstance(small, cst.Assign) and all(_store(t.target) or names_only(t.target) for t in small.targets):
            return self._expr(small.value)
        if isinstance(small, cst.AugAssign) and _store(small.target):
            return self._expr(small.value)
        return super()._small(small)

    def _call(self, call: cst.Call) -> bool:
        if host_read(self.tree, call, self.tensors, self.qualnames):
            return False
        func = call.func
        if isinstance(func, cst.Attribute):
            name = func.attr.value
            if name in _WALKS | _NAMED_WALKS | _DICTS | _COPIES:
                return True
            if self.method and isinstance(func.value, cst.Name) and func.value.value == "self":
                fns = called_functions(self.tree, call)  # (another method of the object: dome272's `step_ema`)
                return bool(self.depth > 0 and fns and all(
                    update_function(self.tree, fn, self.qualnames, method=True, depth=self.depth - 1) for fn in fns))
            if name in _DICT_VIEWS and _walk_kind(call, self.walks) is not None or name == "keys" and isinstance(
                    func.value, cst.Name) and func.value.value in self.walks:
                return True
            if name in _TENSOR_IN_PLACE or name.endswith("_") and not name.startswith("_") and is_tensor_expr(
                    func.value, self.tensors, self.qualnames):
                return name not in _NOT_IN_PLACE  # (`self.shadow[name].mul_(d)`: only a tensor has these)
        if any(q.startswith("torch._foreach_") for q in self.qualnames(func)):
            return True
        if isinstance(func, cst.Name):
            if func.value in _MORE_BUILTINS and not binding_nodes(self.tree, func):
                return True
            fns = called_functions(self.tree, call)
            if self.depth > 0 and fns and all(update_function(self.tree, fn, self.qualnames, depth=self.depth - 1)
                                              for fn in fns):
                return True
        return super()._call(call)


class _BlockCheck(_UpdateCheck):
    """A ``for`` or ``with torch.no_grad():`` block of the loop's body,
    checked as an update function's statement would be, in the function (or
    module) that runs it: WGAN's ``for p in netD.parameters():
    p.data.clamp_(-c, c)``, an average kept inline (``for e, p in
    zip(ema.parameters(), model.parameters()): e.mul_(d).add_(p, alpha=1 - d)``)."""

    def __init__(self, tree: TreeCache, stmt: cst.CSTNode, qualnames: QualNames) -> None:  # (no function's own)
        self.tree, self.fn, self.qualnames, self.depth, self.method = tree, scope_of(stmt, tree), qualnames, 2, False
        self.stmt, self.lists = stmt, set()
        self.walks = _walked(stmt, set())
        self.tensors = tensor_names(self.fn, qualnames) | self.walks

    def block(self) -> bool:
        stmt = self.stmt
        if find_all(stmt, (cst.Return, cst.Break, cst.Continue, cst.Yield, cst.Await, cst.Lambda, cst.Global,
                           cst.Nonlocal, cst.FunctionDef, cst.ClassDef)):
            return False
        return self._statement(stmt)


def _store(target: cst.CSTNode) -> bool:
    """An attribute or item of what a name holds (``self.shadow[name].data``,
    ``target_dict[key]``): stored into, the name itself left bound."""
    if not isinstance(target, (cst.Attribute, cst.Subscript)):
        return False
    while isinstance(target, (cst.Attribute, cst.Subscript)):
        target = target.value
    return isinstance(target, cst.Name)


def _walked(body: cst.CSTNode, tensors: Set[str]) -> FrozenSet[str]:
    """The names ``body`` binds to a model's tensors (``for p in
    m.parameters()``, ``for n, p in m.named_buffers()``, ``for a, b in
    zip(m1.parameters(), m2.parameters())``, ``for k, v in sd.items()``) or
    to a dict of them (``sd = m.state_dict()``, ``dict(m.named_parameters())``)."""
    walks: Set[str] = set()
    for _ in range(3):  # (a dict bound, then walked)
        before = len(walks)
        for assign in find_all(body, cst.Assign):
            value = assign.value  # type: ignore[attr-defined]
            if _dict_of_tensors(value, walks) and len(assign.targets) == 1 and isinstance(  # type: ignore[attr-defined]
                    assign.targets[0].target, cst.Name):  # type: ignore[attr-defined]
                walks.add(assign.targets[0].target.value)  # type: ignore[attr-defined]
        for loop in find_all(body, cst.For):
            walks |= _tensors_walked(loop.target, loop.iter, walks)  # type: ignore[attr-defined]
        if len(walks) == before:
            break
    return frozenset(walks)


def _dict_of_tensors(value: cst.BaseExpression, walks: Set[str]) -> bool:
    """``m.state_dict()``, ``dict(m.named_parameters())``."""
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute):
        return func.attr.value in _DICTS
    return (isinstance(func, cst.Name) and func.value == "dict" and len(value.args) == 1
            and _walk_kind(value.args[0].value, walks) == "pairs")


def _walk_kind(it: cst.BaseExpression, walks: Set[str]) -> Optional[str]:
    """"one" (tensors one by one), "pairs" ((name, tensor)) or None for what a loop walks."""
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute):
        name = it.func.attr.value
        if name in _WALKS:
            return "one"
        if name in _NAMED_WALKS:
            return "pairs"
        owner = it.func.value
        if (isinstance(owner, cst.Name) and owner.value in walks or isinstance(owner, cst.Call)
                and isinstance(owner.func, cst.Attribute) and owner.func.attr.value in _DICTS):
            return {"values": "one", "items": "pairs"}.get(name)  # (`m.state_dict().values()` too)
    return None


def _tensors_walked(target: cst.BaseExpression, it: cst.BaseExpression, walks: Set[str]) -> Set[str]:
    kind = _walk_kind(it, walks)
    if kind == "one" and isinstance(target, cst.Name):
        return {target.value}
    if kind == "pairs" and isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
        last = target.elements[1].value
        return {last.value} if isinstance(last, cst.Name) else set()
    if (isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "zip"
            and isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == len(it.args)):
        out: Set[str] = set()
        for element, arg in zip(target.elements, it.args):
            out |= _tensors_walked(element.value, arg.value, walks)
        return out
    return set()


__all__ = ["update_call", "update_function"]
