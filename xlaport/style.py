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
import hashlib
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


# where Ruff finds the configuration of a file: the nearest of these in its
# directory or above (a pyproject.toml counts where it holds [tool.ruff]),
# else the user's own
_CONFIGS = ("pyproject.toml", "ruff.toml", ".ruff.toml")


def style_key(path: str) -> str:
    """What the style `convert` writes for ``path`` depends on: the Ruff
    version and the Ruff configuration that applies there (every candidate
    file from its directory up, and the user's: a superset, so a change to
    any of them restyles)."""
    directory = os.path.dirname(os.path.abspath(path or "converted.py"))
    return f"{ruff_version()} {_config_digest(_config_files(directory))}"


def _config_files(directory: str):  # type: ignore[no-untyped-def]
    """(path, size, mtime) of every configuration file Ruff may read for a
    file in ``directory`` (stat calls only: the digest is cached by them)."""
    home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    found = []
    for candidate in [os.path.join(home, "ruff", "ruff.toml")] + [
            os.path.join(d, name) for d in _ancestors(directory) for name in _CONFIGS]:
        try:
            st = os.stat(candidate)
            found.append((candidate, st.st_size, st.st_mtime_ns))
        except OSError:
            continue
    return tuple(found)


def _ancestors(directory: str) -> List[str]:
    out = [directory]
    while os.path.dirname(out[-1]) != out[-1]:
        out.append(os.path.dirname(out[-1]))
    return out


@lru_cache(maxsize=256)
def _config_digest(files) -> str:  # type: ignore[no-untyped-def]
    h = hashlib.sha256()
    for path, _, _ in files:
        try:
            with open(path, "rb") as fh:
                h.update(path.encode() + b"\0" + fh.read())
        except OSError:
            continue
    return h.hexdigest()[:20]


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
