"""`xlaport verify` on programs whose graphs grow (a sequence grown per
token, a sampler indexed by a host int): each recompilation is placed on the
line that causes it and tied to the lint finding that predicted it, and
`--lengths` shows the growth."""

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.verifying import PROJECTS, ROOT, verify_in
from xlaport.cli import main

pytestmark = [
    pytest.mark.xla,
]


def test_a_sequence_grown_per_token_fails_and_lint_predicted_it(tmp_path):
    """A generation loop that appends each token (the model in a sibling
    module): a new graph per token, tied to the XLA408 that causes it."""
    dest = tmp_path / "generate"
    shutil.copytree(PROJECTS / "generate", dest)
    result, report = verify_in(dest, "sample.py", report=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    recompiles = [e for e in report["events"] if e["kind"] == "recompile"]
    assert recompiles and all(e["predicted"] and e["predicted"].startswith("XLA408") for e in recompiles), recompiles
    # the growth is the `cat` that feeds the sequence back, not the model's
    # `arange` that is only the first op to read it
    cat = (dest / "sample.py").read_text().splitlines().index("            idx = torch.cat((idx, nxt), dim=1)") + 1
    assert [(Path(e["original_path"]).name, e["original_line"]) for e in recompiles] == [("sample.py", cat)]
    assert "is the next step's input with a new shape" in recompiles[0]["detail"]


def test_a_run_that_times_out_compiling_every_step_says_so_and_names_the_line(tmp_path):
    """A generation loop too slow on XLA to finish (a new graph per token):
    the run is killed at --timeout, and the report says how many compiles it
    saw in how many steps and where lint reports the trap -- in the module
    the run imported (sampler.py), not in one it did not (unused.py)."""
    dest = tmp_path / "grows_every_step"
    shutil.copytree(PROJECTS / "grows_every_step", dest)
    old = os.getcwd()
    os.chdir(dest)
    try:
        result = CliRunner().invoke(main, ["verify", "--json", str(tmp_path / "r.json"), "--timeout", "40",
                                           "--reference-runs", "1", "main.py"])
    finally:
        os.chdir(old)
    report = json.loads((tmp_path / "r.json").read_text())
    assert result.exit_code == 1 and report["verdict"] == "fail", result.output
    killed, why = report["failures"]
    assert "ran past --timeout 40s and was killed (after" in killed
    steps = int(killed.split(" steps, ")[0].rsplit(" ", 1)[1])
    compiles = int(killed.split(" compiles")[0].rsplit(" ", 1)[1])
    assert steps >= 3 and compiles >= steps, killed
    line = (dest / "sampler.py").read_text().splitlines().index("            seq = torch.cat((seq, nxt), dim=0)") + 1
    assert why.endswith(f"lint reports what changes shape every step at sampler.py:{line} (XLA408)"), why


def test_events_are_tied_to_related_lines_and_to_growth_in_the_cut_loop(tmp_path):
    """Without running anything: a recompile in a helper is predicted by the
    XLA407 on the call that passes the loop counter (the finding's related
    line); one in another module's function by the XLA408 of the loop whose
    barrier cut the graph; a host read only by a finding on its own line."""
    from xlaport.verify.predicted import predicted

    (tmp_path / "model.py").write_text("import torch\n\ndef embed(idx):\n    return torch.arange(0, idx.size(1))\n")
    # (the helper indexes with the counter, kept as it is: XLA411 would send it to the device)
    main = ("import torch\nfrom model import embed\n\ndef get_batch(source, i):\n    return source[i]  # noqa: XLA411\n\n"
            "data = torch.randn(20, 4).cuda()\nfor i in range(0, 18, 2):\n    x = get_batch(data, i)\n"
            "    x.sum().backward()\n    opt.step()\n\nidx = torch.zeros(1, 1).cuda()\nfor _ in range(4):\n"
            "    out = model(idx)\n    embed(idx)\n    print(out.sum().item())\n    idx = torch.cat((idx, out), dim=1)\n"
            "for k in range(3):\n    model(data).sum().backward()\n    opt.step()\n")
    (tmp_path / "main.py").write_text(main)
    events = [
        {"kind": "recompile", "original_path": str(tmp_path / "main.py"), "original_line": 5, "detail": "d"},
        {"kind": "recompile", "original_path": str(tmp_path / "model.py"), "original_line": 4, "detail": "d",
         "cut_loop": [str(tmp_path / "main.py"), 14]},
        {"kind": "host_read", "original_path": str(tmp_path / "main.py"), "original_line": 17, "detail": "d"},
        # in the growing loop, but no finding on its line / cut by a loop with no trap in it
        {"kind": "host_read", "original_path": str(tmp_path / "main.py"), "original_line": 16, "detail": "d"},
        {"kind": "recompile", "original_path": str(tmp_path / "model.py"), "original_line": 4, "detail": "d",
         "cut_loop": [str(tmp_path / "main.py"), 19]},
        # cut by the loop that indexes with its counter (XLA407 inside it): the op named may be a neighbour
        {"kind": "recompile", "original_path": str(tmp_path / "model.py"), "original_line": 4, "detail": "d",
         "cut_loop": [str(tmp_path / "main.py"), 8]},
    ]
    predicted(events)
    assert [e["predicted"] for e in events] == ["XLA407 at line 9", "XLA408 at line 18 of main.py",
                                                "XLA401 at line 17", None, None, "XLA407 at line 9 of main.py"]
    assert events[-2]["detail"] == "d; not predicted by lint"


def _line_of_fixture(name, text):
    lines = (ROOT / "fixtures" / name / "input.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_a_growth_names_the_findings_that_predicted_its_recompilations():
    from xlaport.verify.growth import judge_lengths
    from xlaport.verify.predicted import growth_reported

    events = [{"kind": "recompile", "predicted_at": ["XLA407", "/p/model.py", 9]},
              {"kind": "recompile", "predicted_at": ["XLA407", "/p/model.py", 9]},
              {"kind": "recompile", "predicted_at": ["XLA408", "/p/main.py", 18]},
              {"kind": "recompile"},
              {"kind": "host_read", "predicted_at": ["XLA401", "/p/main.py", 20]}]
    reported = growth_reported(events)
    assert reported == (["XLA407 at model.py:9", "XLA408 at main.py:18"], 1)
    assert judge_lengths("--steps", ["3", "6", "9"], [5, 8, 11], [40, 40, 40], [], reported) == [
        "compilations grow with --steps: 5 at 3, 8 at 6, 11 at 9; lint reports it: XLA407 at model.py:9, "
        "XLA408 at main.py:18; 1 recompilation(s) no lint finding predicts"]
    # flat compilations name nothing
    assert judge_lengths("--steps", ["3", "6", "9"], [5, 5, 5], [40, 40, 40], [], reported) == []


def test_a_fixture_run_by_verify_at_two_lengths_grows_where_lint_said(tmp_path):
    """fixtures/sampler_traps through `verify --lengths`: compilations grow
    with the steps, and every recompilation after warm-up is one lint
    reported on its line (XLA407/XLA403)."""
    prog = tmp_path / "prog"
    prog.mkdir()
    # the indexes convert would send to the device (XLA411) kept where they are, on purpose
    kept = (ROOT / "fixtures" / "sampler_traps" / "input.py").read_text().replace(
        "self.alphas[t], self.alphas[t_next]\n", "self.alphas[t], self.alphas[t_next]  # noqa: XLA411\n")
    assert "noqa: XLA411" in kept
    (prog / "sampler.py").write_text(kept)
    result, report = verify_in(prog, "sampler.py", "--lengths", "--steps=3,6", report=tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    assert any(f.startswith("compilations grow with --steps") for f in report["failures"]), report["failures"]
    recompiles = [e for e in report["events"] if e["kind"] == "recompile"]
    assert recompiles, report["events"]
    for e in recompiles:
        assert e["predicted"] and e["predicted"][:6] in ("XLA407", "XLA403"), e
    # the growth itself names what lint reported, on the fixture's lines
    [grow] = [f for f in report["failures"] if f.startswith("compilations grow with --steps")]
    named = sorted({e["predicted_at"][2] for e in recompiles})
    assert "lint reports it: " in grow and all(f"sampler.py:{n}" in grow for n in named), grow
    assert "no lint finding predicts" not in grow
    # torch.full's fill value read from a device table: a host read inside
    # C++ (no tensor method runs), on its line and predicted by XLA403
    full = _line_of_fixture("sampler_traps", "return torch.full(")
    reads = [e for e in report["events"] if e["kind"] == "host_read" and e["original_line"] == full]
    assert reads and reads[0]["predicted"] == f"XLA403 at line {full}", report["events"]


def test_a_recompile_is_placed_at_the_op_that_made_the_grown_input_not_at_its_first_reader(tmp_path):
    """Two graphs of a token loop: the newer takes a s64[1,5] input the older
    made with its `cat` (a root); the first op that differs reads it in the
    model.  The recompile is the `cat`'s line.  A graph whose inputs keep
    their shapes (a slice moved along) is still placed at its first changed
    op."""
    from xlaport.verify.compiles import LineMapper, locate_recompile

    (tmp_path / "model.py").write_text("x = 1\n" * 20)
    script = tmp_path / "sample.py"
    script.write_text("x = 1\n" * 30)

    def graph(n, h):
        return {"hash": h, "frames": [], "ir": [
            f"%0 = s64[1,{n}]{{1,0}} xla::device_data(), location=embedding@functional.py:2542, xla_shape=s",
            f"%1 = s64[{n}]{{0}} aten::arange(), location=forward@model.py:16, xla_shape=s",
            f"%2 = f32[1,{n},8]{{2,1,0}} aten::add(%0, %1), location=forward@model.py:17, xla_shape=f",
            "%3 = s64[1,1]{1,0} aten::argmax(%2), location=main@sample.py:25, xla_shape=s, ROOT=0",
            f"%4 = s64[1,{n + 1}]{{1,0}} aten::cat(%0, %3), location=main@sample.py:26, xla_shape=s, ROOT=1"]}

    lines = LineMapper(script, script, tmp_path, tmp_path)
    where = locate_recompile([graph(3, "a"), graph(4, "b"), graph(5, "c")], lines)
    assert where is not None and (Path(where[0]).name, where[1]) == ("sample.py", 26), where
    sliding = [{**graph(4, h), "ir": [l.replace("s64[1,4]{1,0} xla::device_data", "s64[1,9]{1,0} xla::device_data")
                                      for l in graph(4, h)["ir"]]} for h in "ab"]
    sliding[1]["ir"][1] = sliding[1]["ir"][1].replace("s64[4]", "s64[5]")
    where = locate_recompile(sliding, lines)
    assert where is not None and (Path(where[0]).name, where[1]) == ("model.py", 16), where


def test_a_graph_that_comes_back_from_the_cache_is_not_growth():
    """A step after each logging read compiles once and later steps of its
    kind hit the cache: it recurs, it does not grow; a graph per step that
    never comes back is still growth."""
    from xlaport.verify.compiles import classify_recompiles

    def graphs(hashes):
        return [{"hash": h, "ir": ["%1 = f32[] aten::add(%0)"], "frames": []} for h in hashes]

    # steps 1-2 warm up; the log step's graph (b) at step 6 comes back at 11 and 16; the last chunk (c) once
    periodic = graphs(["a", "a", "a", "a", "a", "b", "a", "a", "a", "a", "b", "a", "a", "a", "a", "b", "c"])
    kinds = classify_recompiles(periodic, {"site_steps": [5, 16]})
    assert kinds == {"churn": [16], "new_path": [], "recurring": [5]}, kinds
    growing = graphs([f"g{k}" for k in range(8)])
    kinds = classify_recompiles(growing, {"site_steps": [2, 3, 4, 5, 6, 7]})
    assert kinds["churn"] == [2, 3, 4, 5, 6, 7] and not kinds["recurring"], kinds


def test_new_graphs_with_cached_steps_between_them_are_not_growth():
    """yunjey/pytorch-tutorial's GAN (3 epochs of 2 batches): the first step of
    epochs 2 and 3 each materialise other views read at the epoch's end (two
    small graphs, other ops) with the training step run from the cache
    between them; compiles are 5 at 3 epochs and at 6. A new graph step after
    step is growth."""
    from xlaport.verify.compiles import in_runs

    assert in_runs([2, 5]) == 0
    assert in_runs([2, 3, 4, 5]) == 4
    assert in_runs([2, 3, 7]) == 2
