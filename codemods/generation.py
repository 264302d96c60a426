"""XLA414: a generation loop that lengthens its sequence by one token a step
and feeds the model a window of it (``idx_cond = idx[:, -block_size:]``)
writes each token into a buffer of the final length instead.

``idx = torch.cat((idx, idx_next), dim=1)`` gives ``idx`` a new shape every
step, and every graph that reads it compiles again: minGPT's ``generate``
compiles once per token for all 500 tokens chargpt samples (on XLA's CPU
backend the process runs out of memory for compiled code first).  Once the
sequence is longer than the window, the model's input has a fixed shape --
only the sequence around it grows.  Written into a buffer of the final
length (``idx.new_zeros`` after the prompt, filled by ``index_copy_`` at the
position sent to the device) with the window gathered at positions sent to
the device, every step past the window runs one graph: compiles stop
growing once the sequence is longer than the window.  The tokens, the
model's inputs and the result are the same as before.

Rewritten only where that is exact (``codemods.analysis.growth.token_growth``):
``for _ in range(n)`` (a ``break`` or ``continue`` may skip the growth: the
sequence after the loop is the buffer's filled part), the growth its last
statement (barriers may follow), one token drawn as one column
(``multinomial(p, num_samples=1)``, ``argmax(..., keepdim=True)`` or ``topk(...,
k=1)`` of the last position's row, which top-k filtering or a temperature in
an ``if`` may change but keep a row: LLMs-from-scratch's ``generate``), and the sequence read in the loop only
as a whole, as ``.size(1)``/``.shape[1]`` or as its last ``n`` columns
(``idx[:, -n:]``), at least once so.  A loop that feeds the model the whole
sequence stays reported (XLA408): padding it to a fixed length is exact only
for a causal model, which the code does not show.
"""

from __future__ import annotations

from typing import Dict

import libcst as cst

from codemods.analysis.growth import sequence_reads, windowed_growth
from codemods.analysis.loops import module_facts
from codemods.analysis.prefilter import STEP_LOOP
from codemods.base import Rule
from codemods.loop_codemod import LoopCodemod
from codemods.syntax import imports

GENERATION_WINDOW = Rule(
    code="XLA414",
    name="generation-window",
    summary="a generation loop that grows its sequence with `torch.cat` and feeds the model a window of it writes "
            "into a buffer of the final length",
    why=(
        "`idx = torch.cat((idx, idx_next), dim=1)` gives `idx` a new shape every step, and every graph that reads "
        "it compiles again: one compile per generated token, even once the model sees only its last "
        "`block_size` tokens. Written into a buffer of the final length at a position sent to the device, with "
        "the window gathered at positions sent to the device, every step past the window runs the same graph: "
        "compiles stop growing at the window's length. The tokens and the model's inputs are the same."
    ),
    before=(
        "import torch\n\nfor _ in range(max_new_tokens):\n    logits = model(idx[:, -block_size:])\n"
        "    idx_next = torch.multinomial(torch.softmax(logits[:, -1, :], dim=-1), num_samples=1)\n"
        "    idx = torch.cat((idx, idx_next), dim=1)\n"
    ),
    after=(
        "import torch\n\nidx_length = idx.size(1)\n"
        "idx_buffer = torch.cat((idx, idx.new_zeros((idx.size(0), max(max_new_tokens, 0), *idx.shape[2:]))), dim=1)\n"
        "for _ in range(max_new_tokens):\n"
        "    logits = model(idx_buffer[:, torch.arange(min(idx_length, block_size), device=idx_buffer.device) + "
        "torch.tensor([max(idx_length - block_size, 0)], device=idx_buffer.device)])\n"
        "    idx_next = torch.multinomial(torch.softmax(logits[:, -1, :], dim=-1), num_samples=1)\n"
        "    idx_buffer.index_copy_(1, torch.tensor([idx_length], device=idx_buffer.device), idx_next)\n"
        "    idx_length += 1\nidx = idx_buffer[:, :idx_length]\n"
    ),
    valid=(
        # the whole sequence goes to the model: padding it is exact only for a causal model (XLA408)
        "import torch\n\nfor _ in range(n):\n    logits = model(idx)\n"
        "    nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)\n    idx = torch.cat((idx, nxt), dim=1)\n",
        # two tokens a step: the buffer holds one a step
        "import torch\n\nfor _ in range(n):\n    logits = model(idx[:, -8:])\n"
        "    nxt = torch.multinomial(torch.softmax(logits[:, -1, :], dim=-1), num_samples=2)\n"
        "    idx = torch.cat((idx, nxt), dim=1)\n",
    ),
)


