"""Which statements bind a name, by Python's scoping rules, without LibCST's
``ScopeProvider`` (a full scope analysis costs seconds on a 5,000-line module,
and is computed again for every tree a rewrite produces).

``binding_nodes(tree, name)`` answers what ``ScopeProvider``'s
``scope[name.value]`` answers for the uses xlaport has -- the nodes that bind
the name in the scope the name resolves to: the ``Name`` targets of
assignments, ``for`` targets, ``with ... as``, ``except ... as``, walrus,
definitions and imports, and ``Param`` nodes.  Functions and lambdas are
scopes; class bodies are not visible from their methods; comprehension
targets are local to the comprehension; ``global``/``nonlocal`` send a name to
the module or the enclosing function.  ``tests/test_bindings.py`` compares it
with ``ScopeProvider`` on real modules.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.syntax.traverse import fields
from codemods.syntax.tree import TreeCache, dotted, node_types

_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Module)
_COMPS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
# every node type that binds a name or opens a scope (what ``_index`` reads)
_BINDERS = node_types((cst.FunctionDef, cst.ClassDef, cst.Lambda) + _COMPS + (
    cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For, cst.WithItem, cst.ExceptHandler, cst.NamedExpr,
    cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal))
_STOP = (cst.FunctionDef, cst.Lambda, cst.ClassDef) + _COMPS
_SCOPE_KINDS = node_types(_STOP)


def target_names(target: cst.CSTNode) -> List[cst.Name]:
    """The names an assignment target binds (``a, *b`` -> a, b; none of a
    subscript or an attribute it writes)."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []  # attributes and subscripts bind nothing


class _Scope:
    def __init__(self, node: cst.CSTNode, parent: Optional["_Scope"]) -> None:
        self.node = node
        self.parent = parent
        self.names: Dict[str, List[cst.CSTNode]] = {}
        self.globals: Set[str] = set()
        self.nonlocals: Set[str] = set()

    def bind(self, name: str, node: cst.CSTNode) -> None:
        self.names.setdefault(name, []).append(node)


def _index(tree: TreeCache) -> Dict[int, _Scope]:
    """id(scope node) -> its bindings (built once per tree).

    No walk of its own: the binding nodes come from the tree's index in
    walk order, and each is placed in the scope whose part of the code holds
    it (:class:`_Placer`) by going up its parent links."""
    found = tree.memo.get("scopes")
    if isinstance(found, dict):
        return found  # type: ignore[return-value]
    root = _Scope(tree.module, None)
    scopes: Dict[int, _Scope] = {id(tree.module): root}
    placer = _Placer(tree, root, scopes)
    where = placer.where
    for n in tree.in_walk_order(_BINDERS):
        kind = type(n)
        if kind in _SCOPE_KINDS:
            placer.opened(n)  # the scope it opens (made with its parameters or targets)
            if kind is cst.FunctionDef or kind is cst.ClassDef:
                scope = where(n)
                if scope is not None:
                    scope.bind(n.name.value, n)  # type: ignore[attr-defined]
            continue
        scope = where(n)
        if scope is None:
            continue
        if kind is cst.Assign:
            for t in n.targets:  # type: ignore[attr-defined]
                for name in target_names(t.target):
                    scope.bind(name.value, name)
        elif kind is cst.AnnAssign or kind is cst.AugAssign or kind is cst.For:
            for name in target_names(n.target):  # type: ignore[attr-defined]
                scope.bind(name.value, name)
        elif kind is cst.WithItem:
            if n.asname is not None:  # type: ignore[attr-defined]
                for name in target_names(n.asname.name):  # type: ignore[attr-defined]
                    scope.bind(name.value, name)
        elif kind is cst.ExceptHandler:
            if n.name is not None:  # type: ignore[attr-defined]
                for name in target_names(n.name.name):  # type: ignore[attr-defined]
                    scope.bind(name.value, name)
        elif kind is cst.NamedExpr:
            for name in target_names(n.target):  # type: ignore[attr-defined]
                _walrus_scope(scope).bind(name.value, name)
        elif kind is cst.Import or kind is cst.ImportFrom:
            if not isinstance(n.names, cst.ImportStar):  # type: ignore[attr-defined]
                for alias in n.names:  # type: ignore[attr-defined]
                    bound = alias.asname.name if alias.asname is not None else alias.name
                    while isinstance(bound, cst.Attribute):  # `import a.b` binds `a`
                        bound = bound.value
                    if isinstance(bound, cst.Name):
                        scope.bind(bound.value, n)
        elif kind is cst.Global:
            scope.globals.update(item.name.value for item in n.names)  # type: ignore[attr-defined]
        elif kind is cst.Nonlocal:
            scope.nonlocals.update(item.name.value for item in n.names)  # type: ignore[attr-defined]
    # `global x` / `nonlocal x`: the scope's own bindings of x belong to the
    # module / to the enclosing function that has x
    for scope in scopes.values():
        for name in scope.globals | scope.nonlocals:
            moved = scope.names.pop(name, [])
            target: Optional[_Scope] = root
            if name in scope.nonlocals:
                target = scope.parent
                while target is not None and (name not in target.names or isinstance(target.node, cst.ClassDef)):
                    target = target.parent
            if target is not None and moved:
                target.names.setdefault(name, []).extend(moved)
    tree.memo["scopes"] = scopes
    return scopes


