"""What explains outputs that differ, other than the port: the original's
own float-order noise (another number of CPU threads), the precision noise
of a low-precision autocast (autocast off), torch_xla's BatchNorm (its
running variance updated with the biased batch variance), and an
accelerator test the conversion turned true that the original on this host
took false.  Each is measured by a diagnostic run of the original, never by
changing the judged run."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from xlaport.engine import Settings, SourceError, transform
from xlaport.verify.model import Report, Run, VerifyError
from xlaport.verify.outputs import Compared, Comparison, compare, within_float_order
from xlaport.verify.project import own_files


class Explanations:
    """The explaining checks of one verification (mixed into ``Session``
    with ``Checks``; ``run_once`` and the project come from ``Runs``)."""

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

    def _torch_xla_batchnorm(self, compared: Comparison, values: Run, rtol: float, atol: float,
                             use_cuda: bool = False) -> None:
        """Outputs that fail where the conversion trained BatchNorm are compared
        once more, against the original run with BatchNorm's running variance
        updated as torch_xla 2.9 updates it (the biased batch variance, where
        PyTorch takes the unbiased one): an output equal to that run's differs
        because of torch_xla, not of the conversion, and passes, said."""
        biased = self._batchnorm_reference(use_cuda)
        if biased is None:
            return
        again = compare([biased[0]], [biased[1]], values.stdout, values.files, rtol, atol)
        agree = {_output_key(o.name) for o in again.outputs if o.ok}
        for i, o in enumerate(compared.outputs):
            if not o.ok and _output_key(o.name) in agree:
                compared.outputs[i] = Compared(o.name, True, o.max_abs_err, o.max_rel_err)
                compared.float_order.append(
                    f"{o.name}: off by {o.max_abs_err:.3g}; equal to the original's once BatchNorm's running variance "
                    "is updated as torch_xla 2.9 updates it (the biased batch variance; PyTorch uses the unbiased "
                    "one): a difference of torch_xla, not of the conversion")

    def _batchnorm_reference(self, use_cuda: bool) -> Optional[Tuple[str, Dict[str, Path]]]:
        """(stdout, files) of the original with torch_xla's BatchNorm update:
        from the record (``--against``), or run here -- on CUDA with its
        device's random draws routed as the conversion's values run routes
        them (``rng``); None where there is none."""
        if self.opts.against is not None:
            try:
                stdouts, files = self.recorded_runs("bn_runs")  # type: ignore[attr-defined]  # (Runs)
            except ValueError:
                return None
            return (stdouts[0], files[0]) if stdouts else None
        env = {"XLAPORT_DIAGNOSE": "rng,xla_batchnorm" if use_cuda else "xla_batchnorm"}
        try:
            _, run = self.run_once(self.ref_name, "cuda" if use_cuda else "cpu", self.args, env)
        except VerifyError:
            return None
        return run.stdout, run.files

    def _switched(self, report: Report) -> None:
        """Outputs differ, and the reference was the original on this CPU
        host: where the conversion turned an accelerator test true, it runs
        the side the original runs only on a GPU, and what that side does
        differently (another data order, workers, precision) moves values
        by itself.  Said, with the lines, and how to compare like with like."""
        found = self._switched_tests(report.imported.get("candidate") or {})
        if found:
            shown = "; ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
            report.failures.append(
                f"the conversion takes the accelerator's side of {shown}; on this host without a GPU the original "
                "took the other side, so what that side does differently (data order, workers, precision) can move "
                "the values by itself: compare against a GPU run of the original (--reference cuda on a GPU host, "
                "or --record there and --against here)")

    def _switched_tests(self, imported: Dict[str, object]) -> List[str]:
        """The accelerator tests the conversion turned true, in the files of
        the modules the candidate imported (``imported``: its record)."""
        own = list(imported.get("own") or [])  # type: ignore[call-overload]
        files = [self.project.root / rel for rel in own_files(own, self._latest["xla"])]  # the script first
        return switched_tests(list(dict.fromkeys(files)), self.project.root)


def switched_tests(files: List[Path], root: Path) -> List[str]:
    """The accelerator tests the conversion turned true (XLA104/XLA105), as
    ``main.py:97 (`accelerator.is_available()` -> `True`)``."""
    found: List[str] = []
    for path in files[:200]:
        try:
            outcome = transform(path.read_bytes(), Settings(), str(path))  # (all rules: a test is kept
            # as it is where the code it switches on still holds CUDA no other rule converts)
        except (OSError, SourceError):
            continue
        found += [f"{path.relative_to(root).as_posix()}:{f.line} ({f.message})" for f in outcome.findings
                  if f.fix and f.code in ("XLA104", "XLA105")]
    return found


def _output_key(name: str) -> str:
    """An output's name without the reference's text of its line
    (``stdout line 3: "loss": 0.72`` -> ``stdout line 3``): the same output
    of two comparisons against different reference runs."""
    m = re.match(r"(.* line \d+): ", name)
    return m.group(1) if m else name
