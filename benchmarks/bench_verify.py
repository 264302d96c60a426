"""What `xlaport verify` costs against the plain runs it stands for.

For each case, measured in the same run: the original run once with plain
`python` on the CPU plus its conversion run once on XLA (PJRT_DEVICE=CPU) --
what a user would do by hand -- against `xlaport verify` on it (which runs
the reference twice, the conversion once, and more where asked: --lengths,
or a diagnostic run).  Prints wall seconds and the ratio verify / plain.

Usage: python benchmarks/bench_verify.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# (name, project folder, script, script arguments, verify options)
CASES = [
    ("train_mlp", ROOT / "fixtures" / "train_mlp", "input.py", ["--epochs", "2"], []),
    ("unseeded", ROOT / "fixtures" / "projects" / "unseeded", "train.py", [], []),
    ("torchscript", ROOT / "fixtures" / "projects" / "torchscript_trainer", "train.py", [], []),
    ("sampler --lengths", ROOT / "fixtures" / "projects" / "fixed_sampler", "train.py", [],
     ["--lengths", "--steps=6,8"]),
]


def _timed(cmd, cwd: Path, env=None) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, timeout=1200)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n{done.stderr.decode()[-2000:]}")
    return time.perf_counter() - start


def measure(name: str, folder: Path, script: str, args, options, repeat: int):
    work = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    try:
        src, conv = work / "src", work / "conv"
        shutil.copytree(folder, src)
        subprocess.run([PY, "-m", "xlaport", "convert", str(src), "-o", str(conv), "-q"], check=False,
                       capture_output=True)
        plain = verify = float("inf")
        for _ in range(repeat):
            plain = min(plain, _timed([PY, script, *args], src, {"CUDA_VISIBLE_DEVICES": ""})
                        + _timed([PY, script, *args], conv, {"PJRT_DEVICE": "CPU"}))
            verify = min(verify, _timed([PY, "-m", "xlaport", "verify", "--quiet", "--root", str(src), *options,
                                         str(src / script), "--", *args], src))
        return plain, verify
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    opts = parser.parse_args()
    print(f"{'case':20} {'plain s':>8} {'verify s':>9} {'ratio':>6}")
    for name, folder, script, args, options in CASES:
        plain, verify = measure(name, folder, script, args, options, opts.repeat)
        print(f"{name:20} {plain:8.1f} {verify:9.1f} {verify / plain:6.2f}")


if __name__ == "__main__":
    main()
