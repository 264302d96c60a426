"""The read side of a tree: the per-tree cache, and ``find_all`` from it.

The stateless helpers live in :mod:`codemods.syntax.nodes` (re-exported here).
:class:`TreeCache` holds what every
codemod running on one tree shares (parents, imports, resolved metadata, the
analyses' memo).
"""

from __future__ import annotations

import ast
from bisect import bisect_left
import weakref
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from codemods.syntax.nodes import (_CHILD_FIELDS, _NODE_TYPES, _child_fields, call_name, children, dotted, node_types, string_value,
                            walk)

# The packages whose names the rules look for.  A name imported from any other
# package can never match a rule, so it needs no scope analysis to be sure.
RULE_PACKAGES = ("torch", "torch_xla", "tqdm")


def find_all(node: cst.CSTNode, kind: Union[type, Tuple[type, ...]], stop: Tuple[type, ...] = ()) -> List[cst.CSTNode]:
    """All descendants of ``node`` (itself included) of type ``kind``.

    Does not descend into nodes of the ``stop`` types (other than ``node``).
    """
    global _LAST_INDEXED
    wanted = node_types(kind)
    last = _LAST_INDEXED()  # (the tree of the last search, asked first)
    if last is not None and last._parents is not None and id(node) in last._order:
        return last.find_in(node, wanted, node_types(stop) if stop else frozenset())
    for tree in list(_TREES.values()):  # a node of an indexed tree: the type index answers, no walk
        if tree._parents is not None and id(node) in tree._order:
            _LAST_INDEXED = weakref.ref(tree)
            return tree.find_in(node, wanted, node_types(stop) if stop else frozenset())
    return [n for n in walk(node, stop) if type(n) in wanted]


def _nothing() -> None:
    return None


_LAST_INDEXED: Callable[[], Optional["TreeCache"]] = _nothing


def parent_map(module: cst.Module) -> Dict[int, cst.CSTNode]:
    """``id(node) -> parent`` for every node of ``module``: its TreeCache's
    (shared, built once), or a new TreeCache's for a module without one."""
    return tree_of(module).parents


def tree_of(module: cst.Module) -> "TreeCache":
    """The TreeCache of ``module`` (a new one for a module without one)."""
    tree = _TREES.get(id(module))
    if tree is None or tree.module is not module:
        tree = TreeCache(module)
    return tree


# ---------------------------------------------------------------- per-tree cache


# The trees a TreeCache indexes, by id() of their module (checked with `is`).
_TREES: "weakref.WeakValueDictionary[int, TreeCache]" = weakref.WeakValueDictionary()

_BINDING_NODES = (cst.Import, cst.ImportFrom, cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor,
                  cst.NamedExpr, cst.Param, cst.FunctionDef, cst.ClassDef, cst.WithItem, cst.ExceptHandler,
                  cst.ExceptStarHandler, cst.Global, cst.Nonlocal, cst.Del)


_TARGETED = frozenset({cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr})


