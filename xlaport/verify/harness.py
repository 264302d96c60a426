"""Runs one script in this (child) process and records what it did.

Usage: python -m xlaport.verify.harness MODE RESULT_JSON SCRIPT [ARGS...]

MODE is ``cpu`` or ``cuda`` (a reference run: output only) or ``xla`` (the
candidate).  For ``xla`` the harness also records, from torch_xla's own
metrics:

* one snapshot per step, a step being one barrier (every sync goes through
  ``torch_xla._XLAC._xla_step_marker``, which is wrapped): cumulative
  compiles, executions, host transfers, scalar reads and CPU fallbacks, with
  the source line of the barrier;
* host reads: the tensor methods that copy to the host (``item``, ``tolist``,
  ``__bool__`` ...) and the torch functions that read a tensor given as a
  number (``torch.full(shape, t)``) are wrapped, and when one makes a
  device-to-host transfer the innermost frame of user code is recorded;
* CPU fallbacks: a ``TorchFunctionMode`` notes which user line called the op
  whenever an ``aten::*`` fallback counter moves;
* with ``XLA_SAVE_TENSORS_FILE`` set by the caller, torch_xla itself dumps the
  IR of every graph (with ``XLA_IR_DEBUG=1`` each node carries file:line),
  which the parent diffs to locate recompilations.

"User code" is any frame outside the Python installation and outside this
package: the script, and a converted package it imports.
"""

from __future__ import annotations

import collections
import io
import json
import os
import runpy
import sys
import sysconfig
import time
import traceback
from typing import Dict, List, Optional, Tuple

# torch functions whose number arguments (a fill value, a range's ends) are
# read on the host when a tensor is given
SCALAR_TAKERS = ("full", "full_like", "arange", "linspace")


class _Tee(io.TextIOBase):
    def __init__(self, stream):
        self.stream = stream
        self.parts = []

    def write(self, s):
        self.parts.append(s)
        return self.stream.write(s)

    def flush(self):
        self.stream.flush()


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

    def __init__(self, progress: Optional[str] = None) -> None:
        import torch
        import torch_xla
        import torch_xla.debug.metrics as met

        # where the counts so far are kept while the program runs: a run
        # killed at verify's --timeout leaves no result, but this says why
        self.progress = progress
        self._saved = 0.0

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
            recorder.save_progress(snap)
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

        if os.environ.get("XLAPORT_TRACE_FALLBACKS") != "1":
            # The mode's own frame would stand in for the user's in the IR
            # locations (XLA_IR_DEBUG): fallbacks are traced in a second run.
            return

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

    def save_progress(self, snap: Dict[str, object]) -> None:
        """The counts at this step and the modules of the side's own tree
        imported so far, in ``progress`` (at most once a second; written
        whole, through a rename)."""
        from xlaport.verify.sandbox import imported

        if not self.progress or (self._saved and snap["time"] - self._saved < 1.0):  # type: ignore[operator]
            return
        self._saved = float(snap["time"])  # type: ignore[arg-type]
        data = {"steps": len(self.steps), **{k: snap[k] for k in ("compiles", "compile_seconds", "executions", "time")},
                "own": imported({"own": os.environ.get("XLAPORT_SIDE_TREE", "")})["own"]}
        try:
            tmp = f"{self.progress}.tmp"
            with open(tmp, "w") as fh:
                json.dump(data, fh)
            os.replace(tmp, self.progress)
        except OSError:
            pass  # counting must never fail the run

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


LEFTOVERS = "xlaport-leftovers.pt"


def _save_leftovers(namespace: Dict[str, object], path: str) -> Dict[str, str]:
    """The tensors and modules the script leaves in its globals, on the CPU,
    so that they are compared like the files it saves.  Returns the device
    type each module was on (a conversion whose model stayed on the CPU)."""
    torch = sys.modules.get("torch")
    devices: Dict[str, str] = {}
    if torch is None:
        return devices
    for name, value in namespace.items():
        if not name.startswith("_") and isinstance(value, torch.nn.Module):
            first = next(iter(value.parameters()), None)
            if first is not None:
                devices[name] = first.device.type
    found: Dict[str, object] = {}
    for name, value in namespace.items():
        if name.startswith("_"):
            continue
        try:
            if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
                found[name] = value.detach().cpu()
            elif isinstance(value, torch.nn.Module):
                found[name] = {k: v.detach().cpu() for k, v in value.state_dict().items()
                               if isinstance(v, torch.Tensor) and v.dtype.is_floating_point}
        except Exception:  # a value that cannot be read back is simply not compared
            continue
    if found:
        torch.save(found, path)
    return devices


