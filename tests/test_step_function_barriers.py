"""XLA302 in a function run every step (codemods/step_function_barriers.py):
the barrier goes before the host reads that follow the function's optimizer
step; fixtures/step_function_reads is the golden case (pyGAT's shape)."""

import pytest

from tests.conftest import convert_text
from tests.test_runnable_ports import needs_xla
from tests.test_step_calls import at_two_lengths, original_output

TRAIN = (
    "import torch\n\nmodel = Net().cuda()\nopt = torch.optim.Adam(model.parameters())\n\n\n"
    "def train(epoch):\n    opt.zero_grad()\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
    "    val = model(x).mean()\n{sync}    print(loss.item(), val.item())\n    return val.item()\n\n\n"
    "for epoch in range(3):\n    train(epoch)\n"
)


def test_the_barrier_goes_before_the_reads_after_the_step_and_the_loop_gets_none():
    out, findings = convert_text(TRAIN.format(sync=""))
    assert "    val = model(x).mean()\n    torch_xla.sync()\n    print(loss.item(), val.item())\n" in out
    assert out.count("torch_xla.sync()") == 1  # (the loop calls a function that syncs on every path)
    assert [f.line for f in findings if f.code == "XLA302"] == [13]
    assert convert_text(out)[0] == out


def test_a_function_that_syncs_or_is_not_run_every_step_is_left():
    synced = TRAIN.format(sync="    torch.cuda.synchronize()\n")
    assert "torch_xla.sync()\n    print" not in convert_text(synced)[0]
    once = TRAIN.replace("for epoch in range(3):\n    train(epoch)\n", "train(0)\n").format(sync="")
    assert "torch_xla.sync()" not in convert_text(once)[0]


def test_suppressed_on_its_line_the_function_keeps_the_loops_barrier():
    out, _ = convert_text(TRAIN.format(sync="").replace("    print(loss.item(), val.item())\n",
                                                        "    print(loss.item(), val.item())  # noqa: XLA302\n"))
    assert "    val = model(x).mean()\n    print(" in out and "    train(epoch)\n    torch_xla.sync()\n" in out


@pytest.mark.xla
@needs_xla
def test_the_epoch_runs_as_one_graph_with_the_originals_numbers(tmp_path):
    """fixtures/step_function_reads on XLA at 3 and 6 epochs: compiles flat,
    one execution an epoch (with the barrier at the loop's end: a graph for
    each of the five reads), and what the original prints on the CPU."""
    a, _, b, out6 = at_two_lengths("step_function_reads", tmp_path, "--epochs", 3, 6)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 3, (a, b)
    original = original_output("step_function_reads", "--epochs", "6")

    def numbers(text):
        return [float(w) for line in text.splitlines() for w in line.split()[1:] if w[0].isdigit()]

    assert len(numbers(out6)) == 31 and numbers(out6) == pytest.approx(numbers(original), rel=1e-4, abs=1e-5)
