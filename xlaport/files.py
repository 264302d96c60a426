"""Finding files, reading them safely, writing them atomically.

Nothing here ever leaves a file half-written: output goes to a temporary file
in the same directory, gets the original's permission bits, and is renamed over
the target in one step.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

SOURCE_SUFFIXES = (".py", ".ipynb")
TEMP_SUFFIX = ".xlaport-tmp"
SKIP_DIRS = {
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".venv",
    "venv",
    ".eggs",
    "node_modules",
    ".ipynb_checkpoints",
    # Ruff's defaults too: installed and built code is not the project's
    "site-packages",
    "__pypackages__",
    "_build",
    "build",
    "dist",
    "buck-out",
    ".direnv",
    ".pytype",
}


class FileProblem(Exception):
    """A file that cannot be processed, with the reason."""


@dataclass(frozen=True)
class Entry:
    path: Path  # as the user will see it
    root: Optional[Path]  # the directory argument it was found under (None: given directly)
    notice: Optional[str] = None  # set when the entry is skipped, not processed
    error: Optional[str] = None  # set when the entry cannot be processed at all
    data: Optional[bytes] = None  # the text itself, when it came on standard input

    @property
    def relative(self) -> Path:
        if self.root is None:
            return Path(self.path.name)
        return self.path.relative_to(self.root)


def discover(paths: Sequence[str], exclude: Sequence[str] = (), force_exclude: bool = False,
             respect_gitignore: bool = True, missing_ok: bool = False) -> List[Entry]:
    """Expand files and directories into entries, sorted, without duplicates.

    Directory walks skip hidden and tool directories, files git ignores
    (``respect_gitignore``) and ``exclude`` globs, never follow directory
    symlinks (so a symlink loop cannot hang the walk) and skip file symlinks
    with a notice (converting through a link would replace it with a file).
    A file named on the command line is taken as it is, unless
    ``force_exclude`` (then ``exclude`` and the skipped directories apply to
    it too).  ``missing_ok``: a named file that does not exist is left out
    (a file a PR deleted, with ``--diff-base``).
    """
    seen: Dict[str, Entry] = {}  # absolute path -> its entry
    entries: List[Entry] = []
    walked: List[Entry] = []

    def add(entry: Entry) -> None:
        key = os.path.abspath(entry.path)
        if key not in seen:
            seen[key] = entry
            entries.append(entry)

    for raw in paths:
        p = Path(raw)
        if p.is_symlink():
            if not p.exists():
                add(Entry(p, None, error="broken or looping symbolic link"))
            else:
                add(Entry(p, None, notice="symbolic link: convert the file it points to instead"))
            continue
        if not p.exists():
            if not missing_ok:
                add(Entry(p, None, error="no such file or directory"))
            continue
        special = _not_regular(p)
        if special:
            add(Entry(p, None, error=special))
            continue
        if p.is_file():
            if force_exclude and (_excluded(str(p), exclude) or _in_skipped_dir(p)):
                continue
            add(Entry(p, None))
            continue
        for found in _walk(p, exclude):
            walked.append(found)
            add(found)
    if respect_gitignore and walked:
        from xlaport.vcs import ignored

        # a directory named on the command line is walked even when git
        # ignores it (the user asked for it); what git ignores inside it is not
        roots = {e.root for e in walked if e.root is not None}
        asked = {os.path.abspath(r) for r in ignored([r / "." for r in roots])} if roots else set()
        inside = {r for r in roots if os.path.abspath(r) not in asked}
        drop = {os.path.abspath(p) for p in ignored([e.path for e in walked if not e.error and e.root in inside])}
        kept = {id(e) for key, e in seen.items() if key not in drop}
        entries = [e for e in entries if e.root is None or id(e) in kept]
    return entries


def _in_skipped_dir(path: Path) -> bool:
    return any(part in SKIP_DIRS or part.endswith(".egg-info") for part in path.parent.parts)


def _excluded(rel: str, exclude: Sequence[str]) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(rel, pat) or fnmatch(os.path.basename(rel), pat) for pat in exclude)


def _walk(root: Path, exclude: Sequence[str]) -> Iterator[Entry]:
    """The source files under ``root``, in ``os.walk``'s top-down order with
    names sorted; read with ``os.scandir``, whose entries know a file's kind
    from the directory itself (no ``stat`` per file on the usual file
    systems: a warm run over a large tree is mostly this walk)."""
    stack = [str(root)]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                found = list(it)
        except OSError:
            continue  # (os.walk's default: an unreadable directory is passed over)
        dirs, files = [], []
        for e in found:
            try:
                is_dir = e.is_dir()  # (follows a link, as os.walk does: a linked directory is not walked)
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(e)
        base = Path(top)
        for e in sorted(files, key=lambda e: e.name):
            name = e.name
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            path = base / name
            if exclude and _excluded(str(path.relative_to(root)), exclude):
                continue
            if e.is_symlink():
                if not path.exists():
                    yield Entry(path, root, error="broken or looping symbolic link")
                else:
                    yield Entry(path, root, notice="symbolic link: not converted through (an output tree gets "
                                                    "the link itself)")
                continue
            special = None if e.is_file(follow_symlinks=False) else _not_regular(path)
            yield Entry(path, root, error=special) if special else Entry(path, root)
        kept = sorted(
            d.name
            for d in dirs
            if d.name not in SKIP_DIRS
            and not d.name.endswith(".egg-info")
            and not (d.name.startswith(".") and d.name not in (".", ".."))
            and not d.is_symlink()
            and not (exclude and _excluded(str((base / d.name).relative_to(root)), exclude))
        )
        stack.extend(os.path.join(top, d) for d in reversed(kept))


def _not_regular(path: Path) -> Optional[str]:
    """Why ``path`` is not a regular file or a directory (a FIFO, a device,
    a socket), or None.  Reading a FIFO would wait for a writer forever."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None  # reported when it is read
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")
    return f"not a regular file but {kind}; not read"


