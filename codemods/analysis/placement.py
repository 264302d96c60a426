"""Where a tensor lives: on the host (the CPU) or on the device.

Only a *device* tensor indexed by a Python int bakes the index into an XLA
graph (XLA407); a host tensor (``losses = torch.zeros(n)``, a dataset made
with ``torch.randn(100, 4)`` and sliced before ``.to(device)``) is indexed
by the CPU and costs nothing on XLA.  :func:`placement` reads it from the
dataflow of :mod:`codemods.analysis.values`:

* a torch factory (``torch.zeros``, ``torch.randn``, ``torch.tensor``,
  ``torch.from_numpy``...) with no ``device=`` (or ``device="cpu"``) makes a
  host tensor; with another ``device=`` a device tensor; ``torch.*_like(x)``
  and ``torch.cat``/``torch.stack`` are made where their inputs are;
* ``.to(x)``/``.cuda()`` moves to the device (``.to("cpu")``/``.cpu()``
  back to the host); other methods, indexing, arithmetic with numbers and
  other torch functions (``torch.cumprod(alphas, 0)``, placed by their first
  argument) keep the placement;
* a model's output is on the device, a function of the module's output where
  all its returns are; a name is placed where every binding
  that reaches it is; a parameter is placed where every argument the
  module's call sites pass to it is; ``self.x`` where every value the
  class stores in it is, and on the device when a model class registers it
  as a buffer.

Anything else is unknown (None): the rules treat it as they did before.
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Optional, Set

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.buffers import model_buffers
from codemods.analysis.loops import loop_iterable
from codemods.analysis.tensors import is_tensor_expr
from codemods.analysis.dataflow import dataflow
from codemods.analysis.steps import SCALAR_READS, TO_HOST
from codemods.analysis.syncs import false_on_xla
from codemods.analysis.values import DEVICE as DEVICE_KIND
from codemods.analysis.values import DEVICE_LOADER, DEVICE_STR, LOADER, MODULE, Values
from codemods.analysis.values import values as values_of
from codemods.syntax.nodes import number_literal
from codemods.syntax.tree import TreeCache, call_name, find_all, string_value

HOST, DEVICE = "host", "device"
# torch factories: each makes a (dense) tensor where its device= says
FACTORIES = frozenset({"zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "linspace",
                       "logspace", "tensor", "as_tensor", "from_numpy", "eye"})
# made where their input is (unless given a device=)
_LIKE = {"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like"}
_JOINS = {"cat", "concat", "concatenate", "stack", "hstack", "vstack"}


def placement(tree: TreeCache, node: cst.CSTNode) -> Optional[str]:
    """``"host"``, ``"device"`` or None (cannot tell) for the tensor ``node``."""
    return _Placement(tree).of(node, set())


def on_device(tree: TreeCache, node: cst.CSTNode, tensors: Set[str]) -> bool:
    """A tensor on the device as far as we can tell: a tensor name not placed
    on the host, or anything (``self.alphas``) placed on the device."""
    if isinstance(node, cst.Name) and node.value in tensors:
        return placement(tree, node) != HOST
    return isinstance(node, (cst.Name, cst.Attribute)) and placement(tree, node) == DEVICE


def host_read(tree: TreeCache, call: cst.Call, tensors: Set[str],
              qualnames: Callable[[cst.CSTNode], Iterable[str]]) -> Optional[str]:
    """How ``call`` copies a tensor's value to the host -- ``"item"``, one of
    ``TO_HOST`` (``.cpu()``, ``.numpy()``, ``.tolist()``), or ``"float"``/
    ``"int"``/``"bool"`` of a tensor -- or None: no such call, or the tensor
    is on the host already (nothing crosses).  The one definition the host
    read rules (XLA401-403) and the barrier's placement read."""
    name = call_name(call)
    func = call.func
    if isinstance(func, cst.Attribute) and (name == "item" and not call.args or name in TO_HOST
                                            or to_cpu(call)):
        return None if placement(tree, func.value) == HOST else name
    if isinstance(func, cst.Name) and name in SCALAR_READS and len(call.args) == 1:
        arg = call.args[0].value
        if is_tensor_expr(arg, tensors, qualnames) and placement(tree, arg) != HOST:  # type: ignore[arg-type]
            return name
    return None


FILL_CALLS = frozenset({"full", "full_like", "new_full"})


