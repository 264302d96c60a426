"""XLA411: a device table indexed by a Python int that changes every step is
indexed with the int sent to the device instead.

``alphas[t]`` on an XLA tensor is a ``select`` whose index is part of the
graph, so a sampling loop ``for t, t_next in zip(times[:-1], times[1:])``
compiles one graph per step (5 -> 9 compiles at 4 -> 8 steps, XLA's CPU
backend).  ``alphas[torch.tensor([t], device=alphas.device)][0]`` sends the
int as a one-element device tensor: the same values, one graph for every
step (3 -> 3).  A zero-dimensional tensor would not do: torch_xla folds it
into the graph as a constant (6 -> 10).

Rewritten only where it is safe to: a read (not an assignment target) of a
table that lives on the device (``codemods.analysis.placement``), named by a
name or an attribute, indexed by one plain int expression of a counter
(``codemods.analysis.counters``) of the step or loader loop it runs in, or of
a loop around it.  A counter of a loop *inside* the step (a decoder unrolled
over time) is part of one graph already and is left as it is.

A slice of such a table by the step's int in the step itself
(``x = X_train[i:i + batch_size]``, the TCN benchmarks' trainers) is a slice
whose start is a constant of the graph too: it becomes the gather below.  A
slice after whole dimensions (``data[:, i:i + seq_len]``, batch-first token
streams) gathers along its own dimension.

The same int handed to a helper of the module (``get_batch(source, i)`` in
the step loop, the word-level language models' recipe) reaches the table in
the helper: ``source[i:i + seq_len]`` there is a ``slice`` whose start is a
constant of the graph, one graph per chunk.  The helper's slice becomes a
gather at ``torch.arange(n, device=...) + torch.tensor([i], device=...)``,
``n`` the slice's length clamped as a slice clamps it: the same rows, one
graph per length.  So is a top-level helper of a module that another project
module's step loop calls (TCN's ``get_batch`` in ``utils.py``, called by
``word_cnn_test.py``: ``codemods.step_callers``), where the caller's own
analysis says the call hands it a counter and a tensor.  Only a slice or an index of the helper's own parameter
(or of a device table it reaches), by plain int expressions, read and never
written or changed in place in the helper, is rewritten; the rest stays
reported (XLA407).  The rows are a copy, not a view: a caller that changes
the chunk in place no longer changes the table.

An index, too, where a step loop (of the module, or of another module)
hands a function or method its counter:
DDPM-Pytorch's ``tools/sample_ddpm.py`` calls its scheduler's
``sample_prev_timestep(xt, noise_pred, torch.as_tensor(i).to(device))``,
which reads ``self.betas.to(xt.device)[t]``.  torch reads a 0-dim int index
on the host and selects with it as a constant, as it does an int: one graph
per step (23 -> 39 compiles at 8 -> 16 steps).  ``table[torch.as_tensor(t)[None]][0]``
is the same element for an int, and the same elements for an int tensor of
any shape, as data: 9 -> 9.  Another module's method is found by its name
in a module that imports its class (``codemods.step_callers``), and only
where it is the module's one function of that name; a method of the
module's own plain helper object by what the object is made from
(``schedule = Schedule(...)``, then ``schedule.ddim_step(model, x, i)``:
``analysis.calls.object_methods``; fixtures/object_sampler, 4 -> 7 compiles
at 3 -> 6 steps before, 2 -> 2 after).  An entry wanted as a
number (``torch.full(shape, alphas[t])``, ``float(alphas[t])``,
``alphas[t].item()``) is left: the table is better kept on the host there
(XLA403), and the call stays reported (XLA407).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import libcst as cst

from codemods.loop_codemod import LoopCodemod
from codemods.step_callers import counter_calls
from codemods.analysis.counters import made_tensor
from codemods.analysis.loops import module_facts
from codemods.analysis.placement import fill_argument, on_device
from codemods.analysis.steps import SCALAR_READS
from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP
from codemods.base import Rule, call_name, find_all
from codemods.syntax import imports
from codemods.syntax.nodes import is_stored, param_names, walk

DEVICE_INDEX = Rule(
    code="XLA411",
    name="device-index",
    summary="a device table indexed by a step's Python int (`alphas[t]`) is indexed with the int sent to the device",
    why=(
        "XLA traces `alphas[t]` as a `select` whose index is a constant of the graph: a loop whose `t` changes "
        "every step compiles a new graph every step (5 -> 9 compiles at 4 -> 8 steps of a sampler, XLA's CPU "
        "backend). Sending the int as a one-element device tensor, "
        "`alphas[torch.tensor([t], device=alphas.device)][0]`, makes it data: the same values, one graph for "
        "every step (3 -> 3). The same int handed to a helper that slices a table with it "
        "(`get_batch(source, i)` returning `source[i:i + seq_len]`, the word-level language models' recipe) "
        "is a slice start baked into the graph: the helper gathers the rows at "
        "`torch.arange(n, device=...) + torch.tensor([i], device=...)` instead, one graph per chunk length "
        "(4 -> 8 compiles at 4 -> 8 chunks left as it is, 3 -> 3 rewritten); so does a slice taken in the step "
        "itself (`x = X_train[i:i + batch_size]`). A method that a step loop in another module hands its counter "
        "(a DDPM scheduler's `sample_prev_timestep(xt, eps, torch.as_tensor(i).to(device))`) indexes its tables "
        "with `table[torch.as_tensor(t)[None]][0]`: torch reads a 0-dim int index on the host, a constant of the "
        "graph as an int is; this is the same element for either, as data (a sampler: 23 -> 39 compiles at 8 -> 16 "
        "steps before, 9 -> 9 after); so does the module's own method (an entry wanted as a number, "
        "`torch.full(shape, alphas[t])`, is left: XLA403). Only reads of a table on the "
        "device, indexed by an int of the step loop (or a loop around it), are rewritten; the rest of XLA407 "
        "stays reported."
    ),
    before=(
        "import torch\n\nalphas = torch.linspace(0.9, 0.1, 11).cuda()\nx = torch.randn(4).cuda()\n"
        "for t in range(10):\n    x = model(x) * alphas[t + 1]\n"
    ),
    after=(
        "import torch\n\nalphas = torch.linspace(0.9, 0.1, 11).cuda()\nx = torch.randn(4).cuda()\n"
        "for t in range(10):\n    x = model(x) * alphas[torch.tensor([t + 1], device=alphas.device)][0]\n"
    ),
    valid=(
        # a host list, and a loop inside the step (one graph already)
        "import torch\n\ntimes = list(range(10))\nfor t in range(9):\n    x = model(x) * times[t]\n",
        "import torch\n\nw = torch.ones(5).cuda()\nfor x in loader:\n    loss = 0\n    for k in range(5):\n"
        "        loss = loss + model(x).sum() * w[k]\n    loss.backward()\n    opt.step()\n",
    ),
)

# what a plain int index may be made of: names, numbers and arithmetic (never a tensor or a call)
_PLAIN = (cst.Name, cst.Integer, cst.BinaryOperation, cst.UnaryOperation, cst.Attribute, cst.Dot, cst.Add, cst.Subtract,
          cst.Multiply, cst.FloorDivide, cst.Modulo, cst.Minus, cst.Plus, cst.SimpleWhitespace,
          cst.ParenthesizedWhitespace, cst.LeftParen, cst.RightParen, cst.TrailingWhitespace, cst.Newline,
          cst.EmptyLine, cst.Comment)


class DeviceIndex(LoopCodemod):
    DESCRIPTION = "Index device tables with a step's Python int sent to the device (one graph for every step)."
    RULES = (DEVICE_INDEX,)
    TRIGGERS = (b"[",)
    NEEDS = (STEP_LOOP, LOADER_LOOP)
    SIBLING_FACTS = ("step_callers",)  # (a helper another module's step loop calls: `get_batch` in utils.py)

    def regions(self, tree):
        # the hot loops (their counters index here) and the helpers' subscripts a loop hands its counter to
        return module_facts(tree).hot_loops + [sub for sub, _ in self._through_calls().values()]

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        through = self._through_calls().get(id(original_node), (None, None))[1]
        if through is not None and _slice_parts(original_node) is None:
            return self._sent(original_node, updated_node, through)
        if through is not None:
            return self._gathered(original_node, updated_node, through)
        index, parts = self._index(original_node), _slice_parts(original_node)
        if index is None and parts is None:
            return updated_node
        ints = [index] if index is not None else [p for p in parts if p is not None]  # (the start first)
        used = {n.value for part in ints for n in find_all(part, cst.Name)}
        first = {n.value for n in find_all(ints[0], cst.Name)}
        hit = sorted(used & self.step_counters(), key=lambda n: (n not in first, n))
        if not hit or used & self.tensors or is_stored(original_node, self.ancestors(original_node)) \
                or self._in_function_below_loop(original_node):
            return updated_node
        table = original_node.value
        if not on_device(self.tree, table, self.tensors):
            return updated_node
        if index is None:  # a slice of the table in the step itself (`data[i:i + bptt]`)
            loop = next(loop for loop, step, loader in reversed(self.loop_stack) if step or loader)
            if _changed(original_node, loop):
                return updated_node
            return self._gathered(original_node, updated_node, hit[0], handed=False)
        code = cst.Module([]).code_for_node
        if not self.flag(original_node, DEVICE_INDEX.code, f"`{code(original_node)}` indexes a device table with "
                         f"the step's Python int `{hit[0]}` (a new graph each step): indexed with it sent to the "
                         "device, one graph for every step", fix=True):
            return updated_node
        imports.need(self.context, "torch")
        return _first(updated_node, cst.parse_expression(f"torch.tensor([{code(index)}], device={code(table)}.device)"))

    # -- the counter handed to a helper ---------------------------------------
    def _through_calls(self) -> Dict[int, Tuple[cst.Subscript, str]]:
        """id of each subscript of a helper that a step or loader loop hands
        its counter to, rewritable where it stands -> it and the counter."""
        memo = self.tree.memo.get("device_index:through")
        if memo is not None:
            return memo  # type: ignore[return-value]
        found: Dict[int, Tuple[cst.Subscript, str]] = {}
        helpers = {fn.name.value for fn in find_all(self.tree.module, cst.FunctionDef)  # type: ignore[attr-defined]
                   if _slices_by_a_parameter(fn) or _indexes_by_a_parameter(fn)}  # (a cheap look first)
        for hit in counter_calls(self, helpers):
            for sub, _, param in hit.hits:
                if _rewritable(sub, hit, param) and not self._read_on_host(sub):
                    found.setdefault(id(sub), (sub, param))
        self.tree.memo["device_index:through"] = found
        return found

    def _gathered(self, original: cst.Subscript, updated: cst.Subscript, counter: str,
                  handed: bool = True) -> cst.BaseExpression:
        """``t[a:b]`` -> ``t[torch.arange(n, device=t.device) + torch.tensor([a], device=t.device)]``,
        ``n`` the slice's length clamped to ``t``'s rows."""
        code = cst.Module([]).code_for_node
        lower, upper = _slice_parts(original)  # type: ignore[misc]
        table = code(original.value)
        dim = len(original.slice) - 1  # (the dimension sliced: after the whole ones)
        whose = " handed to this function" if handed else ""
        if not self.flag(original, DEVICE_INDEX.code, f"`{code(original)}` slices a device table with the step's "
                         f"Python int `{counter}`{whose} (a new graph each step): sliced with it "
                         "sent to the device, one graph for every step of this length", fix=True):
            return updated
        imports.need(self.context, "torch")
        start = code(lower)  # type: ignore[arg-type]
        end = f"{table}.size({dim})" if upper is None else f"min({code(upper)}, {table}.size({dim}))"
        less = start if isinstance(lower, (cst.Name, cst.Integer, cst.Attribute)) else f"({start})"
        rows = cst.parse_expression(f"torch.arange(max({end} - {less}, 0), device={table}.device)"
                                    f" + torch.tensor([{start}], device={table}.device)")
        return updated.with_changes(slice=[*updated.slice[:dim], cst.SubscriptElement(cst.Index(rows))])

    def _read_on_host(self, sub: cst.Subscript) -> bool:
        """An entry wanted as a number (``torch.full(shape, alphas[t])``,
        ``float(alphas[t])``, ``alphas[t].item()``): left as it is, where
        XLA403/XLA401 say to keep the table on the host."""
        parents = self.tree.parents
        parent = parents.get(id(sub))
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("item", "tolist"):
            return True
        call = parents.get(id(parent)) if isinstance(parent, cst.Arg) else None
        if not isinstance(call, cst.Call):
            return False
        return (call_name(call) in SCALAR_READS and isinstance(call.func, cst.Name)) or fill_argument(call) is parent

    def _sent(self, original: cst.Subscript, updated: cst.Subscript, param: str) -> cst.BaseExpression:
        """``t[i]`` -> ``t[torch.as_tensor(i)[None]][0]``: the same element for
        an int and the same elements for an int tensor of any shape (a 0-dim
        one is read on the host, a constant of the graph, as an int is), and
        one graph for every value of either."""
        code = cst.Module([]).code_for_node
        shown = code(original.with_changes(lpar=[], rpar=[]))
        if not self.flag(original, DEVICE_INDEX.code, f"`{shown}` indexes a device table with `{param}`, which "
                         "carries the counter of a step loop that calls this function (a new graph each step): "
                         "indexed with it as a device index, one graph for every step", fix=True):
            return updated
        imports.need(self.context, "torch")
        index = updated.slice[0].slice.value  # type: ignore[attr-defined]
        return _first(updated, cst.parse_expression(f"torch.as_tensor({code(index)})[None]"))

    @staticmethod
    def _index(node: cst.Subscript) -> Optional[cst.BaseExpression]:
        """The one plain int expression ``node`` indexes with (``t``,
        ``t + 1``, ``i - self.offset``) on a table named by a name or an
        attribute; None for anything else (slices, tuples, tensors, calls)."""
        if not isinstance(node.value, (cst.Name, cst.Attribute)):
            return None
        return _plain_index(node, attributes=True)

    def _in_function_below_loop(self, node: cst.CSTNode) -> bool:
        """A function or lambda between ``node`` and its loop: it runs when
        called, not where it stands."""
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.For, cst.While)):
                return False
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return True
        return False


def _slice_parts(node: cst.Subscript):  # type: ignore[no-untyped-def]
    """(lower, upper) of ``t[a:b]`` / ``t[a:]``, or of the one bounded slice
    after whole dimensions (``t[:, a:b]``) (no step; ``a`` a plain int
    expression of sums and products, so never counted from the end); None
    for anything else."""
    if not isinstance(node.value, (cst.Name, cst.Attribute)) or not node.slice:
        return None
    *whole, last = node.slice
    if any(not _whole(e.slice) for e in whole):
        return None
    part = last.slice
    if not isinstance(part, cst.Slice) or part.step is not None or part.lower is None:
        return None
    if not all(isinstance(n, _PLAIN) for e in (part.lower, part.upper) if e is not None for n in walk(e)):
        return None
    if any(isinstance(n, cst.UnaryOperation) or (isinstance(n, cst.BinaryOperation)
                                                 and not isinstance(n.operator, (cst.Add, cst.Multiply)))
           for n in walk(part.lower)):
        return None  # (a start that may count from the end: only sums and products of the counter)
    return part.lower, part.upper


def _whole(part: cst.BaseSlice) -> bool:
    """``:`` -- a whole dimension."""
    return isinstance(part, cst.Slice) and part.lower is None and part.upper is None and part.step is None


def _slices_by_a_parameter(fn: cst.FunctionDef) -> bool:
    """Does ``fn`` slice something from one of its parameters (``source[i:...]``)?"""
    params = param_names(fn)
    return any(part.lower is not None and any(isinstance(n, cst.Name) and n.value in params for n in walk(part.lower))
               for part in find_all(fn.body, cst.Slice))  # type: ignore[attr-defined]


def _first(sub: cst.Subscript, index: cst.BaseExpression) -> cst.Subscript:
    """``t[i]`` -> ``t[index][0]`` (``index`` a one-element tensor; the
    parentheses around ``t[i]`` go around the whole)."""
    gathered = sub.with_changes(slice=[cst.SubscriptElement(cst.Index(index))], lpar=[], rpar=[])
    return cst.Subscript(value=gathered, slice=[cst.SubscriptElement(cst.Index(cst.Integer("0")))],
                         lpar=sub.lpar, rpar=sub.rpar)


def _indexes_by_a_parameter(fn: cst.FunctionDef) -> bool:
    """Does ``fn`` index something with a plain expression of one of its
    parameters (``self.alphas[t]``, ``self.betas.to(x.device)[t - 1]``)?"""
    params = param_names(fn)
    return any(_plain_index(sub) is not None and any(isinstance(n, cst.Name) and n.value in params
                                                     for n in walk(sub.slice[0].slice))
               for sub in find_all(fn.body, cst.Subscript))  # type: ignore[attr-defined]


def _plain_index(sub: cst.Subscript, attributes: bool = False) -> Optional[cst.BaseExpression]:
    """The one plain int expression of names and numbers ``sub`` indexes
    with (``t``, ``t - 1``; with ``attributes``, ``i - self.offset`` too),
    whatever names the table."""
    if len(sub.slice) != 1 or not isinstance(sub.slice[0].slice, cst.Index) or sub.slice[0].slice.star is not None:
        return None
    index = sub.slice[0].slice.value
    return index if all(isinstance(n, _PLAIN) and (attributes or not isinstance(n, cst.Attribute))
                        for n in walk(index)) else None


def _rewritable(sub: cst.Subscript, hit, param: str) -> bool:  # type: ignore[no-untyped-def]
    """A slice, or a plain index, of a table a step's counter reaches
    through a call (``hit``: ``counters.ThroughCall``), read and never
    written or changed in place in the callee (the rows become a copy).  An
    index only where the caller hands ``param`` an int expression of the
    counter or a tensor made of one (``torch.as_tensor(i).to(device)``):
    never a tuple, a list or a slice, which index otherwise."""
    if _changed(sub, hit.function):
        return False
    if _slice_parts(sub) is not None:
        return True
    arg = hit.passed.get(param)
    return _plain_index(sub) is not None and arg is not None and (
        all(isinstance(n, _PLAIN) for n in walk(arg)) or made_tensor(arg))


def _changed(sub: cst.Subscript, fn: cst.FunctionDef) -> bool:
    """Is the subscript written, or what it gives changed in place, in the
    helper (a copy would not carry the change back to the table)?"""
    names = set()
    for assign in find_all(fn.body, cst.Assign):
        if assign.value is sub:  # type: ignore[attr-defined]
            names |= {n.value for t in assign.targets for n in find_all(t.target, cst.Name)}  # type: ignore[attr-defined]
    for target in find_all(fn.body, (cst.AssignTarget, cst.AugAssign)):
        if any(n is sub for n in walk(target.target)):  # type: ignore[attr-defined]
            return True
        if isinstance(target, cst.AugAssign) and isinstance(target.target, cst.Name) and target.target.value in names:
            return True
        if isinstance(target, cst.AssignTarget) and isinstance(target.target, cst.Subscript) \
                and isinstance(target.target.value, cst.Name) and target.target.value.value in names:
            return True
    for call in find_all(fn.body, cst.Call):
        func = call.func  # type: ignore[attr-defined]
        if isinstance(func, cst.Attribute) and func.attr.value.endswith("_") and not func.attr.value.endswith("__"):
            if func.value is sub or (isinstance(func.value, cst.Name) and func.value.value in names):
                return True
    return False


__all__ = ["DeviceIndex", "DEVICE_INDEX"]
