"""XLA420: a random draw from a generator, on the device, where it runs every
step, is drawn on the generator's own device and moved.

torch_xla has no device generators, so a generator a program draws from on
the XLA device is a CPU one (XLA107 makes ``torch.Generator(device=...)``
one where the device is XLA's).  ``torch.randn(shape, generator=g,
device=xla)`` still works: the op falls back to the CPU (``aten::normal_``),
which first runs the step's pending graph to read the empty tensor it fills
-- a graph execution of its own every time, cutting the step in two (a
DDPM sampler's ``noise = torch.randn(x.shape, generator=self.generator,
device=device)``: two executions a step).  Drawn on the generator's device
and moved (``torch.randn(shape, generator=g, device=d if g is None else
g.device).to(d)``) it gives the same numbers -- the CPU generator's, which
the fallback drew as well -- with no fallback and no execution; where the
generator is on the device asked for (a CUDA one on CUDA, the CPU's on the
CPU) or is None, the draw is what it was.

Rewritten where the draw runs every step, its generator and device read
as names or attributes (or ``torch_xla.device()``: read twice, the same),
and no keyword
makes moving it differ (``out=``, ``requires_grad=``, ``pin_memory=``).
A draw from a generator whose input is a device tensor
(``torch.multinomial(probs, 1, generator=g)``, ``x.normal_(generator=g)``)
falls back the same way, but has no device to draw on instead: reported.
"""

from __future__ import annotations

import libcst as cst

from codemods.analysis.device_exprs import DeviceExprs
from codemods.base import Rule
from codemods.hot_path import HotPathCodemod
from codemods.syntax.nodes import dotted

# torch's random factories that take `generator=` and `device=`
_DRAWS = ("torch.randn", "torch.rand", "torch.randint", "torch.randperm")
# draws from a generator whose input is a tensor (their device is its): reported where it is on the device
_INPUT_DRAWS = ("torch.multinomial", "torch.bernoulli", "torch.poisson", "torch.normal")
_INPUT_METHODS = frozenset({"multinomial", "bernoulli", "bernoulli_", "normal_", "uniform_", "random_",
                            "exponential_", "geometric_", "log_normal_", "cauchy_"})
_KEPT_AS_MADE = frozenset({"out", "requires_grad", "pin_memory"})  # (a move would make another tensor than these ask)

CPU_GENERATOR_DRAW = Rule(
    code="XLA420",
    name="generator-draw-on-device",
    summary="a random draw from a generator on the device, every step (`torch.randn(s, generator=g, device=d)`), "
            "is drawn on the generator's device and moved",
    why=(
        "torch_xla has no device generators: the generator drawn from is a CPU one, and `torch.randn(shape, "
        "generator=g, device=xla)` falls back to the CPU (`aten::normal_`), running the step's pending graph "
        "first: a graph execution of its own every step, the step cut in two. Drawn on the generator's device "
        "and moved (`device=d if g is None else g.device` then `.to(d)`), it gives the same numbers, the CPU "
        "generator's, with no fallback; where the generator is on the device asked for, or None, the draw is "
        "what it was."
    ),
    before=(
        "import torch\n\nfor t in timesteps:\n    x = model(x, t)\n"
        "    x = x + torch.randn(x.shape, generator=gen, device=x.device)\n"
    ),
    after=(
        "import torch\n\nfor t in timesteps:\n    x = model(x, t)\n"
        "    x = x + torch.randn(x.shape, generator=gen, device=x.device if gen is None else gen.device).to(x.device)\n"
    ),
    valid=(
        # no generator, or none on a device: nothing falls back
        "import torch\n\nfor t in timesteps:\n    x = model(x, t) + torch.randn(x.shape, device=x.device)\n",
        "import torch\n\nfor t in timesteps:\n    x = model(x, t) + torch.randn(x.shape, generator=gen).to(x.device)\n",
        # a leaf that asks for its gradient: moved, it would be another tensor
        "import torch\n\nfor t in timesteps:\n"
        "    z = torch.randn(4, generator=gen, device=d, requires_grad=True)\n    step(z)\n",
    ),
)


class GeneratorDraws(HotPathCodemod):
    DESCRIPTION = "Draw from a generator on its own device and move the numbers, where the draw runs every step."
    RULES = (CPU_GENERATOR_DRAW,)
    TRIGGERS = (b"generator=",)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.is_qualname(original_node.func, *_DRAWS):
            self._input_draw(original_node)
            return updated_node
        keywords = {a.keyword.value: a.value for a in original_node.args if a.keyword is not None}
        generator, device = keywords.get("generator"), keywords.get("device")
        if generator is None or device is None or _KEPT_AS_MADE & set(keywords) or any(a.star for a in original_node.args):
            return updated_node
        if _none(generator) or _none(device) or dotted(generator) is None or not (
                dotted(device) is not None or DeviceExprs(self.tree, self.qualnames).xla_device(device)):
            return updated_node  # (each written into the new code as it is: names and attributes, read twice the same)
            return updated_node
        where = self._where()
        if where is None:
            return updated_node
        g, d = self.code_of(generator), self.code_of(device)
        if not self.flag(original_node, CPU_GENERATOR_DRAW.code, f"a draw from generator `{g}` on `{d}`: torch_xla's "
                         "generators are CPU ones, and the draw falls back to the CPU, a graph execution of its own "
                         f"-> drawn on `{g}.device` and moved to `{d}` (the same numbers); {where}", fix=True, hot=True):
            return updated_node
        on_its_own = cst.parse_expression(f"{d} if {g} is None else {g}.device")
        args = [a.with_changes(value=on_its_own) if a.keyword is not None and a.keyword.value == "device" else a
                for a in updated_node.args]
        moved = cst.Attribute(value=updated_node.with_changes(args=args), attr=cst.Name("to"))
        return cst.Call(func=moved, args=[cst.Arg(cst.parse_expression(d))])

    def _input_draw(self, call: cst.Call) -> None:
        """``torch.multinomial(probs, 1, generator=g)``, ``x.normal_(generator=g)``, ``probs`` or ``x`` on the device."""
        keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        if "generator" not in keywords or _none(keywords["generator"]):
            return
        func = call.func
        if self.is_qualname(func, *_INPUT_DRAWS) and call.args and call.args[0].keyword is None:
            drawn_from = call.args[0].value
        elif isinstance(func, cst.Attribute) and func.attr.value in _INPUT_METHODS and not self.qualnames(func):
            drawn_from = func.value
        else:
            return
        if self._on_device(drawn_from):
            g = self.code_of(keywords["generator"])
            self._report(call, CPU_GENERATOR_DRAW, f"a draw from generator `{g}` on device tensor "
                         f"`{self.code_of(drawn_from)}`: torch_xla's generators are CPU ones, and the draw falls back "
                         "to the CPU, a graph execution of its own: without the generator the device draws from "
                         "`torch_xla.manual_seed`'s stream (other numbers), with it the draw costs that execution")

    def code_of(self, node: cst.CSTNode) -> str:
        return self.tree.module.code_for_node(node)


def _none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"
