"""XLA424: a device tensor sliced every step at offsets drawn from the
host's random numbers (a random crop) -- in the step's own code, or by a
function it calls with the tensor: reported, with where the slice is and
the fix.

XLA bakes a slice's bounds into the graph, so every offset drawn is another
graph to compile, and compiles grow with the steps until every offset has
been met (on Lornatang/SRGAN-PyTorch, whose ``train_net.py`` crops the batch
on the device with ``imgproc.random_crop_torch``: 12 -> 18 compiles at 4 ->
8 steps; 6 -> 8 with the fix below, the rest its random rotations and
flips).  The fix changes where or how the crop is taken, not what it
takes: crop on the host, in the ``Dataset`` before the batch moves to the
device, or select on the device with an index made on the host
(``x.index_select(2, (torch.arange(size) + top).to(x.device))``: the
offset travels as data, one graph; ``torch.arange(size, device=...) + top``
would not do, a 0 or a 1 added on the device is folded into the graph).  Which of these keeps the program's
meaning (a crop that may run past the edge, a view written through) is not
read from the code, so the rule only reports: at the slice, or at the call
of a function of this module or of another module of the project that
slices what it is handed so, naming the function's file and line
(``codemods.analysis.random_slices``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Tuple

import libcst as cst

from codemods.analysis.dataflow import dataflow
from codemods.analysis.project import imported_from
from codemods.analysis.random_slices import RandomSlice, slicing_functions, slicing_functions_of
from codemods.analysis.steps import HOST_DRAWS
from codemods.base import Rule, walk
from codemods.hot_path import HotPathCodemod
from codemods.syntax.nodes import source_of

RANDOM_SLICE = Rule(
    code="XLA424",
    name="host-random-slice",
    summary="a device tensor sliced every step at offsets drawn from the host's random numbers (a random crop): "
            "a graph per offset",
    why=(
        "XLA bakes a slice's bounds into the graph: `x[:, :, top:top + size]` with `top = random.randint(0, h - "
        "size)` is another graph for every offset drawn, so compiles grow with the steps until every offset has "
        "been met (Lornatang/SRGAN-PyTorch crops its batch on the device so: 12 -> 18 compiles at 4 -> 8 steps on "
        "XLA's CPU backend, 6 -> 8 with the fix). Crop on the host, in the `Dataset` before the batch moves to "
        "the device, or select on the device with an index made on the host, `x.index_select(2, "
        "(torch.arange(size) + top).to(x.device))`: the offset travels as data and one graph serves them all. "
        "Reported where a function that slices so is called every step with a device tensor, naming the slice."
    ),
    before=(
        "import random\nimport torch\n\n"
        "def crop(x, size):\n    top = random.randint(0, x.shape[-1] - size)\n    return x[..., top:top + size]\n\n"
        "for x in loader:\n    x = x.cuda()\n    loss = model(crop(x, 32)).sum()\n    loss.backward()\n"
        "    opt.step()\n"
    ),
    after=None,
)


class RandomSlices(HotPathCodemod):
    DESCRIPTION = "Report functions called every step with a device tensor that slice it at host-random offsets."
    RULES = (RANDOM_SLICE,)

    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        found = self._slicer(node)
        if found is None:
            return
        name, where, piece = found
        if not any(piece.cuts(None if a.keyword is not None else i, a.keyword.value if a.keyword else None)
                   and self._on_device(a.value) for i, a in enumerate(node.args) if not a.star):
            return
        self._report(node, RANDOM_SLICE, f"`{name}()` slices what it is handed at offsets drawn from the host's "
                     f"random numbers ({where}): each offset is another XLA graph; crop on the host before the "
                     "batch moves to the device, or select with an index made on the host: `x.index_select(dim, "
                     "(torch.arange(size) + offset).to(x.device))`")

    def visit_Subscript(self, node: cst.Subscript) -> None:
        """A slice at a host-random offset in the step's own code (``i = random.randint(0, 8)``, then
        ``x[:, i:i + 32]``), of a device tensor."""
        bounds = [b for e in node.slice if isinstance(e.slice, cst.Slice) for b in (e.slice.lower, e.slice.upper)
                  if b is not None]
        region = self._step_region()
        if region is None or not any(self._drawn(b, 2, region) for b in bounds) or not self._on_device(node.value):
            return
        self._report(node, RANDOM_SLICE, f"`{source_of(node.value)}` is sliced at an offset drawn from the host's "
                     "random numbers: each offset is another XLA graph; crop on the host before the batch moves to "
                     "the device, or select with an index made on the host: `x.index_select(dim, "
                     "(torch.arange(size) + offset).to(x.device))`")

    def _step_region(self) -> Optional[cst.CSTNode]:
        """What runs anew every step around here: the outermost step or loader loop, else the function run every
        step (a draw before the loop is drawn once: one offset, one graph)."""
        for loop, step, loader in self.loop_stack:
            if step or loader:
                return loop  # type: ignore[no-any-return]
        return self.function_nodes[-1] if self.function_nodes else None

    def _drawn(self, expr: cst.CSTNode, depth: int, region: cst.CSTNode) -> bool:
        """``expr`` draws from the host's random numbers, or reads a name bound in ``region`` from such a draw
        (``depth`` bindings back: ``gt_top = int(top * scale)``)."""
        flow = dataflow(self.tree)
        for n in walk(expr):
            if isinstance(n, cst.Call) and self.qualnames(n.func) & HOST_DRAWS:
                return True
            if isinstance(n, cst.Name) and depth > 0:
                for binding in flow.reaching(n):
                    value, _ = flow.source(binding)
                    if isinstance(value, cst.BaseExpression) and self._inside(binding, region) \
                            and self._drawn(value, depth - 1, region):
                        return True
        return False

    def _inside(self, node: cst.CSTNode, region: cst.CSTNode) -> bool:
        cur: Optional[cst.CSTNode] = node
        while cur is not None and cur is not region:
            cur = self.tree.parents.get(id(cur))
        return cur is region

    def _slicer(self, call: cst.Call) -> Optional[Tuple[str, str, RandomSlice]]:
        """(the callee's name, where its random slice is, the slice) for a call
        of a function of this module or of another project module that takes one."""
        func = call.func
        if isinstance(func, cst.Name) and not self.tree.import_qualnames(func):
            piece = self._own().get(func.value)
            fn = next((d for d in self.tree.module.body if isinstance(d, cst.FunctionDef)
                       and d.name.value == func.value), None)
            if piece is not None and fn is not None and id(fn) not in self.per_step():
                return func.value, f"line {piece.line}", piece  # (one run every step is reported at its slices)
        if not isinstance(func, (cst.Name, cst.Attribute)):
            return None
        imported = imported_from(self.tree, func)
        if imported is None:
            return None
        path, name = imported
        piece = slicing_functions_of(path).get(name)
        if piece is None:
            return None
        return name, f"{_shown(path, self.tree.filename)}:{piece.line}", piece

    def _own(self) -> Dict[str, RandomSlice]:
        source = self.tree.source or self.tree.module.code.encode("utf-8")
        return self._memo("own_random_slices", self.tree.module,  # type: ignore[no-any-return]
                          lambda: slicing_functions(source))


def _shown(path: Path, here: Optional[str]) -> str:
    """``path`` as the report names it: beside the file reported on, by its name."""
    if here:
        try:
            return str(path.resolve().relative_to(Path(here).resolve().parent))
        except (OSError, ValueError):
            pass
    return str(path)


__all__ = ["RandomSlices", "RANDOM_SLICE"]
