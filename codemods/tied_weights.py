"""XLA157: weights that modules share stay shared on the XLA device.

A language model often ties its output layer to its embedding
(``self.lm_head.weight = self.wte.weight``: one ``Parameter`` held by two
modules).  ``module.to(device)`` keeps a parameter's identity only where it
can convert it in place; from the CPU to an XLA device it cannot, and makes a
new ``Parameter`` for every module that holds one -- so the tie silently
becomes two weights, trained apart (pytorch/xla#2719, #7042; seen on
nanoGPT, whose checkpoint then held one more tensor than on CUDA).  The
module that ties them turns on PyTorch's swapping conversion when it is
imported -- ``torch.__future__.set_swap_module_params_on_conversion(True)``
-- so that ``.to()`` swaps each parameter in place and the tie holds.
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from codemods.base import Rule, XlaCodemod, dotted, find_all, statement
from codemods.syntax.imports import head_length

SWAP = "torch.__future__.set_swap_module_params_on_conversion"
_SHARED = ("weight", "bias")

TIED_WEIGHTS = Rule(
    code="XLA157",
    name="tied-weights",
    summary="weights shared between modules (`self.head.weight = self.embed.weight`) stay shared on the XLA device",
    why=(
        "`module.to(device)` keeps a parameter's identity only where it can convert it in place. From the CPU to "
        "an XLA device it cannot, and it makes a new `Parameter` for each module that holds one: a weight tied "
        "between two modules (an embedding and the output layer of a language model) silently becomes two, "
        "trained apart (pytorch/xla#2719). The module that ties them turns on PyTorch's swapping conversion "
        "where it is imported (`torch.__future__.set_swap_module_params_on_conversion(True)`): `.to()` then "
        "swaps each parameter in place and the tie holds. Only ties written in a class (`self.a.weight = "
        "self.b.weight`) are rewritten."
    ),
    before=(
        "import torch\nimport torch.nn as nn\n\n\nclass LM(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.embed = nn.Embedding(10, 4)\n"
        "        self.head = nn.Linear(4, 10, bias=False)\n        self.head.weight = self.embed.weight\n"
    ),
    after=(
        "import torch\nimport torch.nn as nn\n\n" + SWAP + "(True)\n\n\nclass LM(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.embed = nn.Embedding(10, 4)\n"
        "        self.head = nn.Linear(4, 10, bias=False)\n        self.head.weight = self.embed.weight\n"
    ),
    valid=(
        # already swapping
        "import torch\n\n" + SWAP + "(True)\n\n\nclass LM:\n    def tie(self):\n"
        "        self.head.weight = self.embed.weight\n",
        # a parameter of its own, not another module's
        "import torch\n\n\nclass Layer:\n    def __init__(self, weight):\n        self.weight = weight\n"
        "        self.proj.weight = torch.nn.Parameter(weight)\n",
    ),
)


class TiedWeights(XlaCodemod):
    DESCRIPTION = "Keep weights tied between modules shared when the model moves to the XLA device."
    RESPECTS_HAND_PORTS = True  # a module that supports XLA already may re-tie by hand (transformers does)
    RULES = (TIED_WEIGHTS,)
    TRIGGERS = tuple(f"{name} = self.".encode() for name in _SHARED)

    @classmethod
    def wanted(cls, tree, options):
        return bool(ties(tree.module)) and not any(dotted(c.func) == SWAP for c in find_all(tree.module, cst.Call))

    def regions(self, tree):
        self._ties = ties(tree.module)
        return self._ties

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        flagged = [self.flag(tie, TIED_WEIGHTS.code, f"`{_text(tie)}` ties a weight between modules: `.to(<XLA "
                             "device>)` would untie it; parameters are swapped in place instead", fix=True)
                   for tie in self._ties]
        if not any(flagged):
            return updated_node
        self.add_imports((("torch", None, None),))
        body = list(updated_node.body)
        at = head_length(updated_node)
        call = statement(cst.Call(func=cst.parse_expression(SWAP), args=[cst.Arg(cst.Name("True"))]))
        body.insert(at, call.with_changes(leading_lines=[cst.EmptyLine()] if at else []))
        return updated_node.with_changes(body=body)


def ties(module: cst.Module) -> List[cst.SimpleStatementLine]:
    """The statements of the module's classes that give one module's weight
    (or bias) to another: ``self.a.weight = self.b.weight``."""
    found: List[cst.SimpleStatementLine] = []
    seen = set()
    for cls in find_all(module, cst.ClassDef):
        for line in find_all(cls, cst.SimpleStatementLine):
            if id(line) not in seen and _tie(line) is not None:
                seen.add(id(line))
                found.append(line)  # type: ignore[arg-type]
    return found


def _tie(line: cst.CSTNode) -> Optional[cst.Assign]:
    body = getattr(line, "body", ())
    if len(body) != 1 or not isinstance(body[0], cst.Assign) or len(body[0].targets) != 1:
        return None
    target, value = body[0].targets[0].target, body[0].value
    if not (isinstance(target, cst.Attribute) and isinstance(value, cst.Attribute)):
        return None
    left, right = dotted(target) or "", dotted(value) or ""
    if target.attr.value in _SHARED and value.attr.value == target.attr.value and left != right and \
            left.startswith("self.") and right.startswith("self."):
        return body[0]
    return None


def _text(line: cst.CSTNode) -> str:
    assign = _tie(line)
    return f"{dotted(assign.targets[0].target)} = {dotted(assign.value)}" if assign is not None else ""
