"""XLA301: loops over a torch DataLoader iterate an MpDeviceLoader instead.

``MpDeviceLoader`` copies the next batches to the device in background threads
while the current step runs, and calls the step barrier after every batch.
The per-batch ``.to(device)`` calls that become redundant are kept: moving a
tensor to the device it is already on costs nothing, and the code keeps
working if the loader is later changed back.
"""

from __future__ import annotations

import re
from typing import List, Set, Tuple

import libcst as cst

from codemods.analysis.prefilter import LOADER_LOOP
from codemods.loop_codemod import LoopCodemod
from codemods.analysis import is_device_loader_expr, loop_iterable, module_facts
from codemods.analysis.placement import MOVES, batch_meets_host_tensor, batches_stay_on_host
from codemods.analysis.dataflow import dataflow
from codemods.base import Rule, call_name, find_all

DEVICE_LOADER = Rule(
    code="XLA301",
    name="mp-device-loader",
    summary="loop over a DataLoader: iterate `MpDeviceLoader(loader, device)` instead",
    why=(
        "A plain DataLoader hands the loop CPU tensors; each `.to(device)` then stalls the "
        "step while the batch is copied. `MpDeviceLoader` prefetches batches to the XLA "
        "device in the background and puts the step barrier after each batch, so the loop "
        "needs no barrier of its own. Redundant `.to(device)` calls in the body are kept: "
        "they are no-ops on the device the batch is already on."
    ),
    before=(
        "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=8)\n"
        "for step, (x, y) in enumerate(loader):\n    train(x, y)\n"
    ),
    after=(
        "from torch.utils.data import DataLoader\nimport torch_xla\nimport torch_xla.distributed.parallel_loader as pl\n\n"
        "loader = DataLoader(ds, batch_size=8)\n"
        "for step, (x, y) in enumerate(pl.MpDeviceLoader(loader, torch_xla.device())):\n    train(x, y)\n"
    ),
    valid=(
        "import torch_xla.distributed.parallel_loader as pl\n\n"
        "for x in pl.MpDeviceLoader(loader, device):\n    train(x)\n",
        "for x in range(10):\n    train(x)\n",
        # bound to a device loader by an assignment, even a later one (accelerate's prepare)
        "from torch.utils.data import DataLoader\n\ndl = DataLoader(ds)\ndl = accelerator.prepare(dl)\n"
        "for batch in dl:\n    train(batch)\n",
        # a device loader handed to the function that loops (torch_xla's own examples)
        "import torch_xla.distributed.parallel_loader as pl\nfrom torch.utils.data import DataLoader\n\n"
        "def train_loop_fn(loader):\n    for x in loader:\n        train(x)\n\n"
        "device_loader = pl.MpDeviceLoader(DataLoader(ds), device)\ntrain_loop_fn(device_loader)\n",
        # prepared by accelerate through tuple unpacking, or by a helper that returns it (accelerate's tests)
        "from torch.utils.data import DataLoader\n\nmodel, opt, dl = accelerator.prepare(model, opt, DataLoader(ds))\n"
        "for batch in dl:\n    train(batch)\n",
        "from torch.utils.data import DataLoader\n\ndef setup(accelerator):\n    dl = DataLoader(ds)\n"
        "    model, dl = accelerator.prepare(model, dl)\n    return model, dl\n\n"
        "model, dl = setup(accelerator)\nfor batch in dl:\n    train(batch)\n",
        # the device is the caller's (timm's PrefetchLoader): reported, not rewritten -> not in `valid`
        # host code: batches reduced on the CPU, never moved nor handed on (pytorch-cifar's mean and std)
        "import torch\nfrom torch.utils.data import DataLoader\n\nmean = torch.zeros(3)\n"
        "for x, _ in DataLoader(ds):\n    mean += x.mean((0, 2, 3))\n",
        # a list of loaders (accelerate's checkpointing): iterating it walks loaders, not batches
        "for i, dl in enumerate(dataloaders):\n    save_sampler_state(dl, i)\n",
    ),
)


