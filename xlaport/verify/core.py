"""Run reference and candidate, compare outputs, judge compile behaviour."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from xlaport.engine import Settings, transform
from xlaport.verify import growth, record
from xlaport.verify.outputs import Compared, compare, output_files

ROOT = Path(__file__).resolve().parents[2]


class VerifyError(Exception):
    """The program could not be verified (crash, timeout, missing runtime)."""


@dataclass
class Run:
    ok: bool
    stdout: str
    metrics: Dict[str, object]
    files: Dict[str, Path]
    error: Optional[str]
    workdir: Path
    data: Dict[str, object] = field(default_factory=dict)  # everything the harness recorded


def convert_file(script: Path, target: str, out_dir: Path, settings: Optional[Settings] = None) -> Path:
    s = settings or Settings()
    s = Settings(select=s.select, ignore=s.ignore, target=target, options=s.options)
    if target == "cpu":  # the reference: only the device swap, retargeted to the CPU
        s = Settings(select=["XLA1"], target="cpu")
    out = out_dir / script.name
    out.write_bytes(transform(script.read_bytes(), s, str(script)).code)
    return out


def run_script(script: Path, mode: str, args: Sequence[str], timeout: float, python: str = sys.executable,
               extra_env: Optional[Dict[str, str]] = None, parent: Optional[Path] = None) -> Run:
    """Run ``script`` under the harness in a child process with its own scratch
    directory (under ``parent``); ``mode`` is cpu, cuda (reference) or xla (candidate)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"xlaport-{mode}-", dir=parent))
    shutil.copy2(script, workdir / script.name)
    result_path = workdir / ".xlaport-result.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(script.parent), env.get("PYTHONPATH", "")])
    if mode == "xla":
        env.setdefault("PJRT_DEVICE", "CPU")
    elif mode == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra_env or {})
    cmd = [python, "-m", "xlaport.verify.harness", mode, str(result_path), str(workdir / script.name), *args]
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise VerifyError(f"{script.name} ({mode} run) ran past --timeout {timeout:g}s and was killed")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing the script started stays behind
        except ProcessLookupError:
            pass
    if not result_path.exists():
        raise VerifyError(f"{script.name} ({mode} run) died (exit {proc.returncode}):\n{stderr[-4000:]}")
    data = json.loads(result_path.read_text())
    if not data["ok"]:
        # the script's own words (an argparse usage error, a traceback) come first
        said = stderr.strip()[-3000:]
        raise VerifyError(f"{script.name} ({mode} run) failed: {data['error'][-3000:]}"
                          + (f"\n{said}" if said and said not in data["error"] else ""))
    files = output_files(workdir, script.name)
    return Run(True, data["stdout"], data.get("metrics", {}), files, None, workdir, data)


@dataclass
class Report:
    verdict: str
    outputs: List[Compared] = field(default_factory=list)
    metrics: Dict[str, object] = field(default_factory=dict)
    events: List[Dict[str, object]] = field(default_factory=list)
    error: Optional[str] = None
    failures: List[str] = field(default_factory=list)
    varies: List[str] = field(default_factory=list)
    not_compared: List[str] = field(default_factory=list)
    config: Dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, object]:
        return {
            "verdict": self.verdict,
            "config": self.config,
            "outputs": [o.__dict__ for o in self.outputs],
            "varies_between_runs": self.varies,
            "not_compared": self.not_compared,
            "metrics": self.metrics,
            "events": self.events,
            "failures": self.failures,
            "error": self.error,
        }


