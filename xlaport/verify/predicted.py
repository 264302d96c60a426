"""Whether lint predicted what a verification saw: each recompilation, host
read and CPU fallback tied to the XLA4xx finding on its line (or on a line
the finding names, or inside the loop whose barrier cut the graph), and the
findings a growth measured by ``--lengths`` is tied to."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Tuple

from codemods.rule import Finding
from xlaport.engine import Settings, SourceError, transform
from xlaport.verify.compiles import innermost_loop


def predicted(events: List[Dict[str, object]]) -> None:
    """Say for each recompilation, host read and CPU fallback whether ``lint``
    reports it (``XLA4xx``): on its line, on a line the finding names as
    related (the helper a loop counter reaches, ``get_batch``'s slice), or --
    for a recompilation -- as a per-step trap inside the loop whose barrier
    cuts the graph (XLA408: every op that reads the grown value sees a new
    shape, in whatever function it runs; XLA407: the op the IR diff names
    may be a neighbour of the indexed table).  "predicted by XLA407 at line
    18", or not."""
    cache: Dict[str, List[Finding]] = {}

    def findings(path: str) -> List[Finding]:
        if path not in cache:
            try:
                cache[path] = transform(Path(path).read_bytes(),
                                        Settings(select=["XLA4"], options={"include_cold": True}), path).findings
            except (OSError, SourceError):
                cache[path] = []
        return cache[path]

    for e in events:
        if e["kind"] in ("recurring", "new_graph") and e.get("original_path") and e.get("original_line"):
            _last_batch(e, findings(str(e["original_path"])))
            continue
        if e["kind"] not in ("recompile", "host_read", "fallback") or not e.get("original_path") \
                or not e.get("original_line") or e.get("backend_only"):
            continue
        path, line = str(e["original_path"]), int(e["original_line"])  # type: ignore[call-overload]
        found = findings(path)
        hits = [(f, path) for f in found if f.line == line]
        if not hits and e["kind"] == "recompile":
            hits = [(f, path) for f in found if f.covers(line)]
        cut = e.get("cut_loop")
        if not hits and e["kind"] == "recompile" and isinstance(cut, list):
            # a per-step trap lint reports inside the loop whose barrier cut
            # the graph: the op the IR diff names may be a neighbour of it
            first, last = innermost_loop(Path(str(cut[0])), int(cut[1])) or (0, -1)
            hits = [(f, str(cut[0])) for f in sorted(findings(str(cut[0])), key=lambda f: f.code, reverse=True)
                    if f.code in ("XLA407", "XLA408") and first <= f.line <= last]
        if hits:
            f, where = hits[0]
            e["predicted"] = f"{f.code} at line {f.line}" + ("" if where == path else f" of {Path(where).name}")
            e["predicted_at"] = [f.code, where, f.line]
        else:
            e["predicted"] = None
        e["detail"] = f"{e['detail']}; " + (f"predicted by {e['predicted']}" if hits else "not predicted by lint")


def _last_batch(event: Dict[str, object], found: List[Finding]) -> None:
    """A graph compiled once more in a loop that walks a loader lint says
    keeps a smaller last batch (XLA413 where ``name = DataLoader(...)`` is
    made, the loop's header naming ``name``): said on the event."""
    path, line = Path(str(event["original_path"])), int(event["original_line"])  # type: ignore[call-overload]
    loop = innermost_loop(path, line)
    if loop is None:
        return
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    header = lines[loop[0] - 1] if loop[0] <= len(lines) else ""
    for f in found:
        made = re.match(r"\s*([A-Za-z_][\w.]*)\s*=", lines[f.line - 1]) if f.code == "XLA413" \
            and f.line <= len(lines) else None
        if made and re.search(rf"(?<![\w.]){re.escape(made.group(1))}\b", header):
            event["predicted"] = f"{f.code} at line {f.line}"
            event["predicted_at"] = [f.code, str(path), f.line]
            event["detail"] = f"{event['detail']}; the last, smaller batch of the loader made at line {f.line} " \
                              f"(predicted by {f.code})"
            return


def growth_reported(events: List[Dict[str, object]]) -> Tuple[List[str], int]:
    """The lint findings that predicted the run's recompilations (``XLA407 at
    sampler.py:24``), each once, and how many recompilations none did: what
    a growth that ``--lengths`` measures is tied to."""
    seen: List[str] = []
    unreported = 0
    for e in events:
        if e["kind"] != "recompile":
            continue
        at = e.get("predicted_at")
        if not isinstance(at, list):
            unreported += 1
            continue
        text = f"{at[0]} at {Path(str(at[1])).name}:{at[2]}"
        if text not in seen:
            seen.append(text)
    return seen, unreported
