"""Judging the candidate's compile behaviour: compilations per step and per
sync site, recompilations located in the dumped graphs, host reads and CPU
fallbacks, and the map from the candidate's lines back to the user's."""

from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from xlaport.verify.syncs import read_graphs

if TYPE_CHECKING:
    from xlaport.verify.model import Report, Run


def judge(cand: "Run", compared, lines: "LineMapper", graphs: Path, warmup_steps: int,
          max_host_reads_per_step: Optional[float], ref_kind: str,
          traced: Optional[Dict[str, object]] = None, device: str = "cpu") -> "Report":
    """Outputs, compile behaviour per step, host reads and fallbacks.  The
    steps and graph cuts are the judged run's; ``traced`` is a diagnostic
    run's record of each host read and CPU fallback by line and step, where
    one was made (``Session._traced``).  On a backend other than the TPU, a
    fallback of an op torch_xla lowers on a TPU only is said, not failed."""
    traced = traced or {}
    fallback_sites: List[Dict[str, object]] = list(traced.get("fallback_sites") or [])  # type: ignore[call-overload]
    traced_steps = judge_steps(list(traced["steps"]), warmup_steps) if traced.get("steps") else None  # type: ignore[call-overload]
    outputs = compared.outputs
    cand_script = lines.converted
    steps = list(cand.data.get("steps", []))  # type: ignore[arg-type]
    judged = judge_steps(steps, warmup_steps)
    m = cand.metrics
    metrics: Dict[str, object] = {
        "steps": len(steps),
        "compiles": m.get("compiles", 0),
        "compiles_after_warmup": judged["compiles_after_warmup"],
        "cached_compiles": m.get("cached_compiles", 0),
        "executions": m.get("executions", 0),
        "host_reads": m.get("transfers_from_device", 0),
        "host_reads_per_step": (traced_steps or judged)["host_reads_per_step"],
        "scalar_reads": m.get("scalar_reads", 0),
        "fallbacks": m.get("fallbacks", {}),
        "compile_seconds": m.get("compile_seconds", 0.0),
        "seconds": m.get("seconds", 0.0),
        "warmup_steps": warmup_steps,
        "reference": ref_kind,
        "per_step": [{**s, "path": lines.shown(s["path"])} for s in judged["per_step"]],  # type: ignore[index]
    }
    events: List[Dict[str, object]] = []
    steady_recompiles = 0
    dumped = read_graphs(graphs.parent) if judged["recompile_sites"] else []
    for site in judged["recompile_sites"]:  # type: ignore[union-attr]
        at_site = _at_site(dumped, site)
        kinds = classify_recompiles(at_site, site)
        # one graph with new ops after warm-up (a last step that takes another
        # branch), or the same graph once with another constant (a learning
        # rate leaving 1.0, a special scalar XLA bakes in), is compiled once
        # and does not grow with the steps; a graph compiled again and again does
        churn, fresh = len(kinds["churn"]), len(kinds["new_path"])
        bad = (churn if churn > 1 else 0) + in_runs(kinds["new_path"])
        if bad and settled_then_last(site, warmup_steps):
            where = locate_recompile(at_site, lines, site["where"])  # type: ignore[arg-type]
            steps_at = ", ".join(str(int(n) + 1) for n in site["site_steps"])  # type: ignore[union-attr]
            events.append(lines.event("one_off", where or site["where"], len(site["site_steps"]),  # type: ignore[arg-type]
                                      f"compiled at this sync's last steps only ({steps_at} of "
                                      f"{site['site_total']}), after steps run from the cache: a last step that "
                                      "takes another branch, or a counter reaching 1 and 0 (values XLA bakes into "
                                      "the graph); a fixed cost, not growth (`--lengths` measures it)"
                                      + (f"; {where[2]}" if where else "")))
            events[-1]["last_steps"] = True  # (`--lengths` calls it a fixed cost: growth.fixed_costs)
            continue
        steady_recompiles += bad
        if bad:
            where = locate_recompile(at_site, lines, site["where"])  # type: ignore[arg-type]
            events.append(lines.event("recompile", where or site["where"], bad, where_detail(where, site)))
            events[-1]["cut_loop"] = lines.loop_around(site["where"])  # type: ignore[arg-type]
        elif churn:
            where = locate_recompile(at_site, lines, site["where"])  # type: ignore[arg-type]
            steps_at = ", ".join(str(n + 1) for n in kinds["churn"])
            events.append(lines.event("one_off", where or site["where"], churn,
                                      f"compiled once more at this sync's step {steps_at} with another value "
                                      "(a constant XLA bakes in, such as a learning rate leaving 1.0): a one-off, "
                                      "not growth" + (f"; {where[2]}" if where else "")))
        if kinds["recurring"]:
            where = locate_recompile(at_site, lines, site["where"])  # type: ignore[arg-type]
            steps_at = ", ".join(str(n + 1) for n in kinds["recurring"])
            events.append(lines.event("recurring", where or site["where"], len(kinds["recurring"]),
                                      f"compiled at this sync's step {steps_at} and run again from the cache at "
                                      "later steps (a graph that comes back, such as the step after a logging "
                                      "read): not growth" + (f"; {where[2]}" if where else "")))
        if fresh and not bad:
            steps_at = ", ".join(str(n + 1) for n in kinds["new_path"])
            what = ("one graph with different ops at this sync's step" if fresh == 1 else
                    f"{fresh} graphs with different ops, steps run from the cache between them, at this sync's steps")
            events.append(lines.event("new_graph", site["where"], fresh,
                                      f"{what} {steps_at} (another branch, e.g. a final step, or an epoch's first "
                                      "step after reads at its end): each compiled once, not once per step"))
    metrics["steady_state_recompiles"] = steady_recompiles
    for read in (traced.get("host_reads") or cand.data.get("host_reads", [])):  # type: ignore[union-attr]
        events.append(lines.event("host_read", (read["path"], read["line"]), read["count"], read["detail"]))
    for fb in fallback_sites:
        events.append(lines.event("fallback", (fb["path"], fb["line"]), fb["count"], fb["detail"]))
    if m.get("fallbacks") and not fallback_sites:
        for op, n in dict(m["fallbacks"]).items():  # type: ignore[arg-type]
            events.append({"kind": "fallback", "path": str(cand_script), "line": None, "original_line": None,
                           "source": None, "count": n, "detail": op})
    for e in events:
        if e["kind"] == "fallback" and all(_backend_only(op, device) for op in str(e["detail"]).split(", ")):
            e["backend_only"] = True
            e["detail"] = f"{e['detail']}; lowered on a TPU, it falls back on XLA's {device.upper()} backend only"
    failures = [o.name for o in outputs if not o.ok]
    if steady_recompiles:
        failures.append(f"{steady_recompiles} recompilation(s) after {warmup_steps} warm-up step(s)")
    # with steps, only fallbacks in the steady-state loop fail (others are
    # events); without steps nothing tells the hot loop apart, so any does
    hot_fallbacks = traced_steps["fallbacks_after_warmup"] if traced_steps else dict(m.get("fallbacks") or {})  # type: ignore[index]
    metrics["fallbacks_after_warmup"] = hot_fallbacks
    held = {op: n for op, n in hot_fallbacks.items() if not _backend_only(op, device)}  # type: ignore[union-attr]
    if held:
        ops = ", ".join(f"{op} x{n}" for op, n in held.items())
        failures.append(f"CPU fallbacks in the loop after warm-up: {ops}")
    per_step = metrics["host_reads_per_step"]
    if max_host_reads_per_step is not None and per_step is not None and per_step > max_host_reads_per_step:  # type: ignore[operator]
        failures.append(f"{per_step:g} host read(s) per step > --max-host-reads-per-step {max_host_reads_per_step:g}")
    from xlaport.verify.model import Report

    report = Report("fail" if failures else "pass", outputs, metrics, events)
    report.failures = failures
    report.varies = compared.varies
    report.by_form = compared.by_form
    report.not_compared = compared.not_compared
    report.float_order = compared.float_order
    return report


