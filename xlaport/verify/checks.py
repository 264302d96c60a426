"""What one verification checks once the runs are made: the crash, the
imports, the work done on XLA, the random draws, and where two runs part.
What explains outputs that differ (noise, torch_xla, a switched test) is
``explain``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from xlaport.engine import Settings, SourceError, transform
from xlaport.program import has_accelerator_code
from xlaport.verify import diverge, growth, rng
from xlaport.verify.compiles import LineMapper
from xlaport.verify.core import _inside
from xlaport.verify.crashes import _innermost, _what_killed
from xlaport.verify.model import (
    Report,
    Run,
    VerifyError,
)
from xlaport.verify.project import Side, own_files
from xlaport.verify.syncs import read_graphs


class Checks:
    """The checks of one verification (mixed into ``Session``, which holds
    the runs: ``xlaport.verify.runs.Runs``)."""


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
        from codemods.shape_traps import NEW_SHAPE_EVERY_STEP

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

    def _torchtpu_device(self) -> str:
        """What a TorchTPU port ran on here: its device is
        ``torch.accelerator.current_accelerator()``, so without a TPU it took
        its CPU path -- said plainly, never judged as work on a TPU."""
        probe = ("import torch\nd = torch.accelerator.current_accelerator(check_available=True)\n"
                 "print(d.type if d is not None else 'none')\n")
        try:
            found = subprocess.run([self.opts.python, "-c", probe], capture_output=True, text=True, timeout=120,
                                   env={**os.environ, "PJRT_DEVICE": ""}).stdout.strip().splitlines()
        except (OSError, subprocess.SubprocessError):
            found = []
        kind = found[-1] if found else "none"
        if kind == "tpu":
            return "a TPU (torch.accelerator found one): the port ran on it"
        return (f"no TPU ran: this host has no TPU (torch.accelerator found {kind}), "
                "so the device-generic port took its CPU path; its values were compared, its speed on a TPU was not")

    def _device_work(self, report: Report, cand: Run, side: Side, lines: LineMapper) -> None:
        """A candidate that did nothing on XLA, left a model on the CPU where
        the original used CUDA, or runs a step loop with no barrier."""
        import libcst as cst

        from codemods.analysis.cuda import count_references
        from codemods.base import TreeCache

        executions = int(report.metrics.get("executions", 0) or 0)  # type: ignore[call-overload]
        own = (cand.data.get("imported") or {}).get("own", [])  # type: ignore[union-attr]
        modules = [side.tree / rel for rel in own_files(own, side)] or [side.script]
        used_cuda = named_accelerator = False
        for path in [self.project.root / m.relative_to(side.tree) for m in modules]:
            try:
                source = path.read_bytes()
                named_accelerator = named_accelerator or has_accelerator_code(source)
                used_cuda = used_cuda or count_references(TreeCache(cst.parse_module(source), source)) > 0
            except (OSError, cst.ParserSyntaxError):
                continue
        if executions == 0:
            named = [a for a in self.cand_args if a.split("=")[-1].split(":")[0] in ("cpu", "cuda", "mps")]
            hint = (f"; the device is an argument ({named[0]}): give the conversion its own, "
                    f"`--converted-args` with `xla` in its place") if named and self.opts.converted_args is None else ""
            kept = self.sources.kept  # type: ignore[attr-defined]  # (Runs)
            if kept and not hint:
                hint = (f"; xlaport kept {len(kept)} CUDA test(s) as they were, so the program takes its CPU side: "
                        f"{kept[0]}")
            if not hint and not (used_cuda or named_accelerator):
                ran = ", ".join(m.relative_to(side.tree).as_posix() for m in modules)
                hint = (f": the program runs on the CPU (the files it ran, {ran}, name no CUDA or accelerator: "
                        "nothing of it was there to port). To run it on XLA, give it a device first "
                        "(`device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")` and "
                        "`.to(device)`), then convert it")
            else:
                hint = f": its model and data stayed on the CPU{hint}"
            report.failures.append(f"the conversion did no work on XLA (0 executions){hint}")
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


    def _diverge(self, report: Report, rtol: float, atol: float, use_cuda: bool, xla_env: Dict[str, str],
                 routed: bool = False) -> None:
        """Both sides once more, each module's forward output and each
        parameter's gradient recorded: the first that differs is where the
        programs diverge.  ``routed``: the values compared came from a run
        whose device draws were taken from the CPU generator; so do these."""
        trace_ref, trace_cand = self.scratch / "trace-ref.pt", self.scratch / "trace-xla.pt"
        draws = {"XLAPORT_DIAGNOSE": "rng"} if routed else {}
        try:
            self.run_once(self.ref_name, "cuda" if use_cuda else "cpu", self.args,
                          {**(draws if use_cuda else {}), "XLAPORT_TRACE_MODULES": str(trace_ref)})
            self.run_once("xla", "xla", self.cand_args, {**xla_env, **draws, "XLA_SAVE_TENSORS_FILE": "",
                                                     "XLAPORT_TRACE_MODULES": str(trace_cand)})
        except VerifyError as exc:
            report.not_compared.append(f"divergence trace: could not run ({str(exc)[:200]})")
            return
        found = diverge.first_divergence(str(trace_ref), str(trace_cand), rtol, atol)
        report.divergence = found
        report.failures += list(diverge.where(found))
