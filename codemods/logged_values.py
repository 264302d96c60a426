"""XLA421: the values a step keeps for its log (``loss['D/loss_real'] =
d_loss_real.item()``) are kept on the device, and read where the log reads
them, once the step is computed.

yunjey/stargan's training step stores seven losses in a dict every step,
each with ``.item()``, and prints the dict (and hands it to TensorBoard) only
every ``log_step`` steps.  On XLA each ``.item()`` runs the part of the step
it needs as a graph of its own: 67 executions and 14 compiles for 10 steps
on XLA's CPU backend.  Stored as ``d_loss_real.detach()`` they stay on the
device; the log's ``if`` block starts with the step's barrier and reads them
back into the same Python numbers (``loss = {key: value.item() for key,
value in loss.items()}``): 10 executions (one a step) and 4 compiles, the
same numbers printed.

Rewritten only when the dict's whole life is in view, inside one step loop:

* it is bound to a new, empty dict (``loss = {}``, ``dict()``) at the loop's
  own level on every pass, and nowhere else; no ``global``/``nonlocal``
  names it, and it is not used outside the loop;
* every store into it (``loss[key] = ...``) is a read of a device tensor
  with ``.item()`` of a name or a computed value, and that name is not
  changed in place before the log reads it (the stored tensor would change
  with it);
* every other use of it is in the body of one ``if`` at the loop's own
  level, after every store (the log every N steps).

The barrier goes first in that block only when the block follows the step's
optimizer step (``analysis.step_tail.step_end``) or the loop takes none: in
the middle of a step it would cut the step in two, and the values are read
without it (each read then runs its own graph, but only on the log's steps).
A target with no step barrier (TorchTPU, which runs eagerly) is left as it is.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

import libcst as cst

from codemods.analysis.placement import host_read
from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP
from codemods.analysis.step_tail import step_end
from codemods.analysis.syncs import body_statements
from codemods.base import Rule, call_name, find_all
from codemods.loop_codemod import DetachesItems, LoopCodemod
from codemods.syntax.nodes import is_stored

LOGGED = Rule(
    code="XLA421",
    name="logged-step-values",
    summary="values a step stores for its log with `.item()` (`loss['d'] = d_loss.item()`) stay on the device, read "
            "where the log reads them",
    why=(
        "`.item()` copies a tensor to the host: the pending graph, or the part of it the value needs, runs as a graph "
        "of its own, once for every value stored, on every step, though the log reads them only every N steps "
        "(yunjey/stargan: 67 executions and 14 compiles for 10 steps on XLA's CPU backend). Stored with `.detach()` "
        "they stay on the device, and the log's `if` block first runs the step (`torch_xla.sync()`, where the block "
        "follows the optimizer step) and reads them back into the same Python numbers: one execution a step (10 and "
        "4 compiles there). Done only where the dict is made new on every pass, holds nothing but such values, and "
        "is read only in that block."
    ),
    before=(
        "import torch\n\ndef train(model, opt, batches, log_every):\n    for i, (x, y) in enumerate(batches):\n"
        "        loss = model(x.cuda(), y.cuda())\n        opt.zero_grad()\n        loss.backward()\n"
        "        opt.step()\n        log = {}\n        log['loss'] = loss.item()\n"
        "        if i % log_every == 0:\n            print(log)\n"
    ),
    after=(
        "import torch\nimport torch_xla\n\ndef train(model, opt, batches, log_every):\n"
        "    for i, (x, y) in enumerate(batches):\n"
        "        loss = model(x.cuda(), y.cuda())\n        opt.zero_grad()\n        loss.backward()\n"
        "        opt.step()\n        log = {}\n        log['loss'] = loss.detach()\n"
        "        if i % log_every == 0:\n            torch_xla.sync()\n"
        "            log = {key: value.item() for key, value in log.items()}\n            print(log)\n"
    ),
    valid=(
        # read on every step: nothing to gain
        "import torch\n\ndef train(model, opt, batches):\n    for x, y in batches:\n"
        "        loss = model(x.cuda(), y.cuda())\n        loss.backward()\n        opt.step()\n"
        "        log = {}\n        log['loss'] = loss.item()\n        print(log)\n",
        # kept across steps: read after the loop too
        "import torch\n\ndef train(model, opt, batches):\n    for i, (x, y) in enumerate(batches):\n"
        "        loss = model(x.cuda(), y.cuda())\n        loss.backward()\n        opt.step()\n"
        "        log = {}\n        log['loss'] = loss.item()\n        if i % 10 == 0:\n            print(log)\n"
        "    return log\n",
        # a value of another kind in it
        "import torch\n\ndef train(model, opt, batches):\n    for i, (x, y) in enumerate(batches):\n"
        "        loss = model(x.cuda(), y.cuda())\n        loss.backward()\n        opt.step()\n"
        "        log = {}\n        log['loss'] = loss.item()\n        log['lr'] = opt.param_groups[0]['lr']\n"
        "        if i % 10 == 0:\n            print(log)\n",
    ),
)

_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


class LoggedValues(DetachesItems, LoopCodemod):
    DESCRIPTION = "Keep the values a step stores for its log on the device; read them where the log does."
    RULES = (LOGGED,)
    TRIGGERS = (b".item(",)
    NEEDS = (STEP_LOOP, LOADER_LOOP)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.detached: Set[int] = set()  # ids of the `.item()` calls that become `.detach()`
        self._blocks: Dict[int, List[tuple]] = {}  # id(if) -> [(dict name, with a barrier)]

    def visit_For(self, node: cst.For) -> None:
        super().visit_For(node)
        self._plan(node)

    def visit_While(self, node: cst.While) -> None:
        super().visit_While(node)
        self._plan(node)

    def _plan(self, loop: cst.CSTNode) -> None:
        if self.target.sync is None:
            return  # a target with no step barrier (TorchTPU runs eagerly): nothing to read the values after
        if not (self.is_step_loop(loop) or (isinstance(loop, cst.For) and self.loaders.is_loader_loop(loop))):
            return
        stmts = body_statements(loop)  # type: ignore[arg-type]
        for k, stmt in enumerate(stmts):
            name = _fresh_dict(stmt)
            if name is not None:
                self._plan_dict(loop, stmts, k, name)

    def _plan_dict(self, loop: cst.CSTNode, stmts: List[cst.BaseStatement], k: int, name: str) -> None:
        scope = next((a for a in self.ancestors(loop) if isinstance(a, cst.FunctionDef)), self.tree.module)
        body = scope.body if isinstance(scope, cst.FunctionDef) else scope
        if any(name in {n.name.value for n in g.names} for g in find_all(body, (cst.Global, cst.Nonlocal))):
            return
        uses = [n for n in find_all(body, cst.Name) if n.value == name and self._is_variable(n)]
        inside = {id(n) for n in find_all(loop.body, cst.Name)}
        if any(id(n) not in inside or self._in_nested_scope(n, loop) for n in uses):
            return  # used outside the loop, or by a function that may run anywhere
        level = {id(n): j for j, s in enumerate(stmts) for n in find_all(s, cst.Name) if n.value == name}
        binding = stmts[k].body[0].targets[0].target  # type: ignore[attr-defined]
        stores, reads = [], []
        for use in uses:
            if use is binding:
                continue
            item = self._stored_item(use)
            if item is not None:
                stores.append((use, item))
            elif is_stored(use, self.ancestors(use)):
                return  # bound again
            else:
                reads.append(use)
        if not stores or not reads or any(level[id(u)] <= k for u, _ in stores):
            return
        last_store = max(level[id(u)] for u, _ in stores)
        block = stmts[level[id(reads[0])]]
        if not isinstance(block, cst.If) or level[id(reads[0])] <= last_store or any(
                not self._within(r, block.body) for r in reads):
            return
        if any(self._changed_before(item, stmts, level[id(u)], level[id(reads[0])]) for u, item in stores):
            return
        end = step_end(self.tree, loop, self.steps, self.qualnames)
        barrier = end is None or level[id(reads[0])] >= end
        if not self.flag(stmts[k], LOGGED.code, f"`{name}` keeps {len(stores)} `.item()` value(s) of every step for "
                         "a log read only in the `if` block at line "
                         f"{self.tree.start_positions([block])[id(block)][0]}: kept on the device (`.detach()`), "
                         "read there" + (" after the step's barrier" if barrier else ""), fix=True):
            return
        self.detached.update(id(item) for _, item in stores)
        self._blocks.setdefault(id(block), []).append((name, barrier))

    def _is_variable(self, name: cst.Name) -> bool:
        parent = self.parent(name)
        return not (isinstance(parent, cst.Attribute) and parent.attr is name or
                    isinstance(parent, cst.Arg) and parent.keyword is name or
                    isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.ImportAlias, cst.AsName)))

    def _in_nested_scope(self, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
        for anc in self.ancestors(node):
            if anc is loop:
                return False
            if isinstance(anc, _SCOPES):
                return True
        return False

    def _within(self, node: cst.CSTNode, block: cst.CSTNode) -> bool:
        return any(a is block for a in self.ancestors(node))

    def _stored_item(self, use: cst.Name) -> Optional[cst.Call]:
        """The ``.item()`` call of ``use[key] = <tensor>.item()`` (a device
        tensor, a name or a computed value), or None."""
        sub = self.parent(use)
        target = self.parent(sub) if isinstance(sub, cst.Subscript) and sub.value is use else None
        assign = self.parent(target) if isinstance(target, cst.AssignTarget) else None
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and len(sub.slice) == 1):  # type: ignore[union-attr]
            return None
        value = assign.value
        if not (isinstance(value, cst.Call) and call_name(value) == "item" and not value.args
                and isinstance(value.func, cst.Attribute) and isinstance(value.func.value, (cst.Name, cst.Call))):
            return None
        return value if host_read(self.tree, value, self.tensors, self.qualnames) == "item" else None

    @staticmethod
    def _changed_before(item: cst.Call, stmts: List[cst.BaseStatement], start: int, stop: int) -> bool:
        """The stored tensor is a name changed in place (``loss /= n``,
        ``loss.mul_(2)``, ``loss[0] = 1``) in the statements from its store
        to the log's block: the value kept on the device would change too."""
        tensor = item.func.value  # type: ignore[attr-defined]
        if not isinstance(tensor, cst.Name):
            return False
        for stmt in stmts[start:stop + 1]:
            for aug in find_all(stmt, cst.AugAssign):
                if isinstance(aug.target, cst.Name) and aug.target.value == tensor.value:
                    return True
            for call in find_all(stmt, cst.Call):
                f = call.func
                if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == tensor.value \
                        and f.attr.value.endswith("_") and not f.attr.value.startswith("_"):
                    return True
            for sub in find_all(stmt, cst.AssignTarget):
                t = sub.target
                if isinstance(t, cst.Subscript) and isinstance(t.value, cst.Name) and t.value.value == tensor.value:
                    return True
        return False

    # ---------------------------------------------------------------- rewrite
    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        planned = self._blocks.get(id(original_node))
        if not planned or not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        first: List[cst.BaseStatement] = []
        if any(barrier for _, barrier in planned):
            self.add_imports(self.target.sync_imports)
            first.append(cst.SimpleStatementLine([cst.Expr(self.target.sync_node())]))
        first += [cst.parse_statement(f"{name} = {{key: value.item() for key, value in {name}.items()}}\n")
                  for name, _ in planned]
        body = updated_node.body
        return updated_node.with_changes(body=body.with_changes(body=[*first, *body.body]))


def _fresh_dict(stmt: cst.BaseStatement) -> Optional[str]:
    """``name = {}`` or ``name = dict()``: the name."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    value = assign.value
    empty = (isinstance(value, cst.Dict) and not value.elements) or (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict" and not value.args)
    if not empty or len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return None
    return assign.targets[0].target.value


__all__ = ["LoggedValues", "LOGGED"]
