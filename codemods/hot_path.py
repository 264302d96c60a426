"""The hot path, where the XLA4xx reports speak: code that runs every step.

"Hot" means it runs every step: inside a step loop or a loader loop, or in a
method reached from a ``step()`` method of the same class (a scheduler's
``step`` runs once per denoising step), or in a function the module calls
once per step -- or once per element: inside a loop that walks a device
tensor (``for i, y_i in enumerate(y)``), where each element is a graph of
its own, wherever the loop runs (in a module that has step or loader loops:
the others are not read).  With the option ``include_cold`` the same
patterns are also reported where they run once per call (``hot`` is then
false).  The report-only rules on it: ``host_reads`` (XLA401-404) and
``shape_traps`` (XLA405-408).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from codemods.analysis import hot_methods, loop_iterable, module_facts
from codemods.analysis.loops import per_step_functions
from codemods.analysis.placement import DEVICE, HOST, on_device, placement
from codemods.analysis.values import MODULE, TENSORS, values
from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP, STEP_METHOD
from codemods.base import Rule, TreeCache
from codemods.loop_codemod import LoopCodemod


# the words without which neither hot-path rule can find anything in a file
# (a loop, a subscript, a read, a data-dependent op)
TRIGGERS = (b".item(", b".tolist(", b".numpy(", b".cpu(", b"float(", b"int(", b"bool(", b"if ", b"while ",
            b"nonzero", b"masked_select", b"unique", b"where(", b"[", b"for ")


class HotPathCodemod(LoopCodemod):
    """A loop codemod that reports what it finds on the hot path, saying why
    that spot runs every step (``_report``)."""

    TRIGGERS = TRIGGERS
    NEEDS = (STEP_LOOP, LOADER_LOOP, STEP_METHOD, "option:include_cold")

    @classmethod
    def wanted(cls, tree, options):
        return bool(options.get("include_cold")) or bool(cls.hot_regions(tree))

    @staticmethod
    def hot_regions(tree: TreeCache) -> List[cst.CSTNode]:
        facts = module_facts(tree)
        return facts.hot_loops + facts.step_methods

    def regions(self, tree):
        if self.include_cold:
            return None
        per_step = self.per_step()
        return (self.hot_regions(tree) + [fn for fn in tree.nodes((cst.FunctionDef,)) if id(fn) in per_step]
                + (self.element_loops(tree) if self._runs_steps() else []))

    def _runs_steps(self) -> bool:
        """A real step or loader loop (not a model's layer loop) or a step
        method: only then do loops over device tensors count (and the
        prefilter's facts for HostReads hold)."""

        return bool(module_facts(self.tree).step_methods or self._step_loops())

    def _step_loops(self) -> List[cst.CSTNode]:
        """The module's loops that really are step or loader loops (judged as
        the walk judges them, with the module's step functions)."""
        module = self.tree.module
        return self._memo("real_hot_loops", module, lambda: [  # type: ignore[no-any-return]
            lp for lp in module_facts(self.tree).hot_loops
            if self.is_step_loop(lp) or (isinstance(lp, cst.For) and self.loaders.is_loader_loop(lp))])  # type: ignore[arg-type]

    def per_step(self) -> Dict[int, Tuple[List[str], cst.CSTNode]]:
        """The module's functions run once per step, from its real step and
        loader loops (``_step_loops``)."""
        def compute() -> Dict[int, str]:
            return per_step_functions(self.tree.module, self._step_loops())

        return self._memo("per_step", self.tree.module, compute)  # type: ignore[return-value]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.include_cold = bool(self.option("include_cold", False))
        self.hot_methods: List[Set[str]] = []
        self.function_stack: List[str] = []
        self.function_nodes: List[cst.FunctionDef] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.hot_methods.append(set(hot_methods(node)))

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.hot_methods.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        super().visit_FunctionDef(node)
        self.function_stack.append(node.name.value)
        self.function_nodes.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.CSTNode:
        self.function_stack.pop()
        self.function_nodes.pop()
        return super().leave_FunctionDef(original_node, updated_node)

    def _where(self) -> Optional[str]:
        """Why this spot runs every step, or None when it does not."""
        if self.closure_depth:
            return None
        if self.in_hot:
            return f"runs every step (in the loop at line {self.hot_loop_line()})"
        if self.function_stack and self.hot_methods and self.function_stack[-1] in self.hot_methods[-1]:
            fn = self.function_stack[-1]
            via = "" if fn == "step" else " (reached from `step()`)"
            return f"runs every step: in `{fn}()`{via}"
        if self.function_nodes:
            found = self.per_step().get(id(self.function_nodes[-1]))
            if found is not None:
                chain, loop = found
                via = "".join(f"`{name}()`, called from " for name in reversed(chain))
                return (f"runs every step: in `{self.function_stack[-1]}()`, called from {via}the loop at line "
                        f"{self.loop_line(loop)}")
        walked = self._element_loop()
        if walked is not None:
            return (f"runs once per element of device tensor `{code(loop_iterable(walked))}` (the loop at line "
                    f"{self.loop_line(walked)})")
        return None

    def _element_loop(self) -> Optional[cst.For]:
        """The innermost enclosing loop that walks a device tensor element by
        element (``for i, y_i in enumerate(y)``, ``y`` on the device): its
        body runs once per element, and each element is a graph of its own."""
        walking = self._memo("element_loop_ids", self.tree.module,
                             lambda: {id(lp) for lp in self.element_loops(self.tree)} if self._runs_steps() else set())
        for loop, _, _ in reversed(self.loop_stack):
            if id(loop) in walking:
                return loop  # type: ignore[no-any-return]
        return None

    @staticmethod
    def element_loops(tree: TreeCache) -> List[cst.For]:
        """The module's loops over a device tensor, by name or attribute
        (``for y_i in y``, ``enumerate(self.table)``), once per tree: not
        over a module moved there (``nn.ModuleList([...]).to(device)``)."""
        found = tree.memo.get("element_loops")
        if found is None:
            found = tree.memo["element_loops"] = [
                lp for lp in tree.nodes((cst.For,)) if walks_device_tensor(tree, loop_iterable(lp))]  # type: ignore[arg-type]
        return found  # type: ignore[return-value]

    def _report(self, node: cst.CSTNode, rule: Rule, what: str, related: Sequence[cst.CSTNode] = ()) -> None:
        where = self._where()
        if where is None:
            if not self.include_cold or self.closure_depth:
                return
            fn = self.function_stack[-1] if self.function_stack else "<module>"
            self.flag(node, rule.code, f"{what}; runs once per call (in `{fn}()`)", fix=False, hot=False,
                      related=related)
            return
        self.flag(node, rule.code, f"{what}; {where}", fix=False, hot=True, related=related)

    def _on_host(self, node: cst.CSTNode) -> bool:
        """The tensor lives on the host: indexing it costs XLA nothing."""
        return placement(self.tree, node) == HOST

    def _on_device(self, node: cst.CSTNode) -> bool:
        return on_device(self.tree, node, self.tensors)


def walks_device_tensor(tree: TreeCache, iterable: Optional[cst.CSTNode]) -> bool:
    """Is ``iterable`` (what a ``for`` or a comprehension walks) a device
    tensor, by name or attribute: each element it yields is a graph of its
    own.  Not a module moved there (``nn.ModuleList([...]).to(device)``),
    nor the pieces of a split (``y.split(1)``: a tuple of tensors)."""
    return (isinstance(iterable, (cst.Name, cst.Attribute)) and placement(tree, iterable) == DEVICE
            and not values(tree).of(iterable) & {MODULE, TENSORS})


def code(node: cst.CSTNode) -> str:
    """The source text of ``node``, for a message."""
    return cst.Module([]).code_for_node(node)