def judge_steps(steps: List[Dict[str, object]], warmup: int) -> Dict[str, object]:
    """Per-step deltas from the harness's cumulative snapshots, and the
    compilations that happen after each sync site's first ``warmup`` steps."""
    per_step: List[Dict[str, object]] = []
    seen: Dict[tuple, int] = {}
    after = 0
    sites: Dict[tuple, Dict[str, object]] = {}
    prev: Dict[str, object] = {"compiles": 0, "cached_compiles": 0, "executions": 0, "transfers": 0, "time": 0.0,
                               "fallbacks": {}}
    hot_fallbacks: Dict[str, int] = {}
    for i, snap in enumerate(steps):
        site = (snap.get("path"), snap.get("line"))
        seen[site] = seen.get(site, 0) + 1
        delta = {k: snap.get(k, 0) - prev.get(k, 0)  # type: ignore[operator]
                 for k in ("compiles", "cached_compiles", "executions", "transfers")}
        before = dict(prev.get("fallbacks") or {})  # type: ignore[call-overload]
        fell = {op: n - before.get(op, 0) for op, n in dict(snap.get("fallbacks") or {}).items()  # type: ignore[call-overload]
                if n != before.get(op, 0)}
        per_step.append({"step": i + 1, "path": snap.get("path"), "line": snap.get("line"), **delta,
                         "seconds": round(float(snap["time"]) - float(prev["time"]), 6),  # type: ignore[arg-type]
                         **({"fallbacks": fell} if fell else {})})
        if seen[site] > warmup and delta["compiles"]:
            after += int(delta["compiles"])
            entry = sites.setdefault(site, {"where": site, "count": 0, "steps": [], "site_steps": []})
            entry["count"] = int(entry["count"]) + int(delta["compiles"])  # type: ignore[call-overload]
            entry["steps"].append(i)  # type: ignore[union-attr]
            entry["site_steps"].append(seen[site] - 1)  # type: ignore[union-attr]
        if seen[site] > warmup:
            for op, n in fell.items():
                hot_fallbacks[op] = hot_fallbacks.get(op, 0) + n
        prev = snap
    for where, entry in sites.items():
        entry["site_total"] = seen[where]
    loop = [s for s in per_step[1:]]  # the first step also carries set-up transfers
    reads = (sum(int(s["transfers"]) for s in loop) / len(loop)) if loop else None  # type: ignore[call-overload]
    return {"per_step": per_step, "compiles_after_warmup": after, "recompile_sites": list(sites.values()),
            "host_reads_per_step": reads, "fallbacks_after_warmup": hot_fallbacks}


