"""XLA119 (codemods/tensor_types.py): a legacy tensor type chosen by an
``if``/``else`` statement (``if cuda: dtype = torch.cuda.FloatTensor`` /
``else: dtype = torch.FloatTensor``, Zeleni9/pytorch-wgan's inception score)
is one alias, converted as the ``IfExp`` form is: each use takes the dtype
and a device that follows the test."""

import os
import subprocess
import sys

import libcst as cst
import pytest

from tests.conftest import convert_text
from tests.test_runnable_ports import needs_xla

CHOSEN = """\
import torch
from torch import nn


def score(batches, cuda=True):
    if cuda:
        dtype = torch.cuda.FloatTensor
    else:
        dtype = torch.FloatTensor
    torch.manual_seed(0)
    model = nn.Linear(4, 2).type(dtype)
    total = 0.0
    for batch in batches:
        batch = batch.type(dtype)
        total += float(model(batch).sum())
    return total
"""


def _types(src: str):
    out, findings = convert_text(src)
    return out, [(f.code, f.line) for f in findings if f.code in ("XLA119", "XLA199")]


def test_an_alias_chosen_by_an_if_statement_follows_its_test():
    out, found = _types(CHOSEN)
    assert ("XLA119", 7) in found and ("XLA119", 9) in found and ("XLA199", 7) not in found, found
    assert "dtype = " not in out and "if cuda:" not in out, out  # the `if` only chose the alias: it went
    device = 'device=torch_xla.device() if cuda else "cpu", dtype=torch.float32'
    assert out.count(device) == 2, out
    cst.parse_module(out)
    assert _types(out) == (out, [])


def test_the_choice_either_way_round_keeps_the_cpu_where_the_test_says():
    src = CHOSEN.replace("    if cuda:\n        dtype = torch.cuda.FloatTensor\n    else:\n        dtype = torch.FloatTensor\n",
                         "    if not cuda:\n        dtype = torch.FloatTensor\n    else:\n        dtype = torch.cuda.FloatTensor\n")
    out, _ = _types(src)
    assert 'device="cpu" if not cuda else torch_xla.device(), dtype=torch.float32' in out, out


def test_a_branch_that_does_more_keeps_the_rest():
    src = CHOSEN.replace("    else:\n        dtype = torch.FloatTensor\n",
                         "    else:\n        print('on the CPU')\n        dtype = torch.FloatTensor\n")
    out, found = _types(src)
    assert ("XLA199", 7) not in found
    assert "    if cuda:\n        pass\n    else:\n        print('on the CPU')\n" in out, out


@pytest.mark.parametrize("change", [
    ("    total = 0.0\n", "    total = 0.0\n    assert isinstance(torch.zeros(1), dtype)\n"),  # a use it cannot convert
    ("dtype = torch.FloatTensor\n", "dtype = torch.LongTensor\n"),  # another dtype: no choice of device only
    ("    if cuda:\n", "    if pick():\n"),  # a test that may not give the same answer at each use
    ("    else:\n", "    elif other:\n"),  # no else: the name may be unbound
])
def test_a_choice_it_cannot_read_whole_is_left(change):
    out, found = _types(CHOSEN.replace(*change))
    assert ("XLA199", 7) in found and "dtype = torch.cuda.FloatTensor" in out, (found, out)


def _score(path, cuda: bool, env=None):
    code = (f"import sys, torch; sys.path.insert(0, {str(path.parent)!r}); from {path.stem} import score; "
            f"print(repr(score([torch.arange(8.0).reshape(2, 4) / 8, torch.ones(3, 4)], cuda={cuda})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})})
    assert done.returncode == 0, done.stderr
    return float(done.stdout.strip().splitlines()[-1])


def test_the_cpu_choice_computes_what_the_original_did(tmp_path):
    (tmp_path / "original.py").write_text(CHOSEN)
    (tmp_path / "converted.py").write_text(convert_text(CHOSEN)[0])
    assert _score(tmp_path / "converted.py", False) == _score(tmp_path / "original.py", False)


@pytest.mark.xla
@needs_xla
def test_the_device_choice_runs_on_xla_with_the_cpu_originals_numbers(tmp_path):
    (tmp_path / "original.py").write_text(CHOSEN)
    (tmp_path / "converted.py").write_text(convert_text(CHOSEN)[0])
    on_xla = _score(tmp_path / "converted.py", True, {"PJRT_DEVICE": "CPU"})
    assert on_xla == pytest.approx(_score(tmp_path / "original.py", False), rel=1e-6)


DEFAULT_SET = """\
import torch

from helpers import far


def main():
    torch.set_default_tensor_type("torch.cuda.FloatTensor")
    print((far() + torch.zeros(1)).device, torch.Tensor([1.0]).device)


if __name__ == "__main__":
    main()
"""
HELPERS = "import torch\n\n\ndef far():\n    return torch.Tensor([1e10])\n"


def _project(tmp_path, main=DEFAULT_SET, helpers=HELPERS):
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.py").write_text(main)
    (src / "helpers.py").write_text(helpers)
    from xlaport.cli import main as cli

    from click.testing import CliRunner

    done = CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    return tmp_path / "out", done.output


def test_a_default_tensor_types_constructors_follow_the_default_device_in_every_module(tmp_path):
    """XLA120: ``torch.Tensor(...)`` in the module that sets the default
    type and in a module it imports (nerf-pytorch's helpers)."""
    out, report = _project(tmp_path)
    assert "torch.set_default_device(torch_xla.device())" in (out / "main.py").read_text()
    assert "torch.Tensor([1.0]).to(torch.get_default_device())" in (out / "main.py").read_text()
    assert "return torch.Tensor([1e10]).to(torch.get_default_device())" in (out / "helpers.py").read_text(), report
    for name in ("main.py", "helpers.py"):
        text = (out / name).read_text()
        assert text.count("get_default_device") == convert_text(text)[0].count("get_default_device")  # once


def test_a_program_that_sets_no_default_type_keeps_its_constructors(tmp_path):
    out, _ = _project(tmp_path, main=DEFAULT_SET.replace('    torch.set_default_tensor_type("torch.cuda.FloatTensor")\n',
                                                          "    torch.zeros(1).cuda()\n"))
    assert "get_default_device" not in (out / "main.py").read_text() + (out / "helpers.py").read_text()


@pytest.mark.xla
@needs_xla
def test_the_constructors_tensors_meet_the_factories_on_xla(tmp_path):
    """Before XLA120 the conversion failed at the first op mixing them
    (``Expected all tensors ... to be XLA tensors``), as nerf-pytorch's did."""
    out, _ = _project(tmp_path)
    done = subprocess.run([sys.executable, "main.py"], cwd=out, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["xla:0", "xla:0"]
