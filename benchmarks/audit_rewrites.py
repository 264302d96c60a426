"""Harm audit: every step barrier (XLA302) and device loader (XLA301) that
`xlaport convert` would add over a corpus of code nobody here wrote, each
with its category and verdict (``benchmarks/judge.py``: a real step loop, or
a wrong barrier; categories were judged by reading every loop in them, and
loops no category covers are judged one by one or reported as unjudged).
A loader added over something that looks like a list of loaders is
reported as wrong.

Usage: python benchmarks/audit_rewrites.py PATH [PATH ...] [-j N] [--list]
(e.g. the diffusers, transformers, accelerate and timm packages as
installed, or unpacked from their wheels).
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xlaport.engine import Settings  # noqa: E402
from xlaport.files import discover  # noqa: E402
from xlaport.runner import process  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from judge import VERDICTS, judge  # noqa: E402

def main(argv: List[str]) -> int:
    paths = [a for a in argv if not a.startswith("-") and not a.isdigit()]
    jobs = int(argv[argv.index("-j") + 1]) if "-j" in argv else 2
    start = time.perf_counter()
    results = process(discover(paths, []), Settings(select=["XLA301", "XLA302"]), jobs)
    rows: List[Tuple[str, int, str, str, str]] = []
    for r in results:
        fixes = [f for f in r.findings if f.fix]
        if not fixes or r.original is None:
            continue
        text = r.original.decode("utf-8", "replace")
        lines = text.splitlines()
        judged = judge(str(r.path), text, [f.line for f in fixes if f.code == "XLA302"])
        for f in fixes:
            if f.code == "XLA301":
                wrong = re.search(r"loaders\b|dataloaders\b", lines[f.line - 1])
                rows.append((str(r.path), f.line, f.code, "loader", "wrong" if wrong else "real"))
            else:
                category, verdict, _ = judged.get(f.line, ("check", "unjudged", ""))
                rows.append((str(r.path), f.line, f.code, category, verdict))
    kinds = Counter(r[3] for r in rows)
    verdicts = Counter(r[4] for r in rows)
    print(f"{len(results)} files in {time.perf_counter() - start:.1f} s; {len(rows)} rewrites added "
          f"({sum(1 for r in rows if r[2] == 'XLA302')} barriers, {sum(1 for r in rows if r[2] == 'XLA301')} loaders)")
    print(f"verdicts: {verdicts['real']} real, {verdicts['wrong']} wrong, {verdicts['unjudged']} unjudged")
    for category, n in kinds.most_common():
        verdict, why = VERDICTS[category]
        print(f"  {category:9} {n:3}  {verdict}: {why}")
    for path, line, code, category, verdict in sorted(rows):
        if "--list" in argv or verdict != "real":
            print(f"  {category:9s} {verdict:8s} {code} {path}:{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
