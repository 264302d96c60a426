"""torch's ``AveragedModel`` (``torch.optim.swa_utils``): where its step
counter lives.

``AveragedModel(model, device=d)`` registers ``n_averaged`` with
``torch.tensor(0, device=d)``, and ``update_parameters`` tests it in Python
(``if self.n_averaged == 0``, per parameter, then ``> 0``).  Made with no
``device`` (or ``device=None``), the counter is a host tensor and an update
reads nothing on the device: it only updates the average's tensors.  XLA423
(``codemods.averaged_models``) drops a ``device=`` that moves nothing; the
step barrier (``analysis.step_updates``) then lets the update join the
step's graph.
"""

from __future__ import annotations

from typing import Callable, Optional, Set

import libcst as cst

from codemods.syntax.tree import TreeCache

AVERAGED_MODELS = frozenset({"torch.optim.swa_utils.AveragedModel"})
UPDATE = "update_parameters"  # the method that averages, every step or every N

QualNames = Callable[[cst.CSTNode], Set[str]]


def device_index(call: cst.Call) -> Optional[int]:
    """The position of an ``AveragedModel`` call's ``device`` argument
    (``device=d``, or the second positional one), or None."""
    for i, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == "device":
            return i
        if arg.star:
            return None
    if len(call.args) > 1 and call.args[1].keyword is None:
        return 1
    return None


def counts_on_host(call: cst.Call) -> bool:
    """The ``AveragedModel`` ``call`` makes keeps its counter on the host: no
    ``device``, or ``device=None`` (a ``*args``/``**kwargs`` one may hide it: no)."""
    if any(a.star for a in call.args):
        return False
    index = device_index(call)
    if index is None:
        return True
    value = call.args[index].value
    return isinstance(value, cst.Name) and value.value == "None"


def averages_count_on_host(tree: TreeCache, qualnames: QualNames) -> bool:
    """The module makes ``AveragedModel``s, and every one keeps its counter on
    the host: an ``x.update_parameters(m)`` of a library object here is then
    read as such an average's update (a wrong guess only costs a graph
    execution: a barrier's place never changes a value)."""
    key = "averages_count_on_host"
    if key not in tree.memo:
        if tree.source and b"AveragedModel" not in tree.source:
            tree.memo[key] = False
            return False
        made = [c for c in tree.nodes((cst.Call,)) if qualnames(c.func) & AVERAGED_MODELS]  # type: ignore[attr-defined]
        tree.memo[key] = bool(made) and all(counts_on_host(c) for c in made)  # type: ignore[arg-type]
    return tree.memo[key]  # type: ignore[no-any-return]


__all__ = ["AVERAGED_MODELS", "UPDATE", "averages_count_on_host", "counts_on_host", "device_index"]
