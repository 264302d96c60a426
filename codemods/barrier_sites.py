"""Where XLA302 (``codemods.barriers``) puts the step barrier in a loop.

The questions the rule asks of a loop before it edits it, none of them an
edit: does the loop sync already (by hand, or through the module's author),
does it read the host after its optimizer step (the barrier then goes right
after that step, and what only computes tensors after it joins the step's
graph: ``analysis.step_tail``), does a pass that is no training step read
what it computed (the barrier goes before that read:
``analysis.pass_reads``), and does a step closure follow the barrier (then
another barrier ends the body).  A mixin of the rule: it reads the rule's
tree, tensors, qualified names and memo.
"""

from __future__ import annotations

from typing import Optional, Tuple

import libcst as cst

from codemods.analysis import Loop, has_barrier
from codemods.analysis.syncs import syncs_by_hand
from codemods.analysis.cuda import scope_of
from codemods.analysis.growth import whole_growth
from codemods.analysis.loops import body_statements, loop_step_kind
from codemods.analysis.pass_reads import PassReads, has_exit
from codemods.analysis.placement import host_read
from codemods.analysis.step_tail import StepTail, evaluation_read, reads_host, step_end, step_tail
from codemods.analysis.step_updates import update_call
from codemods.base import find_all
from codemods.syntax.hoist import ReadSite


