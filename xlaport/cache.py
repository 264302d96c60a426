"""A results cache, like Ruff's: a warm re-run over an unchanged tree reads
answers instead of parsing.

An entry is keyed by everything that decides a file's result: its bytes, its
path (findings carry it; per-file ignores read it), the effective settings and
the code of xlaport itself (the version, plus the size and mtime of every
module of the rules and the engine, so that an edited checkout never reads
stale answers).  Entries are small JSON files written through a temporary
file and a rename, so runs in parallel (pre-commit's batches) never read a
half-written one; a damaged entry is a miss.  A rewritten file's output is
kept beside its entry, named by its digest (:meth:`Cache.output`): `lint`
shows findings, and a warm `lint` reads no output at all.

The cache lives in ``.xlaport_cache/`` under the current directory (Ruff's
``.ruff_cache`` convention), or ``$XLAPORT_CACHE_DIR``; ``--no-cache`` skips
it.  It holds its own ``.gitignore`` and a ``CACHEDIR.TAG``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set

from codemods.rule import Finding
from xlaport import __version__
from xlaport.settings import Settings

DIR_NAME = ".xlaport_cache"
_PACKAGES = ("codemods", "xlaport")
FORMAT = "7"  # of an entry; part of the key


@lru_cache(maxsize=None)
def code_fingerprint() -> str:
    """The version and the state of the modules that compute results."""
    h = hashlib.sha256(f"{__version__}/{FORMAT}".encode())
    root = Path(__file__).resolve().parent.parent
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "verify" in path.parts:
                continue
            st = path.stat()
            h.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


# the option `lint` sets when it needs findings alone (xlaport.runner); the key leaves it out
FINDINGS_ONLY = "findings_only"


class _Unread:
    """The output of a rewritten file that was not read (:func:`decode`
    without ``read_output``): the run knows it changes, not how."""

    def __repr__(self) -> str:
        return "UNREAD"


UNREAD = _Unread()


def settings_fingerprint(settings: Settings) -> str:
    data = {
        "select": list(settings.select) if settings.select is not None else None,
        "ignore": list(settings.ignore),
        "target": settings.target,
        # (restyle: `convert` writes Ruff's style of the same output; an entry
        # holds both, so that lint and convert share it -- see styled_output)
        # (findings_only: `lint` leaves the imports pass to the next run that
        # needs the output -- see pending_imports)
        "options": {k: settings.options[k] for k in sorted(settings.options) if k not in ("restyle", FINDINGS_ONLY)},
        "per_file_ignores": {k: list(v) for k, v in sorted(settings.per_file_ignores.items())},
    }

    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Cache:
    def __init__(self, root: Path, settings: Settings) -> None:
        self.dir = root / code_fingerprint()
        self.settings_key = settings_fingerprint(settings)
        self._ready = False
        self._stamps: Dict[str, Optional[List[int]]] = {}  # (this run's look at the files entries depend on)
        self._checked: Dict[str, bool] = {}  # (this run's answer for each group of them)
        self._written: Set[str] = set()  # (the groups this run has written or found)
        self._dir_name: Optional[str] = None

    @classmethod
    def default(cls, settings: Settings) -> "Cache":
        return cls(Path(os.environ.get("XLAPORT_CACHE_DIR") or DIR_NAME), settings)

    def key(self, path: str, data: bytes) -> str:
        h = hashlib.sha256(_sha(data).encode())  # (the digest an entry is checked by: hashed once per file)
        h.update(b"\0" + path.encode("utf-8", "surrogateescape") + b"\0" + self.settings_key.encode())
        return h.hexdigest()

    def _name(self, key: str) -> str:
        """Where the entry ``key`` lives (a string: a warm run reads one entry per file)."""
        if self._dir_name is None:
            self._dir_name = str(self.dir)
        return f"{self._dir_name}{os.sep}{key[:2]}{os.sep}{key}.json"

    def _file(self, key: str) -> Path:
        return Path(self._name(key))

    def get(self, key: str) -> Optional[Dict[str, object]]:
        try:
            with open(self._name(key), "rb") as f:
                entry = json.loads(f.read())
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or not self._groups_unchanged(entry.get("deps")):
            return None
        return entry

    def _groups_unchanged(self, refs: object) -> bool:
        """Are the other files an entry was made from as they were?  Its
        ``deps`` name groups of them (:meth:`_put_groups`), each checked
        once per run: a package's modules all consult the same neighbours."""
        if not refs:
            return True
        if not isinstance(refs, list):
            return False
        for ref in refs:
            ok = self._checked.get(ref) if _is_digest(ref) else False  # (a name, never a path)
            if ok is None:
                ok = self._checked[ref] = self._group_unchanged(ref)
            if not ok:
                return False
        return True

    def _group_unchanged(self, ref: str) -> bool:
        try:
            with open(self._group_name(ref), "rb") as f:
                data = f.read()
        except OSError:
            return False
        try:
            deps = json.loads(data) if _group_ref(data) == ref else None
        except ValueError:
            deps = None
        if not isinstance(deps, dict):  # (named by its digest: a damaged group is a miss, written again by a put)
            _discard(self._group_name(ref))
            return False
        known = self._stamps
        unseen = [p for p in deps if p not in known]
        if unseen:
            from codemods.analysis.project import stamps

            known.update(dict.fromkeys(unseen))
            known.update(stamps(unseen))
        return all(known[p] == stamp for p, stamp in deps.items())

    def output(self, sha: str) -> bytes:
        """The output whose digest is ``sha`` (:meth:`put` keeps it); one
        that is missing or is not its digest's raises ValueError (a miss),
        and a damaged one is removed so that the next put writes it again."""
        if not _is_digest(sha):
            raise ValueError("an output named by no digest")  # (a name, never a path)
        name = self._output_name(sha)
        try:
            with open(name, "rb") as f:
                data = f.read()
        except OSError:
            raise ValueError("a missing output") from None
        if _sha(data) != sha:
            _discard(name)
            raise ValueError("an output that does not match its digest")
        return data

    def _output_name(self, sha: str) -> str:
        return f"{self.dir}{os.sep}out{os.sep}{sha}"

    def _group_name(self, ref: str) -> str:
        return f"{self.dir}{os.sep}deps{os.sep}{ref}.json"  # (beside the entries' two-letter folders)

    def _put_groups(self, deps: Dict[str, List[int]]) -> List[str]:
        """The files an entry depends on, kept as groups (one a directory)
        that entries share by their digest; the groups' names.  (Kept inline,
        the neighbours every module of a package consults made 20 MB of a
        corpus's 89 MB cache and its warm check 214,744 comparisons.)"""
        by_dir: Dict[str, Dict[str, List[int]]] = {}
        for path in sorted(deps):  # (a folder's own stamp [-1, mtime] goes with its files)
            folder = path if deps[path][:1] == [-1] else os.path.dirname(path)
            by_dir.setdefault(folder, {})[path] = deps[path]
        refs = []
        for group in by_dir.values():
            data = json.dumps(group, sort_keys=True).encode()
            ref = _group_ref(data)
            if ref not in self._written:
                name = self._group_name(ref)
                if not os.path.exists(name):
                    _write_whole(Path(name), data)
                self._written.add(ref)
            refs.append(ref)
        return refs

    def put(self, key: str, entry: Dict[str, object], *outputs: Optional[bytes]) -> None:
        """Keep ``entry`` under ``key``, and ``outputs``, the texts it names
        by their digests (``output_sha``, ``styled_sha``; each kept once)."""
        target = self._file(key)
        try:
            self._prepare()
            named = {entry.get("output_sha"), entry.get("styled_sha")}
            for data in filter(None, outputs):
                sha = _sha(data)
                name = self._output_name(sha)
                if sha in named and not os.path.exists(name):
                    _write_whole(Path(name), data)
            deps = entry.get("deps")
            if isinstance(deps, dict):
                entry = {**entry, "deps": self._put_groups(deps)}
            target.parent.mkdir(mode=0o700, exist_ok=True)
            _write_whole(target, json.dumps({**entry, "key": key}).encode())
        except OSError:
            pass  # a read-only tree runs without a cache

    def _prepare(self) -> None:
        if self._ready:
            return
        top = self.dir.parent
        # private to the user: what is read back from here is trusted to
        # be xlaport's own answers (see the README: trust it like the code)
        top.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700, exist_ok=True)
        for name, text in ((".gitignore", "# created by xlaport\n*\n"),
                           ("CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n# xlaport's cache\n")):
            if not (top / name).exists():
                (top / name).write_text(text)
        self._ready = True


