"""Where xlaport puts step barriers, against ground truth written by hand.

diffusers 0.42.1 ends its denoising loops with ``if XLA_AVAILABLE:
xm.mark_step()``, placed by its maintainers.  This strips every such
statement that ends a loop body, converts the stripped package with the
barrier rule alone (XLA302), and compares: recall (hand-placed barriers
xlaport puts back, in the same loop) and every extra barrier, listed with a
verdict (``benchmarks/judge.py``: a real step loop its maintainers did not
port, or a wrong barrier).

Usage: python benchmarks/bench_barriers.py [WHEEL] [--list]
(default WHEEL: .cache/wheels/diffusers-0.42.1-py3-none-any.whl, which
``make setup`` fetches).
"""

from __future__ import annotations

import re
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xlaport.engine import Settings, SourceError, transform  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from judge import VERDICTS, judge  # noqa: E402

_IF = re.compile(r"^(\s*)if XLA_AVAILABLE:\s*$")
_MARK = re.compile(r"^\s*xm\.mark_step\(\)\s*$")
_LOOP = re.compile(r"^(\s*)(for|while|async for)\b")
def strip(text: str) -> Tuple[str, Set[int]]:
    """The text without the loop-ending ``if XLA_AVAILABLE: xm.mark_step()``
    pairs, and the (stripped-file) lines of the loops that had one."""
    lines = text.splitlines(keepends=True)
    out: List[str] = []
    loops: Set[int] = set()
    i = 0
    while i < len(lines):
        m = _IF.match(lines[i])
        if m and i + 1 < len(lines) and _MARK.match(lines[i + 1]):
            indent = len(m.group(1))
            # the innermost loop above whose body this is
            for j in range(len(out) - 1, -1, -1):
                lm = _LOOP.match(out[j])
                if lm and len(lm.group(1)) < indent:
                    loops.add(j + 1)
                    break
                stripped = out[j].strip()
                if stripped and len(out[j]) - len(out[j].lstrip()) < indent and not lm:
                    if not stripped.startswith(("if", "elif", "else", "with", "try", "except", "finally", "#", ")")):
                        break
            i += 2
            continue
        out.append(lines[i])
        i += 1
    return "".join(out), loops


def main(argv: List[str]) -> int:
    wheel = Path(next((a for a in argv if not a.startswith("--")),
                      ROOT / ".cache" / "wheels" / "diffusers-0.42.1-py3-none-any.whl"))
    show = "--list" in argv
    truth: Dict[str, Set[int]] = {}
    found: Dict[str, Set[int]] = {}
    judged: Dict[Tuple[str, int], Tuple[str, str, str]] = {}
    failed = 0
    start = time.perf_counter()
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".py")]
        for name in names:
            text = zf.read(name).decode("utf-8", "replace")
            stripped, loops = strip(text) if "mark_step" in text else (text, set())
            if loops:
                truth[name] = loops
            try:
                outcome = transform(stripped.encode(), Settings(select=["XLA302"]), name)
            except SourceError:
                failed += 1
                continue
            hits = {f.line for f in outcome.findings if f.code == "XLA302"}
            if hits:
                found[name] = hits
                for line, verdict in judge(name, stripped, sorted(hits)).items():
                    judged[(name, line)] = verdict
    seconds = time.perf_counter() - start
    hand = {(n, l) for n, ls in truth.items() for l in ls}
    ours = {(n, l) for n, ls in found.items() for l in ls}
    hit, missed, extra = hand & ours, sorted(hand - ours), sorted(ours - hand)
    kinds = Counter(judged[e][0] for e in extra)
    verdicts = Counter(judged[e][1] for e in extra)
    print(f"diffusers wheel: {wheel.name}; {len(names)} files; {failed} could not be parsed; {seconds:.1f} s")
    print(f"hand-placed loop barriers: {len(hand)} in {len(truth)} files")
    print(f"put back by xlaport: {len(hit)} (recall {len(hit) / max(len(hand), 1):.3f}); missed: {len(missed)}")
    print(f"extra barriers: {len(extra)}: {verdicts['real']} real step loops left unported, "
          f"{verdicts['wrong']} wrong, {verdicts['unjudged']} unjudged")
    for category, n in sorted(kinds.items()):
        verdict, why = VERDICTS[category]
        print(f"  {category:9} {n:3}  {verdict}: {why}")
    if show or len(missed) <= 10:
        for n, l in missed:
            print(f"  missed  {n}:{l}")
    for n, l in extra:
        category, verdict, why = judged[(n, l)]
        if show or verdict != "real":
            print(f"  extra   {n}:{l}  [{category}: {verdict}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
