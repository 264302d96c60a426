"""CUDA tests that must get one answer: state one side leaves, another reads.

XLA116 decides a CUDA test whose CUDA side needs CUDA itself the way a host
without CUDA does (the other side); every other CUDA test is taken as true on
XLA.  Each test is decided on its own, which is right while the two do not
talk.  When they do, the conversion mixes two hosts' programs and fails where
neither did -- DeiT's and torchvision's ``MetricLogger.log_every``::

    if torch.cuda.is_available():           # taken on XLA ...
        log_msg.append('max mem: {memory:.0f}')
    ...
    if torch.cuda.is_available():           # ... but this one is not (memory statistics)
        print(log_msg.format(..., memory=torch.cuda.max_memory_allocated() / MB))
    else:
        print(log_msg.format(...))          # KeyError: 'memory'

:func:`coupled_guards` finds, in each function (with the closures it
holds), the CUDA tests tied to one
XLA116 decides the other way: one of them changes a name (binds it, or calls
a method that changes it in place) that the other reads or changes.  Those
are answered as the XLA116 test is -- the program then does in that function
what it does on a host without CUDA, where it ran.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import target_names
from codemods.analysis.guards import cuda_only, guards
from codemods.syntax.nodes import walk
from codemods.syntax.tree import TreeCache

# methods that change their object in place: a call of one changes the name it is called on
CHANGES_IN_PLACE = frozenset({"append", "extend", "insert", "appendleft", "update", "add", "pop", "remove", "clear",
                              "setdefault", "discard", "sort", "reverse", "popitem"})


class _Guard:
    """One CUDA test: the names its sides change and read."""

    def __init__(self, node: cst.CSTNode, statement: cst.CSTNode, skip: FrozenSet[str]) -> None:
        self.node, self.scope = node, None  # type: Optional[cst.CSTNode]
        sides = [statement] if isinstance(node, cst.IfExp) else [node.body, node.orelse]  # type: ignore[attr-defined]
        self.changes: Set[str] = set()
        self.reads: Set[str] = set()
        for side in sides:
            if side is not None:
                _names(side, self.changes, self.reads)
        self.changes -= skip
        self.reads -= skip


def _names(node: cst.CSTNode, changes: Set[str], reads: Set[str]) -> None:
    for n in walk(node):
        if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]
            for target in targets:
                changes.update(_changed(target))
        elif isinstance(n, (cst.For, cst.CompFor)):
            changes.update(_changed(n.target))
        elif isinstance(n, cst.Del):
            changes.update(_changed(n.target))
        elif isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) \
                and n.func.attr.value in CHANGES_IN_PLACE and isinstance(n.func.value, cst.Name):
            changes.add(n.func.value.value)
        elif isinstance(n, cst.Attribute):
            if isinstance(n.value, cst.Name):
                reads.add(n.value.value)
        elif isinstance(n, cst.Name):
            reads.add(n.value)
    # (an attribute's own name and a keyword are Names inside it: read too, and harmless -- what
    # matters is a name one side changes; a side's own temporaries are changed and read by it alone)


def _changed(target: cst.CSTNode) -> List[str]:
    names = [n.value for n in target_names(target)]
    base = target
    while isinstance(base, (cst.Attribute, cst.Subscript)):
        base = base.value
    if base is not target and isinstance(base, cst.Name):
        names.append(base.value)  # `x.a = ...`, `x[k] = ...` change x
    return names


def coupled_guards(tree: TreeCache, qualnames, api) -> Dict[int, Tuple[cst.CSTNode, str]]:  # type: ignore[no-untyped-def]
    """id() of each CUDA ``if`` or conditional expression to answer as a
    host without CUDA because it shares state with one XLA116 answers so ->
    (that test, the shared name)."""
    key = "coupled_guards"
    found = tree.memo.get(key)
    if isinstance(found, dict):
        return found
    facts = guards(tree, qualnames)
    skip = frozenset(facts.flags)  # (a flag read by both is the question itself, not state they share)
    tests = [n for n in tree.nodes((cst.If, cst.IfExp)) if facts.tests_cuda(n.test)  # type: ignore[attr-defined]
             and not isinstance(tree.parents.get(id(n)), cst.If)]
    off: Dict[int, _Guard] = {}
    rest: List[_Guard] = []
    for node in tests:
        guard = _Guard(node, tree.statement_of(node), skip)
        guard.scope = _outermost_function(node, tree)
        side = facts.cuda_side(node)
        (off.__setitem__(id(node), guard) if side is not None and cuda_only(side, qualnames, api)
         else rest.append(guard))
    out: Dict[int, Tuple[cst.CSTNode, str]] = {}
    changed = bool(off)
    while changed:
        changed = False
        for guard in rest:
            if id(guard.node) in out:
                continue
            for other in list(off.values()):
                shared = _shared(guard, other)
                if other.scope is guard.scope and shared:
                    root = out.get(id(other.node), (other.node, ""))[0]
                    out[id(guard.node)] = (root, shared)
                    off[id(guard.node)] = guard
                    changed = True
                    break
    tree.memo[key] = out
    return out


def _outermost_function(node: cst.CSTNode, tree: TreeCache) -> cst.CSTNode:
    """The function of the module or of a class that holds ``node`` (the
    module where none does): a closure shares its enclosing function's names."""
    found: cst.CSTNode = tree.module
    cur = tree.parents.get(id(node))
    while cur is not None:
        if isinstance(cur, (cst.FunctionDef, cst.Lambda)):
            found = cur
        elif isinstance(cur, cst.ClassDef):
            break
        cur = tree.parents.get(id(cur))
    return found


def _shared(a: _Guard, b: _Guard) -> str:
    names = (a.changes & (b.reads | b.changes)) | (b.changes & a.reads)
    return sorted(names)[0] if names else ""