def _cuda_available(python: str) -> bool:
    if not any(Path("/dev").glob("nvidia*")):
        return False
    probe = subprocess.run([python, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                           capture_output=True, env={**os.environ, "PJRT_DEVICE": ""})
    return probe.returncode == 0


def verify(script: Path, converted: Optional[Path] = None, args: Sequence[str] = (), rtol: float = 1e-3,
           atol: float = 1e-5, timeout: float = 600, max_host_reads_per_step: Optional[float] = None,
           python: str = sys.executable, warmup_steps: int = 2, reference: str = "auto",
           device: str = "cpu", reference_runs: int = 2, lengths: Optional[str] = None, keep: bool = False,
           record_to: Optional[Path] = None, against: Optional[Path] = None) -> Report:
    """Run the reference and the candidate, compare, and judge (see the README).

    ``record_to``: run only the reference and store it there; ``against``:
    compare with such a record instead of running the original.  Temporary
    directories are removed unless ``keep``."""
    script = Path(script).resolve()
    config: Dict[str, object] = {
        "script": str(script), "converted": str(converted) if converted else None, "args": list(args),
        "rtol": rtol, "atol": atol, "warmup_steps": warmup_steps, "reference": reference, "device": device,
        "reference_runs": reference_runs, "lengths": lengths, "against": str(against) if against else None,
        "environment": record.environment(python),
    }
    scratch = Path(tempfile.mkdtemp(prefix="xlaport-verify-"))
    if keep:
        config["kept"] = str(scratch)
    try:
        report = _verify(script, converted, list(args), rtol, atol, timeout, max_host_reads_per_step, python,
                         warmup_steps, reference, device, max(1, reference_runs), lengths, record_to, against,
                         scratch)
    except VerifyError as exc:
        report = Report("error", error=str(exc))
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    report.config = config
    return report


def _verify(script: Path, converted: Optional[Path], args: List[str], rtol: float, atol: float, timeout: float,
            max_host_reads_per_step: Optional[float], python: str, warmup_steps: int, reference: str, device: str,
            reference_runs: int, lengths: Optional[str], record_to: Optional[Path], against: Optional[Path],
            scratch: Path) -> Report:
    import importlib.util

    length_spec = growth.parse_lengths(lengths) if lengths else None  # checked before anything runs
    (scratch / "ref").mkdir()
    (scratch / "xla").mkdir()
    if reference == "cuda" and not _cuda_available(python):
        raise VerifyError("--reference cuda: no CUDA device here (use --reference auto or cpu)")
    use_cuda = reference == "cuda" or (reference == "auto" and _cuda_available(python))
    ref_kind = "cuda" if use_cuda else "cpu"
    if against is not None:
        try:
            recorded, ref_stdouts, ref_files = record.read(Path(against))
        except ValueError as exc:
            raise VerifyError(str(exc)) from None
        ref_kind = f"record ({recorded.get('device')})"
    else:
        if use_cuda:  # the original, unchanged, on the GPU
            ref_script = scratch / "ref" / script.name
            shutil.copy2(script, ref_script)
        else:
            ref_script = convert_file(script, "cpu", scratch / "ref")
        refs = [run_script(ref_script, "cuda" if use_cuda else "cpu", args, timeout, python, parent=scratch)
                for _ in range(reference_runs)]
        ref_stdouts, ref_files = [r.stdout for r in refs], [r.files for r in refs]
        if record_to is not None:
            record.write(Path(record_to), script, args, ref_kind, [(r.stdout, r.files) for r in refs],
                         [float(r.data.get("seconds", 0.0)) for r in refs])  # type: ignore[arg-type]
            return Report("recorded", metrics={"reference": ref_kind, "runs": len(refs)})
    if importlib.util.find_spec("torch_xla") is None and python == sys.executable:
        raise VerifyError("torch_xla is not installed here: pip install 'torch==2.9.0' 'torch_xla==2.9.0' "
                          "(or, from a checkout, `make setup`)")
    cand_script = Path(converted).resolve() if converted else convert_file(script, "torch_xla-2.9", scratch / "xla")
    graphs = scratch / "graphs.txt"
    xla_env = {"PJRT_DEVICE": device.upper(), "XLA_IR_DEBUG": "1",
               "XLA_SAVE_TENSORS_FILE": str(graphs), "XLA_SAVE_TENSORS_FMT": "text"}
    cand = run_script(cand_script, "xla", args, timeout, python, xla_env, parent=scratch)
    fallback_sites: List[Dict[str, object]] = []
    if cand.metrics.get("fallbacks"):
        # a second run ties each fallback to the line that called the op
        traced = run_script(cand_script, "xla", args, timeout, python,
                            {"PJRT_DEVICE": device.upper(), "XLAPORT_TRACE_FALLBACKS": "1"}, parent=scratch)
        fallback_sites = list(traced.data.get("fallback_sites", []))  # type: ignore[arg-type]
    lines = LineMapper(script, cand_script)
    length_runs: List[Dict[str, object]] = []
    if length_spec is not None:
        name, values = length_spec
        for k, value in enumerate(values):
            dump = scratch / f"graphs-{k}" / "graphs.txt"
            dump.parent.mkdir()
            run = run_script(cand_script, "xla", growth.with_length(args, name, value), timeout, python,
                             {**xla_env, "XLA_SAVE_TENSORS_FILE": str(dump)}, parent=scratch)
            length_runs.append({"value": value, "compiles": int(run.metrics.get("compiles", 0)),  # type: ignore[call-overload]
                                "largest_graph": growth.largest_graph(_read_graphs(dump.parent))})
    compared = compare(ref_stdouts, ref_files, cand.stdout, cand.files, rtol, atol)
    report = judge(cand, compared, lines, graphs, warmup_steps, max_host_reads_per_step, fallback_sites, ref_kind)
    _judge_device_work(report, cand, script, cand_script, lines)
    if length_spec is not None:
        report.metrics["lengths"] = length_runs
        loops = [lines.back(l) if lines.back else l for l in growth.unsynced_loops(cand_script)]
        report.failures += growth.judge_lengths(length_spec[0], length_spec[1],
                                                [int(r["compiles"]) for r in length_runs],  # type: ignore[call-overload]
                                                [int(r["largest_graph"]) for r in length_runs], loops)  # type: ignore[call-overload]
    report.verdict = "fail" if report.failures else "pass"
    return report


def _judge_device_work(report: Report, cand: Run, script: Path, cand_script: Path, lines: "LineMapper") -> None:
    """A candidate that did nothing on XLA, left its model on the CPU, or
    runs a step loop with no barrier (one graph growing with the loop)."""
    from codemods.analysis.cuda import count_references
    from codemods.base import TreeCache
    import libcst as cst

    executions = int(report.metrics.get("executions", 0) or 0)  # type: ignore[call-overload]
    if executions == 0:
        report.failures.append("the conversion did no work on XLA (0 executions): its model and data stayed "
                               "on the CPU")
    try:
        source = script.read_bytes()
        used_cuda = count_references(TreeCache(cst.parse_module(source), source)) > 0
    except (OSError, cst.ParserSyntaxError):
        used_cuda = False
    on_cpu = sorted(name for name, kind in dict(cand.data.get("leftover_devices") or {}).items()  # type: ignore[call-overload]
                    if kind == "cpu")
    if used_cuda and on_cpu:
        report.failures.append(f"left on the CPU where the original used CUDA: {', '.join(on_cpu)}")
    if executions:
        for line in growth.unsynced_loops(cand_script):
            report.events.append(lines.event("no_barrier", (str(cand_script), line), 1,
                                             "a step loop with no barrier: every iteration is added to one graph "
                                             "that grows with the loop (xlaport would put `torch_xla.sync()` at "
                                             "the end of its body)"))
            report.failures.append(f"a step loop runs on the device without a barrier (line {line})")


def judge(cand: Run, compared, lines: "LineMapper", graphs: Path, warmup_steps: int,
          max_host_reads_per_step: Optional[float], fallback_sites: List[Dict[str, object]], ref_kind: str) -> Report:
    """Outputs, compile behaviour per step, host reads and fallbacks."""
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
        "host_reads_per_step": judged["host_reads_per_step"],
        "scalar_reads": m.get("scalar_reads", 0),
        "fallbacks": m.get("fallbacks", {}),
        "compile_seconds": m.get("compile_seconds", 0.0),
        "seconds": m.get("seconds", 0.0),
        "warmup_steps": warmup_steps,
        "reference": ref_kind,
        "per_step": judged["per_step"],
    }
    events: List[Dict[str, object]] = []
    steady_recompiles = 0
    dumped = _read_graphs(graphs.parent) if judged["recompile_sites"] else []
    for site in judged["recompile_sites"]:  # type: ignore[union-attr]
        at_site = _at_site(dumped, site)
        kinds = classify_recompiles(at_site, site)
        # one graph with new ops after warm-up (a last step that takes another
        # branch) is compiled once and does not grow with the steps; the same
        # graph with new shapes or constants, or new ops again and again, does
        bad = len(kinds["churn"]) + (len(kinds["new_path"]) if len(kinds["new_path"]) > 1 else 0)
        steady_recompiles += bad
        if bad:
            where = locate_recompile(at_site, cand_script)
            events.append(lines.event("recompile", where or site["where"], bad, where_detail(where, site)))
        else:
            steps_at = ", ".join(str(n + 1) for n in kinds["new_path"])
            events.append(lines.event("new_graph", site["where"], len(kinds["new_path"]),
                                      f"one graph with different ops at this sync's step {steps_at} (another "
                                      "branch, e.g. a final step): compiled once, not once per step"))
    metrics["steady_state_recompiles"] = steady_recompiles
    for read in cand.data.get("host_reads", []):  # type: ignore[union-attr]
        events.append(lines.event("host_read", (read["path"], read["line"]), read["count"], read["detail"]))
    for fb in fallback_sites:
        events.append(lines.event("fallback", (fb["path"], fb["line"]), fb["count"], fb["detail"]))
    if m.get("fallbacks") and not fallback_sites:
        for op, n in dict(m["fallbacks"]).items():  # type: ignore[arg-type]
            events.append({"kind": "fallback", "path": str(cand_script), "line": None, "original_line": None,
                           "source": None, "count": n, "detail": op})
    failures = [o.name for o in outputs if not o.ok]
    if steady_recompiles:
        failures.append(f"{steady_recompiles} recompilation(s) after {warmup_steps} warm-up step(s)")
    # with steps, only fallbacks in the steady-state loop fail (others are
    # events); without steps nothing tells the hot loop apart, so any does
    hot_fallbacks = judged["fallbacks_after_warmup"] if steps else dict(m.get("fallbacks") or {})  # type: ignore[arg-type]
    metrics["fallbacks_after_warmup"] = hot_fallbacks
    if hot_fallbacks:
        ops = ", ".join(f"{op} x{n}" for op, n in hot_fallbacks.items())  # type: ignore[union-attr]
        failures.append(f"CPU fallbacks in the loop after warm-up: {ops}")
    per_step = judged["host_reads_per_step"]
    if max_host_reads_per_step is not None and per_step is not None and per_step > max_host_reads_per_step:  # type: ignore[operator]
        failures.append(f"{per_step:g} host read(s) per step > --max-host-reads-per-step {max_host_reads_per_step:g}")
    report = Report("fail" if failures else "pass", outputs, metrics, events)
    report.failures = failures
    report.varies = compared.varies
    report.not_compared = compared.not_compared
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
    loop = [s for s in per_step[1:]]  # the first step also carries set-up transfers
    reads = (sum(int(s["transfers"]) for s in loop) / len(loop)) if loop else None  # type: ignore[call-overload]
    return {"per_step": per_step, "compiles_after_warmup": after, "recompile_sites": list(sites.values()),
            "host_reads_per_step": reads, "fallbacks_after_warmup": hot_fallbacks}