class TreeCache:
    """Facts about one tree, computed once and shared by every codemod that
    runs on it: parent links, resolved metadata, and whatever analyses a
    codemod memoises in ``memo``.  The engine starts a new one whenever a
    codemod changes the tree."""

    def __init__(self, module: cst.Module, source: bytes = b"", text: Optional[str] = None,
                 pending: Sequence[Tuple[str, Optional[str], Optional[str]]] = ()) -> None:
        self.module = module
        self.source = source
        self.text = text  # the module's code, where the engine knows it (for light positions)
        # imports earlier rewrites asked for, added only once all rules ran
        # (``import torch_xla`` for the ``torch_xla.device()`` already in the tree)
        self.pending = tuple(pending)
        self.memo: Dict[str, object] = {}
        self._parents: Optional[Dict[int, cst.CSTNode]] = None
        self._by_type: Dict[type, List[cst.CSTNode]] = {}
        self._order: Dict[int, int] = {}  # id(node) -> its place in walk() order
        self._seq: List[cst.CSTNode] = []  # the nodes in walk() order
        self._ends: Optional[List[int]] = None  # place in walk() order -> where its subtree ends
        self._orders_of: Dict[type, List[int]] = {}  # node type -> the places of its nodes, ascending
        _TREES[id(module)] = self
        self._light_calls = 0
        self._positions: Dict[int, Tuple[int, int, int, int]] = {}
        self._imports: Optional[Dict[str, str]] = None
        self._rebound: Optional[Set[str]] = None
        self._metadata: Dict[type, Mapping[cst.CSTNode, object]] = {}
        self._wrapper: Optional[MetadataWrapper] = None

    @property
    def parents(self) -> Dict[int, cst.CSTNode]:
        if self._parents is None:
            parents: Dict[int, cst.CSTNode] = {}
            nodes = _NODE_TYPES
            by_type = self._by_type
            order = self._order
            seq = self._seq
            fields_of = _CHILD_FIELDS
            stack: List[cst.CSTNode] = [self.module]
            pop, push, add = stack.pop, stack.append, seq.append
            while stack:
                n = pop()
                kind = type(n)
                bucket = by_type.get(kind)
                if bucket is None:
                    bucket = by_type[kind] = []
                bucket.append(n)
                order[id(n)] = len(seq)
                add(n)
                fields = fields_of.get(kind)
                if fields is None:
                    fields = _child_fields(kind)
                for name in fields:
                    value = getattr(n, name)
                    vkind = type(value)
                    if vkind in nodes:
                        parents[id(value)] = n
                        push(value)
                    elif vkind is tuple or vkind is list:
                        for k in value:
                            if type(k) in nodes:
                                parents[id(k)] = n
                                push(k)
            self._parents = parents
        return self._parents

    def release(self) -> None:
        """Let go of everything computed about the tree, so that it is freed
        as soon as the caller lets go of it rather than by the cycle
        collector: the analyses in ``memo`` refer back to this cache, and
        the closures they made refer to them.  Each analysis object is
        emptied (it is never read again)."""
        for value in list(self.memo.values()):
            _empty(value)
        self.memo.clear()
        # (a visitor class made inside a function is in a reference cycle of its
        # own, which may hold this cache: then at least not the tree)
        self.module = None  # type: ignore[assignment]
        self.source, self.text = b"", None
        self._parents, self._ends, self._seq = None, None, []
        self._by_type, self._order, self._orders_of, self._positions, self._metadata = {}, {}, {}, {}, {}
        self._wrapper = None

    def nodes_unique(self) -> bool:
        """No node object appears twice in the tree (what ``unique``
        checks), found while indexing it: a node met twice is numbered
        once."""
        self.parents
        return len(self._order) == len(self._seq)

    @property
    def knows_xla(self) -> bool:
        """The original file already supports XLA: it imports torch_xla or
        tests for it (``is_torch_xla_available``, ``XLA_AVAILABLE``)."""
        found = self.memo.get("knows_xla")  # (asked for each finding: searched once)
        if found is None:
            src = self.source
            found = self.memo["knows_xla"] = bool(src) and any(k in src for k in _XLA_WORDS) and _ports_xla(src)
        return bool(found)

    @property
    def imports(self) -> Dict[str, str]:
        """Local name -> qualified name for every import in the module
        (``import torch as T`` gives ``{"T": "torch"}``)."""
        if self._imports is None:
            self._scan_bindings()
        return self._imports  # type: ignore[return-value]

    @property
    def rebound(self) -> Set[str]:
        """Names bound anywhere in the module other than by one import:
        assignments, parameters, loop targets, definitions, conflicting imports."""
        if self._rebound is None:
            self._scan_bindings()
        return self._rebound  # type: ignore[return-value]

    def _scan_bindings(self) -> None:
        table: Dict[str, str] = {}
        rebound: Set[str] = set()

        def bind_import(local: str, full: str) -> None:
            if table.get(local, full) != full:
                rebound.add(local)
            table[local] = full

        for module, obj, asname in self.pending:
            if obj is None:
                bind_import(asname or module.split(".")[0], module if asname else module.split(".")[0])
            else:
                bind_import(asname or obj, f"{module}.{obj}")
        for node in self.nodes(_BINDING_NODES):  # the type index: no walk of the tree
            kind = type(node)  # (exact types: none of these classes has a subclass)
            if kind is cst.Import:
                for alias in node.names:
                    full = dotted(alias.name) or ""
                    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                        bind_import(alias.asname.name.value, full)
                    else:
                        bind_import(full.split(".")[0], full.split(".")[0])
            elif kind is cst.ImportFrom and not isinstance(node.names, cst.ImportStar):
                base = "." * len(node.relative) + ((dotted(node.module) or "") if node.module else "")
                for alias in node.names:
                    name = dotted(alias.name) or ""
                    asname = alias.asname
                    local = asname.name.value if (asname is not None and isinstance(asname.name, cst.Name)) else name
                    bind_import(local, f"{base}.{name}")
            elif kind in _TARGETED:
                rebound |= _bound_names(node.target)
            elif kind is cst.Param or kind is cst.FunctionDef or kind is cst.ClassDef:
                rebound.add(node.name.value)
            elif kind is cst.WithItem or kind is cst.ExceptHandler or kind is cst.ExceptStarHandler:
                asname = node.asname if kind is cst.WithItem else node.name
                if asname is not None:
                    rebound |= _bound_names(asname.name)
            elif kind is cst.Global or kind is cst.Nonlocal or kind is cst.Del:
                rebound |= {n.value for n in find_all(node, cst.Name)}
        self._imports, self._rebound = table, rebound

    def import_qualnames(self, node: cst.CSTNode) -> Optional[Set[str]]:
        """The qualified name of a ``Name``/``Attribute`` chain read through
        the module's imports, or None when that is not certain (its root is
        also bound some other way somewhere in the module)."""
        text = dotted(node)
        if not text:
            return set()
        root, _, rest = text.partition(".")
        full = self.imports.get(root)
        if full is None:
            # Not imported: it can only be a local or builtin name, never
            # one of the library names the rules look for.
            return set()
        if root in self.rebound and full.split(".")[0] in RULE_PACKAGES:
            return None
        return {f"{full}.{rest}" if rest else full}

    def ancestor_ids(self, nodes: Iterable[cst.CSTNode]) -> Set[int]:
        keep: Set[int] = {id(self.module)}
        parents = self.parents
        for n in nodes:
            cur: Optional[cst.CSTNode] = n
            while cur is not None and id(cur) not in keep:
                keep.add(id(cur))
                cur = parents.get(id(cur))
        return keep

    def in_walk_order(self, kinds: Iterable[type]) -> List[cst.CSTNode]:
        """The module's nodes of the exact types ``kinds``, in the order
        :func:`walk` gives them (what ``find_all(module, ...)`` returns)."""
        kinds = [k for k in kinds if k in self._by_type]
        lists = [self._by_type[k] for k in kinds]
        if len(lists) == 1:
            return list(lists[0])
        seq = self._seq  # (places in walk order: sorting them sorts the nodes)
        return [seq[p] for p in sorted(p for k in kinds for p in self._places(k))]

    def find_in(self, node: cst.CSTNode, wanted: FrozenSet[type], stops: FrozenSet[type]) -> List[cst.CSTNode]:
        """``find_all(node, ...)`` for a node of this tree, from the index:
        :func:`walk` is depth-first, so a subtree is one run of walk order
        (and a walk from ``node`` meets its nodes in the same order)."""
        start = self._order[id(node)]
        if start == 0 and not stops:
            return self.in_walk_order(wanted)  # the whole module
        ends = self._subtree_ends()
        end = ends[start]
        found: List[Tuple[int, cst.CSTNode]] = []
        for kind in wanted:
            places = self._places(kind)
            i, j = bisect_left(places, start), bisect_left(places, end)
            if i < j:
                found.extend(zip(places[i:j], self._by_type[kind][i:j]))
        if stops and found:
            cuts: List[Tuple[int, int]] = []  # what lies below a stop node (the stop node itself counts)
            for kind in stops:
                places = self._places(kind)
                cuts.extend((p, ends[p]) for p in places[bisect_left(places, start + 1):bisect_left(places, end)])
            if cuts:
                cuts.sort()
                merged: List[Tuple[int, int]] = []
                for a, b in cuts:
                    if merged and a < merged[-1][1]:
                        merged[-1] = (merged[-1][0], max(merged[-1][1], b))
                    else:
                        merged.append((a, b))
                firsts = [a for a, _ in merged]
                kept = []
                for place, n in found:
                    k = bisect_left(firsts, place) - 1  # the last cut starting before place
                    if k < 0 or place >= merged[k][1]:
                        kept.append((place, n))
                found = kept
        if len(wanted) > 1:
            found.sort(key=lambda pair: pair[0])
        return [n for _, n in found]

    def _places(self, kind: type) -> List[int]:
        places = self._orders_of.get(kind)
        if places is None:
            order = self._order
            places = self._orders_of[kind] = [order[id(n)] for n in self._by_type.get(kind, ())]
        return places

    def _subtree_ends(self) -> List[int]:
        """For each place in walk order, where the subtree there ends."""
        if self._ends is None:
            parents, order, seq = self.parents, self._order, self._seq
            ends = list(range(1, len(seq) + 1))
            for place in range(len(seq) - 1, 0, -1):  # children come after their parent
                up = order[id(parents[id(seq[place])])]
                if ends[place] > ends[up]:
                    ends[up] = ends[place]
            self._ends = ends
        return self._ends

    def nodes(self, kinds: Tuple[type, ...]) -> List[cst.CSTNode]:
        """Every node of the module of one of ``kinds`` (exact types), from an
        index built with the parent links: no walk of the tree."""
        self.parents  # builds the index
        return [n for kind in kinds for n in self._by_type.get(kind, ())]

    def statements_where(self, pred: Callable[[cst.CSTNode], bool], kinds: Tuple[type, ...]) -> List[cst.CSTNode]:
        """The innermost statements holding a node of ``kinds`` for which
        ``pred`` is true (each once): the usual ``regions`` of a codemod."""
        found = {id(st): st for st in (self.statement_of(n) for n in self.nodes(kinds) if pred(n))}
        return list(found.values())

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The innermost statement holding ``node`` (``node`` if it is one)."""
        cur: Optional[cst.CSTNode] = node
        while cur is not None and not isinstance(cur, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            cur = self.parents.get(id(cur))
        return cur or node

    def position(self, context: Any, node: cst.CSTNode) -> Tuple[int, int, int, int]:
        """One node's (line, col, end line, end col).  The first few questions
        on a tree are answered by light passes for just those nodes; past
        that, LibCST's full position metadata is computed once and used."""
        if id(node) in self._positions:
            return self._positions[id(node)]
        if PositionProvider not in self._metadata and self._light_calls < 3:
            self._light_calls += 1
            found = self.start_positions([node]).get(id(node))
            if found is not None:
                self._positions[id(node)] = found
                return found
        pos = self.metadata(context, PositionProvider)[node]
        return pos.start.line, pos.start.column + 1, pos.end.line, pos.end.column + 1  # type: ignore[attr-defined]

    def start_positions(self, nodes: List[cst.CSTNode]) -> Dict[int, Tuple[int, int, int, int]]:
        """``id(node) -> (line, col)``: from the full position metadata when
        it was computed anyway, else from one pass for just these nodes."""
        full = self._metadata.get(PositionProvider)
        if full is not None:
            return {id(n): (full[n].start.line, full[n].start.column + 1, full[n].end.line,  # type: ignore[attr-defined]
                            full[n].end.column + 1) for n in nodes if n in full}  # type: ignore[attr-defined]
        from codemods.syntax.positions import tree_positions

        return tree_positions(self, nodes)

    def statement_starts(self) -> Optional[Dict[int, int]]:
        """``positions.statement_starts`` of this tree's text (computed once),
        or None where the text is unknown or does not line up."""
        if "statement_starts" not in self.memo:
            from codemods.syntax.positions import statement_starts

            parsed = self._ast()
            self.memo["statement_starts"] = None if parsed is None else statement_starts(
                self.module, self.text, parsed)  # type: ignore[arg-type]
        return self.memo["statement_starts"]  # type: ignore[return-value]

    def statement_positions(self) -> Dict[int, Tuple[int, int, int, int]]:
        """``positions.statement_positions`` of this tree (computed once;
        empty where the text is unknown or ast cannot read it)."""
        if "statement_positions" not in self.memo:
            from codemods.syntax.positions import statement_positions

            parsed = self._ast()
            self.memo["statement_positions"] = {} if parsed is None else statement_positions(
                self.module, self.text, parsed)  # type: ignore[arg-type]
        return self.memo["statement_positions"]  # type: ignore[return-value]

    def _ast(self) -> Optional[ast.Module]:
        """Python's ``ast`` parse of this tree's text (the prefilter's, where
        the engine hands it over), once; None where there is no text or ast
        refuses it."""
        if self.memo.get("ast") is None and self.text is not None and "ast_failed" not in self.memo:
            try:
                self.memo["ast"] = ast.parse(self.text)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                self.memo["ast_failed"] = True
        return self.memo.get("ast")  # type: ignore[return-value]

    def metadata(self, context: Any, provider: type) -> Mapping[cst.CSTNode, object]:
        found = self._metadata.get(provider)
        if found is None:
            wrapper = context.wrapper
            if wrapper is None or wrapper.module is not self.module:
                # Our own engine: the tree is never copied (see ``unique``),
                # so a wrapper can be made for it at any time.
                if self._wrapper is None:
                    self._wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
                wrapper = self._wrapper
            found = self._metadata[provider] = wrapper.resolve(provider)
        return found


