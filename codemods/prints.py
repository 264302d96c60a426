"""XLA210: prints and logs that read tensors, taken off the hot path.

``print(f"loss {loss.item():.4f}")`` inside the step loop forces the pending
graph to compile and run in the middle of the step and copies a value back:
one step becomes two graphs plus a device-to-host wait.  By default the call is
kept but deferred with ``xm.add_step_closure``: it runs after the step's graph
has executed, with the values of that step (bound as lambda defaults).  The
``prints`` option chooses ``delete`` (what the torch_xla guide advises) or
``keep`` (report only).  Output that reads no tensor is left alone, and so
is output after the pass has synced on every path (a barrier, or a
``torch.cuda.synchronize()`` converted to one, before it): what it reads is
computed, and a closure would run at the next pass's barrier -- a pass late,
and never after the last pass.
"""

from __future__ import annotations

import keyword
import re
from typing import Dict, List, Optional

import libcst as cst

from codemods.analysis.bindings import binding_nodes, binding_scope
from codemods.syntax.nodes import tight_equal
from codemods.analysis.prefilter import LOADER_LOOP, LOG_METHODS, OUTPUT_IN_LOOP, STEP_LOOP, WRITER_METHODS
from codemods.analysis.loops import body_statements
from codemods.analysis.state import assigned_keys
from codemods.analysis.syncs import syncs_on_every_path
from codemods.loop_codemod import LoopCodemod
from codemods.analysis import module_facts, reads_tensor_value
from codemods.base import Rule, call_name, dotted, find_all

_LOGGER_RE = re.compile(r"(^|\.)(log|logger|logging|_logger|LOGGER|LOG)$")

HOT_PRINT = Rule(
    code="XLA210",
    name="hot-loop-tensor-print",
    summary="print/log of a tensor value in the hot loop: defer it to a step closure",
    why=(
        "Reading a tensor on the host (`.item()`, formatting it, printing it) forces the "
        "lazy graph to compile and execute early, then waits for the copy: each step is "
        "split into two graphs. `xm.add_step_closure` runs the same call after the step's "
        "graph has executed, so the output is kept and the step stays one graph. The names it reads are bound "
        "as lambda defaults; where the step goes on to run code that may change an object the call reads "
        "(`scheduler.step()` after a print of `optimizer.param_groups[0]['lr']`), what reads no tensor is "
        "evaluated where the call was, as a default too, so the closure prints the values the original printed. "
        "With `prints = \"delete\"` the call is removed instead; with `\"keep\"` it is only reported."
    ),
    before=(
        "for x, y in loader:\n    loss = loss_fn(model(x), y)\n    loss.backward()\n"
        "    optimizer.step()\n    print(f\"loss {loss.item():.4f}\")\n"
    ),
    after=(
        "import torch_xla.core.xla_model as xm\n\nfor x, y in loader:\n    loss = loss_fn(model(x), y)\n"
        "    loss.backward()\n    optimizer.step()\n"
        "    xm.add_step_closure(lambda loss=loss: print(f\"loss {loss.item():.4f}\"))\n"
    ),
    valid=(
        "for x, y in loader:\n    loss = loss_fn(model(x), y)\n    loss.backward()\n"
        "    print(\"step done\", x.shape)\n",
        # the pass has synced: the print copies a computed value (deferred, it would print a pass late)
        "import torch_xla\n\nfor x, y in loader:\n    loss = loss_fn(model(x), y)\n    loss.backward()\n"
        "    optimizer.step()\n    torch_xla.sync()\n    print(f\"loss {loss.item():.4f}\")\n",
    ),
    options=(("prints", "defer (default) | delete | keep"),),
)

# a name bound in these, read inside a deferred call, is the call's own
_OWN_SCOPES = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.Lambda)


