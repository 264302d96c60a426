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

Where the elements are used on the host in other ways -- arithmetic with
numbers, a truth, an index of a host tensor or of a tuple of names, over a
``zip`` or ``enumerate`` of such tensors (the forums' confusion matrix, the
CIFAR-10 tutorial's count per class: ``analysis.element_walks.host_walk``)
-- the walk goes over each tensor's host copy, ``labels.view(-1).cpu()``.
A loop over indexes that takes such elements by its counter (``label =
labels[i]``, ``c[i].item()``: ``analysis.element_walks.index_walk``)
indexes host copies made once, right before it (``labels_host =
labels.cpu()``).  Pairs of such elements a function hands back
(minRF's ``[(tv, tloss) for tv, tloss in zip(t, tlist)]``), where every
caller in the module uses those elements only on the host and no other
module imports it (``analysis.handed_walks``), are made of the host copy
too (``zip(t.cpu(), tlist)``).

Rewritten where the walk runs every step (as XLA407 would report it); a
tensor on the device by what the module says of it (``analysis.placement``).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import assigned_value, binding_nodes
from codemods.analysis.element_walks import (HostWalk, IndexWalk, NumberWalk, comprehension_walk, for_walk, host_walk,
                                             index_walk, read_elsewhere, root)
from codemods.analysis.handed_walks import handed_back_walk
from codemods.analysis.placement import HOST, placement
from codemods.analysis.tensors import is_tensor_expr
from codemods.analysis.values import MODULE, TENSORS, values
from codemods.base import Rule
from codemods.hot_path import HotPathCodemod, code, walks_device_tensor
from codemods.syntax.tree import find_all

ELEMENT_READ = Rule(
    code="XLA416",
    name="element-number-walk",
    summary="a walk over a device tensor that reads each element as a number (`int(i)`) reads it once: "
            "`y.flatten().tolist()`, or walks its host copy where the elements are used on the host",
    why=(
        "Walking a device tensor (`for i in y`, `[itos[int(i)] for i in y]`) unbinds it into one tensor per "
        "element; each is a graph of its own, a new one per index, and each `int(i)` runs it and reads the "
        "number back: as many compiles and host reads as elements, every time the walk runs. Where the "
        "element is only read as a number (`int(i)`, `float(i)`, `bool(i)`, `i.item()`), "
        "`y.flatten().tolist()` gives the same numbers from one read (a one-element row is its one number "
        "either way). Only where the element's name is a plain one read nowhere after the walk, and the walk "
        "never names the tensor again. Where the elements are used on the host in other ways -- arithmetic with "
        "numbers before the read (`int(s * 10)`), a truth (`if label == prediction:`), an index of a host tensor or "
        "of a tuple of names (`confusion[t.long(), p.long()] += 1`, `classes[label]`), over `zip(...)` or "
        "`enumerate(...)` of such tensors -- the walk goes over each tensor's host copy (`labels.view(-1).cpu()`): "
        "the same elements, tensors of the same values and dtypes, from one read (a confusion matrix and a count "
        "per class over batches of 4: 21 -> 4 compiles, 32 -> 5 executions a batch). A loop over indexes that takes "
        "the elements by its counter (`label = labels[i]`, `c[i].item()`, the older CIFAR-10 tutorial) and uses them "
        "only so indexes host copies made once right before it (`labels_host = labels.cpu()`): 9 -> 1 compiles, "
        "21 -> 1 executions a batch. Pairs of such elements a function hands back (`[(tv, l) for tv, l in zip(t, "
        "tlist)]`) to callers that use them only so are made of the host copy too (minRF's loss bins: 262 -> 7 "
        "compiles, 514 -> 3 executions a step)."
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
        # an element that meets a device tensor: not a use on the host
        "import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nfor x in loader:\n"
        "    y = model(x.cuda()).argmax(-1)\n    for t in y:\n        words.append(float(model.weight[t].sum()))\n",
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
        self._host_walks: Dict[int, Tuple[int, ...]] = {}  # ids of the host walks -> the places of their tensors
        self._indexed: Dict[int, Dict[str, str]] = {}  # ids of the index walks -> their tensors' host copies

    def visit_For(self, node: cst.For) -> None:
        hot = self._where()
        where = hot or "it runs once per call, each of its elements a graph of its own"
        super().visit_For(node)
        scope = self.function_nodes[-1] if self.function_nodes else self.tree.module
        if self._element_loop() is node and isinstance(node.iter, cst.Name) and self._take(node, for_walk(node, scope),
                                                                                           where):
            return
        if hot is not None and node.asynchronous is None and node.orelse is None:
            walk = self._host_walk(node.target, node.iter, [node.body])
            if walk is not None and not any(read_elsewhere(scope, n.value, node) for n in _element_names(node.target)):
                self._take_host(node, walk, where)
                return
            indexed = index_walk(node, self._tensor, self._host_value)
            if indexed is not None and any(self._on_device(_read_in(node, t)) for t in indexed.tensors) and not any(
                    read_elsewhere(scope, a, node) for a in indexed.aliases):
                self._take_indexed(node, indexed, where)

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
        if where is None:
            return
        first = node.for_in
        if walks_device_tensor(self.tree, first.iter) and self._take(node, comprehension_walk(node), where):
            return
        if first.asynchronous is None:
            parts = [*first.ifs, *([first.inner_for_in] if first.inner_for_in else [])]
            parts += [node.key, node.value] if isinstance(node, cst.DictComp) else [node.elt]
            walk = self._host_walk(first.target, first.iter, parts)
            if walk is None and isinstance(node, cst.ListComp) and self.function_nodes:
                walk = self._handed_back(node, self.function_nodes[-1])
            if walk is not None:
                self._take_host(node, walk, where)

    def _take(self, node: cst.CSTNode, walk: Optional[NumberWalk], where: str) -> bool:
        if walk is None:
            return False
        y = code(walk.tensor)
        if self.flag(walk.tensor, ELEMENT_READ.code, f"walking device tensor `{y}` reads each element as a number: a "
                     f"graph and a host read per element -> `{y}.flatten().tolist()`, the same numbers read once; "
                     f"{where}", fix=True, hot=True):
            self._walks.add(id(node))
            self._items.update(id(c) for c in walk.items)
        return True

    def _host_walk(self, target, iterable, parts) -> Optional[HostWalk]:  # type: ignore[no-untyped-def]
        """A host walk (``analysis.element_walks``) over at least one tensor on the device."""
        walk = host_walk(target, iterable, parts, self._tensor, self._host_value)
        return walk if walk is not None and any(self._on_device(root(t)) for t in walk.tensors) else None  # type: ignore[arg-type]

    def _handed_back(self, comp: cst.ListComp, fn: cst.FunctionDef) -> Optional[HostWalk]:
        """Pairs of device elements handed back to callers that use them on the host (``analysis.handed_walks``)."""
        walk = handed_back_walk(self.tree, comp, fn, self._tensor, self._host_value)
        return walk if walk is not None and any(self._on_device(root(t)) for t in walk.tensors) else None  # type: ignore[arg-type]

    def _tensor(self, walked: cst.BaseExpression) -> bool:
        """A tensor by the analysis, or made from one on the device (``labels.view(-1)``, ``labels`` a batch moved
        there): not a module, whose ``.cpu()`` would move it."""
        if isinstance(walked, (cst.Name, cst.Attribute)) and values(self.tree).of(walked) & {MODULE, TENSORS}:
            return False  # (the pieces of a split, a model: no tensor's `.cpu()`)
        start = root(walked)
        return is_tensor_expr(walked, self.tensors, self.qualnames) or (start is not None and walks_device_tensor(
            self.tree, start))

    def _host_value(self, value: cst.BaseExpression) -> bool:
        """A tensor on the host, or a name bound only to a literal container
        or string (``classes = ("cat", "dog")``, ``correct = {c: 0 for c in classes}``)."""
        if placement(self.tree, value) == HOST:
            return True
        if not isinstance(value, cst.Name):
            return False
        bindings = binding_nodes(self.tree, value)
        return bool(bindings) and all(self._container(assigned_value(self.tree, b)) for b in bindings)

    def _container(self, value: Optional[cst.CSTNode]) -> bool:
        """A literal container or string, a comprehension, ``[0] * n``, or what a builtin or numpy makes of one."""
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
            return isinstance(value.left, (cst.List, cst.Tuple)) or isinstance(value.right, (cst.List, cst.Tuple))
        if isinstance(value, cst.Call):
            func = value.func
            builtin = isinstance(func, cst.Name) and func.value in _MAKERS and not binding_nodes(self.tree, func)
            return builtin or bool(self.qualnames(func) & _MAKERS)
        return isinstance(value, _CONTAINERS)

    def _take_indexed(self, loop: cst.For, walk: IndexWalk, where: str) -> None:
        counter = loop.target.value  # type: ignore[attr-defined]
        copies = {t: self.tree.unused_name(f"{t}_host") for t in walk.tensors  # (a host tensor is indexed as it is)
                  if placement(self.tree, _read_in(loop, t)) != HOST}
        taken = ", ".join(f"`{t}[{counter}]`" for t in copies)
        made = "; ".join(f"`{c} = {t}.cpu()`" for t, c in copies.items())
        if self.flag(loop.iter, ELEMENT_READ.code, f"{taken} take an element of a device tensor at each index and use "
                     f"it on the host: a graph and a host read per element -> indexed in a host copy made once "
                     f"before the loop ({made}), the same elements; {where}", fix=True, hot=True):
            self._indexed[id(loop)] = copies

    def _take_host(self, node: cst.CSTNode, walk: HostWalk, where: str) -> None:
        ys = ", ".join(f"`{code(t)}`" for t in walk.tensors)
        if self.flag(walk.tensors[0], ELEMENT_READ.code, f"walking device tensor {ys} uses each element on the host: "
                     f"a graph and a host read per element -> walked as " + ", ".join(
                         f"`{code(t)}.cpu()`" for t in walk.tensors) + f", the same elements read once; {where}",
                     fix=True, hot=True):
            self._host_walks[id(node)] = walk.places

    def rewrite_loop(self, original, updated):  # type: ignore[no-untyped-def]
        if id(original) in self._walks:
            return updated.with_changes(iter=_read_once(updated.iter))
        if id(original) in self._host_walks:
            updated = updated.with_changes(iter=_host_copies(updated.iter, self._host_walks[id(original)]))
        if id(original) in self._indexed:
            copies = self._indexed[id(original)]
            counter = original.target.value
            made = [cst.parse_statement(f"{c} = {t}.cpu()\n") for t, c in copies.items()]
            loop = super().rewrite_loop(original, updated.with_changes(
                body=updated.body.visit(_Renamed(copies, counter))))
            return cst.FlattenSentinel([*made, loop])
        return super().rewrite_loop(original, updated)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        updated = super().leave_Call(original_node, updated_node)
        if id(original_node) in self._items:
            return updated_node.func.value  # type: ignore[attr-defined]  # (`i.item()`: a number's own value)
        return updated

    def _leave_comprehension(self, original, updated):  # type: ignore[no-untyped-def]
        if id(original) in self._host_walks:
            places = self._host_walks[id(original)]
            return updated.with_changes(for_in=updated.for_in.with_changes(iter=_host_copies(updated.for_in.iter,
                                                                                             places)))
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


class _Renamed(cst.CSTTransformer):
    """``labels[i]`` -> ``labels_host[i]``, for each tensor's host copy."""

    def __init__(self, copies: Dict[str, str], counter: str) -> None:
        super().__init__()
        self.copies, self.counter = copies, counter

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.Subscript:
        value, index = updated_node.value, updated_node.slice[0].slice
        if isinstance(value, cst.Name) and value.value in self.copies and len(updated_node.slice) == 1 and isinstance(
                index, cst.Index) and isinstance(index.value, cst.Name) and index.value.value == self.counter:
            return updated_node.with_changes(value=value.with_changes(value=self.copies[value.value]))
        return updated_node


def _read_in(loop: cst.For, name: str) -> cst.Name:
    """A read of ``name`` in the loop's body (placement asks it where it is read: the loop binds it nowhere)."""
    return next(n for n in find_all(loop.body, cst.Name) if n.value == name)  # type: ignore[attr-defined,return-value]


# what a host value an element may index is made of: literals, comprehensions, and the builtins and numpy
# factories that make a container or an array (`class_correct = list(0. for i in range(10))`)
_MAKERS = frozenset({"list", "dict", "tuple", "set", "collections.defaultdict", "collections.Counter", "numpy.zeros",
                     "numpy.ones", "numpy.full", "numpy.empty", "numpy.array"})
_CONTAINERS = (cst.Tuple, cst.List, cst.Dict, cst.Set, cst.SimpleString, cst.ConcatenatedString, cst.ListComp,
               cst.DictComp, cst.SetComp)


def _element_names(target: cst.CSTNode) -> List[cst.Name]:
    return [e.value for e in target.elements if isinstance(e.value, cst.Name)] if isinstance(  # type: ignore[misc]
        target, (cst.Tuple, cst.List)) else [target] if isinstance(target, cst.Name) else []


def _host_copies(iterable: cst.BaseExpression, places: Tuple[int, ...]) -> cst.BaseExpression:
    """``zip(a, b)`` -> ``zip(a.cpu(), b.cpu())`` at ``places``; ``y`` -> ``y.cpu()`` where there are none."""
    if not places:
        return _cpu(iterable)
    args = list(iterable.args)  # type: ignore[attr-defined]
    for i in places:
        args[i] = args[i].with_changes(value=_cpu(args[i].value))
    return iterable.with_changes(args=args)  # type: ignore[attr-defined]


def _cpu(tensor: cst.BaseExpression) -> cst.Call:
    return cst.Call(cst.Attribute(tensor, cst.Name("cpu")))


def _read_once(tensor: cst.BaseExpression) -> cst.Call:
    """``y`` -> ``y.flatten().tolist()``."""
    flat = cst.Call(cst.Attribute(tensor, cst.Name("flatten")))
    return cst.Call(cst.Attribute(flat, cst.Name("tolist")))


__all__ = ["ElementReads", "ELEMENT_READ"]
