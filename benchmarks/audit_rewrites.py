"""Harm audit: every step barrier (XLA302) and device loader (XLA301) that
`xlaport convert` would add over a corpus of code nobody here wrote, each
with a first classification from the code around it, for a person to judge:

* ``train``: the loop's body calls backward / an optimizer step;
* ``denoise``: it steps a scheduler or a denoiser (unet, transformer, prior);
* ``generate``: an autoregressive loop (a language model, next tokens);
* ``loader``: XLA301 on a DataLoader loop;
* ``suspect``: none of the above, inside a ``forward``/``__call__``/``put``/
  ``step`` method, or over something that looks like a list of loaders --
  most likely harmful;
* ``check``: none of the above -- read it.

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

_TRAIN = re.compile(r"\.backward\(|optimizer\.step|optimizer_step|\bopt\w*\.step\(")
_DENOISE = re.compile(r"scheduler\.step|self\.unet\(|self\.transformer\w*\(|self\.prior\(|denois")
_GENERATE = re.compile(r"language_model|lm_head|next_token|max_new_tokens|generate\(|\.decode\(")
_SUSPECT_DEF = re.compile(r"^\s*def (forward|__call__|put|step|_forward)\b")


def classify(lines: List[str], line: int, code: str) -> str:
    if code == "XLA301":
        return "suspect" if re.search(r"loaders\b|dataloaders\b", lines[line - 1]) else "loader"
    indent = len(lines[line - 1]) - len(lines[line - 1].lstrip())
    body: List[str] = []
    for text in lines[line:]:
        if text.strip() and len(text) - len(text.lstrip()) <= indent:
            break
        body.append(text)
    joined = "\n".join(body)
    if _TRAIN.search(joined):
        return "train"
    if _DENOISE.search(joined):
        return "denoise"
    if _GENERATE.search(joined):
        return "generate"
    for text in reversed(lines[: line - 1]):  # the enclosing def
        if text.strip().startswith(("def ", "async def ")) and len(text) - len(text.lstrip()) < indent:
            if _SUSPECT_DEF.match(text):
                return "suspect"
            break
    return "check"


def main(argv: List[str]) -> int:
    paths = [a for a in argv if not a.startswith("-") and not a.isdigit()]
    jobs = int(argv[argv.index("-j") + 1]) if "-j" in argv else 2
    start = time.perf_counter()
    results = process(discover(paths, []), Settings(select=["XLA301", "XLA302"]), jobs)
    rows: List[Tuple[str, int, str, str]] = []
    for r in results:
        fixes = [f for f in r.findings if f.fix]
        if not fixes or r.original is None:
            continue
        lines = r.original.decode("utf-8", "replace").splitlines()
        for f in fixes:
            rows.append((str(r.path), f.line, f.code, classify(lines, f.line, f.code)))
    kinds = Counter(k for *_, k in rows)
    print(f"{len(results)} files in {time.perf_counter() - start:.1f} s; {len(rows)} rewrites added "
          f"({sum(1 for r in rows if r[2] == 'XLA302')} barriers, {sum(1 for r in rows if r[2] == 'XLA301')} loaders)")
    print("by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    for path, line, code, kind in sorted(rows):
        if "--list" in argv or kind in ("suspect", "check"):
            print(f"  {kind:8s} {code} {path}:{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
