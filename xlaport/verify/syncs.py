"""What the judged XLA run did, read from torch_xla's own graph dump.

With ``XLA_SAVE_TENSORS_FILE`` (and ``XLA_IR_DEBUG=1``) torch_xla writes
every graph it syncs -- compiled or taken from its cache -- with the Python
frames that asked for it and the graph's hash.  That is enough to judge a
run without touching it:

* a sync asked for by ``torch_xla.sync``/``xm.mark_step`` is a step (at the
  innermost line of user code on its stack);
* any other sync is a read that cut the graph (``.item()``, ``print``, a
  branch on a tensor), at its user line;
* a graph whose hash was not seen before was compiled; one seen before was
  taken from the cache.

Empty steps (a barrier with nothing pending) write no graph and are not
counted; they compile and execute nothing.
"""

from __future__ import annotations

import collections
import os
import re
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

# the functions of torch_xla whose sync is a step barrier
_BARRIERS = {("sync", "torch_xla.py"), ("mark_step", "xla_model.py")}


def _is_barrier(frames: List[Tuple[str, str, str]]) -> bool:
    return any((fn, os.path.basename(path)) in _BARRIERS and f"{os.sep}torch_xla{os.sep}" in path
               for fn, path, _ in frames)


def _user_frame(frames: List[Tuple[str, str, str]], is_user: Callable[[str], bool]) -> Tuple[Optional[str], Optional[int]]:
    for _, path, line in frames:
        if is_user(path):
            return path, int(line)
    return None, None


def read_graphs(directory: Path) -> List[Dict[str, object]]:
    """The graphs torch_xla dumped (XLA_SAVE_TENSORS_FILE, text format), in
    order: their sync site frames, hash and IR lines.  Read once for each
    state of the dump (a verification reads one dump for several checks)."""
    dumps = sorted(directory.glob("graphs.txt*"))
    stamp = tuple((str(d), d.stat().st_size, d.stat().st_mtime_ns) for d in dumps)
    if _READ[0] != stamp:
        _READ[:] = [stamp, _parse(dumps)]
    return _READ[1]  # type: ignore[return-value]


_READ: List[object] = [None, []]  # (the dump's files as last read, its graphs)


def _parse(dumps: List[Path]) -> List[Dict[str, object]]:
    graphs: List[Dict[str, object]] = []
    for dump in dumps:
        text = dump.read_text(errors="replace")
        for chunk in text.split("[ScheduleSyncTensorsGraph]")[1:]:
            frames = re.findall(r"^\s+(\S+) \((.+):(\d+)\)$", chunk.split("## BEGIN_GRAPH")[0], re.M)
            body = chunk.split("## BEGIN_GRAPH", 1)[1] if "## BEGIN_GRAPH" in chunk else ""
            ir = [l.strip() for l in body.split("\n}", 1)[0].splitlines() if l.strip().startswith("%")]
            h = re.search(r"Graph Hash: (\w+)", body)
            graphs.append({"frames": frames, "hash": h.group(1) if h else None, "ir": ir})
    return graphs


def observed(directory: Path, is_user: Callable[[str], bool]) -> Dict[str, object]:
    """``steps`` (cumulative snapshots, as :func:`compiles.judge_steps`
    reads them), ``host_reads`` (syncs that were not steps, by user line),
    ``autocast`` (the low-precision float types the graphs computed in),
    ``syncs`` and ``own_files`` (the user files on the graphs' stacks)."""
    graphs = read_graphs(directory)
    seen: set = set()
    steps: List[Dict[str, object]] = []
    reads: Dict[Tuple[str, int], int] = collections.Counter()
    cuts = hits = 0
    own: List[str] = []
    low = set()
    for n, g in enumerate(graphs, start=1):
        frames = g["frames"]  # type: ignore[assignment]
        if g["hash"] is not None:
            hits += g["hash"] in seen
            seen.add(g["hash"])
        path, line = _user_frame(frames, is_user)  # type: ignore[arg-type]
        for _, p, _ in frames:  # type: ignore[misc]
            if is_user(p) and p not in own:
                own.append(p)
        for ir in g["ir"]:  # type: ignore[union-attr]
            if "bf16[" in ir:
                low.add("torch.bfloat16")
            elif " f16[" in ir or "(f16[" in ir:
                low.add("torch.float16")
        if _is_barrier(frames):  # type: ignore[arg-type]
            steps.append({"compiles": len(seen), "executions": n, "transfers": cuts, "cached_compiles": hits,
                          "fallbacks": {}, "time": 0.0, "path": path, "line": line})
        else:
            cuts += 1
            if path is not None:
                reads[(path, line)] += 1  # type: ignore[index]
    return {"steps": steps, "syncs": len(graphs), "compiles_seen": len(seen), "own_files": own,
            "autocast": sorted(low),
            "host_reads": [{"path": p, "line": l, "count": c, "detail": "a read of a pending value cut the graph"}
                           for (p, l), c in reads.items()]}


def so_far(directory: Path, is_user: Callable[[str], bool], seconds: float) -> Optional[Dict[str, object]]:
    """How far a run killed at the timeout had come: steps, compiles and
    executions from its dump so far, and the user files on its stacks."""
    try:
        seen = observed(directory, is_user)
    except OSError:
        return None
    if not seen["syncs"]:
        return None
    return {"steps": float(len(seen["steps"])), "compiles": float(seen["compiles_seen"]),  # type: ignore[arg-type]
            "compile_seconds": 0.0, "executions": float(seen["syncs"]), "time": seconds,  # type: ignore[arg-type]
            "own_files": seen["own_files"]}
