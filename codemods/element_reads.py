"""XLA416: a walk over a device tensor that reads each element as a number
reads the tensor once (``y.flatten().tolist()``).

minGPT's ``''.join([itos[int(i)] for i in y])`` and a sampler's
``for t in ts: print(float(t))`` walk a device tensor element by element:
each element is a graph of its own (a new one per index), run and read back
on the host on its own (XLA407 reports it).  Where every use of the element is
a number read (``int(i)``, ``float(i)``, ``bool(i)``, ``i.item()``: the
conditions are ``codemods.analysis.element_walks``'), the walk over
``y.flatten().tolist()`` gives the same numbers from one read, and
``i.item()`` is ``i``.

Rewritten where the walk runs every step (as XLA407 would report it); a
tensor on the device by what the module says of it (``analysis.placement``).
"""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from codemods.analysis.element_walks import NumberWalk, comprehension_walk, for_walk
from codemods.base import Rule
from codemods.hot_path import HotPathCodemod, code, walks_device_tensor

ELEMENT_READ = Rule(
    code="XLA416",
    name="element-number-walk",
    summary="a walk over a device tensor that reads each element as a number (`int(i)`) reads it once: "
            "`y.flatten().tolist()`",
    why=(
        "Walking a device tensor (`for i in y`, `[itos[int(i)] for i in y]`) unbinds it into one tensor per "
        "element; each is a graph of its own, a new one per index, and each `int(i)` runs it and reads the "
        "number back: as many compiles and host reads as elements, every time the walk runs. Where the "
        "element is only read as a number (`int(i)`, `float(i)`, `bool(i)`, `i.item()`), "
        "`y.flatten().tolist()` gives the same numbers from one read (a one-element row is its one number "
        "either way). Only where the element's name is a plain one read nowhere after the walk, and the walk "
        "never names the tensor again."
    ),
    before=(
        "import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nfor x in loader:\n"
        "    y = model(x.cuda()).argmax(-1)\n    words.append(\"\".join([itos[int(i)] for i in y]))\n"
    ),
    after=(
        "import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nfor x in loader:\n"
        "    y = model(x.cuda()).argmax(-1)\n    words.append(\"\".join([itos[int(i)] for i in y.flatten().tolist()]))\n"
    ),
    valid=(
        # the element used as a tensor too
        "import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nfor x in loader:\n"
        "    y = model(x.cuda())\n    rows = [r.sum() for r in y]\n",
        # the tensor written while it is walked (its elements are views of it)
        "import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nfor x in loader:\n"
        "    y = model(x.cuda()).argmax(-1)\n    for i in y:\n        y[0] = int(i)\n",
        # the element read after the loop (a tensor there, not a number)
        "import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nfor x in loader:\n"
        "    y = model(x.cuda()).argmax(-1)\n    for i in y:\n        print(int(i))\n    last = i\n",
        # a copy on the host already
        "import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nfor x in loader:\n"
        "    y = model(x.cuda()).argmax(-1)\n    words.append([int(i) for i in y.tolist()])\n",
    ),
)

class ElementReads(HotPathCodemod):
    DESCRIPTION = "Read a device tensor walked for its numbers once, with `.flatten().tolist()`."
    RULES = (ELEMENT_READ,)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._walks: Set[int] = set()  # ids of the loops and comprehensions rewritten
        self._items: Set[int] = set()  # ids of their `i.item()` calls
        self._arguments: Set[int] = set()  # ids of generator expressions handed to a call

    def visit_For(self, node: cst.For) -> None:
        where = self._where() or "it runs once per call, each of its elements a graph of its own"
        super().visit_For(node)
        if self._element_loop() is node and isinstance(node.iter, cst.Name):
            scope = self.function_nodes[-1] if self.function_nodes else self.tree.module
            self._take(node, for_walk(node, scope), where)

    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        self._arguments.update(id(a.value) for a in node.args if isinstance(a.value, cst.GeneratorExp))

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._comprehension(node)

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._comprehension(node)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._comprehension(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        if id(node) in self._arguments:  # (consumed where it is made: it walks the tensor as it was)
            self._comprehension(node)

    def _comprehension(self, node) -> None:  # type: ignore[no-untyped-def]
        where = self._where()
        if where is not None and walks_device_tensor(self.tree, node.for_in.iter):
            self._take(node, comprehension_walk(node), where)

    def _take(self, node: cst.CSTNode, walk: Optional[NumberWalk], where: str) -> None:
        if walk is None:
            return
        y = code(walk.tensor)
        if self.flag(walk.tensor, ELEMENT_READ.code, f"walking device tensor `{y}` reads each element as a number: a "
                     f"graph and a host read per element -> `{y}.flatten().tolist()`, the same numbers read once; "
                     f"{where}", fix=True, hot=True):
            self._walks.add(id(node))
            self._items.update(id(c) for c in walk.items)

    def rewrite_loop(self, original, updated):  # type: ignore[no-untyped-def]
        if id(original) in self._walks:
            return updated.with_changes(iter=_read_once(updated.iter))
        return super().rewrite_loop(original, updated)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        updated = super().leave_Call(original_node, updated_node)
        if id(original_node) in self._items:
            return updated_node.func.value  # type: ignore[attr-defined]  # (`i.item()`: a number's own value)
        return updated

    def _leave_comprehension(self, original, updated):  # type: ignore[no-untyped-def]
        if id(original) not in self._walks:
            return updated
        return updated.with_changes(for_in=updated.for_in.with_changes(iter=_read_once(updated.for_in.iter)))

    def leave_ListComp(self, original_node: cst.ListComp, updated_node: cst.ListComp) -> cst.BaseExpression:
        return self._leave_comprehension(original_node, updated_node)  # type: ignore[no-any-return]

    def leave_SetComp(self, original_node: cst.SetComp, updated_node: cst.SetComp) -> cst.BaseExpression:
        return self._leave_comprehension(original_node, updated_node)  # type: ignore[no-any-return]

    def leave_DictComp(self, original_node: cst.DictComp, updated_node: cst.DictComp) -> cst.BaseExpression:
        return self._leave_comprehension(original_node, updated_node)  # type: ignore[no-any-return]

    def leave_GeneratorExp(self, original_node: cst.GeneratorExp, updated_node: cst.GeneratorExp) -> cst.BaseExpression:
        return self._leave_comprehension(original_node, updated_node)  # type: ignore[no-any-return]


def _read_once(tensor: cst.BaseExpression) -> cst.Call:
    """``y`` -> ``y.flatten().tolist()``."""
    flat = cst.Call(cst.Attribute(tensor, cst.Name("flatten")))
    return cst.Call(cst.Attribute(flat, cst.Name("tolist")))


__all__ = ["ElementReads", "ELEMENT_READ"]
