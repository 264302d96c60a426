"""The instruments of verify's diagnostic runs (never the run that is judged).

:class:`XlaRecorder` (``XLAPORT_DIAGNOSE=fallbacks``, installed by the
observer) wraps torch_xla's step marker and the tensor methods that read on
the host, and notes with a ``TorchFunctionMode`` which user line called an op
whenever an ``aten::*`` CPU-fallback counter moves: one snapshot per step,
with the source line of the barrier.  The judged run has none of this: its
steps and graph cuts come from torch_xla's own graph dump
(:mod:`xlaport.verify.syncs`).

"User code" is any frame outside the Python installation and outside this
package: the script, and a converted package it imports.
"""

from __future__ import annotations

import collections
import os
import sys
import sysconfig
import time
from typing import Dict, List, Optional, Tuple

# torch functions whose number arguments (a fill value, a range's ends) are
# read on the host when a tensor is given
SCALAR_TAKERS = ("full", "full_like", "arange", "linspace")


def system_roots(search_path: List[str]) -> Tuple[str, ...]:
    """Where code that is not the user's lives: the standard library, this
    interpreter's site-packages, every other ``site-packages``/``dist-packages``
    on the search path (a venv made with ``--system-site-packages``, a ``.pth``
    pointing at another environment) and xlaport's own harness."""
    paths = sysconfig.get_paths()
    found = [paths["stdlib"], paths["purelib"], paths["platlib"], os.path.dirname(__file__)]
    found += [p for p in search_path if os.path.basename(os.path.normpath(p)) in ("site-packages", "dist-packages")]
    return tuple({os.path.realpath(p) for p in found})


_SYSTEM = system_roots(sys.path)


def _is_user_file(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    return not path.startswith(_SYSTEM)


def user_frame() -> Optional[Tuple[str, int]]:
    """(file, line) of the innermost frame of user code on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if _is_user_file(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


class XlaRecorder:
    """Snapshots torch_xla's metrics per step and ties reads/fallbacks to lines."""

    def __init__(self) -> None:
        import torch
        import torch_xla
        import torch_xla.debug.metrics as met

        self.torch, self.torch_xla, self.met = torch, torch_xla, met
        self.steps: List[Dict[str, object]] = []
        self.host_reads: Dict[Tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
        self.fallbacks: Dict[Tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
        self._busy = False
        self._mode = None
        self._last_fallbacks: Dict[str, int] = {}
        self.t0 = time.perf_counter()

    # ------------------------------------------------------------- counters
    def _samples(self, name: str) -> int:
        data = self.met.metric_data(name)
        return int(data[0]) if data else 0

    def _fallback_counts(self) -> Dict[str, int]:
        met = self.met
        return {n: met.counter_value(n) or 0 for n in met.counter_names()
                if n.startswith("aten::") and n != "aten::_local_scalar_dense"}

    def snapshot(self) -> Dict[str, object]:
        met = self.met
        compile_data = met.metric_data("CompileTime")
        return {
            "compiles": self._samples("CompileTime"),
            "compile_seconds": (compile_data[1] / 1e9) if compile_data else 0.0,
            "executions": self._samples("ExecuteTime"),
            "transfers": self._samples("TransferFromDeviceTime"),
            "uncached_compiles": met.counter_value("UncachedCompile") or 0,
            "cached_compiles": met.counter_value("CachedCompile") or 0,
            "scalar_reads": met.counter_value("aten::_local_scalar_dense") or 0,
            "fallbacks": self._fallback_counts(),
            "time": time.perf_counter() - self.t0,
        }

    # ------------------------------------------------------------- patches
    def install(self) -> None:
        xlac = self.torch_xla._XLAC
        marker = xlac._xla_step_marker
        recorder = self

        def step_marker(device, devices, wait=False, reset_scope=True):
            where = user_frame()
            # wait=True: the step's execution is finished (and counted) when
            # the snapshot is taken
            result = marker(device, devices, wait=True, reset_scope=reset_scope)
            snap = recorder.snapshot()
            snap["path"], snap["line"] = where if where else (None, None)
            recorder.steps.append(snap)
            return result

        xlac._xla_step_marker = step_marker

        tensor = self.torch.Tensor
        for name in ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__",
                     "__format__", "__repr__", "cpu"):
            original = getattr(tensor, name, None)
            if original is not None:
                setattr(tensor, name, self._reader(name, original))
        # torch functions that take a Python number read a tensor given in its
        # place on the host, inside C++ (`torch.full(shape, table[i])`): no
        # tensor method runs, so the call itself is watched
        for name in SCALAR_TAKERS:
            original = getattr(self.torch, name, None)
            if original is not None:
                setattr(self.torch, name, self._reader(name, original))

        from torch.overrides import TorchFunctionMode

        class _Fallbacks(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if not recorder._busy:
                    recorder._busy = True
                    try:
                        recorder._check_fallbacks(getattr(func, "__name__", str(func)))
                    finally:
                        recorder._busy = False
                return out

        self._mode = _Fallbacks()
        self._mode.__enter__()

    def _reader(self, name, original):
        recorder = self

        def read(*args, **kwargs):  # a tensor method (the tensor first) or a torch function (keywords only too)
            if recorder._busy:
                return original(*args, **kwargs)
            before = recorder._samples("TransferFromDeviceTime")
            recorder._busy = True
            try:
                return original(*args, **kwargs)
            finally:
                recorder._busy = False
                if recorder._samples("TransferFromDeviceTime") > before:
                    where = user_frame()
                    if where:
                        recorder.host_reads[where][name.strip("_")] += 1

        read.__name__ = name
        return read

    def _check_fallbacks(self, op: str) -> None:
        counts = self._fallback_counts()
        moved = {n: v - self._last_fallbacks.get(n, 0) for n, v in counts.items() if v != self._last_fallbacks.get(n, 0)}
        if moved:
            self._last_fallbacks = counts
            where = user_frame()
            if where:
                for n, k in moved.items():
                    self.fallbacks[where][n] += k

    def uninstall(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)

    def result(self) -> Dict[str, object]:
        try:  # let asynchronous executions finish so that they are counted
            import torch_xla.core.xla_model as xm

            xm.wait_device_ops()
        except Exception:  # noqa: BLE001 -- counting must never fail the run
            pass
        final = self.snapshot()
        return {
            "metrics": {
                "compiles": final["compiles"],
                "compile_seconds": final["compile_seconds"],
                "executions": final["executions"],
                "transfers_from_device": final["transfers"],
                "uncached_compiles": final["uncached_compiles"],
                "cached_compiles": final["cached_compiles"],
                "syncs": len(self.steps),
                "scalar_reads": final["scalar_reads"],
                "fallbacks": final["fallbacks"],
                "seconds": final["time"],
            },
            "steps": self.steps,
            "host_reads": [{"path": p, "line": l, "count": sum(c.values()), "detail": ", ".join(sorted(c))}
                           for (p, l), c in self.host_reads.items()],
            "fallback_sites": [{"path": p, "line": l, "count": sum(c.values()), "detail": ", ".join(sorted(c))}
                               for (p, l), c in self.fallbacks.items()],
        }
