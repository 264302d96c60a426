"""`xlaport verify` on programs that are bad on purpose: each must fail (or
error) with the right event on the right line of the original file."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytestmark = [
    pytest.mark.xla,
]

BAD = Path(__file__).resolve().parent.parent / "fixtures" / "bad"


def _verify(name, *options):
    from xlaport.cli import main

    out = Path(f"/tmp/xlaport-test-{name}.json")
    result = CliRunner().invoke(main, ["verify", str(BAD / name), "--root", str(BAD), "--json", str(out), "--timeout", "300",
                                         *options])
    return result, json.loads(out.read_text())


def _line_of(name, text):
    lines = (BAD / name).read_text().splitlines()
    return next(i for i, l in enumerate(lines, 1) if text in l)


def test_item_in_step_loop_fails_with_a_host_read_on_its_line():
    result, report = _verify("item_in_loop.py", "--max-host-reads-per-step", "0")
    assert result.exit_code == 1 and report["verdict"] == "fail"
    reads = [e for e in report["events"] if e["kind"] == "host_read"]
    line = _line_of("item_in_loop.py", "losses.append(loss.item())")
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
    result = CliRunner().invoke(main, ["verify", str(BAD / "item_in_loop.py"), "--root", str(BAD), "--reference", "cuda"])
    assert result.exit_code == 2 and "no CUDA device" in result.output


def test_graph_that_grows_with_the_step_fails_even_with_new_ops_each_time():
    """Each step unrolls one more inner iteration: new ops every step, which a
    one-off branch (a solver's last step) never has."""
    result, report = _verify("unrolled_loop.py")
    assert result.exit_code == 1 and report["verdict"] == "fail"
    assert report["metrics"]["steady_state_recompiles"] >= 3
    assert [e for e in report["events"] if e["kind"] == "recompile"]


# ------------------------------------------------------------------ verify tells the truth (issue 12)


def _swap_only(name, tmp_path):
    """The device swap alone (`--select XLA1`): no barrier in the loop."""
    from xlaport.engine import Settings, transform

    out = tmp_path / name
    out.write_bytes(transform((BAD / name).read_bytes(), Settings(select=["XLA1"])).code)
    return out


def test_candidate_left_on_the_cpu_fails_saying_so():
    result, report = _verify("left_on_cpu.py", "--converted", str(BAD / "left_on_cpu_converted.py"))
    assert result.exit_code == 1 and report["verdict"] == "fail"
    assert report["metrics"]["executions"] == 0
    assert any("did no work on XLA" in f for f in report["failures"])
    assert any("left on the CPU" in f and "model" in f for f in report["failures"])
    assert all(o["ok"] for o in report["outputs"])  # the numbers agree: only the device is wrong


def test_barrier_less_sampler_fails_and_names_the_loop(tmp_path):
    candidate = _swap_only("sampler.py", tmp_path)
    result, report = _verify("sampler.py", "--converted", str(candidate), "--lengths", "--steps=4,8")
    assert result.exit_code == 1 and report["verdict"] == "fail"
    assert report["metrics"]["steps"] == 0
    loop = _line_of("sampler.py", "for i in range(args.steps):")
    [event] = [e for e in report["events"] if e["kind"] == "no_barrier"]
    assert event["original_line"] == loop and event["source"] == "for i in range(args.steps):"
    # measured at two lengths: the one graph grows with the steps
    sizes = [r["largest_graph"] for r in report["metrics"]["lengths"]]
    assert sizes[1] > 1.5 * sizes[0], sizes
    assert any("largest graph grows with --steps" in f and f"line {loop}" in f for f in report["failures"])


def test_host_read_cut_sampler_fails_on_growing_compilations(tmp_path):
    candidate = _swap_only("sampler.py", tmp_path)
    result, report = _verify("sampler.py", "--converted", str(candidate), "--lengths", "--steps=3,6", "--", "--log")
    assert result.exit_code == 1
    a, b, c = [r["compiles"] for r in report["metrics"]["lengths"]]  # 3, 6 and a third length, 9
    assert [r["value"] for r in report["metrics"]["lengths"]] == ["3", "6", "9"]
    assert c > b > a
    assert any("compilations grow with --steps" in f for f in report["failures"])


def test_xlaport_conversion_of_the_sampler_passes_at_three_lengths():
    result, report = _verify("sampler.py", "--lengths", "--steps=4,8")
    assert result.exit_code == 0, report["failures"]
    a, b, c = report["metrics"]["lengths"]
    assert a["compiles"] == b["compiles"] == c["compiles"] and c["largest_graph"] <= a["largest_graph"] + 16


def test_timings_in_stdout_are_left_out_by_their_form_and_the_rest_of_the_line_compared():
    page = Path("/tmp/xlaport-test-timing_printer.html")
    result, report = _verify("timing_printer.py", "--html", str(page))
    assert result.exit_code == 0 and report["verdict"] == "pass", report["failures"]
    assert any("ms/batch" in v for v in report["left_out_by_form"])
    assert any("time:" in v for v in report["left_out_by_form"])
    assert not any("ms/batch" in v or "time:" in v for v in report["varies_between_runs"])  # they did not vary
    assert "left out by their form (timings, dates, sizes; each line's other numbers compared)" in " ".join(result.output.split())
    html = page.read_text()
    assert "<ul id='by-form'>" in html and "ms/batch" in html[html.index("<ul id='by-form'>"):]
    assert [o for o in report["outputs"] if o["name"].startswith("stdout line 5") and "loss" in o["name"]]


def test_a_whole_pickled_module_and_a_json_file_are_compared():
    result, report = _verify("module_save.py")
    assert result.exit_code == 0, report["failures"]
    names = [o["name"] for o in report["outputs"]]
    assert "whole_model.pt[0.weight]" in names and "whole_model.pt[2.bias]" in names
    assert any(n.startswith("metrics.json line 1") for n in names)
    assert report["not_compared"] == []


def test_argparse_error_is_shown_with_exit_2():
    from xlaport.cli import main

    result = CliRunner().invoke(main, ["verify", str(BAD / "needs_args.py"), "--root", str(BAD)])
    assert result.exit_code == 2
    assert "the following arguments are required: --data-dir" in result.output


def test_record_then_compare_against_the_record(tmp_path):
    from xlaport.cli import main

    ref = tmp_path / "ref.json"
    recorded = CliRunner().invoke(main, ["verify", str(BAD / "timing_printer.py"), "--root", str(BAD), "--record", str(ref)])
    assert recorded.exit_code == 0, recorded.output
    record = json.loads(ref.read_text())
    assert record["format"] == "xlaport-reference/1" and len(record["runs"]) == 2
    assert record["environment"]["torch"] == "2.9.0"
    result, report = _verify("timing_printer.py", "--against", str(ref))
    assert result.exit_code == 0, report["failures"]
    assert report["metrics"]["reference"].startswith("record")
    assert any("ms/batch" in v for v in report["left_out_by_form"])


def _one_file_project(project, source):
    """(the project's root, its ``train.py``) holding ``source``."""
    project.mkdir()
    script = project / "train.py"
    script.write_text(source)
    return project, script


def test_a_record_of_a_cuda_reference_is_compared_through_its_routed_draws(tmp_path):
    """A reference recorded on a GPU draws its dropout masks from CUDA's
    generator, which neither the CPU nor XLA reproduces: ``--record`` there
    also keeps runs with those draws taken from the CPU generator, and the
    conversion's routed run is compared with them.  Here a record is made on
    this host and its runs stand in for CUDA's own draws (other numbers)."""
    from xlaport.cli import main

    project, script = _one_file_project(tmp_path / "drop", "import torch\n\ntorch.manual_seed(0)\n"
                                        "x = torch.ones(64, device='cuda')\n"
                                        "print(torch.nn.functional.dropout(x, 0.5).sum().item())\n")
    ref = tmp_path / "ref.json"
    recorded = CliRunner().invoke(main, ["verify", str(script), "--root", str(project), "--record", str(ref)])
    assert recorded.exit_code == 0, recorded.output
    record = json.loads(ref.read_text())
    assert "rng_runs" not in record  # (a CPU reference drew on the CPU: nothing to route)
    record["rng_runs"] = record["runs"]
    record["runs"] = [{"stdout": "7.0\n", "files": {}}, {"stdout": "7.0\n", "files": {}}]  # CUDA's own masks
    ref.write_text(json.dumps(record))

    def against():
        out = tmp_path / "report.json"
        result = CliRunner().invoke(main, ["verify", str(script), "--root", str(project), "--against", str(ref),
                                           "--json", str(out), "--timeout", "300"])
        return result, json.loads(out.read_text())

    result, report = against()
    assert result.exit_code == 0, report["failures"]
    assert "recorded on cpu with --record" in report["config"]["reference"]
    assert "random draws taken from the CPU generator" in report["config"]["reference"]
    del record["rng_runs"]
    ref.write_text(json.dumps(record))
    result, report = against()
    assert result.exit_code == 1 and report["verdict"] == "fail", report


def test_a_number_made_from_elapsed_time_is_seen_to_vary_even_when_rounded_alike(tmp_path):
    """nanoGPT prints `mfu 0.01%`: rounded, it was equal in both reference
    runs, so it was compared, and the slower conversion failed on it.  The
    later reference runs read a faster clock: such a number varies."""
    from xlaport.cli import main

    project, script = _one_file_project(tmp_path / "timed", "import time\n\nimport torch\n\nt0 = time.perf_counter()\n"
                                        "x = torch.ones(3, device='cuda')\ntime.sleep(0.3)\n"
                                        "print(f'loss {x.sum().item():.4f} rate {round(time.perf_counter() - t0, 1)}')\n")
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["verify", str(script), "--root", str(project), "--json", str(out),
                                       "--timeout", "300"])
    report = json.loads(out.read_text())
    assert result.exit_code == 0, report["failures"]
    assert any("stdout line 1" in v and "rate" in v for v in report["varies_between_runs"]), report


def test_options_and_paths_are_checked_before_anything_runs(tmp_path):
    from xlaport.cli import main

    missing = CliRunner().invoke(main, ["verify", str(BAD / "item_in_loop.py"), "--json", "/nonexistent/r.json"])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    bad = CliRunner().invoke(main, ["verify", str(BAD / "item_in_loop.py"), "--lengths", "steps"])
    assert bad.exit_code == 2 and "ARG=A,B" in bad.output


def test_temporary_directories_are_removed_unless_kept():
    _, report = _verify("item_in_loop.py", "--keep")
    kept = Path(report["config"]["kept"])
    assert kept.is_dir() and list(kept.glob("xla-*/bad/item_in_loop.py"))
    import shutil

    shutil.rmtree(kept)
    _, report = _verify("item_in_loop.py")
    assert "kept" not in report["config"]
    assert report["config"]["tolerance"]["rtol"] == 1e-3 and report["config"]["environment"]["torch_xla"] == "2.9.0"
