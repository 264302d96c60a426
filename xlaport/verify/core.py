"""One run of one side: the program as the user runs it, in a fresh copy of
its project tree (``xlaport.verify.project``) -- the original, its CPU
retargeting, or the conversion -- from the same relative working
directory, watched (``xlaport.verify.observer``), stopped with all it
started.  Verify executes the program, unsandboxed, with the user's rights.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from codemods.findings import KEPT_SWITCH_CODE
from xlaport.engine import Settings
from xlaport.verify import observer, syncs
from xlaport.verify.model import NothingToPort, Run, VerifyError
from xlaport.verify.outputs import LEFTOVERS
from xlaport.verify.project import Project, Side

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ the sides


def convert_sources(project: Project, target: str, settings: Optional[Settings] = None,
                    kept: Optional[List[str]] = None) -> Dict[str, bytes]:
    """Every Python module of the project, converted for ``target`` (``cpu``:
    the reference, the CUDA surface retargeted to the CPU); ``kept`` gets
    the CUDA tests the conversion left as they were (XLA118), ``path:line:
    why``."""
    from xlaport.files import Entry
    from xlaport.runner import process

    if target == "cpu":
        settings = Settings(select=["XLA1"], target="cpu")
    settings = settings or Settings(target=target)
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
        if kept is not None:
            kept += [f"{rel}:{f.line}: {f.message}" for f in r.findings or () if f.code == KEPT_SWITCH_CODE]
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
    SCRIPT ARGS`` (or ``python -m MODULE ARGS``) from its working directory, nothing imported or wrapped
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
    # one string hash for every run (the user's own, where set): a set of
    # strings iterates in one order on every side (pygcn numbers its classes
    # in the order of `set(labels)`), as it does in any one run of the user's
    env.setdefault("PYTHONHASHSEED", "0")
    if mode == "xla":
        env.setdefault("PJRT_DEVICE", "CPU")
    elif mode == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra_env or {})
    Path(env["XLAPORT_LEFTOVERS"]).unlink(missing_ok=True)
    dump = Path(env["XLA_SAVE_TENSORS_FILE"]).parent if env.get("XLA_SAVE_TENSORS_FILE") else None
    mapped = [side.project.map_arg(a, side.tree) for a in args]
    cmd = [python, *side.project.command(side.script), *mapped]
    out_path, err_path = Path(f"{prefix}.stdout"), Path(f"{prefix}.stderr")
    started = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        # files, not pipes: a child the program leaves running (a TensorBoard
        # writer, a logging service) holds no pipe open that we would wait on
        proc = subprocess.Popen(cmd, cwd=side.cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        _LIVE[proc.pid] = (proc, prefix)
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
            _LIVE.pop(proc.pid, None)
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
        # (a program that stops itself may say why on stdout: "ERROR: accelerator is not available")
        said = _told(stderr) or "\n".join(out_path.read_text(errors="replace").strip().splitlines()[-10:]) \
            or f"exited with status {code}"
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
# the runs under way (a candidate runs beside the references): what
# kill_all stops when the verification ends early
_LIVE: Dict[int, Tuple[subprocess.Popen, Path]] = {}


def kill_all() -> None:
    """Every run still under way, and all it started."""
    for proc, prefix in list(_LIVE.values()):
        _kill(proc, prefix)


def _told(stderr: str, most: int = 6000) -> str:
    """What a failed run said, short enough to show: its last Python
    traceback from the start (the frames and the exception, whose message
    may go on for pages), else the end of its stderr."""
    text = stderr.strip()
    start = text.rfind("Traceback (most recent call last):")
    if start >= 0 and len(text) - start > most:
        return text[start:start + most] + "\n[...]"
    return text[start:] if start >= 0 else text[-3000:]


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


