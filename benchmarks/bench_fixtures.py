"""Compile behaviour and speed of xlaport's conversion against a device-swap-only
conversion (`--select XLA1`), for each fixture, measured in the same run.

Both conversions of a fixture run on XLA (PJRT_DEVICE=CPU unless set) as
verify runs them -- plain `python SCRIPT`, watched, not changed -- so the time
is the script's whole run: importing, tracing, compiling, executing.  Reports compile count
(XLA CompileTime samples), compile seconds, wall seconds and steps/s, and the
ratio xlaport / swap-only.

Usage: python benchmarks/bench_fixtures.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xlaport.engine import Settings  # noqa: E402
from xlaport.verify.core import convert_file, run_side  # noqa: E402
from xlaport.verify.project import Project, build_side  # noqa: E402

# (fixture, script arguments, loop steps the script takes)
CASES = [
    ("train_mlp", ["--epochs", "3"], 3 * 8 + 4),  # 8 train batches per epoch + 4 eval batches
    ("sample_loop", ["--steps", "16"], 16),
]


def measure(script: Path, args, repeat: int):
    best = None
    project = Project(script.parent.resolve(), script.resolve(), script.parent.resolve())
    for k in range(repeat):
        side = build_side(project, "xla", Path(tempfile.mkdtemp(prefix="bench-run-")) / script.parent.name, {})
        run = run_side(side, "xla", args, timeout=600)
        m = run.metrics
        row = (int(m["compiles"]), float(m["compile_seconds"]), float(run.data["seconds"]), int(m["executions"]))
        if best is None or row[2] < best[2]:
            best = row
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3, help="runs per conversion; the fastest is kept")
    args = ap.parse_args()
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    print(f"PJRT_DEVICE={os.environ['PJRT_DEVICE']}, best of {args.repeat} run(s) each\n")
    header = (f"{'fixture':12s} {'conversion':10s} {'compiles':>8s} {'compile s':>9s} {'executions':>10s} "
              f"{'run s':>7s} {'steps/s':>8s}")
    print(header)
    print("-" * len(header))
    for name, script_args, steps in CASES:
        src = ROOT / "fixtures" / name / "input.py"
        rows = {}
        for label, settings in (("swap-only", Settings(select=["XLA1"])), ("xlaport", Settings())):
            out = Path(tempfile.mkdtemp(prefix=f"bench-{label}-"))
            converted = convert_file(src, "torch_xla-2.9", out, settings)
            rows[label] = measure(converted, script_args, args.repeat)
            c, cs, secs, ex = rows[label]
            print(f"{name:12s} {label:10s} {c:8d} {cs:9.3f} {ex:10d} {secs:7.3f} {steps / secs:8.1f}")
        s, x = rows["swap-only"], rows["xlaport"]
        print(f"{'':12s} {'ratio':10s} {x[0] / max(s[0], 1):8.2f} {x[1] / max(s[1], 1e-9):9.2f} "
              f"{x[3] / max(s[3], 1):10.2f} {x[2] / s[2]:7.2f} {s[2] / x[2]:8.2f}\n")


if __name__ == "__main__":
    main()
