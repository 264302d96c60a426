"""XLA159 (codemods/xla_limits.py): an op torch_xla has no lowering for, a
utility whose module calls one, or a function that is one by another name,
reported where it is called in code being ported -- and the op table
(codemods/xla_ops_data.py) those read, generated from the installed
torch_xla by benchmarks/gen_xla_ops.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import convert_text

ROOT = Path(__file__).resolve().parent.parent

try:
    import torch_xla  # noqa: F401

    HAVE_XLA = True
except ImportError:  # pragma: no cover
    HAVE_XLA = False


def test_an_op_without_an_xla_lowering_is_reported_only_in_code_being_ported():
    ported = ("import torch\n\nx = torch.randn(4, 4).cuda()\nh = torch.histc(x, bins=2)\ne = torch.linalg.eig(x)\n"
              "same = torch.equal(ids, truncated_ids)\n")  # (a tokenizer's tensors: not on the device)
    found = [(f.line, f.code) for f in convert_text(ported)[1] if f.code == "XLA159"]
    assert found == [(4, "XLA159"), (5, "XLA159")]
    plain = "import torch\n\nx = torch.randn(4)\nh = torch.histc(x, bins=2)\n"
    assert "XLA159" not in [f.code for f in convert_text(plain)[1]]


def test_a_utility_whose_module_falls_back_is_said_where_it_wraps_one():
    """TCN: `weight_norm(nn.Conv1d(...))` runs `_weight_norm_interface` on the CPU at every step (measured)."""
    src = ("import torch\nfrom torch.nn.utils import weight_norm\n\nconv = weight_norm(torch.nn.Conv1d(4, 4, 3)).cuda()\n"
           "ok = torch.nn.utils.spectral_norm(torch.nn.Linear(4, 4)).cuda()\n")
    found = [f for f in convert_text(src)[1] if f.code == "XLA159"]
    assert [f.line for f in found] == [4] and "`_weight_norm_interface`" in found[0].message, found
    assert "XLA159" not in [f.code for f in convert_text(src.replace(".cuda()", ""))[1]]  # not being ported


def test_a_function_that_is_an_op_of_another_name_is_said_by_its_own():
    """SRGAN's rotations: `F.grid_sample` is `aten::grid_sampler_2d`, which falls back (measured: 2 a step)."""
    src = ("import torch\nimport torch.nn.functional as F\n\nx = torch.randn(1, 3, 8, 8).cuda()\n"
           "y = F.grid_sample(x, torch.rand(1, 8, 8, 2).cuda() * 2 - 1)\nn = torch.bincount(x.long().flatten())\n")
    found = [f for f in convert_text(src)[1] if f.code == "XLA159"]
    assert [f.line for f in found] == [5, 6], found
    assert "`nn.functional.grid_sample` runs `grid_sampler_2d`" in found[0].message and "`bincount`" in found[1].message


def test_an_op_whose_only_composite_kernel_is_its_out_overload_falls_back():
    """torchgen gives every op an `out=` overload with a composite kernel that only calls the functional one:
    it lowered nothing, and hid these ops from the table."""
    from codemods.xla_ops_data import CPU_FALLBACK

    assert {"grid_sampler_2d", "bincount", "bucketize", "tril_indices", "unique_consecutive", "vdot"} <= CPU_FALLBACK


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_the_ops_the_out_overloads_hid_do_fall_back_on_xla(tmp_path):
    """Run on XLA's CPU backend, each moves its own fallback counter."""
    script = tmp_path / "ops.py"
    script.write_text(
        "import torch, torch_xla, torch_xla.debug.metrics as met\n"
        "d = torch_xla.device()\n"
        "calls = {'bincount': lambda: torch.bincount(torch.tensor([1, 2, 2], device=d)),\n"
        "         'tril_indices': lambda: torch.tril_indices(3, 3, device=d),\n"
        "         'unique_consecutive': lambda: torch.unique_consecutive(torch.tensor([1, 1, 2], device=d)),\n"
        "         'grid_sampler_2d': lambda: torch.nn.functional.grid_sample(torch.randn(1, 1, 4, 4, device=d),\n"
        "                                                             torch.zeros(1, 4, 4, 2, device=d))}\n"
        "for name, call in calls.items():\n"
        "    met.clear_counters()\n"
        "    call().cpu()\n"
        "    print(name, met.counter_value('aten::' + name) or 0)\n")
    done = subprocess.run([sys.executable, str(script)], env={**os.environ, "PJRT_DEVICE": "CPU"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = dict(line.split() for line in done.stdout.splitlines())
    assert counts == {"bincount": "1", "tril_indices": "1", "unique_consecutive": "1", "grid_sampler_2d": "1"}, counts


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_the_op_table_is_the_one_torch_xla_gives(tmp_path):
    """codemods/xla_ops_data.py is what benchmarks/gen_xla_ops.py reads from
    the installed torch_xla's kernel table (fails when edited by hand)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_xla_ops.py"), "--check"],
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
