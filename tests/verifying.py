"""What the verify tests share: running `xlaport verify` from a project's
own root, converting a tree, and a digest that shows a tree was not written."""

import hashlib
import json
import os
import shutil
from pathlib import Path

from click.testing import CliRunner

from xlaport.cli import main

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = ROOT / "fixtures" / "projects"


def multi_file(tmp_path: Path) -> Path:
    """The multi-file trainer, as a user's checkout."""
    dest = tmp_path / "multi_file"
    shutil.copytree(PROJECTS / "multi_file", dest)
    return dest


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


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
