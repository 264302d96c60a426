"""Walks over a tensor whose elements are only read as Python numbers.

``[itos[int(i)] for i in y]``, ``for t in ts: total += float(t)``: each
element of ``y`` is a tensor of its own (``Tensor.__iter__`` unbinds it), and
each ``int(i)`` reads one on the host.  Where every use of the element is such
a read -- ``int(i)``, ``float(i)``, ``bool(i)``, ``i.item()`` -- the walk over
``y.flatten().tolist()`` gives the same numbers (a one-element row reads as
its one number either way), read at once.

A walk is one only where that holds for certain: the element named by a plain
name; the tensor a plain name the walk never mentions again (its elements are
views: a write to it while walking would show in the ones still to come); for
a ``for`` loop, the element's name read nowhere else in its scope but in other
loops that bind it first (after the loop it holds a number, not a tensor).
Whether the tensor lives on the device, and whether the walk runs every step,
the rule asks (``codemods.element_reads``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import libcst as cst

from codemods.analysis.steps import SCALAR_READS

Comprehension = Union[cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp]


@dataclass(frozen=True)
class NumberWalk:
    """A walk whose elements are only read as numbers: its tensor, and the
    ``i.item()`` calls that read them (a number's own value once walked)."""

    tensor: cst.Name
    items: Tuple[cst.Call, ...]


def for_walk(loop: cst.For, scope: cst.CSTNode) -> Optional[NumberWalk]:
    """``for i in y:`` whose body reads ``i`` only as a number, ``i`` read in
    ``scope`` (its function, or the module) only where another loop binds
    it first; no ``else`` (it would run with ``i`` as the walk left it)."""
    if loop.asynchronous is not None or loop.orelse is not None:
        return None
    if not (isinstance(loop.target, cst.Name) and isinstance(loop.iter, cst.Name)):
        return None
    items = _reads_as_numbers([loop.body], loop.target.value, loop.iter.value)
    if items is None or _read_elsewhere(scope, loop.target.value, loop):
        return None
    return NumberWalk(loop.iter, tuple(items))


def comprehension_walk(comp: Comprehension) -> Optional[NumberWalk]:
    """``[f(int(i)) for i in y if ...]`` (its first ``for``) reading ``i``
    only as a number; its name is the comprehension's own."""
    first = comp.for_in
    if first.asynchronous is not None or not (isinstance(first.target, cst.Name) and isinstance(first.iter, cst.Name)):
        return None
    parts: List[cst.CSTNode] = [*first.ifs, *([first.inner_for_in] if first.inner_for_in else [])]
    parts += [comp.key, comp.value] if isinstance(comp, cst.DictComp) else [comp.elt]
    items = _reads_as_numbers(parts, first.target.value, first.iter.value)
    return None if items is None else NumberWalk(first.iter, tuple(items))


def _reads_as_numbers(parts: Sequence[cst.CSTNode], element: str, tensor: str) -> Optional[List[cst.Call]]:
    """The ``element.item()`` calls in ``parts``, where every use of
    ``element`` there is a number read and ``tensor`` is not named; else None."""
    items: List[cst.Call] = []
    stack: List[cst.CSTNode] = list(parts)
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call):
            read = _number_read(node, element)
            if read == "item":
                items.append(node)
                continue
            if read == "scalar":
                continue
        if isinstance(node, cst.Name) and node.value in (element, tensor):
            return None
        stack.extend(node.children)
    return items


def _number_read(call: cst.Call, element: str) -> Optional[str]:
    """``int(element)``/``float``/``bool``: "scalar"; ``element.item()``: "item"."""
    func = call.func
    if (isinstance(func, cst.Name) and func.value in SCALAR_READS and len(call.args) == 1
            and not call.args[0].keyword and not call.args[0].star
            and isinstance(call.args[0].value, cst.Name) and call.args[0].value.value == element):
        return "scalar"
    if (isinstance(func, cst.Attribute) and func.attr.value == "item" and not call.args
            and isinstance(func.value, cst.Name) and func.value.value == element):
        return "item"
    return None


def _read_elsewhere(scope: cst.CSTNode, name: str, loop: cst.For) -> bool:
    """Is ``name`` used in ``scope`` outside ``loop``, other than in a loop
    or comprehension that binds it before its body reads it?"""
    stack: List[cst.CSTNode] = [scope]
    while stack:
        node = stack.pop()
        if node is loop:
            continue
        if isinstance(node, cst.For) and isinstance(node.target, cst.Name) and node.target.value == name:
            stack.append(node.iter)  # (its body reads what it bound; its `else` may not)
            if node.orelse is not None:
                stack.append(node.orelse)
            continue
        if isinstance(node, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)) \
                and isinstance(node.for_in.target, cst.Name) and node.for_in.target.value == name:
            stack.append(node.for_in.iter)  # (a comprehension's name is its own)
            continue
        if isinstance(node, cst.Name) and node.value == name:
            return True
        stack.extend(node.children)
    return False


__all__ = ["NumberWalk", "comprehension_walk", "for_walk"]
