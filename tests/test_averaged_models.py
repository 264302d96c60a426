"""XLA423: an AveragedModel made on the device its model already sits on
drops ``device=`` (codemods/averaged_models.py, the last move read by
codemods/analysis/module_moves.py).  The rule's own examples are run by
tests/test_rules.py; here the shapes of real trainers, the cases left as
written, and the fixture run on XLA."""

import pytest

from conftest import convert_text
from test_runnable_ports import needs_xla
from test_step_calls import at_two_lengths, original_output, printed_numbers

HEAD = "import torch\nfrom torch.optim.swa_utils import AveragedModel\n\n"
EMA_FN = "lambda a, m, n: 0.9 * a + 0.1 * m"


def _codes(findings):
    return [f.code for f in findings]


def test_srgan_shape_a_model_moved_in_its_builder_then_averaged_under_a_flag():
    """Lornatang/SRGAN-PyTorch's build_model: the move two blocks up, the EMA under `if`."""
    src = HEAD + (
        "def build_model(config, device):\n"
        "    g_model = Generator(**config)\n"
        "    g_model = g_model.to(device)\n"
        "    if config['EMA']:\n"
        "        decay = config['DECAY']\n"
        f"        ema_g_model = AveragedModel(g_model, device=device, avg_fn={EMA_FN})\n"
        "    else:\n"
        "        ema_g_model = None\n"
        "    return g_model, ema_g_model\n"
    )
    out, findings = convert_text(src)
    assert f"ema_g_model = AveragedModel(g_model, avg_fn={EMA_FN})\n" in out
    assert _codes(findings) == ["XLA423"] and findings[0].line == 9


def test_a_model_moved_in_place_by_a_statement():
    """`model.to(DEVICE)` moves a module in place: no binding, still a move."""
    src = HEAD + (
        "model = PromptIR()\nmodel.to(DEVICE)\n"
        "optimizer = torch.optim.AdamW(model.parameters())\n"
        "swa_model = AveragedModel(model, device=DEVICE)\n"
    )
    out, findings = convert_text(src)
    assert "swa_model = AveragedModel(model)\n" in out and _codes(findings) == ["XLA423"]


def test_a_positional_device_becomes_none_so_the_arguments_after_it_keep_their_places():
    src = HEAD + f"model = Net().to(device)\nema = AveragedModel(model, device, {EMA_FN})\n"
    out, _ = convert_text(src)
    assert f"ema = AveragedModel(model, None, {EMA_FN})\n" in out


def test_the_device_keyword_last_leaves_no_dangling_comma():
    src = HEAD + f"model = Net().to(device)\nema = AveragedModel(model, avg_fn={EMA_FN}, device=device)\n"
    out, _ = convert_text(src)
    assert f"ema = AveragedModel(model, avg_fn={EMA_FN})\n" in out


def test_a_call_laid_out_one_argument_a_line_keeps_its_layout():
    """As `ruff format` writes a call that does not fit one line: the trailing comma stays."""
    src = HEAD + "model = Net().to(device)\nema = AveragedModel(\n    model,\n    device=device,\n)\n"
    out, _ = convert_text(src)
    assert "ema = AveragedModel(\n    model,\n)\n" in out


