"""XLA121, XLA122: mixed precision -- autocast to bf16 on XLA, no GradScaler.

The torch_xla AMP guide (2.9): wrap forward and loss in
``torch.autocast("xla", dtype=torch.bfloat16)``; with bf16 "gradient scaling
is not necessary", and torch_xla 2.9 has no GradScaler.  So every CUDA
autocast becomes the target's (a float16 choice becomes bfloat16: TPUs
compute in bf16), and a GradScaler goes with its call sites unwrapped:
``scaler.scale(loss).backward()`` -> ``loss.backward()``,
``scaler.step(opt)`` -> ``opt.step()``, ``update()``/``unscale_()`` dropped.
Where a scaler is used in a way that cannot be unwrapped (handed to another
function, tested), it is kept but disabled, which makes every one of its
methods a pass-through on any device.
"""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from codemods.analysis.cuda import AUTOCASTS, GRAD_SCALERS, cuda_facts, is_cuda_string
from codemods.syntax.edits import DropsStatements
from codemods.syntax.nodes import keyword_arg
from codemods.base import Rule, XlaCodemod, call_name, dotted, find_all

AUTOCAST = Rule(
    code="XLA121",
    name="cuda-autocast",
    summary='CUDA autocast -> `torch.autocast("xla", dtype=torch.bfloat16)`',
    why=(
        "`torch.cuda.amp.autocast()` and `torch.autocast(\"cuda\")` do nothing on a TPU host (and "
        "`torch.autocast(device_type=<a torch.device>)` raises). XLA's mixed precision is "
        "`torch.autocast(\"xla\", dtype=torch.bfloat16)`: TPUs compute in bf16, and float16 is not "
        "their native type, so a float16 choice becomes bfloat16. Other arguments (`enabled=`) are kept."
    ),
    before=(
        "import torch\n\nwith torch.cuda.amp.autocast(enabled=args.amp):\n    loss = model(x)\n"
        "with torch.autocast(\"cuda\", dtype=torch.float16):\n    loss = model(x)\n"
    ),
    after=(
        "import torch\n\nwith torch.autocast(\"xla\", dtype=torch.bfloat16, enabled=args.amp):\n    loss = model(x)\n"
        "with torch.autocast(\"xla\", dtype=torch.bfloat16):\n    loss = model(x)\n"
    ),
    valid=("import torch\n\nwith torch.autocast(\"xla\", dtype=torch.bfloat16):\n    loss = model(x)\n",),
)

GRAD_SCALER = Rule(
    code="XLA122",
    name="grad-scaler",
    summary="GradScaler is not needed with bf16: removed, its call sites unwrapped",
    why=(
        "Loss scaling protects float16 gradients from underflow. bf16 has float32's range, the "
        "torch_xla AMP guide says gradient scaling is not necessary, and torch_xla 2.9 has no "
        "GradScaler. `scaler.scale(loss).backward()` becomes `loss.backward()`, `scaler.step(opt)` "
        "becomes `opt.step()`, `update()`/`unscale_()`/`load_state_dict()` go, `state_dict()` is `{}`. "
        "A scaler used any other way (passed to a function, tested) is kept, disabled."
    ),
    before=(
        "import torch\n\nscaler = torch.cuda.amp.GradScaler()\nfor x in batches:\n"
        "    scaler.scale(model(x)).backward()\n    scaler.unscale_(opt)\n    scaler.step(opt)\n    scaler.update()\n"
    ),
    after=(
        "import torch\n\nfor x in batches:\n    model(x).backward()\n    opt.step()\n"
    ),
)

_FLOAT16 = {"torch.float16", "torch.half"}
_DROPPED = {"update", "unscale_", "load_state_dict"}
_VALUES = {"state_dict": "{}", "get_scale": "1.0", "is_enabled": "False"}