def fill_argument(call: cst.Call) -> Optional[cst.Arg]:
    """The fill value's argument of ``torch.full(shape, v)``,
    ``torch.full_like(x, v)`` or ``x.new_full(shape, v)``: a number, which a
    tensor there gives by a read on the host (XLA403)."""
    if call_name(call) not in FILL_CALLS:
        return None
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == "fill_value"),
                positional[1] if len(positional) > 1 else None)


def reads_truth(test: cst.BaseExpression, tensors: Set[str],
                qualnames: Callable[[cst.CSTNode], Iterable[str]]) -> bool:
    """A condition (``if``/``while``/``assert``) Python can only decide by
    reading a tensor on the host: a tensor operand (``torch.isnan(x).any()``,
    ``loss > 0``), or a tensor op that gives a Python bool
    (``torch.allclose``).  The one definition XLA404 and the barrier's
    placement read."""
    for part in _truth_operands(test):
        inner = part.expression if isinstance(part, cst.UnaryOperation) else part
        if isinstance(inner, cst.Comparison) and all(
                isinstance(c.operator, (cst.Is, cst.IsNot)) for c in inner.comparisons):
            # `x is not None`: identity reads no value -- but what it compares may have read
            # one to make a Python bool (`torch.allclose(a, b) is False`)
            operands = [o for o in [inner.left] + [c.comparator for c in inner.comparisons]
                        if isinstance(o, cst.Call) and call_name(o) in _BOOL_OF_TENSORS]
        elif isinstance(inner, cst.Comparison):
            operands = [inner.left] + [c.comparator for c in inner.comparisons]
        else:
            operands = [inner]
        for op in operands:
            if isinstance(op, cst.Call) and call_name(op) in {"item", "len", "isinstance"}:
                continue
            if (isinstance(op, cst.Call) and call_name(op) in {"any", "all"} and isinstance(op.func, cst.Attribute)) \
                    or is_tensor_expr(op, tensors, qualnames):
                return True
    return False


# tensor ops that give a Python bool: each reads its tensors on the host
_BOOL_OF_TENSORS = frozenset({"allclose", "equal", "is_nonzero"})


def _truth_operands(test: cst.BaseExpression) -> List[cst.BaseExpression]:
    """The operands of ``test`` that Python reads as truth values on XLA, left
    to right: each side of ``and``/``or``, but none after a side of an ``and``
    that is false on XLA (``... and not is_torch_xla_available() and
    torch.isnan(loss)``: transformers' Trainer keeps that read off XLA)."""
    if not isinstance(test, cst.BooleanOperation):
        return [test]
    if isinstance(test.operator, cst.And) and false_on_xla(test.left):
        return _truth_operands(test.left)
    return _truth_operands(test.left) + _truth_operands(test.right)


