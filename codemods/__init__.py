"""xlaport's LibCST codemods, one module per concern.

``CODEMODS`` is the order they run in: the CUDA surface first (device
strings, devices, ``torch.cuda.*``, mixed precision, checkpoints,
distributed), then the structural loop rewrites, then the report-only
analyses, and last the catch-all that reports any CUDA construct left.  Each codemod works on its own
through LibCST's runner, e.g.::

    python -m libcst.tool codemod devices.DeviceSwap train.py
"""

from __future__ import annotations

from typing import Dict, List, Tuple, Type

from codemods.base import Finding, Rule, XlaCodemod
from codemods.amp import MixedPrecision
from codemods.barriers import StepBarrier
from codemods.checkpoints import Checkpoints
from codemods.coverage import CudaCatchAll
from codemods.cuda_api import CudaApi
from codemods.device_strings import DeviceStrings
from codemods.devices import DeviceSwap
from codemods.distributed import Distributed
from codemods.host_reads import HostReads
from codemods.loaders import DeviceLoader
from codemods.prints import HotPrints
from codemods.progress import ProgressBars

CODEMODS: Tuple[Type[XlaCodemod], ...] = (
    DeviceStrings,
    DeviceSwap,
    CudaApi,
    MixedPrecision,
    Checkpoints,
    Distributed,
    ProgressBars,
    HotPrints,
    DeviceLoader,
    StepBarrier,
    HostReads,
    CudaCatchAll,
)


def all_rules() -> List[Rule]:
    return [rule for codemod in CODEMODS for rule in codemod.RULES]


def rule_index() -> Dict[str, Tuple[Rule, Type[XlaCodemod]]]:
    return {rule.code: (rule, codemod) for codemod in CODEMODS for rule in codemod.RULES}


__all__ = ["CODEMODS", "Finding", "Rule", "XlaCodemod", "all_rules", "rule_index"]
