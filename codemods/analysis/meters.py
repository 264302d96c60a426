"""Meters: objects of the program that sum what a step hands them and show it only as text.

pytorch/examples' imagenet records ``losses.update(loss.item(),
images.size(0))`` every step; ``AverageMeter.update`` keeps the value and
sums it (``self.val = val; self.sum += val * n; self.count += n; self.avg =
self.sum / self.count``), and the progress line shows the meter as text
(``'{name} {val:.4e} ({avg:.4e})'.format(**self.__dict__)``).  Handed the
tensor itself, the meter computes the same numbers on the device; formatted,
a tensor of no dimensions gives the text of its number (``Tensor.__format__``
formats ``.item()``), so the line reads the same.

What this module answers, for a store call (``analysis.store_methods``) of a
plain object (``analysis.objects``):

* :func:`value_attributes`: the attributes the handed value flows into
  (``val``, ``sum``, ``avg``; not ``count``), when no other line of the class
  can bind one of them to a tensor;
* :func:`shows_only`: a method reads those attributes only to format them
  (``__str__``, ``summary``), or only binds numbers (``reset``);
* :func:`holds_to_show`: a class of the program an object is handed the
  meters in (``ProgressMeter(n, [batch_time, losses, top1])``) does nothing
  with them but show them.

A *format* is an f-string's expression with no ``!r``/``!s``, an argument of
``str.format`` (``**self.__dict__`` among them) or the first of ``format()``.
"""

from __future__ import annotations

from typing import Callable, Collection, Dict, FrozenSet, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.tensor_functions import _own_attribute
from codemods.syntax.tree import TreeCache, find_all

Parents = Dict[int, cst.CSTNode]

_NUMBER_CALLS = frozenset({"float", "int", "round", "item", "tolist", "abs", "min", "max", "len"})


def is_format(node: cst.CSTNode, parents: Parents) -> bool:
    """``node`` is formatted where it stands, and used no other way (see the module doc)."""
    parent = parents.get(id(node))
    if isinstance(parent, cst.FormattedStringExpression):
        return parent.expression is node and parent.conversion is None
    if not isinstance(parent, cst.Arg) or parent.value is not node:
        return False
    call = parents.get(id(parent))
    if not isinstance(call, cst.Call):
        return False
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "format":
        return _own(node) == "__dict__" if parent.star == "**" else not parent.star
    return isinstance(func, cst.Name) and func.value == "format" and call.args[0] is parent and not parent.star


def methods(cls: cst.ClassDef) -> Dict[str, cst.FunctionDef]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return {s.name.value: s for s in body if isinstance(s, cst.FunctionDef)}


def _own(node: cst.CSTNode) -> Optional[str]:
    """``self.<name>``: the name."""
    return node.attr.value if _own_attribute(node) else None  # type: ignore[attr-defined]


def _stored(stmt: cst.CSTNode) -> Set[str]:
    """The own attributes a statement binds (``self.sum, self.count = ...`` both)."""
    if isinstance(stmt, cst.Assign):
        targets = [t.target for t in stmt.targets]
    elif isinstance(stmt, (cst.AugAssign, cst.AnnAssign)):
        targets = [stmt.target]
    else:
        return set()
    out: Set[str] = set()
    for target in targets:
        for t in ([e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]):
            name = _own(t)
            if name is not None:
                out.add(name)
    return out


def value_attributes(cls: cst.ClassDef, method: cst.FunctionDef, params: FrozenSet[str]) -> Optional[Tuple[str, ...]]:
    """The own attributes ``method`` (a store method) binds from ``params``
    or from attributes so bound, in its order of lines; None where none is,
    or where another line of the class binds one of them to what may be a
    tensor (anything but host numbers: literals, arithmetic of them and of
    its own attributes, ``float(...)``, ``.item()``, ``.tolist()``)."""
    values: Set[str] = set()
    binds = [s for s in find_all(method.body, (cst.Assign, cst.AugAssign))]
    grew = True
    while grew:  # (until no line adds one: `self.avg = self.sum / self.count` after `self.sum += val * n`)
        before = len(values)
        for small in binds:
            names = {n.value for n in find_all(small.value, cst.Name)}
            owns = {_own(a) for a in find_all(small.value, cst.Attribute)}
            if names & params or owns & values:
                values |= _stored(small)  # type: ignore[arg-type]
        grew = len(values) > before
    if not values:
        return None
    lines = [small for line in method.body.body if isinstance(line, cst.SimpleStatementLine)  # type: ignore[union-attr]
             for small in line.body]
    ordered = tuple(dict.fromkeys(a for small in lines for a in sorted(_stored(small)) if a in values))
    for name, fn in methods(cls).items():
        if fn is method:
            continue
        for small in find_all(fn.body, cst.BaseSmallStatement):
            if _stored(small) & values and not _host_number(small.value):  # type: ignore[attr-defined,arg-type]
                return None
    return ordered


def _host_number(expr: cst.BaseExpression) -> bool:
    """``expr`` gives no tensor: numbers, own attributes (themselves checked),
    arithmetic of those and the calls of ``_NUMBER_CALLS``."""
    if isinstance(expr, (cst.Integer, cst.Float)) or _own(expr) is not None:
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _host_number(expr.expression)
    if isinstance(expr, cst.BinaryOperation):
        return _host_number(expr.left) and _host_number(expr.right)
    if isinstance(expr, cst.Call):
        func = expr.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        return name in _NUMBER_CALLS
    return False


