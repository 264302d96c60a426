"""The command-line contract: exit codes, output formats, bad files, -o trees."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from xlaport.cli import main

CUDA = b"import torch\nx = torch.zeros(2).cuda()\n"


def run(*args, cwd=None):
    runner = CliRunner()
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        result = runner.invoke(main, list(map(str, args)), catch_exceptions=False)
    finally:
        os.chdir(old)
    return result


def test_lint_without_paths_exits_zero():
    assert run("lint").exit_code == 0
    assert run("convert").exit_code == 0


def test_lint_exit_codes(tmp_path):
    clean = tmp_path / "clean.py"
    clean.write_text("print('hi')\n")
    dirty = tmp_path / "dirty.py"
    dirty.write_bytes(CUDA)
    assert run("lint", clean).exit_code == 0
    assert run("lint", dirty).exit_code == 1
    bad = tmp_path / "bad.py"
    bad.write_text("x = torch.cuda(\n")
    assert run("lint", dirty, bad).exit_code == 2
    assert dirty.read_bytes() == CUDA  # lint writes nothing


def test_json_output_fields(tmp_path):
    f = tmp_path / "a.py"
    f.write_bytes(CUDA + b'if cfg.backend == "cuda":\n    pass\n')
    result = run("lint", "--format", "json", f)
    rows = json.loads(result.output)["findings"]
    assert {r["code"] for r in rows} == {"XLA101", "XLA104"}
    row = [r for r in rows if r["code"] == "XLA101"][0]
    assert row["path"] == str(f) and row["line"] == 2 and row["col"] == 5 and row["fix"] is True
    assert [r for r in rows if r["code"] == "XLA104"][0]["fix"] is False


def test_github_format(tmp_path):
    f = tmp_path / "a.py"
    f.write_bytes(CUDA)
    out = run("lint", "--format", "github", f).output
    assert out.startswith(f"::warning file={f},line=2,col=5,endLine=2,endColumn=26,title=xlaport XLA101 (fixable)::")


def test_convert_in_place_check_and_diff(tmp_path):
    f = tmp_path / "a.py"
    f.write_bytes(CUDA)
    r = run("convert", "--check", f)
    assert r.exit_code == 1 and f.read_bytes() == CUDA
    r = run("convert", "--diff", f)
    assert "+x = torch.zeros(2).to(torch_xla.device())" in r.output and f.read_bytes() == CUDA
    r = run("convert", f)
    assert r.exit_code == 0
    assert b"torch_xla.device()" in f.read_bytes()
    assert run("convert", "--check", f).exit_code == 0


def test_select_and_ignore(tmp_path):
    f = tmp_path / "a.py"
    f.write_bytes(CUDA)
    assert run("lint", "--ignore", "XLA1", f).exit_code == 0
    assert run("lint", "--select", "XLA4", f).exit_code == 0
    assert run("lint", "--select", "XLA101", f).exit_code == 1
    assert run("lint", "--select", "NOPE", f).exit_code == 2  # usage error


def test_config_in_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.xlaport]\nignore = ["XLA101"]\n')
    f = tmp_path / "a.py"
    f.write_bytes(CUDA)
    assert run("lint", f).exit_code == 0


def test_suppression_in_every_mode(tmp_path):
    f = tmp_path / "a.py"
    src = b"import torch\nx = torch.zeros(2).cuda()  # xlaport: ignore[XLA101]\ny = x.cuda()  # xlaport: ignore\n"
    f.write_bytes(src)
    assert run("lint", f).exit_code == 0
    assert run("convert", f).exit_code == 0
    assert f.read_bytes() == src


def test_bad_files_are_reported_and_do_not_stop_the_run(tmp_path):
    (tmp_path / "syntax.py").write_text("def f(:\n    x.cuda()\n")
    (tmp_path / "py2.py").write_text("print 'cuda'\n")
    (tmp_path / "binary.py").write_bytes(b"\x00\x01cuda\x02")
    (tmp_path / "empty.py").write_bytes(b"")
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf" + CUDA)
    (tmp_path / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\n" + CUDA + b"s = '\xe9'\n")
    (tmp_path / "crlf.py").write_bytes(CUDA.replace(b"\n", b"\r\n"))
    (tmp_path / "tabs.py").write_bytes(b"import torch\nif True:\n\tx = torch.ones(1).cuda()\n")
    ro = tmp_path / "readonly.py"
    ro.write_bytes(CUDA)
    ro.chmod(0o444)
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")
    good = tmp_path / "good.py"
    good.write_bytes(CUDA)
    r = run("convert", tmp_path)
    assert r.exit_code == 2
    text = r.output
    assert "syntax.py:" in text and "XLA001 cannot parse" in text
    assert "py2.py:1:" in text and text.count("cannot parse") == 2
    assert "binary.py" in text and "binary" in text
    assert "readonly.py" in text and "read-only" in text
    assert "loop.py" in text and "symbolic link" in text
    assert b"torch_xla.device()" in good.read_bytes()
    assert (tmp_path / "empty.py").read_bytes() == b""
    assert (tmp_path / "bom.py").read_bytes().startswith(b"\xef\xbb\xbfimport torch\n")
    latin = (tmp_path / "latin.py").read_bytes()
    assert latin.endswith(b"s = '\xe9'\n") and b"torch_xla.device()" in latin
    crlf = (tmp_path / "crlf.py").read_bytes()
    assert b"torch_xla.device()" in crlf and b"\n" not in crlf.replace(b"\r\n", b"")
    assert b"\tx = torch.ones(1).to(torch_xla.device())" in (tmp_path / "tabs.py").read_bytes()
    assert ro.read_bytes() == CUDA
    assert stat.S_IMODE(ro.stat().st_mode) == 0o444
    assert not list(tmp_path.glob("*.xlaport-tmp"))


def test_permissions_kept(tmp_path):
    f = tmp_path / "run.py"
    f.write_bytes(CUDA)
    f.chmod(0o755)
    run("convert", f)
    assert stat.S_IMODE(f.stat().st_mode) == 0o755


def test_output_tree_mirrors_and_copies(tmp_path):
    src = tmp_path / "repo"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_bytes(CUDA)
    (src / "pkg" / "plain.py").write_text("x = 1\n")
    (src / "data.json").write_text("{}")
    out = tmp_path / "out"
    r = run("convert", src, "-o", out)
    assert r.exit_code == 0
    assert b"torch_xla" in (out / "pkg" / "m.py").read_bytes()
    assert (out / "pkg" / "plain.py").read_text() == "x = 1\n"
    assert (out / "data.json").read_text() == "{}"
    assert (src / "pkg" / "m.py").read_bytes() == CUDA  # input untouched
    r = run("convert", src, "-o", src / "inside")
    assert r.exit_code == 2 and "inside" in r.output


def test_rules_and_explain():
    out = run("rules").output
    assert "XLA101" in out and "XLA302" in out
    # in code order, as Ruff lists its rules (not the order the codemods run in)
    codes = [line.split()[0] for line in out.splitlines() if line.startswith("XLA")]
    assert codes == sorted(codes) and codes.index("XLA151") > codes.index("XLA144")
    assert codes.index("XLA202") < codes.index("XLA301")
    out = run("explain", "xla302").output
    assert "Why it matters" in out and "torch_xla.sync()" in out
    assert run("explain", "XLA999").exit_code == 2


def test_static_path_never_imports_torch(tmp_path):
    f = tmp_path / "a.py"
    f.write_bytes(CUDA)
    code = (
        "import sys\nfrom xlaport.cli import main\n"
        "try:\n    main(['lint', sys.argv[1]])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\nprint('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True,
                       cwd=Path(__file__).parent.parent)
    assert r.stdout.strip().endswith("ok"), r.stderr


def test_parallel_jobs_agree(tmp_path):
    for i in range(12):
        (tmp_path / f"m{i}.py").write_bytes(CUDA)
    one = json.loads(run("lint", "--format", "json", "-j", "1", tmp_path).output)["findings"]
    two = json.loads(run("lint", "--format", "json", "-j", "2", tmp_path).output)["findings"]
    assert one == two and len(one) == 12


def test_lint_include_cold_says_which_reads_run_every_step(tmp_path):
    sched = tmp_path / "sched.py"
    sched.write_text(
        "import torch\n\n\nclass Scheduler:\n"
        "    def set_timesteps(self, n):\n        self.sigma_max = self.sigmas.max().item()\n\n"
        "    def index_for_timestep(self, t):\n        return (self.timesteps == t).nonzero()[0].item()\n\n"
        "    def step(self, out, t, sample):\n        i = self.index_for_timestep(t)\n        return sample - out\n"
    )
    hot_only = run("lint", "--format", "json", "--port-cpu", "--select", "XLA4", sched)
    assert {(f["line"], f["code"]) for f in json.loads(hot_only.output)["findings"]} == {(9, "XLA401"), (9, "XLA405")}
    both = json.loads(run("lint", "--format", "json", "--port-cpu", "--select", "XLA4", "--include-cold", sched).output)["findings"]
    by_line = {(f["line"], f["code"]): f["message"] for f in both}
    assert "once per call (in `set_timesteps()`)" in by_line[(6, "XLA401")]
    assert "runs every step" in by_line[(9, "XLA401")] and "reached from `step()`" in by_line[(9, "XLA401")]


def test_lint_first_step_only_lookup_is_once_per_call(tmp_path):
    """diffusers >= 0.2x finds the step index once, under `if self.step_index
    is None:` (verify sees one `aten::nonzero` in an 8-step run): not every step."""
    sched = tmp_path / "sched.py"
    sched.write_text(
        "import torch\n\n\nclass Scheduler:\n"
        "    def index_for_timestep(self, t):\n        return (self.timesteps == t).nonzero()[0].item()\n\n"
        "    def step(self, out, t, sample):\n"
        "        if self.step_index is None:\n            self._step_index = self.index_for_timestep(t)\n"
        "        else:\n            self.other(t)\n"
        "        return sample - out\n\n"
        "    def other(self, t):\n        return t.item()\n"
    )
    hot_only = json.loads(run("lint", "--format", "json", "--port-cpu", "--select", "XLA4", sched).output)["findings"]
    assert {(f["line"], f["code"]) for f in hot_only} == {(16, "XLA401")}  # the else branch is every step
    both = json.loads(run("lint", "--format", "json", "--port-cpu", "--select", "XLA4", "--include-cold", sched).output)["findings"]
    by_line = {(f["line"], f["code"]): f["message"] for f in both}
    assert "once per call (in `index_for_timestep()`)" in by_line[(6, "XLA401")]


# ------------------------------------------------------------------ suppressions and config (issue 13, part)


def test_noqa_with_xlaport_codes_and_file_level_ignore(tmp_path):
    f = tmp_path / "a.py"
    f.write_bytes(b"import torch\nx = y.cuda()  # noqa: XLA101\nz = w.cuda()  # noqa: E501\n")
    rows = json.loads(run("lint", "--format", "json", f).output)["findings"]
    assert [(r["line"], r["code"]) for r in rows] == [(3, "XLA101")]  # flake8's own noqa does not silence xlaport
    g = tmp_path / "b.py"
    g.write_bytes(b"# xlaport: ignore-file\nimport torch\nx = y.cuda()\n")
    assert run("lint", g).exit_code == 0
    assert run("convert", g).exit_code == 0 and g.read_bytes().endswith(b"x = y.cuda()\n")


def test_config_is_checked_strictly(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.xlaport]\nselct = ["XLA1"]\n')
    (tmp_path / "a.py").write_bytes(CUDA)
    result = run("lint", tmp_path / "a.py")
    assert result.exit_code == 2 and "unknown key 'selct'" in result.output and "did you mean 'select'" in result.output
    (tmp_path / "pyproject.toml").write_text('[tool.xlaport]\nprints = "loud"\n')
    result = run("lint", tmp_path / "a.py")
    assert result.exit_code == 2 and "prints must be one of" in result.output and "XLA001" not in result.output


def test_per_file_ignores_and_extend_select(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.xlaport]\nselect = ["XLA4"]\nextend-select = ["XLA101"]\n'
        'per-file-ignores = {"scripts/*.py" = ["XLA101"]}\n')
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "a.py").write_bytes(b"import torch\nx = y.cuda()\n")
    (tmp_path / "b.py").write_bytes(b"import torch\nx = y.cuda()\n")
    rows = json.loads(run("lint", "--format", "json", tmp_path).output)["findings"]
    assert [(Path(r["path"]).name, r["code"]) for r in rows] == [("b.py", "XLA101")]


def test_installed_and_built_code_is_not_scanned(tmp_path):
    for d in ("site-packages/pkg", "build/lib", "dist", "__pypackages__/x", "src"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "m.py").write_bytes(CUDA)
    rows = json.loads(run("lint", "--format", "json", tmp_path).output)["findings"]
    assert {Path(r["path"]).parent.name for r in rows} == {"src"}




def test_the_console_script_exits_with_the_commands_status_and_all_its_output(tmp_path):
    """`python -m xlaport` (the console script's `entry`) ends `lint` and
    `convert` without the interpreter's teardown: the exit status is the
    command's, the report on a pipe is whole, a converted file is written
    whole, and a command that keeps a normal exit (`rules`) exits as before."""
    many = tmp_path / "many.py"
    many.write_bytes(b"import torch\n" + b"".join(b"x%d = torch.zeros(2).cuda()\n" % i for i in range(300)))
    clean = tmp_path / "clean.py"
    clean.write_text("print('hi')\n")
    bad = tmp_path / "bad.py"
    bad.write_text("x = (\n")

    def console(*args):
        return subprocess.run([sys.executable, "-m", "xlaport", *map(str, args)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)

    assert console("lint", clean).returncode == 0
    report = console("lint", "--no-cache", "--format", "json", many)
    assert report.returncode == 1 and len(json.loads(report.stdout)["findings"]) == 300
    assert console("lint", bad).returncode == 2
    done = console("convert", "--no-cache", many)
    assert done.returncode == 0, done.stderr
    text = many.read_text()
    assert text.count("torch_xla.device()") == 300 and ".cuda()" not in text
    assert console("rules").returncode == 0 and "XLA101" in console("rules").stdout
