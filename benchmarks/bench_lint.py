"""Speed of `xlaport lint` against a bare LibCST parse of the same files.

Fetches wheels from PyPI (default: diffusers, transformers, accelerate, timm),
extracts their .py files, then measures in one run:
  * bare: LibCST parse of every file with the same number of worker processes;
  * lint: `xlaport lint -j N` over the same tree (start-up included);
  * one file: `xlaport lint FILE` wall time (process start-up included) next to
    `python -c 'import libcst; parse(FILE)'`.
Reports files/s and ratios. Usage: python benchmarks/bench_lint.py [--packages ...] [-j N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import zipfile
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"
DEFAULT = ["diffusers==0.30.3", "transformers==4.46.3", "accelerate==1.1.1", "timm==1.0.11"]


def corpus(packages):
    wheels = CACHE / "wheels"
    src = CACHE / "src"
    wheels.mkdir(parents=True, exist_ok=True)
    for spec in packages:
        name = spec.split("==")[0]
        if not list(wheels.glob(f"{name}-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "-d", str(wheels), spec], check=True)
    for whl in wheels.glob("*.whl"):
        dest = src / whl.name.split("-")[0]
        if not dest.exists():
            with zipfile.ZipFile(whl) as z:
                for n in z.namelist():
                    if n.endswith(".py"):
                        z.extract(n, dest)
    return src, sorted(src.rglob("*.py"))


def _parse(path):
    import libcst

    try:
        libcst.parse_module(Path(path).read_bytes())
    except Exception:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--packages", nargs="*", default=DEFAULT)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    src, files = corpus(args.packages)
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    print(f"corpus: {len(files)} files, {lines} lines ({', '.join(args.packages)}); jobs={args.jobs}")

    t = time.perf_counter()
    with Pool(args.jobs) as pool:
        pool.map(_parse, [str(p) for p in files], chunksize=8)
    bare = time.perf_counter() - t
    print(f"bare LibCST parse:   {bare:8.1f} s  {len(files) / bare:8.1f} files/s")

    xlaport = [sys.executable, "-m", "xlaport", "lint", "-j", str(args.jobs), "--format", "json", str(src)]
    t = time.perf_counter()
    r = subprocess.run(xlaport, capture_output=True, text=True, cwd=ROOT)
    lint = time.perf_counter() - t
    print(f"xlaport lint:        {lint:8.1f} s  {len(files) / lint:8.1f} files/s  (exit {r.returncode}; "
          f"ratio to bare parse {lint / bare:.2f})")
    one = max(files, key=lambda p: p.stat().st_size if b"cuda" in p.read_bytes() else 0)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "xlaport", "lint", str(one)], capture_output=True, cwd=ROOT)
    single = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import libcst; libcst.parse_module(open({str(one)!r},'rb').read())"])
    single_bare = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "xlaport", "--help"], capture_output=True, cwd=ROOT)
    startup = time.perf_counter() - t
    one_lines = one.read_bytes().count(b"\n")
    print(f"one file ({one.name}, {one_lines} lines): xlaport lint {single:.2f} s, "
          f"bare parse process {single_bare:.2f} s (ratio {single / single_bare:.2f}); `xlaport --help` {startup:.2f} s")


if __name__ == "__main__":
    main()
