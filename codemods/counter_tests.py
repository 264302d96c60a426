"""XLA415: a test of the step's counter, handed to a function as a device
tensor, compares its host copy.

explainingai-code/DDPM-Pytorch's sampling loop hands its scheduler the
counter as a device tensor, ``sample_prev_timestep(xt, noise_pred,
torch.as_tensor(i).to(device))``, and the scheduler asks ``if t == 0:``.
On XLA ``t == 0`` is a graph of its own that the ``if`` runs and reads back
before the step's graph: two graph executions a step where one would do.
``torch.as_tensor(t).cpu() == 0`` copies the tensor the loop sent (data the
device holds, no graph to run) and compares on the host: the same answer, and
for an int (another caller handing the counter as it is) the same too.

Rewritten only where it is known: a comparison of the parameter itself with
a number (``t == 0``, ``t > 0``), read as a bool (an ``if``, ``while``,
conditional expression or ``assert`` test, or a part of one joined by
``and``/``or``/``not``), in a function that a step or loader loop (of the
module, or of another project module: ``codemods.step_callers``) hands a
tensor made from its counter and sent to a device (another call handing an
int gets the same answer from the copy); the parameter never bound again in
the function.  A tensor computed on the device (``timesteps[i]``)
would run its graph to be copied: left as it is.
"""

from __future__ import annotations

from typing import Dict, Tuple

import libcst as cst

from codemods.analysis.counters import host_tests, sent_to_device
from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP
from codemods.base import Rule, find_all
from codemods.loop_codemod import LoopCodemod
from codemods.step_callers import counter_calls
from codemods.syntax import imports
from codemods.syntax.nodes import param_names

COUNTER_TEST = Rule(
    code="XLA415",
    name="device-counter-test",
    summary="a test of the step's counter handed as a device tensor (`if t == 0:`) compares its host copy",
    why=(
        "A step loop that hands a function its counter as a device tensor (`torch.as_tensor(i).to(device)`, a "
        "DDPM scheduler's `sample_prev_timestep`) makes `if t == 0:` there a graph of its own, run and read back "
        "before the step's graph: two graph executions a step (XLA's CPU backend). "
        "`torch.as_tensor(t).cpu() == 0` copies the data the loop sent (no graph runs) and compares on the host: "
        "the same answer, for an int as well, one execution a step. Only a comparison of the parameter itself "
        "with a number, read as a bool, where a step loop hands the function a tensor made from its counter "
        "and sent to a device."
    ),
    before=(
        "import torch\n\n\ndef step(x, t):\n    if t == 0:\n        return x\n    return x * 0.5\n\n\n"
        "x = torch.ones(3).cuda()\nfor i in reversed(range(10)):\n    x = step(model(x), torch.as_tensor(i).cuda())\n"
    ),
    after=(
        "import torch\n\n\ndef step(x, t):\n    if torch.as_tensor(t).cpu() == 0:\n        return x\n"
        "    return x * 0.5\n\n\n"
        "x = torch.ones(3).cuda()\nfor i in reversed(range(10)):\n    x = step(model(x), torch.as_tensor(i).cuda())\n"
    ),
    valid=(
        # the counter handed as an int: compared on the host already
        "import torch\n\n\ndef step(x, t):\n    if t == 0:\n        return x\n    return x * 0.5\n\n\n"
        "x = torch.ones(3).cuda()\nfor i in reversed(range(10)):\n    x = step(model(x), i)\n",
        # a tensor the step computes on the device: copying it runs its graph all the same
        "import torch\n\n\ndef step(x, t):\n    if t == 0:\n        return x\n    return x * 0.5\n\n\n"
        "x = torch.ones(3).cuda()\ntimes = torch.arange(10).cuda()\nfor i in range(10):\n"
        "    x = step(model(x), times[i])\n",
    ),
)


class CounterTests(LoopCodemod):
    DESCRIPTION = "Compare the host copy of a step's counter handed to a function as a device tensor."
    RULES = (COUNTER_TEST,)
    TRIGGERS = (b"if ", b"assert ", b"while ")
    NEEDS = (STEP_LOOP, LOADER_LOOP)
    SIBLING_FACTS = ("step_callers",)  # (a scheduler's method that another module's sampling loop calls)

    def regions(self, tree):
        return [comparison for comparison, _ in self._tests().values()]

    def _tests(self) -> Dict[int, Tuple[cst.Comparison, str]]:
        """id of each comparison to rewrite -> it and the parameter it tests,
        where a call of its function hands the parameter a tensor made from
        a counter and sent to a device (the rewrite keeps an int's answer too)."""
        memo = self.tree.memo.get("counter_tests")
        if memo is not None:
            return memo  # type: ignore[return-value]
        helpers = {fn.name.value for fn in find_all(self.tree.module, cst.FunctionDef)  # type: ignore[attr-defined]
                   if _tests_a_parameter(fn)}  # (a cheap look first)
        found: Dict[int, Tuple[cst.Comparison, str]] = {}
        for hit in counter_calls(self, helpers):
            for comparison, param in hit.tests:
                if sent_to_device(hit.passed[param]):
                    found[id(comparison)] = (comparison, param)
        self.tree.memo["counter_tests"] = found
        return found

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.BaseExpression:
        test = self._tests().get(id(original_node))
        if test is None:
            return updated_node
        param = test[1]
        code = cst.Module([]).code_for_node
        if not self.flag(original_node, COUNTER_TEST.code, f"`{code(original_node)}` reads `{param}`, the counter a "
                         "step loop hands this function as a device tensor, on the host: a graph of its own each "
                         f"step; compared on its host copy, `torch.as_tensor({param}).cpu()`, no graph", fix=True):
            return updated_node
        imports.need(self.context, "torch")
        copy = cst.parse_expression(f"torch.as_tensor({param}).cpu()")
        if isinstance(updated_node.left, cst.Name) and updated_node.left.value == param:
            return updated_node.with_changes(left=copy)
        target = updated_node.comparisons[0]
        return updated_node.with_changes(comparisons=[target.with_changes(comparator=copy)])


def _tests_a_parameter(fn: cst.FunctionDef) -> bool:
    """Does ``fn`` test one of its parameters against a number?"""
    return bool(host_tests(fn, param_names(fn)))


__all__ = ["CounterTests", "COUNTER_TEST"]
