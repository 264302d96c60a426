"""XLA110: CUDA streams that only order the program's own work go
(codemods/streams.py, codemods/analysis/streams.py).  The rule's own
examples are run by tests/test_rules.py; here the prefetcher shapes of real
programs, the uses that keep a stream, and the fixture run on XLA."""

import ast

import pytest

from conftest import convert_text
from test_runnable_ports import needs_xla
from test_step_calls import at_two_lengths, original_output, printed_numbers

HEAD = "import torch\n\n\n"

# apex's examples/imagenet data_prefetcher, as many ImageNet and detection trainers copy it
APEX = HEAD + (
    "class data_prefetcher:\n"
    "    def __init__(self, loader):\n"
    "        self.loader = iter(loader)\n"
    "        self.stream = torch.cuda.Stream()\n"
    "        self.preload()\n\n"
    "    def preload(self):\n"
    "        try:\n"
    "            self.next_input, self.next_target = next(self.loader)\n"
    "        except StopIteration:\n"
    "            self.next_input = None\n"
    "            return\n"
    "        with torch.cuda.stream(self.stream):\n"
    "            self.next_input = self.next_input.cuda(non_blocking=True)\n\n"
    "    def next(self):\n"
    "        torch.cuda.current_stream().wait_stream(self.stream)\n"
    "        input = self.next_input\n"
    "        if input is not None:\n"
    "            input.record_stream(torch.cuda.current_stream())\n"
    "        self.preload()\n"
    "        return input\n"
)


def _codes(findings):
    return [f.code for f in findings]


def _no_cuda_stream_left(out: str) -> bool:
    return "torch.cuda" not in out and "record_stream" not in out and "wait_stream" not in out


def test_apex_prefetcher_keeps_its_copies_and_loses_its_streams():
    out, findings = convert_text(APEX)
    assert _no_cuda_stream_left(out), out
    assert "        with contextlib.nullcontext():\n            self.next_input = self.next_input.to(" in out
    # the `if` that only recorded the stream goes whole; the rest of next() stays
    assert "if input is not None" not in out
    assert "        input = self.next_input\n        self.preload()\n        return input\n" in out
    assert _codes(findings).count("XLA110") == 4 and "XLA115" not in _codes(findings)
    ast.parse(out)
    again, more = convert_text(out)
    assert again == out and "XLA110" not in _codes(more)


def test_a_local_stream_and_its_synchronize():
    src = HEAD + ("def copy(x):\n    s = torch.cuda.Stream()\n    with torch.cuda.stream(s):\n"
                  "        y = x.cuda(non_blocking=True)\n    s.synchronize()\n    return y\n")
    out, _ = convert_text(src)
    assert "s = " not in out and "torch.cuda" not in out
    assert "    torch_xla.sync(wait=True)\n    return y\n" in out
    cpu, _ = convert_text(src, target="cpu")  # verify's reference waits for nothing
    assert "synchronize" not in cpu and "sync(" not in cpu and "    return y\n" in cpu


def test_torchtpu_waits_with_its_own_synchronize():
    src = HEAD + "s = torch.cuda.Stream()\nwith torch.cuda.stream(s):\n    y = f()\ns.synchronize()\n"
    out, _ = convert_text(src, target="torchtpu")
    assert "torch.accelerator.synchronize()" in out and "Stream" not in out


@pytest.mark.parametrize("use", [
    "run(stream)",  # handed on
    "if stream is None:\n    pass",  # tested
    "stream = None",  # bound to something else too
    "with torch.cuda.stream(stream) as s:\n    y = f(s)",  # its context value used
    "print(stream.query())",  # another method
])
def test_a_stream_used_any_other_way_is_left_and_reported(use):
    src = HEAD + f"stream = torch.cuda.Stream()\nwith torch.cuda.stream(stream):\n    y = f()\n{use}\n"
    out, findings = convert_text(src)
    assert "stream = torch.cuda.Stream()" in out and "with torch.cuda.stream(stream)" in out
    assert "XLA110" not in _codes(findings) and "XLA115" in _codes(findings)


def test_an_attribute_read_through_another_object_keeps_the_stream():
    src = HEAD + ("class P:\n    def __init__(self):\n        self.stream = torch.cuda.Stream()\n\n"
                  "    def load(self):\n        with torch.cuda.stream(self.stream):\n            self.x = f()\n\n\n"
                  "p = P()\np.stream.synchronize()\n")
    out, findings = convert_text(src)
    assert "self.stream = torch.cuda.Stream()" in out and "XLA110" not in _codes(findings)


def test_a_module_stream_read_in_a_function_is_one_stream():
    """A name bound at the top and read in a function: its uses there are
    its uses (dropping the binding alone would leave a NameError)."""
    src = HEAD + ("stream = torch.cuda.Stream()\n\n\ndef load(x):\n    with torch.cuda.stream(stream):\n"
                  "        return x.cuda()\n\n\ndef other():\n    return stream\n")
    out, findings = convert_text(src)
    assert "stream = torch.cuda.Stream()" in out and "XLA110" not in _codes(findings)
    ok, _ = convert_text(src.replace("    return stream\n", "    return None\n"))
    assert "Stream" not in ok and "with contextlib.nullcontext():" in ok


def test_a_wait_inside_a_loop_over_a_generator_call_keeps_the_loop():
    src = HEAD + ("s = torch.cuda.Stream()\nwith torch.cuda.stream(s):\n    y = f()\n"
                  "for t in tensors():\n    t.record_stream(s)\n")
    out, _ = convert_text(src)
    assert "for t in tensors():\n    pass\n" in out  # (the call still runs: it may do something)


@pytest.mark.xla
@needs_xla
def test_the_prefetcher_fixture_runs_one_execution_a_step_with_the_cpu_originals_losses(tmp_path):
    """fixtures/stream_prefetcher: the CUDA side of `device.type == "cuda"`
    is a stream prefetcher; converted, that side runs on XLA."""
    a, _, b, out = at_two_lengths("stream_prefetcher", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 3, (a, b)
    want = original_output("stream_prefetcher", "--steps", "6")
    assert printed_numbers(out) == pytest.approx(printed_numbers(want), abs=1e-5)


def test_with_the_rule_off_the_stream_is_reported_as_before():
    src = HEAD + "s = torch.cuda.Stream()\nwith torch.cuda.stream(s):\n    y = f()\n"
    out, findings = convert_text(src, ignore=["XLA110"])
    assert out.startswith(src) and [(f.code, f.line) for f in findings] == [("XLA115", 4), ("XLA115", 5)]