class _Placement:
    def __init__(self, tree: TreeCache) -> None:
        self.tree = tree
        self.values: Values = values_of(tree)
        self.flow = dataflow(tree)

    def of(self, node: cst.CSTNode, busy: Set[int]) -> Optional[str]:
        if id(node) in busy:
            return None
        busy = busy | {id(node)}
        if isinstance(node, cst.Name):
            return self._name(node, busy)
        if isinstance(node, cst.Subscript):
            return self.of(node.value, busy)
        if isinstance(node, cst.Call):
            return self._call(node, busy)
        if isinstance(node, (cst.BinaryOperation, cst.UnaryOperation)):
            return self._arithmetic(node, busy)
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
            buffers = model_buffers(self.tree)
            if node.attr.value in buffers.named(node) or buffers.computed(node):
                return DEVICE  # a model's buffer moves with the model
            found = {self.of(v, busy) for v in self.flow.self_stores(node)}  # what the class stores there
            return found.pop() if len(found) == 1 else None
        return None

    def _call(self, call: cst.Call, busy: Set[int]) -> Optional[str]:
        func, name = call.func, call_name(call)
        if isinstance(func, cst.Attribute):
            quals = self.tree.import_qualnames(func) or set()
            torch_name = next((q.split(".")[-1] for q in quals if q.startswith("torch.")), None)
            if torch_name in FACTORIES:
                return self._factory(call)
            if torch_name in _LIKE or torch_name in _JOINS:
                return self._from_inputs(call, torch_name in _JOINS, busy)
            if torch_name is not None and call.args and call.args[0].keyword is None and not call.args[0].star:
                # any other torch function computes where its tensor is (`torch.cumprod(alphas, 0)`,
                # `torch.sigmoid(nt)`, `F.relu(h)`): placed where its first argument is, when that can be told
                return self.of(call.args[0].value, busy)
            if name in TO_HOST:
                return HOST
            if name == "cuda":
                return DEVICE
            if name == "to":
                target = call.args[0].value if call.args and call.args[0].keyword is None else None
                text = string_value(target) if target is not None else None
                if text is not None:
                    return HOST if text == "cpu" else DEVICE
                if target is not None and isinstance(target, (cst.Name, cst.Attribute, cst.Call)) \
                        and self.values.of(target) & {DEVICE_KIND, DEVICE_STR}:
                    return DEVICE
                return None  # .to(dtype), .to(other)
        local = self.flow.local_function(call)
        if isinstance(local, cst.FunctionDef):  # what the module's own function returns
            found = {self.of(r.value, busy) for r in find_all(local.body, cst.Return, stop=(cst.FunctionDef,))
                     if r.value is not None}  # type: ignore[attr-defined]
            return found.pop() if len(found) == 1 else None
        if self.values.of(func) & {MODULE}:
            return DEVICE  # a model's output
        if isinstance(func, cst.Attribute):
            # any other method of a tensor keeps its placement (a view, a
            # dtype, a reduction: `torch.tensor(losses).mean()` is on the host)
            return self.of(func.value, busy)
        return None

    def _arithmetic(self, node: cst.CSTNode, busy: Set[int]) -> Optional[str]:
        """``1.0 - self.betas``, ``-x``: where its tensors are -- every operand that is no number literal placed
        alike (a number beside a tensor keeps the tensor's placement)."""
        operands = [node.expression] if isinstance(node, cst.UnaryOperation) else [node.left, node.right]  # type: ignore[attr-defined]
        found = {self.of(o, busy) for o in operands if not number_literal(o)}
        return found.pop() if len(found) == 1 else None

    def _from_inputs(self, call: cst.Call, join: bool, busy: Set[int]) -> Optional[str]:
        """``torch.zeros_like(x)`` is made where ``x`` is, ``torch.cat((a, b))``
        where ``a`` and ``b`` both are (unless a ``device=`` says otherwise)."""
        given = _device_argument(call)
        if given is not None:
            return given
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        if first is None:
            return None
        if not join:
            return self.of(first, busy)
        if not isinstance(first, (cst.Tuple, cst.List)) or not first.elements:
            return None
        if any(isinstance(e, cst.StarredElement) for e in first.elements):
            return None
        found = {self.of(e.value, busy) for e in first.elements}
        return found.pop() if len(found) == 1 else None

    def _factory(self, call: cst.Call) -> str:
        return _device_argument(call) or HOST

    def _name(self, name: cst.Name, busy: Set[int]) -> Optional[str]:
        if not binding_nodes(self.tree, name):
            return None
        found: Set[Optional[str]] = set()
        for binding in self.flow.reaching(name):
            if isinstance(binding, cst.Param):
                fn = next((a for a in self.flow.ancestors(binding) if isinstance(a, cst.FunctionDef)), None)
                args = self.flow.arguments(fn, binding) if isinstance(fn, cst.FunctionDef) else []
                found |= {self.of(a, busy) for a in args} if args else {None}
                continue
            value, path = self.flow.source(binding)
            if isinstance(value, cst.For):
                found.add(self._batch(value))
                continue
            found.add(self.of(_element(value, path), busy) if value is not None else None)
        return found.pop() if len(found) == 1 else None

    def _batch(self, loop: cst.For) -> Optional[str]:
        """What a loop over a loader binds: on the device from a device
        loader, on the host from a DataLoader whose batches stay there."""
        kinds = self.values.of(loop_iterable(loop))
        if DEVICE_LOADER in kinds:
            return DEVICE
        return HOST if kinds == {LOADER} and batches_stay_on_host(loop) else None


def _element(value: cst.CSTNode, path: List[int]) -> Optional[cst.CSTNode]:
    """What a tuple target's name at ``path`` is given: ``value`` itself
    for a plain name, the element of a tuple written out (``x, y =
    x.to(device), y.to(device)``); None where it cannot be told (a call
    that returns a tuple, a starred element)."""
    for k in path:
        if not isinstance(value, (cst.Tuple, cst.List)) or k >= len(value.elements) or any(
                isinstance(e, cst.StarredElement) for e in value.elements):
            return None
        value = value.elements[k].value
    return value


# the methods that move a tensor or a module to a device (in place for a module)
MOVES = frozenset({"to", "cuda", "xpu", "to_empty"})


