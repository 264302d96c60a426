"""XLA418 (codemods/deferred_reads.py, analysis/deferred_reads.py): a number
read before the optimizer step and used only after it is read after the
step.  fixtures/gan_reads is the golden case (pytorch/examples' DCGAN shape);
here what keeps a read where it is, and the XLA run."""

import pytest

from xlaport.engine import Settings, transform

from test_runnable_ports import needs_xla
from test_step_calls import at_two_lengths, original_output
from test_step_tail import converted

STEP = (
    "import torch\n\n"
    "def train(model, opt, loader):\n"
    "    for x, y in loader:\n"
    "        out = model(x.cuda())\n"
    "        loss = torch.nn.functional.mse_loss(out, y)\n"
    "        loss.backward()\n"
    "        mean = out.mean().item()\n"
    "{between}"
    "        opt.step()\n"
    "        print(loss.item(), mean)\n"
)
DEFERRED = "        mean_step = out.mean()\n"
READ_AFTER = "        opt.step()\n        torch_xla.sync()\n        mean = mean_step.item()\n"


def step(between: str = "") -> str:
    return STEP.format(between=between)


def test_a_number_used_after_the_step_is_read_after_it():
    code = converted(step())
    assert DEFERRED in code and READ_AFTER in code, code
    # a line between that neither uses nor binds it, the step's bookkeeping after it
    code = converted(step("        clip = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n").replace(
        "        opt.step()\n", "        opt.step()\n        opt.zero_grad()\n"))
    assert DEFERRED in code and "        opt.zero_grad()\n        torch_xla.sync()\n        mean = mean_step.item()\n" in code
    # both findings name the user's line: XLA418's, and XLA401's on the read now after the step
    found = [(f.code, f.line) for f in transform(step().encode(), Settings()).findings if f.code in ("XLA418", "XLA401")]
    assert ("XLA418", 8) in found and ("XLA401", 8) in found, found


LOSS = (
    "import torch\nimport torch.nn as nn\n\n"
    "def train(model, opt, loader):\n"
    "    criterion = nn.MSELoss()\n"
    "    for x, y in loader:\n"
    "        out = model(x.cuda())\n"
    "        loss = criterion(out, y)\n"
    "        loss.backward()\n"
    "        value = loss.item()\n"
    "{between}"
    "        opt.step()\n"
    "        print(value)\n"
)


def test_a_loss_read_before_the_step_is_read_after_it():
    """A name bound to what a loss of torch.nn computed is a new tensor: nothing the step changes."""
    code = converted(LOSS.format(between=""))
    assert "        loss.backward()\n        opt.step()\n        torch_xla.sync()\n        value = loss.item()\n" in code, code
    stops = {
        "changed in place": LOSS.format(between="        loss.mul_(2)\n"),
        "handed to a function": LOSS.format(between="        log(loss)\n"),
        "a model's output": LOSS.format(between="").replace("loss = criterion(out, y)", "loss = model(y)"),
        "an attribute": LOSS.format(between="").replace("loss = criterion(out, y)", "loss = model.scale"),
        "a loss of the program": LOSS.format(between="").replace("nn.MSELoss()", "MyLoss()"),
    }
    for why, src in stops.items():
        code = converted(src)
        assert code.index("value = loss.item()") < code.index("opt.step()"), (why, code)


def test_what_keeps_a_read_where_it_is():
    stops = {
        "used before the step": step("        if mean > 1:\n            opt.zero_grad()\n"),
        "bound again before the step": step("        mean = 0.0\n"),
        "a pass can end between": step("        if y is None:\n            continue\n"),
        "a view the step could change": step().replace("out.mean().item()", "out[0, 0].item()"),
        "a name": step().replace("out.mean().item()", "loss.item()"),
        "a weight": step().replace("out.mean().item()", "model.weight.data.item()"),
        "a random draw": step().replace("out.mean().item()", "torch.randn(1).item()"),
        "a global": step().replace("    for x, y in loader:\n", "    global mean\n    for x, y in loader:\n"),
        "a function that may read it": step().replace(
            "    for x, y in loader:\n", "    def show():\n        print(mean)\n\n    for x, y in loader:\n"),
    }
    for why, src in stops.items():
        code = converted(src)
        assert "mean_step" not in code, (why, code)
    # a module-level loop: a function of the module may read the global between
    module = ("import torch\n\ndef log():\n    print(mean)\n\nfor x, y in loader:\n    out = model(x.cuda())\n"
              "    loss = out.sum()\n    loss.backward()\n    mean = out.mean().item()\n    log()\n    opt.step()\n"
              "    print(mean)\n")
    assert "mean_step" not in converted(module)


@pytest.mark.xla
@needs_xla
def test_the_gans_step_runs_once_with_the_originals_numbers(tmp_path):
    """fixtures/gan_reads on XLA at 3 and 6 steps: compiles flat, one
    execution a step (with the reads where they were: six compiles and four
    executions a step), and the numbers the original prints on the CPU."""
    a, _, b, out6 = at_two_lengths("gan_reads", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 3, (a, b)
    original = original_output("gan_reads", "--steps", "6")

    def numbers(text):
        return [float(w) for line in text.splitlines() for w in line.split()[2:] if w[0] in "-0123456789"]

    assert len(out6.splitlines()) == 6 and numbers(out6) == pytest.approx(numbers(original), rel=1e-4, abs=1e-5)