class HotPrints(LoopCodemod):
    DESCRIPTION = "Defer (or delete) prints and logs that read tensors inside hot loops."
    RULES = (HOT_PRINT,)
    TRIGGERS = (b"print", b"log", b"add_scalar")
    NEEDS = (f"{STEP_LOOP}&{OUTPUT_IN_LOOP}", f"{LOADER_LOOP}&{OUTPUT_IN_LOOP}")

    @classmethod
    def wanted(cls, tree, options):
        return bool(module_facts(tree).hot_loops)

    def regions(self, tree):
        return module_facts(tree).hot_loops

    def _is_output_call(self, call: cst.Call) -> bool:
        if isinstance(call.func, cst.Name):
            return call.func.value == "print"
        name = call_name(call)
        receiver = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
        if receiver is None:
            return False
        if name in LOG_METHODS and _LOGGER_RE.search(receiver):
            return True
        if name in WRITER_METHODS or (receiver == "wandb" and name == "log"):
            return True
        return name == "print" and receiver in {"accelerator", "xm"}

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine):
        if not self.in_hot or len(original_node.body) != 1 or not isinstance(original_node.body[0], cst.Expr):
            return updated_node
        call = original_node.body[0].value
        if not isinstance(call, cst.Call) or not self._is_output_call(call):
            return updated_node
        read = reads_tensor_value(cst.Tuple([cst.Element(a.value) for a in call.args]) if call.args else call,
                                  self.tensors, self.qualnames)
        if read is None:
            return updated_node
        mode = str(self.option("prints", "defer"))
        what = dotted(call.func) or "print"
        if mode == "defer" and self._after_barrier(original_node, call):
            return updated_node  # (what it reads is computed: a copy, not a graph; a closure would print late)
        if mode == "keep" or self.target.step_closure is None:
            self.flag(original_node, HOT_PRINT.code,
                      f"`{what}(...)` reads a tensor every step (hot loop at line {self.hot_loop_line()}); "
                      "defer it with a step closure", fix=False)
            return updated_node
        if mode == "delete":
            if self.flag(original_node, HOT_PRINT.code, f"`{what}(...)` reads a tensor every step; deleted", fix=True):
                return cst.RemoveFromParent()
            return updated_node
        if not self.flag(original_node, HOT_PRINT.code,
                         f"`{what}(...)` reads a tensor every step; deferred to a step closure", fix=True):
            return updated_node
        self.add_imports(self.target.step_closure_imports)
        inner = updated_node.body[0].value  # type: ignore[attr-defined]
        captured: Dict[cst.CSTNode, str] = {}
        if inner.deep_equals(call) and self._changed_later(original_node):
            captured = self._captures(call)
            inner = call.visit(_Replace(captured)) if captured else inner
        params = [cst.Param(cst.Name(n), default=cst.Name(n), equal=tight_equal()) for n in self._bound_names(call, captured)]
        params += [cst.Param(cst.Name(n), default=e, equal=tight_equal()) for e, n in captured.items()]
        closure = cst.Lambda(params=cst.Parameters(params=params), body=inner)
        register = cst.Call(func=cst.parse_expression(self.target.step_closure), args=[cst.Arg(closure)])
        return updated_node.with_changes(body=[cst.Expr(register)])

    def _after_barrier(self, stmt: cst.SimpleStatementLine, call: cst.Call) -> bool:
        """Does the pass sync on every path before ``stmt`` (makemore's
        ``torch.cuda.synchronize()`` before it logs, converted), and nothing
        between assigns a tensor ``call`` reads?  Then the print reads values
        the barrier computed: a copy to the host, no graph of its own.  A
        step closure there would run at the next pass's barrier, a pass late
        (after the output of the pass that follows) and never after the
        last pass."""
        loop = next((lp for lp, step, loader in reversed(self.loop_stack) if step or loader), None)
        body = body_statements(loop) if loop is not None else []
        top = next((a for a in [stmt, *self.ancestors(stmt)] if any(a is b for b in body)), None)
        if top is None:
            return False
        before = body[:next(k for k, b in enumerate(body) if b is top)]
        last = next((k for k in range(len(before) - 1, -1, -1) if syncs_on_every_path([before[k]], self.syncs)), None)
        if last is None:
            return False
        read = {dotted(n) for n in find_all(call, (cst.Name, cst.Attribute))} & self.tensors
        return not any(key in read for s in before[last + 1:] for key in assigned_keys(s))

    def _changed_later(self, stmt: cst.SimpleStatementLine) -> bool:
        """Does the pass run code after ``stmt`` that may change an object the
        output reads (``scheduler.step()`` after a print of the learning rate,
        a store into an attribute)?  The closure runs at the pass's sync."""
        loop = next((lp for lp, step, loader in reversed(self.loop_stack) if step or loader), None)
        body = body_statements(loop) if loop is not None else []
        top = next((a for a in [stmt, *self.ancestors(stmt)] if any(a is b for b in body)), None)
        if top is None:
            return True
        later = body[next(k for k, b in enumerate(body) if b is top) + (top is stmt):]
        for s in later:
            if s is stmt:
                continue
            calls = [c for c in find_all(s, cst.Call) if not self._is_output_call(c)]
            stores = [t for t in find_all(s, (cst.AssignTarget, cst.AugAssign))
                      if isinstance(getattr(t, "target", None), (cst.Attribute, cst.Subscript))]
            if calls or stores:
                return True
        return False

    def _captures(self, call: cst.Call) -> Dict[cst.CSTNode, str]:
        """The call's reads of objects (``optimizer.param_groups[0]['lr']``,
        ``scheduler.get_last_lr()``) that read no tensor: evaluated where the
        output was, as lambda defaults, so the closure prints the values the
        original printed; only the tensor reads wait for the sync."""
        taken = _loaded_names(call)
        found: Dict[cst.CSTNode, str] = {}

        def visit(node: cst.CSTNode) -> None:
            root = _chain_root(node)
            if root is not None and not isinstance(node, cst.Name) and self._captures_root(root) \
                    and reads_tensor_value(node, self.tensors, self.qualnames) is None:
                name = _fresh(_chain_name(node), taken)
                taken.add(name)
                found[node] = name
                return
            if isinstance(node, cst.Lambda):
                return  # (what a lambda reads, it reads when called)
            for child in node.children:
                visit(child)

        for a in call.args:
            visit(a.value)
        return found

    def _captures_root(self, root: cst.Name) -> bool:
        """A variable of the program (not an import, a function, a class, or
        a name the call binds itself)."""
        if isinstance(binding_scope(self.tree, root), _OWN_SCOPES):
            return False
        bound = binding_nodes(self.tree, root)
        return bool(bound) and not any(isinstance(b, (cst.Import, cst.ImportFrom, cst.FunctionDef, cst.ClassDef))
                                       for b in bound)

    def _bound_names(self, call: cst.Call, captured: Dict[cst.CSTNode, str]) -> List[str]:
        """Local variables the call reads: bound as lambda defaults so the
        closure sees this step's values, not the last ones."""
        names: List[str] = []
        outer = self

        class _Loads(_Reads):
            def on_visit(self, node: cst.CSTNode) -> bool:
                return node not in captured and super().on_visit(node)

            def visit_Lambda(self, node: cst.Lambda) -> bool:
                return False

            def visit_Name(self, node: cst.Name) -> None:
                if node.value in names:
                    return
                if isinstance(binding_scope(outer.tree, node), _OWN_SCOPES):
                    return  # (a comprehension's own name, inside the call: nothing of the step's to bind)
                for bound in binding_nodes(outer.tree, node):
                    if not isinstance(bound, (cst.Import, cst.ImportFrom, cst.FunctionDef, cst.ClassDef)):
                        names.append(node.value)
                        return

        for a in call.args:
            a.value.visit(_Loads())
        return names


