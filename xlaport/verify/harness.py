"""Runs one script in this (child) process and records what it produced.

Usage: python -m xlaport.verify.harness MODE RESULT_JSON SCRIPT [ARGS...]
MODE is "xla" (read torch_xla's metrics afterwards) or "cpu".
"""

from __future__ import annotations

import io
import json
import os
import runpy
import sys
import traceback


class _Tee(io.TextIOBase):
    def __init__(self, stream):
        self.stream = stream
        self.parts = []

    def write(self, s):
        self.parts.append(s)
        return self.stream.write(s)

    def flush(self):
        self.stream.flush()


def _metrics():
    import torch_xla.debug.metrics as met

    def samples(name):
        data = met.metric_data(name)
        return int(data[0]) if data else 0

    counters = {name: met.counter_value(name) or 0 for name in met.counter_names()}
    return {
        "compiles": samples("CompileTime"),
        "compile_seconds": (met.metric_data("CompileTime") or (0, 0))[1] / 1e9,
        "executions": samples("ExecuteTime"),
        "transfers_from_device": samples("TransferFromDeviceTime"),
        "uncached_compiles": counters.get("UncachedCompile", 0),
        "cached_compiles": counters.get("CachedCompile", 0),
        "syncs": counters.get("MarkStep", 0),
        "scalar_reads": counters.get("aten::_local_scalar_dense", 0),
        "fallbacks": {k: v for k, v in counters.items() if k.startswith("aten::") and k != "aten::_local_scalar_dense"},
    }


def main() -> int:
    mode, result_path, script, *args = sys.argv[1:]
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    result = {"mode": mode, "ok": True, "error": None}
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            result.update(ok=False, error=f"exited with status {exc.code}")
    except BaseException:
        result.update(ok=False, error=traceback.format_exc())
    sys.stdout = tee.stream
    result["stdout"] = "".join(tee.parts)
    if mode == "xla":
        try:
            result["metrics"] = _metrics()
        except Exception as exc:  # metrics unavailable: report, do not hide
            result["metrics_error"] = repr(exc)
    with open(result_path, "w") as fh:
        json.dump(result, fh)
    if not result["ok"]:
        sys.stderr.write(result["error"] or "")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