# ----------------------------------------------------------------- recompiles

_LOCATION = re.compile(r"location=(?:[^@,]*@)?([^,:]+):(\d+)")
_IR_ID = re.compile(r"%\d+")


_OP = re.compile(r"^%\d+ = \S+ ([\w:.]+)\(")


def _signature(ir: List[str]) -> tuple:
    """The ops of a graph, without shapes, constants' values or locations:
    two graphs with one signature are one computation with different shapes
    or constants, which is what makes compilations grow with the steps."""
    ops: Dict[str, int] = {}
    for line in ir:
        m = _OP.match(line)
        if m:
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    return tuple(sorted(ops.items()))


def _at_site(graphs: List[Dict[str, object]], site: Dict[str, object]) -> List[Dict[str, object]]:
    """The dumped graphs cut at one sync site, in order."""
    _, line = site["where"]  # type: ignore[misc]
    return [g for g in graphs if any(int(f[2]) == line for f in g["frames"])]  # type: ignore[union-attr]


def in_runs(steps: List[int]) -> int:
    """How many of a site's steps with a new graph come right after or before
    another: new ops step after step is growth; new graphs with steps run from
    the cache between them (an epoch's first step after its last one's reads)
    are one-offs, each compiled once."""
    at = set(steps)
    return sum(1 for n in steps if n - 1 in at or n + 1 in at)


