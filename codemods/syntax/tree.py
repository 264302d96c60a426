"""The read side of a tree: the per-tree cache, and ``find_all`` from it.

The stateless helpers live in :mod:`codemods.syntax.nodes` (re-exported here).
:class:`TreeCache` holds what every codemod running on one tree shares: its
node index (``node_index``), its import table (``import_table``), positions
and resolved metadata (``tree_metadata``), and the analyses' memo.
"""

from __future__ import annotations

import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import libcst as cst

from codemods.syntax.import_table import RULE_PACKAGES, ImportTable
from codemods.syntax.node_index import NodeIndex
from codemods.syntax.nodes import _NODE_TYPES, call_name, children, dotted, node_types, string_value, walk
from codemods.syntax.tree_metadata import TreeMetadata

T = TypeVar("T")


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


class TreeCache(NodeIndex, ImportTable, TreeMetadata):
    """Facts about one tree, computed once and shared by every codemod that
    runs on it: the node index (parents, nodes by type, walk order), the
    import table, positions and resolved metadata, and whatever analyses a
    codemod memoises in ``memo``.  The engine starts a new one whenever a
    codemod changes the tree."""

    def __init__(self, module: cst.Module, source: bytes = b"", text: Optional[str] = None,
                 pending: Sequence[Tuple[str, Optional[str], Optional[str]]] = (),
                 filename: Optional[str] = None) -> None:
        self.module = module
        self.filename = filename  # the file the tree was read from, where known (its project's other modules)
        self.source = source
        self.text = text  # the module's code, where the engine knows it (for light positions)
        # imports earlier rewrites asked for, added only once all rules ran
        # (``import torch_xla`` for the ``torch_xla.device()`` already in the tree)
        self.pending = tuple(pending)
        self.memo: Dict[str, object] = {}
        self._init_index()
        self._init_imports()
        self._init_metadata()
        _TREES[id(module)] = self

    def analysis(self, kind: "Callable[[TreeCache], T]", key: str) -> "T":
        """The per-tree analysis ``kind(self)`` (``Values``, ``ModuleFacts``
        ...), made once and kept in ``memo`` under ``key``."""
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = kind(self)
        return found  # type: ignore[return-value]

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


    @property
    def knows_xla(self) -> bool:
        """The original file already supports XLA: it imports torch_xla or
        tests for it (``is_torch_xla_available``, ``XLA_AVAILABLE``)."""
        found = self.memo.get("knows_xla")  # (asked for each finding: searched once)
        if found is None:
            src = self.source
            found = self.memo["knows_xla"] = bool(src) and any(k in src for k in _XLA_WORDS) and _ports_xla(src)
        return bool(found)


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
