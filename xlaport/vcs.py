"""What git knows: lines changed since a ref (``--diff-base``) and ignored
files (``.gitignore``), read through the ``git`` command."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Set

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class GitError(Exception):
    pass


def _git(args: Sequence[str], cwd: Path, stdin: Optional[bytes] = None, ok=(0,)) -> bytes:
    try:
        proc = subprocess.run(["git", "-c", "core.quotepath=off", *args], cwd=cwd, input=stdin,
                              capture_output=True)
    except OSError as exc:
        raise GitError(f"cannot run git: {exc}") from None
    if proc.returncode not in ok:
        raise GitError(proc.stderr.decode(errors="replace").strip() or f"git {args[0]} failed")
    return proc.stdout


def repo_root(start: Path) -> Optional[Path]:
    try:
        out = _git(["rev-parse", "--show-toplevel"], start if start.is_dir() else start.parent)
    except GitError:
        return None
    return Path(out.decode().strip())


def changed_lines(base: str, start: Path) -> Dict[str, FrozenSet[int]]:
    """``absolute path -> lines (1-based) added or changed since base``, for
    every file that differs from ``base`` in the working tree, untracked files
    included (all their lines).  Raises GitError outside a repository or for
    an unknown ref."""
    root = repo_root(start)
    if root is None:
        raise GitError(f"{start} is not in a git repository (needed by --diff-base)")
    _git(["rev-parse", "--verify", "--quiet", f"{base}^{{commit}}"], root)
    diff = _git(["diff", "--unified=0", "--no-color", "--no-ext-diff", "--no-renames", base, "--"], root)
    out: Dict[str, Set[int]] = {}
    current: Optional[Set[int]] = None
    for raw in diff.decode("utf-8", "surrogateescape").splitlines():
        if raw.startswith("+++ "):
            name = raw[4:]
            current = None if name == "/dev/null" else out.setdefault(str(root / name[2:]), set())
        elif raw.startswith("@@") and current is not None:
            m = _HUNK.match(raw)
            if m:
                first, count = int(m.group(1)), int(m.group(2) or 1)
                current.update(range(first, first + count))
    untracked = _git(["ls-files", "--others", "--exclude-standard", "-z"], root)
    for name in filter(None, untracked.decode("utf-8", "surrogateescape").split("\0")):
        path = root / name
        try:
            n = path.read_bytes().count(b"\n") + 1
        except OSError:
            continue
        out[str(path)] = set(range(1, n + 1))
    return {k: frozenset(v) for k, v in out.items()}


def ignored(paths: List[Path]) -> Set[Path]:
    """The paths that git ignores (``.gitignore``, ``.git/info/exclude``),
    asked once per repository; nothing outside a repository."""
    by_root: Dict[Path, Dict[str, Path]] = {}
    real_dirs: Dict[str, str] = {}
    for p in paths:
        folder, name = os.path.split(p)
        root = _root_of(folder)
        if root is not None:  # (as git names it: its folder resolved, a link itself not followed)
            if folder not in real_dirs:
                real_dirs[folder] = os.path.realpath(folder or ".")
            by_root.setdefault(root, {})[os.path.join(real_dirs[folder], name)] = p
    found: Set[Path] = set()
    for root, real in by_root.items():
        data = b"\0".join(os.fsencode(k) for k in real) + b"\0"
        try:  # (a tracked file is never ignored: git's own rule)
            out = _git(["check-ignore", "--stdin", "-z"], root, stdin=data, ok=(0, 1))
        except GitError:
            continue
        found.update(real[k] for k in (os.fsdecode(x) for x in out.split(b"\0") if x) if k in real)
    return found


_ROOTS: Dict[str, Optional[Path]] = {}


def _root_of(directory: str) -> Optional[Path]:
    """The repository holding ``directory`` (looked up once per directory,
    as given and resolved; a walk up stops at a folder already looked up).
    Strings, not Paths: a warm run asks for every file of a tree."""
    if directory in _ROOTS:  # (most files share their directory)
        return _ROOTS[directory]
    walked = [directory]
    cur = os.path.realpath(directory or ".")
    root: Optional[Path] = None
    while cur not in _ROOTS:
        walked.append(cur)
        if os.path.exists(os.path.join(cur, ".git")):
            root = Path(cur)
            break
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    else:
        root = _ROOTS[cur]
    for d in walked:
        _ROOTS[d] = root
    return root
