"""`xlaport verify` is safe to run on a user's project: it refuses outputs
that would replace the user's files, a signal stops the program with its
children and removes the copies, and a child left in the background never
stalls a run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.verifying import ROOT, multi_file, verify_in
from xlaport.cli import main

pytestmark = [
    pytest.mark.xla,
]


def test_output_paths_in_the_project_or_on_the_script_are_refused_before_anything_runs(tmp_path):
    project = multi_file(tmp_path)
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
