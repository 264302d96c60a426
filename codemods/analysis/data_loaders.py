"""Which expressions are data loaders and which loops walk one: a torch
``DataLoader`` (made here, bound to a name, passed in, or named so where
nothing else tells), and a device loader (``MpDeviceLoader``, what
accelerate's ``prepare`` returns, a function of the module that makes one,
a parameter the module's call sites feed one) -- which syncs after every
batch.  Read by the loop rules (``codemods.loop_codemod``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.calls import called_functions
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


def assigned_values(tree: TreeCache, name: cst.Name) -> List[cst.CSTNode]:
    """Values assigned to ``name`` in its scope: plain assignments, and
    the whole right-hand side of a tuple unpacking (``model, dl =
    accelerator.prepare(model, dl)``); parameters as ``Param`` nodes."""
    values: List[cst.CSTNode] = []
    for target in binding_nodes(tree, name):
        parent = tree.parents.get(id(target))
        while isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List)):
            parent = tree.parents.get(id(parent))
        if isinstance(parent, cst.AssignTarget):
            assign = tree.parents.get(id(parent))
            if isinstance(assign, cst.Assign):
                values.append(assign.value)
        elif isinstance(parent, cst.Param) or isinstance(target, cst.Param):
            param = parent if isinstance(parent, cst.Param) else target
            values.append(param)  # type: ignore[arg-type]
    return values


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

    def _makers(self) -> Set[str]:
        key = f"device_loader_makers:{id(self.tree.module)}"
        if key not in self.tree.memo:
            self.tree.memo[key] = self._device_loader_makers()
        return self.tree.memo[key]  # type: ignore[return-value]

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
            values = assigned_values(self.tree, node)
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
                            self._is_device_loader_value(v) for v in assigned_values(self.tree, value)):
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
        values = assigned_values(self.tree, it)
        return any(self._is_device_loader_value(v) for v in values) or any(
            isinstance(v, cst.Param) and self._fed_device_loader(v) for v in values)

    def is_loader_loop(self, loop: cst.For) -> bool:
        it = loop_iterable(loop)
        return is_device_loader_expr(loop.iter, self.loader_names, self.qualnames) or self.is_data_loader_expr(it)

    def loader_loops(self, node: cst.CSTNode) -> List[cst.For]:
        """The loops directly in ``node`` (not in its nested functions) that walk a loader."""
        return [f for f in find_all(node, cst.For, stop=_DEFS) if self.is_loader_loop(f)]  # type: ignore[arg-type]


# DataLoader's parameters in the order they may be passed by position
_DATALOADER_PARAMS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
                      "pin_memory", "drop_last")


@dataclass(frozen=True)
class Batching:
    """What a ``DataLoader(...)`` call says about its batches: the batch size
    (an expression; None when it is left at 1, or ``None``), whether it drops
    the last partial batch (anything but an absent or literal ``False``
    ``drop_last``, or batches a ``batch_sampler`` makes), and whether the
    rows are shuffled (``shuffle`` not literally false, or a sampler other
    than a sequential one)."""

    batch_size: Optional[cst.BaseExpression]
    drops_last: bool
    shuffled: bool


def batching(tree: TreeCache, call: cst.Call) -> Optional[Batching]:
    """The batching of a ``DataLoader(...)`` call, its keywords read through
    a ``**kwargs`` dict made in the same module (``DataLoader(ds,
    **train_kwargs)`` with ``train_kwargs = {"batch_size": ...}`` and its
    ``.update(...)``); None where an argument cannot be read."""
    args: Dict[str, cst.BaseExpression] = {}
    for i, arg in enumerate(call.args):
        if arg.star == "**":
            keywords = _dict_keywords(tree, arg.value)
            if keywords is None:
                return None
            args.update(keywords)
        elif arg.star:
            return None
        elif arg.keyword is not None:
            args[arg.keyword.value] = arg.value
        elif i < len(_DATALOADER_PARAMS):
            args[_DATALOADER_PARAMS[i]] = arg.value
    size = args.get("batch_size")
    if size is not None and (_literal(size) in ("None", "1")):
        size = None
    drop = args.get("drop_last")
    drops = "batch_sampler" in args or (drop is not None and _literal(drop) != "False")
    shuffle, sampler = args.get("shuffle"), args.get("sampler")
    shuffled = (shuffle is not None and _literal(shuffle) not in ("False", "None")) or (
        sampler is not None and _literal(sampler) != "None" and "Sequential" not in (call_name(sampler) or ""))
    return Batching(size, drops, shuffled)


def _literal(node: cst.BaseExpression) -> str:
    """The text of a literal ``None``/``True``/``False`` or integer, else ""."""
    if isinstance(node, cst.Name) and node.value in ("None", "True", "False"):
        return node.value
    return node.value if isinstance(node, cst.Integer) else ""


def _dict_keywords(tree: TreeCache, value: cst.BaseExpression, depth: int = 0) -> Optional[Dict[str, cst.BaseExpression]]:
    """The keywords a ``**value`` passes: a dict display or ``dict(...)``, or
    a name every binding of which is one, with what the name's
    ``.update(...)`` calls in its scope add; None where one cannot be read."""
    if isinstance(value, cst.Dict):
        out: Dict[str, cst.BaseExpression] = {}
        for element in value.elements:
            if not isinstance(element, cst.DictElement):
                more = _dict_keywords(tree, element.value, depth + 1) if depth < 3 else None
                if more is None:
                    return None
                out.update(more)
            elif isinstance(element.key, cst.SimpleString):
                out[element.key.evaluated_value] = element.value  # type: ignore[index]
            else:
                return None
        return out
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
        if any(a.keyword is None for a in value.args):
            return None
        return {a.keyword.value: a.value for a in value.args}  # type: ignore[union-attr]
    if not isinstance(value, cst.Name) or depth >= 3:
        return None
    bound = assigned_values(tree, value)
    if not bound:
        return None
    out = {}
    for v in bound:
        keywords = _dict_keywords(tree, v, depth + 1) if not isinstance(v, cst.Param) else None
        if keywords is None:
            return None
        out.update(keywords)
    scope = next((a for a in dataflow(tree).ancestors(value) if isinstance(a, (cst.FunctionDef, cst.Lambda))), tree.module)
    for target in find_all(scope, cst.AssignTarget):  # kwargs["drop_last"] = True
        sub = target.target  # type: ignore[attr-defined]
        if isinstance(sub, cst.Subscript) and isinstance(sub.value, cst.Name) and sub.value.value == value.value:
            key = sub.slice[0].slice if len(sub.slice) == 1 else None
            if not (isinstance(key, cst.Index) and isinstance(key.value, cst.SimpleString)):
                return None
            out[key.value.evaluated_value] = tree.parents[id(target)].value  # type: ignore[attr-defined,index]
    for call in find_all(scope, cst.Call):
        func = call.func  # type: ignore[attr-defined]
        if isinstance(func, cst.Attribute) and func.attr.value == "update" and isinstance(func.value, cst.Name) \
                and func.value.value == value.value:
            for arg in call.args:  # type: ignore[attr-defined]
                more = _dict_keywords(tree, arg.value, depth + 1) if arg.keyword is None and not arg.star else None
                if more is None:
                    return None
                out.update(more)
    return out



def first_batch_only(tree: TreeCache, call: cst.Call) -> bool:
    """The loader ``call`` makes is read for its first batch only
    (``next(iter(loader))``, pytorch/examples' mnist_forward_forward): made
    in place so, or bound to a name whose every read in its scope is so."""
    if _first_batch_of(tree, call):
        return True
    bound = _bound_to_name(tree, call)
    if bound is None:
        return False
    target, scope = bound
    reads = [n for n in find_all(scope, cst.Name) if n.value == target.value and n is not target]  # type: ignore[attr-defined]
    return bool(reads) and all(_first_batch_of(tree, n) for n in reads)


def _bound_to_name(tree: TreeCache, call: cst.Call) -> Optional[Tuple[cst.Name, cst.CSTNode]]:
    """``name = call``: the name, and the scope it is read in (the function
    around it, or the module)."""
    assign = tree.parents.get(id(call))
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)):
        return None
    scope = next((a for a in dataflow(tree).ancestors(call) if isinstance(a, (cst.FunctionDef, cst.Lambda))),
                 tree.module)
    return assign.targets[0].target, scope


def _first_batch_of(tree: TreeCache, node: cst.CSTNode) -> bool:
    """``node`` is read as ``next(iter(node))``."""
    for name in ("iter", "next"):
        arg = tree.parents.get(id(node))
        node = tree.parents.get(id(arg))  # type: ignore[assignment]
        if not (isinstance(arg, cst.Arg) and isinstance(node, cst.Call) and isinstance(node.func, cst.Name)
                and node.func.value == name and len(node.args) == 1):
            return False
    return True


# what a loop of evaluation runs under: autograd off
_GRAD_OFF = ("no_grad", "inference_mode")
# what reads a loader without walking it (`len(loader.dataset)`)
_LOADER_FACTS = ("dataset", "batch_size", "sampler", "drop_last")
# what walks the loader it is handed, batch by batch, in the loop around it
# (MpDeviceLoader: as the loop rules wrap a loader before this rule reads it)
_WALKING_WRAPPERS = ("enumerate", "tqdm", "iter", "MpDeviceLoader")


def evaluation_only(tree: TreeCache, call: cst.Call) -> bool:
    """The loader ``call`` makes is walked only by loops of evaluation:
    every loop that walks it runs with autograd off (inside ``with
    torch.no_grad():`` or a function under ``@torch.no_grad()``, as
    ``inference_mode``) and calls no ``.backward()`` -- pytorch/examples'
    mnist ``test(model, device, test_loader)``.  The loader is bound to a
    name read only so: walked there, read for a fact (``len(loader)``,
    ``loader.dataset``), or handed to a function of the module that walks
    its parameter so.  Any other read (returned, stored, handed elsewhere)
    and the answer is no: nothing says the loader is not trained on."""
    loops = _walking_loops(tree, call)
    return bool(loops) and all(_grad_off(tree, loop) and not any(
        call_name(c) == "backward" for c in find_all(loop, cst.Call)) for loop in loops)  # type: ignore[arg-type]


def _walking_loops(tree: TreeCache, call: cst.Call) -> Optional[List[cst.For]]:
    bound = _bound_to_name(tree, call)
    if bound is None:
        return None
    target, scope = bound
    return _loops_reading(tree, scope, target.value, target, handed=True)


def _loops_reading(tree: TreeCache, scope: cst.CSTNode, name: str, binding: cst.CSTNode,
                   handed: bool) -> Optional[List[cst.For]]:
    """The loops that walk ``name`` in ``scope``; None where a read of it is
    something else (``handed``: may it be handed on to one function)."""
    loops: List[cst.For] = []
    for read in find_all(scope, cst.Name):
        if read.value != name or read is binding:  # type: ignore[attr-defined]
            continue
        parent = tree.parents.get(id(read))
        if isinstance(parent, cst.Attribute) and parent.value is read and parent.attr.value in _LOADER_FACTS:
            continue
        node = read
        arg = parent
        if isinstance(arg, cst.Arg) and arg.keyword is None and call_name(tree.parents.get(id(arg))) == "len":
            continue
        while isinstance(arg, cst.Arg) and arg.keyword is None and call_name(tree.parents.get(id(arg))) \
                in _WALKING_WRAPPERS and tree.parents[id(arg)].args[0] is arg:  # type: ignore[union-attr]
            node = tree.parents[id(arg)]
            arg = tree.parents.get(id(node))
        if isinstance(arg, cst.For) and arg.iter is node:
            loops.append(arg)
            continue
        more = _loops_of_parameter(tree, arg, read) if handed and node is read else None
        if more is None:
            return None
        loops += more
    return loops


def _loops_of_parameter(tree: TreeCache, arg: Optional[cst.CSTNode], read: cst.Name) -> Optional[List[cst.For]]:
    """``f(..., loader, ...)``, ``f`` one function of the module (read
    through the scopes, ``analysis.calls``): the loops that walk the
    parameter ``loader`` is handed to."""
    call = tree.parents.get(id(arg)) if isinstance(arg, cst.Arg) else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)):
        return None
    defs = called_functions(tree, call) or []
    if len(defs) != 1:
        return None
    fn: cst.FunctionDef = defs[0]  # type: ignore[assignment]
    params = list(fn.params.params)
    position = list(call.args).index(arg)  # type: ignore[arg-type]
    if arg.keyword is not None:  # type: ignore[union-attr]
        param = next((p for p in [*params, *fn.params.kwonly_params] if p.name.value == arg.keyword.value), None)  # type: ignore[union-attr]
    else:
        param = params[position] if position < len(params) and not any(
            a.star for a in list(call.args)[: position + 1]) else None
    if param is None:
        return None
    return _loops_reading(tree, fn.body, param.name.value, param.name, handed=False)


def _grad_off(tree: TreeCache, loop: cst.For) -> bool:
    """Inside ``with torch.no_grad():`` (or ``inference_mode``), or a
    function decorated with one."""
    for node in dataflow(tree).ancestors(loop):
        if isinstance(node, cst.With) and any(
                isinstance(i.item, cst.Call) and call_name(i.item) in _GRAD_OFF for i in node.items):
            return True
        if isinstance(node, cst.FunctionDef):
            return any(call_name(d.decorator) in _GRAD_OFF or (dotted(d.decorator) or "").rpartition(".")[2]
                       in _GRAD_OFF for d in node.decorators)
    return False
