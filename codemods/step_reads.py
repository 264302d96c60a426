"""XLA417: the host reads between a step's forward and its backward follow its optimizer step.

``losses.update(loss.item(), n)`` before ``loss.backward()`` (pytorch/examples'
imagenet) runs the forward as a graph of its own; the backward and the step
are another, and they compute the forward again: two executions a step.  The
step's own lines move before the reads (``analysis.step_head`` says when
that changes no value a line reads); the barrier then goes between the step
and the reads (XLA302): one execution a step.
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from codemods.analysis.loops import Loop
from codemods.analysis.syncs import is_barrier_call, tests_xla
from codemods.analysis.step_head import step_head
from codemods.analysis.values import values as values_of
from codemods.base import Rule
from codemods.loop_codemod import StepBodyCodemod

READS_AFTER_STEP = Rule(
    code="XLA417",
    name="reads-after-step",
    summary="a host read between the step's forward and its backward (`losses.update(loss.item())`) moves after "
            "the optimizer step",
    why=(
        "On XLA a host read runs the pending graph. Between the forward and the backward, `loss.item()` runs the "
        "forward as a graph of its own; the backward and the optimizer step are a second graph, which computes the "
        "forward again: two executions a step, and the forward twice. The step's own lines (`zero_grad`, "
        "`backward`, the optimizer's or scaler's `step`, a gradient clip, a scaler object called with the loss and "
        "the optimizer as timm's `NativeScaler` is, and a plain host assignment only they take) change the "
        "parameters, their gradients and the optimizer's state, and no value the reads take: they move before the "
        "reads, the step's barrier goes between (XLA302; or the program's own barrier right after the step moves "
        "with it: DeiT's converted `torch.cuda.synchronize()`), and each step is one execution. A check that stops "
        "the program on a non-finite loss (`sys.exit(1)`) then stops it after that step is taken, unsaved as "
        "before. Rewritten only where the lines moved over use none of the "
        "step's objects (the loss only for its value, never its `.grad`), call no model or anything the body called "
        "on its way to the loss, no method of `self` and no function of the module that does more than compute "
        "tensors, bind nothing the step uses, cannot leave the body, and are simple lines or `if` blocks of such "
        "decided on the host; and only where no read before the step is left."
    ),
    before=(
        "import torch\n\ndef train(model, loader, opt, meter):\n    for x, y in loader:\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        meter.update(loss.item(), x.size(0))\n        opt.zero_grad()\n        loss.backward()\n"
        "        opt.step()\n"
    ),
    after=(
        "import torch\n\ndef train(model, loader, opt, meter):\n    for x, y in loader:\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
        "        meter.update(loss.item(), x.size(0))\n"
    ),
    valid=(
        # the read runs the model again: after the step it would see the new weights
        "import torch\n\ndef train(model, loader, opt, meter):\n    for x, y in loader:\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        meter.update(model(x).sum().item())\n        loss.backward()\n        opt.step()\n",
    ),
)


class ReadsAfterStep(StepBodyCodemod):
    DESCRIPTION = "Move the host reads between a step's forward and its backward after its optimizer step."
    RULES = (READS_AFTER_STEP,)
    TRIGGERS = (b"backward", b"scaler", b"Scaler")  # (a scaler called with the optimizer: steps.SCALER_CALL_RE)

    def rewrite_body(self, original: Loop, before: List[cst.BaseStatement],
                     stmts: List[cst.BaseStatement]) -> Optional[List[cst.BaseStatement]]:
        head = step_head(self.tree, original, self.steps, self.tensors, self.qualnames, self._tensor_names,
                         values_of(self.tree), self.is_step_closure)
        if head is None:
            return None
        read = self.tree.module.code_for_node(before[head.start].with_changes(leading_lines=())).strip().splitlines()[0]
        # the program's own barrier right after the step (DeiT's `torch.cuda.synchronize()`, converted) goes
        # with it, so that the reads follow that one: a barrier changes no value
        end = head.end + 1 if head.end < len(before) and self._barrier_line(before[head.end]) else head.end
        also = " and the barrier after them" if end > head.end else ""
        if not self.flag(before[head.start], READS_AFTER_STEP.code,
                         f"`{read}` reads the host between the step's forward and its backward: the step's lines"
                         f"{also} moved before it, so that it follows the step (one graph execution a step, not two)",
                         fix=True):
            return None
        return [*stmts[:head.start], *stmts[head.first:end], *stmts[head.start:head.first], *stmts[end:]]

    def _barrier_line(self, stmt: cst.CSTNode) -> bool:
        """A statement that only syncs: ``torch_xla.sync()``, ``xm.mark_step()``,
        or such lines under a test that is true on XLA (``if device.type ==
        "xla":``, a converted CUDA test)."""
        if isinstance(stmt, cst.SimpleStatementLine):
            return all(isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)
                       and is_barrier_call(s.value, self.target.barrier_names, self.qualnames) for s in stmt.body)
        if isinstance(stmt, cst.If) and stmt.orelse is None and tests_xla(stmt.test):
            body = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else [stmt.body]
            return all(self._barrier_line(s) for s in body)
        return False


__all__ = ["ReadsAfterStep", "READS_AFTER_STEP"]
