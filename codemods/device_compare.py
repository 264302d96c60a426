"""XLA104: comparisons with "cuda".

``x.device.type == "cuda"`` asks which side the accelerator takes: it becomes a
comparison with "xla", so the XLA device takes the side the GPU took (the
CUDA-only sides of such tests are gone first: XLA116).  Any other comparison
with a "cuda..." string (a config value, a backend name) is reported.
"""

from __future__ import annotations

import re

import libcst as cst

from codemods.base import Rule, XlaCodemod, dotted, string_value


CUDA_COMPARE = Rule(
    code="XLA104",
    name="cuda-comparison",
    summary='`device.type == "cuda"` -> `"xla"`; other comparisons with "cuda" are reported',
    why=(
        'Code such as `if device.type == "cuda": model = model.to(device)` chooses the path the '
        'accelerator takes. On XLA the device type is "xla", so the comparison becomes one with "xla" '
        "and the program takes the side it took on the GPU (a side that needs CUDA itself -- a fused "
        "optimizer, device properties -- has been removed first: XLA116). A comparison with \"cuda\" "
        "of anything else (a config value, a backend name) is reported: check the branch by hand."
    ),
    before='if x.device.type == "cuda":\n    model = model.to(x.device)\nif cfg.backend == "cuda":\n    pass\n',
    after='if x.device.type == "xla":\n    model = model.to(x.device)\nif cfg.backend == "cuda":\n    pass\n',
    valid=('if x.device.type == "xla":\n    pass\n',),
)


class DeviceComparisons(XlaCodemod):
    DESCRIPTION = 'Compare device types with "xla" where they were compared with "cuda"; report other comparisons.'
    RESPECTS_HAND_PORTS = True
    RULES = (CUDA_COMPARE,)
    TRIGGERS = (b"cuda",)
    NEEDS = ("code~cuda",)  # (see regions)

    def regions(self, tree):
        return tree.statements_where(lambda n: "cuda" in n.value, (cst.SimpleString,))

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.Comparison:
        node = original_node
        operands = [node.left] + [t.comparator for t in node.comparisons]
        for op in operands:
            if string_value(op) is not None and string_value(op).startswith("cuda"):  # type: ignore[union-attr]
                others = [o for o in operands if o is not op]
                if string_value(op) == "cuda" and len(operands) == 2 and _is_device_type(others[0]):
                    # `x.device.type == "cuda"`: the device's type (the
                    # CUDA-only sides of such tests are gone: XLA116)
                    # (the target's device type: "xla", "tpu" -- or "cpu" for verify's CPU reference)
                    kind = self.target.device_string
                    if self.flag(node, CUDA_COMPARE.code, f'`.type == "cuda"` -> `.type == "{kind}"`: the '
                                 f'{kind.upper()} device takes the side the GPU took', fix=True):
                        return _replace_operand(updated_node, operands.index(op),
                                                cst.SimpleString(op.value[0] + kind + op.value[0]))  # type: ignore[attr-defined]
                    return updated_node
                self.flag(
                    node,
                    CUDA_COMPARE.code,
                    'comparison with "cuda" is never true on XLA (device type is "xla"); '
                    "check this branch",
                    fix=False,
                )
                return updated_node
        return updated_node


def _is_device_type(node: cst.CSTNode) -> bool:
    """``<a device>.type``: ``device.type``, ``x.device.type``, ``self.device.type``."""
    return isinstance(node, cst.Attribute) and node.attr.value == "type" and \
        bool(re.search(r"device$", (dotted(node.value) or "").split(".")[-1]))


def _replace_operand(node: cst.Comparison, index: int, new: cst.BaseExpression) -> cst.Comparison:
    if index == 0:
        return node.with_changes(left=new.with_changes(lpar=node.left.lpar, rpar=node.left.rpar))
    targets = list(node.comparisons)
    targets[index - 1] = targets[index - 1].with_changes(comparator=new)
    return node.with_changes(comparisons=targets)
