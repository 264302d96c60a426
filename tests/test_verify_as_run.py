"""Issue 39: `verify` runs the conversion as its user will run it -- `python
SCRIPT ARGS`, nothing imported, patched or wrapped -- gives both sides the
same seeds, never passes with nothing compared, and names the exception
and the user's line when a run crashes."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from xlaport.cli import main
from xlaport.verify.comparison import Comparison
from xlaport.verify.printed import compare_text
from xlaport.verify.crashes import _what_killed

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = ROOT / "fixtures" / "projects"

def _verify(tmp_path, name, *options, runs="1"):
    dest = tmp_path / name
    if not dest.exists():
        shutil.copytree(PROJECTS / name, dest)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["verify", "--json", str(out), "--reference-runs", runs, "--timeout", "300",
                                       "--root", str(dest), *options, str(dest / "train.py")])
    return result, json.loads(out.read_text())


@pytest.mark.xla
@pytest.mark.xla
def test_a_torchscript_program_passes_as_its_user_runs_it(tmp_path):
    """`torch.jit.script` over `torch.full`, and an import that scripts
    torch's own functions: under a harness that wrapped torch functions the
    conversion crashed at the import (verify's own line); run as the user
    runs it, it passes with its losses and weights compared."""
    result, report = _verify(tmp_path, "torchscript_trainer")
    assert result.exit_code == 0 and report["verdict"] == "pass", result.output
    names = [o["name"] for o in report["outputs"]]
    assert any(n.startswith("stdout line 5: step 4 loss") for n in names), names
    assert "model.pt" in names or any(n.startswith("model.pt") for n in names), names


@pytest.mark.xla
@pytest.mark.xla
def test_a_port_that_forgot_import_torch_xla_fails_on_its_line(tmp_path):
    """verify imported torch_xla into the conversion: a port using the
    "xla" device without importing torch_xla passed, and crashed for its
    user.  Run as the user runs it, it fails at the line that makes the
    tensor, with the exception's own words."""
    src = tmp_path / "unseeded"
    shutil.copytree(PROJECTS / "unseeded", src)
    port = tmp_path / "port"
    port.mkdir()
    text = (src / "train.py").read_text()
    (port / "train.py").write_text(text.replace('"cuda" if torch.cuda.is_available() else "cpu"', '"xla"'))
    result, report = _verify(tmp_path, "unseeded", "--converted", str(port))
    assert result.exit_code == 1 and report["verdict"] == "fail", result.output
    crash = [e for e in report["events"] if e["kind"] == "crash"]
    assert crash and crash[0]["original_line"] == 7, crash  # model = nn.Linear(4, 1).to(device)
    assert report["failures"][0].startswith("the conversion did not run at train.py:7: RuntimeError"), report["failures"]


@pytest.mark.xla
@pytest.mark.xla
def test_an_unseeded_program_is_compared_with_the_same_seeds_on_both_sides(tmp_path):
    """Two reference runs of an unseeded trainer used to differ in every
    float, all were left out, and the verdict was pass with nothing
    compared.  Both sides now start from the same seeds."""
    result, report = _verify(tmp_path, "unseeded", runs="2")
    assert result.exit_code == 0 and report["verdict"] == "pass", result.output
    assert report["varies_between_runs"] == [], report["varies_between_runs"]
    losses = [o for o in report["outputs"] if " loss " in o["name"]]
    assert len(losses) == 4 and all(o["ok"] for o in losses), losses


@pytest.mark.xla
@pytest.mark.xla
def test_a_run_that_compared_no_value_does_not_pass(tmp_path):
    result, report = _verify(tmp_path, "no_values")
    assert result.exit_code == 1 and report["verdict"] == "fail", result.output
    assert any(f.startswith("no value was compared") for f in report["failures"]), report["failures"]


def test_lines_written_by_a_native_library_are_listed_not_compared():
    """Gloo writes to the process's stdout on the CPU side only: it is not
    an output of the program's, and the rest is still compared."""
    out = Comparison()
    ref = "[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of connected peer ranks is : 0\nloss 0.67164\n"
    compare_text("stdout", [ref], "loss 0.67164\n", 1e-3, 1e-5, out)
    assert [(o.name, o.ok) for o in out.outputs] == [("stdout line 1: loss 0.67164", True)]
    assert out.not_compared and "[Gloo] Rank 0" in out.not_compared[0]
    bad = Comparison()
    compare_text("stdout", [ref], "loss 0.9\n", 1e-3, 1e-5, bad)
    assert [o.ok for o in bad.outputs] == [False]


def test_a_crash_is_told_by_its_exception_not_the_last_line_of_stderr():
    """A dispatcher error's message runs on for pages; the crash is the
    exception's first line, not the last line of the listing."""
    stderr = ("Traceback (most recent call last):\n  File \"/p/train.py\", line 7, in <module>\n"
              "    model = nn.Linear(4, 1).to(device)\n            ^^^^^^^^^^\n"
              "RuntimeError: Could not run 'aten::empty.memory_format' with arguments from the 'XLA' backend.\n"
              "CPU: registered at /pytorch/build/aten/src/ATen/RegisterCPU.cpp:30477 [kernel]\n"
              "PythonDispatcher: registered at /pytorch/aten/src/ATen/core/PythonFallbackKernel.cpp:198 "
              "[backend fallback]\n")
    assert _what_killed(stderr).startswith("RuntimeError: Could not run 'aten::empty.memory_format'")


@pytest.mark.xla
@pytest.mark.xla
def test_compiles_that_do_not_grow_with_the_length_are_fixed_costs(tmp_path):
    """A sampler's last two steps compile a graph each: after warm-up, so
    verify failed them as recompilations although its own --lengths runs
    showed the same count at every length.  With --lengths they are fixed
    costs, on their line, and the lengths table is in the text report;
    plain verify passes them as a one-off (the site's last two steps, after
    steps run from the cache; where that stops: test_step_callers)."""
    src = tmp_path / "fixed_sampler"
    shutil.copytree(PROJECTS / "fixed_sampler", src)
    port = tmp_path / "port"
    port.mkdir()
    text = (src / "train.py").read_text()
    text = text.replace('"cuda" if torch.cuda.is_available() else "cpu"', '"xla"')
    text = text.replace("import torch\n", "import torch\nimport torch_xla\n", 1)
    (port / "train.py").write_text(text.replace("        x = x + 1\n", "        x = x + 1\n    torch_xla.sync()\n"))
    result, report = _verify(tmp_path, "fixed_sampler", "--converted", str(port))
    assert report["verdict"] == "pass", report["failures"]
    [last] = [e for e in report["events"] if e["kind"] == "one_off"]
    assert "last steps only (5, 6 of 6), after steps run from the cache" in last["detail"], last
    result, report = _verify(tmp_path, "fixed_sampler", "--converted", str(port), "--lengths", "--steps=6,8")
    assert result.exit_code == 0 and report["verdict"] == "pass", result.output
    assert {r["compiles"] for r in report["metrics"]["lengths"]} == {4}
    fixed = [e for e in report["events"] if e["kind"] == "fixed_cost"]
    assert fixed and fixed[0]["original_line"] == 20, fixed  # x = x + 1, the last step's branch
    assert "Compiles at each length" in result.output and "fixed costs:" in result.output


@pytest.mark.xla
@pytest.mark.xla
def test_a_child_that_left_the_process_group_goes_with_the_run(tmp_path):
    """A daemon started with `setsid` is out of the run's process group: it
    outlived verify.  Every process carrying the run's mark now goes."""
    import os
    import time

    proj = tmp_path / "daemon"
    proj.mkdir()
    pids = tmp_path / "pids.txt"
    (proj / "train.py").write_text(
        "import subprocess, sys\nimport torch\n\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        f"open({str(pids)!r}, 'a').write(f'{{child.pid}}\\n')\n"
        "print((torch.ones(2, device=device) * 3).sum().item())\n")
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["verify", "--json", str(out), "--reference-runs", "1", "--root", str(proj),
                                       str(proj / "train.py")])
    assert json.loads(out.read_text())["verdict"] == "pass", result.output
    children = [int(p) for p in pids.read_text().split()]
    time.sleep(0.5)

    def alive(pid):
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().split()[2] != "Z"
        except OSError:
            return False

    assert len(children) == 2 and not [p for p in children if alive(p)], children