def shows_only(owner: TreeCache, cls: cst.ClassDef, name: str, values: Collection[str],
               seen: Optional[Set[str]] = None) -> bool:
    """Method ``name`` of ``cls`` reads ``values`` only to format them, binds
    them only to numbers, and uses ``self`` only through its attributes (the
    methods it calls on ``self`` alike); a class with no ``__str__`` shows
    none of them as text."""
    found = methods(cls).get(name)
    if found is None:
        return name == "__str__"
    seen = set() if seen is None else seen
    if name in seen:
        return True
    seen.add(name)
    parents = owner.parents
    for small in find_all(found.body, cst.BaseSmallStatement):
        if _stored(small) & set(values) and not _host_number(small.value):  # type: ignore[attr-defined,arg-type]
            return False
    for node in find_all(found.body, cst.Name):
        if node.value != "self":
            continue
        attribute = parents.get(id(node))
        if not isinstance(attribute, cst.Attribute) or attribute.value is not node:
            return False  # `self` itself handed on
        attr = attribute.attr.value
        call = parents.get(id(attribute))
        if isinstance(call, cst.Call) and call.func is attribute and attr in methods(cls):
            if not shows_only(owner, cls, attr, values, seen):
                return False
        elif attr == "__dict__" and not is_format(attribute, parents):
            return False
        elif attr in values and not (is_format(attribute, parents) or _is_target(attribute, parents)):
            return False
    return True


def _is_target(node: cst.CSTNode, parents: Parents) -> bool:
    parent = parents.get(id(node))
    if isinstance(parent, cst.Element):
        parent = parents.get(id(parents.get(id(parent))))
    return isinstance(parent, (cst.AssignTarget, cst.AugAssign)) and getattr(parent, "target", None) is not None \
        and (parent.target is node or isinstance(parent.target, (cst.Tuple, cst.List)))


def holds_to_show(owner: TreeCache, holder: cst.ClassDef, made: cst.Call, arg: cst.Arg,
                  shown: Callable[[str], bool]) -> bool:
    """``made`` (``ProgressMeter(n, [losses, top1])``) makes a ``holder``
    whose ``__init__`` keeps ``arg``'s value in one attribute and nothing
    else uses that attribute but to walk it and show what it holds
    (``str(meter)``, ``f"{meter}"``, ``meter.summary()`` where ``shown``
    says the meter's method only shows)."""
    init = methods(holder).get("__init__")
    if init is None or arg.star:
        return False
    params = [p.name.value for p in (*init.params.posonly_params, *init.params.params)][1:]
    index = list(made.args).index(arg)
    param = arg.keyword.value if arg.keyword is not None else params[index] if index < len(params) else None
    if param is None:
        return False
    parents = owner.parents
    kept = None
    for node in find_all(init.body, cst.Name):
        assign = parents.get(id(node))
        if node.value != param or isinstance(assign, cst.Attribute) and assign.attr is node:
            continue
        if not (isinstance(assign, cst.Assign) and assign.value is node and len(assign.targets) == 1
                and _own(assign.targets[0].target) is not None and kept is None):
            return False
        kept = _own(assign.targets[0].target)
    if kept is None:
        return False
    for fn in methods(holder).values():
        for attribute in find_all(fn.body, cst.Attribute):
            if _own(attribute) != kept or fn is init and _is_target(attribute, parents):
                continue
            if not _walked_to_show(attribute, parents, shown):
                return False
    return True


def _walked_to_show(held: cst.Attribute, parents: Parents, shown: Callable[[str], bool]) -> bool:
    """``held`` is what a loop or comprehension walks, and its name for each
    element is only shown (``str(meter)``, ``meter.summary()``)."""
    walk = parents.get(id(held))
    if not isinstance(walk, (cst.CompFor, cst.For)) or walk.iter is not held or not isinstance(walk.target, cst.Name):
        return isinstance(walk, cst.Arg) and _is_len(parents.get(id(walk)))
    element = walk.target.value
    scope = parents.get(id(walk)) if isinstance(walk, cst.CompFor) else walk
    for node in find_all(scope, cst.Name):  # type: ignore[arg-type]
        if node.value != element or node is walk.target:
            continue
        parent = parents.get(id(node))
        if isinstance(parent, cst.Arg) and isinstance(call := parents.get(id(parent)), cst.Call) \
                and isinstance(call.func, cst.Name) and call.func.value == "str" and len(call.args) == 1:
            if not shown("__str__"):
                return False
        elif isinstance(parent, cst.FormattedStringExpression) and parent.conversion is None:
            if not shown("__str__"):
                return False
        elif isinstance(parent, cst.Attribute) and parent.value is node \
                and isinstance(parents.get(id(parent)), cst.Call):
            if not shown(parent.attr.value):
                return False
        else:
            return False
    return True


def _is_len(call: Optional[cst.CSTNode]) -> bool:
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "len"


__all__ = ["holds_to_show", "is_format", "methods", "shows_only", "value_attributes"]
