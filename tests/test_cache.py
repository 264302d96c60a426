"""The results cache (xlaport.cache): same answers, read instead of computed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import xlaport.runner as runner
from xlaport.cli import main

ROOT = Path(__file__).resolve().parent.parent
TRAIN = (ROOT / "fixtures" / "train_mlp" / "input.py").read_bytes()


@pytest.fixture
def cached(monkeypatch, tmp_path):
    monkeypatch.delenv("XLAPORT_NO_CACHE", raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("XLAPORT_CACHE_DIR", str(cache))
    return cache


def _tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_bytes(TRAIN)
    (src / "gpu.py").write_text("import torch\nx = torch.ones(2).cuda()\n")
    (src / "plain.py").write_text("import os\nHERE = os.getcwd()\n")
    return src


def _lint(*args):
    result = CliRunner().invoke(main, ["lint", "--format", "json", "-j", "1", *map(str, args)])
    return result.exit_code, json.loads(result.stdout)


def _no_work(monkeypatch):
    def fail(job):
        raise AssertionError(f"{job[0]} was processed, not read from the cache")

    monkeypatch.setattr(runner, "_work", fail)


def test_warm_run_reads_every_answer_from_the_cache(cached, tmp_path, monkeypatch):
    src = _tree(tmp_path)
    cold = _lint(src)
    assert cold[0] == 1 and cold[1]["findings"]
    assert (cached / ".gitignore").read_text().strip().endswith("*")
    assert (cached / "CACHEDIR.TAG").exists()
    _no_work(monkeypatch)
    assert _lint(src) == cold


def test_convert_check_and_convert_share_the_lint_cache(cached, tmp_path, monkeypatch):
    src = _tree(tmp_path)
    expected = tmp_path / "expected"
    CliRunner().invoke(main, ["convert", "--no-cache", "-j", "1", str(src), "-o", str(expected)])
    _lint(src)
    _no_work(monkeypatch)
    check = CliRunner().invoke(main, ["convert", "--check", "-j", "1", str(src)])
    assert check.exit_code == 1
    done = CliRunner().invoke(main, ["convert", "-j", "1", str(src)])
    assert done.exit_code == 0, done.output
    for name in ("train.py", "gpu.py", "plain.py"):
        assert (src / name).read_bytes() == (expected / name).read_bytes()


def test_changed_content_or_settings_are_misses(cached, tmp_path):
    src = _tree(tmp_path)
    _lint(src)
    (src / "gpu.py").write_text("import torch\ny = torch.ones(3).cuda()\nz = y.cuda()\n")
    code, out = _lint(src)
    assert sum(1 for f in out["findings"] if f["path"].endswith("gpu.py")) == 2
    code, out = _lint("--select", "XLA3", src)
    assert {f["code"][:4] for f in out["findings"]} == {"XLA3"}


def test_no_cache_writes_nothing_and_damaged_entries_are_misses(cached, tmp_path):
    src = _tree(tmp_path)
    _lint("--no-cache", src)
    assert not cached.exists()
    cold = _lint(src)
    for entry in cached.rglob("*.json"):
        entry.write_text("{not json")
    assert _lint(src) == cold


def test_parallel_runs_share_one_cache(cached, tmp_path):
    src = _tree(tmp_path)
    for k in range(12):
        (src / f"copy{k}.py").write_bytes(TRAIN.replace(b"# ", f"# {k} ".encode(), 1))
    env = {**os.environ, "XLAPORT_CACHE_DIR": str(cached), "PYTHONPATH": str(ROOT)}
    env.pop("XLAPORT_NO_CACHE", None)
    cmd = [sys.executable, "-m", "xlaport", "lint", "--format", "json", "-j", "2", str(src)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outs = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 1 for p in procs)
    assert outs[0] == outs[1] == outs[2]
    assert not list(cached.rglob("*.tmp"))
    again = subprocess.run(cmd, env=env, capture_output=True)
    assert again.stdout == outs[0]


def test_lint_leaves_the_imports_pass_to_the_convert_that_reads_its_entry(cached, tmp_path, monkeypatch):
    """A plain `lint` shows no output, so it runs no imports pass (LibCST's
    AddImportsVisitor: a tenth of a cold lint on diffusers); its entry says
    which imports the output lacks, and `convert` adds them on reading it --
    the same bytes as a convert with no cache -- and keeps the entry complete."""
    from codemods.syntax import imports

    src = _tree(tmp_path)
    expected = tmp_path / "expected"
    CliRunner().invoke(main, ["convert", "--no-cache", "-j", "1", str(src), "-o", str(expected)])
    applied = []
    real = imports.apply
    monkeypatch.setattr(imports, "apply", lambda *a: applied.append(1) or real(*a))
    code, out = _lint(src)
    assert code == 1 and out["findings"] and not applied
    entries = [json.loads(p.read_text()) for p in cached.rglob("*.json")]
    assert any("imports" in e for e in entries)
    _no_work(monkeypatch)
    done = CliRunner().invoke(main, ["convert", "-j", "1", str(src)])
    assert done.exit_code == 0, done.output
    for name in ("train.py", "gpu.py"):
        assert (src / name).read_bytes() == (expected / name).read_bytes()
    assert not any("imports" in json.loads(p.read_text()) for p in cached.rglob("*.json"))


def test_a_change_to_the_projects_ruff_configuration_restyles(cached, tmp_path):
    """Issue 42, item 7: the styled output `convert` writes was cached under
    the Ruff version alone; with `line-length` changed, the cached answer
    differed from `--no-cache`.  The Ruff configuration is part of it now."""
    src = tmp_path / "proj"
    src.mkdir()
    (src / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
    (src / "train.py").write_text(
        "import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(3):\n"
        "    loss = model(torch.randn(8, 4).cuda()).pow(2).mean() + model(torch.randn(8, 4).cuda()).abs().mean() * 0.5\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")

    def convert(out, *extra):
        result = CliRunner().invoke(main, ["convert", str(src / "train.py"), "-o", str(tmp_path / out), "-q", *extra])
        assert result.exit_code in (0, 1), result.output
        return (tmp_path / out / "train.py").read_text()

    wide = convert("o1")
    (src / "pyproject.toml").write_text("[tool.ruff]\nline-length = 88\n")
    cached_answer, fresh = convert("o2"), convert("o3", "--no-cache")
    assert cached_answer == fresh
    assert wide != fresh  # (the configuration does change the style: the test can fail)


def test_the_files_an_entry_depends_on_are_groups_its_folder_shares(tmp_path):
    """Issue 42 item 4: every module of a folder consults the same
    neighbours (who imports it?); kept in each entry, they made a corpus's
    cache 89 MB (20 MB of them) and its warm check 214,000 comparisons.
    Kept once a folder, by digest, and checked once a run."""
    from codemods.analysis.project import stamps
    from xlaport.cache import Cache
    from xlaport.settings import Settings

    pkg, other = tmp_path / "pkg", tmp_path / "other"
    pkg.mkdir()
    other.mkdir()
    mods = [pkg / f"m{k}.py" for k in range(5)]
    for m in mods:
        m.write_text("x = 1\n")
    (other / "util.py").write_text("y = 2\n")
    near = stamps([str(pkg), *map(str, mods)])
    cache = Cache(tmp_path / "cache", Settings())
    for k in range(5):  # each imports util.py, or not
        cache.put(f"{k:02d}entry", {"input": "x", "deps": {**near, **(stamps([other / "util.py"]) if k % 2 else {})}})
    groups = sorted((cache.dir / "deps").glob("*.json"))
    assert len(groups) == 2  # the folder's files, util.py
    entry = json.loads((cache.dir / "01" / "01entry.json").read_text())
    assert len(entry["deps"]) == 2 and all(isinstance(r, str) for r in entry["deps"])

    fresh = Cache(tmp_path / "cache", Settings())
    assert all(fresh.get(f"{k:02d}entry") for k in range(5))
    (other / "util.py").write_text("y = 3  # changed\n")
    fresh = Cache(tmp_path / "cache", Settings())
    assert [bool(fresh.get(f"{k:02d}entry")) for k in range(5)] == [True, False, True, False, True]
    (other / "util.py").write_text("y = 2\n")
    for group in groups:  # a group whose text is not its digest's (edited, damaged): a miss, no error
        group.write_text(group.read_text().replace("[", "[ ", 1))
    fresh = Cache(tmp_path / "cache", Settings())
    assert not any(fresh.get(f"{k:02d}entry") for k in range(5))
    fresh.put("00entry", {"input": "x", "deps": near})  # the next answer made writes its group again
    assert Cache(tmp_path / "cache", Settings()).get("00entry")


def test_a_warm_lint_reads_no_output_and_convert_reads_a_checked_one(cached, tmp_path, monkeypatch):
    """Outputs are kept beside the entries, named by their digests: a warm
    `lint` shows findings and reads none (a corpus's entries were 89% output
    text); `convert` reads them, and one that is gone is a miss, worked out
    again."""
    src = _tree(tmp_path)
    expected = tmp_path / "expected"
    CliRunner().invoke(main, ["convert", "--no-cache", "-j", "1", str(src), "-o", str(expected)])
    cold = CliRunner().invoke(main, ["lint", "--verbose", "-j", "1", str(src)])
    kept = sorted((next(cached.glob("*/out"))).iterdir())
    assert len(kept) == 2  # train.py's output and gpu.py's (plain.py is left as it is)
    assert not any({"output", "output_text", "styled"} & set(json.loads(p.read_text())) for p in cached.rglob("*.json"))
    for path in kept:
        path.unlink()
    with monkeypatch.context() as m:
        _no_work(m)
        warm = CliRunner().invoke(main, ["lint", "--verbose", "-j", "1", str(src)])
    assert warm.output == cold.output
    assert "train.py: changed" in warm.output and "gpu.py: changed" in warm.output
    done = CliRunner().invoke(main, ["convert", "-j", "1", str(src)])  # (the outputs gone: misses)
    assert done.exit_code == 0, done.output
    for name in ("train.py", "gpu.py", "plain.py"):
        assert (src / name).read_bytes() == (expected / name).read_bytes()
