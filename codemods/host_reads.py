"""XLA401-404: host reads on the hot path (reported only).

Each of these runs the pending graph and copies a value to the host, every
step: ``.item()``, ``.tolist()``/``.numpy()``/``.cpu()``, ``float(t)``, a
tensor as ``torch.full``'s fill value, a tensor in a condition.  They need a
person: the fix depends on what the value is for.  Each finding says what to
do instead.  Where "hot" is: :mod:`codemods.hot_path`.
"""

from __future__ import annotations

from typing import Set

import libcst as cst

from codemods.analysis import is_tensor_expr
from codemods.analysis.syncs import is_barrier_call
from codemods.analysis.placement import FILL_CALLS, TO_HOST, fill_argument, host_read, reads_truth
from codemods.base import Rule, call_name
from codemods.hot_path import HotPathCodemod

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
    summary="`.tolist()` / `.numpy()` / `.cpu()` / `.to(\"cpu\")` on the hot path copies a tensor to the host",
    why=(
        "Each of these executes the pending graph and waits for a device-to-host copy "
        "(`TransferFromDeviceTime`). `.numpy()` fails outright on XLA tensors without "
        "`.cpu()`. Keep values on the device inside the loop; copy once after it. Where each step's result "
        "must reach the host (a sampler keeping every step on the CPU), the step barrier goes right before "
        "the first copy (XLA302): the copies then find the step computed instead of each running its part."
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


class HostReads(HotPathCodemod):
    DESCRIPTION = "Report host reads on the hot path."
    RULES = (ITEM, TRANSFER, SCALAR, CONDITION)

    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        name = call_name(node)
        # (a host tensor -- `x = out.to("cpu")`, `losses = torch.zeros(n)` -- crosses nothing)
        read = host_read(self.tree, node, self.tensors, self.qualnames)
        if read is not None and self._right_after_barrier(node):
            return  # the barrier ran the pending graph: a computed value is copied, on some steps only
        if read == "item":
            self._report(node, ITEM, "`.item()` reads a tensor on the host: accumulate on the device, read once")
        elif read in TO_HOST or read == "to":
            call = f'.{name}("cpu")' if read == "to" else f".{name}()"
            self._report(node, TRANSFER, f"`{call}` copies a tensor to the host: keep it on the device in the loop")
        elif read is not None:
            self._report(node, SCALAR, f"`{name}()` of a tensor is a host read")
        elif name in FILL_CALLS and self._tensor_fill(node, self.qualnames(node.func)):
            self._report(node, SCALAR, f"`{name}` with a tensor as its fill value reads it on the host (an implicit "
                                       "`.item()`), and the value becomes a constant of the graph: "
                                       "broadcast the tensor instead (`value.expand(shape)`)")

    def _right_after_barrier(self, call: cst.Call) -> bool:
        """``call``'s statement follows a barrier statement in the block of an
        ``if`` (the log every N steps: ``torch_xla.sync()``, then
        ``losses.append(loss.item())``): a computed value copied on some steps
        only, as torch_xla's examples log.  (After a barrier on every pass the
        host still waits for each step: reported.)"""
        line = next((a for a in self.ancestors(call) if isinstance(a, cst.SimpleStatementLine)), None)
        block = self.parent(line) if line is not None else None
        if not isinstance(block, cst.IndentedBlock) or not isinstance(self.parent(block), cst.If):
            return False
        k = next(i for i, s in enumerate(block.body) if s is line)
        before = block.body[k - 1] if k else None
        return isinstance(before, cst.SimpleStatementLine) and len(before.body) == 1 and \
            isinstance(before.body[0], cst.Expr) and isinstance(before.body[0].value, cst.Call) and \
            is_barrier_call(before.body[0].value, self.target.barrier_names, self.qualnames)

    def _tensor_fill(self, call: cst.Call, quals: Set[str]) -> bool:
        """``torch.full(shape, table[index])``: a tensor where a Python number goes."""
        if isinstance(call.func, cst.Attribute) and call_name(call) != "new_full" and \
                not any(n.startswith("torch.") for n in quals):
            return False
        arg = fill_argument(call)
        if arg is None:
            return False
        fill = arg.value
        base = fill.value if isinstance(fill, cst.Subscript) else fill
        return self._on_device(base) or (not isinstance(fill, cst.Subscript)
                                         and is_tensor_expr(fill, self.tensors, self.qualnames)
                                         and not self._on_host(fill))

    def visit_If(self, node: cst.If) -> None:
        self._condition(node.test)

    def visit_Assert(self, node: cst.Assert) -> None:
        self._condition(node.test)

    def visit_While(self, node: cst.While) -> None:
        super().visit_While(node)
        self._condition(node.test)

    def _condition(self, test: cst.BaseExpression) -> None:
        if reads_truth(test, self.tensors, self.qualnames):
            self._report(test, CONDITION, "tensor-valued condition: a host read and a graph split every time; "
                                          "use `torch.where` or test outside the loop")
