"""The runs of one verification: a fresh copy of the project for each
(``xlaport.verify.project``) from the sources each side gets (``sources``), the references
(the original, or its CPU retargeting where it needs CUDA), the judged run of
the conversion (beside the references where it can), the runs at other
lengths and the diagnostic run that ties reads and fallbacks to lines."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from xlaport.verify import growth, record
from xlaport.verify.core import run_side
from xlaport.verify.crashes import needs_cuda
from xlaport.verify.model import (
    Options,
    Run,
    VerifyError,
)
from xlaport.verify.outputs import LEFTOVERS
from xlaport.verify.project import Project, Side, build_side
from xlaport.verify.sources import Sources
from xlaport.verify.syncs import read_graphs


class Runs:
    """Making and running the sides of one verification."""

    def __init__(self, project: Project, converted: Optional[Path], args: List[str], opts: Options,
                 scratch: Path) -> None:
        self.project, self.converted, self.args, self.opts, self.scratch = project, converted, args, opts, scratch
        # the conversion runs with its own arguments where the user gave them (`--device xla` for `--device cuda`)
        self.cand_args = list(opts.converted_args) if opts.converted_args is not None else args
        self._count = 0
        self._lock = threading.Lock()
        self.sources = Sources(project, converted, opts)
        self._latest: Dict[str, Side] = {}  # the last copy made for each side
        self.ref_name = "orig"  # the side the reference runs: the original, or its CPU retargeting
        self.recorded: Dict[str, object] = {}  # the record --against reads (read once, by the session)
        self.reference_is = "the original, unmodified, on the CPU"

    # -- trees and runs ------------------------------------------------------

    def side(self, name: str) -> Side:
        """A fresh copy of the project for one run of side ``name``."""
        sources, files_from, _ = self.sources.of(name)
        with self._lock:  # (the candidate may be starting beside the references)
            self._count += 1
            dest = self.scratch / f"{name}-{self._count}" / self.project.root.name
        self._latest[name] = build_side(self.project, name, dest, sources, files_from)
        return self._latest[name]

    def run_once(self, name: str, mode: str, args: List[str], env: Optional[Dict[str, str]] = None) -> Tuple[Side, Run]:
        side = self.side(name)
        extra = self.sources.of(name)[2]
        return side, run_side(side, mode, args, self.opts.timeout, self.opts.python, env, extra_path=extra)

    # -- the verification ----------------------------------------------------

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

        self.sources.of("xla")  # (converted here, not in the thread)
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

    def _references(self, use_cuda: bool) -> List[Run]:
        """The reference runs: the user's original, unmodified (on CUDA
        where there is one); only where the original cannot run on this host
        for want of CUDA, its CPU retargeting -- said in the report."""
        runs = self.opts.reference_runs
        if use_cuda:
            self.ref_name, self.reference_is = "cuda", "the original, unmodified, on CUDA"
            return [self.run_once("cuda", "cuda", self.args, _later(k))[1] for k in range(runs)]
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
        return [first] + [self.run_once(self.ref_name, "cpu", self.args, _later(k))[1] for k in range(1, runs)]

    def recorded_runs(self, key: str) -> Tuple[List[str], List[Dict[str, Path]]]:
        """(stdouts, files) of the record's runs of kind ``key`` (none: empty)."""
        return record.runs_of(Path(self.opts.against), self.recorded, key)  # type: ignore[arg-type]

    def _rng_references(self, use_cuda: bool) -> Optional[Tuple[List[str], List[Dict[str, Path]]]]:
        """The reference again with its device's random draws taken from the
        CPU generator, as the conversion's values run takes XLA's (``rng``):
        from the record (``--against``), or run on CUDA; None where the
        reference drew on the CPU anyway (or the record holds no such runs)."""
        if self.opts.against is not None:
            stdouts, files = self.recorded_runs("rng_runs")
            return (stdouts, files) if stdouts else None
        if not use_cuda:
            return None
        runs = [self.run_once(self.ref_name, "cuda", self.args, {"XLAPORT_DIAGNOSE": "rng", **_later(k)})[1]
                for k in range(self.opts.reference_runs)]
        return [r.stdout for r in runs], [r.files for r in runs]

    def _recorded_diagnostics(self, use_cuda: bool) -> Dict[str, List[Tuple[str, Dict[str, Path]]]]:
        """What ``--record`` keeps beside a CUDA reference for the XLA host to
        explain differences with: its runs with CUDA's draws routed, and (a
        project that names BatchNorm) one with torch_xla's BatchNorm update."""
        if not use_cuda:
            return {}
        routed = self._rng_references(use_cuda)
        out = {"rng_runs": list(zip(*routed)) if routed is not None else []}
        if any(re.search(rb"BatchNorm|batch_norm", p.read_bytes()) for p in self.project.python_files()):
            bn = self._batchnorm_reference(use_cuda)  # type: ignore[attr-defined]  # (Explanations)
            out["bn_runs"] = [bn] if bn is not None else []
        return out

    def _accelerator_side(self, switched: List[str]) -> Optional[List[Run]]:
        """The reference runs again where the conversion turned an accelerator
        test true that the original, on this host without a GPU, took false
        (``switched``: the tests): the original's CPU retargeting, which
        takes the accelerator's side as the original does on a GPU (its data
        order, workers, precision) -- said.  None where that cannot run."""
        try:
            runs = [self.run_once("ref", "cpu", self.args, _later(k))[1] for k in range(self.opts.reference_runs)]
        except VerifyError:
            return None
        shown = "; ".join(switched[:3]) + (f" and {len(switched) - 3} more" if len(switched) > 3 else "")
        self.ref_name = "ref"
        self.reference_is = (f"the original retargeted to the CPU (its CUDA code converted for the CPU), because the "
                             f"conversion takes the accelerator's side of {shown}, which the original takes on a GPU; "
                             "unmodified on this host without one it took the other side")
        return runs

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


# what makes two runs of one program at once collide (a port, a process group)
_SHARED = re.compile(rb"init_process_group|MASTER_PORT|MASTER_ADDR|\.spawn\(|start_processes|torch_xla\.launch|"
                     rb"\bsocket\b|\.bind\(|multiprocessing|subprocess")


def _later(k: int) -> Dict[str, str]:
    """The environment of reference run ``k``: the first is the reference as
    it runs; in the others the program's clock runs four times as fast
    (``observer``), so that a number computed from elapsed time (a
    throughput, an MFU, an ETA) differs between them even where it is
    rounded alike, and is not compared."""
    return {"XLAPORT_CLOCK": "4"} if k else {}
