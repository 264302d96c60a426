"""Run reference and candidate, compare outputs, judge compile behaviour.

The unit is the program as the user runs it (``xlaport.verify.project``):
each run happens in a fresh copy of the project tree -- the reference's
modules retargeted to the CPU, the candidate's converted -- from the same
relative working directory.  Verify executes the program, unsandboxed, with
the user's rights: the reference twice, the candidate at least once.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from xlaport.engine import Settings
from xlaport.verify import observer, record, syncs
from xlaport.verify.outputs import Compared
from xlaport.verify.project import Project, ProjectError, Side, changed_files

ROOT = Path(__file__).resolve().parents[2]
LEFTOVERS = observer.LEFTOVERS


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


# ------------------------------------------------------------------ the sides


def convert_sources(project: Project, target: str, settings: Optional[Settings] = None) -> Dict[str, bytes]:
    """Every Python module of the project, converted for ``target`` (``cpu``:
    the reference, the CUDA surface retargeted to the CPU)."""
    from xlaport.files import Entry
    from xlaport.runner import process

    if target == "cpu":
        settings = Settings(select=["XLA1"], target="cpu")
    settings = settings or Settings()
    files = project.python_files()
    entries = [Entry(p, project.root) for p in files]
    results = process(entries, settings, jobs=0 if len(entries) > 8 else 1)
    if target != "cpu":
        from xlaport.program import leave_alone, nothing_to_port

        if nothing_to_port(results):
            raise NothingToPort(leave_alone(results))
    out: Dict[str, bytes] = {}
    for r in results:
        rel = r.path.relative_to(project.root).as_posix()
        out[rel] = r.output if r.output is not None else (r.original or b"")
    return out


def convert_file(script: Path, target: str, out_dir: Path, settings: Optional[Settings] = None) -> Path:
    """One file converted for ``target`` into ``out_dir`` (benchmarks)."""
    from xlaport.engine import transform

    chosen = Settings(select=["XLA1"], target="cpu") if target == "cpu" else (settings or Settings())
    out = out_dir / script.name
    out.write_bytes(transform(script.read_bytes(), chosen, str(script)).code)
    return out


OBSERVE = Path(__file__).resolve().parent / "observe"  # the sitecustomize every run starts with


def run_side(side: Side, mode: str, args: Sequence[str], timeout: float, python: str = sys.executable,
             extra_env: Optional[Dict[str, str]] = None, run_dir: Optional[Path] = None,
             extra_path: Sequence[str] = ()) -> Run:
    """Run the side's copy of the program as its user runs it -- ``python
    SCRIPT ARGS`` from its working directory, nothing imported or wrapped
    (:mod:`xlaport.verify.observer` only watches) -- in a child process;
    ``mode`` is cpu, cuda (reference) or xla (candidate).  Its whole process
    group goes when it ends, is killed at ``timeout``, or the verification
    is stopped."""
    run_dir = run_dir or side.tree.parent
    prefix = run_dir / f"{side.name}-{mode}-{next(_RUNS)}"
    env = dict(os.environ)
    user_paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                  if p and not _inside(Path(p), side.project.root)]
    env["PYTHONPATH"] = os.pathsep.join([str(OBSERVE), *side.import_path(), *extra_path, str(ROOT), *user_paths])
    env["XLAPORT_OBSERVE"] = str(prefix)
    env["XLAPORT_SIDE_TREE"] = str(side.tree)
    env["XLAPORT_USER_ROOT"] = str(side.project.root)
    env["XLAPORT_LEFTOVERS"] = str(run_dir / f"{side.name}-{LEFTOVERS}")
    env["XLAPORT_SCRATCH"] = str(side.tree.parent.parent)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a fatal error (an abort in XLA) still shows the Python lines
    if mode == "xla":
        env.setdefault("PJRT_DEVICE", "CPU")
    elif mode == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra_env or {})
    Path(env["XLAPORT_LEFTOVERS"]).unlink(missing_ok=True)
    dump = Path(env["XLA_SAVE_TENSORS_FILE"]).parent if env.get("XLA_SAVE_TENSORS_FILE") else None
    mapped = [side.project.map_arg(a, side.tree) for a in args]
    cmd = [python, str(side.script), *mapped]
    out_path, err_path = Path(f"{prefix}.stdout"), Path(f"{prefix}.stderr")
    started = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        # files, not pipes: a child the program leaves running (a TensorBoard
        # writer, a logging service) holds no pipe open that we would wait on
        proc = subprocess.Popen(cmd, cwd=side.cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc, prefix)
            so_far = _so_far(dump, time.monotonic() - started)
            error = VerifyError(f"{side.project.rel_script} ({mode} run) ran past --timeout {timeout:g}s and was "
                                f"killed{_progress(so_far)}")
            error.so_far = so_far
            raise error
        finally:
            _kill(proc, prefix)  # nothing it started stays behind (and on Ctrl-C, it goes too)
    stderr = err_path.read_text(errors="replace")
    code = proc.returncode
    if code != 0:
        so_far = _so_far(dump, time.monotonic() - started)
        if code < 0 and -code in signal.valid_signals():
            how = f"killed by {signal.Signals(-code).name}"
            error = VerifyError(f"{side.project.rel_script} ({mode} run) died ({how}){_progress(so_far)}:\n"
                                f"{stderr[-4000:]}")
            error.so_far, error.ended = so_far, f"({how}){_progress(so_far)}"
            raise error
        said = stderr.strip()[-3000:] or f"exited with status {code}"
        raise VerifyError(f"{side.project.rel_script} ({mode} run) failed: {said}")
    recorded = observer.records(str(prefix))
    data: Dict[str, object] = {"stdout": out_path.read_text(errors="replace")}
    for rec in sorted(recorded, key=lambda r: r.get("pid") != proc.pid):  # the program's own process first
        for key, value in rec.items():
            if key == "metrics":
                data["metrics"] = _summed(data.get("metrics"), value)  # type: ignore[arg-type]
            else:
                data.setdefault(key, value)
    data["seconds"] = time.monotonic() - started
    if dump is not None and "steps" not in data:
        data.update(syncs.observed(dump, _user_file))
    files = side.outputs()
    leftovers = Path(env["XLAPORT_LEFTOVERS"])
    if leftovers.exists():
        files[LEFTOVERS] = leftovers
    return Run(True, str(data["stdout"]), dict(data.get("metrics") or {}), files, None, side.cwd,  # type: ignore[call-overload]
               data)


_RUNS = itertools.count(1)


def _summed(a: Optional[Dict[str, object]], b: Dict[str, object]) -> Dict[str, object]:
    """The counters of two processes of one run, added up."""
    if not a:
        return dict(b)
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict):
            merged = dict(out.get(key) or {})  # type: ignore[call-overload]
            for k, v in value.items():
                merged[k] = merged.get(k, 0) + v
            out[key] = merged
        elif isinstance(value, (int, float)) and key != "seconds":
            out[key] = out.get(key, 0) + value  # type: ignore[operator]
    return out


def _user_file(path: str) -> bool:
    from xlaport.verify.harness import _is_user_file

    return _is_user_file(path)


def _progress(so_far: Optional[Dict[str, object]]) -> str:
    """`` (after 235 s: 106 steps, 319 compiles, 319 executions)``, or ""."""
    if so_far is None:
        return ""
    return (f" (after {so_far['time']:.0f} s: {so_far['steps']:.0f} steps, {so_far['compiles']:.0f} compiles, "
            f"{so_far['executions']:.0f} executions)")


def _so_far(dump: Optional[Path], seconds: float) -> Optional[Dict[str, object]]:
    """What an XLA run killed or dead before its end had done by then, from
    torch_xla's graph dump (steps, compiles, executions, time; own_files: the
    user files on its stacks), or None."""
    if dump is None:
        return None
    return syncs.so_far(dump, _user_file, seconds)


def _kill(proc: subprocess.Popen, prefix: Optional[Path] = None) -> None:
    """The run's process group, and every process that still carries its
    mark (``XLAPORT_OBSERVE=prefix`` in its environment): a child that left
    the group (``setsid``, a double fork) goes too."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if prefix is not None:
        mark = f"XLAPORT_OBSERVE={prefix}\0".encode()
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                if int(entry.name) != os.getpid() and mark in (entry / "environ").read_bytes() + b"\0":
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except (ValueError, OSError):
        return False


