"""Stopping a run: Ctrl-C, SIGTERM and SIGKILL never leave workers behind,
and a temporary file left by a killed write is removed by the next run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xlaport.cli import main  # noqa: F401 -- the package must import
from xlaport.files import TEMP_SUFFIX

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from gen_growth import generate  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def _children(pid):
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _running(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait(predicate, limit=60.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def slow_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("slow")
    text = generate(1500)
    for k in range(40):
        (root / f"gen{k}.py").write_text(text.replace("def make_model", f"def make_model_{k}"))
    return root


def _start(tree):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLAPORT_NO_CACHE": "1"}
    # started as from a terminal: Ctrl-C at its default action, even when this
    # test run inherited it ignored (a CI job started in the background with
    # `cmd &` from a script ignores SIGINT, and so would every child)
    proc = subprocess.Popen([sys.executable, "-m", "xlaport", "lint", "-j", "2", str(tree)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert _wait(lambda: len(_children(proc.pid)) >= 2), "workers did not start"
    time.sleep(0.5)  # let them take work
    return proc, _children(proc.pid)


@pytest.mark.parametrize("how", ["SIGINT to the group (Ctrl-C)", "SIGTERM", "SIGINT"])
def test_stop_signals_end_the_run_and_its_workers(slow_tree, how):
    proc, workers = _start(slow_tree)
    if how.startswith("SIGINT to the group"):
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, getattr(signal, how))
    try:
        rc = proc.wait(timeout=30)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert rc == (143 if how == "SIGTERM" else 130)  # as a shell reports each signal
    assert "interrupted" in proc.stderr.read().decode()
    assert _wait(lambda: not any(_running(w) for w in workers), 30)


def test_workers_exit_when_the_parent_is_killed(slow_tree):
    proc, workers = _start(slow_tree)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    try:
        assert _wait(lambda: not any(_running(w) for w in workers), 30), "orphaned workers kept running"
    finally:
        for w in workers:
            try:
                os.kill(w, signal.SIGKILL)
            except OSError:
                pass


def test_next_run_removes_a_killed_runs_temporary_file(tmp_path):
    from click.testing import CliRunner

    target = tmp_path / "train.py"
    target.write_text("import torch\nx = torch.ones(2).cuda()\n")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".train.py.{dead.pid}.abcd1234{TEMP_SUFFIX}"
    stale.write_text("")
    live = tmp_path / f".other.py.{os.getpid()}.efgh5678{TEMP_SUFFIX}"  # a run still writing
    live.write_text("")
    result = CliRunner().invoke(main, ["convert", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert not stale.exists()
    assert live.exists()
    assert "removed a temporary file" in result.output
    assert "xla" in target.read_text()
