"""xlaport's LibCST codemods, one module per concern.

``CODEMODS`` is the order they run in: the CUDA surface first (device
strings, devices, ``torch.cuda.*``, mixed precision, checkpoints,
distributed), then the loop rules (bars around iterables, prints, loaders,
barriers, host reads), then the progress-bar blocks around the loops, and
last the runtime settings and the catch-all that reports any CUDA construct
left.  Each
codemod works on its own through LibCST's runner, e.g.::

    python -m libcst.tool codemod devices.DeviceSwap train.py

Importing this package is cheap: the codemod classes (and LibCST) are loaded
on first use of ``CODEMODS``, ``all_rules`` or ``rule_index``; the command
line reads ``codemods.registry`` instead.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from codemods.rule import Finding, Rule

__all__ = ["CODEMODS", "Finding", "Rule", "XlaCodemod", "all_rules", "rule_index"]


def _codemods() -> Tuple[type, ...]:
    from codemods.registry import CODEMODS as INFO

    return tuple(info.load() for info in INFO)


def all_rules() -> List[Rule]:
    """Every rule once (XLA302 is two codemods': the same Rule object)."""
    return list({id(rule): rule for codemod in _codemods() for rule in codemod.RULES}.values())


def rule_index() -> Dict[str, Tuple[Rule, type]]:
    return {rule.code: (rule, codemod) for codemod in _codemods() for rule in codemod.RULES}


def __getattr__(name: str) -> Any:
    if name == "CODEMODS":
        return _codemods()
    if name == "XlaCodemod":
        from codemods.base import XlaCodemod

        return XlaCodemod
    raise AttributeError(name)
