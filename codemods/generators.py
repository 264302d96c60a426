"""XLA107: a ``torch.Generator`` on a CUDA device, or on one the conversion
may make the XLA device, becomes a CPU generator where it would be XLA's.

torch_xla has no device generators: ``torch.Generator(device="xla")`` raises
"XLA device type not an accelerator".  A CPU generator works with it:
``torch.randn(shape, generator=g, device=xla)`` draws the CPU generator's
numbers and moves them (the same numbers as on the CPU), and libraries that
take a generator (diffusers' ``randn_tensor``) do the same.

``torch.Generator("cuda")`` names CUDA, and becomes ``torch.Generator("cpu")``.
``torch.Generator(device=device)`` names a device the program chose --
``"cuda"`` rewritten to the XLA device, a parameter a caller hands the XLA
device, ``x.device`` of a tensor moved there -- which once converted may be
XLA's: the generator is made on the CPU exactly where the device is XLA's
(``device="cpu" if str(device).startswith("xla") else device``), and where
it is anything else (the CPU, ``None``) it is made as before.  A device
written as any other expression (a call, whose second reading could differ)
is reported.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from codemods.analysis.cuda import is_cuda_string
from codemods.analysis.device_exprs import DeviceExprs, is_host_literal
from codemods.base import Rule, XlaCodemod
from codemods.syntax.nodes import calls_nothing, string_value

CUDA_GENERATOR = Rule(
    code="XLA107",
    name="cuda-generator",
    summary="`torch.Generator(\"cuda\")`, or on a device the conversion makes XLA's: XLA has no device generators; "
            "use a CPU one",
    why=(
        "torch_xla cannot create a `torch.Generator` on the XLA device (`RuntimeError: XLA device type not an "
        "accelerator`). A CPU generator works with it: `torch.randn(shape, generator=g, device=xla)` draws the CPU "
        "generator's numbers, the same as on the CPU, and moves them; libraries that take a generator (diffusers' "
        "`randn_tensor`, samplers) do the same. A CUDA generator becomes a CPU one. A generator on a device the "
        "program chose (`torch.Generator(device=device)`, `x.device`) is made on the CPU exactly where that "
        "device is XLA's, and as before anywhere else."
    ),
    before=(
        'import torch\n\ng = torch.Generator("cuda").manual_seed(0)\n\n\n'
        'def noise(shape, device=None):\n    gen = torch.Generator(device=device)\n'
        '    return torch.randn(shape, generator=gen, device=device)\n'
    ),
    after=(
        'import torch\n\ng = torch.Generator("cpu").manual_seed(0)\n\n\n'
        'def noise(shape, device=None):\n    gen = torch.Generator(device="cpu" if str(device).startswith("xla") '
        'else device)\n    return torch.randn(shape, generator=gen, device=device)\n'
    ),
    valid=(
        'import torch\n\ng = torch.Generator()\nh = torch.Generator(device="cpu")\n',
        'import torch\n\ng = torch.Generator(device=None)\n',
    ),
)


def cpu_where_xla(device: cst.BaseExpression) -> cst.IfExp:
    """``"cpu" if str(device).startswith("xla") else device``."""
    test = cst.parse_expression(f'str({cst.Module([]).code_for_node(device)}).startswith("xla")')
    return cst.IfExp(test=test, body=cst.SimpleString('"cpu"'), orelse=device)


def _is_cpu_where_xla(node: cst.CSTNode) -> bool:
    """What ``cpu_where_xla`` made (a second run leaves it)."""
    return m.matches(node, m.IfExp(
        body=m.SimpleString('"cpu"'),
        test=m.Call(func=m.Attribute(value=m.Call(func=m.Name("str")), attr=m.Name("startswith")),
                    args=[m.Arg(m.SimpleString('"xla"'))])))


class CudaGenerators(XlaCodemod):
    DESCRIPTION = 'Make CUDA random generators, and those on the XLA device, CPU ones: torch_xla cannot create one.'
    RESPECTS_HAND_PORTS = True
    RULES = (CUDA_GENERATOR,)
    TRIGGERS = (b"Generator",)
    NEEDS = ("torch:Generator",)  # (a device the program chose may be XLA's in any module of it)

    def regions(self, tree):
        return tree.statements_where(lambda n: n.value == "Generator", (cst.Name,))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.is_qualname(original_node.func, "torch.Generator", "torch._C.Generator"):
            return updated_node
        for i, a in enumerate(original_node.args):
            positional_device = i == 0 and a.keyword is None
            keyword_device = a.keyword is not None and a.keyword.value == "device"
            if positional_device or keyword_device:
                value = self._device(a.value)
                if value is not None:
                    args = list(updated_node.args)
                    args[i] = args[i].with_changes(value=value)
                    return updated_node.with_changes(args=args)
        return updated_node

    def _device(self, device: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """The generator's device once converted, or None to leave it."""
        code = self.tree.module.code_for_node(device)
        devices = DeviceExprs(self.tree, self.qualnames)
        if is_cuda_string(device) or devices.cuda_device(device):
            if self.flag(device, CUDA_GENERATOR.code, "CUDA generator -> CPU generator", fix=True):
                return cst.SimpleString('"cpu"')
            return None
        if (string_value(device) or "").startswith("xla") or devices.xla_device(device):
            if self.flag(device, CUDA_GENERATOR.code, "a generator on the XLA device (torch_xla has none) -> CPU "
                         "generator", fix=True):
                return cst.SimpleString('"cpu"')
            return None
        if is_host_literal(device) or (isinstance(device, cst.Name) and device.value == "None") or _is_cpu_where_xla(
                device) or isinstance(device, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
            return None  # (another string: not a device torch_xla makes)
        if not calls_nothing(device):  # (read twice by the choice)
            self.flag(device, CUDA_GENERATOR.code, f"a generator on `{code}`, which the conversion may make the XLA "
                      "device: torch_xla has no device generators; make it on the CPU where the device is XLA's "
                      f"(`\"cpu\" if str(d).startswith(\"xla\") else d`, `d` the device read once)", fix=False)
            return None
        if self.flag(device, CUDA_GENERATOR.code, f"a generator on `{code}`, which the conversion may make the XLA "
                     "device: torch_xla has no device generators -> a CPU generator where it is XLA's (the same "
                     "numbers as on the CPU), as before elsewhere", fix=True):
            return cpu_where_xla(device)
        return None
