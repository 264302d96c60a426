"""`xlaport verify` on programs that are bad on purpose: each must fail (or
error) with the right event on the right line of the original file."""

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytestmark = [
    pytest.mark.xla,
    pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla not installed"),
]

BAD = Path(__file__).resolve().parent.parent / "fixtures" / "bad"


def _verify(name, *options):
    from xlaport.cli import main

    out = Path(f"/tmp/xlaport-test-{name}.json")
    result = CliRunner().invoke(main, ["verify", str(BAD / name), "--json", str(out), "--timeout", "300", *options])
    return result, json.loads(out.read_text())


def _line_of(name, text):
    lines = (BAD / name).read_text().splitlines()
    return next(i for i, l in enumerate(lines, 1) if text in l)


def test_item_in_step_loop_fails_with_a_host_read_on_its_line():
    result, report = _verify("item_in_loop.py", "--max-host-reads-per-step", "0")
    assert result.exit_code == 1 and report["verdict"] == "fail"
    reads = [e for e in report["events"] if e["kind"] == "host_read"]
    line = _line_of("item_in_loop.py", "total += loss.item()")
    assert [e for e in reads if e["original_line"] == line and e["count"] == 6], reads
    # outputs still agree: the conversion is right, only slow
    assert all(o["ok"] for o in report["outputs"])


def test_item_in_step_loop_is_reported_not_failed_by_default():
    result, report = _verify("item_in_loop.py")
    assert result.exit_code == 0 and report["verdict"] == "pass"
    assert report["metrics"]["host_reads"] >= 6


def test_changing_shapes_fail_on_the_line_that_changes():
    result, report = _verify("changing_shapes.py", "--plot", "/tmp/xlaport-test-plot.png")
    assert result.exit_code == 1 and report["verdict"] == "fail"
    m = report["metrics"]
    assert m["compiles_after_warmup"] >= 3 and m["steps"] == 6
    assert m["steady_state_recompiles"] >= 3  # the same ops with other shapes: churn
    recompiles = [e for e in report["events"] if e["kind"] == "recompile"]
    assert recompiles and recompiles[0]["original_line"] == _line_of("changing_shapes.py", "data[: 4 + step]")
    png = Path("/tmp/xlaport-test-plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cpu_fallback_fails_on_the_op_line():
    result, report = _verify("cpu_fallback.py")
    assert result.exit_code == 1 and report["verdict"] == "fail"
    assert report["metrics"]["fallbacks"] == {"aten::nonzero": 4}
    # no barrier in this loop, so no steps to tell the hot loop apart: every fallback counts
    assert report["metrics"]["fallbacks_after_warmup"] == {"aten::nonzero": 4}
    fallbacks = [e for e in report["events"] if e["kind"] == "fallback"]
    assert [(e["original_line"], e["count"]) for e in fallbacks] == [(_line_of("cpu_fallback.py", "torch.nonzero(x > 0)"), 4)]


def test_json_report_has_the_documented_keys():
    _, report = _verify("item_in_loop.py")
    assert set(report) >= {"verdict", "outputs", "metrics", "events"}
    assert set(report["metrics"]) >= {"steps", "compiles", "compiles_after_warmup", "cached_compiles",
                                      "executions", "host_reads", "fallbacks"}
    for o in report["outputs"]:
        assert set(o) >= {"name", "ok", "max_abs_err", "max_rel_err"}
    for e in report["events"]:
        assert set(e) >= {"kind", "path", "line", "original_line", "count", "detail"}


def test_reference_cuda_without_gpu_is_an_error(tmp_path):
    from xlaport.cli import main

    if any(Path("/dev").glob("nvidia*")):
        pytest.skip("a GPU is present")
    result = CliRunner().invoke(main, ["verify", str(BAD / "item_in_loop.py"), "--reference", "cuda"])
    assert result.exit_code == 2 and "no CUDA device" in result.output


def test_graph_that_grows_with_the_step_fails_even_with_new_ops_each_time():
    """Each step unrolls one more inner iteration: new ops every step, which a
    one-off branch (a solver's last step) never has."""
    result, report = _verify("unrolled_loop.py")
    assert result.exit_code == 1 and report["verdict"] == "fail"
    assert report["metrics"]["steady_state_recompiles"] >= 3
    assert [e for e in report["events"] if e["kind"] == "recompile"]
