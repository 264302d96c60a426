"""XLA415: a test of the step's counter that a loop hands a function as a
device tensor (``if t == 0:`` in DDPM-Pytorch's scheduler) compares its
host copy."""

import json
import os
import subprocess
import sys

import libcst as cst
import pytest

from codemods.analysis.counters import host_tests
from conftest import convert_file, convert_text, project_copy

TESTED = "        if torch.as_tensor(t).cpu() == 0:\n"
OBSERVER = os.path.join(os.path.dirname(__file__), "observe")


def comparisons_in(fn_source: str, params=("t",)):
    fn = cst.parse_module(fn_source).body[0]
    return [cst.Module([]).code_for_node(c) for c, _ in host_tests(fn, set(params))]


@pytest.mark.parametrize("source, found", [
    ("def f(x, t):\n    if t == 0:\n        return x\n", ["t == 0"]),
    ("def f(x, t):\n    if 0 < t:\n        return x\n", ["0 < t"]),
    ("def f(x, t):\n    if t > 0 and x is not None or not t <= -1.5:\n        return x\n", ["t > 0", "t <= -1.5"]),
    ("def f(x, t):\n    return x if t == 0 else -x\n", ["t == 0"]),
    ("def f(x, t):\n    assert t >= 0\n    while t != 3:\n        x = x + 1\n", ["t >= 0", "t != 3"]),
    # not a number, not the parameter itself, not read as a bool, in a nested function, bound again
    ("def f(x, t):\n    if t == x:\n        return x\n", []),
    ("def f(x, t):\n    if t - 1 == 0:\n        return x\n", []),
    ("def f(x, t):\n    mask = t == 0\n    return x * mask\n", []),
    ("def f(x, t):\n    def g():\n        if t == 0:\n            return x\n    return g\n", []),
    ("def f(x, t):\n    t = int(t)\n    if t == 0:\n        return x\n", []),
    ("def f(x, t):\n    if t == 0 == x:\n        return x\n", []),
])
def test_the_tests_of_a_parameter(source, found):
    assert sorted(comparisons_in(source)) == sorted(found)


@pytest.fixture
def sampler(tmp_path):
    return project_copy("scheduler_method", tmp_path)


def test_the_scheduler_compares_the_host_copy_of_the_counter_it_is_handed(sampler):
    """fixtures/projects/scheduler_method: tools/sample.py hands the scheduler's
    `sample_prev_timestep` `torch.as_tensor(i).to(device)`."""
    path = sampler / "schedule" / "linear.py"
    out, found = convert_file(path)
    assert TESTED in out, out
    assert [(line, fix) for line, code, fix in found if code == "XLA415"] == [(26, True)], found
    assert "XLA404" not in [code for _, code, _ in found]  # (what it fixes is not reported as well)
    path.write_text(out)
    again, found = convert_file(path)
    assert again == out and "XLA415" not in [code for _, code, _ in found]
    cst.parse_module(out)


@pytest.mark.parametrize("change", [
    # the counter handed as an int: compared on the host already
    ("tools/sample.py", "xt, noise_pred, torch.as_tensor(i).to(device)", "xt, noise_pred, i"),
    # a tensor made from the counter but left on the host
    ("tools/sample.py", "xt, noise_pred, torch.as_tensor(i).to(device)", "xt, noise_pred, torch.as_tensor(i)"),
    # the call hands no counter
    ("tools/sample.py", "xt, noise_pred, torch.as_tensor(i).to(device)", "xt, noise_pred, torch.as_tensor(0).to(device)"),
    # the scheduler binds its parameter again
    ("schedule/linear.py", "        if t == 0:\n", "        t = t.long()\n        if t == 0:\n"),
    # a comparison with something other than a number
    ("schedule/linear.py", "        if t == 0:\n", "        if t == self.betas[0]:\n"),
])
def test_a_test_nothing_vouches_for_stays(sampler, change):
    name, old, new = change
    path = sampler / name
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    out, found = convert_file(sampler / "schedule" / "linear.py")
    assert "torch.as_tensor(t).cpu()" not in out and "XLA415" not in [c for _, c, _ in found], change


def test_a_function_of_the_module_that_its_own_loop_hands_the_counter():
    source = (
        "import torch\n\n\ndef step(x, t, model):\n    x = model(x)\n    return x if t == 0 else x * 0.5\n\n\n"
        "x = torch.ones(3).cuda()\nfor i in reversed(range(10)):\n"
        "    x = step(x, torch.full((1,), i, device='cuda'), model)\n"
    )
    out, findings = convert_text(source)
    assert "    return x if torch.as_tensor(t).cpu() == 0 else x * 0.5\n" in out, out
    assert [f.code for f in findings].count("XLA415") == 1


@pytest.mark.xla
@pytest.mark.xla
def test_the_converted_sampler_runs_one_graph_a_step(sampler, tmp_path):
    """Measured before this rule: 9 -> 17 executions at 4 -> 8 steps (the test
    a graph of its own each step); with it 7 -> 11, the CPU original's
    sample."""
    from click.testing import CliRunner

    from xlaport.cli import main

    out = tmp_path / "out"
    assert CliRunner().invoke(main, ["convert", str(sampler), "-o", str(out)]).exit_code in (0, 1)
    assert TESTED in (out / "schedule" / "linear.py").read_text()
    ran = {}
    for where, steps in ((sampler, "4"), (sampler, "8"), (out, "4"), (out, "8")):
        metrics = tmp_path / f"{where.name}-{steps}.json"
        env = {**os.environ, "PJRT_DEVICE": "CPU", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": OBSERVER,
               "XLAPORT_TEST_METRICS": str(metrics)}
        done = subprocess.run([sys.executable, "tools/sample.py", "--steps", steps], cwd=where, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        ran[where.name, steps] = done.stdout.strip(), json.loads(metrics.read_text()) if metrics.exists() else None
    for steps in ("4", "8"):
        assert ran["out", steps][0] == ran[sampler.name, steps][0]  # (the original ran on the CPU)
    four, eight = ran["out", "4"][1], ran["out", "8"][1]
    assert four["compiles"] == eight["compiles"], (four, eight)
    assert eight["executions"] - four["executions"] == 4, (four, eight)  # one a step
