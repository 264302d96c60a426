"""Loops around step loops: what a call runs, and whether that holds a step loop.

A loop whose every iteration runs another step loop -- through a function or
method of the module, or through a library call whose behaviour is known --
is cut by that inner loop's barriers: the state it carries is materialised at
each of them, so its own graph cannot grow with its iteration count.  Such an
*outer* loop (an epoch loop around ``train_one_epoch()``, a chunk loop around
a denoising block) needs no barrier of its own.

What a call runs:

* ``f(...)`` of a module-level ``def f`` and ``self.m(...)`` of a method of the
  enclosing class (:meth:`Dataflow.local_function`);
* ``self.loop_step(...)`` in a class built on diffusers'
  ``LoopSequentialPipelineBlocks``: it runs the ``__call__`` of every block of
  ``block_classes``.  The loop's class may be a base that several subclasses
  of the module fill with different blocks: the call runs a step loop only
  when each of those compositions holds one.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Set

import libcst as cst

from codemods.analysis.dataflow import dataflow
from codemods.syntax.tree import TreeCache, dotted, find_all

_NESTED = (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)
_LOOP_BLOCKS = "LoopSequentialPipelineBlocks"

IsStepLoop = Callable[[cst.CSTNode], bool]


def _class_of(tree: TreeCache, node: cst.CSTNode) -> Optional[cst.ClassDef]:
    parents = tree.parents
    cur = parents.get(id(node))
    while cur is not None and not isinstance(cur, cst.ClassDef):
        cur = parents.get(id(cur))
    return cur


def _local_bases(cls: cst.ClassDef) -> List[str]:
    return [dotted(b.value) or "" for b in cls.bases]


def _is_loop_blocks(tree: TreeCache, cls: cst.ClassDef, seen: Optional[Set[str]] = None) -> bool:
    """``cls`` derives (through classes of the module) from diffusers'
    ``LoopSequentialPipelineBlocks``."""
    seen = seen if seen is not None else set()
    seen.add(cls.name.value)
    defs = dataflow(tree).functions()
    for base in cls.bases:
        quals = tree.import_qualnames(base.value) or set()
        if any(q.split(".")[-1] == _LOOP_BLOCKS for q in quals):
            return True
        local = defs.get(dotted(base.value) or "")
        if isinstance(local, cst.ClassDef) and local.name.value not in seen and _is_loop_blocks(tree, local, seen):
            return True
    return False


def _block_lists(tree: TreeCache, cls: cst.ClassDef) -> List[List[cst.CSTNode]]:
    """The ``block_classes`` compositions ``cls`` and its subclasses of the
    module run: one list of local classes per class that sets it."""
    defs = dataflow(tree).functions()
    family: Set[str] = {cls.name.value}
    changed = True
    while changed:  # the subclasses of cls, transitively
        changed = False
        for node in defs.values():
            if isinstance(node, cst.ClassDef) and node.name.value not in family and any(
                    b in family for b in _local_bases(node)):
                family.add(node.name.value)
                changed = True
    out: List[List[cst.CSTNode]] = []
    for name in sorted(family):
        node = defs[name]
        body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()  # type: ignore[attr-defined]
        for stmt in body:
            for assign in find_all(stmt, cst.Assign, stop=_NESTED):
                if any(isinstance(t.target, cst.Name) and t.target.value == "block_classes"
                       for t in assign.targets) and isinstance(assign.value, (cst.List, cst.Tuple)):  # type: ignore[attr-defined]
                    blocks = [defs.get(dotted(e.value) or "") for e in assign.value.elements]  # type: ignore[attr-defined]
                    out.append([b for b in blocks if isinstance(b, cst.ClassDef)])
    return out


def _method(cls: cst.ClassDef, name: str, tree: TreeCache) -> Optional[cst.FunctionDef]:
    """``cls.name`` defined in ``cls`` or in a base class of the module."""
    defs = dataflow(tree).functions()
    todo, seen = [cls], set()
    while todo:
        c = todo.pop(0)
        if c.name.value in seen:
            continue
        seen.add(c.name.value)
        body = c.body.body if isinstance(c.body, cst.IndentedBlock) else ()  # type: ignore[attr-defined]
        for stmt in body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                return stmt
        todo.extend(d for d in (defs.get(b) for b in _local_bases(c)) if isinstance(d, cst.ClassDef))
    return None


def compositions(tree: TreeCache, call: cst.Call) -> Optional[List[List[cst.CSTNode]]]:
    """What ``call`` runs, as alternatives: each a list of the module's
    functions that one way of running it calls.  None when unknown."""
    fn = dataflow(tree).local_function(call)
    if isinstance(fn, cst.FunctionDef):
        return [[fn]]
    func = call.func
    if (isinstance(func, cst.Attribute) and func.attr.value == "loop_step"
            and isinstance(func.value, cst.Name) and func.value.value == "self"):
        cls = _class_of(tree, call)
        if cls is not None and _is_loop_blocks(tree, cls):
            runs = [[m for m in (_method(b, "__call__", tree) for b in blocks) if m is not None]  # type: ignore[arg-type]
                    for blocks in _block_lists(tree, cls)]
            return runs or None
    return None


def runs_step_loop(tree: TreeCache, fn: cst.CSTNode, is_step_loop: IsStepLoop,
                   busy: Optional[Set[int]] = None) -> bool:
    """``fn`` holds a step loop, in its own body or in what it calls."""
    memo: Dict[int, bool] = tree.memo.setdefault("runs_step_loop", {})  # type: ignore[assignment]
    if id(fn) in memo:
        return memo[id(fn)]
    busy = busy if busy is not None else set()
    if id(fn) in busy:
        return False
    busy.add(id(fn))
    found = any(is_step_loop(lp) for lp in find_all(fn, (cst.For, cst.While)))
    if not found:
        found = any(calls_step_loop(tree, c, is_step_loop, busy)  # type: ignore[arg-type]
                    for c in find_all(fn, cst.Call, stop=(cst.ClassDef, cst.Lambda)))
    busy.discard(id(fn))
    memo[id(fn)] = found
    return found


def calls_step_loop(tree: TreeCache, call: cst.Call, is_step_loop: IsStepLoop,
                    busy: Optional[Set[int]] = None) -> bool:
    """Every way ``call`` may run includes a step loop."""
    runs = compositions(tree, call)
    if not runs:
        return False
    return all(any(runs_step_loop(tree, fn, is_step_loop, busy) for fn in way) for way in runs)


def is_outer_loop(tree: TreeCache, loop: cst.CSTNode, is_step_loop: IsStepLoop) -> bool:
    """Each iteration of ``loop`` runs a step loop through a call at its own
    level (not under a branch, a nested loop or a function): that loop's
    barriers cut it."""
    busy: Set[int] = tree.memo.setdefault("outer_busy", set())  # type: ignore[assignment]
    if id(loop) in busy:  # a loop reached again through the calls it makes
        return False
    busy.add(id(loop))
    try:
        return any(calls_step_loop(tree, c, is_step_loop)  # type: ignore[arg-type]
                   for c in find_all(loop.body, cst.Call, stop=_NESTED + (cst.If, cst.Try)))  # type: ignore[attr-defined]
    finally:
        busy.discard(id(loop))