def test_lengths_are_checked_against_the_scripts_arguments_before_anything_runs(tmp_path):
    """`--lengths epochs=1,2` ran two references and then failed; an option
    the script does not take, or a positional argument it was not given, is
    refused before any run."""
    from xlaport.verify import growth

    with pytest.raises(ValueError, match="as it is written"):
        growth.parse_lengths("epochs=1,2")
    source = 'parser.add_argument("--epochs", type=int, default=3)\n'
    growth.check_option("--epochs", [], [source])
    growth.check_option("--steps", ["--steps", "4"], [source])
    with pytest.raises(ValueError, match="takes no option --epoch"):
        growth.check_option("--epoch", [], [source])
    with pytest.raises(ValueError, match="only 1 positional"):
        growth.check_option("@1", ["data.txt"], [source])
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "train.py").write_text("import sys\n\nimport torch\n\nopen(sys.argv[1], 'w').write('ran')\n"
                                   "print(torch.ones(2, device='cuda' if torch.cuda.is_available() else 'cpu').sum())\n")
    marker = tmp_path / "ran"
    result = CliRunner().invoke(main, ["verify", "--root", str(proj), "--lengths", "--steps=1,2", str(proj / "train.py"),
                                       "--", str(marker)])
    assert result.exit_code == 2 and "takes no option --steps" in result.output, result.output
    assert not marker.exists()


