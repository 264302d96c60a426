"""Test-only observer: at exit, write torch_xla's compile, execution and transfer counts
to $XLAPORT_TEST_METRICS -- reading only, and only if the program itself
imported torch_xla (nothing is imported into a program that did not)."""
import atexit
import json
import os
import sys


def _dump():
    out = os.environ.get("XLAPORT_TEST_METRICS")
    if not out or "torch_xla" not in sys.modules:
        return
    import torch_xla.debug.metrics as met

    def samples(name):
        data = met.metric_data(name)
        return int(data[0]) if data else 0

    with open(out, "w") as f:
        fallbacks = {n: met.counter_value(n) for n in met.counter_names() if n.startswith("aten::")}  # (CPU fallbacks)
        json.dump({"compiles": samples("CompileTime"), "executions": samples("ExecuteTime"), "fallbacks": fallbacks,
                   "transfers": samples("TransferFromDeviceTime")}, f)  # (copies to the host: each host read)


atexit.register(_dump)
