"""What takes a step, by name: the one definition both readers of a module
use -- :mod:`codemods.analysis.loops` on the LibCST tree, with the dataflow
to tell an optimizer's ``step`` from an LR scheduler's, and the cheap ``ast``
pre-check :mod:`codemods.analysis.prefilter`, which must find a superset of
it.  No LibCST here."""

from __future__ import annotations

from typing import Dict, Set

# calls that take a training or sampling step (``loss.backward()``,
# ``optimizer.step()``, ``xm.optimizer_step(opt)``, ``scheduler.step(x, t)``)
STEP_CALLS = frozenset({"backward", "step", "optimizer_step"})


def callers_closure(direct: Set[str], calls_of: Dict[str, Set[str]]) -> Set[str]:
    """``direct`` and every function that calls one of them, to any depth
    (``run_step`` -> ``self.forward_backward()`` -> ``loss.backward()``); a
    fixed point, so recursion and call cycles end."""
    found = set(direct)
    changed = True
    while changed:
        changed = False
        for fn, called in calls_of.items():
            if fn not in found and not called.isdisjoint(found):
                found.add(fn)
                changed = True
    return found
