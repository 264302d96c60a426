"""XLA162: a model traced on the XLA device is traced from a CPU copy.

``torch.jit.trace`` does not work on XLA tensors: a convolution or a
BatchNorm traced with them raises ("Cannot insert a Tensor that requires grad
as a constant", pytorch/xla#7606), and so do what trace underneath --
TensorBoard's ``writer.add_graph(model, x)``, ``torch.onnx.export``.  On a GPU
the same lines run.  What they make is a picture or a file of the model's
graph, the same whichever device traced it, so the converted program traces a
CPU copy of the model with its inputs on the CPU.  ``torch.jit.trace`` itself
makes a module the program may go on to run on the device: reported.
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from codemods.analysis.placement import HOST, placement
from codemods.analysis.tensors import is_tensor_expr
from codemods.analysis.values import MODULE, TENSOR, UNKNOWN
from codemods.analysis.values import values as values_of
from codemods.base import Rule, XlaCodemod, call_name
from codemods.syntax import imports

HOST_TRACE = Rule(
    code="XLA162",
    name="host-trace",
    summary="a model traced on the XLA device (`writer.add_graph`, `torch.onnx.export`) is traced from a CPU copy",
    why=(
        "Tracing does not work on XLA tensors: `torch.jit.trace` of a model on the XLA device raises at its first "
        "convolution or BatchNorm (\"Cannot insert a Tensor that requires grad as a constant\", pytorch/xla#7606), "
        "and TensorBoard's `writer.add_graph(model, x)` and `torch.onnx.export(model, x, path)` trace underneath. "
        "What they make -- the graph shown in TensorBoard, the ONNX file -- does not depend on the device that "
        "traced it, so they are handed a CPU copy of the model (`copy.deepcopy(model).cpu()`; the model itself stays "
        "where it is) and their inputs moved to the CPU. Rewritten where each input is a tensor (or a tuple of "
        "tensors written out); anything else, and `torch.jit.trace` itself (its module may go on to run on the "
        "device), is reported."
    ),
    before=(
        "import torch\nfrom torch.utils.tensorboard import SummaryWriter\n\nmodel = Net().cuda()\n"
        "writer = SummaryWriter()\nwriter.add_graph(model, torch.randn(1, 3, 32, 32).cuda())\n"
    ),
    after=(
        "import torch\nfrom torch.utils.tensorboard import SummaryWriter\nimport copy\nimport torch_xla\n\n"
        "model = Net().to(torch_xla.device())\nwriter = SummaryWriter()\n"
        "writer.add_graph(copy.deepcopy(model).cpu(), torch.randn(1, 3, 32, 32).to(torch_xla.device()).cpu())\n"
    ),
    valid=("import torch\n\nwriter.add_graph(model, torch.randn(1, 3, 32, 32))\n",),
    requires=("XLA101",),  # (the example's `.cuda()`)
)

_EXPORTS = frozenset({"torch.onnx.export"})
_TRACES = frozenset({"torch.jit.trace", "torch.jit.trace_module"})
_INPUT_KEYWORDS = {"add_graph": "input_to_model", "torch.onnx.export": "args"}


class HostTraces(XlaCodemod):
    DESCRIPTION = "Trace a CPU copy of a model on the XLA device (TensorBoard graphs, ONNX export); report jit traces."
    RULES = (HOST_TRACE,)
    TRIGGERS = (b"add_graph", b"onnx", b"jit")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        names = self.qualnames(original_node.func)
        if names & _TRACES:
            if self._on_device(original_node):
                self.flag(original_node, HOST_TRACE.code, "`torch.jit.trace` of a model on the XLA device raises "
                          "(pytorch/xla#7606): trace a CPU copy (`copy.deepcopy(model).cpu()`, inputs `.cpu()`) "
                          "where the traced module runs on the CPU", fix=False)
            return updated_node
        kind = "torch.onnx.export" if names & _EXPORTS else "add_graph" if _is_add_graph(original_node) else None
        if kind is None or not self._on_device(original_node):
            return updated_node
        args = list(updated_node.args)
        at = _input_index(args, _INPUT_KEYWORDS[kind])
        moved = self._to_cpu(args[at].value) if at is not None else None
        what = "`writer.add_graph`" if kind == "add_graph" else "`torch.onnx.export`"
        if moved is None:
            self.flag(original_node, HOST_TRACE.code, f"{what} traces the model, which raises on the XLA device "
                      "(pytorch/xla#7606): hand it a CPU copy (`copy.deepcopy(model).cpu()`) and its inputs on the "
                      "CPU", fix=False)
            return updated_node
        if not self.flag(original_node, HOST_TRACE.code, f"{what} traces the model, which raises on the XLA device "
                         "(pytorch/xla#7606): it traces a CPU copy, its inputs on the CPU", fix=True):
            return updated_node
        imports.need(self.context, "copy")
        copy_call = cst.Call(func=cst.Attribute(value=cst.Call(func=cst.parse_expression("copy.deepcopy"),
                                                               args=[cst.Arg(args[0].value)]),
                                                attr=cst.Name("cpu")))
        args[0] = args[0].with_changes(value=copy_call)
        args[at] = args[at].with_changes(value=moved)  # type: ignore[index]
        return updated_node.with_changes(args=args)

    def _on_device(self, call: cst.Call) -> bool:
        """The traced model is one the program may put on the device (a module
        the dataflow knows, or a name), and its input is not placed on the host."""
        if len(call.args) < 2 or call.args[0].keyword is not None:
            return False
        model = call.args[0].value
        kinds = values_of(self.tree).of(model)
        if kinds and not kinds & {MODULE, UNKNOWN}:
            return False
        first = call.args[1].value
        inputs = first.elements if isinstance(first, cst.Tuple) else [first]  # type: ignore[attr-defined]
        return not all(placement(self.tree, e.value if isinstance(e, cst.Element) else e) == HOST for e in inputs)

    def _to_cpu(self, value: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """``value`` moved to the CPU: a tensor expression ``.cpu()``-ed, or each
        element of a tuple written out; None for anything else."""
        if isinstance(value, cst.Tuple):
            moved = [self._to_cpu(e.value) if not isinstance(e, cst.StarredElement) else None for e in value.elements]
            if any(m is None for m in moved):
                return None
            return value.with_changes(elements=[e.with_changes(value=m) for e, m in zip(value.elements, moved)])
        kinds = values_of(self.tree).of(value)
        if kinds == {TENSOR} or is_tensor_expr(value, set(), self.qualnames, values_of(self.tree)):
            return cst.Call(func=cst.Attribute(value=value, attr=cst.Name("cpu")))
        return None


def _is_add_graph(call: cst.Call) -> bool:
    return call_name(call) == "add_graph" and isinstance(call.func, cst.Attribute)


def _input_index(args: List[cst.Arg], keyword: str) -> Optional[int]:
    for i, arg in enumerate(args):
        if (i == 1 and arg.keyword is None) or (arg.keyword is not None and arg.keyword.value == keyword):
            return i
    return None


__all__ = ["HostTraces", "HOST_TRACE"]
