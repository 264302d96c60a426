"""XLA4xx: host reads and recompilation traps on the hot path (reported only).

These need a person: the fix depends on what the value is for.  Each finding
says what to do instead.  "Hot" means it runs every step: inside a step loop
or a loader loop, or in a method reached from a ``step()`` method of the same
class (a scheduler's ``step`` runs once per denoising step) -- or once per
element: inside a loop that walks a device tensor (``for i, y_i in
enumerate(y)``), where each element is a graph of its own, wherever the loop
runs (in a module that has step or loader loops: the others are not read).  With the option
``include_cold`` the same patterns are also reported where they run once per
call (``hot`` is then false).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP, STEP_METHOD
from codemods.loop_codemod import LoopCodemod
from codemods.analysis import hot_methods, is_tensor_expr, loop_iterable, module_facts
from codemods.analysis.loops import per_step_functions, step_functions
from codemods.analysis.counters import loop_counters
from codemods.analysis.placement import DEVICE, HOST, TO_HOST, host_read, on_device, placement
from codemods.analysis.syncs import false_on_xla
from codemods.analysis.dataflow import dataflow
from codemods.base import Rule, TreeCache, call_name, find_all

ITEM = Rule(
    code="XLA401",
    name="host-read-item",
    summary="`.item()` on the hot path reads a tensor on the host every step",
    why=(
        "`.item()` forces the pending graph to compile and run, then copies a scalar back "
        "(counter `aten::_local_scalar_dense`). Accumulate a tensor and read it once per "
        "epoch, or read it in `xm.add_step_closure`."
    ),
    before="for x in loader:\n    loss = model(x)\n    total += loss.item()\n",
    after=None,
    valid=("for x in loader:\n    loss = model(x)\n    total += loss.detach()\nprint(total.item())\n",),
)
TRANSFER = Rule(
    code="XLA402",
    name="host-read-transfer",
    summary="`.tolist()` / `.numpy()` / `.cpu()` on the hot path copies a tensor to the host",
    why=(
        "Each of these executes the pending graph and waits for a device-to-host copy "
        "(`TransferFromDeviceTime`). `.numpy()` fails outright on XLA tensors without "
        "`.cpu()`. Keep values on the device inside the loop; copy once after it."
    ),
    before="for x in loader:\n    preds = model(x).argmax(-1).cpu().tolist()\n",
    after=None,
)
SCALAR = Rule(
    code="XLA403",
    name="host-read-scalar",
    summary="`float(t)` / `int(t)` / `bool(t)` of a tensor, or a tensor as `torch.full`'s fill value, on the hot path",
    why=(
        "Converting a tensor to a Python number is a host read, exactly like `.item()`. "
        "`torch.full(shape, table[i])` does it too: the fill value must be a number, so the tensor "
        "is read on the host and its value becomes a constant of the next graph."
    ),
    before="for x in loader:\n    loss = model(x)\n    running = running + float(loss)\n",
    after=None,
)
CONDITION = Rule(
    code="XLA404",
    name="tensor-condition",
    summary="a tensor in an `if`/`while`/`assert` condition on the hot path",
    why=(
        "Python must know the truth value now, so the graph runs and the value is copied "
        "back every step, and the two branches trace different graphs. Use `torch.where` "
        "to keep both outcomes on the device, or test once outside the loop. An `assert` on a "
        "tensor (`assert mask.min() >= 0`) reads it the same way, every step, unless Python runs "
        "with `-O`: check the data once, before the loop, or on the host side of the loader."
    ),
    before="import torch\n\nfor x in loader:\n    loss = model(x)\n    if torch.isnan(loss).any():\n        break\n",
    after=None,
)
DYNAMIC = Rule(
    code="XLA405",
    name="dynamic-shape-op",
    summary="`nonzero`, `masked_select`, `unique`, one-argument `where`: data-dependent shapes",
    why=(
        "Their output shape depends on the data, so XLA falls back to the CPU (`aten::nonzero`) "
        "and every new shape compiles a new graph. `(self.timesteps == t).nonzero().item()` in "
        "a scheduler is a host read and a CPU fallback on every step: pass the index instead, "
        "and use `torch.where(mask, a, b)` for selections."
    ),
    before=(
        "class Scheduler:\n    def step(self, model_output, timestep, sample):\n"
        "        index = (self.timesteps == timestep).nonzero()[0]\n        return sample - model_output\n"
    ),
    after=None,
)
MASK_INDEX = Rule(
    code="XLA406",
    name="boolean-mask-index",
    summary="indexing with a boolean mask on the hot path (data-dependent shape)",
    why=(
        "`x[x > 0]` has as many elements as the mask has true values: a new shape, hence a "
        "new compilation, whenever the data changes. Use `torch.where(mask, x, 0)` or "
        "`masked_fill` to keep the shape fixed."
    ),
    before="for x in loader:\n    pos = x[x > 0]\n",
    after=None,
)
COUNTER_INDEX = Rule(
    code="XLA407",
    name="loop-counter-index",
    summary="a device tensor iterated or indexed with the Python loop counter",
    why=(
        "`for t in timesteps_on_device` or `alphas[i]` bakes the index into the graph as a "
        "constant: every step traces a different graph and compiles again. Iterate a host "
        "copy (`timesteps.tolist()` once, before the loop) or pass the index as a tensor."
    ),
    before=(
        "import torch\n\nalphas = torch.linspace(0, 1, 10, device=\"cuda\")\nfor i in range(10):\n    x = model(x) * alphas[i]\n"
        "data = torch.randn(100, 4).cuda()\nfor i in range(0, 100, 10):\n    loss = model(data[i:i + 10]).sum()\n"
        "    loss.backward()\n"
    ),
    after=None,
)


GROWING_CAT = Rule(
    code="XLA408",
    name="growing-concat",
    summary="a tensor grown with `torch.cat` on every step",
    why=(
        "`idx = torch.cat((idx, next_token), dim=1)` in a generation loop gives `idx` a new shape "
        "every step, and every op that reads it a new graph: XLA compiles once per token. "
        "Preallocate the whole buffer before the loop and write each step into it "
        "(`buf[:, t] = next_token`, or `index_copy_` with a tensor index), or use a static KV cache."
    ),
    before=(
        "import torch\n\nfor _ in range(max_new_tokens):\n    logits = model(idx)\n"
        "    idx_next = logits[:, -1].argmax(-1, keepdim=True)\n    idx = torch.cat((idx, idx_next), dim=1)\n"
    ),
    after=None,
)


# the rules whose finding means a new shape, so a new graph to compile, every step
NEW_SHAPE_EVERY_STEP = (DYNAMIC.code, MASK_INDEX.code, COUNTER_INDEX.code, GROWING_CAT.code)


class HostReads(LoopCodemod):
    DESCRIPTION = "Report host reads and recompilation traps on the hot path."
    RULES = (ITEM, TRANSFER, SCALAR, CONDITION, DYNAMIC, MASK_INDEX, COUNTER_INDEX, GROWING_CAT)
    TRIGGERS = (b".item(", b".tolist(", b".numpy(", b".cpu(", b"float(", b"int(", b"bool(", b"if ", b"while ",
                b"nonzero", b"masked_select", b"unique", b"where(", b"[", b"for ")
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
        self.steps = self._memo("steps", module, lambda: step_functions(module))
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

    # --------------------------------------------------------------- where
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
            return (f"runs once per element of device tensor `{_code(loop_iterable(walked))}` (the loop at line "
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
        (``for y_i in y``, ``enumerate(self.table)``), once per tree."""
        found = tree.memo.get("element_loops")
        if found is None:
            found = tree.memo["element_loops"] = [
                lp for lp in tree.nodes((cst.For,))
                if isinstance(loop_iterable(lp), (cst.Name, cst.Attribute))  # type: ignore[arg-type]
                and placement(tree, loop_iterable(lp)) == DEVICE]  # type: ignore[arg-type]
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

    # --------------------------------------------------------------- patterns
    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        self._counter_through_call(node)
        name = call_name(node)
        is_method = isinstance(node.func, cst.Attribute)
        q = self.qualnames(node.func)
        # (a host tensor -- `x = out.to("cpu")`, `losses = torch.zeros(n)` -- crosses nothing)
        read = host_read(self.tree, node, self.tensors, self.qualnames)
        if read == "item":
            self._report(node, ITEM, "`.item()` reads a tensor on the host: accumulate on the device, read once")
        elif read in TO_HOST:
            self._report(node, TRANSFER, f"`.{name}()` copies a tensor to the host: keep it on the device in the loop")
        elif read is not None:
            self._report(node, SCALAR, f"`{name}()` of a tensor is a host read")
        elif is_method and (name == "item" or name in TO_HOST) or name in {"float", "int", "bool"}:
            return
        elif name in {"nonzero", "masked_select", "unique", "argwhere", "unique_consecutive"} and (
            is_method or any(n.startswith("torch.") for n in q)
        ):
            self._report(node, DYNAMIC, f"`{name}` has a data-dependent shape: CPU fallback and a new graph per shape; "
                                        "pass an index or use `torch.where`")
        elif name in ("full", "full_like", "new_full") and self._tensor_fill(node, q):
            self._report(node, SCALAR, f"`{name}` with a tensor as its fill value reads it on the host (an implicit "
                                       "`.item()`), and the value becomes a constant of the graph: "
                                       "broadcast the tensor instead (`value.expand(shape)`)")
        elif "torch.where" in q and len(node.args) == 1:
            self._report(node, DYNAMIC, "one-argument `torch.where` is `nonzero`: use `torch.where(cond, a, b)`")

    def _tensor_fill(self, call: cst.Call, quals: Set[str]) -> bool:
        """``torch.full(shape, table[index])``: a tensor where a Python number goes."""
        if isinstance(call.func, cst.Attribute) and call_name(call) != "new_full" and \
                not any(n.startswith("torch.") for n in quals):
            return False
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        fill = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "fill_value"),
                    positional[1] if len(positional) > 1 else None)
        if fill is None:
            return False
        base = fill.value if isinstance(fill, cst.Subscript) else fill
        return self._on_device(base) or (not isinstance(fill, cst.Subscript)
                                         and is_tensor_expr(fill, self.tensors, self.qualnames)
                                         and not self._on_host(fill))

    def visit_Assign(self, node: cst.Assign) -> None:
        """``x = torch.cat((x, new), ...)``: ``x`` grows by one piece a step."""
        value = node.value
        if not (isinstance(value, cst.Call) and call_name(value) in ("cat", "concat", "concatenate") and value.args
                and any(q.startswith("torch.") for q in self.qualnames(value.func))):
            return
        parts = value.args[0].value
        if not isinstance(parts, (cst.Tuple, cst.List)) or not self.loop_stack:
            return
        grown = {t.target.value for t in node.targets if isinstance(t.target, cst.Name)}
        names = {e.value.value for e in parts.elements if isinstance(e.value, cst.Name)}
        # grown only when carried from the last iteration: no other assignment
        # in the loop makes it afresh (`x = torch.cat([zeros_like(x), x])`
        # after `x = controlnet(...)` doubles this step's value once)
        loop = self.loop_stack[-1][0]
        for other in find_all(loop.body, (cst.Assign, cst.AnnAssign), stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            if other is not node:
                targets = other.targets if isinstance(other, cst.Assign) else [other]  # type: ignore[attr-defined]
                grown -= {n.value for t in targets for n in find_all(t.target, cst.Name)}
        if grown & names:  # every op in the loop that reads it (its related lines) sees a new shape
            self._report(node, GROWING_CAT, f"`{sorted(grown & names)[0]}` grows with `torch.cat` every iteration: "
                                            "a new shape and a new graph per step; preallocate it and write into it",
                         related=[loop])

    def visit_If(self, node: cst.If) -> None:
        self._condition(node.test)

    def visit_Assert(self, node: cst.Assert) -> None:
        self._condition(node.test)

    def visit_While(self, node: cst.While) -> None:
        super().visit_While(node)
        self._condition(node.test)

    def _condition(self, test: cst.BaseExpression) -> None:
        for part in _truth_operands(test):
            inner = part.expression if isinstance(part, cst.UnaryOperation) else part
            if isinstance(inner, cst.Comparison) and all(
                    isinstance(c.operator, (cst.Is, cst.IsNot)) for c in inner.comparisons):
                # `x is not None`: identity reads no value -- but what it compares may have read
                # one to make a Python bool (`torch.allclose(a, b) is False`)
                operands = [o for o in [inner.left] + [c.comparator for c in inner.comparisons]
                            if isinstance(o, cst.Call) and call_name(o) in _BOOL_OF_TENSORS]
            elif isinstance(inner, cst.Comparison):
                operands = [inner.left] + [c.comparator for c in inner.comparisons]
            else:
                operands = [inner]
            for op in operands:
                if isinstance(op, cst.Call) and call_name(op) in {"item", "len", "isinstance"}:
                    continue
                if (isinstance(op, cst.Call) and call_name(op) in {"any", "all"} and isinstance(op.func, cst.Attribute)) \
                        or is_tensor_expr(op, self.tensors, self.qualnames):
                    self._report(test, CONDITION, "tensor-valued condition: a host read and a graph split every time; "
                                                  "use `torch.where` or test outside the loop")
                    return

    def _on_host(self, node: cst.CSTNode) -> bool:
        """The tensor lives on the host: indexing it costs XLA nothing."""
        return placement(self.tree, node) == HOST

    def _on_device(self, node: cst.CSTNode) -> bool:
        return on_device(self.tree, node, self.tensors)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if self._on_device(node.value) and self._counter_in(node):
            return
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return
        index = node.slice[0].slice.value
        if isinstance(index, cst.Comparison) or (
            isinstance(index, cst.UnaryOperation) and isinstance(index.operator, cst.BitInvert)
        ):
            self._report(node, MASK_INDEX, "boolean-mask indexing has a data-dependent shape; use `torch.where`/`masked_fill`")
            return

    def _counter_in(self, node: cst.Subscript) -> bool:
        """``data[i]``, ``data[i + 1]``, ``data[i:i + bptt]``: an index or a
        slice bound computed from the loop counter of an enclosing loop."""
        counters = self._counters()
        if not counters:
            return False
        used: Set[str] = set()
        for element in node.slice:
            part = element.slice
            if isinstance(part, cst.Index) and is_tensor_expr(part.value, self.tensors, self.qualnames):
                continue  # an index on the device (XLA411's `alphas[torch.tensor([t], ...)]`) is data
            exprs = [part.value] if isinstance(part, cst.Index) else [
                e for e in (part.lower, part.upper, part.step) if e is not None]  # type: ignore[union-attr]
            for e in exprs:
                used |= {n.value for n in find_all(e, cst.Name)}
        hit = used & counters
        if not hit:
            return False
        what = "slices" if any(isinstance(e.slice, cst.Slice) for e in node.slice) else "indexes"
        self._report(node, COUNTER_INDEX, f"`{_code(node.value)}[...]` {what} a device tensor with the loop "
                     f"counter `{sorted(hit)[0]}`: a new graph for each of its values")
        return True

    def _counters(self) -> Set[str]:
        """Python ints that change with the enclosing loops' iterations
        (:mod:`codemods.analysis.counters`)."""
        return set().union(*(loop_counters(self.tree, loop) for loop, _, _ in self.loop_stack
                             if isinstance(loop, cst.For)))

    def _counter_through_call(self, call: cst.Call) -> None:
        """``get_batch(source, i)`` in a step loop, where the module's
        ``get_batch`` returns ``source[i:i + n]``: the loop counter reaches a
        device tensor's index through the call (reported on the call, with
        the line in the callee)."""
        counters = self._counters() if self.loop_stack else set()
        if not counters:
            return
        fn = dataflow(self.tree).local_function(call)
        if not isinstance(fn, cst.FunctionDef):
            return
        params = [p for p in list(fn.params.posonly_params) + list(fn.params.params)
                  if not (p.name.value == "self" and isinstance(call.func, cst.Attribute))]
        passed = {p.name.value: a.value for p, a in zip(params, [a for a in call.args if a.keyword is None and not a.star])}
        passed.update({a.keyword.value: a.value for a in call.args if a.keyword is not None})
        by_counter = {p for p, arg in passed.items() if {n.value for n in find_all(arg, cst.Name)} & counters}
        if not by_counter:
            return
        hits = []  # (subscript, the device tensor, the counter's parameter)
        for sub in find_all(fn.body, cst.Subscript):
            base = sub.value  # type: ignore[attr-defined]
            used = {n.value for e in sub.slice for n in find_all(e.slice, cst.Name)}  # type: ignore[attr-defined]
            if not used & by_counter:
                continue
            if isinstance(base, cst.Name) and base.value in passed:  # a tensor the caller passes
                tensor = passed[base.value]
                if base.value in by_counter or self._on_host(tensor) or (
                        isinstance(tensor, cst.Name) and tensor.value not in self.tensors
                        and placement(self.tree, tensor) is None):
                    continue
            elif placement(self.tree, base) == DEVICE:  # one the callee reaches itself (`self.alphas`)
                tensor = base
            else:
                continue
            hits.append((sub, tensor, sorted(used & by_counter)[0]))
        if not hits:
            return
        sub, tensor, param = hits[0]
        subs = [h[0] for h in hits]
        lines = sorted({p[0] for p in self.tree.start_positions(subs).values()})
        what = "slices" if any(isinstance(e.slice, cst.Slice) for e in sub.slice) else "indexes"  # type: ignore[attr-defined]
        counter = sorted({n.value for n in find_all(passed[param], cst.Name)} & counters)[0]
        at = f"line {lines[0]}" if len(lines) == 1 else f"lines {', '.join(map(str, lines))}"
        self._report(call, COUNTER_INDEX, f"`{fn.name.value}()` {what} device tensor `{_code(tensor)}` with the loop "
                     f"counter `{counter}` (`{_code(sub.value)}[...]` at {at}): a new graph every step",  # type: ignore[attr-defined]
                     related=subs)

    def visit_For(self, node: cst.For) -> None:
        super().visit_For(node)
        it = loop_iterable(node)
        if isinstance(it, cst.Name) and it.value in self.tensors and self.loop_stack[-1][1] and not self._on_host(it):
            self._report(node.iter, COUNTER_INDEX, f"iterating device tensor `{it.value}` indexes it with a constant per "
                                                   "step: a new graph every step; iterate a host copy")
        elif self._element_loop() is node:
            self._report(node.iter, COUNTER_INDEX, f"iterating device tensor `{_code(it)}` takes each element as a "
                                                   "graph of its own (a new one per index): iterate a host copy, "
                                                   "read once (`.tolist()`), or use tensor ops")


# tensor ops that give a Python bool: each reads its tensors on the host
_BOOL_OF_TENSORS = frozenset({"allclose", "equal", "is_nonzero"})


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _truth_operands(test: cst.BaseExpression) -> List[cst.BaseExpression]:
    """The operands of ``test`` that Python reads as truth values on XLA, left
    to right: each side of ``and``/``or``, but none after a side of an ``and``
    that is false on XLA (``... and not is_torch_xla_available() and
    torch.isnan(loss)``: transformers' Trainer keeps that read off XLA)."""
    if not isinstance(test, cst.BooleanOperation):
        return [test]
    if isinstance(test.operator, cst.And) and false_on_xla(test.left):
        return _truth_operands(test.left)
    return _truth_operands(test.left) + _truth_operands(test.right)
