"""XLA302 in a step function: its barrier before the host reads that follow its optimizer step.

pyGAT's and pygcn's ``train(epoch)`` take the step, run the validation
forward and then print four ``.item()`` reads and return a fifth; the epoch
loop calls it, and its barrier (XLA302) ends the loop's body.  Every read
before that barrier runs a graph of its own -- the step's, then the
validation forward again for each value it did not compute: seven executions
an epoch.  The barrier goes into the function instead, right before the
first statement after its optimizer step that reads the host: the step, the
validation forward and every value the reads take are then one graph, and
the reads copy what it computed.  The loop calls a function that syncs on
every path, so it gets no barrier of its own.
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from codemods.analysis.loops import body_statements, last_optimizer_step
from codemods.analysis.step_tail import reads_host
from codemods.analysis.syncs import syncs_by_hand
from codemods.analysis.values import values as values_of
from codemods.barriers import STEP_BARRIER
from codemods.hot_path import HotPathCodemod
from codemods.syntax.tree import find_all

_NESTED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


class StepFunctionBarrier(HotPathCodemod):
    DESCRIPTION = "Sync a function run every step right before the host reads that follow its optimizer step."
    RULES = (STEP_BARRIER,)  # (XLA302's, documented with codemods.barriers.StepBarrier)
    TRIGGERS = (b"step",)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.CSTNode:
        at = self._site(original_node)
        if at is not None and self.flag(original_node.body.body[at], STEP_BARRIER.code,  # type: ignore[attr-defined]
                                        f"`{original_node.name.value}()` runs every step: `torch_xla.sync()` added "
                                        "before its first host read after the optimizer step (each read would run "
                                        "a graph of its own)", fix=True):
            self.add_imports(self.target.sync_imports)
            stmts: List[cst.BaseStatement] = list(updated_node.body.body)  # type: ignore[attr-defined]
            barrier = cst.SimpleStatementLine([cst.Expr(self.target.sync_node())])
            lead = stmts[at].leading_lines
            stmts[at] = stmts[at].with_changes(leading_lines=())
            stmts.insert(at, barrier.with_changes(leading_lines=lead))
            updated_node = updated_node.with_changes(body=updated_node.body.with_changes(body=stmts))
        return super().leave_FunctionDef(original_node, updated_node)

    def _site(self, fn: cst.FunctionDef) -> Optional[int]:
        """The index of the statement of ``fn``'s body the barrier goes before, or None."""
        if self.target.sync is None or id(fn) not in self.per_step() or not isinstance(fn.body, cst.IndentedBlock):
            return None
        if syncs_by_hand(self.tree, self.target.barrier_names, self.qualnames):  # type: ignore[arg-type]
            return None  # (its authors place the barriers)
        stmts = body_statements(fn)  # type: ignore[arg-type]
        if any(self.syncs(c) for c in find_all(fn.body, cst.Call)):  # type: ignore[arg-type]
            return None  # (a sync anywhere in it: its author's)
        k = last_optimizer_step(fn, self.steps, self.qualnames, values_of(self.tree))  # type: ignore[arg-type]
        if k is None:
            return None
        tensors = self.tensors
        for j in range(k + 1, len(stmts)):
            if any(reads_host(self.tree, c, tensors, self.qualnames, self._tensor_names)  # type: ignore[arg-type]
                   for c in find_all(stmts[j], cst.Call, stop=_NESTED)):
                return j
        return None


__all__ = ["StepFunctionBarrier"]