class BarrierSites:
    """The rule's questions about where a loop's barrier goes (see the module doc)."""

    def _one_graph_generation(self, loop: Loop) -> bool:
        """A generation loop that feeds the model the whole sequence it grows
        a token a step (XLA408 reports it: no buffer can take it) and reads
        nothing on the host: with a barrier every step would compile a graph
        of a new shape; without one, the loop is one graph, compiled once for
        its count (bigram's ``generate``)."""
        if whole_growth(loop, self.qualnames, self.target.barrier_names) is None:
            return False
        calls = find_all(loop.body, cst.Call, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda))
        return not any(host_read(self.tree, c, self.tensors, self.qualnames) or self.is_step_closure(c)  # type: ignore[arg-type]
                       for c in calls)

    def _step_tail(self, loop: Loop, k: int) -> StepTail:
        """``analysis.step_tail`` for the barrier before statement ``k``, once
        per loop; a split's name is new to the function the loop runs in, and
        to the splits of the loops before it."""
        def compute() -> StepTail:
            scope = scope_of(loop, self.tree)
            taken = self._memo("names", scope, lambda: {n.value for n in find_all(scope, cst.Name)})
            tail = step_tail(self.tree, body_statements(loop), k, self.tensors, self.qualnames, set(taken))
            taken.update(name for _, name in tail.split.values())  # type: ignore[attr-defined]
            return tail
        return self._memo(f"step_tail:{k}", loop, compute)  # type: ignore[no-any-return]

    def _updated(self, loop: Loop, k: Optional[int]) -> bool:
        """The barrier before statement ``k`` follows an update of tensors
        after the optimizer step (``analysis.step_updates``)."""
        return bool(k) and update_call(self.tree, body_statements(loop)[k - 1], self.qualnames)  # type: ignore[index,operator]

    def _joins(self, loop: Loop, k: Optional[int]) -> bool:
        """Lines after a barrier before statement ``k`` join the step's graph."""
        return k is not None and bool(self._step_tail(loop, k))

    def _evaluation_read(self, loop: Loop, exits: Tuple[type, ...]) -> Optional[int]:
        """``analysis.step_tail.evaluation_read`` (a loop over a device loader:
        a step closure handed over after the barrier runs at the loader's
        sync, as it did with no barrier)."""
        return evaluation_read(self.tree, loop, self.steps, self.tensors, self.qualnames, self._tensor_names, exits)

    def _flushed_at_end(self, loop: Loop, k: Optional[int]) -> bool:
        """A barrier before statement ``k`` of a loop that is not over a
        device loader needs another at the end of the body: statements from
        ``k`` on hand a step closure over (a print deferred after the step,
        XLA210), which runs at the next barrier -- a pass late, and never
        for the last pass, without one.  The second barrier finds the pass's
        graph run already: it runs the closures and no graph."""
        return k is not None and self._closure_from(body_statements(loop), k)

    def _closure_from(self, stmts, k: int) -> bool:  # type: ignore[no-untyped-def]
        """``stmts[k:]`` hand a step closure over."""
        return any(self.is_step_closure(c) for s in stmts[k:]  # type: ignore[arg-type]
                   for c in find_all(s, cst.Call, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda)))

    def _synced(self, loop: Loop) -> bool:
        return has_barrier(loop, self.target.barrier_names, self.qualnames, self.syncing())

    def _after_optimizer_step(self, loop: Loop, exits: Tuple[type, ...]) -> Optional[int]:
        """Where the barrier goes when the loop reads a tensor on the host
        after its optimizer step (``print(loss.item())``, a histogram of
        the weights): right after that step -- and the LR scheduler's
        ``step()`` and ``zero_grad()`` that follow it -- as experts place
        it, so that the reads find the step computed instead of each running
        the step's pending graph (or a part of it) on its own.  None (the
        end of the body) when nothing after the step reads the host, or
        when a pass can go on to the next after it (``continue``: ``exits[0]``;
        a ``break`` or ``return`` after it, where the loop defers prints,
        gets a barrier of its own before it).  (A step closure handed over
        after it runs at the next barrier: :meth:`_flushed_at_end`.)"""
        stmts = body_statements(loop)
        k = step_end(self.tree, loop, self.steps, self.qualnames)
        if k is None:
            return None
        tail = stmts[k:]
        calls = [c for s in tail for c in find_all(s, cst.Call, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda))]
        if not tail or has_exit(tail, exits[:1]):
            return None  # (a `continue`; a break or return after it is flushed: _flushed_before_exits)
        if not any(reads_host(self.tree, c, self.tensors, self.qualnames, self._tensor_names)  # type: ignore[arg-type]
                   for c in calls):
            return None
        return k  # (what only computes tensors after it joins the step's graph: _after_step_joined)

    def _before_first_read(self, loop: Loop, exits: Tuple[type, ...]) -> Optional[ReadSite]:
        """Where the barrier goes in a loop that is not a training step (a
        sampler, a decoder fed its own output) and reads a value it computed
        on every pass (``out.append(nxt.item())``): right before that read,
        so that the read finds the pass computed.  At the end, the read runs
        the graph up to the value and the barrier the rest: two executions
        and two graphs to compile per pass (a GRU cell read once a step: 4
        compiles and 2 executions a step at 8 steps; 2 and 1 with the barrier
        before the read, the same values).  The read is of a name (what the
        pass computed), or an assignment whose read computes what it reads
        (``ims = torch.clamp(xt, -1, 1).cpu()``: computed before the barrier,
        :func:`~codemods.syntax.hoist.computed_then_read`), in a statement of
        the loop's own level every pass runs, or in each branch of an
        ``if``/``else`` there that decides on the host (pytorch/examples'
        word_language_model, one branch per kind of model), or before such
        an ``if`` where only some of its branches read; where it is:
        :class:`~codemods.analysis.pass_reads.PassReads`.  None where there
        is none, or where the body can end early (a step closure handed
        over after it: :meth:`_flushed_at_end`)."""
        if loop_step_kind(self.tree, loop, self.steps) == "step":
            return None
        stmts = body_statements(loop)
        if has_exit(stmts, exits + (cst.Break, cst.Return)):
            return None
        return PassReads(self.tree, self.tensors, self.qualnames).first(list(stmts))

    def _syncs_by_hand(self) -> bool:
        """The module already calls a barrier somewhere (``analysis.syncs.syncs_by_hand``)."""
        return syncs_by_hand(self.tree, self.target.barrier_names, self.qualnames)  # type: ignore[arg-type]

    def _defers(self, loop: Loop) -> bool:
        """The loop's own body hands work to step closures (deferred prints)."""
        return any(self.is_step_closure(c) for c in find_all(loop.body, cst.Call, stop=(cst.For, cst.While)))  # type: ignore[arg-type]
