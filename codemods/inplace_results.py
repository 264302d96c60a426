"""XLA419: a function hands back the result of an in-place op on a tensor it has just made: the op is made out-of-place.

``res.append(correct_k.mul_(100.0 / batch_size))`` in pytorch/examples'
imagenet ``accuracy``: on XLA a view of the result (``acc1[0]``, kept in a
meter and printed after the step) is computed from the in-place write again
each time it is read, after the step's barrier too.  ``correct_k.mul(...)``
gives the same values in a new tensor.  ``analysis.inplace_results`` says
where nothing else could see the difference.
"""

from __future__ import annotations

import libcst as cst

from codemods.analysis.cuda import being_ported, ported_needs, scope_of
from codemods.analysis.inplace_results import TWINS, inplace_results
from codemods.base import Rule, XlaCodemod

INPLACE_RESULT = Rule(
    code="XLA419",
    name="inplace-result",
    summary="a function hands back an in-place op's result on a tensor it has just made "
            "(`res.append(correct_k.mul_(100.0 / n))`) -> the out-of-place op",
    why=(
        "On XLA a view of a tensor written in place is computed from that write again each time it is read. "
        "pytorch/examples' imagenet `accuracy` (copied into MoCo, SupContrast and many more) returns "
        "`correct_k.mul_(100.0 / batch_size)`; the caller keeps `acc1[0]` in a meter and prints it after the "
        "step, and every print runs a graph of its own after the step's barrier (imagenet at `--print-freq 1`: 20 "
        "graph executions over 6 batches; 8 with the out-of-place op). `correct_k.mul(100.0 / batch_size)` "
        "computes the same values into a new tensor, whose views the barrier leaves computed. Rewritten where the "
        "result is returned or appended to a list, the tensor is a name of the function bound only to a new "
        "tensor (a reduction, arithmetic, a clone -- not a view or a parameter) and read nowhere else, and every "
        "argument is a number (a tensor's dtype could make the out-of-place result another dtype), in code being "
        "ported."
    ),
    before=(
        "import torch\n\ndef accuracy(output, target):\n    n = target.size(0)\n"
        "    correct = output.argmax(1).eq(target).float().sum(0, keepdim=True)\n"
        "    return correct.mul_(100.0 / n)\n\nmodel = model.cuda()\n"
    ),
    after=(
        "import torch\n\ndef accuracy(output, target):\n    n = target.size(0)\n"
        "    correct = output.argmax(1).eq(target).float().sum(0, keepdim=True)\n"
        "    return correct.mul(100.0 / n)\n\nmodel = model.cuda()\n"
    ),
    valid=(
        # a view of a parameter: the caller's tensor changes
        "import torch\n\ndef scale(x):\n    y = x[0]\n    return y.mul_(2)\n\nmodel = model.cuda()\n",
        # the tensor is read again after it changes
        "import torch\n\ndef f(x):\n    y = x.sum(0)\n    out = y.mul_(2)\n    return out, y\n\nmodel = model.cuda()\n",
        # a tensor argument (its dtype could promote the result)
        "import torch\n\ndef f(x, w):\n    y = x.sum(0)\n    return y.mul_(w)\n\nmodel = model.cuda()\n",
        # `.float()` of a float tensor is the tensor itself
        "import torch\n\ndef f(x):\n    y = x.float()\n    return y.mul_(2)\n\nmodel = model.cuda()\n",
    ),
)


class InplaceResults(XlaCodemod):
    DESCRIPTION = "Make out-of-place the in-place op whose result a function hands back, on a tensor it has just made."
    RULES = (INPLACE_RESULT,)
    TRIGGERS = tuple(f".{op}(".encode() for op in TWINS)
    NEEDS = ported_needs()

    @classmethod
    def wanted(cls, tree, options):
        return being_ported(tree)

    def regions(self, tree):
        return tree.statements_where(lambda n: n.value in TWINS, (cst.Name,))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in TWINS):
            return updated_node
        fn = scope_of(original_node, self.tree)
        if not isinstance(fn, cst.FunctionDef) or not any(
                c is original_node for c in inplace_results(self.tree, fn, self.qualnames)):
            return updated_node
        op = func.attr.value
        if not self.flag(original_node, INPLACE_RESULT.code,
                         f"`.{op}(...)` -> `.{TWINS[op]}(...)`: the function hands back the result of an in-place op "
                         "on a tensor it has just made; on XLA a view of it read after the step's barrier "
                         "(`acc1[0]`) runs a graph again at each read (the same values)", fix=True):
            return updated_node
        new_func = updated_node.func.with_changes(attr=cst.Name(TWINS[op]))  # type: ignore[attr-defined]
        return updated_node.with_changes(func=new_func)


__all__ = ["INPLACE_RESULT", "InplaceResults"]
