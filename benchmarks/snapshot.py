"""The corpus snapshot: what `xlaport convert` does to every file of a corpus.

For each file: the sha1 of the converted output, every finding (code, line,
column, end, message, fix) and the CUDA counts.  Two snapshots taken before
and after a change are compared with ``--against``: every file whose output,
findings or counts differ is listed, with the findings that came and went.

Usage:
    python benchmarks/snapshot.py [--corpus DIR] --save OUT.json [-j N]
    python benchmarks/snapshot.py [--corpus DIR] --against OLD.json [-j N] [--save NEW.json]

Without ``--corpus`` the corpus of ``bench_speed.py`` (diffusers 0.42.1,
transformers 4.57.6, accelerate 1.1.1, timm 1.0.11) is fetched and used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from xlaport.engine import Settings  # noqa: E402
from xlaport.files import discover  # noqa: E402
from xlaport.runner import process  # noqa: E402


def take(corpus: Path, jobs: int) -> Dict[str, Dict[str, object]]:
    results = process(discover([str(corpus)], [], respect_gitignore=False), Settings(), jobs)
    snap: Dict[str, Dict[str, object]] = {}
    for r in results:
        out = r.output if r.output is not None else b""
        snap[r.path.relative_to(corpus).as_posix()] = {
            "sha1": hashlib.sha1(out).hexdigest(),
            "findings": sorted([f.code, f.line, f.col, f.end_line, f.end_col, f.message, f.fix] for f in r.findings),
            "cuda": list(r.cuda),
            "error": r.error,
        }
    return snap


def compare(old: Dict[str, Dict[str, object]], new: Dict[str, Dict[str, object]]) -> List[str]:
    lines: List[str] = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        if a is None or b is None:
            lines.append(f"{path}: only in the {'new' if a is None else 'old'} snapshot")
            continue
        what = [k for k in ("sha1", "cuda", "error") if a[k] != b[k]]
        gone = [f for f in a["findings"] if f not in b["findings"]]  # type: ignore[union-attr]
        came = [f for f in b["findings"] if f not in a["findings"]]  # type: ignore[union-attr]
        lines.append(f"{path}: {', '.join(what) or 'findings'} differ"
                     + (f" (cuda {a['cuda']} -> {b['cuda']})" if "cuda" in what else ""))
        lines += [f"  - {f[0]} {f[1]}:{f[2]} {f[5]}" for f in gone]
        lines += [f"  + {f[0]} {f[1]}:{f[2]} {f[5]}" for f in came]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=None)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--against", type=Path, default=None)
    args = ap.parse_args()
    if args.corpus is None:
        from bench_speed import corpus

        args.corpus = corpus()
    start = time.perf_counter()
    snap = take(args.corpus.resolve(), args.jobs)
    print(f"{len(snap)} files, {sum(len(v['findings']) for v in snap.values())} findings, "  # type: ignore[arg-type]
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.save:
        args.save.write_text(json.dumps(snap, indent=0, sort_keys=True))
    if args.against:
        diff = compare(json.loads(args.against.read_text()), snap)
        print("\n".join(diff) if diff else "identical")
        print(f"{sum(1 for l in diff if not l.startswith(' '))} file(s) differ", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
