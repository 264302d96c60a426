"""XLA412: a number summed from ``.item()`` every step is summed on the device
and read once, after the loop.

``epoch_loss += loss.item()`` in a training step copies the loss to the host
every step; before ``backward()`` it also cuts the step into two graphs (8
executions for 4 steps on XLA's CPU backend).  ``epoch_loss +=
loss.detach()`` keeps the sum on the device (4 executions for 4 steps, the
same compiles, the same sum to float32 rounding); right after the loop
``epoch_loss = torch.as_tensor(epoch_loss).item()`` reads it back once -- a
Python number of the kind ``.item()`` gave (an int for a count of correct
predictions; the literal itself when no step ran) -- so the code after the
loop sees the number it saw before.  A read inside the loop (a print every N
steps) reads the sum there.

Rewritten only when the whole life of the name is in view: a plain local
name, bound only by number literals (``total = 0.0``) and augmented
assignments, never used in a nested function, and read (or scaled) inside
the loop that sums only under an ``if`` -- never on every pass, which would
read it every step anyway (XLA401 reports those).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from codemods.loop_codemod import DetachesItems, LoopCodemod
from codemods.analysis.placement import host_read
from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP
from codemods.base import Rule, call_name, find_all
from codemods.syntax import imports
from codemods.syntax.nodes import SCOPES, is_stored

ACCUMULATOR = Rule(
    code="XLA412",
    name="device-accumulator",
    summary="a number summed from `.item()` every step (`total += loss.item()`) is summed on the device, read after the loop",
    why=(
        "`.item()` copies a tensor to the host: the pending graph runs and the step waits for it, every step; "
        "before `backward()` the step is also cut into two graphs (8 executions for 4 steps, XLA's CPU backend). "
        "`total += loss.detach()` keeps the sum on the device (4 executions for 4 steps), and right after the "
        "loop `total = torch.as_tensor(total).item()` reads it back once, as the same kind of Python number (an "
        "int for a count), so the code after the loop is unchanged; a read inside the loop (the print every N "
        "steps) reads the sum where it stands. The sum is taken in the tensor's precision (float32 rather than "
        "Python's float64). Left as it is (and reported by XLA401) when the name is read on every step, rebound to "
        "anything but a number, or used in a nested function."
    ),
    before=(
        "import torch\n\ndef train(model, loader, opt):\n    total = 0.0\n    for x, y in loader:\n"
        "        loss = model(x.cuda(), y.cuda())\n        total += loss.item()\n        loss.backward()\n"
        "        opt.step()\n    return total / len(loader)\n"
    ),
    after=(
        "import torch\n\ndef train(model, loader, opt):\n    total = 0.0\n    for x, y in loader:\n"
        "        loss = model(x.cuda(), y.cuda())\n        total += loss.detach()\n        loss.backward()\n"
        "        opt.step()\n    total = torch.as_tensor(total).item()\n    return total / len(loader)\n"
    ),
    valid=(
        # read on every step: a host read each step whatever we do
        "import torch\n\ndef train(model, loader, opt, bar):\n    total = 0.0\n    for x in loader:\n"
        "        loss = model(x.cuda())\n        total += loss.item()\n        bar.set_postfix(loss=total)\n"
        "        loss.backward()\n        opt.step()\n",
    ),
)

_SCALES = (cst.MultiplyAssign, cst.DivideAssign, cst.FloorDivideAssign, cst.ModuloAssign, cst.PowerAssign)
_HOST_NUMBERS = {"len", "size", "numel", "dim"}  # calls whose value is a Python int


class DeviceAccumulators(DetachesItems, LoopCodemod):
    DESCRIPTION = "Sum per-step `.item()` values on the device; read the sum once, after the loop."
    RULES = (ACCUMULATOR,)
    TRIGGERS = (b".item(",)
    NEEDS = (STEP_LOOP, LOADER_LOOP)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.detached: set = set()  # ids of the `.item()` calls to rewrite
        self._reads: set = set()  # ids of the names read inside the loop: `torch.as_tensor(...).item()`
        self._restores: dict = {}  # id(loop) -> the names read back into Python numbers right after it

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self._prepare(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        super().visit_FunctionDef(node)
        self._prepare(node)

    def _prepare(self, scope: cst.CSTNode) -> None:
        """Decide for the scope's accumulators before its code is walked (a
        read may come before the loop that sums)."""
        body = scope.body if isinstance(scope, cst.FunctionDef) else scope
        augs = [a for a in find_all(body, cst.AugAssign, stop=SCOPES) if isinstance(a.target, cst.Name)]  # type: ignore
        if not augs:
            return
        where = self.tree.start_positions(augs)
        for aug in sorted(augs, key=lambda a: where[id(a)][:2]):  # in the order they are written
            if id(aug) not in self.detached:
                self._decide(aug, scope)  # type: ignore[arg-type]

    def _decide(self, node: cst.AugAssign, scope: cst.CSTNode) -> None:
        if self.innermost_hot_loop(node) is None or not self._item_reads(node.value):
            return
        plan = self._plan(node, scope)
        if plan is None:
            return
        augs, reads, loops = plan
        name = node.target.value  # type: ignore[attr-defined]
        if not self.flag(node, ACCUMULATOR.code, f"`{name}` sums `.item()` every step: summed on the device, read "
                         "once after the loop (and where the loop reads it)", fix=True):
            return
        for aug in augs:
            self.detached.add(id(aug))
            self.detached.update(id(c) for c in self._item_reads(aug.value) or ())
        self._reads.update(id(r) for r in reads)
        for loop in loops:
            self._restores.setdefault(id(loop), []).append(name)

    def _item_reads(self, value: cst.BaseExpression) -> Optional[List[cst.Call]]:
        """The ``.item()`` reads of device tensors in ``value``, when the rest
        of it is host arithmetic (``loss.item() * x.size(0)``); None otherwise."""
        items = [c for c in find_all(value, cst.Call) if call_name(c) == "item" and isinstance(c.func, cst.Attribute)
                 and host_read(self.tree, c, self.tensors, self.qualnames) == "item"]
        inside = {id(n) for c in items for n in find_all(c.func.value, cst.CSTNode)}  # type: ignore[union-attr]
        for call in find_all(value, cst.Call):
            if id(call) in inside or call in items:
                continue
            if call_name(call) not in _HOST_NUMBERS:
                return None
        return items or None

    def _plan(self, aug: cst.AugAssign, scope: cst.CSTNode
              ) -> Optional[Tuple[List[cst.AugAssign], List[cst.Name], List[cst.CSTNode]]]:
        """The sums of ``aug``'s name that read ``.item()`` in a hot loop, the
        reads inside those loops, and the loops (the name is read back into a
        Python number right after each); None when the name is not only a
        number summed so."""
        name = aug.target.value  # type: ignore[attr-defined]
        body = scope.body if isinstance(scope, cst.FunctionDef) else scope
        augs: List[cst.AugAssign] = []
        occurrences = []
        for occurrence in find_all(body, cst.Name):
            if occurrence.value != name:  # type: ignore[attr-defined]
                continue
            role = self._role(occurrence, scope)  # type: ignore[arg-type]
            if role is None:
                return None
            occurrences.append((occurrence, role))
            summed = self.parent(occurrence)
            if role == "aug" and self._item_reads(summed.value):  # type: ignore[attr-defined]
                if self.innermost_hot_loop(summed) is None:
                    return None  # a sum of `.item()` outside any step: it stays a Python number
                augs.append(summed)  # type: ignore[arg-type]
        loops = list({id(lp): lp for lp in (self.innermost_hot_loop(a) for a in augs)}.values())
        reads: List[cst.Name] = []
        for occurrence, role in occurrences:
            inside = next((lp for lp in loops if any(a is lp for a in self.ancestors(occurrence))), None)
            if inside is None:
                continue  # before or after the loops: a Python number there
            if role == "scale" or (role == "read" and self._every_step(occurrence, inside)):
                return None  # read (or scaled) on every pass of the loop that sums: no gain
            if role == "read":
                reads.append(occurrence)  # type: ignore[arg-type]
        return augs, reads, loops  # type: ignore[return-value]

    def _role(self, name: cst.Name, scope: cst.CSTNode) -> Optional[str]:
        """How ``name`` is used: "aug" (summed into), "init" (bound to a
        number), "read", "other" (not this variable: an attribute's or a
        keyword's name), or None (anything that defeats the rewrite)."""
        parent = self.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name or \
                isinstance(parent, cst.Arg) and parent.keyword is name:
            return "other"
        for anc in self.ancestors(name):
            if anc is scope:
                break
            if isinstance(anc, SCOPES):
                return None  # used in a nested scope
        if isinstance(parent, cst.AugAssign) and parent.target is name:
            if isinstance(parent.operator, (cst.AddAssign, cst.SubtractAssign)):
                return "aug"
            return "scale" if isinstance(parent.operator, _SCALES) else None  # (outside the loop only: see _plan)
        if isinstance(parent, cst.AssignTarget):
            assign = self.parent(parent)
            ok = isinstance(assign, cst.Assign) and len(assign.targets) == 1 and _number(assign.value)
            return "init" if ok else None
        if isinstance(parent, (cst.Param, cst.For, cst.CompFor, cst.AsName, cst.NameItem, cst.Del, cst.NamedExpr,
                               cst.ImportAlias, cst.Element, cst.StarredElement, cst.AnnAssign)):
            if isinstance(parent, cst.Element) and not is_stored(parent, self.ancestors(parent)):
                return "read"
            return None
        return "read"

    def _every_step(self, read: cst.CSTNode, loop: cst.CSTNode) -> bool:
        """``read`` runs on every iteration of ``loop``: inside it and not
        in the body of an ``if`` (a test is read every time)."""
        child = read
        guarded = False
        for anc in self.ancestors(read):
            if anc is loop:
                return not guarded
            if isinstance(anc, cst.If) and child is not anc.test:
                guarded = True
            child = anc
        return False  # outside the loop

    # ---------------------------------------------------------------- rewrite
    def rewrite_loop(self, original, updated):  # type: ignore[no-untyped-def]
        names = self._restores.get(id(original))
        if not names:
            return updated
        imports.need(self.context, "torch")
        back = [cst.parse_statement(f"{n} = torch.as_tensor({n}).item()\n") for n in names]
        return cst.FlattenSentinel([updated, *back])

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if id(original_node) not in self._reads:
            return updated_node
        imports.need(self.context, "torch")
        return cst.parse_expression(f"torch.as_tensor({original_node.value}).item()")


def _number(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        value = value.expression
    return isinstance(value, (cst.Integer, cst.Float))


__all__ = ["DeviceAccumulators", "ACCUMULATOR"]