def read_bytes(path: Path) -> bytes:
    """The bytes of a regular file.  Opened without blocking and checked
    before reading, so that a FIFO that appeared after discovery cannot
    hang the run."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except PermissionError:
        raise FileProblem("permission denied (cannot read)") from None
    except IsADirectoryError:
        raise FileProblem("is a directory") from None
    except OSError as exc:
        raise FileProblem(f"cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise FileProblem("is a directory")
        if not stat.S_ISREG(mode):
            raise FileProblem(_not_regular(path) or "not a regular file; not read")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise FileProblem(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if b"\0" in data:
        raise FileProblem("binary file (contains NUL bytes)")
    return data


def check_writable(path: Path) -> None:
    """Refuse to replace a file its owner marked read-only (root included:
    the rename would succeed, but the user asked for the file to be kept)."""
    if not path.exists():
        return
    mode = path.stat().st_mode
    if not (mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) or not os.access(path, os.W_OK):
        raise FileProblem("file is read-only; left unchanged")


def atomic_write(path: Path, data: bytes, like: Optional[Path] = None, expected: Optional[bytes] = None) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    Permission bits, owner and group come from ``like`` (default: the file
    being replaced; the owner only where this process may give it, as root
    in a CI container).  ``expected``: what the file must still hold -- one
    edited since it was read is left as it is (FileProblem).  A file with
    other hard links is rewritten in place, signals held off while it is,
    so that every name of it sees the new text (a rename would give this
    name a new inode and leave the others on the old text).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    source_stat = None
    for candidate in (like, path):
        if candidate is not None and candidate.exists():
            source_stat = candidate.stat()
            break
    if expected is not None and _current(path) != expected:
        raise FileProblem("changed during the run (edited while xlaport read it): left as it is; run again")
    if like is None and source_stat is not None and source_stat.st_nlink > 1 and stat.S_ISREG(source_stat.st_mode):
        _rewrite_in_place(path, data)
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if source_stat is not None:
            os.chmod(tmp, stat.S_IMODE(source_stat.st_mode))
            if like is None:
                _keep_owner(tmp, source_stat)
        else:  # a new file: the mode open() would give it (mkstemp's is 0600)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def same_file(a: Path, b: Path) -> bool:
    """One file under two names (the same path, a symlink, a hard link)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def write_report(path: Path, data: bytes) -> None:
    """A report (``--output-file``, ``--json``) written by replacement: a
    name that is a hard link of another file gets a file of its own, and
    the other names keep their content.  Its folder must exist."""
    if not path.parent.is_dir():
        raise FileNotFoundError(2, "No such file or directory", str(path.parent))
    atomic_write(path, data, like=path if path.is_file() else None)


