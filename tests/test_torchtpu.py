"""`--target torchtpu` (issue 41): CUDA -> TorchTPU (device-generic
torch.accelerator calls, codemods/target.py) and torch_xla -> TorchTPU
(codemods/from_xla.py).  The golden fixtures fixtures/torchtpu_from_cuda and
fixtures/torchtpu_from_xla run in tests/test_fixtures.py; here: the API table
against the wheel, the names the target emits against that table and torch,
the conversions run on this CPU host against the originals, and the CLI."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from codemods import torchtpu_api_data as api
from codemods.from_xla import _ACCELERATOR, _WAIT
from codemods.target import TARGETS, TORCHTPU
from tests.conftest import convert_text
from xlaport.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
WHEELS = sorted((ROOT / ".cache" / "wheels").glob("torch_tpu-0.2.0-*.whl")) + (
    [Path(os.environ["XLAPORT_TORCHTPU_WHEEL"])] if os.environ.get("XLAPORT_TORCHTPU_WHEEL") else [])


def test_the_table_is_the_wheels():
    """codemods/torchtpu_api_data.py is what benchmarks/gen_torchtpu_api.py
    reads from torch-tpu 0.2.0 (re-derived when the wheel is here)."""
    if not WHEELS:
        pytest.skip("no torch-tpu 0.2.0 wheel here: `pip download torch-tpu==0.2.0 --no-deps -d .cache/wheels` "
                    "(or XLAPORT_TORCHTPU_WHEEL=...) re-derives the table from it")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_torchtpu_api.py"), str(WHEELS[-1]),
                           "--check"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_table_says_what_the_reference_says():
    """torch.tpu's device calls that are internal with torch >= 2.11, and the
    calls the wheel names instead (shared/reference/torch_xla.md)."""
    assert api.VERSION == "0.2.0"
    for name in ("is_available", "synchronize", "device_count", "current_device", "set_device"):
        assert api.STAGES[name][0] == "internal" and api.STAGES[name][1].startswith("torch.accelerator."), name
    assert api.STAGES["manual_seed"][0] == "experimental"
    assert {"set_tpu_launch_env"} <= api.PUBLIC["torch.tpu.distributed"]


def _emitted() -> set:
    """Every torch.tpu / torch.accelerator name the target can write."""
    codes = [TORCHTPU.device, TORCHTPU.autocast_device, _ACCELERATOR, _WAIT]
    codes += [move.code for move in TORCHTPU.cuda_api.values() if move.kind in ("call", "expr")]
    names = set()
    for code in codes:
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Attribute):
                dotted = ast.unparse(node)
                if dotted.startswith(("torch.tpu.", "torch.accelerator.")):
                    names.add(dotted)
    return names


@pytest.mark.torch
def test_every_name_the_target_writes_exists_and_is_the_one_the_wheel_prefers():
    import torch

    emitted = _emitted()
    assert "torch.accelerator.current_accelerator" in emitted and "torch.accelerator.synchronize" in emitted
    preferred = {prefer for _, prefer in api.STAGES.values() if prefer}
    for name in emitted:
        module, _, attr = name.rpartition(".")
        if module == "torch.tpu":
            assert attr in api.PUBLIC["torch.tpu"] and api.STAGES.get(attr, ("",))[0] != "internal", name
        else:  # torch's own device-generic API, with the torch this host has (2.9)
            assert hasattr(torch.accelerator, attr), name
    # where the wheel names the call to make instead of a torch.tpu one, that is the call written
    for cuda_name in ("is_available", "synchronize", "device_count", "current_device", "set_device"):
        assert TORCHTPU.cuda_api[f"torch.cuda.{cuda_name}"].code in preferred


def test_cuda_calls_become_device_generic_and_cuda_only_code_is_kept_where_it_converts():
    src = ("import torch\n\nif torch.cuda.is_available():\n    torch.cuda.synchronize()\n"
           "    print(torch.cuda.max_memory_allocated())\nelse:\n    print('cpu')\n"
           "with torch.autocast('cuda', dtype=torch.bfloat16):\n    y = model(x.cuda())\n"
           "name = torch.cuda.get_device_name(0)\n")
    out, findings = convert_text(src, target="torchtpu")
    assert "if torch.accelerator.is_available():\n    torch.accelerator.synchronize()\n" in out
    assert "torch.accelerator.max_memory_allocated()" in out and "print('cpu')" in out
    assert ('torch.autocast(torch.device(torch.accelerator.current_accelerator(check_available=True) or "cpu")'
            '.type, dtype=torch.bfloat16)') in out
    assert "torch_xla" not in out and "torch.tpu" not in out
    assert [f.code for f in findings if not f.fix] == ["XLA115"]  # the device name: no generic counterpart
    # the same program for torch_xla keeps its default: XLA
    assert "torch_xla" in convert_text(src)[0]


def test_a_torch_xla_loader_not_iterated_by_names_and_a_launch_are_reported():
    src = ("import torch_xla\nimport torch_xla.core.xla_model as xm\n"
           "import torch_xla.distributed.parallel_loader as pl\n\n"
           "def train(index):\n    device_loader = pl.MpDeviceLoader(loader, torch_xla.device())\n"
           "    for batch in device_loader:\n        step(batch)\n        xm.optimizer_step(opt)\n\n"
           "torch_xla.launch(train)\n")
    out, findings = convert_text(src, target="torchtpu")
    reported = sorted((f.code, f.line) for f in findings if not f.fix)
    assert reported == [("XLA503", 6), ("XLA504", 9), ("XLA509", 11)], findings
    assert "pl.MpDeviceLoader" in out and "xm.optimizer_step(opt)" in out  # left as they are, with their imports


def _numbers(text: str):
    return [float(n) for n in re.findall(r"-?\d+\.\d+|\d+", text)]


@pytest.mark.xla
@pytest.mark.parametrize("name, env", [("torchtpu_from_cuda", {"CUDA_VISIBLE_DEVICES": ""}),
                                       ("torchtpu_from_xla", {"PJRT_DEVICE": "CPU"})])
@pytest.mark.torch
def test_the_conversion_runs_here_with_the_originals_numbers(tmp_path, name, env):
    """On this host (no TPU) the conversion takes the CPU path; the original
    ran on the CPU (CUDA's fixture) or on XLA's CPU backend (torch_xla's)."""
    runs = {}
    for side, text in (("original", (FIXTURES / name / "input.py").read_text()),
                       ("converted", (FIXTURES / name / "expected.py").read_text())):
        work = tmp_path / side
        work.mkdir()
        (work / "main.py").write_text(text)
        clean = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}
        done = subprocess.run([sys.executable, "main.py"], cwd=work, capture_output=True, text=True, timeout=300,
                              env={**clean, **(env if side == "original" else {"CUDA_VISIBLE_DEVICES": ""})})
        assert done.returncode == 0, done.stderr[-2000:]
        runs[side] = done.stdout
    assert _numbers(runs["converted"]) == pytest.approx(_numbers(runs["original"]), rel=1e-4)
    assert "mean loss" in runs["converted"]


def test_the_target_is_chosen_on_the_command_line_or_in_pyproject(tmp_path):
    assert "torchtpu" in TARGETS
    (tmp_path / "train.py").write_text("import torch\n\nmodel = model.cuda()\ntorch.cuda.synchronize()\n")
    runner = CliRunner()
    done = runner.invoke(main, ["convert", "--target", "torchtpu", "--diff", str(tmp_path / "train.py")])
    assert "+torch.accelerator.synchronize()" in done.output, done.output
    (tmp_path / "pyproject.toml").write_text('[tool.xlaport]\ntarget = "torchtpu"\n')
    done = runner.invoke(main, ["lint", "--format", "concise", str(tmp_path / "train.py")])
    assert "XLA111 [*] `cuda.synchronize()` -> `torch.accelerator.synchronize`" in done.output, done.output
    assert "torch_xla" not in done.output


@pytest.mark.torch
@pytest.mark.xla
def test_verify_runs_the_torchtpu_port_and_says_no_tpu_ran(tmp_path):
    """On a host without a TPU the port's CPU path runs, its values are
    compared with the original's, and the report says no TPU ran."""
    import json

    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "train.py").write_text((FIXTURES / "torchtpu_from_cuda" / "input.py").read_text())
    report = tmp_path / "r.json"
    done = CliRunner().invoke(main, ["verify", str(prog / "train.py"), "--target", "torchtpu",
                                     "--json", str(report)])
    data = json.loads(report.read_text())
    assert done.exit_code == 0, (done.output, data["failures"])
    assert data["config"]["target"] == "torchtpu"
    assert data["config"]["device_ran"].startswith("no TPU ran")
    assert any(o["name"].endswith("mean loss 5.98660") and o["ok"] for o in data["outputs"]), data["outputs"]
    assert "no TPU ran" in done.output and "XLA (cpu reference)" not in done.output