class LoaderWrapping:
    """What XLA301 decides for a loop, for a :class:`LoopCodemod` that needs
    to know (``refusal``): XLA301 itself, and XLA425, whose meters summed on
    the device need the sync a device loader makes after every batch."""

    def _callers_device(self, loop: cst.CSTNode) -> bool:
        """The loop is in a function, or a class, that takes a device from its
        caller (timm's ``PrefetchLoader(loader, device=...)``): the device to
        load onto is the caller's choice, not a hard-coded XLA device."""
        for anc in self.ancestors(loop):
            if isinstance(anc, cst.FunctionDef) and _device_params(anc):
                return True
            if isinstance(anc, cst.ClassDef):
                body = anc.body.body if isinstance(anc.body, cst.IndentedBlock) else ()
                return any(isinstance(f, cst.FunctionDef) and f.name.value == "__init__" and _device_params(f)
                           for f in body)
        return False

    def _model_on_host(self, loop: cst.For) -> str:
        """The name of a model the loop's own body runs that stays on the host:
        built by a constructor here, never ``.to()``/``.cuda()``-ed, and never
        handed to anything that could move it (``accelerator.prepare``, DDP,
        a helper).  Wrapping the loader would put the batches on the XLA
        device beside a CPU model (accelerate's CPU baseline in its tests)."""
        flow = dataflow(self.tree)
        for call in find_all(loop.body, cst.Call, stop=(cst.For, cst.While, cst.FunctionDef, cst.Lambda)):
            func = call.func  # type: ignore[attr-defined]
            if not isinstance(func, cst.Name):
                continue
            bindings = flow.reaching(func)
            if not bindings or not all(self._built_here(b) for b in bindings):
                continue
            # searched where the name lives: its function, or the whole module for a global
            scope = next((a for a in self.ancestors(bindings[0]) if isinstance(a, (cst.FunctionDef, cst.Lambda))),
                         self.tree.module)
            if not self._moved_or_shared(func.value, scope):
                return func.value
        return ""

    def _built_here(self, binding: cst.CSTNode) -> bool:
        """``model = Net(...)``: a constructor call, nothing chained after it."""
        assign = self.parent(self.parent(binding)) if isinstance(self.parent(binding), cst.AssignTarget) else None
        if not isinstance(assign, cst.Assign) or not isinstance(binding, cst.Name):
            return False
        value = assign.value
        name = call_name(value) or ""
        # (a loss or an activation has no parameters: on the host it serves device tensors as well)
        return isinstance(value, cst.Call) and name[:1].isupper() and not (
            name.endswith("Loss") or name in _STATELESS)

    def _moved_or_shared(self, name: str, scope: cst.CSTNode) -> bool:
        for call in find_all(scope, cst.Call):
            func = call.func  # type: ignore[attr-defined]
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == name:
                if func.attr.value in MOVES or func.attr.value in ("apply", "share_memory"):
                    return True
            if any(isinstance(a.value, cst.Name) and a.value.value == name for a in call.args):  # type: ignore[attr-defined]
                return True  # handed to something that may move it
        return False

    def refusal(self, original: cst.CSTNode):  # type: ignore[no-untyped-def]
        """Why XLA301 leaves a loop's loader as it is: ``("skip", None)`` for
        a loop it does not concern (or that walks a device loader already), a
        reason it reports with what names it (``("host_model", name)``,
        ``("callers_device", None)``, ``("meets", call)``, ``("numpy", name)``),
        or None where it wraps the loader (XLA425 asks: such a loop syncs after
        every batch once converted)."""
        if not isinstance(original, cst.For) or self.target.loader is None:
            return ("skip", None)
        if is_device_loader_expr(original.iter, self.target.loader_names, self.qualnames):
            return ("skip", None)
        inner = loop_iterable(original)
        if not self.loaders.is_data_loader_expr(inner) or batches_stay_on_host(original):
            return ("skip", None)  # (host code: its batches are never moved nor handed on)
        host_model = self._model_on_host(original)
        if host_model:
            return ("host_model", host_model)
        if self._callers_device(original):
            return ("callers_device", None)
        meets = batch_meets_host_tensor(self.tree, original)
        if meets is not None:
            return ("meets", meets)
        rebound = _numpy_reads(original)[1]
        return ("numpy", rebound) if rebound else None


