"""XLA162 (codemods/traces.py): a model traced on the XLA device -- by
TensorBoard's `add_graph`, by `torch.onnx.export` -- is traced from a CPU
copy; `torch.jit.trace` itself is reported."""

import os
import subprocess
import sys

import pytest

from tests.conftest import convert_text
from tests.test_runnable_ports import needs_xla

PROGRAM = '''\
import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
x = torch.Tensor(1, 3, 8, 8)
if args.gpu:
    model = model.cuda()
    x = x.cuda()
writer = SummaryWriter(log_dir)
writer.add_graph(model, x)
dummy = torch.zeros(2, 3, 8, 8).cuda()
hidden = model.init_hidden(1)
torch.onnx.export(model, (dummy,), "m.onnx")
torch.onnx.export(model, (dummy, hidden), "m.onnx")
traced = torch.jit.trace(model, dummy)
'''


def test_a_graph_and_an_export_are_traced_from_a_cpu_copy():
    out, findings = convert_text(PROGRAM)
    assert "writer.add_graph(copy.deepcopy(model).cpu(), x.cpu())" in out
    assert 'torch.onnx.export(copy.deepcopy(model).cpu(), (dummy.cpu(),), "m.onnx")' in out
    assert "import copy" in out
    fixed = {f.line: f.fix for f in findings if f.code == "XLA162"}
    # the export of a hidden state that may be a tuple, and the jit trace, are reported
    assert fixed == {11: True, 14: True, 15: False, 16: False}, fixed
    assert convert_text(out)[0] == out  # idempotent


def test_a_model_traced_with_inputs_on_the_host_is_left():
    source = "import torch\n\nmodel = Net()\nwriter.add_graph(model, torch.zeros(1, 3))\n"
    out, findings = convert_text(source)
    assert out == source and not [f for f in findings if f.code == "XLA162"]


TRACE = '''\
import copy

import torch
import torch_xla
from torch import nn

model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).to(torch_xla.device())
x = torch.randn(1, 3, 8, 8, device=torch_xla.device())
try:
    torch.jit.trace(model, x)
    print("traced on XLA")
except RuntimeError:
    print("raised on XLA")
graph = torch.jit.trace(copy.deepcopy(model).cpu(), x.cpu())
print(type(graph).__name__, next(model.parameters()).device.type)
'''


@pytest.mark.xla
@needs_xla
def test_tracing_raises_on_xla_and_the_cpu_copy_traces(tmp_path):
    """What `add_graph` and `onnx.export` run underneath (`torch.jit.trace`):
    on the XLA device it raises (pytorch/xla#7606), on the CPU copy it traces,
    and the model stays on the XLA device."""
    script = tmp_path / "trace.py"
    script.write_text(TRACE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "raised on XLA\nTopLevelTracedModule xla\n"


@pytest.mark.xla
@needs_xla
def test_the_converted_graph_is_written_on_xla(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard is not a dependency of xlaport")
    source = PROGRAM.split("dummy =")[0].replace("args.gpu", "True").replace("log_dir", repr(str(tmp_path / "runs")))
    script = tmp_path / "main.py"
    script.write_text(convert_text(source)[0] + "writer.close()\nprint('written')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.endswith("written\n") and list((tmp_path / "runs").iterdir())
