"""What a verification deals in: its options, a run, a report, and the
errors that end it (the bottom floor of ``xlaport.verify``)."""

from __future__ import annotations

from codemods.target import DEFAULT_TARGET

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from xlaport.settings import Settings
from xlaport.verify.outputs import Compared


class VerifyError(Exception):
    """The program could not be verified (crash, timeout, missing runtime).
    ``so_far``: what an XLA run killed at the timeout had done by then;
    ``ended``: how a run that died ended and how far it got
    (``killed by SIGABRT (after 92 s: 1 steps, ...)``)."""

    so_far: Optional[Dict[str, object]] = None
    ended: str = ""


class NothingToPort(Exception):
    """The project holds no CUDA or accelerator code: what ``convert`` says
    (``xlaport.program``), said by verify too, before anything runs."""


@dataclass
class Run:
    ok: bool
    stdout: str
    metrics: Dict[str, object]
    files: Dict[str, Path]
    error: Optional[str]
    workdir: Path
    data: Dict[str, object] = field(default_factory=dict)  # everything the harness recorded


# the heading of the numbers a report leaves out by their form (text and HTML)
BY_FORM = "left out by their form (timings, dates, sizes; each line's other numbers compared)"


@dataclass
class Report:
    verdict: str
    outputs: List[Compared] = field(default_factory=list)
    metrics: Dict[str, object] = field(default_factory=dict)
    events: List[Dict[str, object]] = field(default_factory=list)
    error: Optional[str] = None
    failures: List[str] = field(default_factory=list)
    varies: List[str] = field(default_factory=list)
    by_form: List[str] = field(default_factory=list)  # timings, dates, sizes left out (the rest compared)
    not_compared: List[str] = field(default_factory=list)
    float_order: List[str] = field(default_factory=list)  # compared, within the original's float-order noise
    config: Dict[str, object] = field(default_factory=dict)
    random: List[str] = field(default_factory=list)  # random, not compared: op and line
    imported: Dict[str, Dict[str, List[str]]] = field(default_factory=dict)  # side -> tree -> modules
    divergence: Optional[Dict[str, object]] = None

    def as_dict(self) -> Dict[str, object]:
        return {
            "verdict": self.verdict,
            "config": self.config,
            "outputs": [o.__dict__ for o in self.outputs],
            "varies_between_runs": self.varies,
            "left_out_by_form": self.by_form,
            "not_compared": self.not_compared,
            "within_float_order_noise": self.float_order,
            "random_not_compared": self.random,
            "divergence": self.divergence,
            "imported": self.imported,
            "metrics": self.metrics,
            "events": self.events,
            "failures": self.failures,
            "error": self.error,
        }


@dataclass
class Options:
    """What a verification was asked to do (the command line's options)."""

    rtol: Optional[float] = None  # None: follow the dtypes (see outputs.tolerance)
    atol: Optional[float] = None
    timeout: float = 600
    max_host_reads_per_step: Optional[float] = None
    python: str = sys.executable
    warmup_steps: int = 2
    reference: str = "auto"
    device: str = "cpu"
    reference_runs: int = 2
    lengths: Optional[str] = None
    keep: bool = False
    record_to: Optional[Path] = None
    against: Optional[Path] = None
    root: Optional[Path] = None
    device_rng: bool = False  # True: leave the device's random numbers to XLA's generator
    # the conversion's own arguments, where they differ from the reference's (a device named on the command line)
    converted_args: Optional[List[str]] = None
    target: str = DEFAULT_TARGET  # what the conversion targets (torchtpu: a device-generic, eager port)
    # what the conversion made here is asked to do, as `convert` would be from the project's root: its
    # [tool.xlaport] and verify's --unsafe-fixes (None: every rule's default for ``target``)
    settings: Optional[Settings] = None
