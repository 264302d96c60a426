"""The node index of a tree: parent links, and every node by type and in
walk order, built in one pass; what ``find_all`` and the analyses' searches
read instead of walking the tree again.  A part of
:class:`codemods.syntax.tree.TreeCache`."""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

import libcst as cst

from codemods.syntax.nodes import _CHILD_FIELDS, _NODE_TYPES, _child_fields


class NodeIndex:
    """Parents, nodes by type, walk order (``self.module``'s)."""

    module: cst.Module

    def _init_index(self) -> None:
        self._parents: Optional[Dict[int, cst.CSTNode]] = None
        self._by_type: Dict[type, List[cst.CSTNode]] = {}
        self._order: Dict[int, int] = {}  # id(node) -> its place in walk() order
        self._seq: List[cst.CSTNode] = []  # the nodes in walk() order
        self._ends: Optional[List[int]] = None  # place in walk() order -> where its subtree ends
        self._orders_of: Dict[type, List[int]] = {}  # node type -> the places of its nodes, ascending

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

    def nodes_unique(self) -> bool:
        """No node object appears twice in the tree (what ``unique``
        checks), found while indexing it: a node met twice is numbered
        once."""
        self.parents
        return len(self._order) == len(self._seq)

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

    def unused_name(self, base: str) -> str:
        """``base``, or ``base_1``, ``base_2`` ...: the first that no name in
        the module is (a name a rewrite binds)."""
        taken = {n.value for n in self.nodes((cst.Name,))}  # type: ignore[attr-defined]
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        return name

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
