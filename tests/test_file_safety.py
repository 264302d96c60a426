"""Nothing a user did not ask to be replaced is ever replaced (issue 26):
output trees, edits made during a run, the cache, the report file, owners
and hard links, special files, interrupted writes, dying workers."""

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import xlaport.cli as cli
from tests.conftest import cli as xlaport
from xlaport.cache import Cache
from xlaport.cli import main
from xlaport.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
CUDA = "import torch\nx = torch.zeros(2).cuda()\n"
OTHER = "import torch\ny = torch.ones(2).cuda()\n"


def digest(tree: Path):
    return {p.relative_to(tree).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ output trees (items 1, 2)

def test_input_inside_the_output_is_refused_before_anything_is_written(tmp_path):
    proj = tmp_path / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "x.py").write_text(CUDA)
    (proj / "sub" / "x.py").write_text(OTHER)
    before = digest(proj)
    result = xlaport("convert", proj / "sub", "-o", proj)
    assert result.exit_code == 2
    assert "inside output directory" in result.output
    assert digest(proj) == before


def test_two_sources_with_one_destination_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.py").write_text(CUDA)
    (tmp_path / "b" / "x.py").write_text(OTHER)
    result = xlaport("convert", tmp_path / "a" / "x.py", tmp_path / "b" / "x.py", "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert "would both be written to" in result.output
    assert not (tmp_path / "out").exists()


def test_an_existing_file_in_the_output_is_replaced_only_if_it_is_our_untouched_output(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "train.py").write_text(CUDA)
    (src / "data.txt").write_text("1 2 3\n")
    out.mkdir()
    (out / "train.py").write_text("# my own notes, not a conversion\n")
    result = xlaport("convert", src, "-o", out)
    assert result.exit_code == 2
    assert "is not an earlier output of" in result.output
    assert (out / "train.py").read_text() == "# my own notes, not a conversion\n"
    assert (out / "data.txt").read_text() == "1 2 3\n"  # the rest still went through
    (out / "train.py").unlink()
    assert xlaport("convert", src, "-o", out).exit_code == 0
    assert "torch_xla" in (out / "train.py").read_text()
    # a second run over its own output: allowed, and the result is the same
    (src / "train.py").write_text(CUDA + "z = torch.zeros(3).cuda()\n")
    assert xlaport("convert", src, "-o", out).exit_code == 0
    assert "z = torch.zeros(3).to(torch_xla.device())" in (out / "train.py").read_text()
    # edited by the user since: kept
    (out / "train.py").write_text((out / "train.py").read_text() + "# tuned by hand\n")
    (src / "data.txt").write_text("4 5 6\n")
    result = xlaport("convert", src, "-o", out)
    assert result.exit_code == 2 and "was edited after xlaport wrote it" in result.output
    assert (out / "train.py").read_text().endswith("# tuned by hand\n")
    assert (out / "data.txt").read_text() == "4 5 6\n"  # our own copy, untouched since: refreshed


def test_stale_temporary_files_in_the_output_tree_are_removed(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "train.py").write_text(CUDA)
    assert xlaport("convert", src, "-o", out).exit_code == 0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / f".train.py.{dead.pid}.abcd.xlaport-tmp"
    stale.write_text("half")
    result = xlaport("convert", src, "-o", out)
    assert result.exit_code == 0 and not stale.exists()
    assert "removed a temporary file" in result.output


# ------------------------------------------------------------------ edits during a run (item 3)

def test_a_file_edited_during_the_run_is_left_as_it_is(tmp_path, monkeypatch):
    f = tmp_path / "train.py"
    f.write_text(CUDA)
    real = cli.process

    def process_then_edit(*args, **kwargs):
        results = real(*args, **kwargs)
        f.write_text(CUDA + "# saved by the editor meanwhile\n")
        return results

    monkeypatch.setattr(cli, "process", process_then_edit)
    result = xlaport("convert", f)
    assert result.exit_code == 2
    assert "changed during the run" in result.output
    assert f.read_text().endswith("# saved by the editor meanwhile\n")
    assert "0 file(s) changed" in result.output


# ------------------------------------------------------------------ the cache (item 5)

@pytest.fixture
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("XLAPORT_NO_CACHE", raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("XLAPORT_CACHE_DIR", str(cache))
    return cache


def _entry_file(cache_dir: Path, path: Path, data: bytes, options=None) -> Path:
    cache = Cache(cache_dir, Settings(options=options or {}))
    key = cache.key(str(path), data)
    return cache._file(key)


def test_a_planted_cache_entry_never_reaches_a_source_file(cache_dir, tmp_path):
    f = tmp_path / "train.py"
    f.write_text(CUDA)
    assert xlaport("convert", "--check", f).exit_code == 1  # fills the cache
    entry = _entry_file(cache_dir, f, CUDA.encode())
    assert entry.exists()
    clean = json.loads(entry.read_text())
    planted = "aW1wb3J0IG9zOyBvcy5zeXN0ZW0oJ2V2aWwnKQo="  # base64 of `import os; os.system('evil')`
    for field in ("output", "styled"):  # (fields of an older format: not read)
        entry.write_text(json.dumps({**clean, field: planted, "same": False}))
        assert xlaport("convert", "--diff", f).exit_code == 1
        assert xlaport("convert", f).exit_code == 0
        assert "evil" not in f.read_text() and "torch_xla" in f.read_text()
        f.write_text(CUDA)
    # the outputs an entry names by their digests, planted in their files
    outputs = sorted((entry.parent.parent / "out").iterdir())
    assert len(outputs) == 1  # (the output, which Ruff leaves as it is: one text, kept once)
    for kept in outputs:
        kept.write_text("import os; os.system('evil')\n")
        assert xlaport("convert", "--diff", f).exit_code == 1
        assert xlaport("convert", f).exit_code == 0
        assert "evil" not in f.read_text() and "torch_xla" in f.read_text()
        f.write_text(CUDA)


def test_what_a_cache_entry_names_is_never_read_or_removed_outside_the_cache(cache_dir, tmp_path):
    """An entry names its output and its dependency groups by digest; the
    cache removes a damaged one.  A name that is a path (`../../victim`)
    is a miss: nothing outside the cache is opened or removed."""
    f = tmp_path / "train.py"
    f.write_text(CUDA)
    assert xlaport("convert", "--check", f).exit_code == 1  # fills the cache
    entry = _entry_file(cache_dir, f, CUDA.encode())
    clean = json.loads(entry.read_text())
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / "victim.json").write_text("keep me too\n")
    (entry.parent.parent / "deps").mkdir(exist_ok=True)  # (so that a path through it resolves)
    up = os.path.relpath(victim, entry.parent.parent / "out")
    for planted in ({"output_sha": up, "styled_sha": up, "same": False},
                    {"deps": [os.path.relpath(victim, entry.parent.parent / "deps")]}):
        entry.write_text(json.dumps({**clean, **planted}))
        assert xlaport("convert", f).exit_code == 0
        assert victim.read_text() == "keep me\n" and (tmp_path / "victim.json").read_text() == "keep me too\n"
        assert "torch_xla" in f.read_text()
        f.write_text(CUDA)


def test_a_cache_entry_of_the_wrong_shape_is_a_miss_not_a_crash(cache_dir, tmp_path):
    f = tmp_path / "train.py"
    f.write_text(CUDA)
    assert xlaport("lint", f).exit_code == 1
    entry = _entry_file(cache_dir, f, CUDA.encode())
    data = json.loads(entry.read_text())
    data["findings"] = [["XLA101", 7, "x", None, "yes", None, None, 0, 0]]
    data["cuda"] = "many"
    entry.write_text(json.dumps(data))
    result = xlaport("lint", "--format", "concise", f)
    assert result.exit_code == 1 and "XLA101" in result.output


def test_the_cache_is_private_to_its_user(cache_dir, tmp_path):
    f = tmp_path / "train.py"
    f.write_text(CUDA)
    xlaport("lint", f)
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    for sub in cache_dir.iterdir():
        if sub.is_dir():
            assert stat.S_IMODE(sub.stat().st_mode) == 0o700


# ------------------------------------------------------------------ the report file (item 6)

@pytest.mark.parametrize("command", ["lint", "convert"])
def test_an_output_file_that_is_an_input_is_refused(tmp_path, command):
    f = tmp_path / "train.py"
    f.write_text(CUDA)
    result = xlaport(command, f, "--output-file", f)
    assert result.exit_code == 2 and "is an input file" in result.output
    assert f.read_text() == CUDA


# ------------------------------------------------------------------ owner, mode, hard links (item 7)

def test_a_hard_linked_file_keeps_its_inode_and_every_name_sees_the_conversion(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(CUDA)
    os.chmod(f, 0o640)
    link = tmp_path / "same_file.py"
    os.link(f, link)
    inode = f.stat().st_ino
    assert xlaport("convert", f).exit_code == 0
    assert f.stat().st_ino == inode and link.read_text() == f.read_text()
    assert "torch_xla" in link.read_text()
    assert stat.S_IMODE(f.stat().st_mode) == 0o640


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can give a file away")
def test_converting_as_root_keeps_the_files_owner_and_group(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(CUDA)
    os.chown(f, 4321, 4322)
    assert xlaport("convert", f).exit_code == 0
    st = f.stat()
    assert (st.st_uid, st.st_gid) == (4321, 4322)
    assert "torch_xla" in f.read_text()


# ------------------------------------------------------------------ special files (items 9, 11)

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_and_devices_are_reported_not_read(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    os.mkfifo(tree / "pipe.py")
    (tree / "gpu.py").write_text(CUDA)
    cmd = [sys.executable, "-m", "xlaport", "lint", "--format", "concise", "--no-cache"]
    walked = subprocess.run(cmd + [str(tree)], capture_output=True, text=True, timeout=60)
    assert walked.returncode == 2
    assert "pipe.py:1:1: XLA001 not a regular file but a FIFO" in walked.stdout
    assert "gpu.py:2:5: XLA101" in walked.stdout
    named = subprocess.run(cmd + [str(tree / "pipe.py"), "/dev/null"], capture_output=True, text=True, timeout=60)
    assert named.returncode == 2
    assert "/dev/null:1:1: XLA001 not a regular file but a character device" in named.stdout
    assert "All checks passed" not in named.stdout + named.stderr


def test_a_looping_symlink_named_first_is_a_file_error_not_a_traceback(tmp_path):
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    (tmp_path / "gpu.py").write_text(CUDA)
    result = subprocess.run([sys.executable, "-m", "xlaport", "lint", "--format", "concise", "--no-cache",
                             str(tmp_path / "a.py"), str(tmp_path / "gpu.py")], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "a.py:1:1: XLA001 broken or looping symbolic link" in result.stdout
    assert "gpu.py:2:5: XLA101" in result.stdout


# ------------------------------------------------------------------ interrupted writes (item 12)

def test_sigterm_while_writing_leaves_every_file_whole_and_says_so(tmp_path, monkeypatch):
    files = [tmp_path / f"f{k}.py" for k in range(3)]
    for f in files:
        f.write_text(CUDA)
    real_fsync = os.fsync
    calls = []

    def fsync_then_term(fd):
        real_fsync(fd)
        calls.append(fd)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the second file is being written

    monkeypatch.setattr(os, "fsync", fsync_then_term)
    result = CliRunner().invoke(main, ["convert", "-j", "1", *map(str, files)])
    assert result.exit_code == 143
    assert "interrupted while writing" in result.output
    texts = [f.read_text() for f in files]
    assert texts[0] != CUDA and all(t in (CUDA, texts[0]) for t in texts)  # converted or untouched, never half
    assert not list(tmp_path.glob("*.xlaport-tmp"))


# ------------------------------------------------------------------ read-only files (item 13)

@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX modes")
def test_a_read_only_file_is_an_error_and_not_counted_as_converted(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(CUDA)
    os.chmod(f, 0o444)
    result = xlaport("convert", f)
    assert result.exit_code == 2
    assert "read-only" in result.output
    assert "0 file(s) changed (0 rewrite(s))" in result.output
    assert "XLA101 [*]" not in result.output
    assert "0 rewritten (0%)" in result.output
    assert f.read_text() == CUDA


# ------------------------------------------------------------------ dying workers (item 8)

def test_a_file_that_kills_its_worker_is_reported_and_the_rest_finish(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for k in range(6):
        (tree / f"ok{k}.py").write_text(CUDA)
    # LibCST's native parser crashes (segfault) on 5,000 nested brackets;
    # --no-prefilter skips the check that otherwise reports it before LibCST sees it
    (tree / "deep.py").write_text(CUDA + "y = " + "[" * 5000 + "]" * 5000 + "\n")
    result = subprocess.run([sys.executable, "-m", "xlaport", "lint", "--format", "concise", "--no-cache",
                             "--no-prefilter", "-j", "2", str(tree)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "BrokenProcessPool" not in result.stderr and "Traceback" not in result.stderr
    assert "deep.py:1:1: XLA001 the process converting this file died" in result.stdout
    assert result.stdout.count("XLA101") == 6
    checked = subprocess.run([sys.executable, "-m", "xlaport", "lint", "--format", "concise", "--no-cache",
                              str(tree / "deep.py")], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 2 and "too many nested parentheses" in checked.stdout  # in-process: said, not crashed


def test_a_broken_pool_leaves_no_manager_thread_for_the_exit_hook():
    # concurrent.futures' exit hook writes to each pool's wake-up pipe while a
    # broken pool's manager thread may be closing it (Python 3.11: "OSError:
    # Bad file descriptor" at exit); every pool a run gives up is waited for.
    # (In a process of its own: the dying workers' fault reports stay in it.)
    script = textwrap.dedent(f"""
        import threading
        from xlaport import runner
        from xlaport.settings import Settings

        cuda = {CUDA!r}
        deep = (cuda + "y = " + "[" * 5000 + "]" * 5000 + "\\n").encode()
        settings = Settings(prefilter=False)
        jobs_in = [(f"ok{{k}}.py", cuda.encode(), settings) for k in range(6)] + [("deep.py", deep, settings)]
        outcomes = [outcome for outcome, _ in runner._run(jobs_in, 2, None)]
        assert outcomes[-1][2][0] == runner.DIED and all(o[2] is None for o in outcomes[:-1])
        managers = [t for t in threading.enumerate()
                    if type(t).__name__ == "_ExecutorManagerThread" and t.is_alive()]
        print("managers left:", len(managers))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert "managers left: 0" in result.stdout, result.stdout + result.stderr


def test_a_hard_linked_file_killed_mid_rewrite_gets_its_old_content_back(tmp_path):
    """Issue 42, item 5: a hard-linked file is rewritten in place (write,
    then truncate).  A SIGKILL between the two left the conversion followed
    by the original's tail under every name.  Now the old content is kept
    beside it first, and the next run puts it back."""
    f = tmp_path / "train.py"
    original = CUDA + "# a long tail that the shorter conversion would leave behind\n" * 40
    f.write_text(original)
    link = tmp_path / "same_file.py"
    os.link(f, link)
    dying = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "import xlaport.files as files\n"
        "real_open = open\n"
        "class Dying:\n"
        "    def __init__(self, fh): self.fh = fh\n"
        "    def __enter__(self): return self\n"
        "    def __exit__(self, *a): self.fh.close()\n"
        "    def write(self, data): return self.fh.write(data)\n"
        "    def truncate(self): self.fh.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "files.open = lambda *a, **k: Dying(real_open(*a, **k))\n"
        "files.atomic_write(Path(sys.argv[1]), b'import torch_xla\\n')\n")
    killed = subprocess.run([sys.executable, "-c", dying, str(f)], capture_output=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    torn = link.read_text()
    assert torn.startswith("import torch_xla\n") and torn != original  # the conversion, then the old tail
    journals = [p.name for p in tmp_path.iterdir() if p.name.endswith(".xlaport-undo")]
    assert len(journals) == 1, journals
    later = f.stat().st_mtime + 3600  # changed by hand an hour after the crash: never overwritten
    os.utime(f, (later, later))
    assert "its old content is back" not in xlaport("lint", f).output and f.read_text() == torn
    os.utime(f, (later - 3600, later - 3600))
    result = xlaport("lint", f)
    assert "its old content is back" in result.output
    assert f.read_text() == original and link.read_text() == original
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".xlaport-undo")]
    # and a run that is not interrupted leaves no journal behind
    assert xlaport("convert", f).exit_code == 0
    assert "torch_xla" in link.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same_file.py", "train.py"]


def test_an_output_file_that_is_a_hard_link_of_an_input_is_refused_and_reports_replace(tmp_path):
    """Issue 42, item 6: `lint x.py --output-file xh.py`, xh.py a hard link
    of x.py, wrote the report into x.py; files are compared by device and
    inode now, and a report onto a link of some other file replaces its own
    name only."""
    x = tmp_path / "x.py"
    x.write_text(CUDA)
    os.link(x, tmp_path / "xh.py")
    result = xlaport("lint", x, "--output-file", tmp_path / "xh.py")
    assert result.exit_code == 2 and "is an input file" in result.output
    assert x.read_text() == CUDA
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    os.link(notes, tmp_path / "report.txt")
    assert xlaport("lint", x, "--output-file", tmp_path / "report.txt").exit_code == 1
    assert notes.read_text() == "mine\n" and "XLA101" in (tmp_path / "report.txt").read_text()
    verified = xlaport("verify", x, "--json", tmp_path / "xh.py")
    assert verified.exit_code == 2 and "it would be replaced" in verified.output
    assert x.read_text() == CUDA


def test_a_file_that_does_not_parse_is_reported_even_with_no_trigger_word(tmp_path):
    """Issue 42, item 8: the prefilter skipped a file that holds none of the
    rules' trigger words before anything parsed it, so a syntax error there
    was never reported (exit 0).  Python's own parser reads it now."""
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    (tmp_path / "fine.py").write_text("def g():\n    return 1\n")
    result = xlaport("lint", "--format", "concise", "--no-cache", tmp_path)
    assert result.exit_code == 2, result.output
    assert "broken.py:1:7: XLA001 cannot parse: invalid syntax" in result.output
    assert "fine.py" not in result.output


def test_an_output_tree_keeps_directory_links_and_says_what_it_did_with_file_links(tmp_path):
    """Issue 42, item 9: `convert DIR -o OUT` dropped directory symlinks
    silently, and said "skipped" of a file symlink it recreates."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "train.py").write_text(CUDA)
    shared = tmp_path / "shared_data"
    shared.mkdir()
    (shared / "x.txt").write_text("1\n")
    os.symlink(shared, tree / "data")
    os.symlink("train.py", tree / "alias.py")
    out = tmp_path / "out"
    result = xlaport("convert", tree, "-o", out)
    assert result.exit_code == 0, result.output
    assert (out / "data").is_symlink() and os.readlink(out / "data") == str(shared)
    assert (out / "alias.py").is_symlink() and os.readlink(out / "alias.py") == "train.py"
    assert "skipped" not in result.output and "the link itself" in result.output
    assert xlaport("convert", tree, "-o", out).exit_code == 0  # again: the links are already there


def test_a_cr_only_file_keeps_its_last_line_ending(tmp_path):
    """Issue 42, item 10: LibCST drops the final `\\r` of a file whose lines
    end in CR alone; the conversion ends as its input did."""
    f = tmp_path / "cr.py"
    f.write_bytes(CUDA.replace("\n", "\r").encode())
    assert xlaport("convert", f, "--no-cache").exit_code == 0
    data = f.read_bytes()
    assert data.endswith(b".to(torch_xla.device())\r") and b"\n" not in data
    assert xlaport("convert", f, "--no-cache").exit_code == 0 and f.read_bytes() == data  # idempotent


def test_a_file_name_holding_a_newline_keeps_each_finding_on_one_line(tmp_path):
    (tmp_path / "a\nb.py").write_text(CUDA)
    result = xlaport("lint", "--format", "concise", "--no-cache", tmp_path)
    lines = [line for line in result.output.splitlines() if "XLA101 [*]" in line]
    assert lines and lines[0].endswith("a\\nb.py:2:5: XLA101 [*] `.cuda()` -> `.to(<XLA device>)`"), result.output
