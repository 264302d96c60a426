"""XLA411 on a slice of a device table taken in the step itself
(``X_train[i:i + batch_size]``, ``i`` the step's Python int; the TCN
benchmarks' trainers): the slice start is a constant of the graph, one graph
per step (185 compiles for 20 steps of TCN's adding problem, each step's
graph cut by CPU fallbacks); converted, the rows are gathered at indices sent
to the device: one graph per slice length (14 compiles at 20 and at 40 steps).
A function that reads the tensors from the module sees them as tensors."""

import pytest

from tests.conftest import convert_text

from test_recompile_fixes import _numbers, _original_and_two_lengths, codes
from test_runnable_ports import FIXTURES, needs_xla

LOOP = '''\
import torch

data = torch.arange(40.0).view(20, 2).cuda()
for i in range(0, data.size(0), 6):
    x = data[i:i + 6]
    loss = model(x).sum()
    loss.backward()
    opt.step()
'''



def test_a_slice_by_the_step_int_gathers_at_device_indices():
    out, findings = convert_text(LOOP)
    assert codes(findings, "XLA411") == [(5, True)], findings
    assert ("    x = data[torch.arange(max(min(i + 6, data.size(0)) - i, 0), device=data.device) + "
            "torch.tensor([i], device=data.device)]\n") in out, out
    assert "XLA407" not in [f.code for f in findings]
    again, findings = convert_text(out)
    assert again == out and not codes(findings, "XLA411")


def test_a_function_reads_the_modules_tensors():
    src = LOOP.replace("for i in range(0, data.size(0), 6):\n", "\n\ndef train():\n    for i in range(0, data.size(0), 6):\n")
    src = src.replace("    x = data", "        x = data").replace("    loss", "        loss").replace("    opt", "        opt")
    out, findings = convert_text(src)
    assert codes(findings, "XLA411") == [(8, True)], findings
    # a function that binds the name itself reads its own (a host list here)
    own = src.replace("def train():\n", "def train():\n    data = list(range(20))\n")
    out, findings = convert_text(own)
    assert not codes(findings, "XLA411") and "torch.tensor([" not in out, out


@pytest.mark.parametrize("change", [
    ("    x = data[i:i + 6]\n", "    x = data[i:i + 6]\n    x.mul_(2)\n"),  # changed in place: a copy would not write back
    ("    x = data[i:i + 6]\n", "    data[i:i + 6] = 0\n    x = data\n"),  # written
    ("data[i:i + 6]", "data[i:i + 6:2]"),  # a step
    ("data[i:i + 6]", "data[i - 1:i + 6]"),  # a start that may count from the end
    ("data[i:i + 6]", "data[:i + 6]"),  # no start
])
def test_a_slice_that_is_not_a_plain_read_stays_reported(change):
    src = LOOP.replace(*change)
    assert change[1] in src
    out, findings = convert_text(src)
    assert not codes(findings, "XLA411") and "torch.tensor([" not in out, out
    assert "XLA407" in [f.code for f in findings]


def test_a_slice_of_a_host_table_or_by_an_inner_counter_is_left():
    out, findings = convert_text(LOOP.replace("torch.arange(40.0).view(20, 2).cuda()", "list(range(20))"))
    assert not codes(findings, "XLA411") and "torch.tensor([" not in out
    inner = LOOP.replace("    x = data[i:i + 6]\n", "    x = 0\n    for k in range(3):\n        x = x + data[k:k + 2]\n")
    out, findings = convert_text(inner)  # a loop inside the step: one graph already
    assert not codes(findings, "XLA411") and "data[k:k + 2]" in out


@pytest.mark.xla
@needs_xla
def test_sliced_batches_compile_once_per_length_and_train_as_the_original(tmp_path):
    """fixtures/step_slices at 4 and 8 steps: compiles flat, the original's loss."""
    original, short, long, out8 = _original_and_two_lengths("step_slices", tmp_path)
    assert short["metrics"]["compiles"] == long["metrics"]["compiles"], (short, long)
    assert _numbers(out8) == pytest.approx(_numbers(original.stdout), rel=1e-3, abs=1e-4), (out8, original.stdout)


