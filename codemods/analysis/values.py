"""What a name holds, from the program's dataflow: a tensor, a device, a
device string, a model (``nn.Module``), an optimizer, a gradient scaler, an
LR scheduler, a diffusion sampler, a data loader, a device loader or a host
value.

``values(tree).of(expr)`` answers for any expression with a set of kinds
(empty: cannot tell).  A name's kinds are those of the bindings that reach
it (``reaching``): the last unconditional binding before the use in its
function, the conditional ones after that, and the ones later in a loop
around the use (they reach the next iteration).  Values come from

* library calls, read through the module's imports: ``torch.optim.AdamW`` is
  an optimizer, ``torch.optim.lr_scheduler.*`` an LR scheduler,
  ``DataLoader`` a loader, ``MpDeviceLoader`` a device loader, ``torch.nn.*``
  layers and ``X.from_pretrained`` of a diffusers/transformers model a model,
  ``*Scheduler.from_pretrained`` a sampler, ``torch.*`` ops tensors;
* the module's own code: classes that subclass ``nn.Module`` (or a
  ``DataLoader``, an ``Optimizer``), what its functions return, what its call
  sites pass to a parameter, what ``self.x = ...`` stores in an attribute;
* operations: ``.to(...)``/``.cuda()``/``.eval()`` keep the kind, calling a
  model gives a tensor, ``.item()`` a host value, accelerate's
  ``prepare(model, opt, dl)`` maps position by position (a loader comes back
  a device loader).

Nothing here looks at what a name is called.  The loop rules fall back on
names (``codemods.analysis.loops``) only when this analysis has no answer:
a parameter no call site in the module feeds, say.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.dataflow import SCOPES, dataflow
from codemods.analysis.kinds import (  # noqa: F401 -- the kinds are part of this module's API
    DEVICE,
    DEVICE_LOADER,
    DEVICE_STR,
    HOST,
    LOADED,
    LOADER,
    LR_SCHEDULER,
    MODEL_LIBS,
    MODULE,
    NONE,
    OBJECT,
    OPTIMIZER,
    PRETRAINED_METHODS,
    SAMPLER,
    SCALER,
    SPLITS,
    STATELESS,
    TENSOR,
    TENSORS,
    UNKNOWN,
    Kinds,
    definitely_not,
    is_stateless_class,
    library_kinds,
    pretrained_kinds,
    union_kinds,
)
from codemods.syntax.tree import (
    TreeCache,
    call_name,
    dotted,
    find_all,
    string_value,
)

_KEEP_KIND = {"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "eval", "train", "requires_grad_",
              "detach", "clone", "contiguous", "share_memory", "type_as", "xpu"}
_HOST_METHODS = {"item", "tolist", "numpy", "size", "dim", "numel", "nelement", "data_ptr", "element_size",
                 "stride", "get_device", "is_contiguous"}
_MODEL_METHODS = {"forward", "generate", "__call__"}
_TENSOR_ATTRS = {"grad", "data", "T", "mT", "real", "imag", "prev_sample", "pred_original_sample", "logits",
                 "last_hidden_state", "sample", "latent_dist"}
_BUILTIN_HOST = {"len", "int", "float", "str", "bool", "range", "round", "abs", "min", "max", "sum", "sorted",
                 "list", "dict", "set", "tuple", "enumerate", "zip", "isinstance", "getattr", "hasattr", "print"}


class Values:
    """The per-tree analysis; get it with :func:`values`."""

    def __init__(self, tree: TreeCache) -> None:
        self.tree = tree
        self.flow = dataflow(tree)
        self._memo: Dict[Tuple[int, int], Kinds] = {}
        self._busy: Set[Tuple[int, int]] = set()

    # -- public ----------------------------------------------------------
    def of(self, node: cst.CSTNode) -> Kinds:
        """Kinds ``node`` may hold (empty: unknown)."""
        return self._cached(0, node, lambda: self._of(node))

    def element(self, node: cst.CSTNode, index: int) -> Kinds:
        """Kinds of element ``index`` of the tuple ``node`` evaluates to."""
        if isinstance(node, (cst.Tuple, cst.List)):
            elements = node.elements
            if index < len(elements) and not isinstance(elements[index], cst.StarredElement):
                return self.of(elements[index].value)
            return NONE
        if isinstance(node, cst.Call):
            if call_name(node) == "prepare" and isinstance(node.func, cst.Attribute):
                args = [a for a in node.args if a.keyword is None and not a.star]
                return _prepared(self.of(args[index].value)) if index < len(args) else NONE
            fn = self.flow.local_function(node)
            if fn is not None:
                return self._returns(fn, index)
        whole = self.of(node)
        if TENSORS in whole:  # (`a, b = x.chunk(2)`)
            whole = whole | {TENSOR}
        return whole & {TENSOR, HOST}  # pieces of a tensor (or of a host value) are of the same kind

    # -- expressions -----------------------------------------------------
    def _cached(self, tag: int, node: cst.CSTNode, compute) -> Kinds:  # type: ignore[no-untyped-def]
        key = (tag, id(node))
        if key in self._memo:
            return self._memo[key]
        if key in self._busy:
            return NONE  # a cycle (a recursive function, `x = x + 1`): no more than what is known
        self._busy.add(key)
        try:
            found = frozenset(compute())
        finally:
            self._busy.discard(key)
        self._memo[key] = found
        return found

    def _of(self, node: cst.CSTNode) -> Kinds:
        if isinstance(node, cst.Name):
            if node.value in ("True", "False"):
                return frozenset({HOST})
            if node.value == "None":
                return NONE  # a placeholder, filled in later
            return self._name(node)
        if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.FormattedString, cst.ConcatenatedString)):
            return frozenset({HOST})
        if isinstance(node, cst.SimpleString):
            text = string_value(node) or ""
            return frozenset({DEVICE_STR if text.split(":")[0] in ("cuda", "cpu", "xla", "mps") else HOST})
        if isinstance(node, cst.Call):
            return self._call(node)
        if isinstance(node, cst.Attribute):
            return self._attribute(node)
        if isinstance(node, cst.Subscript):
            inner = self.of(node.value)
            return inner & {TENSOR, MODULE}
        if isinstance(node, cst.BinaryOperation):
            left, right = self.of(node.left), self.of(node.right)
            if TENSOR in left or TENSOR in right:
                return frozenset({TENSOR})
            return frozenset({HOST}) if left == right == {HOST} else NONE
        if isinstance(node, cst.UnaryOperation):
            return self.of(node.expression)
        if isinstance(node, cst.IfExp):
            return union_kinds(self.of(node.body), self.of(node.orelse))
        if isinstance(node, cst.BooleanOperation):
            return union_kinds(self.of(node.left), self.of(node.right))
        if isinstance(node, cst.Comparison):
            return self.of(node.left) & {TENSOR} or frozenset({HOST})
        if isinstance(node, cst.Await):
            return self.of(node.expression)
        return NONE

    def _call(self, call: cst.Call) -> Kinds:
        func = call.func
        quals = self.tree.import_qualnames(func) or set()
        for q in quals:
            if q == "torch.compile" and call.args:
                return self.of(call.args[0].value)
            found = library_kinds(q, list(call.args))
            if found is not None:
                return found
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in PRETRAINED_METHODS:
                for q in self.tree.import_qualnames(func.value) or ():
                    found = pretrained_kinds(q)
                    if found is not None:
                        return found
                return NONE
            if method in _HOST_METHODS:
                return frozenset({HOST})
            if method == "prepare":  # accelerate: a loader comes back a device loader
                return frozenset(k for a in call.args for k in _prepared(self.of(a.value)))
            receiver = self.of(func.value)
            if method in _KEEP_KIND:
                return receiver
            if method == "step" and SAMPLER in receiver:
                return frozenset({TENSOR})  # a scheduler's output (its .prev_sample)
            if method in SPLITS and TENSOR in receiver:
                return frozenset({TENSORS})
            if TENSOR in receiver or (MODULE in receiver and method in _MODEL_METHODS):
                return frozenset({TENSOR})
            return frozenset({TENSOR}) if self.of(func) & {MODULE, STATELESS} else NONE  # self.unet(...)
        if isinstance(func, cst.Name):
            if func.value in _BUILTIN_HOST and not self._bound_here(func):
                return frozenset({HOST})
            local = self.flow.local_function(call)
            if isinstance(local, cst.ClassDef):
                return class_kinds(self.tree, local)
            if isinstance(local, cst.FunctionDef):
                return self._returns(local, None)
        callee = self.of(func)
        if callee & {MODULE, LOADED, STATELESS}:
            return frozenset({TENSOR})  # running a model (or a loss)
        return NONE

    def _attribute(self, node: cst.Attribute) -> Kinds:
        attr = node.attr.value
        if attr == "device":
            return frozenset({DEVICE})
        if attr in ("shape", "dtype", "ndim", "requires_grad", "is_cuda"):
            return frozenset({HOST})
        base = node.value
        if isinstance(base, cst.Name) and base.value == "self":
            return self._self_attribute(node)
        inner = self.of(base)
        if attr in _TENSOR_ATTRS and inner & {TENSOR}:
            return frozenset({TENSOR})
        if attr == "module" and MODULE in inner:
            return frozenset({MODULE})  # DDP(model).module
        return NONE

    def _self_attribute(self, node: cst.Attribute) -> Kinds:
        """``self.x``: what the methods of the enclosing class store in it."""
        return frozenset(k for v in self.flow.self_stores(node) for k in self.of(v))

    # -- names -----------------------------------------------------------
    def _name(self, name: cst.Name) -> Kinds:
        return union_kinds(*(self._binding_kinds(b) for b in self.flow.reaching(name))) if binding_nodes(
            self.tree, name) else NONE

    def _binding_kinds(self, binding: cst.CSTNode) -> Kinds:
        return self._cached(1, binding, lambda: self._bound_value(binding))

    def _bound_value(self, binding: cst.CSTNode) -> Kinds:
        if isinstance(binding, cst.Param):
            return _param(self, binding)
        if isinstance(binding, cst.ClassDef):
            return NONE
        value, path = self.flow.source(binding)
        if isinstance(value, cst.For):
            return _iterated(self, value.iter, path)
        if value is None:
            return NONE
        if not path:
            return self.of(value)
        kinds = self.element(value, path[0])
        return kinds if len(path) == 1 else kinds & {TENSOR, HOST}

    # -- the module's own functions and classes ---------------------------

    def _returns(self, fn: cst.FunctionDef, index: Optional[int]) -> Kinds:
        kinds: Set[str] = set()
        for ret in find_all(fn.body, cst.Return, stop=SCOPES):
            value = ret.value  # type: ignore[attr-defined]
            if value is not None:
                kinds |= self.of(value) if index is None else self.element(value, index)
        return frozenset(kinds)

    def _bound_here(self, name: cst.Name) -> bool:
        return bool(binding_nodes(self.tree, name))


def _iterated(values: Values, it: cst.BaseExpression, path: List[int]) -> Kinds:
    """Kinds of the loop target at ``path`` when iterating ``it``."""
    if isinstance(it, cst.Call) and call_name(it) in ("enumerate", "tqdm") and it.args:
        if call_name(it) == "enumerate":
            if not path:
                return NONE
            if path[0] == 0:
                return frozenset({HOST})
            path = path[1:]
        return _iterated(values, it.args[0].value, path)
    if isinstance(it, cst.Call) and call_name(it) == "range":
        return frozenset({HOST})
    source = values.of(it)
    if source & {LOADER, DEVICE_LOADER, TENSOR, TENSORS}:
        return frozenset({TENSOR})  # batches
    return NONE


def _param(values: Values, param: cst.Param) -> Kinds:
    """A parameter: its annotation, its default, and what the module's own
    call sites pass to it."""
    kinds: Set[str] = set()
    if param.annotation is not None:
        text = (dotted(param.annotation.annotation) or "").split(".")[-1]
        kinds |= {"Tensor": {TENSOR}, "Module": {MODULE}, "DataLoader": {LOADER}, "Optimizer": {OPTIMIZER},
                  "device": {DEVICE}, "int": {HOST}, "float": {HOST}, "bool": {HOST}}.get(text, set())
    parts = [values.of(param.default)] if param.default is not None else []
    fn = next((a for a in values.flow.ancestors(param) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
    if isinstance(fn, cst.FunctionDef):
        parts += [values.of(arg) for arg in values.flow.arguments(fn, param)]
    if kinds or not parts:
        return frozenset(kinds)  # an annotation is what the author says it holds
    return union_kinds(*parts)


def class_kinds(tree: TreeCache, cls: cst.ClassDef, seen: Optional[Set[str]] = None) -> Kinds:
    """A class of the module: a model when it subclasses ``nn.Module`` (or
    a model class of a library, or another such class of the module)."""
    seen = seen or set()
    seen.add(cls.name.value)
    for base in cls.bases:
        value = base.value
        quals = tree.import_qualnames(value) or set()
        text = dotted(value) or ""
        for q in quals:
            if q in ("torch.nn.Module", "torch.nn.modules.module.Module") or (
                    q.startswith(MODEL_LIBS) and pretrained_kinds(q) == {MODULE}):
                # a module of the program named as a loss or a metric is one
                return frozenset({STATELESS if is_stateless_class(cls.name.value) else MODULE})
            if q.startswith("torch.utils.data.") and q.endswith("DataLoader"):
                return frozenset({LOADER})
            if q.startswith("torch.optim.") and q.split(".")[-1][:1].isupper():
                return frozenset({OPTIMIZER})
        local = dataflow(tree).functions().get(text)
        if isinstance(local, cst.ClassDef) and text not in seen:
            found = class_kinds(tree, local, seen)
            if found != {OBJECT}:
                return found
    return frozenset({OBJECT})


def _prepared(kinds: Kinds) -> Kinds:
    """What accelerate's ``prepare`` gives back for an object of ``kinds``."""
    return frozenset(DEVICE_LOADER if k == LOADER else k for k in kinds)


def values(tree: TreeCache) -> Values:
    return tree.analysis(Values, "values")


__all__ = ["Values", "values", "class_kinds", "TENSOR", "DEVICE", "DEVICE_STR", "MODULE", "OPTIMIZER", "SCALER", "LR_SCHEDULER",
           "SAMPLER", "LOADER", "DEVICE_LOADER", "HOST", "OBJECT", "LOADED", "NONE", "UNKNOWN", "Kinds", "definitely_not",
           "STATELESS"]