# ----------------------------------------------------------------- recompiles

_LOCATION = re.compile(r"location=(?:[^@,]*@)?([^,:]+):(\d+)")
_IR_ID = re.compile(r"%\d+")


def _read_graphs(directory: Path) -> List[Dict[str, object]]:
    """The graphs torch_xla dumped (XLA_SAVE_TENSORS_FILE, text format), in
    order: their sync site frames, hash and IR lines."""
    graphs: List[Dict[str, object]] = []
    for dump in sorted(directory.glob("graphs.txt*")):
        text = dump.read_text(errors="replace")
        for chunk in text.split("[ScheduleSyncTensorsGraph]")[1:]:
            frames = re.findall(r"^\s+(\S+) \((.+):(\d+)\)$", chunk.split("## BEGIN_GRAPH")[0], re.M)
            body = chunk.split("## BEGIN_GRAPH", 1)[1] if "## BEGIN_GRAPH" in chunk else ""
            ir = [l.strip() for l in body.split("\n}", 1)[0].splitlines() if l.strip().startswith("%")]
            h = re.search(r"Graph Hash: (\w+)", body)
            graphs.append({"frames": frames, "hash": h.group(1) if h else None, "ir": ir})
    return graphs


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


def classify_recompiles(graphs: List[Dict[str, object]], site: Dict[str, object]) -> Dict[str, List[int]]:
    """Split the compilations after warm-up at one sync site into ``churn``
    (the graph of an earlier step again, with other shapes or constants) and
    ``new_path`` (ops no earlier step at this site ran: another branch, such as
    a solver's last step).  Values are the site's 0-based step numbers.  Each
    sync at the site dumps one graph, so the site's n-th graph is its n-th step;
    ``graphs`` are the site's graphs (:func:`_at_site`)."""
    signatures = [_signature(g["ir"]) for g in graphs]  # type: ignore[arg-type]
    out: Dict[str, List[int]] = {"churn": [], "new_path": []}
    for n in site.get("site_steps", []):  # type: ignore[union-attr]
        if n >= len(graphs):
            out["churn"].append(n)  # no dump to judge by: count it against the script
            continue
        earlier = graphs[:n]
        if any(g["hash"] == graphs[n]["hash"] for g in earlier):
            continue  # not a compilation of this graph (the count came from elsewhere)
        out["churn" if signatures[n] in signatures[:n] else "new_path"].append(n)
    return out


