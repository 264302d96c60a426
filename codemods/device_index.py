"""XLA411: a device table indexed by a Python int that changes every step is
indexed with the int sent to the device instead.

``alphas[t]`` on an XLA tensor is a ``select`` whose index is part of the
graph, so a sampling loop ``for t, t_next in zip(times[:-1], times[1:])``
compiles one graph per step (5 -> 9 compiles at 4 -> 8 steps, XLA's CPU
backend).  ``alphas[torch.tensor([t], device=alphas.device)][0]`` sends the
int as a one-element device tensor: the same values, one graph for every
step (3 -> 3).  A zero-dimensional tensor would not do: torch_xla folds it
into the graph as a constant (6 -> 10).

Rewritten only where it is safe to: a read (not an assignment target) of a
table that lives on the device (``codemods.analysis.placement``), named by a
name or an attribute, indexed by one plain int expression of a counter
(``codemods.analysis.counters``) of the step or loader loop it runs in, or of
a loop around it.  A counter of a loop *inside* the step (a decoder unrolled
over time) is part of one graph already and is left as it is; so is an
index reached through a call (XLA407 reports it).
"""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from codemods.loop_codemod import LoopCodemod
from codemods.analysis.counters import loop_counters
from codemods.analysis.placement import on_device
from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP
from codemods.base import Rule, find_all
from codemods.syntax import imports
from codemods.syntax.nodes import is_stored, walk

DEVICE_INDEX = Rule(
    code="XLA411",
    name="device-index",
    summary="a device table indexed by a step's Python int (`alphas[t]`) is indexed with the int sent to the device",
    why=(
        "XLA traces `alphas[t]` as a `select` whose index is a constant of the graph: a loop whose `t` changes "
        "every step compiles a new graph every step (5 -> 9 compiles at 4 -> 8 steps of a sampler, XLA's CPU "
        "backend). Sending the int as a one-element device tensor, "
        "`alphas[torch.tensor([t], device=alphas.device)][0]`, makes it data: the same values, one graph for "
        "every step (3 -> 3). Only reads of a table on the device, indexed by an int of the step loop (or a "
        "loop around it), are rewritten; the rest of XLA407 stays reported."
    ),
    before=(
        "import torch\n\nalphas = torch.linspace(0.9, 0.1, 11).cuda()\nx = torch.randn(4).cuda()\n"
        "for t in range(10):\n    x = model(x) * alphas[t + 1]\n"
    ),
    after=(
        "import torch\n\nalphas = torch.linspace(0.9, 0.1, 11).cuda()\nx = torch.randn(4).cuda()\n"
        "for t in range(10):\n    x = model(x) * alphas[torch.tensor([t + 1], device=alphas.device)][0]\n"
    ),
    valid=(
        # a host list, and a loop inside the step (one graph already)
        "import torch\n\ntimes = list(range(10))\nfor t in range(9):\n    x = model(x) * times[t]\n",
        "import torch\n\nw = torch.ones(5).cuda()\nfor x in loader:\n    loss = 0\n    for k in range(5):\n"
        "        loss = loss + model(x).sum() * w[k]\n    loss.backward()\n    opt.step()\n",
    ),
)

# what a plain int index may be made of: names, numbers and arithmetic (never a tensor or a call)
_PLAIN = (cst.Name, cst.Integer, cst.BinaryOperation, cst.UnaryOperation, cst.Attribute, cst.Dot, cst.Add, cst.Subtract,
          cst.Multiply, cst.FloorDivide, cst.Modulo, cst.Minus, cst.Plus, cst.SimpleWhitespace,
          cst.ParenthesizedWhitespace, cst.LeftParen, cst.RightParen, cst.TrailingWhitespace, cst.Newline,
          cst.EmptyLine, cst.Comment)


class DeviceIndex(LoopCodemod):
    DESCRIPTION = "Index device tables with a step's Python int sent to the device (one graph for every step)."
    RULES = (DEVICE_INDEX,)
    TRIGGERS = (b"[",)
    NEEDS = (STEP_LOOP, LOADER_LOOP)

    def _step_counters(self) -> Set[str]:
        """The ints that change every step: counters of the innermost step or
        loader loop and of the loops around it (not of loops inside it)."""
        hot = [k for k, (_, step, loader) in enumerate(self.loop_stack) if step or loader]
        if not hot or self.closure_depth:
            return set()
        return set().union(*(loop_counters(self.tree, loop) for loop, _, _ in self.loop_stack[:hot[-1] + 1]
                             if isinstance(loop, cst.For)))

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        index = self._index(original_node)
        if index is None:
            return updated_node
        counters = self._step_counters()
        used = {n.value for n in find_all(index, cst.Name)}
        hit = sorted(used & counters)
        if not hit or used & self.tensors or is_stored(original_node, self.ancestors(original_node)) \
                or self._in_function_below_loop(original_node):
            return updated_node
        table = original_node.value
        if not on_device(self.tree, table, self.tensors):
            return updated_node
        code = cst.Module([]).code_for_node
        if not self.flag(original_node, DEVICE_INDEX.code, f"`{code(original_node)}` indexes a device table with "
                         f"the step's Python int `{hit[0]}` (a new graph each step): indexed with it sent to the "
                         "device, one graph for every step", fix=True):
            return updated_node
        imports.need(self.context, "torch")
        sent = cst.parse_expression(f"torch.tensor([{code(index)}], device={code(table)}.device)")
        gathered = updated_node.with_changes(slice=[cst.SubscriptElement(cst.Index(sent))])
        return cst.Subscript(value=gathered, slice=[cst.SubscriptElement(cst.Index(cst.Integer("0")))])

    @staticmethod
    def _index(node: cst.Subscript) -> Optional[cst.BaseExpression]:
        """The one plain int expression ``node`` indexes with (``t``,
        ``t + 1``, ``i - self.offset``) on a table named by a name or an
        attribute; None for anything else (slices, tuples, tensors, calls)."""
        if not isinstance(node.value, (cst.Name, cst.Attribute)) or len(node.slice) != 1:
            return None
        part = node.slice[0].slice
        if not isinstance(part, cst.Index) or part.star is not None:
            return None
        if not all(isinstance(n, _PLAIN) for n in walk(part.value)):
            return None
        return part.value

    def _in_function_below_loop(self, node: cst.CSTNode) -> bool:
        """A function or lambda between ``node`` and its loop: it runs when
        called, not where it stands."""
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.For, cst.While)):
                return False
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return True
        return False


__all__ = ["DeviceIndex", "DEVICE_INDEX"]
