"""File discovery (``xlaport.files.discover``): which files a run reads, in
which order, and what it says of the ones it does not read."""

import os
import shutil
import subprocess

import pytest

from xlaport.files import discover


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "proj"
    for rel in ("x.py", "a/y.py", "a/b/z.py", ".hid/h.py", "node_modules/n.py", "c.egg-info/e.py", "ign/i.py",
                "a/q.skip.py", "a/n.ipynb", "a/t.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("import torch\n")
    (root / ".gitignore").write_text("ign/\n*.skip.py\n")
    (root / "linkdir").symlink_to("a")
    (root / "link.py").symlink_to("x.py")
    (root / "broken.py").symlink_to("nowhere.py")
    os.mkfifo(root / "a" / "fifo.py")
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def _seen(entries, root):
    return [(str(e.path.relative_to(root)), e.error is not None, e.notice is not None) for e in entries]


@pytest.mark.skipif(not shutil.which("git"), reason="git is needed to read .gitignore")
def test_a_walk_is_sorted_depth_first_and_skips_what_it_must(tree):
    """Files of a directory (sorted) before its subdirectories (sorted);
    hidden, tool and git-ignored directories and files left out; a linked
    directory not walked; a file link and a broken link named, not read; a
    FIFO named as such, never opened."""
    assert _seen(discover([str(tree)]), tree) == [
        ("broken.py", True, False), ("link.py", False, True), ("x.py", False, False),
        ("a/fifo.py", True, False), ("a/n.ipynb", False, False), ("a/y.py", False, False),
        ("a/b/z.py", False, False)]
    assert [r for r, _, _ in _seen(discover([str(tree)], ["*/b/*"]), tree)] == [
        "broken.py", "link.py", "x.py", "a/fifo.py", "a/n.ipynb", "a/y.py"]


def test_a_file_named_twice_is_read_once(tree):
    entries = discover([str(tree / "a"), str(tree / "a" / "y.py"), str(tree / "x.py")], respect_gitignore=False)
    rels = [str(e.path.relative_to(tree)) for e in entries]
    assert rels.count("a/y.py") == 1 and rels[-1] == "x.py", rels
