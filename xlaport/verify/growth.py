"""Does the candidate's compiled work grow with the number of steps?

Three shapes (issue: verify on real programs):

* a loop that runs on the device with no barrier: every iteration is appended
  to one pending graph, so there are no steps to judge and the one graph grows
  with the loop.  The loop is found statically -- the step-barrier rule
  (XLA302) would put a barrier in it -- and named by its line;
* graphs cut by host reads inside the loop: their number grows with the steps;
* a one-off graph (a solver's first-order last step): compiled once at any
  length, which is fine.

The sound test is to run at several lengths (``--lengths ARG=A,B[,C]``):
compilations and the largest graph must not keep growing from one length to
the next (three lengths tell growth from a one-off compile).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from xlaport.engine import Settings, SourceError, transform


def unsynced_loops(candidate: Path) -> List[int]:
    """Lines of the candidate's step loops that have no barrier."""
    try:
        outcome = transform(candidate.read_bytes(), Settings(select=["XLA302"]), str(candidate))
    except (OSError, SourceError):
        return []
    return sorted({f.line for f in outcome.findings if f.code == "XLA302"})


def parse_lengths(spec: str) -> Tuple[str, List[str]]:
    """``--steps=4,8,16`` -> ("--steps", ["4", "8", "16"]); ``@0=4,8`` names
    the script's first positional argument.  With two lengths a third is
    added (as far beyond the second as the second is beyond the first):
    three points tell growth from a one-off compile."""
    name, sep, values = spec.rpartition("=")
    parts = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name or len(parts) not in (2, 3) or (name.startswith("@") and not name[1:].isdigit()) \
            or not name.startswith(("-", "@")):
        raise ValueError(f"--lengths takes ARG=A,B[,C], the script's option as it is written (e.g. --steps=4,8) "
                         f"or @N for its N-th positional argument (@0=4,8), not {spec!r}")
    if len(parts) == 2:
        try:
            a, b = int(parts[0]), int(parts[1])
            parts.append(str(b + (b - a)) if b > a else str(b * 2))
        except ValueError:
            raise ValueError(f"--lengths {spec!r}: with two values they must be integers (or give three)") from None
    return name, parts


def with_length(args: Sequence[str], name: str, value: str) -> List[str]:
    """The script's arguments with ``name`` set to ``value``, in the style
    they use: ``--k V``, ``--k=V``, or (``@N``) the N-th positional argument;
    an option they lack is added as ``--k=V``."""
    out = list(args)
    if name.startswith("@"):
        index = int(name[1:])
        positional = [i for i, a in enumerate(out) if not a.startswith("-") and (i == 0 or not (
            out[i - 1].startswith("-") and "=" not in out[i - 1]))]
        if index >= len(positional):
            raise ValueError(f"--lengths {name}: the script has only {len(positional)} positional argument(s)")
        out[positional[index]] = value
        return out
    for i, a in enumerate(out):
        if a == name and i + 1 < len(out):
            out[i + 1] = value
            return out
        if a.startswith(name + "="):
            out[i] = f"{name}={value}"
            return out
    return out + [f"{name}={value}"]


def largest_graph(graphs: List[Dict[str, object]]) -> int:
    return max((len(g["ir"]) for g in graphs), default=0)  # type: ignore[arg-type]


def judge_lengths(name: str, values: Sequence[str], compiles: Sequence[int], graph_sizes: Sequence[int],
                  loops: Sequence[Optional[int]], reported: Tuple[Sequence[str], int] = ((), 0)) -> List[str]:
    """Failures from the runs at each length; ``loops`` are original lines
    of unsynced loops, to name; ``reported``: the lint findings that predicted
    the recompilations of the main run and how many none did
    (``session.growth_reported``), to tie the growth to.  Growth keeps
    rising from each length to the next: one more compile at the second
    length that the third does not add to (a learning rate leaving 1.0, a
    constant XLA bakes in) is a one-off, not growth."""
    failures: List[str] = []
    where = f" (loop at line {', '.join(str(l) for l in loops if l)})" if any(loops) else ""
    shown = ", ".join(f"{c} at {v}" for c, v in zip(compiles, values))
    if all(b > a for a, b in zip(compiles, compiles[1:])):
        findings, unreported = reported
        said = f"; lint reports it: {', '.join(findings)}" if findings else ""
        if unreported:
            said += f"; {unreported} recompilation(s) no lint finding predicts"
        failures.append(f"compilations grow with {name}: {shown}{where}{said}")
    # once every step loop is cut, the largest graph does not depend on the
    # length at all; a little slack covers graphs that take one input per
    # step (`torch.stack(losses)`).  (A 1.5x allowance let an unsynced
    # sampler hide behind a larger fixed graph: 222 -> 322 IR nodes.)
    if all(b > a + max(16, a * 0.1) for a, b in zip(graph_sizes, graph_sizes[1:])):
        sizes = ", ".join(f"{g} IR nodes at {v}" for g, v in zip(graph_sizes, values))
        failures.append(f"the largest graph grows with {name}: {sizes}: a loop runs on the device without a "
                        f"barrier{where}")
    return failures


def fixed_costs(report, name: str, compiles: Sequence[int]) -> None:  # type: ignore[no-untyped-def]
    """Compilations after warm-up that ``--lengths`` shows do not change with
    the length (6/6/6: a last step that takes another branch, a constant
    step at the end of a schedule) are fixed costs: said, each on its line,
    not failed as recompilations."""
    if len(set(compiles)) != 1:
        return
    steady = [f for f in report.failures if "recompilation(s) after" in f]
    last = [e for e in report.events if e.get("last_steps")]  # (forgiven already: a site's last two steps)
    if not steady and not last:
        return
    report.failures = [f for f in report.failures if f not in steady]
    for e in report.events:
        if e["kind"] == "recompile" or e.get("last_steps"):
            e["kind"] = "fixed_cost"
            e["detail"] = (f"{e['detail']}; the same {compiles[0]} compiles at every {name}: compiled a fixed "
                           "number of times, not once per step")
    said = steady[0] if steady else f"{sum(int(e['count']) for e in last)} compilation(s) on a loop's last steps"
    report.config["fixed_costs"] = f"{said}, but {compiles[0]} compiles at every {name}: fixed costs, not growth"


def check_option(name: str, args: Sequence[str], sources: Iterable[str]) -> None:
    """Before anything runs: ``name`` is an option the script takes (given in
    ``args``, or declared in one of the project's ``sources``), or a
    positional argument it was given.  Raises ValueError saying which."""
    if name.startswith("@"):
        with_length(args, name, "1")
        return
    if any(a == name or a.startswith(name + "=") for a in args):
        return
    if not any(f'"{name}"' in text or f"'{name}'" in text for text in sources):
        raise ValueError(f"--lengths {name}: the script takes no option {name} (its arguments do not give it and no "
                         f"module of the project declares it)")
