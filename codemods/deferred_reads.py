"""XLA418: a number a step reads before its optimizer step, and uses only after it, is read after it.

``D_x = output.mean().item()`` between DCGAN's backward passes runs, on
XLA, the part of the step it needs as a graph of its own; three such reads
make four executions a step.  The tensor stays where it is computed, in a
name of its own (``D_x_step = output.mean()``: part of the step's graph),
and is read right after the optimizer step (``D_x = D_x_step.item()``),
where the step's barrier goes (XLA302): one execution a step.  A read of a
name (``value = loss.item()``) moves there whole.  ``analysis.deferred_reads`` says which
reads change no value by this.
"""

from __future__ import annotations

from typing import List, Optional, Set

import libcst as cst

from codemods.analysis.cuda import scope_of
from codemods.analysis.deferred_reads import deferred_reads
from codemods.analysis.step_tail import fresh_name
from codemods.analysis.loops import Loop
from codemods.base import Rule, find_all
from codemods.loop_codemod import StepBodyCodemod

DEFERRED_READ = Rule(
    code="XLA418",
    name="deferred-read",
    summary="a number read before the optimizer step and used only after it (`D_x = out.mean().item()`) is read "
            "after the step",
    why=(
        "On XLA a host read runs the pending graph: a read in the middle of a step (DCGAN's `D_x = "
        "output.mean().item()` after the discriminator's backward) runs the part of the step it needs as a graph "
        "of its own, and the step's barrier runs the step again with it; three such reads make four executions a "
        "step. Where the number is used only after the optimizer step, the tensor is computed where it was, into a "
        "name of its own (`D_x_step = output.mean()`, in the step's graph), and read right after the step (`D_x = "
        "D_x_step.item()`), after the step's barrier (XLA302): one execution, the same number; a read of a loss "
        "(`value = loss.item()`) moves there whole. Rewritten only where the tensor is computed on the line (not a "
        "view the step could change) or is a name bound to such a computation or to a `torch.nn` loss's that "
        "nothing between touches but its `backward()`, nothing between uses or binds the number's name or can "
        "leave the body, and no function of the scope that could run between names it."
    ),
    before=(
        "import torch\n\ndef train(model, loader, opt):\n    for x, y in loader:\n"
        "        out = model(x)\n        loss = torch.nn.functional.cross_entropy(out, y)\n"
        "        loss.backward()\n        mean = out.mean().item()\n        opt.step()\n"
        "        print(loss.item(), mean)\n"
    ),
    after=(
        "import torch\n\ndef train(model, loader, opt):\n    for x, y in loader:\n"
        "        out = model(x)\n        loss = torch.nn.functional.cross_entropy(out, y)\n"
        "        loss.backward()\n        mean_step = out.mean()\n        opt.step()\n        mean = mean_step.item()\n"
        "        print(loss.item(), mean)\n"
    ),
    valid=(
        # the number decides what the step does: it is needed before the step
        "import torch\n\ndef train(model, loader, opt):\n    for x, y in loader:\n"
        "        out = model(x)\n        loss = out.sum()\n        loss.backward()\n"
        "        mean = out.mean().item()\n        if mean > 1:\n            opt.zero_grad()\n        opt.step()\n",
        # a weight's value, read before the step changes it in place
        "import torch\n\ndef train(model, loader, opt):\n    for x, y in loader:\n"
        "        model(x).sum().backward()\n        w = model.weight[0, 0].item()\n        opt.step()\n"
        "        print(w)\n",
    ),
)


class DeferredReads(StepBodyCodemod):
    DESCRIPTION = "Read the numbers a step reads before its optimizer step, and uses only after it, after the step."
    RULES = (DEFERRED_READ,)
    TRIGGERS = (b".item()",)

    def rewrite_body(self, original: Loop, before: List[cst.BaseStatement],
                     stmts: List[cst.BaseStatement]) -> Optional[List[cst.BaseStatement]]:
        found = deferred_reads(self.tree, original, self.steps, self.tensors, self.qualnames)
        if found is None:
            return None
        scope = scope_of(original, self.tree)
        taken = self._memo("names", scope, lambda: {n.value for n in find_all(scope, cst.Name)})  # type: ignore[attr-defined]
        reads: List[cst.BaseStatement] = []
        gone: Set[int] = set()
        for read in found.reads:
            line = stmts[read.index]
            small = line.body[0]  # type: ignore[attr-defined]
            value = small.value  # (as the rules before this one left it)
            if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                    and value.func.attr.value == "item") or not self.flag(
                    before[read.index], DEFERRED_READ.code,
                    f"`{read.name}` is read on the host before the optimizer step and used only after it: "
                    f"{_HOW[isinstance(read.tensor, cst.Name)]} (one graph execution a step)", fix=True):
                continue
            if isinstance(read.tensor, cst.Name):  # `value = loss.item()`: the line itself moves
                gone.add(read.index)
                reads.append(line)
                continue
            name = fresh_name(f"{read.name}_step", taken)
            taken.add(name)  # (`d_x_step = output.mean()` here, `d_x = d_x_step.item()` after the step)
            stmts[read.index] = line.with_changes(body=[cst.Assign(  # type: ignore[attr-defined]
                targets=[cst.AssignTarget(cst.Name(name))], value=value.func.value)])
            reads.append(cst.parse_statement(f"{read.name} = {name}.item()\n"))
        if not reads:
            return None
        return [s for k, s in enumerate(stmts[:found.end]) if k not in gone] + reads + stmts[found.end:]


_HOW = {False: "the tensor is computed here, into a name of its own, and read after the step",
        True: "the read moves after the step (the tensor is the same)"}


__all__ = ["DEFERRED_READ", "DeferredReads"]