class GenerationWindow(LoopCodemod):
    DESCRIPTION = "Write a generated sequence read through a window into a buffer of its final length."
    RULES = (GENERATION_WINDOW,)
    TRIGGERS = (b"cat",)
    NEEDS = (STEP_LOOP,)

    def regions(self, tree):
        # (the loops it may rewrite: step loops, found as `is_step_loop` finds them)
        return [loop for loop in module_facts(tree).step_loops if isinstance(loop, cst.For)]

    def rewrite_loop(self, original, updated):  # type: ignore[no-untyped-def]
        if not isinstance(original, cst.For) or not self.is_step_loop(original) or not updated.deep_equals(original):
            return updated
        growth = windowed_growth(original, self.qualnames, self.target.barrier_names)
        reads = sequence_reads(original, growth) if growth is not None else None
        if growth is None or reads is None:
            return updated
        seq = growth.sequence
        if not self.flag(growth.grows.body[0], GENERATION_WINDOW.code,  # type: ignore[attr-defined]
                         f"`{seq}` grows by one token a step and the model reads its last tokens: written into a "
                         "buffer of its final length instead, one graph for every step past the window", fix=True):
            return updated
        imports.need(self.context, "torch")
        buf, cur = self.tree.unused_name(f"{seq}_buffer"), self.tree.unused_name(f"{seq}_length")
        code = cst.Module([]).code_for_node
        new: Dict[int, cst.BaseExpression] = {id(n): cst.Name(cur) for n in reads.length}
        new.update({id(n): cst.parse_expression(f"{buf}[:, :{cur}]") for n in reads.whole})
        for node, n in reads.windows:
            size = code(n) if isinstance(n, (cst.Name, cst.Attribute, cst.Integer)) else f"({code(n)})"
            new[id(node)] = cst.parse_expression(
                f"{buf}[:, torch.arange(min({cur}, {size}), device={buf}.device) + "
                f"torch.tensor([max({cur} - {size}, 0)], device={buf}.device)]")
        grows = growth.grows
        token = grows.body[0].value.args[0].value.elements[1].value.value  # type: ignore[attr-defined]
        copy = cst.parse_statement(f"{buf}.index_copy_(1, torch.tensor([{cur}], device={buf}.device), {token})\n")
        copy = copy.with_changes(leading_lines=grows.leading_lines, trailing_whitespace=grows.trailing_whitespace)
        replaced = {id(grows): cst.FlattenSentinel([copy, cst.parse_statement(f"{cur} += 1\n")])}
        body = original.body.visit(_Replace(new, replaced))
        steps = code(growth.steps)
        before = [cst.parse_statement(f"{cur} = {seq}.size(1)\n").with_changes(leading_lines=original.leading_lines),
                  cst.parse_statement(f"{buf} = torch.cat(({seq}, {seq}.new_zeros(({seq}.size(0), max({steps}, 0), "
                                      f"*{seq}.shape[2:]))), dim=1)\n")]
        loop = updated.with_changes(body=body, leading_lines=[])
        return cst.FlattenSentinel([*before, loop, cst.parse_statement(f"{seq} = {buf}[:, :{cur}]\n")])


class _Replace(cst.CSTTransformer):
    """Each expression and statement of ``new``/``statements`` (by the id of
    the original node) replaced; nothing inside them is visited."""

    def __init__(self, new: Dict[int, cst.BaseExpression], statements: Dict[int, cst.CSTNode]) -> None:
        super().__init__()
        self.new, self.statements = new, statements

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) not in self.new and id(node) not in self.statements

    def on_leave(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        key = id(original_node)
        return self.new[key] if key in self.new else self.statements[key] if key in self.statements else updated_node


__all__ = ["GenerationWindow", "GENERATION_WINDOW"]