def test_a_program_with_nothing_to_port_gets_converts_answer_from_verify(tmp_path):
    """`convert` says "nothing to port" of a CPU-only program; verify said
    "fail: did no work on XLA".  Now both say the same, and nothing runs."""
    proj = tmp_path / "cpu_only"
    proj.mkdir()
    marker = tmp_path / "ran"
    (proj / "train.py").write_text(f"import torch\nopen({str(marker)!r}, 'w').write('ran')\n"
                                   "print((torch.ones(3) * 2).sum().item())\n")
    verified = CliRunner().invoke(main, ["verify", "--root", str(proj), str(proj / "train.py")])
    converted = CliRunner().invoke(main, ["convert", "--diff", str(proj / "train.py")])
    assert verified.exit_code == 0 and converted.exit_code == 0, verified.output
    said = next(line for line in converted.output.splitlines() if line.startswith("nothing to port"))
    assert f"verify: {said}" in verified.output
    assert not marker.exists()


@pytest.mark.xla
@pytest.mark.xla
def test_batchnorm_parts_because_of_torch_xla_passes_said_and_a_wrong_port_still_fails(tmp_path):
    """torch_xla 2.9 tracks BatchNorm's running variance with the biased batch
    variance (PyTorch: unbiased): a correct port of a scripted BatchNorm model
    differs in running_var and in its eval output, and equals a run of the
    original whose BatchNorm updates the way torch_xla does: pass, said.  A
    port that changes the momentum differs from both and fails.  (If a
    torch_xla release fixes the variance, the outputs agree outright: then
    drop the diagnostic run.)"""
    result, report = _verify(tmp_path, "batchnorm")
    assert result.exit_code == 0 and report["verdict"] == "pass", result.output
    explained = report["within_float_order_noise"]
    assert any(e.startswith("model.pt[1.running_var]") and "torch_xla 2.9" in e for e in explained), explained
    assert any(e.startswith("stdout line 1: eval") and "torch_xla 2.9" in e for e in explained), explained
    converted = tmp_path / "converted"
    shutil.copytree(tmp_path / "batchnorm", converted)
    CliRunner().invoke(main, ["convert", "--no-cache", "-o", str(tmp_path / "conv"), str(converted / "train.py")])
    text = (tmp_path / "conv" / "train.py").read_text()
    assert "nn.BatchNorm1d(16)" in text, text
    (converted / "train.py").write_text(text.replace("nn.BatchNorm1d(16)", "nn.BatchNorm1d(16, momentum=0.2)"))
    result, report = _verify(tmp_path, "batchnorm", "--converted", str(converted / "train.py"))
    assert result.exit_code == 1 and report["verdict"] == "fail", result.output
    failed = sorted(o["name"] for o in report["outputs"] if not o["ok"])
    assert "model.pt[1.running_var]" in failed and any(n.startswith("stdout line 1: eval") for n in failed), failed


def test_a_long_crash_keeps_its_traceback_and_exception():
    from xlaport.verify.core import _told

    listing = "".join(f"Backend{k}: registered at /pytorch/aten/src/ATen/core/Fallback.cpp:{k} [kernel]\n"
                      for k in range(400))
    stderr = ("Traceback (most recent call last):\n  File \"/p/train.py\", line 57, in <module>\n    adj = adj.cuda()\n"
              "NotImplementedError: Could not run 'aten::_to_sparse' with arguments from the 'XLA' backend.\n" + listing)
    told = _told(stderr)
    assert told.startswith("Traceback") and 'File "/p/train.py", line 57' in told
    assert _what_killed(told).startswith("NotImplementedError: Could not run 'aten::_to_sparse'")


