"""XLA423: ``AveragedModel(model, device=d)`` of a model already moved to
``d`` is made without ``device=``, so its step counter stays on the host.

``torch.optim.swa_utils.AveragedModel`` keeps the number of averages in a
buffer, ``n_averaged``, made with ``torch.tensor(0, device=device)``, and
``update_parameters`` tests it in Python (``if self.n_averaged == 0``, once
per parameter, then ``if self.n_averaged > 0``).  On the device each test
reads the device: every EMA update, every step, runs the pending graph and
two more (measured on XLA's CPU backend: 3 graph executions a step instead
of 1, 7 compiles instead of 3).  Without ``device=`` the averaged copy is
made where the model is (``deepcopy(model)``; the ``.to(device)`` it skips
would not move it) and the counter is a host tensor: the tests read the
host and ``n_averaged.to(p.device)`` hands the average its count, the same
values.

Rewritten only where the model argument is a name whose last move before
the call (``codemods.analysis.module_moves``) went to the same device
expression ``device=`` names, so dropping it moves nothing; a model moved
elsewhere, or not visibly, and an EMA kept on another device
(``device="cpu"``, ``config.SWA.DEVICE``) are left as written, and so is an
average the program moves again itself (``ema = ema.to(device)``).
"""

from __future__ import annotations

import libcst as cst

from codemods.analysis.averages import AVERAGED_MODELS, device_index
from codemods.analysis.module_moves import MOVES, moved_to
from codemods.base import Rule, XlaCodemod, find_all
from codemods.syntax.nodes import source_of


AVERAGED_MODEL_COUNTER = Rule(
    code="XLA423",
    name="averaged-model-counter",
    summary="`AveragedModel(model, device=d)` of a model already on `d` drops `device=`: its step counter stays "
            "on the host",
    why=(
        "`AveragedModel` counts its updates in a buffer made on `device=`, and `update_parameters` tests it in "
        "Python (`if self.n_averaged == 0`, per parameter): on the XLA device every EMA update reads the device, "
        "running the step's pending graph and two more (3 graph executions a step instead of 1 on XLA's CPU "
        "backend). The model is already on that device, so without `device=` the averaged copy is made in the "
        "same place and only the counter changes: it stays on the host, where the tests cost nothing and the "
        "averages come out the same. Done where the model's last move before the call went to the same device "
        "expression."
    ),
    before=(
        "import torch\nfrom torch.optim.swa_utils import AveragedModel\n\n"
        "model = Net().to(device)\nema = AveragedModel(model, device=device)\n"
    ),
    after=(
        "import torch\nfrom torch.optim.swa_utils import AveragedModel\n\n"
        "model = Net().to(device)\nema = AveragedModel(model)\n"
    ),
    valid=(
        # kept on the host on purpose: another device than the model's
        "import torch\nfrom torch.optim.swa_utils import AveragedModel\n\n"
        "model = Net().to(device)\nema = AveragedModel(model, device='cpu')\n",
        # the model is not visibly on that device yet
        "import torch\nfrom torch.optim.swa_utils import AveragedModel\n\n"
        "model = Net()\nema = AveragedModel(model, device=device)\nmodel.to(device)\n",
    ),
)


class AveragedModelCounter(XlaCodemod):
    DESCRIPTION = "Make an AveragedModel of a model already on its device without device=, so its counter stays " \
                  "on the host."
    RULES = (AVERAGED_MODEL_COUNTER,)
    TRIGGERS = (b"AveragedModel",)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.is_qualname(original_node.func, *AVERAGED_MODELS):
            return updated_node
        index = device_index(original_node)
        if index is None or index == 0 or original_node.args[0].keyword is not None:
            return updated_node
        model = original_node.args[0].value
        if not isinstance(model, cst.Name):
            return updated_node
        moved = moved_to(self.tree, model)
        device = original_node.args[index].value
        if moved is None or source_of(moved) != source_of(device) or self._moved_later(original_node):
            return updated_node
        if not self.flag(original_node, AVERAGED_MODEL_COUNTER.code,
                         f"`device=` dropped: `{model.value}` is already on `{source_of(device)}`, so the copy is "
                         "made there and the step counter `n_averaged` stays on the host (no device read per update)",
                         fix=True):
            return updated_node
        if updated_node.args[index].keyword is None:  # positional: `None` keeps the arguments after it in place
            args = list(updated_node.args)
            args[index] = args[index].with_changes(value=cst.Name("None"))
            return updated_node.with_changes(args=args)
        args = [a for i, a in enumerate(updated_node.args) if i != index]
        if index == len(updated_node.args) - 1:  # the last one: the one before it takes its comma (or none)
            args[-1] = args[-1].with_changes(comma=updated_node.args[index].comma)
        return updated_node.with_changes(args=args)

    def _moved_later(self, call: cst.Call) -> bool:
        """The averaged model is moved again in its scope (``ema = ema.to(device)``, as some trainers do right
        after making it): its counter goes to the device all the same, and nothing is gained."""
        stmt = self.tree.statement_of(call)
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if not isinstance(small, cst.Assign) or small.value is not call:
            return False
        names = {source_of(t.target) for t in small.targets}
        scope = next((a for a in self.ancestors(call) if isinstance(a, (cst.FunctionDef, cst.Lambda))),
                     self.tree.module)
        return any(isinstance(c.func, cst.Attribute) and c.func.attr.value in MOVES
                   and source_of(c.func.value) in names for c in find_all(scope, cst.Call))


__all__ = ["AveragedModelCounter", "AVERAGED_MODEL_COUNTER"]