class MixedPrecision(DropsStatements, XlaCodemod):
    DESCRIPTION = "Convert CUDA autocast to the target's bf16 autocast; remove GradScaler."
    RESPECTS_HAND_PORTS = True
    RULES = (AUTOCAST, GRAD_SCALER)
    TRIGGERS = (b"autocast", b"GradScaler", b"scaler")
    # a CUDA autocast (torch.cuda.amp's, or one given a "cuda" string), a
    # GradScaler, or a name CudaFacts.is_scaler takes for one
    NEEDS = ("name:autocast&code~cuda", "name:GradScaler", "name:scaler", "name:grad_scaler", "name:loss_scaler",
             "name:amp_scaler")

    def regions(self, tree):
        return tree.statements_where(lambda n: n.value in ("autocast", "GradScaler") or "scaler" in n.value,
                                     (cst.Name,))

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._removable: Set[str] = set()

    def visit_Module(self, node: cst.Module) -> None:
        facts = cuda_facts(self.tree, self.qualnames)
        self._facts = facts
        # a scaler whose every use can be unwrapped is removed with its construction
        for name in facts.scalers:
            uses = [n for n in find_all(node, (cst.Name, cst.Attribute)) if dotted(n) == name]
            if all(self._unwrappable_use(n) or self._is_binding(n) for n in uses):
                self._removable.add(name)

    def _is_binding(self, node: cst.CSTNode) -> bool:
        parent = self.parent(node)
        return isinstance(parent, (cst.AssignTarget, cst.AnnAssign))

    def _unwrappable_use(self, node: cst.CSTNode) -> bool:
        parent = self.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            call = self.parent(parent)
            return isinstance(call, cst.Call) and call.func is parent and parent.attr.value in (
                {"scale", "step"} | _DROPPED | set(_VALUES))
        return False

    # ------------------------------------------------------------ autocast
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        q = self.qualnames(original_node.func)
        if q & AUTOCASTS:
            return self._autocast(original_node, updated_node, q)
        if q & GRAD_SCALERS:
            return self._construction(original_node, updated_node)
        func = original_node.func
        if isinstance(func, cst.Attribute) and self._facts.is_scaler(func.value):
            return self._scaler_call(original_node, updated_node)
        return updated_node

    def _autocast(self, original: cst.Call, updated: cst.Call, q: Set[str]) -> cst.BaseExpression:
        cuda_module = any(n.startswith("torch.cuda.") for n in q)
        args = list(updated.args)
        device_index: Optional[int] = None
        for i, a in enumerate(original.args):
            if (a.keyword is None and i == 0) or (a.keyword is not None and a.keyword.value == "device_type"):
                device_index = i
        if not cuda_module:
            if device_index is None or not is_cuda_string(original.args[device_index].value):
                return updated  # another device, or one chosen elsewhere (a device string: XLA109)
            args.pop(device_index)
        dtype_index = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "dtype"), None)
        if dtype_index is not None:
            if self.qualnames(args[dtype_index].value) & _FLOAT16:
                args[dtype_index] = args[dtype_index].with_changes(value=cst.parse_expression(self.target.autocast_dtype))
        else:
            args.insert(0, keyword_arg("dtype", cst.parse_expression(self.target.autocast_dtype)))
        new_args = [cst.Arg(cst.parse_expression(self.target.autocast_device))] + [
            a for a in args if not (a.keyword is None)]
        new_args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    for a in new_args[:-1]] + [new_args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
        if not self.flag(original, AUTOCAST.code, f'autocast -> torch.autocast({self.target.autocast_device}, '
                         f'dtype={self.target.autocast_dtype})', fix=True):
            return updated
        self.add_imports((("torch", None, None),))
        self.remove_unused_import("torch.cuda.amp", "autocast")
        return updated.with_changes(func=cst.parse_expression("torch.autocast"), args=new_args)

    # ------------------------------------------------------------ GradScaler
    def _construction(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        parent = self.parent(original)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and \
                dotted(parent.targets[0].target) in self._removable:
            if self.flag(original, GRAD_SCALER.code, "GradScaler removed (not needed with bf16)", fix=True):
                self.drop(parent)
                self._forget_imports()
            return updated
        if not self.flag(original, GRAD_SCALER.code, "GradScaler kept but disabled (it is used beyond "
                         "scale/step/update): every method passes through", fix=True):
            return updated
        self._forget_imports()
        self.add_imports((("torch", None, None),))
        return cst.parse_expression('torch.amp.GradScaler("cpu", enabled=False)')

    def _forget_imports(self) -> None:
        for module in ("torch.cuda.amp", "torch.amp", "torch.cuda.amp.grad_scaler"):
            self.remove_unused_import(module, "GradScaler")

    def _known(self, call: cst.Call) -> bool:
        """The receiver is bound to a GradScaler in this module (not only
        named like one): only then are its state methods ours to replace."""
        return (dotted(call.func.value) or "") in self._facts.scalers  # type: ignore[attr-defined]

    def _scaler_call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = call_name(original) or ""
        receiver = dotted(original.func.value) or "scaler"  # type: ignore[attr-defined]
        if name == "scale" and len(original.args) == 1:
            if self.flag(original, GRAD_SCALER.code, f"`{receiver}.scale(x)` -> `x`", fix=True):
                return updated.args[0].value
        elif name == "step" and original.args and original.args[0].keyword is None:
            if self.flag(original, GRAD_SCALER.code, f"`{receiver}.step(opt)` -> `opt.step()`", fix=True):
                return cst.Call(func=cst.Attribute(value=updated.args[0].value, attr=cst.Name("step")))
        elif name in _DROPPED and (name != "load_state_dict" or self._known(original)):
            if self.flag(original, GRAD_SCALER.code, f"`{receiver}.{name}()` removed", fix=True):
                return self.drop_call(updated, self.parent(original))
        elif name in _VALUES and self._known(original):
            if self.flag(original, GRAD_SCALER.code, f"`{receiver}.{name}()` -> `{_VALUES[name]}`", fix=True):
                return cst.parse_expression(_VALUES[name])
        return updated

