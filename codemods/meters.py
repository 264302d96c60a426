"""XLA425: a meter handed ``.item()`` every step (``losses.update(loss.item(),
n)``) is handed the tensor, and its numbers are read back once, after the loop.

pytorch/examples' imagenet, SupContrast and many trainers keep their running
loss in an ``AverageMeter``: ``losses.update(loss.item(), images.size(0))``
on every step copies the loss to the host, and the step waits for its graph
to run before the next one is traced.  Handed ``loss.detach().reshape(())``
(the same number, as a tensor of no dimensions) the meter sums on the device;
the progress line that shows it (``'{val:.4e} ({avg:.4e})'.format(...)``)
formats the tensor's number, the same text, read only on the lines it
prints; right after the loop each attribute the value flows into is read
back into a Python number, so the code after the loop sees what it saw
before.

Rewritten only where the meter's whole life is in view
(``codemods.analysis.meters``):

* the meter is a plain object of a class of the program (``analysis.objects``),
  a name of the function bound only to ``C(...)``, no ``global`` of it and no
  use in a nested scope; the call runs a store method (``analysis.store_methods``)
  and every store call on it in the function hands ``.item()`` values;
* no other line of the class binds the attributes the value flows into to
  what may be a tensor;
* in the loop, the meter is only updated, reset, shown (a format of its
  values, ``str(meter)``, a method that only formats them) or read for
  attributes the value does not reach (``count``); outside it, read, or
  handed to an object of the program that only shows it (imagenet's
  ``ProgressMeter``), itself only called in the loop;
* no ``return`` or ``yield`` in the loop (the read-back would be skipped).

The sum is taken in the tensor's precision (float32 where Python summed in
float64), as XLA412's is.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.meter_uses import MeterUses, scope_of
from codemods.analysis.meters import shows_only, value_attributes
from codemods.analysis.loops import loop_iterable
from codemods.analysis.objects import instance_class, method_of
from codemods.analysis.placement import host_read
from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP
from codemods.analysis.step_tail import step_end
from codemods.analysis.store_methods import _without_self, stores_only
from codemods.analysis.syncs import body_statements, syncs_by_hand, syncs_on_every_path
from codemods.analysis.tensor_functions import handed_tensors
from codemods.base import Rule, call_name, find_all
from codemods.barriers import STEP_BARRIER
from codemods.loaders import DEVICE_LOADER, LoaderWrapping
from codemods.loop_codemod import DetachesItems, LoopCodemod
from codemods.syntax import imports
from codemods.syntax.nodes import SCOPES

DEVICE_METER = Rule(
    code="XLA425",
    name="device-meter",
    summary="a meter handed `.item()` every step (`losses.update(loss.item(), n)`) is handed the tensor, read back "
            "after the loop",
    why=(
        "`.item()` copies a tensor to the host, and the step waits for its graph to run before the next one is "
        "traced: every step, for a running average shown every N steps. Handed the tensor (`loss.detach()."
        "reshape(())`, the same number) the meter sums on the device; a progress line that formats it prints the "
        "same text, reading it only when it prints; right after the loop each attribute the value reaches is read "
        "back into a Python number, so the code after the loop is unchanged. Done only where the meter is a plain "
        "object of the program whose class only sums and formats what it is handed, and nothing else sees it "
        "during the loop. The sum is taken in the tensor's precision (float32 rather than Python's float64)."
    ),
    before=(
        "import torch\n\n\nclass Meter:\n    def __init__(self):\n        self.sum = self.count = self.avg = 0\n\n"
        "    def update(self, val, n=1):\n        self.sum += val * n\n        self.count += n\n"
        "        self.avg = self.sum / self.count\n\n"
        "    def __str__(self):\n        return f\"{self.avg:.4f}\"\n\n\n"
        "def train(model, loader, opt):\n    losses = Meter()\n    for i, (x, y) in enumerate(loader):\n"
        "        loss = model(x.cuda(), y.cuda())\n        loss.backward()\n        opt.step()\n"
        "        losses.update(loss.item(), x.size(0))\n        if i % 10 == 0:\n            print(losses)\n"
        "    return losses.sum\n"
    ),
    after=(
        "import torch\nimport torch_xla\n\n\nclass Meter:\n    def __init__(self):\n        self.sum = self.count = self.avg = 0\n\n"
        "    def update(self, val, n=1):\n        self.sum += val * n\n        self.count += n\n"
        "        self.avg = self.sum / self.count\n\n"
        "    def __str__(self):\n        return f\"{self.avg:.4f}\"\n\n\n"
        "def train(model, loader, opt):\n    losses = Meter()\n    for i, (x, y) in enumerate(loader):\n"
        "        loss = model(x.cuda(), y.cuda())\n        loss.backward()\n        opt.step()\n"
        "        losses.update(loss.detach().reshape(()), x.size(0))\n        if i % 10 == 0:\n"
        "            torch_xla.sync()\n            print(losses)\n        torch_xla.sync()\n"
        "    losses.sum = torch.as_tensor(losses.sum).item()\n"
        "    losses.avg = torch.as_tensor(losses.avg).item()\n"
        "    return losses.sum\n"
    ),
    requires=("XLA302",),  # (its barrier cuts the step loop's passes apart: without it, the sums would be one graph)
    valid=(
        # the loop compares the average: a host number there
        "import torch\n\n\nclass Meter:\n    def __init__(self):\n        self.avg = 0\n\n"
        "    def update(self, val):\n        self.avg = val\n\n\n"
        "def train(model, loader):\n    m = Meter()\n    for x in loader:\n        loss = model(x.cuda())\n"
        "        m.update(loss.item())\n        if m.avg < 0.1:\n            break\n",
    ),
)

_HANDED = "__xlaport_handed__"  # (no program's name: what a store call is handed in place of `.item()`)
_RESHAPE = cst.Arg(cst.Tuple([], lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))


class DeviceMeters(DetachesItems, LoaderWrapping, LoopCodemod):
    DESCRIPTION = "Hand a meter the step's tensor instead of `.item()`; read its numbers back once, after the loop."
    RULES = (DEVICE_METER,)
    TRIGGERS = (b".item(",)
    NEEDS = (STEP_LOOP, LOADER_LOOP)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.detached: set = set()  # ids of the `.item()` calls handed to a meter
        self._restores: Dict[int, List[Tuple[str, Tuple[str, ...]]]] = {}  # id(loop) -> (meter, attributes)
        self._decided: Set[int] = set()
        self._blocks: Set[int] = set()  # ids of the log `if` blocks that start with the step's barrier

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        super().visit_FunctionDef(node)
        if id(node) not in self._decided:
            self._decided.add(id(node))
            self._prepare(node)

    # ---------------------------------------------------------------- decide
    def _prepare(self, scope: cst.FunctionDef) -> None:
        """Decide for the function's meters before its code is walked."""
        by_meter: Dict[str, List[cst.Call]] = {}
        for call in find_all(scope.body, cst.Call, stop=SCOPES):
            func = call.func
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and self._items(call):
                by_meter.setdefault(func.value.value, []).append(call)
        for name, calls in by_meter.items():
            self._decide(scope, name, calls)

    def _items(self, call: cst.Call) -> List[cst.Call]:
        """The arguments of ``call`` that are ``t.item()`` of a device tensor."""
        return [a.value for a in call.args if isinstance(a.value, cst.Call) and call_name(a.value) == "item"
                and isinstance(a.value.func, cst.Attribute) and not a.value.args
                and host_read(self.tree, a.value, self.tensors, self.qualnames) == "item"]

    def _decide(self, scope: cst.FunctionDef, name: str, calls: List[cst.Call]) -> None:
        hot = [self.innermost_hot_loop(c) for c in calls]
        if any(lp is None for lp in hot):
            return  # a call outside any step: a number handed once
        loops = {id(lp): lp for lp in hot}
        if not all(self._cut_every_pass(lp) for lp in loops.values()):
            return  # summed on the device with no barrier, the loop would record one graph for all its passes
        receiver = calls[0].func.value  # type: ignore[attr-defined]
        found = instance_class(self.tree, receiver)
        if found is None or any(scope_of(self.tree, b) is not scope for b in binding_nodes(self.tree, receiver)):
            return  # (a meter of the enclosing function: its uses there are not in view)
        owner, cls = found
        values = self._values(cls, calls)
        if values is None:
            return
        uses = MeterUses(self.tree, self.qualnames, self._items, list(loops.values()), values,
                         lambda m: shows_only(owner, cls, m, values))
        if not uses.allowed(scope, name):
            return
        blocks = self._log_blocks(list(loops.values()), uses.shown)
        if blocks is None:
            return
        if not self.enabled(DEVICE_METER.code) or any(self.is_suppressed(c, DEVICE_METER.code) for c in calls):
            return  # (all of its calls or none: a meter handed numbers and tensors would mix them)
        flagged = [self.flag(call, DEVICE_METER.code, f"`{name}` is handed `.item()` every step: handed the tensor, "
                             "its numbers read back once after the loop", fix=True) for call in calls]
        if not all(flagged):
            return  # (a line outside --diff-base's changes)
        for call in calls:
            self.detached.update(id(c) for c in self._items(call))
        self._blocks.update(blocks)
        for loop in loops.values():
            self._restores.setdefault(id(loop), []).append((name, values))

    def _cut_every_pass(self, loop: cst.CSTNode) -> bool:
        """Every pass of ``loop`` ends in a graph of its own once converted: a
        step loop of a module its authors did not sync by hand (XLA302 places
        its barrier: a training step, an evaluation pass that sums tensors in
        another meter), a loop over a loader XLA301 wraps, a loop that syncs
        already, or a target that runs eagerly."""
        if self.target.sync is None or syncs_on_every_path(body_statements(loop), self.syncs):  # type: ignore[arg-type]
            return True
        if syncs_by_hand(self.tree, self.target.barrier_names, self.qualnames):  # type: ignore[arg-type]
            return False  # (its authors place the barriers: XLA302 adds none)
        barrier = self.selected(STEP_BARRIER.code) and not self.is_suppressed(loop, STEP_BARRIER.code)
        return self.is_step_loop(loop) and barrier or self._wrapped(loop)

    def _wrapped(self, loop: cst.CSTNode) -> bool:
        """XLA301 wraps the loop's loader in a device loader, which syncs after every batch."""
        if self.tree.knows_xla or not self.selected(DEVICE_LOADER.code) or self.refusal(loop) is not None:
            return False
        return not self.is_suppressed(loop_iterable(loop), DEVICE_LOADER.code)  # type: ignore[arg-type]

    def _values(self, cls: cst.ClassDef, calls: List[cst.Call]) -> Optional[Tuple[str, ...]]:
        """The attributes the handed values reach, in the order the store methods bind them."""
        out: Dict[str, None] = {}
        for call in calls:
            items = self._items(call)
            # the call as it will be: each `.item()` a tensor (a name known to hold one: `t.item()` read a device tensor)
            probe = call.with_changes(args=[a.with_changes(value=cst.Name(_HANDED)) if a.value in items else a
                                            for a in call.args])
            tensors = self.tensors | {_HANDED}
            found = method_of(self.tree, call, self.qualnames)
            if found is None or not stores_only(self.tree, probe, tensors, self.qualnames):
                return None
            params = handed_tensors(_without_self(found[1]), probe, tensors, self.qualnames)
            values = value_attributes(cls, found[1], params or frozenset())
            if values is None:
                return None
            out.update(dict.fromkeys(values))
        return tuple(out)

    def _log_blocks(self, loops: List[cst.CSTNode], shown: List[cst.CSTNode]) -> Optional[Set[int]]:
        """The ``if`` blocks of the loops' bodies that show the meter, each
        after the step's optimizer step (or in a loop that takes none): the
        step's barrier goes first there, so that what they format is computed
        (a format of a value still pending runs a graph for it alone); None
        where a show is anywhere else (every step, or in the middle of one)."""
        out: Set[int] = set()
        for loop in loops:
            stmts = body_statements(loop)  # type: ignore[arg-type]
            end = step_end(self.tree, loop, self.steps, self.qualnames)
            for node in shown:
                if not any(a is loop for a in self.ancestors(node)):
                    continue
                k = next(i for i, st in enumerate(stmts) if st is node or any(a is st for a in self.ancestors(node)))
                block = stmts[k]
                if not isinstance(block, cst.If) or not any(a is block.body for a in self.ancestors(node)) \
                        or end is not None and k < end:
                    return None
                out.add(id(block))
        return out if self.target.sync is not None or not out else set()

    # ---------------------------------------------------------------- rewrite
    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if id(original_node) not in self._blocks or not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        self.add_imports(self.target.sync_imports)
        first = cst.SimpleStatementLine([cst.Expr(self.target.sync_node())])
        body = updated_node.body
        return updated_node.with_changes(body=body.with_changes(body=[first, *body.body]))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        updated = super().leave_Call(original_node, updated_node)
        if id(original_node) in self.detached and isinstance(updated, cst.Call):
            return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name("reshape")), args=[_RESHAPE])
        return updated

    def rewrite_loop(self, original, updated):  # type: ignore[no-untyped-def]
        restores = self._restores.get(id(original))
        if not restores:
            return updated
        imports.need(self.context, "torch")
        back = [cst.parse_statement(f"{m}.{a} = torch.as_tensor({m}.{a}).item()\n")
                for m, attrs in restores for a in attrs]
        return cst.FlattenSentinel([updated, *back])


__all__ = ["DeviceMeters", "DEVICE_METER"]
