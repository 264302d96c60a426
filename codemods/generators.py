"""XLA107: ``torch.Generator("cuda")`` becomes a CPU generator.

torch_xla has no device generators; libraries that take a generator accept a
CPU one and move the numbers to the device.
"""

from __future__ import annotations

import libcst as cst

from codemods.analysis.cuda import is_cuda_string
from codemods.base import Rule, XlaCodemod


CUDA_GENERATOR = Rule(
    code="XLA107",
    name="cuda-generator",
    summary="`torch.Generator(\"cuda\")`: XLA has no device generators; use a CPU one",
    why=(
        "torch_xla cannot create a `torch.Generator` on the XLA device. Libraries "
        "that take a generator (diffusers' `randn_tensor`, samplers) accept a CPU "
        "generator and move the numbers to the device, so the generator moves to the CPU."
    ),
    before='import torch\n\ng = torch.Generator("cuda").manual_seed(0)\n',
    after='import torch\n\ng = torch.Generator("cpu").manual_seed(0)\n',
)


class CudaGenerators(XlaCodemod):
    DESCRIPTION = 'Make CUDA random generators CPU ones: torch_xla cannot create one on its device.'
    RESPECTS_HAND_PORTS = True
    RULES = (CUDA_GENERATOR,)
    TRIGGERS = (b"Generator",)
    NEEDS = ("code~cuda",)

    def regions(self, tree):
        return tree.statements_where(lambda n: n.value == "Generator", (cst.Name,))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.is_qualname(original_node.func, "torch.Generator", "torch._C.Generator"):
            return updated_node
        args = list(updated_node.args)
        for i, a in enumerate(original_node.args):
            positional_device = i == 0 and a.keyword is None
            keyword_device = a.keyword is not None and a.keyword.value == "device"
            if (positional_device or keyword_device) and is_cuda_string(a.value):
                if self.flag(a.value, CUDA_GENERATOR.code, "CUDA generator -> CPU generator", fix=True):
                    args[i] = args[i].with_changes(value=cst.SimpleString('"cpu"'))
                    return updated_node.with_changes(args=args)
        return updated_node
