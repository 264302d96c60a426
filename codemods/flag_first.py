"""XLA422: a condition that reads a tensor before a host flag that can
decide it alone (``if torch.isnan(x).any() and DEBUG:``) tests the flag
first, where it runs every step.

yenchenlin/nerf-pytorch's ``render_rays`` checks every output for NaN and
infinity on every call, ``(torch.isnan(ret[k]).any() or
torch.isinf(ret[k]).any()) and DEBUG``, with ``DEBUG = False``: Python
evaluates the tensor side first, so each check reads the device and cuts
the step's graph, for a print that never happens.  ``DEBUG and (...)`` has
the same truth value -- both sides only compute -- and reads nothing while
the flag is off.

Rewritten where the test is ``<tensor side> and <flag>`` (or ``or``) on the
hot path, the flag a name or an attribute that holds no tensor (or ``not``
of one), and the tensor side only calls functions that compute (``isnan``,
``isinf``, ``any``, ``abs``...: ``_PURE``), so skipping it changes nothing.
"""

from __future__ import annotations

import libcst as cst

from codemods.analysis import is_tensor_expr
from codemods.analysis.placement import DEVICE, placement, reads_truth
from codemods.base import Rule, call_name, find_all
from codemods.hot_path import HotPathCodemod

FLAG_FIRST = Rule(
    code="XLA422",
    name="host-flag-first",
    summary="a tensor condition before a host flag (`torch.isnan(x).any() and DEBUG`) tests the flag first",
    why=(
        "Python evaluates `a and b` from the left: `torch.isnan(x).any() and DEBUG` reads the tensor on the host, "
        "running the pending graph, before it looks at the flag that may decide alone (nerf-pytorch checks every "
        "output so, every step, with `DEBUG = False`). `DEBUG and torch.isnan(x).any()` has the same truth value, "
        "since both sides only compute, and reads nothing while the flag is off. Done where the test runs every "
        "step, the flag is a name or an attribute holding no tensor, and the tensor side only calls functions that "
        "compute."
    ),
    before=(
        "import torch\n\nDEBUG = False\nfor x in loader:\n    out = model(x.cuda())\n"
        "    if torch.isnan(out).any() and DEBUG:\n        print('nan')\n"
    ),
    after=(
        "import torch\n\nDEBUG = False\nfor x in loader:\n    out = model(x.cuda())\n"
        "    if DEBUG and torch.isnan(out).any():\n        print('nan')\n"
    ),
    valid=(
        # the flag first already
        "import torch\n\nDEBUG = False\nfor x in loader:\n    out = model(x.cuda())\n"
        "    if DEBUG and torch.isnan(out).any():\n        print('nan')\n",
        # the left side does more than compute: it must run
        "import torch\n\nfor x in loader:\n    out = model(x.cuda())\n"
        "    if check(out).any() and args.debug:\n        print('nan')\n",
    ),
)

# tensor functions and methods that only compute (skipping one changes nothing but the time it takes)
_PURE = frozenset({"isnan", "isinf", "isfinite", "isneginf", "isposinf", "any", "all", "abs", "sum", "mean", "max",
                   "min", "amax", "amin", "isclose", "allclose", "eq", "ne", "gt", "lt", "ge", "le", "norm", "detach",
                   "float", "logical_not", "logical_or", "logical_and"})


class FlagFirst(HotPathCodemod):
    DESCRIPTION = "Test a host flag before a tensor condition it is `and`/`or`-ed with, where it runs every step."
    RULES = (FLAG_FIRST,)
    TRIGGERS = (b" and ", b" or ")

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        test = original_node.test
        if not isinstance(test, cst.BooleanOperation) or not self._swappable(test) or self._where() is None:
            return updated_node
        op = "and" if isinstance(test.operator, cst.And) else "or"
        if not self.flag(test, FLAG_FIRST.code, f"`{op}` with a host flag: the flag is tested first (the tensor is "
                         "read only when the flag does not decide)", fix=True):
            return updated_node
        new = updated_node.test
        assert isinstance(new, cst.BooleanOperation)
        return updated_node.with_changes(test=new.with_changes(left=new.right, right=new.left))

    def _swappable(self, test: cst.BooleanOperation) -> bool:
        left, right = test.left, test.right
        flag = right.expression if isinstance(right, cst.UnaryOperation) and isinstance(right.operator, cst.Not) \
            else right
        if not isinstance(flag, (cst.Name, cst.Attribute)) or is_tensor_expr(flag, self.tensors, self.qualnames) \
                or placement(self.tree, flag) == DEVICE:
            return False
        if not reads_truth(left, self.tensors, self.qualnames):
            return False
        if find_all(left, (cst.NamedExpr, cst.Await, cst.Yield, cst.Lambda)):
            return False
        return all(call_name(c) in _PURE for c in find_all(left, cst.Call))

__all__ = ["FlagFirst", "FLAG_FIRST"]
