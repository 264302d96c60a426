"""The base class of the loop-aware codemods: while it walks, it knows
whether it is inside a step loop or a loader loop (the hot region), which
names hold tensors, and whether a loop iterates a device loader."""

from __future__ import annotations

from typing import Callable, List, Set

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.loops import (
    _DEFS,
    LOADER_NAME_RE,
    Loop,
    _names_one_loader,
    accumulates_gradients,
    in_model_code,
    is_device_loader_expr,
    loop_iterable,
    loop_step_kind,
    model_functions,
    module_facts,
    step_functions,
)
from codemods.analysis.nesting import is_outer_loop
from codemods.analysis.tensors import tensor_names
from codemods.analysis.values import DEVICE_LOADER, LOADER, UNKNOWN
from codemods.analysis.values import values as values_of
from codemods.base import SOURCE_KEY, XlaCodemod, call_name, dotted, find_all

DATALOADER_NAMES = {
    "torch.utils.data.DataLoader",
    "torch.utils.data.dataloader.DataLoader",
}


# Every way _is_device_loader_value can see a device loader is spelled with
# one of these in the source.
_DEVICE_LOADER_WORDS = (b"MpDeviceLoader", b"ParallelLoader", b"per_device_loader", b"parallel_loader",
                        b"prepare(", b"prepare_data_loader")

