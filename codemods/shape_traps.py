"""XLA405-408: what gives an op a new shape, so a new graph to compile, every
step on the hot path (reported only): data-dependent shapes (``nonzero``,
boolean masks), a device tensor indexed or sliced with the loop counter
(also through a helper the counter is passed to), a tensor grown with
``torch.cat``.  Where "hot" is: :mod:`codemods.hot_path`.  The trap whose fix
keeps the program's meaning is rewritten by ``device_index`` (XLA411)."""

from __future__ import annotations

from typing import Dict, List, Set

import libcst as cst

from codemods.analysis import is_tensor_expr, loop_iterable
from codemods.analysis.counters import counter_through_call, loop_counters
from codemods.analysis.growth import grown_by
from codemods.analysis.growth import whole_growth, windowed_growth
from codemods.analysis.syncs import is_barrier_call
from codemods.generation import GENERATION_WINDOW
from codemods.analysis.values import TENSOR, values
from codemods.base import Rule, call_name, dotted, find_all
from codemods.analysis.element_walks import walked_by
from codemods.hot_path import HotPathCodemod, code, walks_device_tensor

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
        "`masked_fill` to keep the shape fixed. An assignment of a number through a mask of the tensor's own "
        "values (top-k sampling's `logits[logits < v[:, [-1]]] = -float('Inf')`) is rewritten to "
        "`masked_fill_`, which writes the same values in place at a fixed shape; other mask indexing is reported."
    ),
    before=(
        "import torch\n\nfor x in loader:\n    pos = x[x > 0]\n    logits = model(x)\n"
        "    logits[logits < 0.5] = -float('Inf')\n"
    ),
    after=(
        "import torch\n\nfor x in loader:\n    pos = x[x > 0]\n    logits = model(x)\n"
        "    logits.masked_fill_(logits < 0.5, -float('Inf'))\n"
    ),
)
COUNTER_INDEX = Rule(
    code="XLA407",
    name="loop-counter-index",
    summary="a device tensor iterated or indexed with the Python loop counter",
    why=(
        "`for t in timesteps_on_device`, `[itos[int(i)] for i in tokens_on_device]` or `alphas[i]` bakes the "
        "index into the graph as a constant: every step traces a different graph and compiles again (and a walk "
        "reads each element on the host on its own). Iterate a host copy (`timesteps.tolist()` once, before the "
        "loop) or pass the index as a tensor."
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


class ShapeTraps(HotPathCodemod):
    DESCRIPTION = "Report what changes a shape every step on the hot path."
    RULES = (DYNAMIC, MASK_INDEX, COUNTER_INDEX, GROWING_CAT)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._fillable: Dict[int, str] = {}  # id of `x[x < v] = n` -> why it runs every step
        self._fill_targets: List[cst.CSTNode] = []

    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        self._counter_through_call(node)
        name = call_name(node)
        q = self.qualnames(node.func)
        if name in {"nonzero", "masked_select", "unique", "argwhere", "unique_consecutive"} and (
            isinstance(node.func, cst.Attribute) or any(n.startswith("torch.") for n in q)
        ):
            self._report(node, DYNAMIC, f"`{name}` has a data-dependent shape: CPU fallback and a new graph per shape; "
                                        "pass an index or use `torch.where`")
        elif "torch.where" in q and len(node.args) == 1:
            self._report(node, DYNAMIC, "one-argument `torch.where` is `nonzero`: use `torch.where(cond, a, b)`")

    def visit_Assign(self, node: cst.Assign) -> None:
        """``x = torch.cat((x, new), ...)``: ``x`` grows by one piece a step;
        ``x[x < v] = number`` is filled at a fixed shape instead (hot only)."""
        where = self._where()
        if where is not None and self._mask_fill(node):
            self._fillable[id(node)] = where
            self._fill_targets.append(node.targets[0].target)
        if not self.loop_stack:
            return
        loop = self.loop_stack[-1][0]
        grown = grown_by(node, loop, self.qualnames)
        if grown and self.selected(GENERATION_WINDOW.code):
            growth = windowed_growth(loop, self.qualnames, self.target.barrier_names)
            if growth is not None and growth.grows.body[0] is node:  # type: ignore[attr-defined]
                return  # (XLA414 writes it into a buffer)
        if grown:  # every op in the loop that reads it (its related lines) sees a new shape
            what = "a new shape and a new graph per step; preallocate it and write into it"
            whole = whole_growth(loop, self.qualnames, self.target.barrier_names)
            if whole is not None and whole.grows.body[0] is node and not any(  # type: ignore[attr-defined]
                    is_barrier_call(c, self.target.barrier_names, self.qualnames)  # type: ignore[arg-type]
                    for c in find_all(loop.body, cst.Call)):
                what = ("the model reads all of it, a new shape every step: left without a barrier, the loop is one "
                        "graph, compiled once for its count; a buffer of the final length (for a causal model) would "
                        "run one graph a step")
            self._report(node, GROWING_CAT, f"`{sorted(grown)[0]}` grows with `torch.cat` every iteration: {what}",
                         related=[loop])

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign):
        """``x[x < v] = number`` -> ``x.masked_fill_(x < v, number)``: the mask
        compares the tensor itself, so (where the original runs) it has the
        tensor's shape, and both write the number where it is true."""
        if id(original_node) not in self._fillable:
            return updated_node
        target = updated_node.targets[0].target
        assert isinstance(target, cst.Subscript)
        if not self.flag(original_node, MASK_INDEX.code, "a number written through a boolean mask -> `masked_fill_`: "
                         f"the same values at a fixed shape; {self._fillable[id(original_node)]}", fix=True, hot=True):
            return updated_node
        mask = target.slice[0].slice.value  # type: ignore[attr-defined]
        return cst.Expr(cst.Call(func=cst.Attribute(target.value, cst.Name("masked_fill_")),
                                 args=[cst.Arg(mask, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                                       cst.Arg(updated_node.value)]))

    def _mask_fill(self, node: cst.Assign) -> bool:
        """``x[x <op> y] = <a number>`` (or ``y <op> x``), ``x`` or ``y`` a tensor, ``x`` not on the host."""
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Subscript) or not _number(node.value):
            return False
        target = node.targets[0].target
        if len(target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
            return False
        mask, x = target.slice[0].slice.value, dotted(target.value)
        if not (x and isinstance(mask, cst.Comparison) and len(mask.comparisons) == 1
                and x in (dotted(mask.left), dotted(mask.comparisons[0].comparator))):
            return False
        kinds = values(self.tree)  # (a tensor compared, or compared with one: not a numpy array)
        return not self._on_host(target.value) and (self._on_device(target.value) or any(
            TENSOR in kinds.of(side) for side in (mask.left, mask.comparisons[0].comparator)))

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if any(node is t for t in self._fill_targets):
            return  # the assignment is rewritten (leave_Assign)
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
        self._report(node, COUNTER_INDEX, f"`{code(node.value)}[...]` {what} a device tensor with the loop "
                     f"counter `{sorted(hit)[0]}`: a new graph for each of its values")
        return True

    def _counters(self) -> Set[str]:
        """Python ints that change with the steps (:mod:`codemods.analysis.counters`):
        in a step, those of its loop and the loops around it (a loop inside
        the step, or in a function the step runs, has every value traced
        into the step's one graph); elsewhere (in a walk over a device
        tensor's elements, or with ``include_cold``), those of the enclosing
        loops."""
        if self.in_hot:
            return self.step_counters()
        if self._where() is not None and self._element_loop() is None:
            return set()  # (a loop over a device tensor's elements is one graph an element: its counters count)
        return set().union(*(loop_counters(self.tree, loop) for loop, _, _ in self.loop_stack
                             if isinstance(loop, cst.For)))

    def _counter_through_call(self, call: cst.Call) -> None:
        """``get_batch(source, i)`` in a step loop, where the module's
        ``get_batch`` returns ``source[i:i + n]``: the loop counter reaches a
        device tensor's index through the call (reported on the call, with
        the line in the callee; :func:`counter_through_call`)."""
        counters = self._counters() if self.loop_stack else set()
        found = counter_through_call(self.tree, call, counters, self.tensors)
        if found is None or not found.hits:
            return  # (a test of the counter only: XLA415)
        fn, hits, passed = found.function, found.hits, found.passed
        sub, tensor, param = hits[0]
        subs = [h[0] for h in hits]
        lines = sorted({p[0] for p in self.tree.start_positions(subs).values()})
        what = "slices" if any(isinstance(e.slice, cst.Slice) for e in sub.slice) else "indexes"
        counter = sorted({n.value for n in find_all(passed[param], cst.Name)} & counters)[0]  # type: ignore[attr-defined]
        at = f"line {lines[0]}" if len(lines) == 1 else f"lines {', '.join(map(str, lines))}"
        self._report(call, COUNTER_INDEX, f"`{fn.name.value}()` {what} device tensor `{code(tensor)}` with the loop "
                     f"counter `{counter}` (`{code(sub.value)}[...]` at {at}): a new graph every step",
                     related=subs)

    def visit_For(self, node: cst.For) -> None:
        super().visit_For(node)
        it = loop_iterable(node)
        if isinstance(it, cst.Name) and it.value in self.tensors and self.loop_stack[-1][1] and not self._on_host(it):
            self._report(node.iter, COUNTER_INDEX, f"iterating device tensor `{it.value}` indexes it with a constant per "
                                                   "step: a new graph every step; iterate a host copy")
        elif self._element_loop() is node:
            self._report(node.iter, COUNTER_INDEX, f"iterating device tensor `{code(it)}` takes each element as a "
                                                   "graph of its own (a new one per index): iterate a host copy, "
                                                   "read once (`.tolist()`), or use tensor ops")

    def visit_CompFor(self, node: cst.CompFor) -> None:
        """``[itos[int(i)] for i in y]``, ``y`` on the device: one graph and
        one transfer per element, where ``y.tolist()`` reads it once."""
        for walked in walked_by(node.iter)[1]:
            if walks_device_tensor(self.tree, walked):
                self._report(walked, COUNTER_INDEX, f"a comprehension over device tensor `{code(walked)}` takes each "
                                                    "element as a graph of its own and reads it on the host one by "
                                                    f"one: read it once (`{code(walked)}.tolist()`) and walk the copy")


def _number(node: cst.CSTNode) -> bool:
    """A Python number: ``0``, ``-1e9``, ``float("inf")``, ``-float('Inf')``, ``math.inf``."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        node = node.expression
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.Call) and dotted(node.func) == "float" and len(node.args) == 1:
        return isinstance(node.args[0].value, cst.SimpleString)
    return dotted(node) in ("math.inf", "torch.inf", "np.inf", "numpy.inf")

