"""Converted fixtures run on XLA's CPU backend and behave (needs the verify extra)."""

from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.xla,
]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _verify(name, *args):
    from xlaport.verify.verification import verify

    report = verify(FIXTURES / name / "input.py", args=args, timeout=300, root=FIXTURES / name)
    assert report.error is None, report.error
    assert report.verdict == "pass", [o for o in report.outputs if not o.ok]
    assert all(o.max_rel_err <= 1e-3 or o.max_abs_err <= 1e-5 for o in report.outputs)
    assert report.metrics["compiles_after_warmup"] == 0
    assert not [e for e in report.events if e["kind"] in ("recompile", "fallback")]
    return report


def test_training_compiles_do_not_grow_with_epochs():
    one = _verify("train_mlp", "--epochs", "1")
    three = _verify("train_mlp", "--epochs", "3")
    assert one.metrics["compiles"] == three.metrics["compiles"]
    # 8 train batches per epoch + 4 eval batches: about one execution per step
    steps = 8 * 3 + 4
    assert three.metrics["executions"] <= steps + 3
    assert three.metrics["fallbacks"] == {}


def test_sampling_one_graph_per_step_and_flat_transfers():
    eight = _verify("sample_loop", "--steps", "8")
    sixteen = _verify("sample_loop", "--steps", "16")
    assert eight.metrics["compiles"] == sixteen.metrics["compiles"]
    assert sixteen.metrics["executions"] - eight.metrics["executions"] == 8  # one per extra step
    assert eight.metrics["host_reads"] == sixteen.metrics["host_reads"]


def test_verify_reports_crash_as_error(tmp_path):
    from xlaport.verify.verification import verify

    bad = tmp_path / "crash.py"
    bad.write_text("import torch\nx = torch.ones(2).cuda()\nraise RuntimeError('boom')\n")
    report = verify(bad, timeout=120)
    assert report.verdict == "error" and "boom" in report.error


def test_verify_kills_a_hanging_script(tmp_path):
    from xlaport.verify.verification import verify

    hang = tmp_path / "hang.py"
    hang.write_text("import time\n\ndevice = 'cuda'\nwhile True:\n    time.sleep(1)\n")
    report = verify(hang, timeout=5)
    assert report.verdict == "error" and "timeout" in report.error
