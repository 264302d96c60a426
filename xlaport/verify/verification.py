"""``xlaport verify`` as a function: the project found, a scratch tree made,
the session run, the user's tree checked untouched, every run stopped."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional, Sequence

from codemods.target import DEFAULT_TARGET
from xlaport.settings import Settings
from xlaport.verify import record
from xlaport.verify.core import _inside, kill_all
from xlaport.verify.model import Options, Report, VerifyError
from xlaport.verify.project import Project, ProjectError, changed_files
from xlaport.verify.session import Session


# what the report says of a conversion made with unsafe fixes (text and HTML: config.conversion)
UNSAFE = ("made with unsafe fixes (--unsafe-fixes, or the project's [tool.xlaport]): they change what the program "
          "computes, so its values may differ from the original's by design")


def verify(script: Optional[Path], converted: Optional[Path] = None, args: Sequence[str] = (), rtol: Optional[float] = None,
           atol: Optional[float] = None, timeout: float = 600, max_host_reads_per_step: Optional[float] = None,
           python: str = sys.executable, warmup_steps: int = 2, reference: str = "auto", device: str = "cpu",
           reference_runs: int = 2, lengths: Optional[str] = None, keep: bool = False,
           record_to: Optional[Path] = None, against: Optional[Path] = None, root: Optional[Path] = None,
           device_rng: bool = False, cwd: Optional[Path] = None,
           converted_args: Optional[Sequence[str]] = None, target: str = DEFAULT_TARGET,
           module: Optional[str] = None, settings: Optional[Settings] = None) -> Report:
    """Run the reference and the candidate, compare, and judge (see the README).

    ``record_to``: run only the reference and store it there; ``against``:
    compare with such a record instead of running the original.  Temporary
    directories are removed unless ``keep`` -- also when the verification is
    interrupted (KeyboardInterrupt goes on to the caller).  ``module``: the
    program is ``python -m module`` from ``cwd`` (``script`` is not read).
    ``settings``: what the conversion made here is asked to do (its target
    wins over ``target``; default: every rule's default)."""
    target = settings.target if settings is not None else target
    opts = Options(rtol, atol, timeout, max_host_reads_per_step, python, warmup_steps, reference, device,
                   max(1, reference_runs), lengths, keep, record_to, against, root, device_rng,
                   list(converted_args) if converted_args is not None else None, target, settings)
    try:
        project = Project.of(Path(script) if script is not None else None, root, cwd, module)
    except ProjectError as exc:
        return Report("error", error=str(exc))
    config: Dict[str, object] = {
        "script": str(project.script), "module": module, "root": str(project.root), "cwd": str(project.cwd),
        "converted": str(converted) if converted else None, "args": list(args), "rtol": rtol, "atol": atol,
        "warmup_steps": warmup_steps, "reference": reference, "device": device, "reference_runs": reference_runs,
        "lengths": lengths, "against": str(against) if against else None, "device_rng": device_rng,
        "converted_args": list(converted_args) if converted_args is not None else None, "target": target,
        "conversion_options": dict(settings.options) if settings is not None else {},
        **({"conversion": UNSAFE} if settings is not None and settings.options.get("unsafe_fixes") else {}),
        "environment": record.environment(python),
    }
    scratch = Path(tempfile.mkdtemp(prefix="xlaport-verify-", dir=_scratch_base(project.root)))
    if keep:
        config["kept"] = str(scratch)
    before = project.fingerprint()
    try:
        report = Session(project, converted, list(args), opts, scratch).run()
    except (VerifyError, ProjectError) as exc:
        report = Report("error", error=str(exc))
    finally:
        kill_all()
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
