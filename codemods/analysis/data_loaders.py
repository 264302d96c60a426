"""Which expressions are data loaders and which loops walk one: a torch
``DataLoader`` (made here, bound to a name, passed in, or named so where
nothing else tells), and a device loader (``MpDeviceLoader``, what
accelerate's ``prepare`` returns, a function of the module that makes one,
a parameter the module's call sites feed one) -- which syncs after every
batch.  Read by the loop rules (``codemods.loop_codemod``)."""

from __future__ import annotations

from typing import Callable, List, Sequence, Set

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.dataflow import dataflow
from codemods.analysis.loops import _DEFS, LOADER_NAME_RE, _names_one_loader, is_device_loader_expr, loop_iterable
from codemods.analysis.values import DEVICE_LOADER, LOADER, UNKNOWN
from codemods.analysis.values import values as values_of
from codemods.syntax.tree import TreeCache, call_name, dotted, find_all

DATALOADER_NAMES = {
    "torch.utils.data.DataLoader",
    "torch.utils.data.dataloader.DataLoader",
}

# Every way _is_device_loader_value can see a device loader is spelled with
# one of these in the source.
_DEVICE_LOADER_WORDS = (b"MpDeviceLoader", b"ParallelLoader", b"per_device_loader", b"parallel_loader",
                        b"prepare(", b"prepare_data_loader")


class DataLoaders:
    """The loaders of one tree, for one codemod: ``qualnames`` is the
    codemod's (its scope fallback), ``loader_names`` its target's device
    loader names, ``text`` the module's text as the codemods so far left it
    (an earlier one may have added a device loader)."""

    def __init__(self, tree: TreeCache, qualnames: Callable[[cst.CSTNode], Set[str]], loader_names: Sequence[str],
                 text: Callable[[], bytes]) -> None:
        self.tree = tree
        self.qualnames = qualnames
        self.loader_names = loader_names
        self.text = text
        self.values = values_of(tree)
        self.flow = dataflow(tree)

    def _parent(self, node: cst.CSTNode):  # type: ignore[no-untyped-def]
        return self.tree.parents.get(id(node))

    def _makers(self) -> Set[str]:
        key = f"device_loader_makers:{id(self.tree.module)}"
        if key not in self.tree.memo:
            self.tree.memo[key] = self._device_loader_makers()
        return self.tree.memo[key]  # type: ignore[return-value]

    def assigned_values(self, name: cst.Name) -> List[cst.CSTNode]:
        """Values assigned to ``name`` in its scope: plain assignments, and
        the whole right-hand side of a tuple unpacking (``model, dl =
        accelerator.prepare(model, dl)``); parameters as ``Param`` nodes."""
        values: List[cst.CSTNode] = []
        for target in binding_nodes(self.tree, name):
            parent = self._parent(target)
            while isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List)):
                parent = self._parent(parent)
            if isinstance(parent, cst.AssignTarget):
                assign = self._parent(parent)
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
            kinds = self.values.of(node)
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
        data = self.text()
        return any(w in data for w in _DEVICE_LOADER_WORDS)

    def _is_device_loader_value(self, value: cst.CSTNode) -> bool:
        """An MpDeviceLoader, what ``accelerator.prepare(...)`` returns (on
        XLA, accelerate's MpDeviceLoaderWrapper), or what a function of this
        module returns when it makes one of those (``get_training_setup()``)."""
        if isinstance(value, cst.Param):
            return False
        if is_device_loader_expr(value, self.loader_names, self.qualnames):
            return True
        if not isinstance(value, cst.Call):
            return False
        if call_name(value) in ("prepare", "prepare_data_loader"):
            return True
        return isinstance(value.func, cst.Name) and value.func.value in self._makers()

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
        fn = next((a for a in self.flow.ancestors(param) if isinstance(a, cst.FunctionDef)), None)
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
        if is_device_loader_expr(loop.iter, self.loader_names, self.qualnames):
            return True
        it = loop_iterable(loop)
        if not isinstance(it, cst.Name) or not self._may_make_device_loaders():
            return False
        if DEVICE_LOADER in self.values.of(it):
            return True
        values = self.assigned_values(it)
        return any(self._is_device_loader_value(v) for v in values) or any(
            isinstance(v, cst.Param) and self._fed_device_loader(v) for v in values)

    def is_loader_loop(self, loop: cst.For) -> bool:
        it = loop_iterable(loop)
        return is_device_loader_expr(loop.iter, self.loader_names, self.qualnames) or self.is_data_loader_expr(it)

    def loader_loops(self, node: cst.CSTNode) -> List[cst.For]:
        """The loops directly in ``node`` (not in its nested functions) that walk a loader."""
        return [f for f in find_all(node, cst.For, stop=_DEFS) if self.is_loader_loop(f)]  # type: ignore[arg-type]
