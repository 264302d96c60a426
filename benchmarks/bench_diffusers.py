"""Tiny Stable Diffusion on XLA: xlaport's conversion of the whole diffusers
package against a device-swap-only conversion (`--select XLA1`), measured in
the same run.

Both conversions start from the installed diffusers (0.30.3, the `diffusers`
extra) and from `fixtures/diffusers_sd/input.py`; each converted script runs
as verify runs it on XLA (PJRT_DEVICE=CPU unless set), importing its own
converted package.  For 4, 8 and 16 inference steps it prints the number of
XLA compilations, the seconds spent compiling, the executions and the wall
time of the script, and the ratio swap-only / xlaport.

Usage: python benchmarks/bench_diffusers.py [--steps 4,8,16] [--repeat N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_fixtures import measure  # noqa: E402  (the same run as verify's, best of N)

DRIVER = ROOT / "fixtures" / "diffusers_sd" / "input.py"
CONVERSIONS = (("swap-only", ["--select", "XLA1"]), ("xlaport", []))


def convert(label: str, select, diffusers: Path) -> Path:
    out = Path(tempfile.mkdtemp(prefix=f"bench-sd-{label}-"))
    for src, dest in ((diffusers, out / "diffusers"), (DRIVER, out)):
        subprocess.run([sys.executable, "-m", "xlaport", "convert", str(src), "-o", str(dest), "-q", *select],
                       check=True, stderr=subprocess.DEVNULL)
    return out / DRIVER.name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", default="4,8,16", help="comma-separated inference step counts")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; the fastest is kept")
    args = ap.parse_args()
    spec = importlib.util.find_spec("diffusers")
    if spec is None or spec.origin is None:
        sys.exit("diffusers is not installed: pip install -e '.[diffusers]'")
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    diffusers = Path(spec.origin).parent
    scripts = {label: convert(label, select, diffusers) for label, select in CONVERSIONS}
    print(f"PJRT_DEVICE={os.environ['PJRT_DEVICE']}, tiny SD 32x32, DPM-Solver++, best of {args.repeat} run(s)\n")
    header = f"{'steps':>5s} {'conversion':10s} {'compiles':>8s} {'compile s':>9s} {'executions':>10s} {'run s':>7s}"
    print(header)
    print("-" * len(header))
    for steps in (int(s) for s in args.steps.split(",")):
        rows = {}
        for label, _ in CONVERSIONS:
            rows[label] = c, cs, secs, ex = measure(scripts[label], ["--steps", str(steps)], args.repeat)
            print(f"{steps:5d} {label:10s} {c:8d} {cs:9.2f} {ex:10d} {secs:7.2f}")
        s, x = rows["swap-only"], rows["xlaport"]
        print(f"{'':5s} {'swap/xlaport':10s} {s[0] / max(x[0], 1):8.2f} {s[1] / max(x[1], 1e-9):9.2f} "
              f"{s[3] / max(x[3], 1):10.2f} {s[2] / x[2]:7.2f}\n")


if __name__ == "__main__":
    main()
