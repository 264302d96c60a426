"""Where two runs part: the first module output or gradient that differs.

When outputs differ, both sides run once more with a forward hook on every
``nn.Module`` (:func:`install`, in the harness): each call's qualified name
(``model.blocks.3.attn``, from the outermost module called), the number of
the outermost module's forward pass it belongs to (the step) and its output
tensors are recorded, up to a budget.  Each parameter of an outermost module
also records its gradient after every backward pass (numbered apart: a
backward pass is the gradients made between two outermost forward calls),
in the order they were made: a program whose forward passes agree
but whose backward does not (an op's gradient that the device computes
otherwise) parts there, a step before its next forward pass shows it.
:func:`first_divergence` walks the two records in step and finds the first
call or gradient that disagrees beyond the tolerance.  The trace reads every
output back to the host: a diagnostic run of its own, never the run that is
judged.
"""

from __future__ import annotations

import atexit
import os
from typing import Dict, List, Optional, Tuple

BUDGET = 3000  # module calls and gradients recorded per side
GRAD_ELEMENTS = 20_000_000  # gradient elements kept per side (80 MB as float32)


def install(path: str) -> None:
    """Hooks on every module call, except those a data loader makes (a
    dataset's transforms, ``Resize`` and the like, run in a loader's thread
    on one side and inline on the other)."""
    import sys
    import threading

    import torch

    records: List[Dict[str, object]] = []
    names: Dict[int, str] = {}
    depth = [0]
    passes = [0]

    def name_of(module) -> str:  # type: ignore[no-untyped-def]
        return names.get(id(module), type(module).__name__)

    main = threading.main_thread()

    def loading() -> bool:
        if threading.current_thread() is not main:
            return True
        frame = sys._getframe(2)
        while frame is not None:
            if f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}" in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False

    skipped = set()
    grads = _Gradients(records)

    def pre(module, args):  # type: ignore[no-untyped-def]
        if loading():
            skipped.add(id(module))
            return
        if depth[0] == 0:
            grads.flush()
            passes[0] += 1
            for sub_name, sub in module.named_modules():
                names.setdefault(id(sub), f"{type(module).__name__}.{sub_name}" if sub_name else type(module).__name__)
            grads.watch(module)
        depth[0] += 1

    def post(module, args, output):  # type: ignore[no-untyped-def]
        if id(module) in skipped:
            skipped.discard(id(module))
            return
        depth[0] -= 1
        if len(records) >= BUDGET:
            return
        tensors = [t for t in _flatten(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        records.append({"name": name_of(module), "pass": passes[0],
                        "outputs": [t.detach().to("cpu", torch.float64) for t in tensors[:4]]})

    def save() -> None:
        grads.flush()
        torch.save(records, path)

    torch.nn.modules.module.register_module_forward_pre_hook(pre)
    torch.nn.modules.module.register_module_forward_hook(post)
    atexit.register(save)


class _Gradients:
    """Each watched parameter's gradient after each backward pass, kept on
    its device until the next forward pass (or the exit) and then read back
    in one transfer: a read per parameter in the middle of a backward pass
    would cut a lazy device's graph into one per parameter."""

    def __init__(self, records: List[Dict[str, object]]) -> None:
        self.records = records
        self.backward = 0  # backward passes seen
        self.fresh = True  # no gradient since the last outermost forward call
        self.watched: set = set()
        self.pending: List[Tuple[str, int, object]] = []  # (name, pass, gradient copy)
        self.kept = 0  # elements

    def watch(self, module) -> None:  # type: ignore[no-untyped-def]
        owner = type(module).__name__
        for name, param in module.named_parameters():
            if id(param) in self.watched or not param.requires_grad:
                continue
            self.watched.add(id(param))
            param.register_post_accumulate_grad_hook(self._hook(f"{owner}.{name}"))

    def _hook(self, name: str):  # type: ignore[no-untyped-def]
        import torch

        def accumulated(param) -> None:  # type: ignore[no-untyped-def]
            grad = param.grad
            if self.fresh:
                self.fresh = False
                self.backward += 1
            if (grad is None or grad.layout != torch.strided or not grad.is_floating_point()
                    or len(self.records) + len(self.pending) >= BUDGET or self.kept + grad.numel() > GRAD_ELEMENTS):
                return
            self.kept += grad.numel()
            self.pending.append((name, self.backward, grad.detach().clone()))
        return accumulated

    def flush(self) -> None:
        self.fresh = True
        if not self.pending:
            return
        import torch

        pending, self.pending = self.pending, []
        by_device: Dict[str, List[Tuple[str, int, object]]] = {}
        for item in pending:
            by_device.setdefault(str(item[2].device), []).append(item)  # type: ignore[attr-defined]
        host = {}
        for items in by_device.values():
            flat = torch.cat([g.reshape(-1).float() for _, _, g in items]).to("cpu")  # type: ignore[attr-defined]
            for (name, step, g), part in zip(items, flat.split([g.numel() for _, _, g in items])):  # type: ignore[attr-defined]
                host[id(g)] = part.reshape(g.shape).double()  # type: ignore[attr-defined]
        for name, step, g in pending:
            self.records.append({"name": name, "pass": step, "kind": "gradient", "outputs": [host[id(g)]]})


def _flatten(value):  # type: ignore[no-untyped-def]
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flatten(v)
    elif hasattr(value, "to_tuple"):  # transformers/diffusers output classes
        yield from _flatten(value.to_tuple())
    else:
        yield value


def first_divergence(ref_path: str, cand_path: str, rtol: float, atol: float) -> Optional[Dict[str, object]]:
    """The first module call (in order) whose outputs differ beyond the
    tolerance, as ``{"module", "pass", "call", "max_abs_err"}``; None when
    every recorded call agrees (or nothing was recorded)."""
    import torch

    from xlaport.verify.outputs import close

    try:
        ref = torch.load(ref_path, weights_only=False)
        cand = torch.load(cand_path, weights_only=False)
    except Exception:  # noqa: BLE001 -- no trace: nothing to say
        return None
    for k, (a, b) in enumerate(_aligned(ref, cand)):
        if a.get("kind") == "gradient" and a["name"] == b["name"]:
            x, y = a["outputs"][0], b["outputs"][0]
            if x.shape == y.shape and not close(x, y, rtol, atol):
                err = float((x - y).abs().max()) if x.numel() else 0.0
                return {"module": a["name"], "pass": a["pass"], "call": k + 1, "max_abs_err": err, "phase": "backward",
                        "detail": f"its gradient is the first beyond tolerance (max abs err {err:.3g})"}
            continue
        if a["name"] != b["name"]:
            return {"module": f"{a['name']} / {b['name']}", "pass": a["pass"], "call": k + 1,
                    "max_abs_err": None, "detail": "the two runs call different modules here"}
        for x, y in zip(a["outputs"], b["outputs"]):
            if x.shape != y.shape:
                return {"module": a["name"], "pass": a["pass"], "call": k + 1, "max_abs_err": None,
                        "detail": f"shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}"}
            if not close(x, y, rtol, atol):
                err = float((x - y).abs().max()) if x.numel() else 0.0
                return {"module": a["name"], "pass": a["pass"], "call": k + 1, "max_abs_err": err,
                        "detail": f"first output beyond tolerance (max abs err {err:.3g})"}
    return None


def _aligned(ref: List[Dict[str, object]], cand: List[Dict[str, object]]):  # type: ignore[no-untyped-def]
    """The two records side by side; the gradients of one backward pass are
    paired by parameter name (a device's autograd may accumulate them in
    another order), in the reference's order."""
    i = j = 0
    while i < len(ref) and j < len(cand):
        if ref[i].get("kind") == "gradient" and cand[j].get("kind") == "gradient":
            i2, j2 = i, j
            while i2 < len(ref) and ref[i2].get("kind") == "gradient":
                i2 += 1
            while j2 < len(cand) and cand[j2].get("kind") == "gradient":
                j2 += 1
            theirs = {(r["name"], r["pass"]): r for r in cand[j:j2]}
            for r in ref[i:i2]:
                if (r["name"], r["pass"]) in theirs:
                    yield r, theirs[(r["name"], r["pass"])]
            i, j = i2, j2
            continue
        if ref[i].get("kind") == "gradient":  # a backward pass one side did not record (its budget)
            i += 1
            continue
        if cand[j].get("kind") == "gradient":
            j += 1
            continue
        yield ref[i], cand[j]
        i, j = i + 1, j + 1


def where(found: Optional[Dict[str, object]]) -> Tuple[str, ...]:
    if not found:
        return ()
    if found.get("phase") == "backward":
        return (f"the runs diverge first at the gradient of `{found['module']}` in backward pass {found['pass']} "
                f"(record {found['call']}; every module output before it agreed): {found['detail']}",)
    return (f"the runs diverge first at `{found['module']}` in forward pass {found['pass']} "
            f"(module call {found['call']}): {found['detail']}",)
