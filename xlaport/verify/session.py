"""One verification, step by step: the reference runs, the candidate runs,
the runs at other lengths, the comparison and the verdict.  Every run gets
a fresh copy of the project (``xlaport.verify.project``)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from xlaport.engine import Settings, SourceError, transform
from xlaport.verify import diverge, growth, record, rng
from xlaport.verify.compiles import LineMapper, judge
from xlaport.verify.core import _cuda_available, _inside, convert_sources, run_side
from xlaport.verify.crashes import _innermost, _what_killed, needs_cuda
from xlaport.verify.model import (
    LEFTOVERS,
    NothingToPort,
    Options,
    Report,
    Run,
    VerifyError,
)
from xlaport.verify.outputs import Comparison, compare, tolerance, within_float_order
from xlaport.verify.predicted import growth_reported, predicted
from xlaport.verify.project import Project, Side, build_side
from xlaport.verify.syncs import read_graphs


class Session:
    def __init__(self, project: Project, converted: Optional[Path], args: List[str], opts: Options,
                 scratch: Path) -> None:
        self.project, self.converted, self.args, self.opts, self.scratch = project, converted, args, opts, scratch
        # the conversion runs with its own arguments where the user gave them (`--device xla` for `--device cuda`)
        self.cand_args = list(opts.converted_args) if opts.converted_args is not None else args
        self._count = 0
        self._lock = threading.Lock()
        self._sources: Dict[str, Tuple[Dict[str, bytes], Optional[Path], List[str]]] = {}
        self._latest: Dict[str, Side] = {}  # the last copy made for each side
        self.ref_name = "orig"  # the side the reference runs: the original, or its CPU retargeting
        self.reference_is = "the original, unmodified, on the CPU"

    # -- trees and runs ------------------------------------------------------
    def side(self, name: str) -> Side:
        """A fresh copy of the project for one run of side ``name``."""
        sources, files_from, _ = self.sources(name)
        with self._lock:  # (the candidate may be starting beside the references)
            self._count += 1
            dest = self.scratch / f"{name}-{self._count}" / self.project.root.name
        self._latest[name] = build_side(self.project, name, dest, sources, files_from)
        return self._latest[name]

    def sources(self, name: str) -> Tuple[Dict[str, bytes], Optional[Path], List[str]]:
        """(converted modules, a converted tree to copy instead of the
        project, extra import paths) for side ``name``; once per side."""
        if name not in self._sources:
            if name in ("cuda", "orig"):
                self._sources[name] = ({}, None, [])  # the original, unchanged
            elif name == "ref":
                self._sources[name] = (convert_sources(self.project, "cpu"), None, [])
            else:
                self._sources[name] = self._candidate_sources()
        return self._sources[name]

    def _candidate_sources(self) -> Tuple[Dict[str, bytes], Optional[Path], List[str]]:
        """The default conversion of every module; or the converted tree
        ``--converted`` points into (a directory, or the converted script at
        the same place in its tree); or, for a converted script outside such
        a tree, the default conversion with that script, and its directory
        on the import path (a converted package beside it)."""
        converted = self.converted
        if converted is None:
            return convert_sources(self.project, "torch_xla-2.9"), None, []
        converted = converted.resolve()
        if converted.is_dir():
            return {}, converted, []
        rel = self.project.rel_script
        tree = converted
        for _ in rel.parts:
            tree = tree.parent
        if converted.name == rel.name and (tree / rel).resolve() == converted and tree != self.project.root:
            return {}, tree, []
        sources = dict(convert_sources(self.project, "torch_xla-2.9"))
        sources[rel.as_posix()] = converted.read_bytes()
        return sources, None, [str(converted.parent)]

    def _shown(self) -> Tuple[Optional[Path], Optional[Path]]:
        """(the converted tree, the converted script) the user named, for
        pointing at the candidate's files where the user can open them."""
        tree = self.sources("xla")[1]
        if tree is not None:
            return tree, None
        return None, (self.converted.resolve() if self.converted is not None else None)

    def run_once(self, name: str, mode: str, args: List[str], env: Optional[Dict[str, str]] = None) -> Tuple[Side, Run]:
        side = self.side(name)
        extra = self.sources(name)[2]
        return side, run_side(side, mode, args, self.opts.timeout, self.opts.python, env, extra_path=extra)

    # -- the verification ----------------------------------------------------
    def run(self) -> Report:
        opts = self.opts
        length_spec = growth.parse_lengths(opts.lengths) if opts.lengths else None  # checked before anything runs
        if self.converted is None:
            try:
                self.sources("xla")  # (converted once, kept for the candidate)
            except NothingToPort as said:
                report = Report("nothing to port")
                report.config["nothing_to_port"] = str(said)
                return report
        if length_spec is not None:
            files = [self.project.script] + [p for p in self.project.python_files() if p != self.project.script]
            sources = (p.read_text(errors="replace") for p in files)  # (read until the option is found)
            try:
                growth.check_option(length_spec[0], self.cand_args, sources)
            except ValueError as exc:
                raise VerifyError(str(exc)) from None
        if opts.reference == "cuda" and not _cuda_available(opts.python):
            raise VerifyError("--reference cuda: no CUDA device here (use --reference auto or cpu)")
        use_cuda = opts.reference == "cuda" or (opts.reference == "auto" and _cuda_available(opts.python))
        ref_kind = "cuda" if use_cuda else "cpu"
        ref_autocast: List[str] = []
        ref_imports: Dict[str, List[str]] = {}
        early = None
        if opts.against is not None:
            try:
                recorded, ref_stdouts, ref_files = record.read(Path(opts.against))
            except ValueError as exc:
                raise VerifyError(str(exc)) from None
            ref_kind = f"record ({recorded.get('device')})"
        else:
            early = self._start_candidate() if opts.record_to is None else None
            refs = self._references(use_cuda)
            ref_stdouts, ref_files = [r.stdout for r in refs], [r.files for r in refs]
            ref_autocast = [a for r in refs for a in r.data.get("autocast", [])]  # type: ignore[union-attr]
            ref_imports = dict(refs[0].data.get("imported") or {})  # type: ignore[arg-type]
            if opts.record_to is not None:
                try:
                    record.write(Path(opts.record_to), self.project.script, self.args, ref_kind,
                                 [(r.stdout, r.files) for r in refs],
                                 [float(r.data.get("seconds", 0.0)) for r in refs])  # type: ignore[arg-type]
                except ValueError as exc:
                    raise VerifyError(str(exc)) from None
                return Report("recorded", metrics={"reference": ref_kind, "runs": len(refs)})
        if importlib.util.find_spec("torch_xla") is None and opts.python == sys.executable:
            raise VerifyError("torch_xla is not installed here: pip install 'torch==2.9.0' 'torch_xla==2.9.0' "
                              "(or, from a checkout, `make setup`)")
        graphs, xla_env = self._xla_env()
        try:
            cand_side, cand = early.result() if early is not None else self.run_once("xla", "xla", self.cand_args,
                                                                                     xla_env)
        except VerifyError as exc:  # the original ran: a conversion that cannot is a failed one
            return self._crashed(str(exc), exc.so_far, exc.ended)
        traced = self._traced(cand, xla_env)
        lines = LineMapper(self.project.script, cand_side.script, cand_side.tree, self.project.root, self._shown())
        length_runs = self._lengths(length_spec, xla_env) if length_spec is not None else []
        rtol, atol, why = tolerance(opts.rtol, opts.atol, ref_autocast + list(cand.data.get("autocast", [])))  # type: ignore[arg-type]
        compared = compare(ref_stdouts, ref_files, cand.stdout, cand.files, rtol, atol,
                           follow=opts.rtol is None and opts.atol is None)
        values, values_graphs = cand, graphs
        if any(not o.ok for o in compared.outputs) and not opts.device_rng and _drew_on_device(graphs):
            # XLA's generator is not the CPU's: the values are compared on a
            # diagnostic run whose device draws come from the CPU generator
            values_graphs = self.scratch / "graphs-rng" / "graphs.txt"
            values_graphs.parent.mkdir()
            try:
                _, values = self.run_once("xla", "xla", self.cand_args, {
                    **xla_env, "XLAPORT_DIAGNOSE": "rng", "XLA_SAVE_TENSORS_FILE": str(values_graphs)})
                compared = compare(ref_stdouts, ref_files, values.stdout, values.files, rtol, atol,
                                   follow=opts.rtol is None and opts.atol is None)
            except VerifyError as exc:
                values, values_graphs = cand, graphs
                compared.not_compared.append(f"a run with the device's random draws from the CPU generator could "
                                             f"not run ({str(exc)[:200]})")
        if any(not o.ok for o in compared.outputs) and ref_kind == "cpu":
            self._float_order(compared, ref_stdouts[0], ref_files[0])
        if any(not o.ok for o in compared.outputs) and "autocast" in why and opts.against is None:
            self._precision_noise(compared, ref_stdouts[0], ref_files[0], use_cuda)
        report = judge(cand, compared, lines, graphs, opts.warmup_steps, opts.max_host_reads_per_step, ref_kind,
                       traced)
        report.config["tolerance"] = {"rtol": rtol, "atol": atol, "why": why}
        report.config["reference"] = self.reference_is
        report.imported = {"reference": ref_imports, "candidate": dict(cand.data.get("imported") or {})}  # type: ignore[arg-type]
        self._imports(report)
        self._device_work(report, cand, cand_side, lines)
        self._random(report, values, values_graphs, lines)
        if values is not cand:
            n = sum(dict(values.data.get("rng_routed") or {}).values())  # type: ignore[call-overload]
            report.config["values_from"] = (f"a second run of the conversion whose {n} random draw(s) on the device came "
                                            "from the CPU generator, as the reference drew them (the judged run "
                                            "drew them from XLA's)")
        predicted(report.events)
        if length_spec is not None:
            report.metrics["lengths"] = length_runs
            loops = [e["original_line"] for e in report.events if e["kind"] == "no_barrier"]
            report.failures += growth.judge_lengths(length_spec[0], length_spec[1],
                                                    [int(r["compiles"]) for r in length_runs],  # type: ignore[call-overload]
                                                    [int(r["largest_graph"]) for r in length_runs], loops,
                                                    growth_reported(report.events))
            growth.fixed_costs(report, length_spec[0], [int(r["compiles"]) for r in length_runs])  # type: ignore[call-overload]
        failed = [o.name for o in report.outputs if not o.ok]
        if failed and all(name.endswith("running_var]") for name in failed):  # those alone: explained
            report.failures = [f + _RUNNING_VAR if f.endswith("running_var]") else f for f in report.failures]
        if any(not o.ok for o in report.outputs) and opts.against is None:
            self._diverge(report, rtol, atol, use_cuda, xla_env)
        if not any("(random, not compared)" not in o.name for o in report.outputs):
            left = len(report.varies) + len(report.not_compared)
            report.failures.append("no value was compared: the runs printed no number and left no file or tensor "
                                   "that both made" + (f" ({left} left out: see above)" if left else "")
                                   + "; a pass needs values")
        report.verdict = "fail" if report.failures else "pass"
        return report

    def _xla_env(self) -> Tuple[Path, Dict[str, str]]:
        """The judged XLA run's graph dump and environment (made once)."""
        graphs = self.scratch / "graphs" / "graphs.txt"
        graphs.parent.mkdir(exist_ok=True)
        return graphs, {"PJRT_DEVICE": self.opts.device.upper(), "XLA_IR_DEBUG": "1",
                        "XLA_SAVE_TENSORS_FILE": str(graphs), "XLA_SAVE_TENSORS_FMT": "text"}

    def _start_candidate(self):  # type: ignore[no-untyped-def]
        """The judged run of the conversion, started beside the references
        where there are cores for both (it depends on nothing they do); its
        future, or None (then it runs after them)."""
        if (os.cpu_count() or 1) < 2 or os.environ.get("XLAPORT_VERIFY_SERIAL") == "1" or \
                os.environ.get("XLAPORT_TORCHRUN") or self._shares_the_host() or \
                (importlib.util.find_spec("torch_xla") is None and self.opts.python == sys.executable):
            return None
        import concurrent.futures

        self.sources("xla")  # (converted here, not in the thread)
        _, xla_env = self._xla_env()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        future = pool.submit(self.run_once, "xla", "xla", self.cand_args, xla_env)
        pool.shutdown(wait=False)
        return future

    def _shares_the_host(self) -> bool:
        """Whether two runs of the program at once could meet: it starts
        processes or opens ports (a fixed MASTER_PORT, a process group),
        which two runs side by side would both claim."""
        for path in self.project.python_files():
            try:
                if _SHARED.search(path.read_bytes()):
                    return True
            except OSError:
                continue
        return False

    def _traced(self, cand: Run, xla_env: Dict[str, str]) -> Optional[Dict[str, object]]:
        """A diagnostic run that ties each CPU fallback and host read to its
        line and step, where the judged run had fallbacks, or more transfers
        from the device per step than ``--max-host-reads-per-step`` allows (a
        read of a value already computed cuts no graph: the dump does not
        show it).  The judged run itself is never instrumented."""
        steps = len(cand.data.get("steps") or [])  # type: ignore[arg-type]
        limit = self.opts.max_host_reads_per_step
        transfers = float(cand.metrics.get("transfers_from_device", 0) or 0)  # type: ignore[arg-type]
        if not cand.metrics.get("fallbacks") and (limit is None or transfers / max(steps, 1) <= limit):
            return None
        _, run = self.run_once("xla", "xla", self.cand_args, {**xla_env, "XLAPORT_DIAGNOSE": "trace",
                                                              "XLA_SAVE_TENSORS_FILE": ""})
        return run.data

    def _references(self, use_cuda: bool) -> List[Run]:
        """The reference runs: the user's original, unmodified (on CUDA
        where there is one); only where the original cannot run on this host
        for want of CUDA, its CPU retargeting -- said in the report."""
        runs = self.opts.reference_runs
        if use_cuda:
            self.ref_name, self.reference_is = "cuda", "the original, unmodified, on CUDA"
            return [self.run_once("cuda", "cuda", self.args)[1] for _ in range(runs)]
        try:
            first = self.run_once("orig", "cpu", self.args)[1]
            self.ref_name, self.reference_is = "orig", "the original, unmodified, on the CPU"
            needs = None if first.stdout.strip() or set(first.files) - {LEFTOVERS} else (
                "unmodified it printed nothing and wrote no file here (no GPU: `device_count()` is 0)")
        except VerifyError as exc:
            needs = needs_cuda(str(exc))
            if needs is None:
                raise  # the original itself fails here: nothing to verify against
        if needs is not None:
            first = self.run_once("ref", "cpu", self.args)[1]
            self.ref_name = "ref"
            why = needs if needs.startswith("unmodified") else f"unmodified it needs CUDA: {needs}"
            self.reference_is = f"the original retargeted to the CPU (its CUDA code converted for the CPU), because {why}"
        return [first] + [self.run_once(self.ref_name, "cpu", self.args)[1] for _ in range(runs - 1)]

    def _float_order(self, compared: Comparison, stdout: str, files: Dict[str, Path]) -> None:
        """Outputs that failed are run once more on the original with another
        number of CPU threads (another order of float sums): an output the
        conversion is off by no more than ten times what that moves it is
        the program's own float-order noise, amplified by training (a GAN's
        weights after ten Adam steps moved by 1e-3 between 1 and 2 threads),
        not a wrong port."""
        usual = os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count() or 1)
        threads = "2" if usual == "1" else "1"
        try:
            _, other = self.run_once(self.ref_name, "cpu", self.args, {"OMP_NUM_THREADS": threads})
        except VerifyError:
            return
        moved = compare([stdout], [files], other.stdout, other.files, 0.0, 0.0)
        within_float_order(compared, {o.name: o.max_abs_err for o in moved.outputs},
                           f"with {threads} CPU thread(s) instead of {usual}")

    def _precision_noise(self, compared: Comparison, stdout: str, files: Dict[str, Path], use_cuda: bool) -> None:
        """Outputs that still fail, where autocast ran in a low precision,
        are measured against the reference run once more with autocast off:
        a conversion off by no more than ten times what the precision moves
        an output is within that precision's noise (bf16 AdamW on biases that
        start at zero), not a wrong port."""
        try:
            _, full = self.run_once(self.ref_name, "cuda" if use_cuda else "cpu", self.args,
                                    {"XLAPORT_DIAGNOSE": "no_autocast"})
        except VerifyError:
            return
        moved = compare([stdout], [files], full.stdout, full.files, 0.0, 0.0)
        within_float_order(compared, {o.name: o.max_abs_err for o in moved.outputs},
                           "with autocast off (the precision noise of the low precision that ran)")

    def _crashed(self, error: str, so_far: Optional[Dict[str, object]] = None, ended: str = "") -> Report:
        """The candidate crashed (or ran past the timeout) where the reference
        ran: the verdict is fail, with the program's own error and the line of
        the user's file it came from; a run that timed out compiling a new
        graph nearly every step, with the lines lint says change a shape
        every step."""
        side = self._latest["xla"]
        lines = LineMapper(self.project.script, side.script, side.tree, self.project.root)
        frame = _innermost(error, lambda p: lines.resolve(p) is not None)
        report = Report("fail")
        last = _what_killed(error) + (f"; it died {ended}" if ended else "")
        if frame is not None:
            event = lines.event("crash", frame, 1, last)
            report.events.append(event)
            where = f" at {Path(str(event['original_path'] or frame[0])).name}:{event['original_line'] or frame[1]}"
        else:
            where = ""
        report.failures.append(f"the conversion did not run{where}: {last}")
        report.config["candidate_error"] = error[-4000:]
        if so_far is not None and so_far["steps"] >= 3 and so_far["compiles"] >= so_far["steps"] / 2:  # type: ignore[operator]
            report.failures.append(self._shape_traps(so_far, side))
        return report

    def _shape_traps(self, so_far: Dict[str, object], side: Side) -> str:
        """Why a run that compiled a new graph nearly every step was slow:
        the findings of lint's rules for what changes a shape every step,
        in the user's files of the modules the run had imported."""
        from codemods.host_reads import NEW_SHAPE_EVERY_STEP

        found: List[str] = []
        stacked = [Path(str(f)) for f in so_far.get("own_files") or []]  # type: ignore[union-attr]
        rels = [p.relative_to(side.tree) for p in stacked if _inside(p, side.tree)]
        for rel in list(dict.fromkeys([side.project.rel_script, *rels])):
            path = self.project.root / rel
            try:
                outcome = transform(path.read_bytes(), Settings(select=list(NEW_SHAPE_EVERY_STEP)), str(path))
            except (OSError, SourceError):
                continue
            found += [f"{rel.as_posix()}:{f.line} ({f.code})" for f in outcome.findings]
        said = (f"lint reports what changes shape every step at {', '.join(found[:5])}"
                + (f" and {len(found) - 5} more" if len(found) > 5 else "")) if found else \
            "lint reports no line that changes a shape every step"
        return (f"{so_far['compiles']:.0f} compiles in {so_far['steps']:.0f} steps: a new graph nearly every step, "
                f"each compiled anew; {said}")

    def _lengths(self, spec: Tuple[str, List[str]], xla_env: Dict[str, str]) -> List[Dict[str, object]]:
        """The conversion at each length.  Its compiles are the graphs its
        dump holds that were new to it (hashes), so the runs share a
        persistent compilation cache (torch_xla's ``XLA_PERSISTENT_CACHE_PATH``):
        a graph the shorter run compiled is loaded, not compiled again, by
        the longer one, and still counted."""
        name, values = spec
        out: List[Dict[str, object]] = []
        cache = self.scratch / "xla-cache"
        cache.mkdir(exist_ok=True)
        for k, value in enumerate(values):
            dump = self.scratch / f"graphs-{k}" / "graphs.txt"
            dump.parent.mkdir()
            try:
                args = growth.with_length(self.cand_args, name, value)
            except ValueError as exc:
                raise VerifyError(str(exc)) from None
            _, run = self.run_once("xla", "xla", args, {**xla_env, "XLA_SAVE_TENSORS_FILE": str(dump),
                                                        "XLA_PERSISTENT_CACHE_PATH": str(cache)})
            out.append({"value": value, "compiles": int(run.data.get("compiles_seen", 0)),  # type: ignore[call-overload]
                        "largest_graph": growth.largest_graph(read_graphs(dump.parent))})
        return out

    def _imports(self, report: Report) -> None:
        """A side that imported the user's copy of a project module, or the
        other side's, compared the wrong programs: it cannot be verified."""
        for side, trees in report.imported.items():
            wrong = {label: mods for label, mods in trees.items() if label != "own" and mods}
            if wrong:
                where = "; ".join(f"{', '.join(m[:5])} from the {'user' if l == 'user' else 'other side'}'s tree"
                                  for l, m in wrong.items())
                raise VerifyError(f"the {side} imported project modules that are not its own copy ({where}): "
                                  "something on its import path reaches the user's tree (PYTHONPATH, a .pth file)")

    def _device_work(self, report: Report, cand: Run, side: Side, lines: LineMapper) -> None:
        """A candidate that did nothing on XLA, left a model on the CPU where
        the original used CUDA, or runs a step loop with no barrier."""
        import libcst as cst

        from codemods.analysis.cuda import count_references
        from codemods.base import TreeCache

        executions = int(report.metrics.get("executions", 0) or 0)  # type: ignore[call-overload]
        if executions == 0:
            named = [a for a in self.cand_args if a.split("=")[-1].split(":")[0] in ("cpu", "cuda", "mps")]
            hint = (f"; the device is an argument ({named[0]}): give the conversion its own, "
                    f"`--converted-args` with `xla` in its place") if named and self.opts.converted_args is None else ""
            report.failures.append("the conversion did no work on XLA (0 executions): its model and data stayed "
                                   f"on the CPU{hint}")
        own = (cand.data.get("imported") or {}).get("own", [])  # type: ignore[union-attr]
        modules = [side.tree / rel for rel in own_files(own, side)] or [side.script]
        used_cuda = False
        for path in [self.project.root / m.relative_to(side.tree) for m in modules]:
            try:
                source = path.read_bytes()
                used_cuda = used_cuda or count_references(TreeCache(cst.parse_module(source), source)) > 0
            except (OSError, cst.ParserSyntaxError):
                continue
        on_cpu = sorted(name for name, kind in dict(cand.data.get("leftover_devices") or {}).items()  # type: ignore[call-overload]
                        if kind == "cpu")
        if used_cuda and on_cpu:
            report.failures.append(f"left on the CPU where the original used CUDA: {', '.join(on_cpu)}")
        if not executions:
            return
        for module in modules:
            for line in growth.unsynced_loops(module):
                event = lines.event("no_barrier", (str(module), line), 1,
                                    "a step loop with no barrier: every iteration is added to one graph that grows "
                                    "with the loop (xlaport would put `torch_xla.sync()` at the end of its body)")
                report.events.append(event)
                report.failures.append(f"a step loop runs on the device without a barrier "
                                       f"({module.relative_to(side.tree)}:{event['original_line'] or line})")

    def _random(self, report: Report, cand: Run, graphs: Path, lines: LineMapper) -> None:
        """Random ops that still ran on XLA's generator: named, and the
        outputs that differ are then listed as random, not failed."""
        ops: Dict[Tuple[str, int], str] = {}
        for g in read_graphs(graphs.parent):
            for line in rng.unrouted(g["ir"]):  # type: ignore[arg-type]
                from xlaport.verify.compiles import _LOCATION

                loc = _LOCATION.search(line)
                op = line.split("(")[0].split()[-1]
                if loc:
                    ops.setdefault((loc.group(1), int(loc.group(2))), op)
        for (path, line), op in ops.items():
            event = lines.event("random", (path, line), 1, f"{op}: drawn by XLA's own generator")
            where = f"{Path(event['original_path'] or path).name}:{event['original_line'] or line}"
            report.random.append(f"{op} at {where}")
        report.metrics["rng_routed"] = cand.data.get("rng_routed", {})
        if not report.random:
            return
        differing = [o for o in report.outputs if not o.ok]
        for o in differing:
            o.ok = True
            o.name += " (random, not compared)"
            report.not_compared.append(f"{o.name}: differs; the candidate drew random numbers on the device "
                                       f"({'; '.join(report.random[:3])})")
        report.failures = [f for f in report.failures if f not in {o.name.replace(' (random, not compared)', '')
                                                                   for o in differing}]

    def _diverge(self, report: Report, rtol: float, atol: float, use_cuda: bool, xla_env: Dict[str, str]) -> None:
        """Both sides once more, each module's forward output recorded: the
        first module whose output differs is where the programs diverge."""
        trace_ref, trace_cand = self.scratch / "trace-ref.pt", self.scratch / "trace-xla.pt"
        try:
            self.run_once(self.ref_name, "cuda" if use_cuda else "cpu", self.args,
                          {"XLAPORT_TRACE_MODULES": str(trace_ref)})
            self.run_once("xla", "xla", self.cand_args, {**xla_env, "XLA_SAVE_TENSORS_FILE": "",
                                                     "XLAPORT_TRACE_MODULES": str(trace_cand)})
        except VerifyError as exc:
            report.not_compared.append(f"divergence trace: could not run ({str(exc)[:200]})")
            return
        found = diverge.first_divergence(str(trace_ref), str(trace_cand), rtol, atol)
        report.divergence = found
        report.failures += list(diverge.where(found))


