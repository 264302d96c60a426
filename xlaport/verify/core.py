"""Run reference and candidate, compare outputs, judge compile behaviour."""

from __future__ import annotations

import json
import math
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

_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
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


def convert_file(script: Path, target: str, out_dir: Path, settings: Optional[Settings] = None) -> Path:
    s = settings or Settings()
    s = Settings(select=s.select, ignore=s.ignore, target=target, options=s.options)
    if target == "cpu":  # the reference: only the device swap, retargeted to the CPU
        s = Settings(select=["XLA1"], target="cpu")
    out = out_dir / script.name
    out.write_bytes(transform(script.read_bytes(), s, str(script)).code)
    return out


def run_script(script: Path, mode: str, args: Sequence[str], timeout: float, python: str = sys.executable) -> Run:
    workdir = Path(tempfile.mkdtemp(prefix=f"xlaport-{mode}-"))
    shutil.copy2(script, workdir / script.name)
    result_path = workdir / ".xlaport-result.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if mode == "xla":
        env.setdefault("PJRT_DEVICE", "CPU")
    else:
        env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "")
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
        raise VerifyError(f"{script.name} ({mode} run) failed:\n{data['error'][-4000:]}")
    files = {p.name: p for p in workdir.iterdir() if p.suffix in {".pt", ".pth", ".bin"}}
    return Run(True, data["stdout"], data.get("metrics", {}), files, None, workdir)


@dataclass
class Compared:
    name: str
    ok: bool
    max_abs_err: float
    max_rel_err: float


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol) or (math.isnan(a) and math.isnan(b))


def compare_stdout(ref: str, cand: str, rtol: float, atol: float) -> List[Compared]:
    out: List[Compared] = []
    ref_lines = [l for l in ref.splitlines() if _NUMBER.search(l)]
    cand_lines = [l for l in cand.splitlines() if _NUMBER.search(l)]
    if len(ref_lines) != len(cand_lines):
        return [Compared("stdout", False, math.inf, math.inf)]
    for i, (r, c) in enumerate(zip(ref_lines, cand_lines), 1):
        rn, cn = [float(x) for x in _NUMBER.findall(r)], [float(x) for x in _NUMBER.findall(c)]
        if len(rn) != len(cn):
            out.append(Compared(f"stdout line {i}", False, math.inf, math.inf))
            continue
        abs_err = max((abs(a - b) for a, b in zip(rn, cn)), default=0.0)
        rel_err = max((abs(a - b) / max(abs(a), 1e-12) for a, b in zip(rn, cn)), default=0.0)
        ok = all(_close(a, b, rtol, atol) for a, b in zip(rn, cn))
        out.append(Compared(f"stdout line {i}: {r.strip()[:60]}", ok, abs_err, rel_err))
    return out


def compare_files(ref: Dict[str, Path], cand: Dict[str, Path], rtol: float, atol: float) -> List[Compared]:
    import torch

    out: List[Compared] = []
    for name in sorted(set(ref) | set(cand)):
        if name not in ref or name not in cand:
            out.append(Compared(name, False, math.inf, math.inf))
            continue
        a = torch.load(ref[name], map_location="cpu", weights_only=False)
        b = torch.load(cand[name], map_location="cpu", weights_only=False)
        for key, (x, y) in _tensor_pairs(name, a, b):
            if x is None or y is None or x.shape != y.shape:
                out.append(Compared(key, False, math.inf, math.inf))
                continue
            x, y = x.double(), y.double()
            diff = (x - y).abs()
            abs_err = float(diff.max()) if diff.numel() else 0.0
            rel_err = float((diff / y.abs().clamp_min(1e-12)).max()) if diff.numel() else 0.0
            ok = bool(torch.allclose(y, x, rtol=rtol, atol=atol))
            out.append(Compared(key, ok, abs_err, rel_err))
    return out


def _tensor_pairs(prefix, a, b):
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        yield prefix, (a if isinstance(a, torch.Tensor) else None, b if isinstance(b, torch.Tensor) else None)
    elif isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            yield from _tensor_pairs(f"{prefix}[{k}]", a.get(k), b.get(k))
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _tensor_pairs(f"{prefix}[{i}]", x, y)


@dataclass
class Report:
    verdict: str
    outputs: List[Compared] = field(default_factory=list)
    metrics: Dict[str, object] = field(default_factory=dict)
    events: List[Dict[str, object]] = field(default_factory=list)
    error: Optional[str] = None

    def as_dict(self) -> Dict[str, object]:
        return {
            "verdict": self.verdict,
            "outputs": [o.__dict__ for o in self.outputs],
            "metrics": self.metrics,
            "events": self.events,
            "error": self.error,
        }


def verify(script: Path, converted: Optional[Path] = None, args: Sequence[str] = (), rtol: float = 1e-3,
           atol: float = 1e-5, timeout: float = 600, max_host_reads_per_step: Optional[float] = None,
           python: str = sys.executable) -> Report:
    try:
        import importlib.util

        if importlib.util.find_spec("torch_xla") is None and python == sys.executable:
            raise VerifyError("torch_xla is not installed: pip install 'xlaport[verify]' "
                              "(torch==2.9.0 and torch_xla==2.9.0)")
        scratch = Path(tempfile.mkdtemp(prefix="xlaport-verify-"))
        (scratch / "ref").mkdir()
        (scratch / "xla").mkdir()
        ref_script = convert_file(script, "cpu", scratch / "ref")
        cand_script = converted or convert_file(script, "torch_xla-2.9", scratch / "xla")
        ref = run_script(ref_script, "cpu", args, timeout, python)
        cand = run_script(Path(cand_script), "xla", args, timeout, python)
    except VerifyError as exc:
        return Report("error", error=str(exc))
    outputs = compare_stdout(ref.stdout, cand.stdout, rtol, atol) + compare_files(ref.files, cand.files, rtol, atol)
    m = cand.metrics
    syncs = int(m.get("syncs", 0) or 0)
    metrics = {
        "steps": syncs,
        "compiles": m.get("compiles", 0),
        "compile_seconds": m.get("compile_seconds", 0.0),
        "cached_compiles": m.get("cached_compiles", 0),
        "executions": m.get("executions", 0),
        "host_reads": m.get("transfers_from_device", 0),
        "scalar_reads": m.get("scalar_reads", 0),
        "fallbacks": m.get("fallbacks", {}),
    }
    events = [{"kind": "fallback", "path": str(cand_script), "line": None, "original_line": None,
               "count": n, "detail": op} for op, n in dict(metrics["fallbacks"]).items()]  # type: ignore[arg-type]
    verdict = "pass" if all(o.ok for o in outputs) else "fail"
    if max_host_reads_per_step is not None and syncs and metrics["host_reads"] / syncs > max_host_reads_per_step:  # type: ignore[operator]
        verdict = "fail"
    return Report(verdict, outputs, metrics, events)