def _cuda_available(python: str) -> bool:
    if not any(Path("/dev").glob("nvidia*")):
        return False
    probe = subprocess.run([python, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                           capture_output=True, env={**os.environ, "PJRT_DEVICE": ""})
    return probe.returncode == 0


# ------------------------------------------------------------------ verify


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


def verify(script: Path, converted: Optional[Path] = None, args: Sequence[str] = (), rtol: Optional[float] = None,
           atol: Optional[float] = None, timeout: float = 600, max_host_reads_per_step: Optional[float] = None,
           python: str = sys.executable, warmup_steps: int = 2, reference: str = "auto", device: str = "cpu",
           reference_runs: int = 2, lengths: Optional[str] = None, keep: bool = False,
           record_to: Optional[Path] = None, against: Optional[Path] = None, root: Optional[Path] = None,
           device_rng: bool = False, cwd: Optional[Path] = None,
           converted_args: Optional[Sequence[str]] = None) -> Report:
    """Run the reference and the candidate, compare, and judge (see the README).

    ``record_to``: run only the reference and store it there; ``against``:
    compare with such a record instead of running the original.  Temporary
    directories are removed unless ``keep`` -- also when the verification is
    interrupted (KeyboardInterrupt goes on to the caller)."""
    opts = Options(rtol, atol, timeout, max_host_reads_per_step, python, warmup_steps, reference, device,
                   max(1, reference_runs), lengths, keep, record_to, against, root, device_rng,
                   list(converted_args) if converted_args is not None else None)
    try:
        project = Project.of(Path(script), root, cwd)
    except ProjectError as exc:
        return Report("error", error=str(exc))
    config: Dict[str, object] = {
        "script": str(project.script), "root": str(project.root), "cwd": str(project.cwd),
        "converted": str(converted) if converted else None, "args": list(args), "rtol": rtol, "atol": atol,
        "warmup_steps": warmup_steps, "reference": reference, "device": device, "reference_runs": reference_runs,
        "lengths": lengths, "against": str(against) if against else None, "device_rng": device_rng,
        "converted_args": list(converted_args) if converted_args is not None else None,
        "environment": record.environment(python),
    }
    scratch = Path(tempfile.mkdtemp(prefix="xlaport-verify-", dir=_scratch_base(project.root)))
    if keep:
        config["kept"] = str(scratch)
    before = project.fingerprint()
    try:
        from xlaport.verify.session import Session

        report = Session(project, converted, list(args), opts, scratch).run()
    except (VerifyError, ProjectError) as exc:
        report = Report("error", error=str(exc))
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    touched = changed_files(before, project.fingerprint())
    if touched:  # never expected: said loudly if it happens
        report.error = (report.error + "\n" if report.error else "") + \
            f"the user's tree changed during the verification: {', '.join(touched[:10])}"
        report.verdict = "error"
    report.config = {**config, **report.config}
    return report


def _scratch_base(root: Path) -> Optional[str]:
    """A temporary directory outside the project (never inside the tree it copies)."""
    base = Path(tempfile.gettempdir()).resolve()
    if _inside(base, root):
        home = Path.home() / ".cache" / "xlaport"
        home.mkdir(parents=True, exist_ok=True)
        return str(home)
    return None


Runner = Callable[..., Run]
