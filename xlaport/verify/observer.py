"""In every process of a ``verify`` run: watch the program, do not change it.

The program runs as its user runs it -- ``python SCRIPT ARGS`` from its
working directory -- and this module, started by the ``sitecustomize`` that
verify puts on its path, only

* gives every run the same seeds: ``random`` at start, numpy's and torch's
  global generators right after the program imports them (a program that
  seeds itself overrides them, on both sides alike);
* keeps writes through links out of the user's tree (:mod:`sandbox`);
* at exit, writes what the run left: torch_xla's counters (only where the
  program imported torch_xla itself: nothing is imported into it), the
  tensors and modules in the script's globals, the project modules it
  imported.  Steps, compiles per step and the lines that cut graphs come
  from torch_xla's own graph dump (``XLA_SAVE_TENSORS_FILE``), read by the
  parent (:mod:`xlaport.verify.syncs`).

A later reference run (``XLAPORT_CLOCK``) reads a clock that runs faster,
so that numbers made from elapsed time show as varying between the runs.
Diagnostic runs -- never the run that is judged -- add one instrument each,
named by ``XLAPORT_DIAGNOSE``: ``trace`` (per step, the host reads and CPU
fallbacks and the line of each), ``no_autocast`` (the precision noise:
autocast regions run in full precision), ``xla_batchnorm`` (BatchNorm's
running variance updated as torch_xla does) and ``rng`` (the device's random draws taken from the CPU generator, to
compare values with a reference that drew them there); and with
``XLAPORT_TRACE_MODULES``, each module's outputs (where two runs part).
"""

from __future__ import annotations

import atexit
import importlib.abc
import json
import os
import random
import sys
import time
from typing import Callable, Dict, List, Optional