@pytest.mark.parametrize("lines", [
    # kept on another device on purpose (an EMA on the host saves device memory)
    "model = Net().to(device)\nema = AveragedModel(model, device='cpu')\n",
    # a device from the config: not visibly the model's
    "model = Net().to(device)\nema = AveragedModel(model, device=config.SWA.DEVICE)\n",
    # moved to another device expression
    "model = Net().to(args.device)\nema = AveragedModel(model, device=device)\n",
    # moved after the EMA was made: the EMA's copy is made on the host and moved by device=
    "model = Net()\nema = AveragedModel(model, device=device)\nmodel.to(device)\n",
    # moved back to the host in place after the move
    "model = Net().to(device)\nmodel.cpu()\nema = AveragedModel(model, device=device)\n",
    # bound again after the move
    "model = Net().to(device)\nmodel = wrap(model)\nema = AveragedModel(model, device=device)\n",
    # moved on one path only
    "model = Net()\nif args.gpu:\n    model.to(device)\nema = AveragedModel(model, device=device)\n",
    # moved back later in the loop around it: the next pass makes the average of a model on the host
    "model = Net().to(device)\nfor epoch in range(3):\n    ema = AveragedModel(model, device=device)\n"
    "    model = model.cpu()\n",
    # a parameter: where the caller's model is, is not read
    "def make(model, device):\n    return AveragedModel(model, device=device)\n",
    # moved again by the program itself right after: the counter goes to the device all the same
    "model = Net().to(device)\nema = AveragedModel(model, device=device)\nema = ema.to(device)\n",
    # not a name
    "self.model = Net().to(device)\nema = AveragedModel(self.model, device=device)\n",
])
def test_left_as_written_where_dropping_device_could_move_the_average(lines):
    src = HEAD + lines
    out, findings = convert_text(src, select=["XLA423"])
    assert out == src and findings == []


def test_another_class_of_the_same_name_is_not_torchs():
    src = "from swa import AveragedModel\n\nmodel = Net().to(device)\nema = AveragedModel(model, device=device)\n"
    out, findings = convert_text(src, select=["XLA423"])
    assert out == src and findings == []


def test_with_the_rule_off_the_call_is_left():
    src = HEAD + "model = Net().to(device)\nema = AveragedModel(model, device=device)\n"
    out, findings = convert_text(src, ignore=["XLA423"])
    assert out == src and "XLA423" not in _codes(findings)


def test_a_noqa_on_the_line_keeps_it():
    src = HEAD + "model = Net().to(device)\nema = AveragedModel(model, device=device)  # noqa: XLA423\n"
    out, _ = convert_text(src)
    assert out == src


STEP = (
    "for x, y in data:\n"
    "    x, y = x.cuda(), y.cuda()\n"
    "    loss = loss_fn(model(x), y)\n"
    "    opt.zero_grad()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    ema.update_parameters(model)\n"
    "    meter.update(loss.item())\n"
)


def test_an_update_of_an_average_counted_on_the_host_joins_the_steps_graph():
    """The barrier the host read after the step asks for follows the EMA update (one graph a step)."""
    src = HEAD + "model = Net().cuda()\nopt = torch.optim.SGD(model.parameters())\n" \
        "ema = AveragedModel(model, device='cuda')\n" + STEP
    out, findings = convert_text(src)
    assert "ema = AveragedModel(model)\n" in out
    assert "    ema.update_parameters(model)\n    torch_xla.sync()\n    meter.update(loss.item())\n" in out


def test_an_average_counted_on_the_device_updates_after_the_barrier():
    """Kept on another device, its update reads its counter: the barrier stays right after the step."""
    src = HEAD + "model = Net().cuda()\nopt = torch.optim.SGD(model.parameters())\n" \
        "ema = AveragedModel(model, device=ema_device)\n" + STEP
    out, _ = convert_text(src)
    assert "    opt.step()\n    torch_xla.sync()\n    ema.update_parameters(model)\n" in out


@pytest.mark.xla
@needs_xla
def test_the_ema_fixture_runs_one_execution_a_step_with_the_cpu_originals_values(tmp_path):
    """fixtures/ema_trainer: with the counter on the device (`--ignore
    XLA423`) a step ran 4 graphs (9 compiles); converted, the update joins
    the step's graph: one a step, compiles flat, and the losses, the meter's
    mean and the average the unconverted program computes on the CPU."""
    a, _, b, out = at_two_lengths("ema_trainer", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 3, (a, b)
    want = original_output("ema_trainer", "--steps", "6")
    assert printed_numbers(out) == pytest.approx(printed_numbers(want), abs=1e-5)
