"""Which of the module's own functions a call runs, read through the scopes.

``f(...)`` runs the ``def f`` its name is bound to where it is called -- at
module level, a closure of the enclosing function, a function defined in a
loop's body -- never a function of the same name elsewhere (a method, another
function's closure, a parameter called ``train``).  ``self.m(...)`` runs the
method ``m`` of the class around the call; ``obj.m(...)``, ``obj`` a plain
object of a class of the module, its method ``m`` (``analysis.objects``:
asked where a question needs it -- what runs every step, what a counter
reaches -- not by :func:`called_functions`).  Every rule that follows calls
(the step functions, the functions run once per step) asks here.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.objects import function_names as _function_names
from codemods.syntax.tree import TreeCache


def called_functions(tree: TreeCache, call: cst.Call) -> Optional[List[cst.FunctionDef]]:
    """The functions of the module ``call`` may run: ``[]`` when its callee
    is none of them (a parameter, an import, a builtin); None for a
    ``self.m(...)`` whose class does not define ``m`` (a base class may):
    then nothing is known."""
    func = call.func
    if type(func) is cst.Name:  # (a name the module does not bind is none of its functions)
        if func.value not in _function_names(tree):
            applied = _applied_aliases(tree).get(func.value)  # (`relu = MyReLU.apply`, then `relu(x)`)
            return _passes(applied) if applied is not None else []  # (most calls: builtins, imports)
        return [b for b in binding_nodes(tree, func) if type(b) is cst.FunctionDef]  # type: ignore[misc]
    if type(func) is cst.Attribute and func.attr.value == "apply" and type(func.value) is cst.Name:
        applied = _autograd_functions(tree).get(func.value.value)  # `MyReLU.apply(x)`
        if applied is not None and any(b is applied for b in binding_nodes(tree, func.value)):
            return _passes(applied)
    if type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value == "self":
        if func.attr.value not in _function_names(tree):
            return None  # no class of the module defines it
        cls = _enclosing_class(tree, call)
        if cls is None or type(cls.body) is not cst.IndentedBlock:
            return None
        methods = [s for s in cls.body.body if type(s) is cst.FunctionDef and s.name.value == func.attr.value]
        return methods or None  # type: ignore[return-value]
    return None


# what a torch.autograd.Function subclass is made from
AUTOGRAD_FUNCTIONS = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})


def _autograd_functions(tree: TreeCache) -> Dict[str, cst.ClassDef]:
    """The module's classes made from ``torch.autograd.Function``, by name:
    ``C.apply(x)`` runs their ``forward`` at once and their ``backward``
    when the loss is taken back through it (every step, from a step loop)."""
    found = tree.memo.get("autograd_functions")
    if found is None:
        found = tree.memo["autograd_functions"] = {
            cls.name.value: cls for cls in tree.nodes((cst.ClassDef,))  # type: ignore[attr-defined]
            if any((tree.import_qualnames(b.value) or set()) & AUTOGRAD_FUNCTIONS for b in cls.bases)}  # type: ignore[attr-defined]
    return found  # type: ignore[no-any-return]


def _applied_aliases(tree: TreeCache) -> Dict[str, cst.ClassDef]:
    """Module-level names bound once, to ``C.apply`` of such a class
    (PyTorch's tutorial: ``relu = MyReLU.apply``)."""
    found = tree.memo.get("applied_aliases")
    if found is None:
        classes = _autograd_functions(tree)
        found = {}
        if classes:
            bound: Dict[str, int] = {}
            for stmt in tree.module.body:
                for small in (stmt.body if type(stmt) is cst.SimpleStatementLine else ()):  # type: ignore[attr-defined]
                    for target in (small.targets if type(small) is cst.Assign else ()):  # type: ignore[attr-defined]
                        if type(target.target) is cst.Name:
                            name = target.target.value
                            bound[name] = bound.get(name, 0) + 1
                            value = small.value  # type: ignore[attr-defined]
                            if type(value) is cst.Attribute and value.attr.value == "apply" \
                                    and type(value.value) is cst.Name and value.value.value in classes:
                                found[name] = classes[value.value.value]
            found = {n: c for n, c in found.items() if bound.get(n) == 1}
        tree.memo["applied_aliases"] = found
    return found  # type: ignore[no-any-return]


def _passes(cls: cst.ClassDef) -> List[cst.FunctionDef]:
    """An autograd Function's ``forward`` and ``backward``."""
    body = cls.body.body if type(cls.body) is cst.IndentedBlock else ()
    return [s for s in body if type(s) is cst.FunctionDef and s.name.value in ("forward", "backward")]  # type: ignore[misc]


def _enclosing_class(tree: TreeCache, node: cst.CSTNode) -> Optional[cst.ClassDef]:
    """The class whose method holds ``node`` (``self`` is its instance)."""
    parents = tree.parents
    cur = parents.get(id(node))
    while cur is not None:
        if type(cur) is cst.ClassDef:
            return cur  # type: ignore[return-value]
        cur = parents.get(id(cur))
    return None


class FunctionSet(set):
    """Some of the module's functions: their names (a set of ``str``, as
    name-based readers want it) and the functions themselves (``defs``:
    their ids), which a call is matched against with :meth:`called_by`."""

    def __init__(self, tree: TreeCache, functions: Iterable[cst.FunctionDef] = ()) -> None:
        functions = list(functions)
        super().__init__(fn.name.value for fn in functions)
        self.tree = tree
        self.defs: Set[int] = {id(fn) for fn in functions}

    def called_by(self, call: cst.Call) -> bool:
        """``call`` runs one of these functions (read through the scopes; a
        ``self.m()`` the class does not define, by the method's name)."""
        called = called_functions(self.tree, call)
        if called is None:
            return type(call.func) is cst.Attribute and call.func.attr.value in self  # type: ignore[union-attr]
        return any(id(fn) in self.defs for fn in called)


def calls_named(tree: TreeCache, name: str, on_self: bool) -> List[Tuple[int, cst.Call]]:
    """The module's calls ``name(...)`` (or, ``on_self``, ``self.name(...)``),
    each with its place among the module's calls, in walk order: the only
    calls that can run a function of that name (indexed once per tree)."""
    index = tree.memo.get("calls_named")
    if not isinstance(index, dict):
        index = tree.memo["calls_named"] = {}
        for k, call in enumerate(tree.nodes((cst.Call,))):
            func = call.func  # type: ignore[attr-defined]
            if type(func) is cst.Name:
                index.setdefault((False, func.value), []).append((k, call))
            elif type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value == "self":
                index.setdefault((True, func.attr.value), []).append((k, call))
    return index.get((on_self, name), [])  # type: ignore[no-any-return]