# where a node sits in the node of a scope, as :class:`_Placer` reads it
_INNER, _OUTER, _UNREAD = "inner", "outer", None


class _Placer:
    """``where(node)``: the scope whose bindings a binding at ``node`` joins,
    None where Python's scoping is not read (annotations, class bases,
    lambda defaults, comprehension targets); ``opened(node)``: the scope
    ``node`` (a function, class, lambda or comprehension) opens, made on
    first asking, with its parameters or targets bound.

    Which scope a part of a scope's node belongs to: a function's or class's
    body, a lambda's body, a comprehension's element and conditions and all
    but its first iterable are inside; decorators, a function's parameter
    defaults and a comprehension's first iterable are read in the scope
    around it.  (A class, not closures that call each other: those would
    make a reference cycle holding the tree until the cycle collector runs.)"""

    def __init__(self, tree: TreeCache, root: _Scope, scopes: Dict[int, _Scope]) -> None:
        self.parents = tree.parents
        self.root = root
        self.scopes = scopes
        self.made: Dict[int, Optional[_Scope]] = {id(tree.module): root}

    def opened(self, node: cst.CSTNode) -> Optional[_Scope]:
        key = id(node)
        made = self.made
        if key in made:
            return made[key]
        outer = self.where(node)
        scope = None if outer is None else _Scope(node, outer)
        made[key] = scope
        if scope is not None:
            self.scopes[key] = scope
            if isinstance(node, (cst.FunctionDef, cst.Lambda)):
                for p in _params(node.params):
                    scope.bind(p.name.value, p)
            elif isinstance(node, _COMPS):
                for_in = node.for_in  # type: ignore[attr-defined]
                while for_in is not None:
                    for t in target_names(for_in.target):
                        scope.bind(t.value, t)
                    for_in = for_in.inner_for_in
        return scope

    def where(self, node: cst.CSTNode) -> Optional[_Scope]:
        parents = self.parents
        chain = [node]
        cur = parents.get(id(node))
        while cur is not None:
            if type(cur) in _SCOPE_KINDS:
                part = _part(cur, chain)
                if part is _INNER:
                    return self.opened(cur)
                if part is _UNREAD:
                    return None
            chain.append(cur)
            cur = parents.get(id(cur))
        return self.root


def _part(scope_node: cst.CSTNode, chain: List[cst.CSTNode]) -> Optional[str]:
    """Where ``chain[-1]`` (a child of ``scope_node``; ``chain`` runs down
    from it to the node asked about, backwards) sits in ``scope_node``."""
    child = chain[-1]
    if isinstance(scope_node, cst.FunctionDef):
        if child is scope_node.body:
            return _INNER
        if any(child is d for d in scope_node.decorators):
            return _OUTER
        if child is scope_node.params and len(chain) >= 3:
            param, part = chain[-2], chain[-3]
            return _OUTER if isinstance(param, cst.Param) and part is param.default else _UNREAD
        return _UNREAD
    if isinstance(scope_node, cst.ClassDef):
        if child is scope_node.body:
            return _INNER
        return _OUTER if any(child is d for d in scope_node.decorators) else _UNREAD
    if isinstance(scope_node, cst.Lambda):
        return _INNER if child is scope_node.body else _UNREAD
    # a comprehension
    for_in = scope_node.for_in  # type: ignore[attr-defined]
    if child is not for_in:
        return _INNER  # the element (a dict's key and value)
    k = len(chain) - 2
    first = True
    while k >= 0:
        below = chain[k]
        if below is for_in.iter:
            return _OUTER if first else _INNER
        if below is for_in.inner_for_in:
            for_in, first, k = below, False, k - 1
            continue
        return _INNER if any(below is c for c in for_in.ifs) else _UNREAD
    return _UNREAD


def _params(params: cst.Parameters) -> List[cst.Param]:
    out = list(params.posonly_params) + list(params.params) + list(params.kwonly_params)
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            out.append(star)
    return out


def _walrus_scope(scope: _Scope) -> _Scope:
    while isinstance(scope.node, _COMPS) and scope.parent is not None:
        scope = scope.parent
    return scope


def binding_nodes(tree: TreeCache, name: cst.Name) -> List[cst.CSTNode]:
    """The nodes that bind ``name`` where it is used (see the module doc)."""
    return _resolve(tree, name)[1]