def locate_recompile(graphs: List[Dict[str, object]], script: Path) -> Optional[tuple]:
    """Diff the IR of the last two different graphs cut at the recompiling
    sync site (``graphs``: :func:`_at_site`); return (path, line, detail) of
    the first node that differs and comes from user code."""
    distinct: List[Dict[str, object]] = []
    for g in graphs:
        if not distinct or g["hash"] != distinct[-1]["hash"]:
            distinct.append(g)
    if len(distinct) < 2:
        return None
    old, new = distinct[-2], distinct[-1]

    def norm(l: str) -> str:
        return _IR_ID.sub("%", l)

    old_set = {norm(l) for l in old["ir"]}  # type: ignore[union-attr]
    lines: List[int] = []
    for l in new["ir"]:  # type: ignore[union-attr]
        if norm(l) in old_set:
            continue
        loc = _LOCATION.search(l)
        if loc and Path(loc.group(1)).name == script.name:
            lines.append(int(loc.group(2)))
    if not lines:
        return None
    others = sorted(set(lines) - {lines[0]})
    detail = "the graph differs from the previous step's here"
    if others:
        detail += f" (also lines {', '.join(map(str, others[:5]))})"
    return str(script), lines[0], detail


def where_detail(where: Optional[tuple], site: Dict[str, object]) -> str:
    if where:
        return f"{where[2]}; graph cut at line {site['where'][1]}"  # type: ignore[index]
    return f"new graph compiled at this sync after warm-up (steps {site['steps']})"


class LineMapper:
    """Converted-file lines -> original-file lines (for events)."""

    def __init__(self, original: Path, converted: Path) -> None:
        from xlaport.linemap import line_map as _line_map

        self.converted = converted.resolve()
        self.original_lines: List[str] = []
        try:
            text = original.read_text(errors="replace")
            self.original_lines = text.splitlines()
            self.back = _line_map(text, converted.read_text(errors="replace"))
        except OSError:
            self.back = None

    def event(self, kind: str, where: tuple, count: object, detail: object) -> Dict[str, object]:
        path, line = where[0], where[1]
        same = path is not None and Path(path).name == self.converted.name
        original = self.back(line) if (same and self.back and line) else None
        source = self.original_lines[original - 1].strip() if original and original <= len(self.original_lines) else None
        return {"kind": kind, "path": str(self.converted) if same else path, "line": line,
                "original_line": original, "source": source, "count": count, "detail": detail}