def settled_then_last(site: Dict[str, object], warmup: int) -> bool:
    """A sync site whose compilations after warm-up fall on its last two
    steps only, after at least one step run from the cache: the loop had
    settled on one graph, and only its end compiled (a final step's other
    branch, ``if t == 0``; a counter handed to the device reaching 1 and 0,
    which XLA bakes into the graph as special scalars).  That cost is the
    same at any length; growth never runs a step from the cache."""
    steps = [int(n) for n in site.get("site_steps", [])]  # type: ignore[union-attr]
    total = int(site.get("site_total", 0))  # type: ignore[call-overload]
    return bool(steps) and len(steps) <= 2 and min(steps) >= total - 2 and min(steps) > warmup


def classify_recompiles(graphs: List[Dict[str, object]], site: Dict[str, object]) -> Dict[str, List[int]]:
    """Split the compilations after warm-up at one sync site into ``churn``
    (the graph of an earlier step again, with other shapes or constants),
    ``new_path`` (ops no earlier step at this site ran: another branch, such as
    a solver's last step) and ``recurring`` (a graph compiled once that later
    steps run again from the cache: it comes back, it does not grow).  Values are the site's 0-based step numbers.  Each
    sync at the site dumps one graph, so the site's n-th graph is its n-th step;
    ``graphs`` are the site's graphs (:func:`_at_site`)."""
    signatures = [_signature(g["ir"]) for g in graphs]  # type: ignore[arg-type]
    out: Dict[str, List[int]] = {"churn": [], "new_path": [], "recurring": []}
    for n in site.get("site_steps", []):  # type: ignore[union-attr]
        if n >= len(graphs):
            out["churn"].append(n)  # no dump to judge by: count it against the script
            continue
        earlier = graphs[:n]
        if any(g["hash"] == graphs[n]["hash"] for g in earlier):
            continue  # not a compilation of this graph (the count came from elsewhere)
        if any(g["hash"] == graphs[n]["hash"] for g in graphs[n + 1:]):
            # compiled once and run again at later steps from the cache (the
            # step after each log read, every 200 batches): a graph that comes
            # back, not one per step
            out["recurring"].append(n)
            continue
        out["churn" if signatures[n] in signatures[:n] else "new_path"].append(n)
    return out


# ops whose IR text leaves out the values that go into the graph's hash,
# slices and selections first (their offsets), constants last
_HIDDEN_VALUES = ("xla::generic_slice", "xla::select", "aten::select", "aten::slice", "aten::narrow",
                  "aten::as_strided", "xla::update_slice", "aten::diagonal", "aten::expand", "prim::Constant")


def locate_recompile(graphs: List[Dict[str, object]], lines: "LineMapper",
                     site: Optional[tuple] = None) -> Optional[tuple]:
    """Diff the IR of the last two different graphs cut at the recompiling
    sync site (``graphs``: :func:`_at_site`); return (path, line, detail) of
    the first node that differs and comes from the candidate's own code --
    not from the sync itself (``site``), whose nodes only carry the values
    cut there: the op that makes the graphs differ is earlier."""
    distinct: List[Dict[str, object]] = []
    for g in graphs:
        if not distinct or g["hash"] != distinct[-1]["hash"]:
            distinct.append(g)
    if len(distinct) < 2:
        return None
    old, new = distinct[-2], distinct[-1]

    def norm(l: str) -> str:
        return _IR_ID.sub("%", l)

    carried = _grown_input(old, new, lines)
    if carried is not None:
        return carried
    old_set = {norm(l) for l in old["ir"]}  # type: ignore[union-attr]
    changed = [l for l in new["ir"] if norm(l) not in old_set]  # type: ignore[union-attr]
    if not changed:
        # the same IR text, another hash: the graphs differ in what the text
        # does not print -- a slice's offsets (`sigmas[i]`), a constant's value
        changed = [l for l in new["ir"] if any(f" {op}(" in l for op in _HIDDEN_VALUES)]  # type: ignore[union-attr]
    found: List[tuple] = []
    for l in changed:
        loc = _LOCATION.search(l)
        path = lines.resolve(loc.group(1)) if loc else None
        if path is not None and (str(path), int(loc.group(2))) not in found:  # type: ignore[union-attr]
            found.append((str(path), int(loc.group(2))))  # type: ignore[union-attr]
    if site is not None:
        site_path = lines.resolve(str(site[0])) if site[0] else None
        causes = [f for f in found if (Path(f[0]), f[1]) != (site_path, site[1])]
        found = causes or found
    if not found:
        return None
    others = sorted({line for p, line in found[1:] if p == found[0][0]} - {found[0][1]})
    detail = "the graph differs from the previous step's here"
    if others:
        detail += f" (also line{'s' if len(others) > 1 else ''} {', '.join(map(str, others[:5]))})"
    return found[0][0], found[0][1], detail


