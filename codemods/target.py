"""The one table that says which API a conversion targets.

Every rule asks the target for the code it emits (the device expression, the
step barrier, the device loader, the step closure) and for the imports that
code needs.  Adding another target (an older torch_xla, TorchTPU) means adding
an entry here, not touching the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Dict, FrozenSet, Mapping, Optional, Tuple

if TYPE_CHECKING:
    import libcst as cst


# (module, obj, asname) as AddImportsVisitor.add_needed_import takes them.
Import = Tuple[str, Optional[str], Optional[str]]


@dataclass(frozen=True)
class Move:
    """What a CUDA API call becomes on a target.

    ``kind`` is one of:

    * ``"call"``: the same call with another callee (``code``), arguments kept;
    * ``"expr"``: the whole call becomes the expression ``code``;
    * ``"drop"``: the call means nothing there: a statement made of it goes,
      elsewhere it becomes ``None``;
    * ``"report"``: no counterpart; reported with ``why`` and left alone.
    """

    kind: str
    code: str = ""
    imports: Tuple[Import, ...] = ()
    why: str = ""


_XLA = (("torch_xla", None, None),)
_XR = (("torch_xla.runtime", None, "xr"),)

# torch.cuda.* (and torch.accelerator.*) on XLA.  Anything under torch.cuda
# that is not in the table is reported by the CUDA catch-all (XLA199).
_NO_MEANING = "no meaning on XLA: the runtime manages device memory and placement"
_NO_COUNTERPART = "no XLA counterpart"
# `with torch.cuda.device(i):` makes CUDA device i current (a no-op for a negative i, which a program
# takes on a host without CUDA: SimCLR's `gpu_index = -1`); a process has one XLA, TPU or CPU device
_DEVICE_CONTEXTS = {name: Move("expr", "contextlib.nullcontext()", (("contextlib", None, None),),
                               why="one device per process: nothing to make current")
                    for name in ("torch.cuda.device", "torch.cuda.device_of")}
XLA_CUDA_API: Dict[str, Move] = {
    "torch.cuda.synchronize": Move("expr", "torch_xla.sync(wait=True)", _XLA),
    "torch.accelerator.synchronize": Move("expr", "torch_xla.sync(wait=True)", _XLA),
    "torch.cuda.empty_cache": Move("drop", why=_NO_MEANING),
    "torch.cuda.set_device": Move("drop", why=_NO_MEANING),
    "torch.accelerator.set_device_index": Move("drop", why=_NO_MEANING),
    "torch.cuda.init": Move("drop", why=_NO_MEANING),
    "torch.cuda.ipc_collect": Move("drop", why=_NO_MEANING),
    "torch.cuda.reset_peak_memory_stats": Move("drop", why=_NO_MEANING),
    "torch.cuda.reset_max_memory_allocated": Move("drop", why=_NO_MEANING),
    "torch.cuda.reset_accumulated_memory_stats": Move("drop", why=_NO_MEANING),
    "torch.cuda.manual_seed": Move("call", "torch_xla.manual_seed", _XLA),
    "torch.cuda.manual_seed_all": Move("call", "torch_xla.manual_seed", _XLA),
    **_DEVICE_CONTEXTS,
    "torch.cuda.is_available": Move("expr", "True"),
    "torch.accelerator.is_available": Move("expr", "True"),
    "torch.cuda.is_bf16_supported": Move("expr", "True"),
    "torch.accelerator.current_accelerator": Move("expr", "torch_xla.device()", _XLA),
    "torch.cuda.device_count": Move("expr", "xr.world_size()", _XR),
    "torch.accelerator.device_count": Move("expr", "xr.world_size()", _XR),
    **{name: Move("report", why="an int device index means a CUDA device to torch (`.to(0)` is cuda:0): "
                               "use `torch_xla.device()`, or `xr.local_ordinal()` for this process's index")
       for name in ("torch.cuda.current_device", "torch.accelerator.current_device_index")},
    **{f"torch.cuda.{name}": Move("report", why=f"{_NO_COUNTERPART}; `xm.get_memory_info()` reports TPU memory")
       for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                    "memory_stats", "mem_get_info", "memory_cached", "max_memory_cached")},
    # the report a program prints about its device (it raises where CUDA never ran: KeyError
    # 'allocated_bytes.all.current'): XLA's own, the one torch_xla's troubleshooting guide reads
    "torch.cuda.memory_summary": Move("expr", "torch_xla.debug.metrics.short_metrics_report()",
                                      (("torch_xla.debug.metrics", None, None),)),
    **{f"torch.cuda.{name}": Move("report", why=f"{_NO_COUNTERPART}: XLA orders work itself; remove it")
       for name in ("Stream", "Event", "stream", "current_stream", "default_stream", "graph", "CUDAGraph",
                    "graphs", "make_graphed_callables", "ExternalStream")},
    **{f"torch.cuda.{name}": Move("report", why=f"{_NO_COUNTERPART}: describe the TPU with `xr.device_type()`")
       for name in ("get_device_name", "get_device_properties", "get_device_capability", "get_arch_list")},
    "torch.cuda.nvtx": Move("report", why="use `torch_xla.debug.profiler.Trace(name)` regions (never around a sync)"),
}

# The reference run of verify: the same program, on the host CPU, with the
# CUDA-only calls neutralised so that it runs where there is no GPU.
CPU_CUDA_API: Dict[str, Move] = {
    **{name: Move("drop", why="the CPU reference runs eagerly") for name in
       ("torch.cuda.synchronize", "torch.accelerator.synchronize")},
    **{name: move for name, move in XLA_CUDA_API.items() if move.kind == "drop"},
    "torch.cuda.manual_seed": Move("call", "torch.manual_seed"),
    "torch.cuda.manual_seed_all": Move("call", "torch.manual_seed"),
    **_DEVICE_CONTEXTS,
    "torch.cuda.is_available": Move("expr", "True"),
    "torch.accelerator.is_available": Move("expr", "True"),
    "torch.cuda.is_bf16_supported": Move("expr", "True"),
    "torch.accelerator.current_accelerator": Move("expr", 'torch.device("cpu")'),
    "torch.cuda.device_count": Move("expr", "1"),
    "torch.accelerator.device_count": Move("expr", "1"),
    "torch.cuda.current_device": Move("expr", "0"),
    "torch.accelerator.current_device_index": Move("expr", "0"),
    **{f"torch.cuda.{name}": Move("expr", "0") for name in (
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
        "max_memory_cached")},
    "torch.cuda.get_device_name": Move("expr", '"cpu"'),
    "torch.cuda.memory_summary": Move("expr", '""'),
    **{name: move for name, move in XLA_CUDA_API.items() if move.kind == "report" and name not in (
        "torch.cuda.get_device_name",)},
}


@dataclass(frozen=True)
class Target:
    name: str
    summary: str
    device: str
    device_imports: Tuple[Import, ...]
    # Code the loop rules emit; None means the target has no such concept and
    # the rule does nothing.
    sync: Optional[str] = None
    sync_imports: Tuple[Import, ...] = ()
    loader: Optional[str] = None  # "{loader}" is replaced by the iterable
    loader_imports: Tuple[Import, ...] = ()
    step_closure: Optional[str] = None  # a callable taking a zero-arg closure
    step_closure_imports: Tuple[Import, ...] = ()
    # Fully qualified names that already act as a step barrier / device loader.
    barrier_names: FrozenSet[str] = field(default_factory=frozenset)
    loader_names: FrozenSet[str] = field(default_factory=frozenset)
    step_closure_names: FrozenSet[str] = field(default_factory=frozenset)
    # The rest of the CUDA surface (see Move and the tables above).
    cuda_api: Mapping[str, Move] = field(default_factory=dict)
    device_string: str = "xla"  # what a "cuda" string becomes where it is used as a string
    autocast_device: str = '"xla"'  # the code of autocast's device_type
    autocast_dtype: str = "torch.bfloat16"
    process_group_backend: str = "xla"
    process_group_init: Optional[str] = 'init_method="xla://"'  # keyword kept, rank/world size dropped
    process_group_imports: Tuple[Import, ...] = (("torch_xla.distributed.xla_backend", None, None),)
    ddp_extra: Optional[str] = "gradient_as_bucket_view=True"
    launch: Optional[str] = "torch_xla.launch"  # spawn(fn, args, nprocs) -> launch(fn, args=args); None: fn(0, *args)
    launch_imports: Tuple[Import, ...] = _XLA
    keeps_spawn: bool = False  # True: `mp.spawn` works there as it is (one process per device, as on CUDA)
    from_torch_xla: bool = False  # True: torch_xla code is moved to this target (codemods/from_xla.py)
    keeps_device_index: bool = False  # True: "cuda:1" -> "tpu:1" (one process per device as on CUDA); False: "xla"
    save: Optional[str] = "xm.save"  # torch.save of device state; None: left alone
    save_imports: Tuple[Import, ...] = (("torch_xla.core.xla_model", None, "xm"),)
    compile_backend: Optional[str] = "openxla"  # None: torch.compile(m) -> m (eager)
    # What the runtime of the target cannot do the way torch on CUDA does
    # (codemods/runtime.py); each None/False: leave the program as it is.
    seed: Optional[str] = "torch_xla.manual_seed"  # also seeded beside torch.manual_seed(s)
    seed_imports: Tuple[Import, ...] = _XLA
    no_inference_mode: bool = True  # torch.inference_mode() -> torch.no_grad()
    no_fused_optimizers: bool = True  # torch.optim.X(..., fused=True) -> fused=False
    matmul_precision: Optional[str] = "torch_xla.backends.set_mat_mul_precision"
    matmul_precision_imports: Tuple[Import, ...] = (("torch_xla.backends", None, None),)
    # torch.set_float32_matmul_precision's levels -> the target's
    matmul_levels: Mapping[str, str] = field(default_factory=lambda: {
        "highest": "highest", "high": "high", "medium": "default"})
    configures_logging: bool = True  # importing it calls logging.basicConfig(): the program's own needs force=True

    # a fresh copy for each use: a node object that appears twice in a tree
    # makes the engine copy the whole tree (metadata needs unique nodes)
    def device_node(self) -> cst.BaseExpression:
        return _parse(self.device).deep_clone()

    def sync_node(self) -> cst.BaseExpression:
        assert self.sync is not None
        return _parse(self.sync).deep_clone()


@lru_cache(maxsize=None)
def _parse(expr: str) -> "cst.BaseExpression":
    import libcst as cst  # here, not at the top: the CLI reads the target table without LibCST

    return cst.parse_expression(expr)


# Names that count as an existing barrier or device loader whatever the target:
# code that a person (or an older xlaport) already ported must be left alone.
KNOWN_BARRIERS = frozenset(
    {
        "torch_xla.sync",
        "torch_xla.core.xla_model.mark_step",
        "torch_xla._XLAC._xla_step_marker",
    }
)
KNOWN_LOADERS = frozenset(
    {
        "torch_xla.distributed.parallel_loader.MpDeviceLoader",
        "torch_xla.distributed.parallel_loader.ParallelLoader",
    }
)
KNOWN_STEP_CLOSURES = frozenset({"torch_xla.core.xla_model.add_step_closure"})

TORCH_XLA_2_9 = Target(
    name="torch_xla-2.9",
    summary="PyTorch/XLA 2.9 (torch_xla.device(), torch_xla.sync(), MpDeviceLoader)",
    device="torch_xla.device()",
    device_imports=(("torch_xla", None, None),),
    sync="torch_xla.sync()",
    sync_imports=(("torch_xla", None, None),),
    loader="pl.MpDeviceLoader({loader}, torch_xla.device())",
    loader_imports=(
        ("torch_xla", None, None),
        ("torch_xla.distributed.parallel_loader", None, "pl"),
    ),
    step_closure="xm.add_step_closure",
    step_closure_imports=(("torch_xla.core.xla_model", None, "xm"),),
    barrier_names=KNOWN_BARRIERS,
    loader_names=KNOWN_LOADERS,
    step_closure_names=KNOWN_STEP_CLOSURES,
    cuda_api=XLA_CUDA_API,
)

# The reference run of `xlaport verify`: the original program with its CUDA
# device retargeted to the host CPU, and nothing else changed.
CPU = Target(
    name="cpu",
    summary="eager CPU (the reference run of `xlaport verify`)",
    device='torch.device("cpu")',
    device_imports=(("torch", None, None),),
    barrier_names=KNOWN_BARRIERS,
    loader_names=KNOWN_LOADERS,
    step_closure_names=KNOWN_STEP_CLOSURES,
    cuda_api=CPU_CUDA_API,
    device_string="cpu",
    autocast_device='"cpu"',
    process_group_backend="gloo",
    process_group_init=None,
    process_group_imports=(),
    ddp_extra=None,
    launch=None,
    launch_imports=(),
    save=None,
    save_imports=(),
    compile_backend=None,
    seed=None,
    seed_imports=(),
    no_inference_mode=False,
    no_fused_optimizers=False,
    matmul_precision=None,
    matmul_precision_imports=(),
    configures_logging=False,
)

# torch.cuda.* on TorchTPU: device-generic PyTorch.  The device calls whose
# torch.tpu counterpart the wheel marks internal go to the torch.accelerator
# call it names (codemods/torchtpu_api_data.py, generated from the wheel);
# memory calls to torch.accelerator's own (torch >= 2.9); the rest is
# reported as it is for XLA.
_TPU_PREFERRED = ("is_available", "synchronize", "device_count", "current_device", "set_device")
_ACCELERATOR_MEMORY = ("empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
                       "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
                       "reset_accumulated_memory_stats")


def _torchtpu_cuda_api() -> Dict[str, Move]:
    from codemods.torchtpu_api_data import STAGES

    table: Dict[str, Move] = {
        name: move for name, move in XLA_CUDA_API.items()
        if move.kind == "report" and not name.startswith("torch.accelerator.")
        and name.rsplit(".", 1)[1] not in _TPU_PREFERRED + _ACCELERATOR_MEMORY}
    for name in _TPU_PREFERRED:
        stage, prefer = STAGES[name]
        assert stage == "internal" and prefer, name  # the wheel names the call to make
        table[f"torch.cuda.{name}"] = Move("call", prefer)
    for name in _ACCELERATOR_MEMORY:
        table[f"torch.cuda.{name}"] = Move("call", f"torch.accelerator.{name}")
    for name in ("init", "ipc_collect", "reset_max_memory_allocated"):
        table[f"torch.cuda.{name}"] = Move("drop", why="no meaning on TorchTPU: its runtime manages device memory")
    seeded = "`torch.manual_seed` seeds every device's generator, the TPU's with it"
    table["torch.cuda.manual_seed"] = Move("call", "torch.manual_seed", why=seeded)
    table["torch.cuda.manual_seed_all"] = Move("call", "torch.manual_seed", why=seeded)
    table["torch.cuda.is_bf16_supported"] = Move("expr", "True")
    table.update(_DEVICE_CONTEXTS)
    for name in ("get_device_name", "get_device_properties", "get_device_capability", "get_arch_list"):
        table[f"torch.cuda.{name}"] = Move("report", why="no device-generic counterpart: `torch.tpu.get_device_name()` "
                                                        "and `get_device_properties()` are TorchTPU's (experimental)")
    return table


# the accelerator's device, or the CPU where there is none
_TPU_DEVICE = 'torch.device(torch.accelerator.current_accelerator(check_available=True) or "cpu")'

# CUDA -> TorchTPU (torch-tpu 0.2.0, torch 2.11-2.15): device-generic PyTorch,
# eager-first (no barrier, no device loader, no step closure), so the program
# still runs -- on the CPU -- on a host without a TPU.
TORCHTPU = Target(
    name="torchtpu",
    summary="TorchTPU (device \"tpu\" through torch.accelerator; eager, no barriers)",
    device=_TPU_DEVICE,
    device_imports=(("torch", None, None),),
    barrier_names=KNOWN_BARRIERS,
    loader_names=KNOWN_LOADERS,
    step_closure_names=KNOWN_STEP_CLOSURES,
    cuda_api=_torchtpu_cuda_api(),
    device_string="tpu",
    # the device's own type: "tpu", or "cpu" on a host without one (autocast refuses a type it does not know)
    autocast_device=f"{_TPU_DEVICE}.type",
    process_group_backend="tpu_dist",
    process_group_init=None,
    process_group_imports=(),
    ddp_extra=None,
    launch=None,
    launch_imports=(),
    keeps_spawn=True,
    from_torch_xla=True,
    keeps_device_index=True,
    save=None,
    save_imports=(),
    compile_backend="tpu",
    seed=None,
    seed_imports=(),
    no_inference_mode=False,
    matmul_precision=None,
    matmul_precision_imports=(),
    configures_logging=False,
)

TARGETS: Dict[str, Target] = {t.name: t for t in (TORCH_XLA_2_9, CPU, TORCHTPU)}
DEFAULT_TARGET = TORCH_XLA_2_9.name


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(
            f"unknown target {name!r}; known targets: {', '.join(sorted(TARGETS))}"
        ) from None
