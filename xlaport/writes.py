"""Where ``convert`` writes, and what it refuses to overwrite.

In place, a file is replaced only if it still holds what was read (one
edited during the run is left alone).  Into an output tree (``-o OUT``):

* the output may not be inside an input, nor an input inside the output,
  and two inputs may not land on one destination -- all checked before
  anything is written;
* a destination that exists is replaced only if it is an earlier output
  of the same source that nobody has edited since: ``OUT/.xlaport-output.json``
  (the manifest) records, for every file xlaport wrote or copied there,
  its source and the digest of what was written.  Anything else is the
  user's, and stays (XLA001, the run goes on).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from xlaport.files import FileProblem, atomic_write, check_writable, remove_stale_temps
from xlaport.runner import FileResult

MANIFEST = ".xlaport-output.json"
_FORMAT = "xlaport-output/1"


class PlanError(Exception):
    """A request that would overwrite the wrong files: nothing is written."""


def is_inside(child: Path, parent: Path) -> bool:
    try:
        Path(os.path.realpath(child)).relative_to(os.path.realpath(parent))
        return True
    except ValueError:
        return False


def check_output_root(paths: Sequence[str], out_root: Path) -> None:
    """The output tree and the inputs must not overlap."""
    if out_root.exists() and not out_root.is_dir():
        raise PlanError(f"output {out_root} exists and is not a directory")
    for p in paths:
        path = Path(p)
        if path.is_dir() and is_inside(out_root, path):
            raise PlanError(f"output directory {out_root} is inside input {p}; choose another place")
        if is_inside(path, out_root):
            raise PlanError(f"input {p} is inside output directory {out_root}: converting it there would "
                            "overwrite the inputs; choose another place")


def destinations(results: Sequence[FileResult], paths: Sequence[str], out_root: Path) -> Dict[int, Path]:
    """``index of result -> destination`` for every file that goes into the
    output tree; two sources with one destination are an error."""
    single_dir = len(paths) == 1 and Path(paths[0]).is_dir()
    dests: Dict[int, Path] = {}
    taken: Dict[str, Path] = {}
    for k, r in enumerate(results):
        if r.original is None or r.entry.notice:
            continue
        rel = r.entry.relative
        if not single_dir and r.entry.root is not None:
            rel = Path(r.entry.root.name) / rel
        dest = out_root / rel
        key = os.path.normcase(os.path.abspath(dest))
        if key in taken:
            raise PlanError(f"{taken[key]} and {r.path} would both be written to {dest}; convert them into "
                            "separate output directories (or name their common directory instead)")
        taken[key] = r.path
        dests[k] = dest
    return dests


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str:
    """The digest of a file's bytes, read in pieces (data files can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Manifest:
    """What xlaport wrote into one output tree, and from which source."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / MANIFEST
        self.files: Dict[str, Dict[str, str]] = {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("format") == _FORMAT and isinstance(data.get("files"), dict):
                self.files = {k: v for k, v in data["files"].items()
                              if isinstance(v, dict) and isinstance(v.get("source"), str)
                              and isinstance(v.get("sha256"), str)}
        except (OSError, ValueError):
            pass

    def _rel(self, dest: Path) -> str:
        return Path(os.path.abspath(dest)).relative_to(os.path.abspath(self.root)).as_posix()

    def refuses(self, dest: Path, source: Path, digest: str) -> Optional[str]:
        """Why ``dest`` must not be replaced with content of ``digest`` made
        from ``source`` (None: it may)."""
        if not os.path.lexists(dest):
            return None
        if dest.is_symlink() or not dest.is_file():
            return f"{dest} exists and is not a file xlaport wrote: left as it is"
        try:
            current = _file_digest(dest)
        except OSError as exc:
            return f"{dest}: cannot read ({exc.strerror or exc})"
        if current == digest:
            return None  # already this output
        entry = self.files.get(self._rel(dest))
        if entry is None or entry["source"] != os.path.realpath(source):
            return (f"{dest} exists and is not an earlier output of {source}: left as it is "
                    "(remove it, or convert into another directory)")
        if entry["sha256"] != current:
            return f"{dest} was edited after xlaport wrote it: left as it is (remove it to convert again)"
        return None

    def record(self, dest: Path, source: Path, digest: str) -> None:
        self.files[self._rel(dest)] = {"source": os.path.realpath(source), "sha256": digest}

    def save(self) -> None:
        if not self.files:
            return
        data = json.dumps({"format": _FORMAT, "files": dict(sorted(self.files.items()))}, indent=1) + "\n"
        atomic_write(self.path, data.encode("utf-8"))


def write_in_place(results: Sequence[FileResult]) -> None:
    """Replace each converted file, if it still holds what was read."""
    for r in results:
        if not r.writable:
            continue
        try:
            check_writable(r.path)
            atomic_write(r.path, r.output, expected=r.original)  # type: ignore[arg-type]
        except FileProblem as exc:
            _failed(r, str(exc))
        except OSError as exc:
            _failed(r, f"cannot write: {exc.strerror or exc}")


def _failed(r: FileResult, why: str) -> None:
    """A file that was not written: its rewrites did not happen."""
    r.error, r.error_line, r.error_col, r.partial = why, None, None, False
    r.findings = [f for f in r.findings if not f.fix]
    r.cuda = (r.cuda[0], r.cuda[0])  # every CUDA reference of it is still there


Echo = Callable[[str], None]


def write_tree(results: Sequence[FileResult], paths: Sequence[str], out_root: Path, echo: Echo) -> None:
    """Write the conversions, and copy every other file of the input
    directories, into ``out_root`` (checked with :func:`destinations` first)."""
    dests = destinations(results, paths, out_root)
    manifest = Manifest(out_root)
    for stale in remove_stale_temps({d.parent for d in dests.values()}):
        echo(f"{stale}: removed a temporary file left by an interrupted run")
    converted: List[Path] = [results[k].path for k in dests]  # (not copied, whether written or not)
    try:
        for k, dest in dests.items():
            r = results[k]
            data = r.output if r.writable else r.original
            assert data is not None
            digest = _digest(data)
            why = manifest.refuses(dest, r.path, digest)
            if why:
                _failed(r, why)
                continue
            try:
                atomic_write(dest, data, like=r.path)
                manifest.record(dest, r.path, digest)
            except OSError as exc:
                _failed(r, f"cannot write {dest}: {exc.strerror or exc}")
        single_dir = len(paths) == 1 and Path(paths[0]).is_dir()
        for p in paths:
            if Path(p).is_dir():
                dest_root = out_root if single_dir else out_root / Path(p).name
                for src, reason in copy_tree_files(Path(p), dest_root, converted, manifest):
                    echo(f"{src}: {reason}")
    finally:
        manifest.save()


def copy_tree_files(root: Path, out: Path, skip: Sequence[Path], manifest: Manifest) -> List[Tuple[Path, str]]:
    """Copy every file under ``root`` to ``out`` except those in ``skip``
    (and ``__pycache__``, and ``out`` itself), never over a file the
    manifest does not give xlaport.  Returns problems as (path, reason); a
    file that cannot be copied does not stop the others."""
    problems: List[Tuple[Path, str]] = []
    skipped = {os.path.abspath(p) for p in skip}
    out_abs = os.path.realpath(out)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and os.path.realpath(base / d) != out_abs]
        for name in [d for d in dirnames if (base / d).is_symlink()]:  # a link to a directory: the link itself
            _copy_link(base / name, out / (base / name).relative_to(root), manifest, problems)
        for name in filenames:
            src = base / name
            if os.path.abspath(src) in skipped:
                continue
            dst = out / src.relative_to(root)
            try:
                if src.is_symlink():
                    _copy_link(src, dst, manifest, problems)
                    continue
                if not src.is_file():
                    continue  # a FIFO, a socket: nothing to copy
                digest = _file_digest(src)
                why = manifest.refuses(dst, src, digest)
                if why:
                    problems.append((src, f"not copied: {why}"))
                    continue
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
                manifest.record(dst, src, digest)
            except (OSError, FileProblem) as exc:
                problems.append((src, f"cannot copy: {getattr(exc, 'strerror', None) or exc}"))
    return problems


def _copy_link(src: Path, dst: Path, manifest: Manifest, problems: List[Tuple[Path, str]]) -> None:
    """A symbolic link (to a file or a directory) copied as the same link,
    never over something the manifest does not give xlaport.  (A link is
    recognised by its target, not recorded.)"""
    try:
        link = os.readlink(src)
        if dst.is_symlink() and os.readlink(dst) == link:
            return
        if os.path.isdir(dst) and not dst.is_symlink():
            problems.append((src, f"not copied: {dst} exists and is a directory: left as it is"))
            return
        why = manifest.refuses(dst, src, _digest(link.encode("utf-8", "surrogateescape")))
        if why:
            problems.append((src, f"not copied: {why}"))
            return
        dst.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(dst):
            dst.unlink()
        os.symlink(link, dst)
    except OSError as exc:
        problems.append((src, f"cannot copy: {exc.strerror or exc}"))


_LINE_IN_MESSAGE = re.compile(r"\b(lines?) (\d+(?:, \d+)*)\b")


def to_written_lines(results: List[FileResult]) -> None:
    """Findings of a file converted in place point at the file as written
    (an earlier rewrite may have added or removed lines above them)."""
    from xlaport.linemap import line_map

    for r in results:
        if not (r.writable and r.findings) or str(r.path).endswith(".ipynb"):
            continue
        try:
            old, new = r.original.decode("utf-8"), r.output.decode("utf-8")  # type: ignore[union-attr]
        except UnicodeDecodeError:
            continue
        forward = line_map(new, old)  # a line of the input -> the line of the output that holds it
        for f in r.findings:
            f.map_lines(forward)
            # a line a message names ("in the loop at line 6") moves with it
            f.message = _LINE_IN_MESSAGE.sub(
                lambda m: f"{m.group(1)} " + ", ".join(str(forward(int(n))) for n in m.group(2).split(", ")), f.message)