DERIVED = LOOP.replace("for i in range(0, data.size(0), 6):\n    x = data[i:i + 6]\n",
                       "for batch in range(0, 4):\n    start = batch * 6\n    end = start + 6\n    x = data[start:end]\n")


def test_ints_computed_from_the_counter_change_every_step_too():
    """TCN's copy-memory trainer: `start_ind = batch`, `end_ind = start_ind + batch_size`
    (103 -> 16 compiles at 10 steps, 16 at 20)."""
    assert "x = data[start:end]" in DERIVED
    out, findings = convert_text(DERIVED)
    assert codes(findings, "XLA411") == [(7, True)], findings
    assert "torch.tensor([start], device=data.device)" in out


@pytest.mark.parametrize("change", [
    ("    end = start + 6\n", "    end = start + 6\n    if end > 20:\n        start = None\n"),  # not always an int
    ("    start = batch * 6\n", "    start = batch / 6\n"),  # a float
    ("    start = batch * 6\n", "    start = f(batch)\n"),  # a call
])
def test_a_name_that_may_be_no_int_of_the_counter_is_no_counter(change):
    src = DERIVED.replace(*change)
    assert src != DERIVED
    out, findings = convert_text(src)
    assert not codes(findings, "XLA411") and "torch.tensor([" not in out, out


def test_a_slice_after_whole_dimensions_gathers_on_its_own_dimension():
    """Batch-first token streams are cut along their second dimension (`data[:, i:i + seq_len]`)."""
    src = LOOP.replace("data[i:i + 6]", "data[:, i:i + 6]").replace(".view(20, 2)", ".view(2, 20)").replace(
        "data.size(0), 6", "data.size(1), 6")
    out, findings = convert_text(src)
    assert codes(findings, "XLA411") == [(5, True)], findings
    assert ("x = data[:, torch.arange(max(min(i + 6, data.size(1)) - i, 0), device=data.device) + "
            "torch.tensor([i], device=data.device)]") in out, out
    for other in ("data[0, i:i + 6]", "data[i:i + 6, :]", "data[:, i:i + 6, 0]"):  # an int, or a bound first or last
        out, findings = convert_text(src.replace("data[:, i:i + 6]", other))
        assert not codes(findings, "XLA411") and "torch.tensor([" not in out, other


@pytest.mark.torch
def test_the_gathered_columns_are_the_slices_columns():
    import torch

    source = torch.arange(60).view(3, 20)
    for i, n in ((0, 6), (18, 6), (20, 2), (25, 3)):
        got = source[:, torch.arange(max(min(i + n, source.size(1)) - i, 0), device=source.device)
                     + torch.tensor([i], device=source.device)]
        assert torch.equal(got, source[:, i:i + n]), (i, n)



@pytest.mark.parametrize("name", ["recompile_fixes", "teacher_forcing"])
def test_a_counter_of_a_loop_inside_the_step_is_traced_whole_into_its_graph(name):
    """A decoder unrolled over time steps inside the step (in the step loop,
    or in a function the step runs: teacher_forcing's ``refine``) reads
    ``trg[t]`` for every ``t`` each step: one graph, nothing to report; the
    step loop's own counter indexing the same tensor is a graph a step."""
    src = (FIXTURES / name / "input.py").read_text()
    _, findings = convert_text(src)
    assert "XLA407" not in [f.code for f in findings], [f for f in findings if f.code == "XLA407"]
    if name != "recompile_fixes":
        return
    stepped = src.replace("loss = loss + nn.functional.cross_entropy(out, trg[t])",
                          "loss = loss + nn.functional.cross_entropy(out, trg[t]) + trg[step].sum()")
    assert stepped != src
    _, findings = convert_text(stepped)
    line = src.splitlines().index("            loss = loss + nn.functional.cross_entropy(out, trg[t])") + 1
    assert [f.message.split("`")[3] for f in findings if f.code in ("XLA407", "XLA411") and f.line == line] \
        == ["step"], findings
