"""The one table that says which API a conversion targets.

Every rule asks the target for the code it emits (the device expression, the
step barrier, the device loader, the step closure) and for the imports that
code needs.  Adding another target (an older torch_xla, TorchTPU) means adding
an entry here, not touching the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Dict, FrozenSet, Optional, Tuple

import libcst as cst

# (module, obj, asname) as AddImportsVisitor.add_needed_import takes them.
Import = Tuple[str, Optional[str], Optional[str]]


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

    def device_node(self) -> cst.BaseExpression:
        return _parse(self.device)

    def sync_node(self) -> cst.BaseExpression:
        assert self.sync is not None
        return _parse(self.sync)


@lru_cache(maxsize=None)
def _parse(expr: str) -> cst.BaseExpression:
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
)

TARGETS: Dict[str, Target] = {t.name: t for t in (TORCH_XLA_2_9, CPU)}
DEFAULT_TARGET = TORCH_XLA_2_9.name


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(
            f"unknown target {name!r}; known targets: {', '.join(sorted(TARGETS))}"
        ) from None
