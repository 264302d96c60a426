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
from codemods.analysis.calls import calls_named
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
    STATELESS,
    TENSOR,
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
    children,
    dotted,
    find_all,
    node_types,
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
_STATEMENT_FIELDS = (cst.BaseSuite, cst.BaseStatement, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler,
                     cst.Finally, cst.MatchCase)
_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


class Values:
    """The per-tree analysis; get it with :func:`values`."""

    def __init__(self, tree: TreeCache) -> None:
        self.tree = tree
        self._numbers: Optional[Dict[int, Tuple[int, int]]] = None
        self._memo: Dict[Tuple[int, int], Kinds] = {}
        self._busy: Set[Tuple[int, int]] = set()
        self._defs: Optional[Dict[str, cst.CSTNode]] = None

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
            fn = self.local_function(node)
            if fn is not None:
                return self._returns(fn, index)
        whole = self.of(node)
        return whole & {TENSOR, HOST}  # pieces of a tensor (or of a host value) are of the same kind

    def functions(self) -> Dict[str, cst.CSTNode]:
        """Module-level functions and classes by name."""
        if self._defs is None:
            self._defs = {}
            for stmt in self.tree.module.body:
                for node in ([stmt] if not isinstance(stmt, (cst.If, cst.Try)) else find_all(
                        stmt, (cst.FunctionDef, cst.ClassDef), stop=(cst.FunctionDef, cst.ClassDef))):
                    if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                        self._defs.setdefault(node.name.value, node)
        return self._defs

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
            if TENSOR in receiver or (MODULE in receiver and method in _MODEL_METHODS):
                return frozenset({TENSOR})
            return frozenset({TENSOR}) if self.of(func) & {MODULE, STATELESS} else NONE  # self.unet(...)
        if isinstance(func, cst.Name):
            if func.value in _BUILTIN_HOST and not self._bound_here(func):
                return frozenset({HOST})
            local = self.local_function(call)
            if isinstance(local, cst.ClassDef):
                return self.class_kinds(local)
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
        return frozenset(k for v in self.self_stores(node) for k in self.of(v))

    def self_stores(self, node: cst.Attribute) -> List[cst.BaseExpression]:
        """The values the methods of the class around ``self.x`` assign to ``self.x``."""
        cls = next((a for a in self.ancestors(node) if isinstance(a, cst.ClassDef)), None)
        if cls is None:
            return []
        stores = self.tree.memo.get(f"self_stores:{id(cls)}")
        if not isinstance(stores, dict):
            stores = {}
            for assign in find_all(cls, cst.Assign, stop=(cst.ClassDef,)):
                for t in assign.targets:  # type: ignore[attr-defined]
                    tgt = t.target
                    if (isinstance(tgt, cst.Attribute) and isinstance(tgt.value, cst.Name)
                            and tgt.value.value == "self"):
                        stores.setdefault(tgt.attr.value, []).append(assign.value)  # type: ignore[attr-defined]
            self.tree.memo[f"self_stores:{id(cls)}"] = stores
        return list(stores.get(node.attr.value, ()))

    # -- names -----------------------------------------------------------
    def _name(self, name: cst.Name) -> Kinds:
        return union_kinds(*(self._binding_kinds(b) for b in self.reaching(name))) if binding_nodes(
            self.tree, name) else NONE

    def reaching(self, name: cst.Name) -> List[cst.CSTNode]:
        """The bindings of ``name`` that can reach this use of it."""
        bindings = binding_nodes(self.tree, name)
        if len(bindings) < 2:
            return bindings
        use_fn = self._scope_of(name)
        if any(self._scope_of(b) is not use_fn for b in bindings):
            return bindings  # bound in an enclosing scope: any of them, in any order
        numbers = self._statement_numbers()
        use = numbers.get(id(self.tree.statement_of(name)), (0, 0))[0]
        timed = sorted(((self._point(b, numbers), b) for b in bindings), key=lambda p: p[0][0])
        before = [(p, b) for p, b in timed if p[0] <= use]
        reach: List[cst.CSTNode] = []
        killer: Optional[Tuple[int, int]] = None
        for point, b in reversed(before):
            reach.append(b)
            stmt = self.tree.statement_of(b)
            block = self.tree.parents.get(id(stmt))
            if point[1] >= 0 and block is not None and self._contains(block, name):
                killer = numbers.get(id(stmt))
                break
        for point, b in timed:  # later bindings in a loop around the use reach its next iteration
            if point[0] > use:
                loop = self._common_loop(b, name)
                if loop is not None:
                    span = numbers.get(id(loop), (0, 0))
                    if killer is None or not (span[0] < killer[0] <= span[1]):
                        reach.append(b)
        return reach

    def _point(self, binding: cst.CSTNode, numbers: Dict[int, Tuple[int, int]]) -> Tuple[float, int]:
        """When a binding takes effect, in statement numbers; the second item
        is -1 for parameters (they bind before everything, and never kill a
        binding of the body)."""
        if isinstance(binding, cst.Param):
            return (-1.0, -1)
        stmt = self.tree.statement_of(binding)
        start, end = numbers.get(id(stmt), (0, 0))
        if isinstance(stmt, (cst.For, cst.With, cst.Try, cst.While)):
            return (start + 0.5, 0)  # before the body runs
        return (end + 0.5, 0)

    def _binding_kinds(self, binding: cst.CSTNode) -> Kinds:
        return self._cached(1, binding, lambda: self._bound_value(binding))

    def source(self, binding: cst.CSTNode) -> Tuple[Optional[cst.CSTNode], List[int]]:
        """What a binding binds: (the assigned value, or the ``For`` whose
        target it is, or None; the index path of the binding inside a
        tuple target, ``a, (b, c) = ...`` gives ``[1, 0]`` for ``b``)."""
        parent = self.tree.parents.get(id(binding))
        path: List[int] = []
        node: cst.CSTNode = binding
        while isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List)):
            if isinstance(parent, (cst.Tuple, cst.List)):
                path.insert(0, next(i for i, e in enumerate(parent.elements) if e is node))
            node, parent = parent, self.tree.parents.get(id(parent))
        if isinstance(parent, cst.AssignTarget):
            assign = self.tree.parents.get(id(parent))
            return (assign.value if isinstance(assign, cst.Assign) else None), path
        if isinstance(parent, (cst.AnnAssign, cst.AugAssign, cst.NamedExpr)):
            return parent.value, path
        if isinstance(parent, cst.For):
            return parent, path
        return None, path

    def _bound_value(self, binding: cst.CSTNode) -> Kinds:
        if isinstance(binding, cst.Param):
            return self._param(binding)
        if isinstance(binding, cst.ClassDef):
            return NONE
        value, path = self.source(binding)
        if isinstance(value, cst.For):
            return self._iterated(value.iter, path)
        if value is None:
            return NONE
        if not path:
            return self.of(value)
        kinds = self.element(value, path[0])
        return kinds if len(path) == 1 else kinds & {TENSOR, HOST}

    def _iterated(self, it: cst.BaseExpression, path: List[int]) -> Kinds:
        """Kinds of the loop target at ``path`` when iterating ``it``."""
        if isinstance(it, cst.Call) and call_name(it) in ("enumerate", "tqdm") and it.args:
            if call_name(it) == "enumerate":
                if not path:
                    return NONE
                if path[0] == 0:
                    return frozenset({HOST})
                path = path[1:]
            return self._iterated(it.args[0].value, path)
        if isinstance(it, cst.Call) and call_name(it) == "range":
            return frozenset({HOST})
        source = self.of(it)
        if source & {LOADER, DEVICE_LOADER, TENSOR}:
            return frozenset({TENSOR})  # batches
        return NONE

    def _param(self, param: cst.Param) -> Kinds:
        """A parameter: its annotation, its default, and what the module's own
        call sites pass to it."""
        kinds: Set[str] = set()
        if param.annotation is not None:
            text = (dotted(param.annotation.annotation) or "").split(".")[-1]
            kinds |= {"Tensor": {TENSOR}, "Module": {MODULE}, "DataLoader": {LOADER}, "Optimizer": {OPTIMIZER},
                      "device": {DEVICE}, "int": {HOST}, "float": {HOST}, "bool": {HOST}}.get(text, set())
        parts = [self.of(param.default)] if param.default is not None else []
        fn = next((a for a in self.ancestors(param) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
        if isinstance(fn, cst.FunctionDef):
            parts += [self.of(arg) for arg in self.arguments(fn, param)]
        if kinds or not parts:
            return frozenset(kinds)  # an annotation is what the author says it holds
        return union_kinds(*parts)

    def arguments(self, fn: cst.FunctionDef, param: cst.Param) -> List[cst.BaseExpression]:
        """What the module's call sites pass for ``param`` of ``fn``: calls by
        name for module functions, ``self.fn(...)`` for methods, ``Cls(...)``
        for ``Cls.__init__``."""
        params = list(fn.params.posonly_params) + list(fn.params.params)
        names = [p.name.value for p in params]
        is_method = bool(names) and names[0] == "self"
        index = names.index(param.name.value) - (1 if is_method else 0) if param.name.value in names else None
        out: List[cst.BaseExpression] = []
        cls = next((a for a in self.ancestors(fn) if isinstance(a, cst.ClassDef)), None) \
            if fn.name.value == "__init__" else None  # `Sampler(model, device)` calls `__init__`
        sites = calls_named(self.tree, fn.name.value, is_method) + (
            calls_named(self.tree, cls.name.value, False) if cls is not None else [])
        for _, call in sorted(sites, key=lambda site: site[0]):  # (in the module's order)
            for i, arg in enumerate(call.args):  # type: ignore[attr-defined]
                if arg.star:
                    break
                if (arg.keyword is not None and arg.keyword.value == param.name.value) or (
                        arg.keyword is None and i == index):
                    out.append(arg.value)
        return out

    # -- the module's own functions and classes ---------------------------
    def local_function(self, call: cst.Call) -> Optional[cst.CSTNode]:
        """The module's own function or class ``call`` calls: ``f(...)`` of a
        module-level ``def f``/``class f``, or ``self.m(...)`` of a method of
        the enclosing class (not one a subclass elsewhere may override)."""
        func = call.func
        if isinstance(func, cst.Name) and not self.tree.import_qualnames(func):
            found = self.functions().get(func.value)
            if found is not None and binding_nodes(self.tree, func) == [found]:
                return found
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            cls = next((a for a in self.ancestors(call) if isinstance(a, cst.ClassDef)), None)
            if cls is not None and isinstance(cls.body, cst.IndentedBlock):
                methods = [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == func.attr.value]
                if len(methods) == 1 and not methods[0].decorators:
                    return methods[0]
        return None

    def _returns(self, fn: cst.FunctionDef, index: Optional[int]) -> Kinds:
        kinds: Set[str] = set()
        for ret in find_all(fn.body, cst.Return, stop=_SCOPES):
            value = ret.value  # type: ignore[attr-defined]
            if value is not None:
                kinds |= self.of(value) if index is None else self.element(value, index)
        return frozenset(kinds)

    def class_kinds(self, cls: cst.ClassDef, seen: Optional[Set[str]] = None) -> Kinds:
        """A class of the module: a model when it subclasses ``nn.Module`` (or
        a model class of a library, or another such class of the module)."""
        seen = seen or set()
        seen.add(cls.name.value)
        for base in cls.bases:
            value = base.value
            quals = self.tree.import_qualnames(value) or set()
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
            local = self.functions().get(text)
            if isinstance(local, cst.ClassDef) and text not in seen:
                found = self.class_kinds(local, seen)
                if found != {OBJECT}:
                    return found
        return frozenset({OBJECT})

    # -- structure ---------------------------------------------------------
    def _statement_numbers(self) -> Dict[int, Tuple[int, int]]:
        """``id(statement) -> (first, last)`` statement numbers in source order
        (``last`` covers a compound statement's body)."""
        if self._numbers is None:
            numbers: Dict[int, Tuple[int, int]] = {}
            counter = [0]

            holders, statements = node_types(_STATEMENT_FIELDS), node_types(cst.BaseStatement)  # (exact types)

            def visit(node: cst.CSTNode) -> None:
                start = counter[0]
                statement = type(node) in statements
                if statement:
                    counter[0] += 1
                for child in children(node):
                    if type(child) in holders:
                        visit(child)
                if statement:
                    numbers[id(node)] = (start, counter[0] - 1)

            visit(self.tree.module)
            visit = None  # type: ignore[assignment]  # (it refers to itself: no cycle left behind)
            self._numbers = numbers
        return self._numbers

    def ancestors(self, node: cst.CSTNode):  # type: ignore[no-untyped-def]
        cur = self.tree.parents.get(id(node))
        while cur is not None:
            yield cur
            cur = self.tree.parents.get(id(cur))

    def _scope_of(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return next((a for a in self.ancestors(node) if isinstance(a, _SCOPES)), None)

    def _contains(self, outer: cst.CSTNode, node: cst.CSTNode) -> bool:
        return any(a is outer for a in self.ancestors(node))

    def _common_loop(self, a: cst.CSTNode, b: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The innermost loop (in their own scope) whose body holds both."""
        for anc in self.ancestors(a):
            if isinstance(anc, _SCOPES):
                return None
            if isinstance(anc, (cst.For, cst.While)) and self._contains(anc.body, b):
                return anc
        return None

    def _bound_here(self, name: cst.Name) -> bool:
        return bool(binding_nodes(self.tree, name))


def _prepared(kinds: Kinds) -> Kinds:
    """What accelerate's ``prepare`` gives back for an object of ``kinds``."""
    return frozenset(DEVICE_LOADER if k == LOADER else k for k in kinds)


def values(tree: TreeCache) -> Values:
    found = tree.memo.get("values")
    if not isinstance(found, Values):
        found = tree.memo["values"] = Values(tree)
    return found


__all__ = ["Values", "values", "TENSOR", "DEVICE", "DEVICE_STR", "MODULE", "OPTIMIZER", "SCALER", "LR_SCHEDULER",
           "SAMPLER", "LOADER", "DEVICE_LOADER", "HOST", "OBJECT", "LOADED", "NONE", "UNKNOWN", "Kinds", "definitely_not",
           "STATELESS"]