def _chain_root(node: cst.CSTNode) -> Optional[cst.Name]:
    """The name an attribute/subscript/call chain starts from
    (``optimizer`` of ``optimizer.param_groups[0]['lr']``), else None."""
    while isinstance(node, (cst.Attribute, cst.Subscript, cst.Call)):
        node = node.func if isinstance(node, cst.Call) else node.value
    return node if isinstance(node, cst.Name) else None


def _chain_name(node: cst.CSTNode) -> str:
    """A parameter name for a captured chain: its last attribute, string key
    or method (``lr``, ``get_last_lr``)."""
    while True:
        if isinstance(node, cst.Attribute):
            return node.attr.value
        if isinstance(node, cst.Subscript) and len(node.slice) == 1:
            key = node.slice[0].slice
            if isinstance(key, cst.Index) and isinstance(key.value, cst.SimpleString):
                text = key.value.evaluated_value
                if isinstance(text, str) and text.isidentifier():
                    return text
        if isinstance(node, cst.Call):
            node = node.func
        elif isinstance(node, cst.Subscript):
            node = node.value
        else:
            return node.value if isinstance(node, cst.Name) else "value"


class _Reads(cst.CSTVisitor):
    """Visits the names an expression reads: not an attribute's name
    (``meter.loss``), not a keyword (``.format(loss=x)``)."""

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False


def _loaded_names(call: cst.Call) -> set:
    """The names the call reads."""
    names: set = set()

    class _V(_Reads):
        def visit_Name(self, node: cst.Name) -> None:
            names.add(node.value)

    call.visit(_V())
    return names


def _fresh(name: str, taken: set) -> str:
    if name not in taken and not keyword.iskeyword(name):
        return name
    k = 2
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


class _Replace(cst.CSTTransformer):
    """Puts each captured expression's parameter in its place."""

    def __init__(self, captured: Dict[cst.CSTNode, str]) -> None:
        super().__init__()
        self.captured = captured

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node not in self.captured and super().on_visit(node)

    def on_leave(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        if original_node in self.captured:
            return cst.Name(self.captured[original_node])
        return super().on_leave(original_node, updated_node)
