"""Converted code keeps the style checks its input passed: Ruff's.

A rewrite can leave a line too long for the formatter, an import outside
the sorted block, an import it made unused.  Ruff (a dependency of
xlaport) is the well-kept tool that knows those rules, with the project's
own configuration (found from the file's path, as Ruff finds it).  So, for
a file a conversion changed:

* the Ruff diagnostics the *input* was free of and the output is not are
  fixed with Ruff's own safe fixes (``ruff check --fix-only``, only those
  rules);
* if the input was formatted as ``ruff format`` formats it, the output is
  formatted too (the input was already as Ruff formats it, so only the
  lines the conversion wrote change).

Nothing is done for a style the input did not follow, or when Ruff is not
installed.  Ruff answers from standard input; nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import lru_cache
from typing import List, Optional, Set


@lru_cache(maxsize=None)
def ruff_binary() -> Optional[str]:
    try:
        from ruff.__main__ import find_ruff_bin  # the ruff package's own binary

        return os.fsdecode(find_ruff_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("ruff")


@lru_cache(maxsize=None)
def ruff_version() -> str:
    ruff = ruff_binary()
    if ruff is None:
        return "none"
    try:
        return subprocess.run([ruff, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "none"


def _ruff(args: List[str], path: str, source: bytes) -> Optional[subprocess.CompletedProcess]:
    ruff = ruff_binary()
    if ruff is None:
        return None
    try:
        return subprocess.run([ruff, *args, "--stdin-filename", path or "converted.py", "-"], input=source,
                              capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None


def _codes(path: str, source: bytes) -> Optional[Set[str]]:
    """The rule codes Ruff (the project's configuration) reports on ``source``."""
    done = _ruff(["check", "--no-fix", "--output-format", "json", "--exit-zero", "--quiet"], path, source)
    if done is None or done.returncode != 0:
        return None
    try:
        return {d["code"] for d in json.loads(done.stdout or b"[]") if d.get("code")}
    except (ValueError, TypeError, KeyError):
        return None


def _formatted(path: str, source: bytes) -> Optional[bytes]:
    done = _ruff(["format", "--quiet"], path, source)
    return done.stdout if done is not None and done.returncode == 0 else None


def restyle(path: str, original: bytes, output: bytes) -> bytes:
    """``output`` (the conversion of ``original``) fixed for the Ruff rules
    and the format ``original`` already satisfied."""
    if output == original or path.endswith(".ipynb") or ruff_binary() is None:
        return output
    before = _codes(path, original)
    after = _codes(path, output)
    if before is not None and after is not None and after - before:
        fixed = _ruff(["check", "--fix-only", "--exit-zero", "--quiet", "--select", ",".join(sorted(after - before))],
                      path, output)
        if fixed is not None and fixed.returncode == 0 and fixed.stdout:
            output = fixed.stdout
    if _formatted(path, original) == original:
        formatted = _formatted(path, output)
        if formatted:
            output = formatted
    return output