def batches_stay_on_host(loop: cst.For) -> bool:
    """The loop's body never moves what it iterates to a device nor hands it
    on: no ``.to()``/``.cuda()`` in it, and no name the loop binds (or a
    name assigned from one, ``ids = batch["ids"]``) in a call's arguments
    (a model, a step or a helper could move it) or in a ``return``/``yield``
    -- host code, such as a dataset's mean and std.
    Wrapping its loader would move work the program does on the CPU to the
    device (the loader rule leaves it), and its batches are host tensors."""
    names = {n.value for n in find_all(loop.target, cst.Name)}
    assigns = find_all(loop.body, (cst.Assign, cst.AugAssign, cst.AnnAssign))
    grown = True
    while grown:  # names given a batch's value (`ids = batch["ids"]`) carry it on
        grown = False
        for a in assigns:
            value = getattr(a, "value", None)
            if value is None or not any(n.value in names for n in find_all(value, cst.Name)):
                continue
            targets = ([t.target for t in a.targets] if isinstance(a, cst.Assign)  # type: ignore[attr-defined]
                       else [a.target])  # type: ignore[attr-defined]
            new = {n.value for t in targets if isinstance(t, (cst.Name, cst.Tuple, cst.List))
                   for n in find_all(t, cst.Name)} - names
            if new:
                names |= new
                grown = True
    for call in find_all(loop.body, cst.Call):
        if call_name(call) in MOVES:  # type: ignore[arg-type]
            return False
        if any(n.value in names for a in call.args for n in find_all(a.value, cst.Name)):  # type: ignore[attr-defined]
            return False
    return not any(n.value in names for out in find_all(loop.body, (cst.Return, cst.Yield))
                   for n in find_all(out, cst.Name))


def batch_meets_host_tensor(tree: TreeCache, loop: cst.For) -> Optional[cst.Call]:
    """A join (``torch.cat``/``stack``) that puts one of the loop's batches,
    not yet moved, beside a tensor made on the host -- in the loop's body or
    in a function of the module the batch is handed to (Informer's
    ``torch.cat([batch_y[:, :k], torch.zeros(...)])`` in ``_process_one_batch``).
    The original runs it on the CPU; with the loader wrapped in a device
    loader the batch is on the device and the join fails: the loader must
    stay as it is.  None when there is none."""
    from codemods.analysis.calls import called_functions

    work = [(loop.body, {n.value for n in find_all(loop.target, cst.Name)})]
    seen: Set[int] = set()
    while work:
        body, names = work.pop()
        if id(body) in seen:
            continue
        seen.add(id(body))
        for call in find_all(body, cst.Call):
            if call_name(call) in _JOINS and call.args:  # type: ignore[attr-defined]
                parts = call.args[0].value  # type: ignore[attr-defined]
                operands = [e.value for e in parts.elements] if isinstance(parts, (cst.List, cst.Tuple)) else []
                if any(_unmoved(o, names) for o in operands) and any(placement(tree, o) == HOST for o in operands):
                    return call  # type: ignore[return-value]
            for fn in called_functions(tree, call) or ():  # type: ignore[arg-type]
                params = [p.name.value for p in fn.params.params if p.name.value != "self"]
                given = {params[i] for i, a in enumerate(a for a in call.args if a.keyword is None)  # type: ignore[attr-defined]
                         if i < len(params) and _unmoved(a.value, names)}
                given |= {a.keyword.value for a in call.args if a.keyword is not None and _unmoved(a.value, names)}  # type: ignore[attr-defined]
                if given:
                    work.append((fn.body, given))
    return None


def _unmoved(expr: cst.CSTNode, names: Set[str]) -> bool:
    """``expr`` reads one of ``names`` and moves nothing to a device."""
    return any(isinstance(n, cst.Name) and n.value in names for n in find_all(expr, cst.Name)) and not any(
        call_name(c) in MOVES for c in find_all(expr, cst.Call))  # type: ignore[arg-type]


def to_cpu(call: cst.Call) -> bool:
    """``x.to("cpu")`` / ``x.to(device="cpu")``: a copy to the host, as
    ``x.cpu()`` is."""
    if call_name(call) != "to" or not call.args:
        return False
    first = call.args[0]
    where = first.value if first.keyword is None or first.keyword.value == "device" else None
    return where is not None and string_value(where) == "cpu"


def _device_argument(call: cst.Call) -> Optional[str]:
    """Where a ``device=`` argument puts what ``call`` makes; None without one."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "device":
            return HOST if string_value(arg.value) == "cpu" else DEVICE
    return None
