"""XLA501-XLA509: a program already ported to torch_xla, moved to TorchTPU
(``--target torchtpu``; nothing happens with the other targets).

TorchTPU is eager-first and device-generic: the device is
``torch.accelerator.current_accelerator()`` (``"tpu"``), there is no step
barrier, no device loader and no step closure.  So:

* XLA501 ``xm.xla_device()`` / ``torch_xla.device()`` -> the target's device;
* XLA502 ``torch_xla.sync()`` / ``xm.mark_step()`` as a statement -> removed;
  ``sync(wait=True)`` / ``xm.wait_device_ops()`` -> ``torch.accelerator.synchronize()``;
* XLA503 ``pl.MpDeviceLoader(loader, device)`` -> ``loader``;
* XLA504 ``xm.optimizer_step(opt)`` -> ``opt.step()`` (one process: with
  several, ``DistributedDataParallel`` reduces the gradients on TorchTPU, so
  a program that launches processes is reported instead);
* XLA505 ``xm.save(obj, path)`` -> ``torch.save(obj, path)``;
  ``xm.add_step_closure(fn, args=(a,))`` -> ``fn(a)``, run at once;
* XLA506 the process group (``"xla"``, ``init_method="xla://"``) -> the
  device's default backend ``"tpu_dist"``; ``torch.compile(...,
  backend="openxla")`` -> ``backend="tpu"``; world size and ordinals ->
  ``torch.distributed``'s;
* XLA509 any other torch_xla name has no counterpart: reported, with the fix.

The torch_xla imports nothing uses any more are removed.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from codemods.analysis.device_exprs import XLA_DEVICE_CALLS
from codemods.base import Rule, XlaCodemod, call_name, string_value
from codemods.syntax import imports
from codemods.syntax.edits import DropsStatements
from codemods.syntax.nodes import comma_separated, source_of
from codemods.target import TORCHTPU

_WAIT = "torch.accelerator.synchronize() if torch.accelerator.is_available() else None"
_ACCELERATOR = TORCHTPU.device  # (the rules emit `self.target.device`; this is for their examples)


def _rule(code: str, name: str, summary: str, why: str, before: str, after: str) -> Rule:
    return Rule(code=code, name=name, summary=summary, why=why, before=before, after=after, example_target="torchtpu")


DEVICE = _rule("XLA501", "xla-device", "`torch_xla.device()` / `xm.xla_device()` -> the accelerator's device",
               "TorchTPU's device is `\"tpu\"`, reached through `torch.accelerator.current_accelerator()`; falling "
               "back to the CPU keeps the program running on a host without a TPU.",
               "import torch\nimport torch_xla\n\ndevice = torch_xla.device()\n",
               f"import torch\n\ndevice = {_ACCELERATOR}\n")
BARRIER = _rule("XLA502", "xla-barrier", "`torch_xla.sync()` / `xm.mark_step()` removed (TorchTPU is eager)",
                "TorchTPU runs eagerly: there is no lazy graph to cut. A barrier that waits for the device "
                "(`sync(wait=True)`, `xm.wait_device_ops()`) becomes `torch.accelerator.synchronize()`, where an "
                "accelerator is (it raises on a host without one, where the torch_xla program ran).",
                "import torch_xla\n\nfor x in data:\n    step(x)\n    torch_xla.sync()\n",
                "for x in data:\n    step(x)\n")
LOADER = _rule("XLA503", "xla-device-loader", "`pl.MpDeviceLoader(loader, device)` -> `loader`, each batch moved",
               "The device loader overlaps host-to-device copies with XLA's graph execution, and moves each batch "
               "to the device; on TorchTPU the loop moves its batches itself, as it did on CUDA. Where the loader "
               "is not iterated by a loop over names (`for x, y in ...`), it is reported.",
               "import torch_xla.distributed.parallel_loader as pl\n\n"
               "for x, y in pl.MpDeviceLoader(loader, device):\n    step(x, y)\n",
               "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n    step(x, y)\n")
OPTIMIZER = _rule("XLA504", "xla-optimizer-step", "`xm.optimizer_step(opt)` -> `opt.step()`",
                  "`xm.optimizer_step` all-reduces the gradients of the replicas, then steps. With one process "
                  "it is `opt.step()`; with several, TorchTPU reduces gradients through `DistributedDataParallel`, "
                  "so in a module that launches processes it is reported.",
                  "import torch_xla.core.xla_model as xm\n\nfor x in data:\n    step(x)\n    xm.optimizer_step(opt)\n",
                  "for x in data:\n    step(x)\n    opt.step()\n")
SAVE = _rule("XLA505", "xla-save-closure", "`xm.save` -> `torch.save`; `xm.add_step_closure(fn, args)` -> `fn(*args)`; "
             "seeds and prints", "`xm.save` moved device tensors to the CPU and wrote from one process; `torch.save` "
             "writes what it is given. Without a lazy graph a step closure has nothing to wait for: it runs where it "
             "stands. `torch_xla.manual_seed(s)` is `torch.manual_seed(s)`, which seeds the TPU's generator too; "
             "`xm.master_print` is `print` in a program of one process (reported where the module launches several).",
             "import torch_xla.core.xla_model as xm\n\nxm.add_step_closure(report, args=(step, loss))\n"
             "xm.save(state, \"model.pt\")\n",
             "import torch\n\nreport(step, loss)\ntorch.save(state, \"model.pt\")\n")
DISTRIBUTED = _rule("XLA506", "xla-distributed", "process group, compile backend, world size and ordinals -> "
                    "TorchTPU's", "TorchTPU registers the backend `\"tpu_dist\"` for the device (its default); "
                    "`torch.compile` takes `backend=\"tpu\"`; the world size and ranks are `torch.distributed`'s.",
                    "import torch\nimport torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n\n"
                    "dist.init_process_group(\"xla\", init_method=\"xla://\")\n"
                    "model = torch.compile(model, backend=\"openxla\")\n",
                    "import torch\nimport torch.distributed as dist\n\ndist.init_process_group(\"tpu_dist\")\n"
                    "model = torch.compile(model, backend=\"tpu\")\n")
LEFT_OVER = Rule(
    code="XLA509", name="xla-left-over", summary="a torch_xla name with no TorchTPU counterpart (reported)",
    why="SPMD meshes, `xm.all_reduce` and the other collectives, `xmp.spawn`/`torch_xla.launch` (use `torchrun` "
        "with `torch.tpu.distributed.set_tpu_launch_env(...)`), metrics and debug modules: each needs a person.",
    before="import torch_xla\n\ntorch_xla.launch(main)\n", after=None, example_target="torchtpu")

_DEVICES = XLA_DEVICE_CALLS
_BARRIERS = {"torch_xla.sync", "torch_xla.core.xla_model.mark_step", "torch_xla.torch_xla.sync"}
_WAITS = {"torch_xla.core.xla_model.wait_device_ops"}
_LOADERS = {"torch_xla.distributed.parallel_loader.MpDeviceLoader"}
_INITIALIZED = "torch.distributed.is_initialized()"
_WORLD_SIZE = f"(torch.distributed.get_world_size() if {_INITIALIZED} else 1)"
_RANK = f"(torch.distributed.get_rank() if {_INITIALIZED} else 0)"
_WORLD = {"torch_xla.runtime.world_size": _WORLD_SIZE, "torch_xla.core.xla_model.xrt_world_size": _WORLD_SIZE,
          "torch_xla.runtime.global_ordinal": _RANK, "torch_xla.core.xla_model.get_ordinal": _RANK,
          "torch_xla.core.xla_model.is_master_ordinal": f"(not {_INITIALIZED} or torch.distributed.get_rank() == 0)"}
_LAUNCHES = {"torch_xla.launch", "torch_xla.distributed.xla_multiprocessing.spawn"}


class FromTorchXla(DropsStatements, XlaCodemod):
    DESCRIPTION = "Move a torch_xla program to TorchTPU (--target torchtpu)."
    RULES = (DEVICE, BARRIER, LOADER, OPTIMIZER, SAVE, DISTRIBUTED, LEFT_OVER)
    TRIGGERS = (b"torch_xla",)
    NEEDS = ("name~torch_xla",)

    def regions(self, tree):
        self._moves: dict = {}  # id(loop) -> the device its batches move to
        if not self.target.from_torch_xla:
            return []
        self._launches = any(self.qualnames(c.func) & _LAUNCHES for c in tree.nodes((cst.Call,)))  # type: ignore
        for module, obj, asname in _xla_imports(tree.module):  # removed where nothing uses them any more
            imports.drop(self.context, module, obj, asname)
        return None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        q = self.qualnames(original_node.func)
        if not any(n.startswith("torch_xla") for n in q) and not q & {"torch.compile",
                                                                       "torch.distributed.init_process_group"}:
            return updated_node
        parent = self.parent(original_node)
        if q & _DEVICES:
            return self._replace(original_node, DEVICE, "the accelerator's device", self.target.device) or updated_node
        if q & (_BARRIERS | _WAITS):
            waits = bool(q & _WAITS) or any(a.keyword is not None and a.keyword.value == "wait" for a in
                                            original_node.args)
            if waits:
                # (torch.accelerator.synchronize() raises where no accelerator is: the program ran on any host)
                return self._replace(original_node, BARRIER, "`torch.accelerator.synchronize()`",
                                     _WAIT) or updated_node
            if isinstance(parent, cst.Expr) and self.flag(original_node, BARRIER.code, "barrier removed (TorchTPU "
                                                          "runs eagerly)", fix=True):
                return self.drop_call(updated_node, parent)
            return updated_node
        if q & _LOADERS and updated_node.args:
            return self._loader(original_node, updated_node)
        if "torch_xla.core.xla_model.optimizer_step" in q:
            return self._optimizer_step(original_node, updated_node)
        if "torch_xla.core.xla_model.save" in q:
            if self.flag(original_node, SAVE.code, "`xm.save` -> `torch.save`", fix=True):
                imports.need(self.context, "torch")
                return updated_node.with_changes(func=cst.parse_expression("torch.save"))
            return updated_node
        if "torch_xla.core.xla_model.add_step_closure" in q:
            return self._closure(original_node, updated_node)
        if "torch_xla.manual_seed" in q and self.flag(original_node, SAVE.code, "`torch_xla.manual_seed` -> "
                                                      "`torch.manual_seed` (it seeds the TPU's generator too)",
                                                      fix=True):
            imports.need(self.context, "torch")
            return updated_node.with_changes(func=cst.parse_expression("torch.manual_seed"))
        if "torch_xla.core.xla_model.master_print" in q and not self._launches and \
                self.flag(original_node, SAVE.code, "`xm.master_print` -> `print` (one process)", fix=True):
            return updated_node.with_changes(func=cst.Name("print"))
        found = next((_WORLD[n] for n in q if n in _WORLD), None)
        if found is not None:
            return self._replace(original_node, DISTRIBUTED, "`torch.distributed`'s", found) or updated_node
        if q & {"torch.compile", "torch.distributed.init_process_group"}:
            return self._backend(original_node, updated_node, q)
        self._left_over(original_node, q)
        return updated_node

    def _loader(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``for x, y in MpDeviceLoader(loader, device)`` (or ``enumerate(...)``
        of it): iterate ``loader`` and move the batch at the top of the body
        (``leave_For``); anywhere else the loader is reported."""
        loop = self._loop_over(original)
        device = updated.args[1].value if len(updated.args) > 1 and updated.args[1].keyword is None else None
        if loop is None or device is None:
            self.flag(original, LOADER.code, "`MpDeviceLoader` moved batches to the device: iterate the loader and "
                      "move each batch with `.to(device)` in the loop", fix=False)
            return updated
        if not self.flag(original, LOADER.code, "`MpDeviceLoader(loader, device)` -> `loader`, the batch moved "
                         "with `.to(device)`", fix=True):
            return updated
        self._moves[id(loop)] = device
        return updated.args[0].value

    def _loop_over(self, call: cst.Call) -> Optional[cst.For]:
        """The loop whose batches ``call`` gives, when its target is names
        (``x, y``), directly or as ``enumerate``'s second item."""
        parent = self.parent(call)
        target_of = None
        if isinstance(parent, cst.For) and parent.iter is call:
            loop, target_of = parent, parent.target
        else:
            outer = self.parent(parent) if isinstance(parent, cst.Arg) else None
            loop = self.parent(outer) if isinstance(outer, cst.Call) and call_name(outer) == "enumerate" else None
            if not (isinstance(loop, cst.For) and loop.iter is outer and isinstance(loop.target, cst.Tuple)
                    and len(loop.target.elements) == 2):
                return None
            target_of = loop.target.elements[1].value
        names = [e.value for e in target_of.elements] if isinstance(target_of, (cst.Tuple, cst.List)) else [target_of]
        return loop if all(isinstance(n, cst.Name) for n in names) else None  # type: ignore[return-value]

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        device = self._moves.get(id(original_node))
        if device is None:
            return updated_node
        target = original_node.target
        if isinstance(original_node.iter, cst.Call) and call_name(original_node.iter) == "enumerate":
            target = target.elements[1].value  # type: ignore[attr-defined]
        names = [e.value.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) \
            else [target.value]  # type: ignore[attr-defined]
        to = source_of(device)
        move = cst.parse_statement(f"{', '.join(names)} = {', '.join(f'{n}.to({to})' for n in names)}\n")
        body = updated_node.body
        return updated_node.with_changes(body=body.with_changes(body=[move, *body.body]))  # type: ignore[attr-defined]

    def _replace(self, original: cst.Call, rule: Rule, what: str, code: str) -> Optional[cst.BaseExpression]:
        if not self.flag(original, rule.code, f"`{call_name(original)}()` -> {what}", fix=True):
            return None
        imports.need(self.context, "torch")
        return cst.parse_expression(code)

    def _optimizer_step(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if self._launches:
            self.flag(original, OPTIMIZER.code, "`xm.optimizer_step` reduces gradients across the processes this "
                      "module launches: wrap the model in `DistributedDataParallel` and call `opt.step()`", fix=False)
            return updated
        if not updated.args or not self.flag(original, OPTIMIZER.code, "`xm.optimizer_step(opt)` -> `opt.step()`",
                                             fix=True):
            return updated
        kwargs = next((a.value for a in updated.args if a.keyword is not None
                       and a.keyword.value == "optimizer_args"), None)
        args = [cst.Arg(kwargs, star="**")] if kwargs is not None else []
        return cst.Call(func=cst.Attribute(updated.args[0].value, cst.Name("step")), args=args)

    def _closure(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not updated.args or not self.flag(original, SAVE.code, "step closure -> called at once", fix=True):
            return updated
        fn = updated.args[0].value
        passed = next((a.value for a in updated.args if a.keyword is not None and a.keyword.value == "args"),
                      updated.args[1].value if len(updated.args) > 1 and updated.args[1].keyword is None else None)
        if isinstance(passed, (cst.Tuple, cst.List)) and not any(isinstance(e, cst.StarredElement)
                                                                 for e in passed.elements):
            args = [cst.Arg(e.value) for e in passed.elements]  # `args=(step, loss)`: fn(step, loss)
        else:
            args = [cst.Arg(passed, star="*")] if passed is not None else []
        if isinstance(fn, cst.Lambda) and not args and all(
                p.default is not None and isinstance(p.default, cst.Name) and p.default.value == p.name.value
                for p in fn.params.params) and not isinstance(fn.params.star_arg, cst.Param) \
                and not fn.params.kwonly_params and fn.params.star_kwarg is None:
            return fn.body  # `lambda loss=loss: ...`: its body, run now
        if isinstance(fn, cst.Lambda):
            fn = fn.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return cst.Call(func=fn, args=comma_separated(args))

    def _backend(self, original: cst.Call, updated: cst.Call, q: set) -> cst.BaseExpression:
        new = {"openxla": "tpu", "xla": "tpu_dist"}
        args = list(updated.args)
        changed = False
        for k, a in enumerate(original.args):
            keyword = a.keyword.value if a.keyword is not None else None
            value = string_value(a.value)
            if keyword == "init_method" and value == "xla://":
                args[k] = None  # type: ignore[call-overload]
                changed = True
            elif (keyword == "backend" or (keyword is None and k == 0 and "torch.distributed.init_process_group" in q)) \
                    and value in new and (value == "openxla") == ("torch.compile" in q):
                args[k] = args[k].with_changes(value=cst.SimpleString(f'"{new[value]}"'))
                changed = True
        if not changed or not self.flag(original, DISTRIBUTED.code, "torch_xla's backend -> TorchTPU's", fix=True):
            return updated
        return updated.with_changes(args=comma_separated([a for a in args if a is not None]))

    def _left_over(self, original: cst.Call, q: set) -> None:
        name = sorted(n for n in q if n.startswith("torch_xla"))[0]
        if name in _LAUNCHES:
            why = "launch with `torchrun` (after `torch.tpu.distributed.set_tpu_launch_env(...)`)"
        else:
            why = "no TorchTPU counterpart"
        self.flag(original, LEFT_OVER.code, f"`{name}`: {why}", fix=False)


def _xla_imports(module: cst.Module):
    """(module, obj, asname) of each top-level torch_xla import, as
    ``RemoveImportsVisitor`` takes them."""
    for line in module.body:
        for small in getattr(line, "body", ()) if isinstance(line, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Import):
                for alias in small.names:
                    full = source_of(alias.name)
                    if full.split(".")[0] == "torch_xla":
                        yield full, None, alias.asname.name.value if alias.asname else None  # type: ignore
            elif isinstance(small, cst.ImportFrom) and small.module is not None \
                    and source_of(small.module).split(".")[0] == "torch_xla" and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    yield (source_of(small.module), source_of(alias.name),
                           alias.asname.name.value if alias.asname else None)  # type: ignore


__all__ = ["FromTorchXla"]