def _empty(value: object, depth: int = 0) -> None:
    """Empty an analysis (``codemods.analysis``) held in a TreeCache's
    ``memo``, or those in a dict or list there, breaking the cycles through
    it."""
    kind = type(value)
    if kind in _PLAIN or kind in _NODE_TYPES or depth > 1:
        return  # (a node, a position, a name: nothing to break)
    if isinstance(value, dict):
        for v in list(value.values()):
            _empty(v, depth + 1)
        value.clear()
    elif isinstance(value, list):
        for v in value:
            _empty(v, depth + 1)
        value.clear()
    elif kind.__module__.startswith("codemods.analysis.") and hasattr(value, "__dict__"):
        # only the per-tree analyses (Values, ModuleFacts, CudaFacts, scopes):
        # an ast tree here is the prefilter's too, a target is shared
        vars(value).clear()


_PLAIN = frozenset({tuple, int, str, bool, float, type(None), frozenset, set})


def unique(module: cst.Module) -> cst.Module:
    """``module`` itself when no node object appears twice in it (what
    metadata needs), else a deep copy.  Codemod output nearly always
    qualifies, and checking (the engine's own test, ``nodes_unique``) is
    much cheaper than copying."""
    return module if TreeCache(module).nodes_unique() else module.deep_clone()


