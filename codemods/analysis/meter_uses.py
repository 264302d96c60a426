"""The uses of a meter in the function that makes it (XLA425, ``codemods.meters``).

Where a meter handed ``.item()`` every step may be handed the tensor: in the
loops that update it, only updated, shown (a format of the attributes the
value reaches, ``str(meter)``, a method of its class that only formats them
-- ``analysis.meters.shows_only``), or read for other attributes; elsewhere
in the function, read, or handed to an object of the program that only
shows it (``analysis.meters.holds_to_show``: imagenet's ``ProgressMeter``),
itself only made and called.  Never used in a nested scope, never named by
``global``/``nonlocal``, and no ``return``/``yield`` in those loops (the
read-back after each would be skipped).  :attr:`MeterUses.shown` collects
where the loops show it (the log blocks the barrier goes first in).
"""

from __future__ import annotations

import string
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.meters import holds_to_show, is_format, methods
from codemods.analysis.objects import QualNames, instance_class, made_by
from codemods.syntax.nodes import SCOPES
from codemods.syntax.tree import TreeCache, find_all



def scope_of(tree: TreeCache, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The innermost scope ``node`` is in (None: the module's)."""
    cur = tree.parents.get(id(node))
    while cur is not None and not isinstance(cur, SCOPES):
        cur = tree.parents.get(id(cur))
    return cur


class MeterUses:
    """One meter's uses, against the module doc; ``items(call)``: the
    ``.item()`` arguments of a call (its store calls hand those)."""

    def __init__(self, tree: TreeCache, qualnames: QualNames, items: Callable[[cst.Call], List[cst.Call]],
                 loops: List[cst.CSTNode], values: Tuple[str, ...], show: Callable[[str], bool]) -> None:
        self.tree, self.qualnames, self.items = tree, qualnames, items
        self.loops, self.values, self.show = loops, values, show
        self.shown: List[cst.CSTNode] = []  # where the loops show the meter (a format, str(), a holder's call)
        self._holding: Dict[int, tuple] = {}  # id(holder's name) -> ((tree, class), the call made it, the argument)

    def _parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.tree.parents.get(id(node))

    def _ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        cur = self._parent(node)
        while cur is not None:
            yield cur
            cur = self._parent(cur)

    def allowed(self, scope: cst.FunctionDef, name: str) -> bool:
        """Every use of the meter ``name`` in ``scope`` is one the module doc allows."""
        if any(name in {n.value for n in g.names} for g in find_all(scope.body, (cst.Global, cst.Nonlocal))):
            return False
        if any(find_all(loop.body, (cst.Return, cst.Yield), stop=SCOPES) for loop in self.loops):
            return False
        holders: List[cst.Name] = []
        for node, parent in self._occurrences(scope, name):
            use = parent is not None and self._use(node, parent, self._inside(node))
            if not use:
                return False
            if isinstance(use, cst.Name):
                holders.append(use)
        return all(self._holder_ok(h, scope) for h in holders)

    def _occurrences(self, scope: cst.FunctionDef, name: str) -> Iterator[Tuple[cst.Name, Optional[cst.CSTNode]]]:
        """The uses of the variable ``name`` in ``scope`` (not an attribute's or
        a keyword's name), each with its parent; None for the parent of one in
        a nested scope."""
        for node in find_all(scope.body, cst.Name):
            parent = self._parent(node)
            if node.value != name or isinstance(parent, cst.Attribute) and parent.attr is node or \
                    isinstance(parent, cst.Arg) and parent.keyword is node:
                continue
            yield node, (parent if scope_of(self.tree, node) is scope else None)  # type: ignore[misc]

    def _inside(self, node: cst.CSTNode) -> bool:
        """``node`` is in one of the loops that update the meter."""
        return any(a is lp for a in self._ancestors(node) for lp in self.loops)

    def _use(self, node: cst.Name, parent: cst.CSTNode, inside: bool):  # type: ignore[no-untyped-def]
        """True for a use allowed where it stands, the holder's name for a
        meter handed to an object made outside the loop, None otherwise."""
        values, shown = self.values, self.show
        if isinstance(parent, cst.AssignTarget):
            return made_by(self.tree, node) is not None
        if isinstance(parent, cst.Attribute):
            call = self._parent(parent)
            if not inside:
                return True
            if isinstance(call, cst.Call) and call.func is parent:
                if self.items(call):
                    return True  # a store call handed `.item()` (XLA425 checked each one's method)
                self.shown.append(call)
                return shown(parent.attr.value)
            if parent.attr.value in values:
                self.shown.append(parent)
                return is_format(parent, self.tree.parents)
            return not self._stored(parent)
        if self._shows(node, parent):
            self.shown.append(node)
            return shown("__str__")
        if inside:
            return None
        return self._held_by(node)

    def _stored(self, node: cst.CSTNode) -> bool:
        parent = self._parent(node)
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.Del)) or isinstance(parent, cst.Element)

    def _shows(self, node: cst.Name, parent: cst.CSTNode) -> bool:
        """``str(meter)``, ``print(meter)``, ``f"{meter}"``, or the meter handed
        to a literal's ``format`` whose fields all format what they name
        (``'loss {loss.val:.3f} ({loss.avg:.3f})'.format(loss=losses)``, as
        SupContrast prints; no ``!r``/``!s``)."""
        if isinstance(parent, cst.FormattedStringExpression):
            return parent.conversion is None
        call = self._parent(parent) if isinstance(parent, cst.Arg) and not parent.star else None
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "format":
            return _formats_only(call.func.value)
        return isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in ("str", "print") \
            and not binding_nodes(self.tree, call.func)

    def _held_by(self, node: cst.Name) -> Optional[cst.Name]:
        """``holder = P(..., [a, meter, b])``: the name ``holder``."""
        element = self._parent(node)
        seq = self._parent(element) if isinstance(element, cst.Element) else None
        arg = self._parent(seq) if isinstance(seq, (cst.List, cst.Tuple)) else None
        made = self._parent(arg) if isinstance(arg, cst.Arg) else None
        target = self._parent(made) if isinstance(made, cst.Call) else None
        if not (isinstance(target, cst.Assign) and len(target.targets) == 1
                and isinstance(target.targets[0].target, cst.Name)):
            return None
        holder = target.targets[0].target
        found = instance_class(self.tree, holder)
        if found is None:
            return None
        self._holding[id(holder)] = (found, made, arg)  # type: ignore[assignment]
        return holder

    def _holder_ok(self, holder: cst.Name, scope: cst.FunctionDef) -> bool:
        """The holder is only made and called (its methods) in ``scope``."""
        (owner, cls), made, arg = self._holding[id(holder)]
        if not holds_to_show(owner, cls, made, arg, self.show):
            return False
        for node, parent in self._occurrences(scope, holder.value):
            if node is holder or isinstance(parent, cst.AssignTarget) and made_by(self.tree, node) is not None:
                continue
            call = self._parent(parent) if isinstance(parent, cst.Attribute) else None
            if not (isinstance(call, cst.Call) and call.func is parent and parent.attr.value in methods(cls)):
                return False  # the holder handed on, read for an attribute, or used in a nested scope
            if self._inside(call):
                self.shown.append(call)
        return True


def _formats_only(text: cst.BaseExpression) -> bool:
    """``text`` is a string literal whose every field formats its value (no conversion)."""
    value = text.evaluated_value if isinstance(text, (cst.SimpleString, cst.ConcatenatedString)) else None
    if not isinstance(value, str):
        return False
    try:
        return all(conversion is None for _, field, _, conversion in string.Formatter().parse(value) if field is not None)
    except ValueError:
        return False


__all__ = ["MeterUses", "scope_of"]
