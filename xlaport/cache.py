"""A results cache, like Ruff's: a warm re-run over an unchanged tree reads
answers instead of parsing.

An entry is keyed by everything that decides a file's result: its bytes, its
path (findings carry it; per-file ignores read it), the effective settings and
the code of xlaport itself (the version, plus the size and mtime of every
module of the rules and the engine, so that an edited checkout never reads
stale answers).  Entries are small JSON files written through a temporary
file and a rename, so runs in parallel (pre-commit's batches) never read a
half-written one; a damaged entry is a miss.

The cache lives in ``.xlaport_cache/`` under the current directory (Ruff's
``.ruff_cache`` convention), or ``$XLAPORT_CACHE_DIR``; ``--no-cache`` skips
it.  It holds its own ``.gitignore`` and a ``CACHEDIR.TAG``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional

from codemods.rule import Finding
from xlaport import __version__
from xlaport.settings import Settings

DIR_NAME = ".xlaport_cache"
_PACKAGES = ("codemods", "xlaport")
FORMAT = "2"  # of an entry; part of the key


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


def settings_fingerprint(settings: Settings) -> str:
    data = {
        "select": list(settings.select) if settings.select is not None else None,
        "ignore": list(settings.ignore),
        "target": settings.target,
        "options": {k: settings.options[k] for k in sorted(settings.options)},
        "per_file_ignores": {k: list(v) for k, v in sorted(settings.per_file_ignores.items())},
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Cache:
    def __init__(self, root: Path, settings: Settings) -> None:
        self.dir = root / code_fingerprint()
        self.settings_key = settings_fingerprint(settings)
        self._ready = False

    @classmethod
    def default(cls, settings: Settings) -> "Cache":
        return cls(Path(os.environ.get("XLAPORT_CACHE_DIR") or DIR_NAME), settings)

    def key(self, path: str, data: bytes) -> str:
        h = hashlib.sha256(data)
        h.update(b"\0" + path.encode("utf-8", "surrogateescape") + b"\0" + self.settings_key.encode())
        return h.hexdigest()

    def _file(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> Optional[Dict[str, object]]:
        try:
            entry = json.loads(self._file(key).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        return entry

    def put(self, key: str, entry: Dict[str, object]) -> None:
        target = self._file(key)
        try:
            self._prepare()
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**entry, "key": key}))
            os.replace(tmp, target)
        except OSError:
            pass  # a read-only tree runs without a cache

    def _prepare(self) -> None:
        if self._ready:
            return
        top = self.dir.parent
        top.mkdir(parents=True, exist_ok=True)
        for name, text in ((".gitignore", "# created by xlaport\n*\n"),
                           ("CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n# xlaport's cache\n")):
            if not (top / name).exists():
                (top / name).write_text(text)
        self._ready = True


def encode(output: Optional[bytes], original: bytes, findings: List[Finding], problem, cuda) -> Dict[str, object]:
    return {
        "output": None if output is None or output == original else base64.b64encode(output).decode(),
        "same": output is not None and output == original,
        "findings": [[f.code, f.message, f.line, f.col, f.fix, f.hot, f.cell, f.end_line, f.end_col] for f in findings],
        "problem": list(problem) if problem is not None else None,
        "cuda": list(cuda),
    }


# the entry of a file that no enabled codemod can concern (``runner._work``'s None)
NOTHING: Dict[str, object] = {"nothing": True}


def decode(entry: Dict[str, object], original: bytes, path: str):
    """``(output, findings, problem, cuda)`` as ``runner._work`` returns
    them, or None for a file with nothing to look at."""
    if entry.get("nothing"):
        return None
    out: Optional[bytes]
    if entry.get("same"):
        out = original
    elif entry.get("output") is not None:
        out = base64.b64decode(entry["output"])  # type: ignore[arg-type]
    else:
        out = None
    findings = [Finding(c, m, line, col, fix, hot, path=path, cell=cell, end_line=end_line, end_col=end_col)
                for c, m, line, col, fix, hot, cell, end_line, end_col in entry["findings"]]  # type: ignore[union-attr]
    problem = tuple(entry["problem"]) if entry.get("problem") is not None else None  # type: ignore[arg-type]
    return out, findings, problem, tuple(entry["cuda"])  # type: ignore[arg-type]