def _launch_here() -> None:
    """With one XLA device, ``torch_xla.launch``/``xmp.spawn`` would start one
    worker process, out of this harness's sight.  One replica in this process
    is the same computation (torch_xla's own ``debug_single_process``), so run
    it here, where its output and metrics are recorded."""
    if os.environ.get("CPU_NUM_DEVICES", "1") != "1" or os.environ.get("PJRT_DEVICE", "CPU") != "CPU":
        return
    import torch_xla
    import torch_xla.distributed.xla_multiprocessing as xmp

    launch, spawn = torch_xla.launch, xmp.spawn

    def launch_here(fn, args=(), start_method="spawn", debug_single_process=False):
        return launch(fn, args=args, start_method=start_method, debug_single_process=True)

    def spawn_here(fn, args=(), nprocs=None, start_method="spawn"):
        return spawn(fn, args=args, nprocs=1, start_method=start_method)

    torch_xla.launch, xmp.spawn = launch_here, spawn_here


def _emulate_torchrun() -> None:
    """``--torchrun``: the environment ``torchrun --nproc_per_node=1`` gives."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        os.environ.setdefault(key, value)


def _side_setup(mode: str) -> Dict[str, object]:
    """What a side needs before the program starts: writes through links
    kept out of the user's tree, the device's random numbers drawn from the
    CPU generator (candidate), autocast recorded, modules traced on request."""
    extras: Dict[str, object] = {"autocast": [], "rng_routed": {}}
    tree = os.environ.get("XLAPORT_SIDE_TREE")
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if tree:
        from xlaport.verify import sandbox

        sandbox.protect(tree)
    if torch is None:
        return extras
    if mode == "xla" and os.environ.get("XLAPORT_DEVICE_RNG") != "1":
        from xlaport.verify import rng

        rng.install(extras["rng_routed"])  # type: ignore[arg-type]
    seen: List[str] = extras["autocast"]  # type: ignore[assignment]
    enter = torch.amp.autocast_mode.autocast.__enter__

    def recording_enter(self):  # type: ignore[no-untyped-def]
        if getattr(self, "_enabled", True):
            seen.append(str(getattr(self, "fast_dtype", "")))
        return enter(self)

    torch.amp.autocast_mode.autocast.__enter__ = recording_enter
    trace = os.environ.get("XLAPORT_TRACE_MODULES")
    if trace:
        from xlaport.verify import diverge

        diverge.install(trace)
    return extras


def progress_file(result_path: str) -> str:
    """Where an XLA run keeps its counts so far (``XlaRecorder.progress``)."""
    return f"{result_path}.progress"


def main() -> int:
    mode, result_path, script, *args = sys.argv[1:]
    recorder = None
    if os.environ.get("XLAPORT_TORCHRUN"):
        _emulate_torchrun()
    if mode == "xla":
        recorder = XlaRecorder(progress_file(result_path))  # imports torch_xla before the clock starts
        recorder.install()
        _launch_here()
    extras = _side_setup(mode)
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    result: Dict[str, object] = {"mode": mode, "ok": True, "error": None}
    start = time.perf_counter()
    namespace: Dict[str, object] = {}
    try:
        namespace = runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            result.update(ok=False, error=f"exited with status {exc.code}")
    except BaseException:
        result.update(ok=False, error=traceback.format_exc())
    result["seconds"] = time.perf_counter() - start
    sys.stdout = tee.stream
    result["stdout"] = "".join(tee.parts)
    result.update(extras)
    from xlaport.verify.sandbox import imported

    result["imported"] = imported({"own": os.environ.get("XLAPORT_SIDE_TREE", ""),
                                   "user": os.environ.get("XLAPORT_USER_ROOT", ""),
                                   "scratch": os.environ.get("XLAPORT_SCRATCH", "")})
    if recorder is not None:
        recorder.uninstall()
        try:
            result.update(recorder.result())
        except Exception as exc:  # metrics unavailable: report, do not hide
            result["metrics_error"] = repr(exc)
    if result["ok"]:  # after the metrics: reading these back is not the script's doing
        leftovers = os.environ.get("XLAPORT_LEFTOVERS") or os.path.join(os.path.dirname(result_path), LEFTOVERS)
        result["leftover_devices"] = _save_leftovers(namespace, leftovers)
    with open(result_path, "w") as fh:
        json.dump(result, fh)
    if not result["ok"]:
        sys.stderr.write(str(result["error"] or ""))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
