"""Real programs come out runnable (issue 24): each class of device, guard
and runtime spelling, as a fixture, converted and run on XLA's CPU backend
with plain `python`, as its user runs it (issue 38: no harness of verify's
around it) -- it must exit 0 having run work on XLA."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from click.testing import CliRunner

from xlaport.cli import main
from xlaport.engine import Settings, transform

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

try:
    import torch_xla  # noqa: F401

    HAVE_XLA = True
except ImportError:  # pragma: no cover
    HAVE_XLA = False

needs_xla = pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")


OBSERVER = Path(__file__).resolve().parent / "observe"  # a sitecustomize that only reads torch_xla's metrics


def run_on_xla(name: str, tmp_path: Path, *args: str, settings: Optional[Settings] = None):
    """The fixture's conversion run as its user runs it -- plain `python`, from
    its own directory, on XLA's CPU backend, nothing of ours imported into it
    (tests/observe/sitecustomize.py reads the compile and execution counts at
    exit, only where the program imported torch_xla itself); it must exit 0
    having run work on XLA.  (result with "metrics", stdout, stderr, the run's
    directory)."""
    work = tmp_path / name
    work.mkdir(parents=True, exist_ok=True)
    script = work / "main.py"
    # (the module's Settings, looked up now: tests replace it to turn a rule off)
    chosen = settings if settings is not None else Settings()
    script.write_bytes(transform((FIXTURES / name / "input.py").read_bytes(), chosen).code)
    metrics = work.parent / f"{name}-metrics.json"
    env = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(OBSERVER), "XLAPORT_TEST_METRICS": str(metrics)}
    done = subprocess.run([sys.executable, "main.py", *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert metrics.exists(), "the program did not import torch_xla"
    result = {"ok": True, "metrics": json.loads(metrics.read_text())}
    assert result["metrics"]["executions"] > 0, "no work ran on XLA"
    return result, done.stdout, done.stderr, work


@pytest.mark.xla
@needs_xla
@pytest.mark.parametrize("name", ["int_devices", "device_kinds", "cuda_guards", "runtime_zoo", "param_defaults"])
def test_converted_fixture_runs_on_xla(name, tmp_path):
    result, stdout, _, _ = run_on_xla(name, tmp_path)
    if name in ("int_devices", "device_kinds"):
        assert "xla" in stdout  # the tensors are on the XLA device, not on the CPU
    if name == "int_devices":
        assert "head on xla" in stdout  # `head.to(gpu_ids[0])`: an element of a list of ordinals
    if name == "cuda_guards":
        assert "flash=False" in stdout  # the CUDA-only side (device capability) went


@pytest.mark.xla
@needs_xla
def test_converted_program_logs_exactly_as_the_original(tmp_path):
    original = tmp_path / "original"
    original.mkdir()
    shutil.copy(FIXTURES / "logging_config" / "input.py", original / "main.py")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    ref = subprocess.run([sys.executable, "main.py"], cwd=original, env=env, capture_output=True, text=True,
                         timeout=300)
    assert ref.returncode == 0, ref.stderr
    _, _, stderr, work = run_on_xla("logging_config", tmp_path)
    expected = (original / "train.log").read_text()
    assert expected == "INFO trainer: training for 3 steps\nINFO trainer: done\n"
    assert (work / "train.log").read_text() == expected
    lines = [line for line in stderr.splitlines() if line.startswith("INFO trainer")]
    assert lines == expected.splitlines()


@pytest.mark.xla
@needs_xla
def test_the_seed_still_decides_the_numbers_drawn_on_the_device(tmp_path):
    _, one, _, _ = run_on_xla("seeded_noise", tmp_path / "a", "--seed", "1")
    _, again, _, _ = run_on_xla("seeded_noise", tmp_path / "b", "--seed", "1")
    _, two, _, _ = run_on_xla("seeded_noise", tmp_path / "c", "--seed", "2")
    assert one.strip() == again.strip()
    assert one.strip() != two.strip()


def test_a_program_with_nothing_to_port_stays_byte_identical(tmp_path):
    src = tmp_path / "cpu_only"
    shutil.copytree(FIXTURES / "cpu_only", src)
    before = (src / "train.py").read_bytes()
    result = CliRunner().invoke(main, ["convert", "--no-cache", str(src)])
    assert result.exit_code == 0, result.output
    assert (src / "train.py").read_bytes() == before
    assert result.output.count("nothing to port") == 1
    lint = CliRunner().invoke(main, ["lint", "--no-cache", "--format", "json", str(src)])
    assert lint.exit_code == 0 and json.loads(lint.stdout)["findings"] == []
    opted = CliRunner().invoke(main, ["convert", "--no-cache", "--port-cpu", "--diff", str(src)])
    assert opted.exit_code == 1 and "torch_xla" in opted.stdout  # moving it to XLA is a choice of its own


def test_a_module_without_cuda_in_a_cuda_program_is_still_ported(tmp_path):
    (tmp_path / "loop.py").write_text("def train(model, data, opt):\n    for x in data:\n"
                                      "        model(x).sum().backward()\n        opt.step()\n")
    (tmp_path / "main.py").write_text("import torch\nfrom loop import train\n"
                                      "model = torch.nn.Linear(2, 2).cuda()\n")
    result = CliRunner().invoke(main, ["convert", "--no-cache", "--diff", str(tmp_path)])
    assert "nothing to port" not in result.output
    assert "+        torch_xla.sync()" in result.stdout


@pytest.mark.xla
@needs_xla
def test_an_xla_device_string_keeps_the_import_it_needs_through_the_style_fixes(tmp_path):
    """`device = "cuda"` -> `"xla"` needs `import torch_xla` (it registers the
    device), which no code reads: `convert` applied Ruff's fix for the
    unused import (the input passed Ruff) and the program crashed at its
    first tensor ("Could not run 'aten::empty.memory_format' ... 'XLA'")."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.py").write_text('import torch\n\ndevice = "cuda"\nx = torch.zeros(2, device=device)\nprint(x)\n')
    result = CliRunner().invoke(main, ["convert", "--no-cache", str(src), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    out = (tmp_path / "out" / "main.py").read_text()
    assert "import torch_xla  # noqa: F401\n" in out, out
    done = subprocess.run([sys.executable, "main.py"], cwd=tmp_path / "out", env={**os.environ, "PJRT_DEVICE": "CPU"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "device='xla:0'" in done.stdout, done.stderr[-2000:]
    # the "xla" process-group backend is registered by an import no code reads either; where another import
    # of the package's modules is marked, `import torch_xla` needs no mark of its own (Ruff: RUF100 otherwise)
    (src / "main.py").write_text('import torch.distributed as dist\n\ndist.init_process_group("nccl")\n'
                                 'device = "cuda"\n')
    CliRunner().invoke(main, ["convert", "--no-cache", str(src / "main.py"), "-o", str(tmp_path / "dist")])
    out = (tmp_path / "dist" / "main.py").read_text()
    assert "import torch_xla\nimport torch_xla.distributed.xla_backend  # noqa: F401\n" in out, out
    from xlaport.style import ruff_binary

    checked = subprocess.run([ruff_binary(), "check", "--isolated", "--extend-select", "RUF100", str(tmp_path / "dist")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


@pytest.mark.xla
@needs_xla
def test_the_slice_xla160_clamps_is_out_of_range_on_xla_and_the_clamped_one_runs(tmp_path):
    """XLA160's claim, on torch_xla itself: the last `block_size` of a
    sequence still shorter raises on XLA (eager clamps); the clamped bound
    convert writes runs and prints what the original prints on the CPU."""
    program = ("import torch\n\nblock_size = 8\nidx = torch.zeros((1, 1), dtype=torch.long).cuda()\n"
               "for _ in range(4):\n    ctx = idx[:, -block_size:]\n    idx = torch.cat((idx, ctx[:, -1:] + 1), dim=1)\n"
               "print(idx.tolist())\n")
    outcome = transform(program.encode(), Settings())
    converted, findings = outcome.code.decode(), outcome.findings
    assert [(f.code, f.line, f.fix) for f in findings if f.code == "XLA160"] == [("XLA160", 6, True)]
    assert "    ctx = idx[:, -min(block_size, idx.size(1)):]\n" in converted, converted
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    (tmp_path / "unclamped.py").write_text(converted.replace("-min(block_size, idx.size(1)):", "-block_size:"))
    (tmp_path / "clamped.py").write_text(converted)
    (tmp_path / "original.py").write_text(program.replace(".cuda()", ""))  # (eager, on the CPU)
    runs = {name: subprocess.run([sys.executable, f"{name}.py"], cwd=tmp_path, capture_output=True, text=True,
                                 timeout=300, env={**env, "CUDA_VISIBLE_DEVICES": ""})
            for name in ("unclamped", "clamped", "original")}
    assert runs["unclamped"].returncode != 0 and "Value out of range" in runs["unclamped"].stderr, \
        runs["unclamped"].stderr[-2000:]
    assert runs["clamped"].returncode == 0 and runs["clamped"].stdout.strip() == "[[0, 1, 2, 3, 4]]", \
        runs["clamped"].stderr[-2000:]
    assert runs["original"].stdout == runs["clamped"].stdout, runs["original"].stderr[-2000:]


@pytest.mark.xla
@needs_xla
def test_an_optimizer_made_before_the_move_still_trains_the_model_on_xla(tmp_path):
    """`.to(<XLA device>)` gives a module new Parameters (on CUDA they are
    converted in place): an optimizer made over the old ones stepped CPU
    tensors and the model on XLA never changed (pytorch/examples'
    mnist_forward_forward).  XLA133 turns on the swapping conversion."""
    program = ("import torch\n\ntorch.manual_seed(0)\n\n\nclass Layer(torch.nn.Linear):\n"
               "    def __init__(self):\n        super().__init__(3, 2)\n"
               "        self.opt = torch.optim.SGD(self.parameters(), lr=0.05)\n\n\n"
               "device = 'cuda' if torch.cuda.is_available() else 'cpu'\nlayer = Layer().to(device)\n"
               "x = torch.ones(4, 3, device=device)\nfor _ in range(3):\n    loss = layer(x).pow(2).mean()\n"
               "    layer.opt.zero_grad()\n    loss.backward()\n    layer.opt.step()\n"
               "    print(f'{loss.item():.6f}')\n")
    outcome = transform(program.encode(), Settings())
    assert "XLA133" in {f.code for f in outcome.findings}
    (tmp_path / "orig.py").write_text(program)
    (tmp_path / "conv.py").write_bytes(outcome.code)
    runs = {name: subprocess.run([sys.executable, f"{name}.py"], cwd=tmp_path, capture_output=True, text=True,
                                 timeout=300, env={**os.environ, "PJRT_DEVICE": "CPU", "CUDA_VISIBLE_DEVICES": ""})
            for name in ("orig", "conv")}
    assert all(r.returncode == 0 for r in runs.values()), runs["conv"].stderr[-2000:]
    losses = [[float(v) for v in runs[n].stdout.split()] for n in ("orig", "conv")]
    assert len(set(losses[0])) == 3  # it trains
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