@pytest.mark.torch
def test_the_precision_noise_run_turns_autocast_off_and_a_judged_run_is_left_alone(tmp_path):
    """The diagnostic run that measures the precision noise runs every
    autocast region in full precision; without it, the observer changes
    nothing (autocast on, as the program asked)."""
    import os
    import subprocess
    import sys

    from xlaport.verify.core import OBSERVE, ROOT

    script = tmp_path / "amp.py"
    script.write_text("import torch\nwith torch.autocast('cpu', dtype=torch.bfloat16):\n"
                      "    y = torch.ones(2, 2) @ torch.ones(2, 2)\n    on = torch.is_autocast_enabled('cpu')\n"
                      "print(on, y.dtype)\n")

    def run(**env):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env={
            **os.environ, "PYTHONPATH": f"{OBSERVE}{os.pathsep}{ROOT}", "XLAPORT_OBSERVE": str(tmp_path / "r"), **env})
        return done.stdout.strip()

    assert run() == "True torch.bfloat16"
    assert run(XLAPORT_DIAGNOSE="no_autocast") == "False torch.float32"


@pytest.mark.xla
@pytest.mark.xla
def test_the_accelerator_side_of_a_test_is_compared_like_with_like_and_a_wrong_port_still_fails(tmp_path):
    """pytorch/examples' mnist shuffles its data only where an accelerator is
    available: the conversion takes that side, the original on a CPU host
    the other, and the values differ for that alone.  The reference becomes
    the original's side as a GPU runs it (its CPU retargeting), said with
    the test's line, and a correct port passes on its losses; a port that
    changes the learning rate still fails against that side."""
    result, report = _verify(tmp_path, "accel_branch")
    assert result.exit_code == 0 and report["verdict"] == "pass", result.output
    assert "the accelerator's side of train.py:7 (`cuda.is_available()` -> `True`)" in report["config"]["reference"], \
        report["config"]["reference"]
    losses = [o for o in report["outputs"] if " loss " in o["name"]]
    assert len(losses) == 4 and all(o["ok"] for o in losses), report["outputs"]
    conv = tmp_path / "conv"
    CliRunner().invoke(main, ["convert", "--no-cache", "-o", str(conv), str(tmp_path / "accel_branch" / "train.py")])
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "accel_branch", broken)
    text = (conv / "train.py").read_text()
    assert "lr=0.1" in text, text
    (broken / "train.py").write_text(text.replace("lr=0.1", "lr=0.2"))
    result, report = _verify(tmp_path, "accel_branch", "--converted", str(broken / "train.py"))
    assert result.exit_code == 1 and report["verdict"] == "fail", result.output
    assert [o["ok"] for o in report["outputs"] if " loss " in o["name"]][1:] == [False] * 3, report["outputs"]


@pytest.mark.xla
@pytest.mark.xla
def test_a_record_made_on_a_gpu_explains_torch_xlas_batchnorm(tmp_path):
    """fixtures/records/h200: the batchnorm fixture recorded on an H200
    (torch 2.11).  The conversion here differs from CUDA's values by
    torch_xla's BatchNorm variance, and the record's own BatchNorm run
    explains it; without that run the same comparison fails."""
    record = ROOT / "fixtures" / "records" / "h200" / "batchnorm.json"
    copy = tmp_path / "record"
    shutil.copytree(record.parent, copy)
    result, report = _verify(tmp_path, "batchnorm", "--against", str(copy / "batchnorm.json"))
    assert result.exit_code == 0 and report["verdict"] == "pass", report["failures"]
    assert "recorded on cuda with --record (torch 2.11.0" in report["config"]["reference"]
    assert any(e.startswith("model.pt[1.running_var]") and "torch_xla 2.9" in e
               for e in report["within_float_order_noise"]), report["within_float_order_noise"]
    data = json.loads((copy / "batchnorm.json").read_text())
    del data["bn_runs"]
    (copy / "batchnorm.json").write_text(json.dumps(data))
    result, report = _verify(tmp_path, "batchnorm", "--against", str(copy / "batchnorm.json"))
    assert result.exit_code == 1 and report["verdict"] == "fail", report