def _bound_names(target: object) -> Set[str]:
    """Names bound by an assignment target (not ``a.b`` or ``a[i]``)."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for e in target.elements for n in _bound_names(e.value)}
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return set()


# (the helpers of codemods.syntax.nodes are read from here too)
__all__ = ["RULE_PACKAGES", "TreeCache", "call_name", "children", "dotted", "find_all", "node_types", "parent_map",
           "string_value", "unique", "walk"]


_XLA_GUARDS = ("is_torch_xla_available", "XLA_AVAILABLE", "is_tpu_available")
_XLA_WORDS = (b"torch_xla",) + tuple(g.encode() for g in _XLA_GUARDS)


def _ports_xla(source: bytes) -> bool:
    """The code itself (not a comment, a docstring or a string) imports
    torch_xla or reads one of the XLA guards: read from the original file,
    so that what the rules add on the way never counts."""
    import ast

    from codemods.syntax.pyast import parsed

    tree = parsed(source)
    if tree is None:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch_xla" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch_xla" and not node.level:
            return True
        if isinstance(node, ast.Name) and node.id in _XLA_GUARDS:
            return True
        if isinstance(node, ast.Attribute) and node.attr in _XLA_GUARDS:
            return True
        if isinstance(node, ast.alias) and node.name in _XLA_GUARDS:
            return True
    return False