def depends_on(path: str, data: bytes) -> Dict[str, List[int]]:
    """The other files an answer about ``path`` may have read (the project
    modules it imports from, and the modules that import it where it was
    asked who calls its functions: ``codemods.analysis.importers``), with their
    sizes and times (a directory's time), for :meth:`Cache.get` to check."""
    from codemods.analysis.importers import consulted
    from codemods.analysis.project import imported_modules, stamps

    return stamps([*imported_modules(path, data).values(), *sorted(consulted(path))])


def _group_ref(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:24]


_DIGEST = re.compile(r"[0-9a-f]{24,64}\Z")


def _is_digest(name: object) -> bool:
    """A group's or an output's name as the cache makes them (hex digits):
    what an entry names is opened, and removed when damaged, only then."""
    return isinstance(name, str) and _DIGEST.match(name) is not None


def _discard(path: str) -> None:
    """Remove a damaged group or output (named by its digest: the next put writes it again)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_whole(target: Path, data: bytes) -> None:
    """``data`` at ``target`` through a temporary file and a rename: a run
    beside this one never reads it half-written."""
    target.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)


def _sha(data: bytes) -> str:
    """The digest of ``data``; the last one is kept for the same bytes object
    (a run asks for a file's digest for its key, then to check the entry)."""
    global _LAST_SHA
    if _LAST_SHA[0] is not data:
        _LAST_SHA = (data, hashlib.sha256(data).hexdigest())
    return _LAST_SHA[1]


_LAST_SHA: "tuple[object, str]" = (None, "")


def encode(output: Optional[bytes], original: bytes, findings: List[Finding], problem, cuda,
           styled: Optional[bytes] = None, restyled: bool = False, imports=None, path: str = "",
           deps: Optional[Dict[str, List[int]]] = None) -> Dict[str, object]:  # type: ignore[no-untyped-def]
    """An entry, tied to the input it answers for and to its own output by
    their digests (checked on read: see :func:`decode`); a changed output
    itself goes to :meth:`Cache.put` beside it.  ``restyled``: the
    entry also holds ``styled``, the output as `convert` writes it (None:
    the same).  ``imports``: the import requests the output still lacks
    (``engine.finish_imports``; an entry `lint` made).  ``deps``: the other
    files it was made from (:func:`depends_on`)."""
    changed = output is not None and output != original
    return {
        **(encode_style(styled, path) if restyled else {}),
        **({"imports": [[list(r) for r in imports[0]], [list(r) for r in imports[1]]]} if imports else {}),
        "input": _sha(original),
        "output_sha": _sha(output) if changed else None,  # type: ignore[arg-type]
        "same": output is not None and output == original,
        "findings": [[f.code, f.message, f.line, f.col, f.fix, f.hot, f.cell, f.end_line, f.end_col,
                      [list(span) for span in f.related], f.unsafe_fix] for f in findings],
        "problem": list(problem) if problem is not None else None,
        "cuda": list(cuda),
        **({"deps": deps} if deps else {}),
    }


def nothing(original: bytes, deps: Optional[Dict[str, List[int]]] = None) -> Dict[str, object]:
    """The entry of a file that no enabled codemod can concern (``runner._work``'s None)."""
    return {"nothing": True, "input": _sha(original), **({"deps": deps} if deps else {})}


def _int(value: object) -> bool:
    return type(value) is int


def _optional(value: object, check) -> bool:  # type: ignore[no-untyped-def]
    return value is None or check(value)


def _finding_ok(row: object) -> bool:
    return (isinstance(row, list) and len(row) == 11 and isinstance(row[0], str) and isinstance(row[1], str)
            and _int(row[2]) and _int(row[3]) and type(row[4]) is bool and _optional(row[5], lambda v: type(v) is bool)
            and _optional(row[6], _int) and _int(row[7]) and _int(row[8]) and isinstance(row[9], list)
            and all(isinstance(s, list) and len(s) == 2 and all(_int(v) for v in s) for s in row[9])
            and type(row[10]) is bool)


def decode(entry: Dict[str, object], original: bytes, path: str,
           read_output: Optional[Callable[[str], bytes]] = None):  # type: ignore[no-untyped-def]
    """``(output, findings, problem, cuda)`` as ``runner._work`` returns
    them, or None for a file with nothing to look at.  A changed output is
    read with ``read_output`` (:meth:`Cache.output`), or is :data:`UNREAD`
    without it.  An entry that is not for these bytes, whose output does
    not match its digest, or whose fields are not of their types raises
    ValueError (a miss): the cache is never trusted to put text into a
    source file unchecked."""
    if entry.get("input") != _sha(original):
        raise ValueError("an entry for other bytes")
    if entry.get("nothing") is True:
        return None
    out: Optional[bytes]
    if entry.get("same") is True:
        out = original
    elif isinstance(entry.get("output_sha"), str):
        out = UNREAD if read_output is None else read_output(entry["output_sha"])  # type: ignore[arg-type,assignment]
    elif entry.get("output_sha") is None:
        out = None
    else:
        raise ValueError("output of the wrong type")
    rows, problem, cuda = entry.get("findings"), entry.get("problem"), entry.get("cuda")
    if not (isinstance(rows, list) and all(_finding_ok(r) for r in rows)):
        raise ValueError("findings of the wrong shape")
    if not (problem is None or (isinstance(problem, list) and len(problem) == 3 and isinstance(problem[0], str)
                                and _optional(problem[1], _int) and _optional(problem[2], _int))):
        raise ValueError("a problem of the wrong shape")
    if not (isinstance(cuda, list) and len(cuda) == 2 and all(_int(c) for c in cuda)):
        raise ValueError("CUDA counts of the wrong shape")
    findings = [Finding(c, m, line, col, fix, hot, path=path, cell=cell, end_line=end_line, end_col=end_col,
                        related=tuple((a, b) for a, b in related), unsafe_fix=unsafe)
                for c, m, line, col, fix, hot, cell, end_line, end_col, related, unsafe in rows]
    return out, findings, tuple(problem) if problem is not None else None, tuple(cuda)


def pending_imports(entry: Dict[str, object]):  # type: ignore[no-untyped-def]
    """The import requests an entry's output still lacks, as
    ``engine.finish_imports`` takes them; None when it lacks none.  A field
    of another shape raises ValueError (a miss)."""
    held = entry.get("imports")
    if held is None:
        return None

    def request(r: object) -> bool:
        return (isinstance(r, list) and len(r) == 3 and isinstance(r[0], str)
                and all(v is None or isinstance(v, str) for v in r[1:]))

    if not (isinstance(held, list) and len(held) == 2 and all(
            isinstance(part, list) and all(request(r) for r in part) for part in held)):
        raise ValueError("import requests of the wrong shape")
    return [tuple(r) for r in held[0]], [tuple(r) for r in held[1]]


def encode_style(styled: Optional[bytes], path: str) -> Dict[str, object]:
    """The fields of an entry that hold the output as `convert` writes it
    (``xlaport.style``), for the Ruff and the Ruff configuration that styled
    it."""
    from xlaport.style import style_key

    return {"ruff": style_key(path), "styled_sha": _sha(styled) if styled is not None else None}


def styled_output(entry: Dict[str, object], path: str, read_output: Callable[[str], bytes]):  # type: ignore[no-untyped-def]
    """(known, styled output or None) from an entry: not known when it was
    made without styling, or by another Ruff or Ruff configuration; the
    output is read with ``read_output`` (:meth:`Cache.output`)."""
    from xlaport.style import style_key

    if entry.get("ruff") != style_key(path):
        return False, None
    sha = entry.get("styled_sha")
    if sha is None:
        return True, None
    if not isinstance(sha, str):
        raise ValueError("a styled output of the wrong type")
    return True, read_output(sha)