class LoopCodemod(XlaCodemod):
    """A codemod that knows, while it walks, whether it is inside a step loop,
    a loader loop (the hot region), which names hold tensors, and which loops
    are step loops."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.steps: Set[str] = set()
        self.loop_stack: List[tuple] = []  # (loop, is_step, is_loader)
        self.tensor_stack: List[Set[str]] = []
        self.closure_depth = 0

    # -- walking state -------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self.steps = self._memo("steps", node, lambda: step_functions(node))
        self.tensor_stack.append(self._tensor_names(node))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.tensor_stack.append(self._tensor_names(node.body))

    def _memo(self, kind: str, node: cst.CSTNode, compute: Callable[[], object]):  # type: ignore[no-untyped-def]
        """Per-tree memo shared by the loop codemods that run on one tree."""
        key = f"{kind}:{id(node)}"
        memo = self.tree.memo
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    def _tensor_names(self, node: cst.CSTNode) -> Set[str]:
        return self._memo("tensors", node, lambda: tensor_names(node, self.qualnames, self._loader_loops(node),
                                                                 values_of(self.tree)))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.CSTNode:
        self.tensor_stack.pop()
        return updated_node

    def is_step_loop(self, loop: Loop) -> bool:
        """:func:`is_step_loop`, and not inside a model's own forward/backward."""
        called = self._memo("model_functions", self.tree.module, lambda: model_functions(self.tree))
        return self._memo("step_loop", loop, lambda: self._is_step_loop(loop, called))

    def _is_step_loop(self, loop: Loop, called: Set[str]) -> bool:
        kind = loop_step_kind(self.tree, loop, self.steps)
        if kind is None or in_model_code(loop, self.tree.parents, called):
            return False
        if is_outer_loop(self.tree, loop, self.is_step_loop):
            return False  # the step loop it runs on every iteration cuts it
        if kind in ("carried", "sample", "feedback") or (kind == "step" and accumulates_gradients(loop, self.steps)):
            # an accumulation inside another step loop (panorama's per-view
            # loop; the micro-steps of gradient accumulation, whose optimizer
            # step the outer loop takes): the outer step's barrier bounds it
            # already, and one graph per outer iteration is the fewest
            # (docs/internals.md, "Gradient accumulation").  So is a decoder
            # unrolled over time inside a training step (its output fed back
            # as the next input): a barrier of its own would cut the step
            # into one graph per time step
            for anc in self.ancestors(loop):
                if isinstance(anc, _DEFS):
                    break
                if isinstance(anc, (cst.For, cst.While)) and self.is_step_loop(anc) \
                        and (kind != "feedback" or loop_step_kind(self.tree, anc, self.steps) == "step"):
                    return False
        return True

    def visit_For(self, node: cst.For) -> None:
        self.loop_stack.append((node, self.is_step_loop(node), self.is_loader_loop(node)))

    def leave_For(self, original_node: cst.For, updated_node: cst.For):  # type: ignore[override]
        self.loop_stack.pop()
        return self.rewrite_loop(original_node, updated_node)

    def visit_While(self, node: cst.While) -> None:
        self.loop_stack.append((node, self.is_step_loop(node), False))

    def leave_While(self, original_node: cst.While, updated_node: cst.While):  # type: ignore[override]
        self.loop_stack.pop()
        return self.rewrite_loop(original_node, updated_node)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_step_closure(node):
            self.closure_depth += 1

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.is_step_closure(original_node):
            self.closure_depth -= 1
        return updated_node

    def rewrite_loop(self, original: Loop, updated: Loop):
        return updated

    # -- questions -----------------------------------------------------------
    @property
    def in_hot(self) -> bool:
        return self.closure_depth == 0 and any(step or loader for _, step, loader in self.loop_stack)

    @property
    def tensors(self) -> Set[str]:
        return self.tensor_stack[-1] if self.tensor_stack else set()

    def hot_loop_line(self) -> int:
        """The line of the user's file where the innermost hot loop starts."""
        for loop, step, loader in self.loop_stack:
            if step or loader:
                return self.loop_line(loop)
        return 0

    def loop_line(self, loop: cst.CSTNode) -> int:
        """The line of the user's file where ``loop`` starts."""
        lines = self._memo("loop_lines", self.tree.module, lambda: {  # every candidate loop, one pass
            k: v[0] for k, v in self.tree.start_positions(module_facts(self.tree).hot_loops).items()})
        return self.user_line(lines.get(id(loop)) or self.position(loop)[0])  # type: ignore[union-attr]

    def is_step_closure(self, call: cst.Call) -> bool:
        if self.qualnames(call.func) & set(self.target.step_closure_names):
            return True
        return call_name(call) == "add_step_closure"

    def assigned_values(self, name: cst.Name) -> List[cst.CSTNode]:
        """Values assigned to ``name`` in its scope: plain assignments, and
        the whole right-hand side of a tuple unpacking (``model, dl =
        accelerator.prepare(model, dl)``); parameters as ``Param`` nodes."""
        values: List[cst.CSTNode] = []
        for target in binding_nodes(self.tree, name):
            parent = self.parent(target)
            while isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List)):
                parent = self.parent(parent)
            if isinstance(parent, cst.AssignTarget):
                assign = self.parent(parent)
                if isinstance(assign, cst.Assign):
                    values.append(assign.value)
            elif isinstance(parent, cst.Param) or isinstance(target, cst.Param):
                param = parent if isinstance(parent, cst.Param) else target
                values.append(param)  # type: ignore[arg-type]
        return values

    def is_data_loader_expr(self, node: cst.CSTNode) -> bool:
        """A torch DataLoader: constructed here, a name bound to one, a
        parameter annotated as one, or a name that says it is a loader."""
        if isinstance(node, cst.Call):
            if self.qualnames(node.func) & DATALOADER_NAMES:
                return True
            return call_name(node) == "DataLoader"
        if isinstance(node, cst.Name):
            if not LOADER_NAME_RE.search(node.value) and b"DataLoader" not in self.tree.source:
                return False  # nothing in this file could bind it to a DataLoader
            kinds = values_of(self.tree).of(node)
            if DEVICE_LOADER in kinds:
                return False  # one device loader reaching the loop decides: it must not be wrapped again
            if kinds and UNKNOWN not in kinds:
                return LOADER in kinds
            values = self.assigned_values(node)
            # every binding counts (`dl = accelerator.prepare(dl)` rebinds a
            # DataLoader to a device loader): one device loader decides
            if any(self._is_device_loader_value(v) for v in values):
                return False
            if any(isinstance(v, cst.Call) and self.is_data_loader_expr(v) for v in values):
                return True
            if any(isinstance(v, cst.Call) for v in values):
                return False  # bound to something else we can see
            for v in values:
                if isinstance(v, cst.Param):
                    ann = v.annotation
                    if ann is not None and "DataLoader" in (dotted(ann.annotation) or ""):
                        return True
                    if self._fed_device_loader(v):
                        return False
            return _names_one_loader(node.value)
        if isinstance(node, cst.Attribute):
            return _names_one_loader(node.attr.value)
        return False

    def _may_make_device_loaders(self) -> bool:
        """False when nothing in the current text (an earlier codemod may
        have added a loader) can make a device loader: no scope analysis is
        needed to know that no name holds one."""
        text = self.context.scratch.get(SOURCE_KEY)
        data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else self.tree.module.code.encode()
        return any(w in data for w in _DEVICE_LOADER_WORDS)

    def _is_device_loader_value(self, value: cst.CSTNode) -> bool:
        """An MpDeviceLoader, what ``accelerator.prepare(...)`` returns (on
        XLA, accelerate's MpDeviceLoaderWrapper), or what a function of this
        module returns when it makes one of those (``get_training_setup()``)."""
        if isinstance(value, cst.Param):
            return False
        if is_device_loader_expr(value, self.target.loader_names, self.qualnames):
            return True
        if not isinstance(value, cst.Call):
            return False
        if call_name(value) in ("prepare", "prepare_data_loader"):
            return True
        return isinstance(value.func, cst.Name) and value.func.value in self._memo(
            "device_loader_makers", self.tree.module, self._device_loader_makers)

    def _device_loader_makers(self) -> Set[str]:
        """Functions of the module that build device loaders (call
        ``prepare``/``MpDeviceLoader``) and return something."""
        makers: Set[str] = set()
        for fn in find_all(self.tree.module, cst.FunctionDef):
            calls = find_all(fn, cst.Call, stop=(cst.FunctionDef, cst.ClassDef))
            returns = find_all(fn, cst.Return, stop=(cst.FunctionDef, cst.ClassDef))
            if any(r.value is not None for r in returns) and any(  # type: ignore[attr-defined]
                    call_name(c) in ("prepare", "prepare_data_loader", "MpDeviceLoader", "ParallelLoader")
                    for c in calls):
                makers.add(fn.name.value)  # type: ignore[attr-defined]
        return makers

    def _fed_device_loader(self, param: cst.Param) -> bool:
        """A parameter that the module's own call sites pass a device loader
        (torch_xla's examples: ``train_loop_fn(train_device_loader)``)."""
        fn = next((a for a in self.ancestors(param) if isinstance(a, cst.FunctionDef)), None)
        if fn is None:
            return False
        params = [p.name.value for p in fn.params.params]
        index = params.index(param.name.value) if param.name.value in params else None
        if params and params[0] == "self" and index is not None:
            index -= 1
        for call in find_all(self.tree.module, cst.Call):
            func = call.func  # type: ignore[attr-defined]
            name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
            if name != fn.name.value:
                continue
            for i, arg in enumerate(call.args):  # type: ignore[attr-defined]
                if (arg.keyword is not None and arg.keyword.value == param.name.value) or (
                        arg.keyword is None and i == index):
                    value = arg.value
                    if self._is_device_loader_value(value):
                        return True
                    if isinstance(value, cst.Name) and any(
                            self._is_device_loader_value(v) for v in self.assigned_values(value)):
                        return True
        return False

    def iterates_device_loader(self, loop: cst.For) -> bool:
        """The loop walks a device loader, which syncs after every batch:
        written in place, or through a name bound to one or fed one."""
        if is_device_loader_expr(loop.iter, self.target.loader_names, self.qualnames):
            return True
        it = loop_iterable(loop)
        if not isinstance(it, cst.Name) or not self._may_make_device_loaders():
            return False
        if DEVICE_LOADER in values_of(self.tree).of(it):
            return True
        values = self.assigned_values(it)
        return any(self._is_device_loader_value(v) for v in values) or any(
            isinstance(v, cst.Param) and self._fed_device_loader(v) for v in values)

    def is_loader_loop(self, loop: cst.For) -> bool:
        it = loop_iterable(loop)
        return is_device_loader_expr(loop.iter, self.target.loader_names, self.qualnames) or self.is_data_loader_expr(it)

    def _loader_loops(self, node: cst.CSTNode) -> List[cst.For]:
        return [f for f in find_all(node, cst.For, stop=_DEFS) if self.is_loader_loop(f)]  # type: ignore[arg-type]
