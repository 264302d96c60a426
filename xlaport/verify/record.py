"""``verify --record REF.json`` and ``verify --against REF.json``.

A user with a GPU box and a TPU VM records the original on the GPU and
compares the conversion with that record on the TPU.  The record holds the
reference runs' stdout and the files they wrote (copied beside it, in
``REF.json.d/``), the command, and the environment it ran in.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

FORMAT = "xlaport-reference/1"


def environment(python: str = sys.executable) -> Dict[str, object]:
    env: Dict[str, object] = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        from importlib.metadata import version

        for pkg in ("torch", "torch_xla", "xlaport"):
            try:
                env[pkg] = version(pkg)
            except Exception:  # noqa: BLE001 -- not installed
                env[pkg] = None
    except ImportError:  # pragma: no cover
        pass
    return env


MARKER = ".xlaport-record"  # in a store verify made (and may replace)


def owns_store(store: Path) -> bool:
    return (store / MARKER).is_file()


def write(path: Path, script: Path, args: Sequence[str], device: str, runs: List[Tuple[str, Dict[str, Path]]],
          seconds: List[float], diagnostics: Optional[Dict[str, Sequence[Tuple[str, Dict[str, Path]]]]] = None) -> None:
    """The record; ``diagnostics``: the reference's diagnostic runs by kind --
    ``rng_runs`` (its device's random draws taken from the CPU generator, a
    CUDA reference: see ``rng``), ``bn_runs`` (BatchNorm's running variance
    updated as torch_xla updates it, those draws routed too)."""
    store = path.with_name(path.name + ".d")
    if store.exists():
        if not owns_store(store):
            raise ValueError(f"{store} exists and is not a record store verify made: not replaced")
        shutil.rmtree(store)
    store.mkdir()
    (store / MARKER).write_text(f"{FORMAT}\n")
    def saved(kind: str, i: int, stdout: str, files: Dict[str, Path]) -> Dict[str, object]:
        kept: Dict[str, str] = {}
        for rel, src in files.items():
            dest = store / f"{kind}{i}" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
            kept[rel] = dest.relative_to(path.parent).as_posix()
        return {"stdout": stdout, "files": kept}

    record = {"format": FORMAT, "script": script.name, "args": list(args), "device": device,
              "environment": environment(), "seconds": seconds,
              "runs": [saved("run", i, *run) for i, run in enumerate(runs)]}
    for kind, kind_runs in (diagnostics or {}).items():
        if kind_runs:
            record[kind] = [saved(kind.split("_")[0], i, *run) for i, run in enumerate(kind_runs)]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(path)


def read(path: Path) -> Tuple[Dict[str, object], List[str], List[Dict[str, Path]]]:
    """(the record, the stdout of each run, the files of each run)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable record ({exc})") from None
    if record.get("format") != FORMAT:
        raise ValueError(f"{path}: not an xlaport reference record (format {record.get('format')!r})")
    stdouts, files = runs_of(path, record, "runs")
    return record, stdouts, files


def runs_of(path: Path, record: Dict[str, object], key: str) -> Tuple[List[str], List[Dict[str, Path]]]:
    """(stdouts, files) of the record's ``runs``, ``rng_runs`` or ``bn_runs`` (none: empty)."""
    runs = record.get(key) or []
    stdouts = [r["stdout"] for r in runs]  # type: ignore[union-attr,index]
    files = [{rel: path.parent / p for rel, p in r["files"].items()} for r in runs]  # type: ignore[union-attr,index]
    missing = [str(p) for run in files for p in run.values() if not p.exists()]
    if missing:
        raise ValueError(f"{path}: recorded files are missing: {', '.join(missing[:3])}")
    return stdouts, files