def assigned_value(tree: TreeCache, bound: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """The value ``name = value`` binds a name to (a binding from
    :func:`binding_nodes`, the assignment's one target); None for any other binding."""
    target = tree.parents.get(id(bound))
    assign = tree.parents.get(id(target)) if isinstance(target, cst.AssignTarget) else None
    return assign.value if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None


def binding_scope(tree: TreeCache, name: cst.Name) -> Optional[cst.CSTNode]:
    """The node of the scope whose binding of ``name`` it reads (a
    function, a lambda, a comprehension, a class, the module), or None."""
    scope = _resolve(tree, name)[0]
    return scope.node if scope is not None else None


def _resolve(tree: TreeCache, name: cst.Name) -> Tuple[Optional[_Scope], List[cst.CSTNode]]:
    """The scope whose bindings of ``name`` it reads, and those bindings."""
    return _resolve_from(tree, _own_scope(tree, name), name.value)


def _resolve_from(tree: TreeCache, start: _Scope, value: str) -> Tuple[Optional[_Scope], List[cst.CSTNode]]:
    """Where a name read in ``start`` is bound, looking outward."""
    scopes = _index(tree)
    scope: Optional[_Scope] = start
    first = True
    while scope is not None:
        if value in scope.globals:
            scope = scopes[id(tree.module)]
            return scope, list(scope.names.get(value, ()))
        if value in scope.nonlocals:
            scope = scope.parent
            continue
        skip = isinstance(scope.node, cst.ClassDef) and not first
        if not skip and value in scope.names:
            return scope, list(scope.names[value])
        first = False
        scope = scope.parent
    return None, []


def _inside_scope_body(scope_node: cst.CSTNode, chain: List[cst.CSTNode]) -> bool:
    """``chain[-1]`` (a child of ``scope_node``; ``chain`` runs down from it,
    backwards) is in the part the scope reads names in: a function's body
    and parameters, but not its decorators, nor a parameter's default or
    annotation (read in the scope around it)."""
    if isinstance(scope_node, cst.Module):
        return True
    child = chain[-1]
    if isinstance(scope_node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and child is scope_node.body:
        return True
    if isinstance(scope_node, (cst.FunctionDef, cst.Lambda)) and child is scope_node.params:
        if len(chain) >= 3 and isinstance(chain[-2], cst.Param):
            return not (chain[-3] is chain[-2].default or chain[-3] is chain[-2].annotation)
        return True
    return isinstance(scope_node, _COMPS)  # a comprehension: all of it (its first iterable too, a simplification)


def import_qualnames(tree: TreeCache, node: cst.CSTNode) -> Optional[Set[str]]:
    """What LibCST's ``QualifiedNameProvider`` gives for a ``Name`` or
    ``Attribute`` chain, read from the bindings of its root where it is read:
    an import gives the imported name (``F.pad`` -> ``torch.nn.functional.pad``),
    any other binding the scope-qualified name (``f.<locals>.F.pad``; at
    module level ``F.pad`` itself).  None where that is not certain (a
    binding in a lambda or a comprehension, a name bound nowhere): then only
    the full scope analysis can say.

    For modules that bind an imported name some other way too (``FSDP = None``
    after a failed import, ``B, C, F, H, W = x.shape`` in one function), where
    the quick read of the imports (``TreeCache.import_qualnames``) declines.
    ``tests/test_bindings.py`` compares it with the provider on real modules."""
    text = dotted(node)
    root = node
    while isinstance(root, cst.Attribute):
        root = root.value
    if not text or not isinstance(root, cst.Name):
        return None
    own = _own_scope(tree, root)
    if isinstance(own.node, _COMPS):
        return None  # (a comprehension's first iterable is read outside it: simplified here)
    scope, bound = _resolve(tree, root)
    if scope is None or not bound or any(b is node for b in bound):
        return None
    if node is root and scope is own:
        # A plain name read in the scope that binds it: LibCST counts the
        # bindings of that scope made before it (statements left before it
        # is read), else looks outward from the enclosing scope.
        earlier = []
        for b in bound:
            # (parameters are bound before the body runs; LibCST reads
            # defaults and annotations in the enclosing scope)
            order = _in_body(tree, node, own.node) if isinstance(b, cst.Param) else _statement_order(tree, b, node)
            if order is None:
                return None  # the same statement: LibCST's own counting decides
            if order:
                earlier.append(b)
        if not earlier:
            if own.parent is None:
                return None  # builtins, or nothing
            scope, bound = _resolve_from(tree, own.parent, root.value)
            if scope is None or not bound:
                return None
        else:
            bound = earlier
    _, _, rest = text.partition(".")
    found: Set[str] = set()
    for b in bound:
        if isinstance(b, (cst.Import, cst.ImportFrom)):
            if isinstance(b.names, cst.ImportStar):
                return None
            for alias in b.names:
                imported = dotted(alias.name) or ""
                if alias.asname is not None:
                    if not isinstance(alias.asname.name, cst.Name):
                        return None
                    local = alias.asname.name.value
                else:
                    local = imported if isinstance(b, cst.ImportFrom) else imported.split(".")[0]
                    if isinstance(b, cst.Import):
                        if local != imported and local == root.value:
                            return None  # `import a.b` binds `a.b` too: LibCST looks that up first
                        imported = local
                if local != root.value:
                    continue
                if isinstance(b, cst.ImportFrom):
                    module = "." * len(b.relative) + (dotted(b.module) or "" if b.module is not None else "")
                    imported = f"{module}{imported}" if module.endswith(".") else f"{module}.{imported}"
                found.add(f"{imported}.{rest}" if rest else imported)
        else:
            prefix = _prefix(scope)
            if prefix is None:
                return None
            found.add(f"{prefix}.{text}" if prefix else text)
    return found


_STATEMENTS = (cst.BaseSmallStatement, cst.BaseCompoundStatement)


def _statement_order(tree: TreeCache, a: cst.CSTNode, b: cst.CSTNode) -> Optional[bool]:
    """Whether the statement holding ``a`` comes before the one holding
    ``b`` (in LibCST's visiting order); None when one holds the other."""
    parents = tree.parents

    def statement(n: cst.CSTNode) -> Optional[cst.CSTNode]:
        cur: Optional[cst.CSTNode] = n
        while cur is not None and not isinstance(cur, _STATEMENTS):
            cur = parents.get(id(cur))
        return cur

    sa, sb = statement(a), statement(b)
    if sa is None or sb is None:
        return None
    path: Dict[int, cst.CSTNode] = {id(sa): sa}  # id(sa or an ancestor) -> its child on the way to sa
    cur = sa
    while True:
        up = parents.get(id(cur))
        if up is None:
            break
        path[id(up)] = cur
        cur = up
    child, cur = sb, sb
    while id(cur) not in path:
        child, cur = cur, parents.get(id(cur))
        if cur is None:
            return None
    if cur is sa or cur is sb:
        return None  # one statement holds the other
    towards_a = path[id(cur)]
    for field in fields(type(cur)):
        value = getattr(cur, field)
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if item is towards_a:
                return True
            if item is child:
                return False
    return None


def _in_body(tree: TreeCache, node: cst.CSTNode, fn: cst.CSTNode) -> Optional[bool]:
    """True when ``node`` is in the body of the function ``fn``."""
    parents = tree.parents
    child, cur = node, parents.get(id(node))
    while cur is not None and cur is not fn:
        child, cur = cur, parents.get(id(cur))
    return True if cur is fn and child is getattr(fn, "body", None) else None


def _own_scope(tree: TreeCache, name: cst.Name) -> _Scope:
    """The scope ``name`` is read in (before any lookup outward)."""
    scopes = _index(tree)
    parents = tree.parents
    chain: List[cst.CSTNode] = [name]
    cur = parents.get(id(name))
    while cur is not None:
        if id(cur) in scopes and _inside_scope_body(cur, chain):
            return scopes[id(cur)]
        chain.append(cur)
        cur = parents.get(id(cur))
    return scopes[id(tree.module)]


def _prefix(scope: _Scope) -> Optional[str]:
    """LibCST's name prefix of a scope: ``f.<locals>``, ``C``, ``C.m.<locals>``."""
    parts: List[str] = []
    cur: Optional[_Scope] = scope
    while cur is not None and not isinstance(cur.node, cst.Module):
        if isinstance(cur.node, cst.FunctionDef):
            parts[:0] = [cur.node.name.value, "<locals>"]
        elif isinstance(cur.node, cst.ClassDef):
            parts.insert(0, cur.node.name.value)
        else:  # a lambda or a comprehension
            return None
        cur = cur.parent
    return ".".join(parts)


__all__ = ["assigned_value", "binding_nodes", "binding_scope", "import_qualnames"]


def read_from_module(tree: TreeCache, fn: cst.CSTNode, names: Set[str]) -> Set[str]:
    """Of ``names``, those that a read inside the function ``fn`` takes from
    the module's own bindings (bound neither in ``fn`` nor in a function
    around it; ``global`` sends a name there too)."""
    scopes = _index(tree)
    module = scopes.get(id(tree.module))
    start: Optional[_Scope] = scopes.get(id(fn))
    cur = tree.parents.get(id(fn))
    while start is None and cur is not None:  # (a function that binds nothing opens no scope of its own)
        start = scopes.get(id(cur))
        cur = tree.parents.get(id(cur))
    if start is None or module is None:
        return set()
    return {n for n in names if _resolve_from(tree, start, n)[0] is module}