_SHAPE = re.compile(r"^%\d+ = (\S+) ")


def _shapes_of_inputs(ir: List[str]) -> "collections.Counter[str]":
    return collections.Counter(m.group(1) for l in ir if " xla::device_data()" in l and (m := _SHAPE.match(l)))


def _grown_input(old: Dict[str, object], new: Dict[str, object], lines: "LineMapper") -> Optional[tuple]:
    """A value fed back from one step to the next with a new shape (a
    sequence grown by ``torch.cat``): the newer graph takes an input of a
    shape the older did not, and the older graph computed a result of
    exactly that shape.  The line of that result is what changes the graph
    -- not the first op that reads it (a model's ``arange``), which only
    follows.  (path, line, detail) of the user's line, or None."""
    grown = _shapes_of_inputs(new["ir"]) - _shapes_of_inputs(old["ir"])  # type: ignore[arg-type]
    if not grown:
        return None
    for l in old["ir"]:  # type: ignore[union-attr]
        m, loc = _SHAPE.match(l), _LOCATION.search(l)
        if ", ROOT=" not in l or m is None or m.group(1) not in grown or loc is None:
            continue
        path = lines.resolve(loc.group(1))
        if path is not None:
            return (str(path), int(loc.group(2)),
                    f"the value computed here ({m.group(1).split('{')[0]}) is the next step's input with a new "
                    "shape, so every op that reads it compiles again")
    return None


