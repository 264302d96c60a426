"""The program's plain objects: which class a name's object is made from, and which method a call on it runs.

pytorch/examples' imagenet keeps its meters as ``top1 = AverageMeter(...)``;
minRF drives its flow as ``rf = RF(model)``, then ``rf.forward(x, c)`` in the
step loop.  A *plain object* is a name bound only to ``C(...)``, ``C`` one
class of the module (or imported from a module of the project: read from
that module's tree), with no base but ``object``, no decorator, no property
setter and no attribute hook: ``obj.m(...)`` runs ``C.m`` and nothing else.
What such a call may do the readers decide (``store_methods``: a store call;
``step_updates``: an update; ``loops``: what runs every step; ``counters``:
where a loop counter goes).  Nothing here reads other analyses, so every one
of them may ask.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.project import file_stamp, imported_from
from codemods.syntax.tree import TreeCache, find_all

QualNames = Callable[[cst.CSTNode], Iterable[str]]

_HOOKS = frozenset({"__setattr__", "__getattr__", "__getattribute__", "__delattr__"})


def imported_def(tree: TreeCache, callee: cst.Name, kind: type) -> Optional[Tuple[TreeCache, cst.CSTNode]]:
    """The tree of the project module a function (``kind``: ``cst.FunctionDef``)
    or class (``cst.ClassDef``) is imported from, and its definition there."""
    found = imported_from(tree, callee)
    if found is None:
        return None
    sibling = _sibling(found[0])
    fn = None if sibling is None else next((s for s in sibling.module.body if isinstance(s, kind)
                                            and s.name.value == found[1]), None)
    return None if sibling is None or fn is None else (sibling, fn)


_SIBLINGS: Dict[Tuple[str, object], Optional[TreeCache]] = {}


def _sibling(path: Path) -> Optional[TreeCache]:
    """A project module read whole (the last few kept, by file and stamp); None where it does not parse."""
    key = (str(path), file_stamp(path))
    if key not in _SIBLINGS:
        if len(_SIBLINGS) >= 8:
            _SIBLINGS.pop(next(iter(_SIBLINGS)))
        try:
            source = path.read_bytes()
            _SIBLINGS[key] = TreeCache(cst.parse_module(source), source, filename=str(path))
        except (OSError, cst.ParserSyntaxError, RecursionError):
            _SIBLINGS[key] = None
    return _SIBLINGS[key]


def quick_qualnames(tree: TreeCache) -> QualNames:
    """Qualified names read from a module's imports alone (where they are not sure: none, so nothing is a torch op)."""
    return lambda node: tree.import_qualnames(node) or set()


def instance_class(tree: TreeCache, name: cst.Name, or_none: bool = False) -> Optional[Tuple[TreeCache, cst.ClassDef]]:
    """(the tree it is defined in, the class) where every binding of ``name``
    is ``name = C(...)`` of one plain class ``C`` of the program (or, with
    ``or_none``, ``name = None``: ermongroup/ddim's ``ema_helper`` where the
    average is turned off); else None."""
    found: Optional[Tuple[TreeCache, cst.ClassDef]] = None
    bindings = binding_nodes(tree, name)
    for bound in bindings:
        if or_none and _bound_to_none(tree, bound):
            continue
        made = made_by(tree, bound)
        cls = _class_of(tree, made.func) if made is not None and isinstance(made.func, cst.Name) else None
        if cls is None or found is not None and found[1] is not cls[1]:
            return None
        found = cls
    return found if bindings and found is not None and _plain(found[1]) else None


def _bound_to_none(tree: TreeCache, bound: cst.CSTNode) -> bool:
    """``name = None``."""
    target = tree.parents.get(id(bound))
    assign = tree.parents.get(id(target)) if isinstance(target, cst.AssignTarget) else None
    return (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Name)
            and assign.value.value == "None")


