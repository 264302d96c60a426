"""The codemods as the command line sees them, without importing LibCST.

A pre-commit hook is called on every commit, mostly on files that no rule
concerns; answering those must not cost LibCST's ~0.5 s import.  The facts
here (order, rule codes, names, trigger bytes) are generated from the codemod
classes into ``registry_data.py`` and kept in sync by a test; the classes are
imported only when a file needs parsing (``load``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from codemods.rule import code_matches

# The order the codemods run in (see the package docstring): edit this to add one.
ORDER: Tuple[Tuple[str, str], ...] = (
    ("codemods.from_xla", "FromTorchXla"),  # --target torchtpu: torch_xla code first, so no rule reads it as XLA's
    # before the guards: a stream it removes is no CUDA-only code behind a CUDA test
    ("codemods.streams", "CudaStreams"),
    ("codemods.guards", "CudaGuards"),  # decides CUDA tests before the device rules rewrite them
    ("codemods.device_strings", "DeviceStrings"),
    ("codemods.devices", "DeviceSwap"),
    ("codemods.generators", "CudaGenerators"),
    ("codemods.device_compare", "DeviceComparisons"),  # after the device choices: an idiom it replaces is gone
    ("codemods.tensor_types", "TensorTypes"),
    ("codemods.tensor_types", "DefaultTypeConstructors"),  # what the default type it rewrites decided
    ("codemods.cuda_api", "CudaApi"),
    ("codemods.traces", "HostTraces"),  # after the device rules: the inputs it moves are on the XLA device there
    # after the device rules (it compares their devices) and before the barriers: an average whose counter it
    # leaves on the host updates inside the step's graph
    ("codemods.averaged_models", "AveragedModelCounter"),
    ("codemods.amp", "MixedPrecision"),
    ("codemods.checkpoints", "Checkpoints"),
    ("codemods.distributed", "Distributed"),
    ("codemods.progress", "BarIterables"),  # before the loader rule: `tqdm(loader)` read as the loader
    # before the prints (a print of the sum it moves to the device is deferred to a step closure) and the
    # barriers (none is placed for a host read it removes)
    ("codemods.accumulators", "DeviceAccumulators"),
    # likewise: the values it keeps on the device for a log are read there, after the barrier it places
    ("codemods.logged_values", "LoggedValues"),
    ("codemods.meters", "DeviceMeters"),  # likewise: a meter handed the tensor is no read for the barriers
    # before the prints too: a walk in a print (`''.join([itos[int(i)] for i in y])`) is read once there,
    # then deferred with it (in a step closure it runs after the step, a graph per element all the same)
    ("codemods.element_reads", "ElementReads"),
    ("codemods.generator_draws", "GeneratorDraws"),  # (XLA107 made the generators it draws from CPU ones)
    ("codemods.prints", "HotPrints"),
    # after the accumulators and the prints (a sum kept on the device, a print deferred to a step
    # closure, is no read) and before the barriers: a read moved after the step finds its barrier there
    ("codemods.step_reads", "ReadsAfterStep"),
    ("codemods.deferred_reads", "DeferredReads"),  # after XLA417 (what it leaves) and before the barriers (likewise)
    ("codemods.loaders", "DeviceLoader"),
    # before the loops' barriers: a loop that calls a function synced on every path gets none of its own
    ("codemods.step_function_barriers", "StepFunctionBarrier"),
    ("codemods.barriers", "StepBarrier"),
    ("codemods.device_index", "DeviceIndex"),  # before the host reads: what it fixes is not reported
    ("codemods.counter_tests", "CounterTests"),  # so is this (and ElementReads', above: XLA407's walks)
    ("codemods.flag_first", "FlagFirst"),  # before the host reads: the condition it reorders is still one
    ("codemods.host_reads", "HostReads"),
    ("codemods.shape_traps", "ShapeTraps"),
    # after the barriers (a sync may follow the growth) and the shape traps (its masks filled at a fixed
    # shape first); XLA408 leaves what it rewrites to it
    ("codemods.generation", "GenerationWindow"),
    # after the loop rules: they read the loops where the user wrote them, and on most files the
    # dedent is the last rewrite, so nothing analyses the tree again
    ("codemods.progress", "BarBlocks"),
    ("codemods.tied_weights", "TiedWeights"),
    ("codemods.runtime", "XlaRuntime"),  # late: it asks whether the rules before it import torch_xla
    ("codemods.recompiles", "Recompiles"),
    ("codemods.random_slices", "RandomSlices"),
    ("codemods.partial_batches", "PartialBatches"),
    ("codemods.inplace_results", "InplaceResults"),
    ("codemods.xla_limits", "XlaLimits"),  # before the catch-all: what it reports keeps CUDA tests too
    ("codemods.index_errors", "CaughtIndexErrors"),
    ("codemods.coverage", "CudaCatchAll"),
    ("codemods.suppressions", "UnusedSuppressions"),  # last: it reads what the others silenced
)


@dataclass(frozen=True)
class RuleInfo:
    code: str
    name: str
    summary: str
    fix: bool


@dataclass(frozen=True)
class CodemodInfo:
    module: str
    name: str
    triggers: Tuple[bytes, ...]
    needs: Tuple[str, ...]
    rules: Tuple[RuleInfo, ...]
    sibling_facts: Tuple[str, ...] = ()  # (``XlaCodemod.SIBLING_FACTS``)

    def load(self) -> type:
        return getattr(importlib.import_module(self.module), self.name)


def _infos() -> Tuple[CodemodInfo, ...]:
    try:
        from codemods.registry_data import CODEMODS as data
    except ImportError:  # not generated yet: read the classes themselves
        data = ()
    known = {(module, name): rest for module, name, *rest in data}
    out = []
    for module, name in ORDER:
        if len(known.get((module, name), ())) == 4:  # (a stale data file is read from the classes)
            triggers, needs, rule_rows, siblings = known[(module, name)]
        else:
            cls = getattr(importlib.import_module(module), name)
            triggers, needs, siblings = tuple(cls.TRIGGERS), tuple(cls.NEEDS), tuple(cls.SIBLING_FACTS)
            rule_rows = tuple((r.code, r.name, r.summary, r.fixes_by_default) for r in cls.RULES)
        # (shortest first: the commonest, which ends the search soonest; the set is the same)
        triggers = tuple(sorted(dict.fromkeys(triggers), key=len))
        out.append(CodemodInfo(module, name, triggers, tuple(needs), tuple(RuleInfo(*r) for r in rule_rows),
                               tuple(siblings)))
    return tuple(out)


CODEMODS: Tuple[CodemodInfo, ...] = _infos()


def rules() -> List[RuleInfo]:
    """Every rule, in code order (as ``xlaport rules`` and the docs list
    them; the codemods run in ``CODEMODS``' order)."""
    # (a rule two codemods share, XLA302, once: the first of them documents it)
    return sorted({r.code: r for c in reversed(CODEMODS) for r in c.rules}.values(), key=lambda r: r.code)


@lru_cache(maxsize=None)
def rule_info() -> Dict[str, RuleInfo]:
    return {r.code: r for r in rules()}


def selected_codes(select: Optional[Sequence[str]], ignore: Sequence[str]) -> List[str]:
    codes = [r.code for r in rules()]
    if select is not None:
        codes = [c for c in codes if code_matches(c, select)]
    return [c for c in codes if not code_matches(c, ignore)]


def applicable(source: bytes, codes: Sequence[str], options: Optional[Mapping[str, object]] = None,
               prefilter: bool = True, triggered: Optional[Sequence[CodemodInfo]] = None,
               filename: Optional[str] = None) -> List[CodemodInfo]:
    """The codemods worth parsing the file for: enabled, triggered by its
    bytes (or by what a project module it imports from holds, ``sibling_facts``:
    ``filename`` is where the file is) and, for those with ``NEEDS``, by the
    ``ast`` prefilter's facts.  ``triggered``: what an earlier call found
    triggered (for these codes or more), so that they are not scanned again."""
    wanted = set(codes)
    if triggered is not None:
        found = [c for c in triggered if any(r.code in wanted for r in c.rules)]
    else:
        seen: Dict[bytes, bool] = {}  # each trigger searched for once (`cuda` triggers five codemods)

        def present(trigger: bytes) -> bool:
            hit = seen.get(trigger)
            if hit is None:
                hit = seen[trigger] = trigger in source
            return hit

        found = [c for c in CODEMODS if any(r.code in wanted for r in c.rules)
                 and (any(map(present, c.triggers)) or _from_siblings(c, source, filename, called=False))]
    if not prefilter or not any(c.needs for c in found):
        return found
    from codemods.analysis.prefilter import facts_of

    facts = facts_of(source)
    if facts is None:  # ast cannot read it: LibCST will say why
        return found
    from codemods.analysis.importers import ported_importer
    from codemods.analysis.prefilter import PORTED_BY_IMPORTER, holds

    facts = facts | {f"option:{k}" for k, v in (options or {}).items() if v}
    ported: List[bool] = []  # (asked of the project once, and only where nothing else decides)

    def by_importer(info: CodemodInfo) -> bool:
        if not any(holds(n, facts | {PORTED_BY_IMPORTER}) for n in info.needs if PORTED_BY_IMPORTER in n):
            return False
        if not ported:
            ported.append(ported_importer(filename, source))
        return ported[0]

    return [c for c in found if not c.needs or any(holds(n, facts) for n in c.needs)
            or _from_siblings(c, source, filename) or by_importer(c)]


def _from_siblings(info: CodemodInfo, source: bytes, filename: Optional[str], called: bool = True) -> bool:
    """Is ``info`` triggered by a project module the file imports from (or,
    with ``called``, by one whose step loop calls the file's functions)?  A
    function that another module's loop calls is rewritten in the file's
    own text, so it stands in for the file's needs, never for its triggers."""
    facts = [f for f in info.sibling_facts if called or f != "step_callers"]
    if not facts or not filename:
        return False
    from codemods.analysis.importers import step_callers
    from codemods.analysis.project import sibling_fact

    return any(bool(step_callers(filename, source)) if fact == "step_callers" else sibling_fact(filename, source, fact)
               for fact in facts)