def test_a_cuda_device_keeps_its_index_on_torchtpu():
    """One process per device on TorchTPU, as on CUDA: `cuda:N` is `tpu:N`
    (torch_xla has one device per process: "xla")."""
    src = ("import torch\n\ndef setup(rank):\n    device = f'cuda:{rank}'\n    torch.cuda.set_device(device)\n"
           "    spare = 'cuda:1'\n    kind = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
           "    return torch.zeros(2, device=device), kind\n")
    out, _ = convert_text(src, target="torchtpu")
    assert "device = f'tpu:{rank}'\n    torch.accelerator.set_device_index(device)\n" in out
    assert "spare = 'cuda:1'" in out  # not a device anywhere: left
    assert 'kind = torch.device(torch.accelerator.current_accelerator(check_available=True) or "cpu")' in out
    xla = convert_text(src)[0]
    assert 'device = "xla"' in xla and "tpu" not in xla


def test_a_cuda_device_object_default_stays_on_torchtpu():
    """`torch.device("tpu")` raises where TorchTPU's backend is not loaded, and
    a default is made at import: it stays, reported (on torch_xla it becomes
    `torch.device("xla")`, a device type torch knows)."""
    src = "import torch\n\n\ndef run(x, device=torch.device(\"cuda\"), dev=\"cuda:1\"):\n    return x.to(device), dev\n"
    out, findings = convert_text(src, target="torchtpu")
    assert 'device=torch.device("cuda")' in out and "dev=\"tpu:1\"" in out, out
    assert [(f.code, f.fix) for f in findings if f.code == "XLA106"] == [("XLA106", False)], findings
    xla = convert_text(src)[0]
    assert 'device=torch.device("xla")' in xla and 'dev="xla"' in xla, xla
