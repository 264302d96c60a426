"""Where two runs part: the first module whose output differs.

When outputs differ, both sides run once more with a forward hook on every
``nn.Module`` (:func:`install`, in the harness): each call's qualified name
(``model.blocks.3.attn``, from the outermost module called), the number of
the outermost module's forward pass it belongs to (the step) and its output
tensors are recorded, up to a budget.  :func:`first_divergence` walks the two
records in step and finds the first call whose outputs disagree beyond the
tolerance.  The trace reads every output back to the host: a diagnostic run
of its own, never the run that is judged.
"""

from __future__ import annotations

import atexit
import os
from typing import Dict, List, Optional, Tuple

BUDGET = 3000  # module calls recorded per side


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

    def pre(module, args):  # type: ignore[no-untyped-def]
        if loading():
            skipped.add(id(module))
            return
        if depth[0] == 0:
            passes[0] += 1
            for sub_name, sub in module.named_modules():
                names.setdefault(id(sub), f"{type(module).__name__}.{sub_name}" if sub_name else type(module).__name__)
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

    torch.nn.modules.module.register_module_forward_pre_hook(pre)
    torch.nn.modules.module.register_module_forward_hook(post)
    atexit.register(lambda: torch.save(records, path))


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
    for k, (a, b) in enumerate(zip(ref, cand)):
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


def where(found: Optional[Dict[str, object]]) -> Tuple[str, ...]:
    if not found:
        return ()
    return (f"the runs diverge first at `{found['module']}` in forward pass {found['pass']} "
            f"(module call {found['call']}): {found['detail']}",)
