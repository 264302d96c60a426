"""Does the candidate's compiled work grow with the number of steps?

Three shapes (issue: verify on real programs):

* a loop that runs on the device with no barrier: every iteration is appended
  to one pending graph, so there are no steps to judge and the one graph grows
  with the loop.  The loop is found statically -- the step-barrier rule
  (XLA302) would put a barrier in it -- and named by its line;
* graphs cut by host reads inside the loop: their number grows with the steps;
* a one-off graph (a solver's first-order last step): compiled once at any
  length, which is fine.

The sound test is to run at two lengths (``--lengths ARG=A,B``): compilations
and the largest graph must not grow from A to B.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from xlaport.engine import Settings, SourceError, transform


def unsynced_loops(candidate: Path) -> List[int]:
    """Lines of the candidate's step loops that have no barrier."""
    try:
        outcome = transform(candidate.read_bytes(), Settings(select=["XLA302"]), str(candidate))
    except (OSError, SourceError):
        return []
    return sorted({f.line for f in outcome.findings if f.code == "XLA302"})


def parse_lengths(spec: str) -> Tuple[str, List[str]]:
    """``--steps=4,8`` -> ("--steps", ["4", "8"])."""
    name, sep, values = spec.rpartition("=")
    parts = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name or len(parts) != 2:
        raise ValueError(f"--lengths takes ARG=A,B (e.g. --steps=4,8), not {spec!r}")
    return name, parts


def with_length(args: Sequence[str], name: str, value: str) -> List[str]:
    """The script's arguments with ``name`` set to ``value``."""
    out: List[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == name:
            skip = True
            continue
        if a.startswith(name + "="):
            continue
        out.append(a)
    return out + [name, value]


def largest_graph(graphs: List[Dict[str, object]]) -> int:
    return max((len(g["ir"]) for g in graphs), default=0)  # type: ignore[arg-type]


def judge_lengths(name: str, values: Sequence[str], compiles: Sequence[int], graph_sizes: Sequence[int],
                  loops: Sequence[Optional[int]]) -> List[str]:
    """Failures from the two runs (A, B); ``loops`` are original lines of
    unsynced loops, to name."""
    failures: List[str] = []
    where = f" (loop at line {', '.join(str(l) for l in loops if l)})" if any(loops) else ""
    a, b = values
    if compiles[1] > compiles[0]:
        failures.append(f"compilations grow with {name}: {compiles[0]} at {a}, {compiles[1]} at {b}{where}")
    # once every step loop is cut, the largest graph does not depend on the
    # length at all; a little slack covers graphs that take one input per
    # step (`torch.stack(losses)`).  (A 1.5x allowance let an unsynced
    # sampler hide behind a larger fixed graph: 222 -> 322 IR nodes.)
    if graph_sizes[1] > graph_sizes[0] + max(16, graph_sizes[0] * 0.1):
        failures.append(f"the largest graph grows with {name}: {graph_sizes[0]} IR nodes at {a}, "
                        f"{graph_sizes[1]} at {b}: a loop runs on the device without a barrier{where}")
    return failures
