"""Write codemods/xla_ops_data.py: the torch ops torch_xla has no lowering for.

Read from torch_xla itself (the dispatcher's kernel table after ``import
torch_xla``), never by hand: an op name (``aten::unfold``, all its overloads)
falls back to the CPU on XLA when it has a CPU kernel and none of its overloads
has an XLA kernel or a composite one (composite ops decompose into others,
which XLA lowers).  The rule XLA159 (codemods/xla_limits.py) reports calls of
these names.

Some XLA kernels choose at run time: torch_xla 2.9's ``aten_xla_type.cpp``
sends ``upsample_bilinear2d_backward`` and ``upsample_nearest2d_backward`` to
the CPU unless the device is a TPU (``if (!CheckTpuDevice(hw_type))``).  The
dispatcher table cannot show that, so each such op is run here, on XLA's CPU
backend, and kept in ``TPU_ONLY_LOWERING`` only where its fallback counter
moves: verify, which runs on that backend, does not count them against a port
for a TPU.

Some torch utilities make modules whose ops are private (``weight_norm``
runs ``aten::_weight_norm_interface``, which the public names above leave
out), and some functions are ops of other names (``F.grid_sample`` is
``aten::grid_sampler_2d``): each is run the same way and kept in
``FALLBACK_CALLS`` with the ops whose fallback counters move.

Usage: PJRT_DEVICE=CPU python benchmarks/gen_xla_ops.py [--check]
(``--check``: exit 1 when the file differs from what this torch_xla gives.)
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "codemods" / "xla_ops_data.py"
_LOWERED = ("XLA", "AutogradXLA", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
            "CompositeExplicitAutogradNonFunctional")


# the gradient of F.interpolate(mode=...) is each op; sizes are arbitrary
_DEVICE_CHECKED = {"upsample_bilinear2d_backward": "bilinear", "upsample_nearest2d_backward": "nearest"}


def tpu_only() -> list:
    """The ops of ``_DEVICE_CHECKED`` that fall back on this (CPU) backend."""
    import torch
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.debug.metrics as met

    found = []
    for name, mode in _DEVICE_CHECKED.items():
        x = torch.randn(1, 2, 4, 4, device=torch_xla.device(), requires_grad=True)
        before = met.counter_value(f"aten::{name}") or 0
        F.interpolate(x, scale_factor=2, mode=mode).sum().backward()
        torch_xla.sync()
        if (met.counter_value(f"aten::{name}") or 0) > before:
            found.append(name)
    return sorted(found)


# torch utilities whose ops are private (``_weight_norm_interface``: not in the
# public names above), each wrapping a small module; kept where, run forward and
# backward on this backend, a fallback counter moves
_UTILITIES = ("torch.nn.utils.weight_norm", "torch.nn.utils.parametrizations.weight_norm",
              "torch.nn.utils.spectral_norm", "torch.nn.utils.parametrizations.spectral_norm")


# torch functions whose aten ops are not their own names (``F.grid_sample`` is ``grid_sampler_2d`` for an
# image batch), each run forward and backward on this backend with the inputs given
_FUNCTIONS = {"torch.nn.functional.grid_sample": lambda torch, d: (
    torch.randn(1, 2, 4, 4, device=d, requires_grad=True), torch.rand(1, 4, 4, 2, device=d) * 2 - 1)}


def fallback_calls() -> dict:
    """utility or function -> the ops that fall back to the CPU when a module
    it wraps runs on XLA, or when it runs there."""
    import importlib
    import warnings

    import torch
    import torch_xla
    import torch_xla.debug.metrics as met

    found = {}
    for name in _UTILITIES:
        module, _, attr = name.rpartition(".")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (weight_norm's deprecation)
            wrapped = getattr(importlib.import_module(module), attr)(torch.nn.Conv1d(4, 4, 3)).to(torch_xla.device())
        torch_xla.sync()
        met.clear_counters()
        wrapped(torch.randn(2, 4, 6, device=torch_xla.device())).sum().backward()
        torch_xla.sync()
        ops = sorted(c[len("aten::"):] for c in met.counter_names() if c.startswith("aten::") and met.counter_value(c))
        if ops:
            found[name] = tuple(ops)
    for name, inputs in _FUNCTIONS.items():
        module, _, attr = name.rpartition(".")
        args = inputs(torch, torch_xla.device())
        torch_xla.sync()
        met.clear_counters()
        getattr(importlib.import_module(module), attr)(*args, align_corners=False).sum().backward()
        torch_xla.sync()
        ops = sorted(c[len("aten::"):] for c in met.counter_names() if c.startswith("aten::") and met.counter_value(c))
        if ops:
            found[name] = tuple(ops)
    return found


def _out_overload(op: str) -> bool:
    """``aten::grid_sampler_2d.out``: the ``out=`` overload torchgen gives
    every op, whose composite kernel only calls the functional one; it lowers
    nothing (counted, it hid ``grid_sampler_2d``, ``bincount``, ``poisson``...)."""
    overload = op.partition(".")[2]
    return overload == "out" or overload.startswith("out_") or overload.endswith("_out")


def table() -> str:
    import torch
    import torch_xla

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    groups = defaultdict(list)
    for op in torch._C._dispatch_get_all_op_names():
        if op.startswith("aten::"):
            groups[op[len("aten::"):].split(".")[0].rstrip("_")].append(op)
    public = {name: ops for name, ops in groups.items()
              if not name.startswith("_") and not name.endswith(("_backward", "_jvp", "_forward"))}
    fallback = sorted(name for name, ops in public.items() if any(has(o, "CPU") for o in ops)
                      and not any(has(o, key) for o in ops if not _out_overload(o) for key in _LOWERED))
    lines = "\n".join(f"    {name!r}," for name in fallback)
    tpu = "\n".join(f"    {name!r}," for name in tpu_only())
    calls = "\n".join(f"    {name!r}: {ops!r}," for name, ops in fallback_calls().items())
    return (f'"""Generated by ``benchmarks/gen_xla_ops.py`` from torch_xla {torch_xla.__version__} (torch '
            f'{torch.__version__.split("+")[0]}); do not edit by hand.\n\n'
            f"Op names (of {len(public)} public aten op names) that torch_xla has no lowering for: on XLA\n"
            'they run on the CPU, the tensors copied to the host and back at every call."""\n\n'
            f'TORCH_XLA = "{torch_xla.__version__}"\nOPS_READ = {len(public)}\n'
            f"CPU_FALLBACK = frozenset({{\n{lines}\n}})\n\n"
            "# lowered on a TPU only: on XLA's CPU backend (where verify runs) these fall back\n"
            f"TPU_ONLY_LOWERING = frozenset({{\n{tpu}\n}})\n\n"
            "# torch utilities whose modules, run on XLA, call ops that fall back (private ops)\n"
            f"FALLBACK_CALLS = {{\n{calls}\n}}\n")


def main() -> int:
    text = table()
    if "--check" in sys.argv:
        same = OUT.exists() and OUT.read_text() == text
        print("xla_ops_data.py is up to date" if same else "xla_ops_data.py differs from this torch_xla")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
