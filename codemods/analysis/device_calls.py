"""Where a device goes in a call, and which calls start worker processes:
what both the CUDA surface (``cuda``) and the integer devices
(``ordinals``) read."""

from __future__ import annotations

from typing import Callable, List, Set

import libcst as cst

QualNames = Callable[[cst.CSTNode], Set[str]]

LAUNCHERS = {"torch_xla.launch", "torch_xla.distributed.xla_multiprocessing.spawn"}
SPAWNS = {"torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn", "torch.multiprocessing.start_processes"}


def device_arguments(call: cst.Call, qualnames: QualNames) -> List[cst.BaseExpression]:
    """The arguments of ``call`` that sit where a device goes: ``device=``,
    the first of ``.to(...)`` and of ``torch.device(...)``."""
    found = [a.value for a in call.args if a.keyword is not None and a.keyword.value == "device"]
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    func = call.func
    if positional and ((isinstance(func, cst.Attribute) and func.attr.value == "to")
                       or "torch.device" in qualnames(func)):
        found.append(positional[0])
    return found
