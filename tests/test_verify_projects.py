"""`xlaport verify` on programs that are projects (issue 23): a sibling
module, a package, data and a config read by relative path, an editable
install, a torchrun trainer -- each run from its own root as a user runs it.
A correct conversion passes; broken ones fail naming the cause and the line;
the user's tree is never written; the run is safe to interrupt."""

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from xlaport.cli import main

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = ROOT / "fixtures" / "projects"
BAD = ROOT / "fixtures" / "bad"

pytestmark = [
    pytest.mark.xla,
    pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla not installed"),
]


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def project(tmp_path):
    """The multi-file trainer, as a user's checkout."""
    dest = tmp_path / "multi_file"
    shutil.copytree(PROJECTS / "multi_file", dest)
    return dest


def verify_in(cwd: Path, *args: str, report: Path, runs: str = "1"):
    """`xlaport verify ARGS` from ``cwd`` (one reference run unless asked:
    these programs print no timings)."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, ["verify", "--json", str(report), "--timeout", "300",
                                           "--reference-runs", runs, *args])
    finally:
        os.chdir(old)
    return result, json.loads(report.read_text()) if report.exists() else None


def converted_tree(project: Path, dest: Path) -> Path:
    result = CliRunner().invoke(main, ["convert", "--no-cache", "-q", str(project), "-o", str(dest)])
    assert result.exit_code == 0, result.output
    return dest


def test_a_multi_file_project_passes_from_its_own_root_and_its_tree_is_untouched(project, tmp_path):
    before = tree_digest(project)
    result, report = verify_in(project, "train.py", report=tmp_path / "r.json", runs="2")
    assert result.exit_code == 0, (report or {}).get("failures") or result.output
    assert report["verdict"] == "pass"
    names = {o["name"] for o in report["outputs"]}
    assert any(n.startswith("out/model.pt[") for n in names)  # written by relative path, compared
    assert any(n.startswith("stdout") for n in names)
    for side in ("reference", "candidate"):  # each side imported its own copy of every project module
        assert set(report["imported"][side]["own"]) >= {"data", "pkg", "pkg.model", "pkg.layers"}
        assert report["imported"][side]["user"] == [] and report["imported"][side]["scratch"] == []
    assert report["metrics"]["rng_routed"].get("dropout", 0) >= 4  # dropout drawn from the CPU generator
    assert all(o["max_abs_err"] < 1e-5 for o in report["outputs"])  # value for value
    assert report["config"]["root"] == str(project) and report["config"]["tolerance"]["rtol"] == 1e-3
    assert tree_digest(project) == before


def test_a_sibling_module_left_unconverted_fails_on_its_line(project, tmp_path):
    conv = converted_tree(project, tmp_path / "conv")
    shutil.copy(project / "pkg" / "layers.py", conv / "pkg" / "layers.py")  # the CUDA buffer, as it was
    result, report = verify_in(project, "train.py", "--converted", str(conv / "train.py"), report=tmp_path / "r.json")
    assert result.exit_code == 1 and report["verdict"] == "fail"
    line = next(i for i, t in enumerate((project / "pkg" / "layers.py").read_text().splitlines(), 1) if "cuda" in t)
    assert any(f"layers.py:{line}" in f and "NVIDIA" in f for f in report["failures"]), report["failures"]


def test_a_removed_barrier_fails_naming_the_loop(project, tmp_path):
    conv = converted_tree(project, tmp_path / "conv")
    train = conv / "train.py"
    train.write_text("".join(l for l in train.read_text().splitlines(keepends=True) if "torch_xla.sync()" not in l))
    result, report = verify_in(project, "train.py", "--converted", str(conv), report=tmp_path / "r.json")
    assert result.exit_code == 1
    loop = next(i for i, t in enumerate((project / "train.py").read_text().splitlines(), 1) if t.startswith("for "))
    assert any("without a barrier" in f and f"train.py:{loop}" in f for f in report["failures"]), report["failures"]


def test_a_model_left_on_the_cpu_fails_saying_so(project, tmp_path):
    conv = converted_tree(project, tmp_path / "conv")
    train = conv / "train.py"
    text = train.read_text().replace("model = Net().to(device)", "model = Net()")
    train.write_text(text.replace("rows[:, :4].to(device), rows[:, 4:].to(device)", "rows[:, :4], rows[:, 4:]"))
    for module in ("layers.py", "model.py"):
        path = conv / "pkg" / module
        path.write_text(path.read_text().replace("device=torch_xla.device()", 'device="cpu"'))
    result, report = verify_in(project, "train.py", "--converted", str(conv), report=tmp_path / "r.json")
    assert result.exit_code == 1
    assert any("left on the CPU" in f and "model" in f for f in report["failures"]), report["failures"]


def test_a_wrong_port_says_which_module_diverges_first(project, tmp_path):
    conv = converted_tree(project, tmp_path / "conv")
    layers = conv / "pkg" / "layers.py"
    layers.write_text(layers.read_text().replace("0.5", "0.6"))  # a port that changed a number
    result, report = verify_in(project, "train.py", "--converted", str(conv), report=tmp_path / "r.json")
    assert result.exit_code == 1
    assert report["divergence"]["module"] == "Net.scaled" and report["divergence"]["pass"] == 1
    assert any("diverge first at `Net.scaled`" in f for f in report["failures"])


def test_device_randomness_left_to_xla_is_named_not_failed(project, tmp_path):
    result, report = verify_in(project, "train.py", "--device-rng", report=tmp_path / "r.json")
    assert result.exit_code == 0, report["failures"]
    assert report["random_not_compared"], "the random ops XLA drew must be named"
    assert any("random, not compared" in o["name"] for o in report["outputs"])


def test_an_editable_install_imports_each_sides_own_copy(tmp_path):
    src = tmp_path / "editable_pkg"
    shutil.copytree(PROJECTS / "editable_pkg", src)
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    here = next(p for p in sys.path if p.endswith("site-packages") and (Path(p) / "torch").is_dir())
    (site / "xlaport_test_torch.pth").write_text(here + "\n")  # torch and torch_xla of the test's environment
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(src), "--no-deps"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"pip install -e failed (no registry?): {done.stderr[-300:]}")
    from xlaport.verify.verification import verify

    report = verify(src / "scripts" / "train.py", python=str(venv / "bin" / "python"), timeout=300, cwd=src)
    assert report.error is None and report.verdict == "pass", report.error or report.failures
    for side in ("reference", "candidate"):
        assert report.imported[side]["own"] == ["tinylib", "tinylib.model"]
        assert report.imported[side]["user"] == []


def test_a_torchrun_trainer_passes_under_emulated_torchrun(tmp_path):
    src = tmp_path / "torchrun_trainer"
    shutil.copytree(PROJECTS / "torchrun_trainer", src)
    result, report = verify_in(src, "train.py", "--torchrun", report=tmp_path / "r.json")
    assert result.exit_code == 0, report["failures"]
    assert any(o["name"].startswith("final.pt[") for o in report["outputs"])
    assert report["imported"]["candidate"]["own"] == ["utils"]


def test_a_one_off_recompile_is_not_growth():
    result = CliRunner().invoke(main, ["verify", str(BAD / "lr_one_off.py"), "--root", str(BAD), "--json",
                                       "/tmp/xlaport-test-lr.json", "--lengths", "--steps=2,6"])
    report = json.loads(Path("/tmp/xlaport-test-lr.json").read_text())
    assert result.exit_code == 0, report["failures"]
    assert [r["compiles"] for r in report["metrics"]["lengths"]] == [1, 2, 2]  # one more at 6, none at 10


def test_a_recompile_names_the_read_that_makes_each_graph_differ_and_lint_predicted_it():
    result = CliRunner().invoke(main, ["verify", str(BAD / "indexed_table.py"), "--root", str(BAD), "--json",
                                       "/tmp/xlaport-test-idx.json"])
    report = json.loads(Path("/tmp/xlaport-test-idx.json").read_text())
    assert result.exit_code == 1
    [event] = [e for e in report["events"] if e["kind"] == "recompile"]
    assert event["source"].startswith("sigma = sigmas[i]")  # (kept on purpose: `# xlaport: ignore[XLA411]`)
    assert event["predicted"].startswith("XLA407 at line")


# ------------------------------------------------------------------ safety


def test_output_paths_in_the_project_or_on_the_script_are_refused_before_anything_runs(project, tmp_path):
    for option, value in (("--json", project / "report.json"), ("--json", project / "train.py"),
                          ("--html", project / "out" / "r.html")):
        result = CliRunner().invoke(main, ["verify", str(project / "train.py"), option, str(value)])
        assert result.exit_code == 2 and "would be replaced" in result.output or "inside the project" in result.output
    assert not (project / "report.json").exists()
    store = tmp_path / "ref.json.d"
    store.mkdir()
    (store / "mine.txt").write_text("keep me")
    result = CliRunner().invoke(main, ["verify", str(project / "train.py"), "--record", str(tmp_path / "ref.json")])
    assert result.exit_code == 2 and "not a record store verify made" in result.output
    assert (store / "mine.txt").read_text() == "keep me"


def _slow_project(tmp_path: Path) -> Path:
    proj = tmp_path / "slow"
    proj.mkdir()
    (proj / "pyproject.toml").write_text("[project]\nname = 'slow'\n")
    (proj / "main.py").write_text(
        "import os, subprocess, sys, time\n"
        "import torch\n"
        "x = torch.zeros(2).cuda()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "open(sys.argv[1], 'a').write(f'{os.getpid()} {child.pid}\\n')\n"
        "print(float((x + 1).sum()))\n"
        "if len(sys.argv) > 2:\n    time.sleep(120)\n"
        "print('done')\n")
    return proj


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_program_and_its_children_and_removes_the_copies(tmp_path, signum, status):
    proj = _slow_project(tmp_path)
    pids = tmp_path / "pids.txt"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "xlaport", "verify", "main.py", "--", str(pids), "hang"],
                            cwd=proj, env={**os.environ, "TMPDIR": str(tmp)}, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not pids.exists():
        time.sleep(0.2)
    assert pids.exists(), "the program did not start"
    time.sleep(0.5)
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == status
    assert "interrupted" in proc.stderr.read()
    started = [int(p) for line in pids.read_text().splitlines() for p in line.split()]
    time.sleep(0.5)
    assert not [p for p in started if _alive(p)], "the program (or its child) still runs"
    assert not list(tmp.glob("xlaport-verify-*")), "a temporary copy was left behind"


def test_a_background_child_never_stalls_a_run(tmp_path):
    proj = _slow_project(tmp_path)
    pids = tmp_path / "pids.txt"
    start = time.time()
    result, report = verify_in(proj, "main.py", "--", str(pids), report=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert time.time() - start < 100  # the child sleeps 120 s each run: nobody waited for it
    children = [int(line.split()[1]) for line in pids.read_text().splitlines()]
    assert len(children) == 2 and not [p for p in children if _alive(p)]


def test_help_says_that_verify_runs_the_program():
    result = CliRunner().invoke(main, ["verify", "--help"])
    assert "runs your program, unsandboxed" in " ".join(result.output.split())
    readme = (ROOT / "README.md").read_text()
    assert "runs your program, unsandboxed" in " ".join(readme.split())


# ------------------------------------------------------------------ the page


def test_the_html_report_renders_in_a_real_browser(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Debian's chromium is not installed (make test installs it where it can)")
    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["verify", str(BAD / "indexed_table.py"), "--root", str(BAD), "--html",
                                       str(page)])
    assert result.exit_code == 1
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    dom = subprocess.run([browser, *flags, f"--user-data-dir={tmp_path / 'p1'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert "<span id=\"verdict\" class=\"verdict fail\">fail</span>" in dom
    assert dom.count("class=\"output-row") >= 3
    assert "sigma = sigmas[i]" in dom and "predicted by XLA407" in dom  # the event, with its code
    assert dom.count("class=\"bar\"") == 3 * 6  # compiles, executions, transfers for each of the 6 steps
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, f"--user-data-dir={tmp_path / 'p2'}", "--window-size=1200,1400",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_the_candidate_reads_the_projects_data_not_what_the_converted_tree_holds(tmp_path):
    """A converted tree someone ran already holds that run's outputs (a
    snapshot the program resumes from): the candidate gets the converted
    tree's modules and the project's data, as the reference does."""
    from xlaport.verify.project import Project, build_side

    root, conv = tmp_path / "proj", tmp_path / "out"
    (root / "pkg").mkdir(parents=True)
    (conv / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("import pkg.m\n")
    (root / "pkg" / "m.py").write_text("DEVICE = 'cuda'\n")
    (root / "input.txt").write_text("the project's data\n")
    (conv / "train.py").write_text("import pkg.m\n")
    (conv / "pkg" / "m.py").write_text("DEVICE = 'xla'\n")
    (conv / "snapshot.pt").write_text("left by an earlier run\n")
    (conv / "input.txt").write_text("stale\n")
    side = build_side(Project.of(root / "train.py", root, root), "xla", tmp_path / "side", {}, conv)
    assert (side.tree / "pkg" / "m.py").read_text() == "DEVICE = 'xla'\n"
    assert (side.tree / "input.txt").read_text() == "the project's data\n"
    assert not (side.tree / "snapshot.pt").exists()


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
    main = ("import torch\nfrom model import embed\n\ndef get_batch(source, i):\n    return source[i:i + 2]\n\n"
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
        # cut by the loop that slices with its counter (XLA407 inside it): the op named may be a neighbour
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


def test_a_conversion_that_dies_in_xla_names_the_signal_the_cause_and_the_line(tmp_path):
    """Pytorch-UNet's first evaluation round made the XLA CPU backend abort
    (``LLVM ERROR: Unable to allocate section memory!``) in native code: the
    report said only the first runtime log line.  Now it names the signal,
    the cause, the progress so far, and the user's line the fault handler
    shows (the innermost frame: a dump lists the most recent call first)."""
    dest = tmp_path / "dies"
    dest.mkdir()
    (dest / "helpers.py").write_text(
        "import os\nimport sys\n\n\ndef check(x):\n    if x.device.type == 'xla':\n"
        "        print('E0000 00:00:1.0 1 execution_engine.cc:54] LLVM compilation error', file=sys.stderr)\n"
        "        print('LLVM ERROR: Unable to allocate section memory!', file=sys.stderr, flush=True)\n"
        "        os.abort()\n    return x * 2\n")
    (dest / "main.py").write_text(
        "import torch\n\nfrom helpers import check\n\n"
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "print(check(torch.ones(2).to(device)))\n")
    result = CliRunner().invoke(main, ["verify", "--json", str(tmp_path / "r.json"), "--reference-runs", "1",
                                       "--root", str(dest), str(dest / "main.py")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert result.exit_code == 1 and report["verdict"] == "fail", result.output
    said = report["failures"][0]
    assert said.startswith("the conversion did not run at helpers.py:9: "), said
    assert "LLVM ERROR: Unable to allocate section memory! (Fatal Python error: Aborted); it died (killed by " \
           "SIGABRT)" in said, said
    assert "died (killed by SIGABRT" in report["config"]["candidate_error"]


def test_a_device_named_on_the_command_line_gets_the_conversions_own_arguments(tmp_path):
    """makemore-style: the original takes its device as an argument (`--device
    cpu` for a reference on the CPU, `cuda` on a GPU); the conversion runs with
    `--device xla` (`--converted-args`), and the two agree.  Given the
    reference's arguments, the conversion does nothing on XLA: the failure
    says so and points at the option."""
    dest = tmp_path / "cli_device"
    dest.mkdir()
    (dest / "main.py").write_text(
        "import argparse\n\nimport torch\n\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--device', default='cpu', help='cpu|cuda|mps')\n"
        "parser.add_argument('--steps', type=int, default=3)\n"
        "args = parser.parse_args()\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2).to(args.device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nx = torch.randn(8, 4).to(args.device)\n"
        "for _ in range(args.steps):\n    loss = model(x).pow(2).mean()\n    opt.zero_grad()\n    loss.backward()\n"
        "    opt.step()\nprint(f'loss {loss.item():.5f}')\n")
    base = ["verify", "--reference", "cpu", "--reference-runs", "1", "--root", str(dest)]
    result = CliRunner().invoke(main, [*base, "--json", str(tmp_path / "ok.json"), "--converted-args",
                                       "--device xla --steps 3", str(dest / "main.py"), "--", "--device", "cpu"])
    report = json.loads((tmp_path / "ok.json").read_text())
    assert result.exit_code == 0 and report["verdict"] == "pass", result.output
    assert report["config"]["converted_args"] == ["--device", "xla", "--steps", "3"]
    assert any(o["name"].startswith("stdout") and o["ok"] for o in report["outputs"]), report["outputs"]
    same = CliRunner().invoke(main, [*base, "--json", str(tmp_path / "same.json"), str(dest / "main.py"), "--",
                                     "--device", "cpu"])
    said = json.loads((tmp_path / "same.json").read_text())["failures"]
    assert same.exit_code == 1 and any(f.startswith("the conversion did no work on XLA (0 executions)") and
                                       "the device is an argument (cpu): give the conversion its own, "
                                       "`--converted-args`" in f for f in said), said


def test_outputs_off_by_the_originals_float_order_noise_pass_and_more_fail(tmp_path):
    """A program whose printed number moves with the CPU thread count (as a
    GAN's weights do: pytorch/examples' dcgan moved by 1e-3 between 1 and 2
    threads): a conversion off by less than ten times that passes, saying
    so; one off by far more fails."""
    dest = tmp_path / "noisy"
    dest.mkdir()
    program = ("import torch\n\nx = torch.ones(2).to('cuda' if torch.cuda.is_available() else 'cpu')\n"
               "noise = 1e-4 * torch.get_num_threads() + (OFF if x.device.type == 'xla' else 0.0)\n"
               "print(f'value {1e-3 + noise:.7f} sum {(x * 2).sum().item()}')\n")
    for off, code in (("5e-5", 0), ("5e-3", 1)):
        (dest / "main.py").write_text(program.replace("OFF", off))
        out = tmp_path / f"{off}.json"
        result = CliRunner().invoke(main, ["verify", "--reference", "cpu", "--json", str(out), "--root", str(dest),
                                           str(dest / "main.py")])
        report = json.loads(out.read_text())
        assert result.exit_code == code, result.output
        noted = report["within_float_order_noise"]
        assert (len(noted) == 1 and noted[0].startswith("stdout line 1") and "CPU thread(s) instead of" in noted[0]) \
            if code == 0 else not noted, noted


def test_linked_data_folders_reach_the_copies(tmp_path):
    """``data -> ../datasets`` (a data set kept outside the project, or in a
    folder the copy leaves out) and ``cache -> data`` (inside it): the
    copies read the same files the program reads in place; os.walk lists a
    linked folder among the folders and never walks it."""
    from xlaport.verify.project import Project, build_side

    root, outside = tmp_path / "proj", tmp_path / "datasets"
    (root / ".hidden_sets").mkdir(parents=True)
    outside.mkdir()
    (outside / "train.txt").write_text("kept outside\n")
    (root / ".hidden_sets" / "val.txt").write_text("kept hidden\n")
    (root / "train.py").write_text("print(open('data/train.txt').read())\n")
    (root / "data").symlink_to("../datasets")
    (root / "val").symlink_to(".hidden_sets")
    (root / "mirror").symlink_to("val")
    side = build_side(Project.of(root / "train.py", root, root), "xla", tmp_path / "side", {})
    assert (side.tree / "data" / "train.txt").read_text() == "kept outside\n"
    assert (side.tree / "val" / "val.txt").read_text() == "kept hidden\n"
    assert (side.tree / "mirror" / "val.txt").read_text() == "kept hidden\n"
    assert os.readlink(side.tree / "mirror") == "val"  # inside the copy: the copy's own link


def test_the_reference_is_the_original_unmodified(tmp_path):
    """Issue 39: the reference runs the user's own file, not a CPU conversion
    of it (which the converter's own mistakes would break too).  A program
    reading its own source shows which file ran: the original's text holds
    `.cuda()` (in a helper the run never calls, so no test is switched), the
    conversion's does not -- so the outputs differ and the verdict is fail,
    where a converted reference agreed (pass)."""
    dest = tmp_path / "own"
    dest.mkdir()
    (dest / "main.py").write_text(
        "import torch\n\n\ndef to_gpu(t):\n    return t.cuda()\n\n\nsource = open(__file__).read()\n"
        "x = torch.ones(2)\n"
        "print('moves with cuda():', 7 * int('.cu' + 'da()' in source), (x * 2).sum().item())\n")
    result = CliRunner().invoke(main, ["verify", "--json", str(tmp_path / "r.json"), "--reference-runs", "1",
                                       "--root", str(dest), str(dest / "main.py")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["config"]["reference"] == "the original, unmodified, on the CPU", result.output
    assert report["verdict"] == "fail" and result.exit_code == 1, result.output


def test_an_original_that_needs_cuda_is_retargeted_and_the_report_says_why(tmp_path):
    dest = tmp_path / "needs"
    dest.mkdir()
    (dest / "main.py").write_text("import torch\n\nx = torch.ones(2).cuda()\nprint((x * 2).sum().item())\n")
    result = CliRunner().invoke(main, ["verify", "--json", str(tmp_path / "r.json"), "--reference-runs", "1",
                                       "--root", str(dest), str(dest / "main.py")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "pass" and result.exit_code == 0, result.output
    said = report["config"]["reference"]
    assert said.startswith("the original retargeted to the CPU") and "NVIDIA driver" in said, said


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
