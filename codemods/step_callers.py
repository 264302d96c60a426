"""Which of a module's helpers the step loops of *other* project modules hand
a loop counter to (read, never rewritten).

TCN's ``word_cnn_test.py`` trains with ``data, targets = get_batch(train_data,
i, args)`` in its step loop; ``get_batch`` lives in ``utils.py``, which it
imports (``from TCN.word_cnn.utils import *``) and which has no loop of its
own.  Whether that call stands in a step loop, and which of its arguments
carry the loop's counter, is a fact of the caller's tree, asked by the same
definitions the caller's own rules use (:class:`LoopCodemod`'s step loops,
``codemods.analysis.counters``): :func:`handed_calls` parses each caller that
:func:`codemods.analysis.importers.step_callers` names (once per process while
its size and time stay the same) and walks nothing but its module node.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.counters import ThroughCall, counter_through_call
from codemods.analysis.dataflow import dataflow
from codemods.analysis.importers import step_callers
from codemods.analysis.project import resolve
from codemods.base import SOURCE_KEY, Context
from codemods.loop_codemod import LoopCodemod
from codemods.syntax.nodes import dotted
from codemods.syntax.tree import TreeCache, find_all


class _Callers(LoopCodemod):
    DESCRIPTION = "Find the calls of another module's helpers in this module's step loops (reads, never rewrites)."

    def __init__(self, context: Context, callee: TreeCache, helpers: Dict[str, cst.FunctionDef],
                 methods: Dict[str, Tuple[str, cst.FunctionDef]]) -> None:
        super().__init__(context)
        self.callee = callee
        self.helpers = helpers
        self.methods = methods  # method name -> (its class, the method)
        self.found: List[ThroughCall] = []

    def visit_Module(self, node: cst.Module) -> bool:  # type: ignore[override]
        super().visit_Module(node)
        names, modules = self._bound_to_callee()
        local = dataflow(self.tree)
        own = {f.name.value for f in find_all(node, cst.FunctionDef)}  # type: ignore[attr-defined]
        for call in find_all(node, cst.Call):
            func = call.func  # type: ignore[attr-defined]
            fn = None
            if isinstance(func, cst.Name) and func.value in names and local.local_function(call) is None:
                fn = self.helpers.get(func.value)
            elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in modules:
                fn = self.helpers.get(func.attr.value)
            elif isinstance(func, cst.Attribute) and func.attr.value not in own:
                # `scheduler.step(...)`: a method of a class this module imports from
                # the callee, named by no function of this module
                owner, fn = self.methods.get(func.attr.value, (None, None))
                if owner is None or not (owner in names or modules):
                    fn = None
            counters = self.hot_counters_around(call) if fn is not None else set()
            if not counters:
                continue
            scope = next((a for a in self.ancestors(call) if isinstance(a, cst.FunctionDef)), None)
            tensors = self._tensor_names(scope.body if scope is not None else node)
            if scope is not None:
                tensors = tensors | self._tensor_names(node)
            hit = counter_through_call(self.tree, call, counters, tensors, callee=(self.callee, fn))  # type: ignore[arg-type]
            if hit is not None:
                self.found.append(hit)
        return False  # (nothing below is walked: the questions above are all it asks)

    def _bound_to_callee(self) -> Tuple[Set[str], Set[str]]:
        """The helper names this module imports from the callee (every one,
        for ``import *``) and the names it binds the callee module to."""
        target = os.path.abspath(self.callee.filename or "")
        names: Set[str] = set()
        modules: Set[str] = set()
        for node in find_all(self.tree.module, (cst.ImportFrom, cst.Import)):
            if isinstance(node, cst.ImportFrom):
                module = "." * len(node.relative) + (_name(node.module) if node.module is not None else "")
                if not _is(resolve(self.context.filename, module), target):
                    continue
                known = set(self.helpers) | {owner for owner, _ in self.methods.values()}
                if isinstance(node.names, cst.ImportStar):
                    names |= known
                else:
                    names |= {(a.asname.name.value if a.asname else _name(a.name))  # type: ignore[union-attr]
                              for a in node.names if _name(a.name) in known}
            else:
                for alias in node.names:
                    if alias.asname is not None and _is(resolve(self.context.filename, _name(alias.name)), target):
                        modules.add(alias.asname.name.value)  # type: ignore[union-attr]
        return names, modules


def _name(node: cst.BaseExpression) -> str:
    return dotted(node) or ""


def _is(path: Optional[Path], target: str) -> bool:
    return path is not None and os.path.abspath(path) == target


def handed_calls(tree: TreeCache, helpers: Dict[str, cst.FunctionDef],
                 methods: Optional[Dict[str, Tuple[str, cst.FunctionDef]]] = None) -> List[ThroughCall]:
    """The calls of ``helpers`` (top-level functions of ``tree``, by name)
    and of ``methods`` (name -> its class and the method: called on any
    object, by a module that imports the class) in other project modules'
    step or loader loops that hand them a counter, with the subscripts of
    each it reaches (``ThroughCall``).  Each caller is parsed once for the
    tree (its answer holds this tree's nodes)."""
    methods = methods or {}
    if not tree.filename or not (helpers or methods):
        return []
    callers: Dict[Path, None] = {}
    for name, paths in step_callers(tree.filename, tree.source).items():
        if name in helpers or name in methods:
            callers.update(dict.fromkeys(paths))
    return [hit for path in callers for hit in _handed(path, tree, helpers, methods)]


def _handed(path: Path, tree: TreeCache, helpers: Dict[str, cst.FunctionDef],
            methods: Dict[str, Tuple[str, cst.FunctionDef]]) -> List[ThroughCall]:
    try:
        module = cst.parse_module(path.read_bytes())
    except (OSError, cst.ParserSyntaxError, RecursionError, TypeError, ValueError):
        return []  # (a caller that does not parse says so when it is converted itself)
    observer = _Callers(Context(filename=str(path), scratch={SOURCE_KEY: module.code}), tree, helpers, methods)
    try:
        observer.transform_module_impl(module)
    finally:
        if observer._tree is not None:
            observer._tree.release()
    return observer.found


def counter_calls(codemod: LoopCodemod, helpers: Set[str]) -> List[ThroughCall]:
    """Every call that hands a step or loader loop's counter to one of
    ``helpers`` (names of the module's functions and methods): the calls in
    the module's own loops, then those in other project modules' step loops
    (:func:`handed_calls`: a top-level function, or a method of a top-level
    class that no other function of the module shares a name with)."""
    tree = codemod.tree
    found: List[ThroughCall] = []
    for call in find_all(tree.module, cst.Call) if helpers else ():
        func = call.func  # type: ignore[attr-defined]
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) \
            else None
        if name not in helpers:
            continue
        counters = codemod.hot_counters_around(call)
        if not counters:
            continue
        scope = next((a for a in codemod.ancestors(call) if isinstance(a, cst.FunctionDef)), None)
        hit = counter_through_call(tree, call, counters,
                                   codemod._tensor_names(scope.body if scope is not None else tree.module))
        if hit is not None:
            found.append(hit)
    top = {fn.name.value: fn for fn in tree.module.body if isinstance(fn, cst.FunctionDef) and fn.name.value in helpers}
    methods = _methods(tree.module, helpers)
    return found + (handed_calls(tree, top, methods) if top or methods else [])


def _methods(module: cst.Module, helpers: Set[str]) -> Dict[str, tuple]:
    """Methods of the module's top-level classes named in ``helpers`` (and
    by no other method or function of the module) -> (class name, method)."""
    seen: Dict[str, list] = {}
    for node in find_all(module, cst.FunctionDef):
        seen.setdefault(node.name.value, []).append(node)  # type: ignore[attr-defined]
    found: Dict[str, tuple] = {}
    for cls in module.body:
        if not isinstance(cls, cst.ClassDef) or not isinstance(cls.body, cst.IndentedBlock):
            continue
        for fn in cls.body.body:
            if isinstance(fn, cst.FunctionDef) and fn.name.value in helpers and len(seen[fn.name.value]) == 1 \
                    and not fn.decorators:
                found[fn.name.value] = (cls.name.value, fn)
    return found



__all__ = ["counter_calls", "handed_calls"]