# measured on torch_xla 2.9.0 (XLA's CPU backend): one training step of
# BatchNorm1d over 16 rows leaves running_var at 0.9 + 0.1 * biased variance,
# where PyTorch's CPU kernel uses the unbiased one (a ratio of 16/15)
_RUNNING_VAR = (" (torch_xla 2.9 updates BatchNorm's running_var with the biased batch variance, PyTorch with the "
                "unbiased one: the buffers part by n/(n-1) per step because of torch_xla, not of the conversion; "
                "eval-mode outputs follow them)")


# what makes two runs of one program at once collide (a port, a process group)
_SHARED = re.compile(rb"init_process_group|MASTER_PORT|MASTER_ADDR|\.spawn\(|start_processes|torch_xla\.launch|"
                     rb"\bsocket\b|\.bind\(|multiprocessing|subprocess")


def _drew_on_device(graphs: Path) -> bool:
    """Did the run draw random numbers with XLA's own generator?"""
    return any(rng.unrouted(g["ir"]) for g in read_graphs(graphs.parent))  # type: ignore[arg-type]


def own_files(names: List[str], side: Side) -> List[Path]:
    """The script and the side's own modules ``names``, as paths in its tree."""
    found: List[Path] = [side.project.rel_script]
    for name in names:
        rel = Path(*name.split("."))
        for candidate in (rel.with_suffix(".py"), rel / "__init__.py"):
            for base in (side.tree, side.tree / "src"):
                if (base / candidate).exists():
                    found.append((base / candidate).relative_to(side.tree))
    return list(dict.fromkeys(found))


