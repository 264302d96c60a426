"""One verification, step by step: the reference runs, the candidate runs,
the runs at other lengths, the comparison and the verdict.  Every run gets
a fresh copy of the project (``xlaport.verify.project``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Dict, List, Tuple

from xlaport.verify import growth, record, rng
from xlaport.verify.checks import Checks
from xlaport.verify.explain import Explanations
from xlaport.verify.compiles import LineMapper, judge
from xlaport.verify.core import _cuda_available
from xlaport.verify.model import (
    NothingToPort,
    Report,
    Run,
    VerifyError,
)
from xlaport.verify.outputs import Comparison, compare, tolerance
from xlaport.verify.printed import WORDED, messages_only
from xlaport.verify.predicted import growth_reported, predicted
from xlaport.verify.runs import Runs
from xlaport.verify.syncs import read_graphs


class Session(Runs, Checks, Explanations):
    """One verification: the runs (``Runs``), then the checks (``Checks``,
    ``Explanations``)."""

    def run(self) -> Report:
        opts = self.opts
        length_spec = growth.parse_lengths(opts.lengths) if opts.lengths else None  # checked before anything runs
        if self.converted is None:
            try:
                self.sources.of("xla")  # (converted once, kept for the candidate)
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
            self.recorded = recorded
            env = recorded.get("environment") or {}
            self.reference_is = (f"the original, unmodified, recorded on {recorded.get('device')} with --record "
                                 f"(torch {env.get('torch')}, {env.get('platform')})")  # type: ignore[union-attr]
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
                                 [float(r.data.get("seconds", 0.0)) for r in refs],  # type: ignore[arg-type]
                                 self._recorded_diagnostics(use_cuda))
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
        lines = LineMapper(self.project.script, cand_side.script, cand_side.tree, self.project.root,
                           self.sources.shown())
        length_runs = self._lengths(length_spec, xla_env) if length_spec is not None else []
        rtol, atol, why = tolerance(opts.rtol, opts.atol, ref_autocast + list(cand.data.get("autocast", [])))  # type: ignore[arg-type]
        compared, values, values_graphs = self._compare_values(ref_stdouts, ref_files, cand, graphs, xla_env,
                                                               (rtol, atol, why), ref_kind, use_cuda)
        report = judge(cand, compared, lines, graphs, opts.warmup_steps, opts.max_host_reads_per_step, ref_kind,
                       traced, opts.device)
        report.config["tolerance"] = {"rtol": rtol, "atol": atol, "why": why}
        report.config["reference"] = self.reference_is
        report.imported = {"reference": ref_imports, "candidate": dict(cand.data.get("imported") or {})}  # type: ignore[arg-type]
        self._imports(report)
        if opts.target == "torchtpu":
            report.config["device_ran"] = self._torchtpu_device()
        else:
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
            self._diverge(report, rtol, atol, use_cuda, xla_env, routed=values is not cand)
            if self.ref_name == "orig" and not use_cuda and self.converted is None:
                self._switched(report)
        messages = messages_only(ref_stdouts[0], self.project.python_files())
        if not any("(random, not compared)" not in o.name and not (messages and o.name.startswith(WORDED))
                   for o in report.outputs):
            left = len(report.varies) + len(report.not_compared)
            report.failures.append("no value was compared: the runs printed no number and left no file or tensor "
                                   "that both made" + (f" ({left} left out: see above)" if left else "")
                                   + "; a pass needs values")
        report.verdict = "fail" if report.failures else "pass"
        return report


    def _compare_values(self, ref_stdouts: List[str], ref_files: List[Dict[str, Path]], cand: Run, graphs: Path,
                        xla_env: Dict[str, str], tol: Tuple[float, float, str], ref_kind: str,
                        use_cuda: bool) -> Tuple[Comparison, Run, Path]:
        """The candidate's outputs against the reference's; where they differ,
        the diagnostic runs that may explain it: the device's random draws
        from the CPU generator, the original's accelerator side, torch_xla's
        BatchNorm, the original's float-order and precision noise.  (The
        comparison, the run whose values it compared, that run's graphs.)"""
        opts = self.opts
        rtol, atol, why = tol
        follow = opts.rtol is None and opts.atol is None
        compared = compare(ref_stdouts, ref_files, cand.stdout, cand.files, rtol, atol, follow=follow)
        values, values_graphs = cand, graphs
        if any(not o.ok for o in compared.outputs) and not opts.device_rng and _drew_on_device(graphs):
            # XLA's generator is not the CPU's: the values are compared on a
            # diagnostic run whose device draws come from the CPU generator
            values_graphs = self.scratch / "graphs-rng" / "graphs.txt"
            values_graphs.parent.mkdir()
            try:
                _, values = self.run_once("xla", "xla", self.cand_args, {
                    **xla_env, "XLAPORT_DIAGNOSE": "rng", "XLA_SAVE_TENSORS_FILE": str(values_graphs)})
                routed = self._rng_references(use_cuda)
                if routed is not None:  # a reference that drew on CUDA: its own run with the draws routed
                    ref_stdouts, ref_files = routed
                    self.reference_is += "; its device's random draws taken from the CPU generator, as the conversion's"
                compared = compare(ref_stdouts, ref_files, values.stdout, values.files, rtol, atol, follow=follow)
            except (VerifyError, ValueError) as exc:
                values, values_graphs = cand, graphs
                compared.not_compared.append(f"a run with the device's random draws from the CPU generator could "
                                             f"not run ({str(exc)[:200]})")
        if any(not o.ok for o in compared.outputs) and self.ref_name == "orig" and ref_kind == "cpu":
            switched = self._switched_tests(dict(cand.data.get("imported") or {}))  # type: ignore[call-overload]
            side = self._accelerator_side(switched) if switched else None
            if side is not None:  # like with like: the original as it runs on a GPU, on the CPU
                ref_stdouts, ref_files = [r.stdout for r in side], [r.files for r in side]
                compared = compare(ref_stdouts, ref_files, values.stdout, values.files, rtol, atol, follow=follow)
        if any(not o.ok for o in compared.outputs) and (ref_kind == "cpu" or use_cuda or opts.against is not None) \
                and _trained_batchnorm(values_graphs):
            self._torch_xla_batchnorm(compared, values, rtol, atol, use_cuda)
        if any(not o.ok for o in compared.outputs) and ref_kind == "cpu":
            self._float_order(compared, ref_stdouts[0], ref_files[0])
        if any(not o.ok for o in compared.outputs) and "autocast" in why and opts.against is None:
            self._precision_noise(compared, ref_stdouts[0], ref_files[0], use_cuda)
        return compared, values, values_graphs


# measured on torch_xla 2.9.0 (XLA's CPU backend): one training step of
# BatchNorm1d over 16 rows leaves running_var at 0.9 + 0.1 * biased variance,
# where PyTorch's CPU kernel uses the unbiased one (a ratio of 16/15)
_RUNNING_VAR = (" (torch_xla 2.9 updates BatchNorm's running_var with the biased batch variance, PyTorch with the "
                "unbiased one: the buffers part by n/(n-1) per step because of torch_xla, not of the conversion; "
                "eval-mode outputs follow them)")


def _drew_on_device(graphs: Path) -> bool:
    """Did the run draw random numbers with XLA's own generator?"""
    return any(rng.unrouted(g["ir"]) for g in read_graphs(graphs.parent))  # type: ignore[arg-type]


def _trained_batchnorm(graphs: Path) -> bool:
    """Did the run compute a BatchNorm on XLA (in training, it updates the
    running statistics the way torch_xla does)?"""
    return any("aten::native_batch_norm(" in line
               for g in read_graphs(graphs.parent) for line in g["ir"])  # type: ignore[union-attr]
