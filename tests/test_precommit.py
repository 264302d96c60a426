"""A real `pre-commit run` over a git repository that uses this repository's
hook definitions (.pre-commit-hooks.yaml), as a project adopting xlaport would.

The hooks run with `language: system` (the xlaport under test, not a fresh
install from the network); everything else -- file types, serial running,
the entry's sub-command -- is read from the hook file itself."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pre_commit")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
CUDA = "import torch\nx = torch.zeros(2).cuda()\n"


def _env(tmp_path):
    return {**os.environ, "PYTHONPATH": str(ROOT), "PRE_COMMIT_HOME": str(tmp_path / "pc-home"),
            "XLAPORT_NO_CACHE": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(tmp_path)}


@pytest.fixture
def project(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "project"
    repo.mkdir()
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    for hook in hooks:
        args = " ".join(hook["entry"].split()[1:])  # the sub-command and its flags, as shipped
        hook["entry"] = f"{sys.executable} -m xlaport {args}"
        hook["language"] = "system"
    config = {"repos": [{"repo": "local", "hooks": hooks}]}
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    for k in range(30):  # enough files for pre-commit to split them into batches if it may
        (repo / f"clean{k}.py").write_text(f"VALUE_{k} = {k}\n")
    (repo / "gpu.py").write_text(CUDA)
    (repo / "notes.txt").write_text("cuda everywhere\n")
    env = _env(tmp_path)
    for cmd in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "start"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env, capture_output=True)
    return repo, env


def _pre_commit(repo, env, *args):
    return subprocess.run([sys.executable, "-m", "pre_commit", "run", *args], cwd=repo, env=env,
                          capture_output=True, text=True)


def test_lint_hook_fails_on_cuda_code_with_one_summary(project):
    repo, env = project
    result = _pre_commit(repo, env, "xlaport-lint", "--all-files")
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "gpu.py:2:5: XLA101" in out
    assert out.count("Found 1 finding(s)") == 1 and "All checks passed" not in out  # one batch, one summary
    assert "notes.txt" not in out


def test_convert_hook_rewrites_and_then_passes(project):
    repo, env = project
    first = _pre_commit(repo, env, "xlaport-convert", "--all-files")
    assert first.returncode == 1  # files were modified: pre-commit fails the hook
    assert ".to(torch_xla.device())" in (repo / "gpu.py").read_text()
    second = _pre_commit(repo, env, "xlaport-convert", "--all-files")
    assert second.returncode == 0, second.stdout
    lint = _pre_commit(repo, env, "xlaport-lint", "--all-files")
    assert lint.returncode == 0, lint.stdout


def test_hooks_apply_the_projects_excludes_to_the_files_pre_commit_passes(project):
    repo, env = project
    (repo / "vendor").mkdir()
    (repo / "vendor" / "gpu_vendored.py").write_text(CUDA)
    (repo / "pyproject.toml").write_text('[tool.xlaport]\nexclude = ["vendor/*"]\n')
    for cmd in (["git", "add", "."], ["git", "commit", "-qm", "vendor"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env, capture_output=True)
    lint = _pre_commit(repo, env, "xlaport-lint", "--all-files")
    assert "gpu_vendored.py" not in lint.stdout, lint.stdout
    assert "gpu.py:2:5: XLA101" in lint.stdout
    _pre_commit(repo, env, "xlaport-convert", "--all-files")
    assert (repo / "vendor" / "gpu_vendored.py").read_text() == CUDA
