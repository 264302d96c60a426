"""Which bindings reach a use of a name, and what each binds: the module's
dataflow that every analysis of what a name holds reads (kinds of values in
``values``, devices in ``placement``, ordinals in ``ordinals``, counters in
``counters``).

* ``reaching(name)``: the last unconditional binding before the use in its
  function, the conditional ones after that, and the ones later in a loop
  around the use (they reach the next iteration);
* ``source(binding)``: the value a binding binds (or the ``for`` it is the
  target of), and its place in a tuple target;
* ``arguments(fn, param)``: what the module's call sites pass to a parameter;
* ``local_function(call)``: the module's own function, class or method a
  call calls; ``self_stores(self.x)``: what the class stores in an attribute.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.calls import calls_named
from codemods.syntax.tree import TreeCache, children, find_all, node_types

_STATEMENT_FIELDS = (cst.BaseSuite, cst.BaseStatement, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler,
                     cst.Finally, cst.MatchCase)
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


class Dataflow:
    """The per-tree dataflow; get it with :func:`dataflow`."""

    def __init__(self, tree: TreeCache) -> None:
        self.tree = tree
        self._numbers: Optional[Dict[int, Tuple[int, int]]] = None
        self._defs: Optional[Dict[str, cst.CSTNode]] = None

    def functions(self) -> Dict[str, cst.CSTNode]:
        """Module-level functions and classes by name."""
        if self._defs is None:
            self._defs = {}
            for stmt in self.tree.module.body:
                for node in ([stmt] if not isinstance(stmt, (cst.If, cst.Try)) else find_all(
                        stmt, (cst.FunctionDef, cst.ClassDef), stop=(cst.FunctionDef, cst.ClassDef))):
                    if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                        self._defs.setdefault(node.name.value, node)
        return self._defs

    def self_stores(self, node: cst.Attribute) -> List[cst.BaseExpression]:
        """The values the methods of the class around ``self.x`` assign to ``self.x``."""
        cls = next((a for a in self.ancestors(node) if isinstance(a, cst.ClassDef)), None)
        if cls is None:
            return []
        stores = self.tree.memo.get(f"self_stores:{id(cls)}")
        if not isinstance(stores, dict):
            stores = {}
            for assign in find_all(cls, cst.Assign, stop=(cst.ClassDef,)):
                for t in assign.targets:  # type: ignore[attr-defined]
                    tgt = t.target
                    if (isinstance(tgt, cst.Attribute) and isinstance(tgt.value, cst.Name)
                            and tgt.value.value == "self"):
                        stores.setdefault(tgt.attr.value, []).append(assign.value)  # type: ignore[attr-defined]
            self.tree.memo[f"self_stores:{id(cls)}"] = stores
        return list(stores.get(node.attr.value, ()))

    def reaching(self, name: cst.Name) -> List[cst.CSTNode]:
        """The bindings of ``name`` that can reach this use of it."""
        bindings = binding_nodes(self.tree, name)
        if len(bindings) < 2:
            return bindings
        use_fn = self._scope_of(name)
        if any(self._scope_of(b) is not use_fn for b in bindings):
            return bindings  # bound in an enclosing scope: any of them, in any order
        numbers = self._statement_numbers()
        use = numbers.get(id(self.tree.statement_of(name)), (0, 0))[0]
        timed = sorted(((self._point(b, numbers), b) for b in bindings), key=lambda p: p[0][0])
        before = [(p, b) for p, b in timed if p[0] <= use]
        reach: List[cst.CSTNode] = []
        killer: Optional[Tuple[int, int]] = None
        for point, b in reversed(before):
            reach.append(b)
            stmt = self.tree.statement_of(b)
            block = self.tree.parents.get(id(stmt))
            if point[1] >= 0 and block is not None and self._contains(block, name):
                killer = numbers.get(id(stmt))
                break
        for point, b in timed:  # later bindings in a loop around the use reach its next iteration
            if point[0] > use:
                loop = self._common_loop(b, name)
                if loop is not None:
                    span = numbers.get(id(loop), (0, 0))
                    if killer is None or not (span[0] < killer[0] <= span[1]):
                        reach.append(b)
        return reach

    def _point(self, binding: cst.CSTNode, numbers: Dict[int, Tuple[int, int]]) -> Tuple[float, int]:
        """When a binding takes effect, in statement numbers; the second item
        is -1 for parameters (they bind before everything, and never kill a
        binding of the body)."""
        if isinstance(binding, cst.Param):
            return (-1.0, -1)
        stmt = self.tree.statement_of(binding)
        start, end = numbers.get(id(stmt), (0, 0))
        if isinstance(stmt, (cst.For, cst.With, cst.Try, cst.While)):
            return (start + 0.5, 0)  # before the body runs
        return (end + 0.5, 0)

    def source(self, binding: cst.CSTNode) -> Tuple[Optional[cst.CSTNode], List[int]]:
        """What a binding binds: (the assigned value, or the ``For`` whose
        target it is, or None; the index path of the binding inside a
        tuple target, ``a, (b, c) = ...`` gives ``[1, 0]`` for ``b``)."""
        parent = self.tree.parents.get(id(binding))
        path: List[int] = []
        node: cst.CSTNode = binding
        while isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List)):
            if isinstance(parent, (cst.Tuple, cst.List)):
                path.insert(0, next(i for i, e in enumerate(parent.elements) if e is node))
            node, parent = parent, self.tree.parents.get(id(parent))
        if isinstance(parent, cst.AssignTarget):
            assign = self.tree.parents.get(id(parent))
            return (assign.value if isinstance(assign, cst.Assign) else None), path
        if isinstance(parent, (cst.AnnAssign, cst.AugAssign, cst.NamedExpr)):
            return parent.value, path
        if isinstance(parent, cst.For):
            return parent, path
        return None, path

    def arguments(self, fn: cst.FunctionDef, param: cst.Param) -> List[cst.BaseExpression]:
        """What the module's call sites pass for ``param`` of ``fn``: calls by
        name for module functions, ``self.fn(...)`` for methods, ``Cls(...)``
        for ``Cls.__init__``."""
        params = list(fn.params.posonly_params) + list(fn.params.params)
        names = [p.name.value for p in params]
        is_method = bool(names) and names[0] == "self"
        index = names.index(param.name.value) - (1 if is_method else 0) if param.name.value in names else None
        out: List[cst.BaseExpression] = []
        cls = next((a for a in self.ancestors(fn) if isinstance(a, cst.ClassDef)), None) \
            if fn.name.value == "__init__" else None  # `Sampler(model, device)` calls `__init__`
        sites = calls_named(self.tree, fn.name.value, is_method) + (
            calls_named(self.tree, cls.name.value, False) if cls is not None else [])
        for _, call in sorted(sites, key=lambda site: site[0]):  # (in the module's order)
            for i, arg in enumerate(call.args):  # type: ignore[attr-defined]
                if arg.star:
                    break
                if (arg.keyword is not None and arg.keyword.value == param.name.value) or (
                        arg.keyword is None and i == index):
                    out.append(arg.value)
        return out

    def local_function(self, call: cst.Call) -> Optional[cst.CSTNode]:
        """The module's own function or class ``call`` calls: ``f(...)`` of a
        module-level ``def f``/``class f``, or ``self.m(...)`` of a method of
        the enclosing class (not one a subclass elsewhere may override)."""
        func = call.func
        if isinstance(func, cst.Name) and not self.tree.import_qualnames(func):
            found = self.functions().get(func.value)
            if found is not None and binding_nodes(self.tree, func) == [found]:
                return found
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            cls = next((a for a in self.ancestors(call) if isinstance(a, cst.ClassDef)), None)
            if cls is not None and isinstance(cls.body, cst.IndentedBlock):
                methods = [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == func.attr.value]
                if len(methods) == 1 and not methods[0].decorators:
                    return methods[0]
        return None

    def _statement_numbers(self) -> Dict[int, Tuple[int, int]]:
        """``id(statement) -> (first, last)`` statement numbers in source order
        (``last`` covers a compound statement's body)."""
        if self._numbers is None:
            numbers: Dict[int, Tuple[int, int]] = {}
            counter = [0]

            holders, statements = node_types(_STATEMENT_FIELDS), node_types(cst.BaseStatement)  # (exact types)

            def visit(node: cst.CSTNode) -> None:
                start = counter[0]
                statement = type(node) in statements
                if statement:
                    counter[0] += 1
                for child in children(node):
                    if type(child) in holders:
                        visit(child)
                if statement:
                    numbers[id(node)] = (start, counter[0] - 1)

            visit(self.tree.module)
            visit = None  # type: ignore[assignment]  # (it refers to itself: no cycle left behind)
            self._numbers = numbers
        return self._numbers

    def ancestors(self, node: cst.CSTNode):  # type: ignore[no-untyped-def]
        cur = self.tree.parents.get(id(node))
        while cur is not None:
            yield cur
            cur = self.tree.parents.get(id(cur))

    def _scope_of(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return next((a for a in self.ancestors(node) if isinstance(a, SCOPES)), None)

    def _contains(self, outer: cst.CSTNode, node: cst.CSTNode) -> bool:
        return any(a is outer for a in self.ancestors(node))

    def _common_loop(self, a: cst.CSTNode, b: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The innermost loop (in their own scope) whose body holds both."""
        for anc in self.ancestors(a):
            if isinstance(anc, SCOPES):
                return None
            if isinstance(anc, (cst.For, cst.While)) and self._contains(anc.body, b):
                return anc
        return None


def dataflow(tree: TreeCache) -> Dataflow:
    return tree.analysis(Dataflow, "dataflow")