def made_by(tree: TreeCache, bound: cst.CSTNode) -> Optional[cst.Call]:
    """The call a binding of a name is: ``top1 = C(...)``, or its place in
    ``losses, top1 = C(...), C(...)``; None for any other binding."""
    parent = tree.parents.get(id(bound))
    index = None
    if isinstance(parent, cst.Element):
        names = tree.parents.get(id(parent))
        if not isinstance(names, (cst.Tuple, cst.List)):
            return None
        index = next(i for i, e in enumerate(names.elements) if e is parent)
        parent = tree.parents.get(id(names))
    assign = tree.parents.get(id(parent)) if isinstance(parent, cst.AssignTarget) else None
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    value = assign.value
    if index is not None:
        size = len(names.elements)  # type: ignore[union-attr]
        if not isinstance(value, (cst.Tuple, cst.List)) or len(value.elements) != size or any(
                isinstance(e, cst.StarredElement) for e in (*value.elements, *names.elements)):  # type: ignore[union-attr]
            return None
        value = value.elements[index].value
    return value if isinstance(value, cst.Call) else None


def _class_of(tree: TreeCache, name: cst.Name) -> Optional[Tuple[TreeCache, cst.ClassDef]]:
    classes = [b for b in binding_nodes(tree, name) if isinstance(b, cst.ClassDef)]
    if len(classes) == 1 and len(binding_nodes(tree, name)) == 1:
        return tree, classes[0]
    found = imported_def(tree, name, cst.ClassDef)
    return found  # type: ignore[return-value]


def _plain(cls: cst.ClassDef) -> bool:
    """No base but ``object``, no decorator, no attribute hook, no property setter."""
    if cls.decorators or cls.keywords or any(
            not (isinstance(b.value, cst.Name) and b.value.value == "object") for b in cls.bases):
        return False
    for stmt in _body(cls):
        if isinstance(stmt, cst.FunctionDef) and (stmt.name.value in _HOOKS or any(
                isinstance(d.decorator, cst.Attribute) and d.decorator.attr.value in ("setter", "deleter")
                for d in stmt.decorators)):
            return False
    return True


def _body(cls: cst.ClassDef):  # type: ignore[no-untyped-def]
    return cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()


def method_of(tree: TreeCache, call: cst.Call, qualnames: QualNames,
              or_none: bool = False) -> Optional[Tuple[TreeCache, cst.FunctionDef, QualNames]]:
    """For ``obj.m(...)``, ``obj`` a plain object of the program
    (:func:`instance_class`): the tree its class is defined in, the method
    ``m`` there, and the qualified names to read that tree with."""
    func = call.func
    if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Name):
        return None
    found = instance_class(tree, func.value, or_none)
    if found is None:
        return None
    owner, cls = found
    method = next((s for s in _body(cls) if isinstance(s, cst.FunctionDef) and s.name.value == func.attr.value), None)
    return None if method is None else (owner, method, qualnames if owner is tree else quick_qualnames(owner))


def object_methods(tree: TreeCache, call: cst.Call) -> List[cst.FunctionDef]:
    """``obj.m(...)``, ``obj`` a plain object of a class of the module
    (:func:`instance_class`: minRF's ``rf = RF(model)``,
    then ``rf.forward(x, c)`` in the step loop): its method ``m``, which
    the call runs; ``[]`` for any other call."""
    func = call.func
    if not (type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value != "self"
            and func.attr.value in function_names(tree)):
        return []
    found = method_of(tree, call, tree.import_qualnames)  # type: ignore[arg-type]
    return [found[1]] if found is not None and found[0] is tree else []


def function_names(tree: TreeCache) -> Set[str]:
    """The names the module's functions, methods and closures are defined
    with: a call spelled otherwise runs none of them."""
    names = tree.memo.get("function_names")
    if names is None:
        names = tree.memo["function_names"] = {fn.name.value for fn in find_all(tree.module, cst.FunctionDef)}
    return names  # type: ignore[return-value]


__all__ = ["QualNames", "function_names", "imported_def", "instance_class", "made_by", "method_of", "object_methods",
           "quick_qualnames"]