SEED = 0
_PERF = time.perf_counter  # the real clock, for the run's own seconds (see _clock)
_KEPT: List[object] = []  # what a diagnostic instrument must keep alive for the run


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``hooks[name](module)`` once the program's own import of
    ``name`` has finished; the module itself is untouched."""

    def __init__(self, hooks: Dict[str, Callable]) -> None:
        self.hooks = hooks

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        hook, loader = self.hooks.pop(name), spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        real = loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            real(module)
            try:
                hook(module)
            except Exception as exc:  # noqa: BLE001 -- watching must never fail the run
                sys.stderr.write(f"xlaport verify: observer: {exc!r}\n")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class _State:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.t0 = _PERF()
        self.extras: Dict[str, object] = {}
        self.recorder = None


def start(prefix: str) -> None:
    state = _State(prefix)
    if os.environ.get("XLAPORT_TORCHRUN"):
        _emulate_torchrun()
    tree = os.environ.get("XLAPORT_SIDE_TREE")
    if tree:
        from xlaport.verify import sandbox

        sandbox.protect(tree)
    random.seed(SEED)
    if os.environ.get("XLAPORT_CLOCK"):
        _clock(float(os.environ["XLAPORT_CLOCK"]))
    hooks: Dict[str, Callable] = {"numpy": lambda np: np.random.seed(SEED),
                                  "torch": lambda torch: _on_torch(torch, state),
                                  "torch_xla": lambda _: _record_before_torch_xla_exits(state)}
    sys.meta_path.insert(0, _AfterImport(hooks))
    if "trace" in _instruments():
        from xlaport.verify.harness import XlaRecorder

        state.recorder = XlaRecorder()
        state.recorder.install()
    atexit.unregister(_record)  # (importing torch_xla just now registered it)
    atexit.register(_record, state)


def _instruments() -> List[str]:
    """The diagnostic instruments of this run (``XLAPORT_DIAGNOSE``: one, or
    several joined by commas)."""
    return [d for d in os.environ.get("XLAPORT_DIAGNOSE", "").split(",") if d]


def _clock(scale: float) -> None:
    """Time as the program reads it runs ``scale`` times as fast from now on
    (a later reference run only: what it computes from elapsed time differs
    from the first run's, and so is seen to vary, not compared)."""
    for name in ("time", "perf_counter", "monotonic"):
        for suffix, kind in (("", float), ("_ns", int)):
            real = getattr(time, name + suffix)
            setattr(time, name + suffix, _scaled(real, real(), scale, kind))


def _scaled(real: Callable, start: float, scale: float, kind: type) -> Callable:
    def now():  # type: ignore[no-untyped-def]
        return kind(start + (real() - start) * scale)

    return now


def _on_torch(torch, state: _State) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(SEED)
    tree = os.environ.get("XLAPORT_SIDE_TREE")
    if tree:
        from xlaport.verify import sandbox

        sandbox.protect_save(tree, torch)
    diagnose = _instruments()
    if "rng" in diagnose:
        from xlaport.verify import rng

        routed: Dict[str, int] = {}
        state.extras["rng_routed"] = routed
        rng.install(routed)
    if "no_autocast" in diagnose:
        _autocast_off(torch)
    if "xla_batchnorm" in diagnose:
        _KEPT.append(_batchnorm_as_torch_xla(torch))
    trace = os.environ.get("XLAPORT_TRACE_MODULES")
    if trace:
        from xlaport.verify import diverge

        diverge.install(trace)


def _autocast_off(torch) -> None:  # type: ignore[no-untyped-def]
    """Every autocast region runs in the program's own precision (a
    diagnostic run: how far the low precision moves the outputs)."""
    kind = torch.amp.autocast_mode.autocast
    init = kind.__init__

    def full_precision(self, device_type, dtype=None, enabled=True, cache_enabled=None):  # type: ignore[no-untyped-def]
        init(self, device_type, dtype=dtype, enabled=False, cache_enabled=cache_enabled)

    kind.__init__ = full_precision


def _batchnorm_as_torch_xla(torch):  # type: ignore[no-untyped-def]
    """BatchNorm in training updates its running variance with the biased
    batch variance, as torch_xla 2.9 does (PyTorch's CPU kernel uses the
    unbiased one): a diagnostic run of the reference, to tell a difference
    torch_xla makes from one the conversion makes.  The CPU kernel of
    ``aten::native_batch_norm`` is replaced, so eager and TorchScript
    modules alike take it; outputs and gradients are the kernel's own.  On
    CUDA the CUDA kernel is replaced too, with cuDNN off (its BatchNorm is
    another op) for the length of this diagnostic run."""
    import warnings

    aten = torch.ops.aten

    def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):  # type: ignore[no-untyped-def]
        if running_mean is None or running_var is None:
            return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
        if not training:
            return aten._native_batch_norm_legit(input, weight, bias, running_mean, running_var, False, momentum, eps)
        out, mean, invstd = aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            biased = invstd.double().pow(-2) - eps
            running_var.mul_(1 - momentum).add_(biased.to(running_var.dtype), alpha=momentum)
        return out, mean, invstd

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (it says a kernel is overridden: that is the point)
        lib.impl("native_batch_norm", native_batch_norm, "CPU")
        if torch.cuda.is_available():  # a reference on CUDA: cuDNN's BatchNorm is another op, so cuDNN is off
            lib.impl("native_batch_norm", native_batch_norm, "CUDA")
            torch.backends.cudnn.enabled = False
    return lib  # kept alive: the registration lasts as long as the library object


def _record_before_torch_xla_exits(state: _State) -> None:
    """torch_xla shuts its runtime down at exit: the record is taken first
    (exit handlers run last registered, first run)."""
    atexit.unregister(_record)
    atexit.register(_record, state)


