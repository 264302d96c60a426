"""The base class of the loop-aware codemods: while it walks, it knows
whether it is inside a step loop or a loader loop (the hot region) and which
names hold tensors; which loops walk a loader it asks
``codemods.analysis.data_loaders`` (``self.loaders``)."""

from __future__ import annotations

from typing import Callable, List, Optional, Set

import libcst as cst

from codemods.analysis.data_loaders import DataLoaders
from codemods.analysis.loops import (
    _DEFS,
    Loop,
    accumulates_gradients,
    body_statements,
    in_model_code,
    loop_step_kind,
    model_functions,
    module_facts,
    step_functions,
    syncing_functions,
)
from codemods.analysis.syncs import is_barrier_call
from codemods.analysis.counters import loop_counters
from codemods.analysis.nesting import is_outer_loop
from codemods.analysis.prefilter import STEP_LOOP
from codemods.analysis.bindings import read_from_module
from codemods.analysis.tensors import tensor_names
from codemods.analysis.values import values as values_of
from codemods.base import SOURCE_KEY, XlaCodemod, call_name
from codemods.syntax.nodes import SCOPES

class LoopCodemod(XlaCodemod):
    """A codemod that knows, while it walks, whether it is inside a step loop,
    a loader loop (the hot region), which names hold tensors, and which loops
    are step loops."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.steps: Set[str] = set()
        self.loop_stack: List[tuple] = []  # (loop, is_step, is_loader)
        self.tensor_stack: List[Set[str]] = []
        self.closure_depth = 0
        self._loaders: Optional[DataLoaders] = None

    @property
    def loaders(self) -> DataLoaders:
        """Which expressions are loaders and which loops walk one, in this tree."""
        if self._loaders is None or self._loaders.tree is not self.tree:
            self._loaders = DataLoaders(self.tree, self.qualnames, self.target.loader_names, self._text)
        return self._loaders

    def _text(self) -> bytes:
        text = self.context.scratch.get(SOURCE_KEY)
        return text.encode("utf-8", "surrogateescape") if isinstance(text, str) else self.tree.module.code.encode()

    # -- walking state -------------------------------------------------------
    def know_steps(self) -> None:
        """The module's step functions, which every step-loop question reads:
        set when the walk starts (``visit_Module``), or by the first such
        question asked before it (a ``regions``): an answer memoised with
        none known would be wrong for every codemod on the tree."""
        module = self.tree.module
        self.steps = self._memo("steps", module, lambda: step_functions(module))

    def visit_Module(self, node: cst.Module) -> None:
        self.know_steps()
        self.tensor_stack.append(self._tensor_names(node))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        """The function's tensors: its own, and the module's that it reads (``X_train`` sliced in ``train()``)."""
        def seen() -> Set[str]:
            own = self._tensor_names(node.body)
            module = self.tensor_stack[0] if self.tensor_stack else set()
            return own | read_from_module(self.tree, node, module - own)
        self.tensor_stack.append(self._memo("tensors_seen", node, seen))

    def _memo(self, kind: str, node: cst.CSTNode, compute: Callable[[], object]):  # type: ignore[no-untyped-def]
        """Per-tree memo shared by the loop codemods that run on one tree."""
        key = f"{kind}:{id(node)}"
        memo = self.tree.memo
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    def _tensor_names(self, node: cst.CSTNode) -> Set[str]:
        return self._memo("tensors", node, lambda: tensor_names(node, self.qualnames, self.loaders.loader_loops(node),
                                                                 values_of(self.tree)))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.CSTNode:
        self.tensor_stack.pop()
        return updated_node

    def is_step_loop(self, loop: Loop) -> bool:
        """:func:`is_step_loop`, and not inside a model's own forward/backward."""
        called = self._memo("model_functions", self.tree.module, lambda: model_functions(self.tree))
        return self._memo("step_loop", loop, lambda: self._is_step_loop(loop, called))

    def _is_step_loop(self, loop: Loop, called: Set[str]) -> bool:
        self.know_steps()
        kind = loop_step_kind(self.tree, loop, self.steps)
        if kind is None or in_model_code(loop, self.tree.parents, called):
            return False
        if is_outer_loop(self.tree, loop, self.is_step_loop):
            return False  # the step loop it runs on every iteration cuts it
        if kind in ("carried", "sample", "feedback") or (kind == "step" and accumulates_gradients(loop, self.steps)):
            # an accumulation inside another step loop (panorama's per-view
            # loop; the micro-steps of gradient accumulation, whose optimizer
            # step the outer loop takes): the outer step's barrier bounds it
            # already, and one graph per outer iteration is the fewest
            # (docs/internals.md, "Gradient accumulation").  So is a decoder
            # unrolled over time inside a training step (its output fed back
            # as the next input): a barrier of its own would cut the step
            # into one graph per time step
            for anc in self.ancestors(loop):
                if isinstance(anc, _DEFS):
                    break
                if isinstance(anc, (cst.For, cst.While)) and self.is_step_loop(anc) \
                        and (kind != "feedback" or loop_step_kind(self.tree, anc, self.steps) == "step"):
                    return False
        return True

    def hot_counters_around(self, call: cst.CSTNode) -> Set[str]:
        """The counters (``codemods.analysis.counters``) of the loops around
        ``call`` up to the innermost step or loader loop, asked before (or
        without) a walk reaching it; none where a function or lambda stands
        between."""
        loops = []
        for anc in self.ancestors(call):
            if isinstance(anc, (cst.Lambda, cst.ClassDef)) or (isinstance(anc, cst.FunctionDef) and not loops):
                break
            if isinstance(anc, (cst.For, cst.While)):
                loops.append(anc)
        loops.reverse()  # outermost first
        return self._counters_to_step([(loop, self.is_step_loop(loop), isinstance(loop, cst.For)
                                        and self.loaders.is_loader_loop(loop)) for loop in loops])

    def step_counters(self) -> Set[str]:
        """The ints that change every step where the walk is: counters of the
        innermost step or loader loop and of the loops around it -- not of
        loops inside it, whose every value the step traces into its one
        graph (a decoder unrolled over time steps)."""
        return set() if self.closure_depth else self._counters_to_step(self.loop_stack)

    def _counters_to_step(self, loops: List[tuple]) -> Set[str]:
        """The counters of ``loops`` ((loop, is_step, is_loader), outermost
        first) up to the innermost step or loader loop; none without one."""
        hot = [k for k, (_, step, loader) in enumerate(loops) if step or loader]
        if not hot:
            return set()
        return set().union(*(loop_counters(self.tree, loop) for loop, _, _ in loops[:hot[-1] + 1]
                             if isinstance(loop, cst.For)))

    def visit_For(self, node: cst.For) -> None:
        self.loop_stack.append((node, self.is_step_loop(node), self.loaders.is_loader_loop(node)))

    def leave_For(self, original_node: cst.For, updated_node: cst.For):  # type: ignore[override]
        self.loop_stack.pop()
        return self.rewrite_loop(original_node, updated_node)

    def visit_While(self, node: cst.While) -> None:
        self.loop_stack.append((node, self.is_step_loop(node), False))

    def leave_While(self, original_node: cst.While, updated_node: cst.While):  # type: ignore[override]
        self.loop_stack.pop()
        return self.rewrite_loop(original_node, updated_node)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_step_closure(node):
            self.closure_depth += 1

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.is_step_closure(original_node):
            self.closure_depth -= 1
        return updated_node

    def rewrite_loop(self, original: Loop, updated: Loop):
        return updated

    # -- questions -----------------------------------------------------------
    @property
    def in_hot(self) -> bool:
        return self.closure_depth == 0 and any(step or loader for _, step, loader in self.loop_stack)

    @property
    def tensors(self) -> Set[str]:
        return self.tensor_stack[-1] if self.tensor_stack else set()

    def innermost_hot_loop(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The innermost loop around ``node`` in its own scope, when a step or
        loader loop of that scope holds it (XLA412's sums, XLA425's meters)."""
        loops = []
        for anc in self.ancestors(node):
            if isinstance(anc, SCOPES):
                break
            if isinstance(anc, (cst.For, cst.While)):
                loops.append(anc)
        if any(self.is_step_loop(lp) or (isinstance(lp, cst.For) and self.loaders.is_loader_loop(lp)) for lp in loops):
            return loops[0]
        return None

    def hot_loop_line(self) -> int:
        """The line of the user's file where the innermost hot loop starts."""
        for loop, step, loader in self.loop_stack:
            if step or loader:
                return self.loop_line(loop)
        return 0

    def loop_line(self, loop: cst.CSTNode) -> int:
        """The line of the user's file where ``loop`` starts."""
        lines = self._memo("loop_lines", self.tree.module, lambda: {  # every candidate loop, one pass
            k: v[0] for k, v in self.tree.start_positions(module_facts(self.tree).hot_loops).items()})
        return self.user_line(lines.get(id(loop)) or self.position(loop)[0])  # type: ignore[union-attr]

    def syncing(self):  # type: ignore[no-untyped-def]
        """The module's functions that sync (``syncing_functions``), once per tree."""
        return self._memo("syncing", self.tree.module, lambda: syncing_functions(
            self.tree.module, self.target.barrier_names, self.qualnames))

    def syncs(self, call: cst.Call) -> bool:
        """``call`` is a barrier, or calls one of the module's functions that sync."""
        return is_barrier_call(call, self.target.barrier_names, self.qualnames) or self.syncing().called_by(call)

    def is_step_closure(self, call: cst.Call) -> bool:
        if self.qualnames(call.func) & set(self.target.step_closure_names):
            return True
        return call_name(call) == "add_step_closure"


class StepBodyCodemod(LoopCodemod):
    """A rule that reorders the lines of a training step loop's body (XLA417,
    XLA418): it visits the module's step loops only, and rewrites a body whose
    statements still line up one for one with the loop's as this pass found
    it (``before``), through :meth:`rewrite_body`."""

    NEEDS = (STEP_LOOP,)

    @classmethod
    def wanted(cls, tree, options):  # type: ignore[no-untyped-def]
        return bool(module_facts(tree).step_loops)

    def regions(self, tree):  # type: ignore[no-untyped-def]
        return module_facts(tree).step_loops

    def rewrite_loop(self, original: Loop, updated: Loop):  # type: ignore[no-untyped-def]
        body = updated.body
        if not self.enabled(self.RULES[0].code) or not isinstance(body, cst.IndentedBlock):
            return updated
        before = body_statements(original)
        if len(before) != len(body.body) or not self.is_step_loop(original):
            return updated
        stmts = self.rewrite_body(original, before, list(body.body))
        return updated if stmts is None else updated.with_changes(body=body.with_changes(body=stmts))

    def rewrite_body(self, original: Loop, before: List[cst.BaseStatement],
                     stmts: List[cst.BaseStatement]) -> Optional[List[cst.BaseStatement]]:
        """The body's new statements, or None to leave it."""
        raise NotImplementedError


class DetachesItems:
    """Mixin for a :class:`LoopCodemod` that keeps values on the device: the
    ``.item()`` calls whose ids it puts in ``self.detached`` become
    ``.detach()`` (XLA412's sums, XLA421's logged values)."""

    detached: Set[int]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        updated = super().leave_Call(original_node, updated_node)  # type: ignore[misc]
        if id(original_node) in self.detached and isinstance(updated, cst.Call) \
                and isinstance(updated.func, cst.Attribute):
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("detach")))
        return updated