def _current(path: Path) -> Optional[bytes]:
    try:
        return read_bytes(path)
    except FileProblem:
        return None


def _keep_owner(path: str, st: os.stat_result) -> None:
    if (st.st_uid, st.st_gid) == (os.getuid(), os.getgid()) or not hasattr(os, "chown"):
        return
    for uid, gid in ((st.st_uid, st.st_gid), (-1, st.st_gid)):  # the group alone, where the owner cannot be given
        try:
            os.chown(path, uid, gid)
            return
        except OSError:
            continue


UNDO_SUFFIX = ".xlaport-undo"


def _journal(path: Path) -> Path:
    return path.parent / f".{path.name}.{os.getpid()}{UNDO_SUFFIX}"


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """Replace a hard-linked file's content, keeping its inode.  The old
    content is first kept whole beside it (``.NAME.PID.xlaport-undo``, made
    by a rename): a run killed, crashed or cut off by a power failure while
    the file is half rewritten leaves that journal, and the next run puts
    the old content back (:func:`undo_interrupted`).  SIGINT and SIGTERM
    wait until the content is whole (a few system calls)."""
    import signal

    journal = _journal(path)
    atomic_write(journal, read_bytes(path), like=path)
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held) if hasattr(signal, "pthread_sigmask") else None
    try:
        _overwrite(path, data)
        os.unlink(journal)
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _overwrite(path: Path, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.write(data)
        fh.truncate()
        fh.flush()
        os.fsync(fh.fileno())


# a file changed this long after its journal was made was changed by someone
# else than the run that died rewriting it (that rewrite follows in milliseconds)
_EDITED_AFTER = 60 * 10**9


def _named(directory: Path, suffix: str) -> List[str]:
    """The names of the files in ``directory`` that end in ``suffix`` (what
    an interrupted run of ours may have left there)."""
    try:
        return [e.name for e in os.scandir(directory) if e.name.endswith(suffix) and e.is_file()]
    except OSError:
        return []


def undo_interrupted(directories: Iterable[Path]) -> List[Path]:
    """Files of ``directories`` that a killed run was rewriting in place,
    given their old content back from its journal (whose writer is gone:
    a running writer's is left alone).  Returns the files restored."""
    restored: List[Path] = []
    for directory in directories:
        for name in _named(directory, UNDO_SUFFIX):
            target, _, pid = name[1:-len(UNDO_SUFFIX)].rpartition(".")
            if not target or not pid.isdigit() or _alive(int(pid)):
                continue
            journal, path = Path(directory) / name, Path(directory) / target
            try:
                if path.is_file() and path.stat().st_mtime_ns > journal.stat().st_mtime_ns + _EDITED_AFTER:
                    continue  # changed since the run died (by hand?): never overwritten; the journal stays
                if path.is_file() and not path.is_symlink() and read_bytes(path) != read_bytes(journal):
                    _overwrite(path, read_bytes(journal))
                    restored.append(path)
                os.unlink(journal)
            except (OSError, FileProblem):
                continue
    return restored


def remove_stale_temps(directories: Iterable[Path]) -> List[Path]:
    """Delete temporary files that a killed run left in ``directories``: ours
    carry the writer's pid, and a file whose writer is gone is stale.  (A
    running writer's file is left alone: parallel runs stay safe.)"""
    removed: List[Path] = []
    for directory in directories:
        for name in _named(directory, TEMP_SUFFIX):
            parts = name.rsplit(".", 3)  # .<file>.<pid>.<random>.xlaport-tmp
            pid = int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None
            if pid is not None and _alive(pid):
                continue
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(Path(directory) / name)
            except OSError:
                pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True