def _metrics() -> Optional[Dict[str, object]]:
    if "torch_xla" not in sys.modules:
        return None
    import torch_xla.debug.metrics as met

    try:  # the program is done: let its last executions finish, so that they are counted
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()
    except Exception:  # noqa: BLE001 -- counting must never fail the run
        pass

    def samples(name: str) -> int:
        data = met.metric_data(name)
        return int(data[0]) if data else 0

    compile_data = met.metric_data("CompileTime")
    return {
        "compiles": samples("CompileTime"),
        "compile_seconds": (compile_data[1] / 1e9) if compile_data else 0.0,
        "executions": samples("ExecuteTime"),
        "transfers_from_device": samples("TransferFromDeviceTime"),
        "uncached_compiles": met.counter_value("UncachedCompile") or 0,
        "cached_compiles": met.counter_value("CachedCompile") or 0,
        "scalar_reads": met.counter_value("aten::_local_scalar_dense") or 0,
        "fallbacks": {n: met.counter_value(n) or 0 for n in met.counter_names()
                      if n.startswith("aten::") and n != "aten::_local_scalar_dense"},
    }


def _record(state: _State) -> None:
    from xlaport.verify import sandbox

    data: Dict[str, object] = {"pid": os.getpid(), "seconds": _PERF() - state.t0, **state.extras}
    try:
        metrics = _metrics()
        if metrics is not None:
            data["metrics"] = {**metrics, "seconds": data["seconds"]}
        if state.recorder is not None:
            state.recorder.uninstall()
            traced = state.recorder.result()
            data.update(steps=traced["steps"], fallback_sites=traced["fallback_sites"],
                        host_reads=traced["host_reads"])
        data["imported"] = sandbox.imported({"own": os.environ.get("XLAPORT_SIDE_TREE", ""),
                                             "user": os.environ.get("XLAPORT_USER_ROOT", ""),
                                             "scratch": os.environ.get("XLAPORT_SCRATCH", "")})
        main = sys.modules.get("__main__")
        leftovers = os.environ.get("XLAPORT_LEFTOVERS")
        if leftovers and main is not None and getattr(main, "__name__", "") == "__main__":
            data["leftover_devices"] = _save_leftovers(vars(main), leftovers)
    except Exception as exc:  # noqa: BLE001 -- watching must never fail the run
        data["observer_error"] = repr(exc)
    path = f"{state.prefix}.{os.getpid()}.json"
    try:
        with open(f"{path}.tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(f"{path}.tmp", path)
    except OSError:
        pass


def _save_leftovers(namespace: Dict[str, object], path: str) -> Dict[str, str]:
    """The tensors (not masks) and modules the script leaves in its globals, on the CPU,
    so that they are compared like the files it saves (and its numbers: a
    conversion may hold as a number what the original holds as a tensor).  Returns the device
    type each module was on (a conversion whose model stayed on the CPU)."""
    torch = sys.modules.get("torch")
    devices: Dict[str, str] = {}
    if torch is None:
        return devices
    found: Dict[str, object] = {}
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        try:
            if isinstance(value, torch.nn.Module):
                first = next(iter(value.parameters()), None)
                if first is not None:
                    devices[name] = first.device.type
                found[name] = {k: v.detach().cpu() for k, v in value.state_dict().items()
                               if isinstance(v, torch.Tensor) and v.dtype.is_floating_point}
            elif isinstance(value, torch.Tensor) and value.dtype != torch.bool:
                found[name] = value.detach().cpu()  # values, and the integers a sampler drew (its tokens)
            elif type(value) in (int, float):  # (compared only with a tensor the other run holds there)
                found[name] = value
        except Exception:  # noqa: BLE001 -- a value that cannot be read back is simply not compared
            continue
    if found:
        torch.save(found, path)
    return devices


def _emulate_torchrun() -> None:
    """``--torchrun``: the environment ``torchrun --nproc_per_node=1`` gives."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        os.environ.setdefault(key, value)


def records(prefix: str) -> List[Dict[str, object]]:
    """(In the parent) what every process of a run recorded at exit."""
    folder, stem = os.path.split(prefix)
    found: List[Dict[str, object]] = []
    for name in sorted(os.listdir(folder or ".")):
        if name.startswith(os.path.basename(stem) + ".") and name.endswith(".json"):
            try:
                with open(os.path.join(folder, name)) as fh:
                    found.append(json.load(fh))
            except (OSError, ValueError):
                continue
    return found