class DeviceLoader(LoaderWrapping, LoopCodemod):
    DESCRIPTION = "Wrap DataLoaders iterated by a loop in MpDeviceLoader."
    RESPECTS_HAND_PORTS = True  # a module that knows XLA wraps its own loaders (transformers\' Trainer)
    RULES = (DEVICE_LOADER,)
    TRIGGERS = (b"oader", b"_dl")
    NEEDS = (LOADER_LOOP,)

    @classmethod
    def wanted(cls, tree, options):
        return bool(module_facts(tree).loader_loops)

    def regions(self, tree):
        return module_facts(tree).loader_loops

    def rewrite_loop(self, original, updated):
        refused = self.refusal(original)
        inner = loop_iterable(original) if isinstance(original, cst.For) else None
        if refused is not None:
            kind, what = refused
            if kind == "host_model":
                self.flag(inner, DEVICE_LOADER.code, f"DataLoader loop whose model `{what}` is never moved to a "
                          "device: its batches stay on the host here; move the model (`.to(device)`) and wrap the "
                          "loader in `MpDeviceLoader` together, or leave both on the CPU", fix=False)
            elif kind == "callers_device":
                self.flag(inner, DEVICE_LOADER.code, "DataLoader loop in code that takes its device from the caller: "
                          "wrap the loader in `MpDeviceLoader(loader, device)` where the device is chosen", fix=False)
            elif kind == "meets":
                line = self.user_line(self.position(what)[0])
                self.flag(inner, DEVICE_LOADER.code, f"DataLoader loop whose batches meet tensors made on the host "
                          f"(the `{call_name(what)}` at line {line}): a device loader would put them on the device "
                          "first; make those tensors on the batch's device (`device=x.device`), then wrap the loader "
                          "in `MpDeviceLoader`", fix=False, related=(what,))
            elif kind == "numpy":
                self.flag(inner, DEVICE_LOADER.code, f"DataLoader loop whose batch `{what}` is read on the host "
                          "(`.numpy()`) after the body rebinds it: wrap the loader in `MpDeviceLoader` and read it "
                          "with `.cpu().numpy()`", fix=False)
            return updated
        to_numpy = _numpy_reads(original)[0]
        read = f"; `{to_numpy[0]}.numpy()` reads it back with `.cpu()`" if to_numpy else ""
        if not self.flag(inner, DEVICE_LOADER.code, f"DataLoader loop -> MpDeviceLoader (syncs after every batch){read}",
                         fix=True):
            return updated
        if to_numpy:  # the batches now live on the device: numpy needs them on the host
            updated = updated.with_changes(body=updated.body.visit(_ToHost(set(to_numpy))))
        self.add_imports(self.target.loader_imports)
        wrapped = cst.parse_expression(self.target.loader.format(loader="__XLAPORT_LOADER__"))
        wrapped = wrapped.visit(_Replace(loop_iterable(updated)))
        if isinstance(updated.iter, cst.Call) and call_name(updated.iter) == "enumerate" and updated.iter.args:
            args = list(updated.iter.args)
            args[0] = args[0].with_changes(value=wrapped)
            return updated.with_changes(iter=updated.iter.with_changes(args=args))
        return updated.with_changes(iter=wrapped)


_DEVICE_PARAM = re.compile(r"(^|_)device$")
_STATELESS = {"ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Dropout", "Identity", "Flatten",
              "Upsample", "LeakyReLU"}


def _device_params(fn: cst.FunctionDef) -> bool:
    return any(_DEVICE_PARAM.search(p.name.value) for p in (*fn.params.params, *fn.params.kwonly_params))


def _numpy_reads(loop: cst.For) -> Tuple[List[str], str]:
    """The batch names (bound by the loop's target) that its body reads with
    ``.numpy()``, and one of them the body also rebinds ("" if none)."""
    batch = {n.value for n in find_all(loop.target, cst.Name)}  # type: ignore[attr-defined]
    read = sorted({c.func.value.value for c in find_all(loop.body, cst.Call)  # type: ignore[attr-defined]
                   if isinstance(c.func, cst.Attribute) and c.func.attr.value == "numpy"  # type: ignore[attr-defined]
                   and isinstance(c.func.value, cst.Name) and c.func.value.value in batch})  # type: ignore[attr-defined]
    if not read:
        return [], ""
    bound = {n.value for t in find_all(loop.body, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For))
             for n in find_all(t.target, cst.Name)}  # type: ignore[attr-defined]
    rebound = [n for n in read if n in bound]
    return read, rebound[0] if rebound else ""


class _ToHost(cst.CSTTransformer):
    """``x.numpy()`` -> ``x.cpu().numpy()`` for the names given."""

    def __init__(self, names: Set[str]) -> None:
        self.names = names

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = updated_node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "numpy" and not updated_node.args \
                and isinstance(func.value, cst.Name) and func.value.value in self.names:
            return updated_node.with_changes(func=func.with_changes(value=cst.parse_expression(f"{func.value.value}.cpu()")))
        return updated_node


class _Replace(cst.CSTTransformer):
    def __init__(self, value: cst.BaseExpression) -> None:
        self.value = value

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.value if original_node.value == "__XLAPORT_LOADER__" else updated_node