def innermost_loop(path: Path, line: int) -> Optional[Tuple[int, int]]:
    """(first, last) line of the innermost ``for``/``while`` of ``path`` that
    holds ``line`` (its header included), or None."""
    import ast

    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    spans = [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
             if isinstance(n, (ast.For, ast.While, ast.AsyncFor)) and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return max(spans) if spans else None


def where_detail(where: Optional[tuple], site: Dict[str, object]) -> str:
    if where:
        return f"{where[2]}; graph cut at the barrier on line {site['where'][1]} of the conversion"  # type: ignore[index]
    return f"new graph compiled at this sync after warm-up (steps {site['steps']})"


class LineMapper:
    """Lines of the candidate's files -> lines of the user's files (for
    events): a file of the candidate's tree maps to the same relative path
    in the project, through the same line map as lint."""

    def __init__(self, original: Path, converted: Path, cand_tree: Optional[Path] = None,
                 root: Optional[Path] = None, shown: Optional[Tuple[Optional[Path], Optional[Path]]] = None) -> None:
        self.converted = converted.resolve()
        self.original = original
        self.cand_tree = cand_tree.resolve() if cand_tree is not None else None
        self.root = root
        # where the user sees the candidate's files: the converted tree (or
        # script) --converted named; None: they exist only in the scratch tree
        self.user_tree, self.user_script = shown or (None, None)
        self._maps: Dict[str, tuple] = {}
        self.original_lines, self.back = self._load(original, self.converted)

    @staticmethod
    def _load(original: Path, converted: Path) -> tuple:
        from xlaport.linemap import line_map as _line_map

        try:
            text = original.read_text(errors="replace")
            return text.splitlines(), _line_map(text, converted.read_text(errors="replace"))
        except OSError:
            return [], None

    def shown(self, name: object) -> object:
        """A candidate file as the user can find it: in the converted tree
        ``--converted`` named, or else its path relative to the project (the
        scratch copy is gone when verify ends)."""
        if name is None:
            return None
        path = Path(str(name)).resolve()
        if self.user_script is not None and path == self.converted:
            return str(self.user_script)
        rel = self._relative(path)
        if rel is None:
            return str(name)
        return str(self.user_tree / rel) if self.user_tree is not None else rel.as_posix()

    def _relative(self, path: Path) -> Optional[Path]:
        """``path``'s place in the candidate's tree (of this run or another)."""
        if self.cand_tree is None:
            return None
        try:
            return path.relative_to(self.cand_tree)
        except ValueError:
            # another run's copy of the candidate (scratch/xla-N/<root>/...): the same file
            try:
                parts = path.relative_to(self.cand_tree.parent.parent).parts
            except ValueError:
                return None
            if len(parts) < 3 or not parts[0].startswith("xla-") or parts[1] != self.cand_tree.name:
                return None
            return Path(*parts[2:])

    def _for(self, path: Path) -> Optional[tuple]:
        """(the user's file, its lines, the line map) for a candidate file."""
        if path == self.converted:
            return self.original, self.original_lines, self.back
        if self.cand_tree is None or self.root is None:
            return None
        rel = self._relative(path)
        if rel is None:
            return None
        path = self.cand_tree / rel
        key = rel.as_posix()
        if key not in self._maps:
            original = self.root / rel
            lines, back = self._load(original, path)
            self._maps[key] = (original, lines, back)
        return self._maps[key]

    def resolve(self, name: str) -> Optional[Path]:
        """The candidate's file an IR location names (a path, or a bare file
        name when it is the only one of that name in the candidate's tree)."""
        path = Path(name)
        if path.is_absolute():
            path = path.resolve()
            return path if self._for(path) is not None else None
        if path.name == self.converted.name:
            return self.converted
        if self.cand_tree is None:
            return None
        matches = [p for p in self.cand_tree.rglob(path.name) if p.suffix == ".py"]
        return matches[0].resolve() if len(matches) == 1 else None

    def loop_around(self, where: tuple) -> Optional[List[object]]:
        """[the user's file, the line of the innermost loop] around a line
        of a candidate file (the barrier a graph is cut at), or None."""
        path = Path(str(where[0])).resolve() if where[0] else None
        found = self._for(path) if path is not None else None
        span = innermost_loop(path, int(where[1])) if found is not None and found[2] else None  # type: ignore[arg-type]
        return [str(found[0]), found[2](span[0])] if span is not None else None  # type: ignore[index]

    def event(self, kind: str, where: tuple, count: object, detail: object) -> Dict[str, object]:
        path, line = where[0], where[1]
        found = self._for(Path(path).resolve()) if path is not None else None
        original = source = original_path = None
        if found is not None:
            original_path, lines, back = found
            original = back(line) if (back and line) else None
            source = lines[original - 1].strip() if original and original <= len(lines) else None
        return {"kind": kind, "path": self.shown(path), "line": line,
                "original_path": str(original_path) if original_path else None,
                "original_line": original, "source": source, "count": count, "detail": detail}


def _backend_only(op: str, device: str) -> bool:
    """Does ``op`` (``aten::upsample_nearest2d_backward``) fall back here only
    because this is not a TPU (codemods/xla_ops_data.py, measured)?"""
    from codemods.xla_ops_data import TPU_ONLY_LOWERING

    return device != "tpu" and op.split("::")[-1] in TPU_ONLY_LOWERING
