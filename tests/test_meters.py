"""XLA425 (codemods/meters.py, codemods/analysis/meters.py): a meter handed
``.item()`` every step is handed the tensor; the log block that shows it
starts with the step's barrier; its numbers are read back after the loop."""

import pytest

from tests.conftest import convert_text
from tests.test_runnable_ports import needs_xla, run_on_xla
from tests.test_step_calls import original_output

METER = '''\
import torch


class AverageMeter:
    def __init__(self, name, fmt=":f"):
        self.name = name
        self.fmt = fmt
        self.reset()

    def reset(self):
        self.val = 0
        self.sum = 0
        self.count = 0
        self.avg = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)
{extra}

def train(model, loader, opt, every):
    losses = AverageMeter("Loss", ":.4e")
    for i, (x, y) in enumerate(loader):
        loss = model(x.cuda(), y.cuda())
        losses.update(loss.item(), x.size(0))
        opt.zero_grad()
        loss.backward()
        opt.step()
{log}
    return losses.avg
'''

LOG = "        if i % every == 0:\n            print(losses)\n"


def _program(log=LOG, extra=""):
    return METER.replace("{extra}", extra).replace("{log}", log.rstrip("\n"))


def _convert(log=LOG, extra="", **settings):
    out, findings = convert_text(_program(log, extra), **settings)
    return out, [f.code for f in findings]


def test_the_meter_is_handed_the_tensor_and_read_back_after_the_loop():
    out, codes = _convert()
    assert "losses.update(loss.detach().reshape(()), x.size(0))" in out
    assert "XLA425" in codes and "XLA401" not in codes
    # the log block starts with the barrier; the numbers come back, in the order update binds them
    assert "        if i % every == 0:\n            torch_xla.sync()\n            print(losses)\n" in out
    back = out.split("            print(losses)\n", 1)[1]  # (the loop walks an MpDeviceLoader, which syncs each batch)
    assert back.startswith("    losses.val = torch.as_tensor(losses.val).item()\n"
                           "    losses.sum = torch.as_tensor(losses.sum).item()\n"
                           "    losses.avg = torch.as_tensor(losses.avg).item()\n    return losses.avg\n"), back
    again, _ = convert_text(out)
    assert again == out  # idempotent


@pytest.mark.parametrize("log", [
    # compared on the host in the loop
    "        if losses.avg < 0.1:\n            break\n",
    # shown on every step, not in a log block: a read each step whatever we do
    "        print(losses)\n",
    # handed to something that is not a class of the program
    "        if i % every == 0:\n            writer.add_scalar('loss', losses.avg, i)\n",
    # `!r` shows the tensor, not its number
    "        if i % every == 0:\n            print(f'{losses.avg!r}')\n",
    # a return in the loop would skip the read-back
    "        if i % every == 0:\n            return losses.avg\n",
])
def test_a_use_the_meter_cannot_take_leaves_the_read(log):
    out, codes = _convert(log=log)
    assert "losses.update(loss.item(), x.size(0))" in out and "XLA425" not in codes


def test_a_class_that_binds_a_value_to_a_tensor_elsewhere_is_left():
    extra = "\n    def start(self):\n        self.sum = torch.zeros(())\n"
    out, codes = _convert(extra=extra)
    assert "loss.item()" in out and "XLA425" not in codes


def test_a_holder_that_only_shows_its_meters_is_followed():
    extra = ('\n\nclass Progress:\n    def __init__(self, meters):\n        self.meters = meters\n\n'
             '    def display(self, i):\n        print(i, " ".join(str(m) for m in self.meters))\n')
    src = _program("        if i % every == 0:\n            progress.display(i)\n", extra).replace(
        '    losses = AverageMeter("Loss", ":.4e")\n',
        '    losses = AverageMeter("Loss", ":.4e")\n    progress = Progress([losses])\n')
    out, findings = convert_text(src)
    assert "loss.detach().reshape(())" in out and "XLA425" in [f.code for f in findings]
    # a holder that sums what it holds reads the numbers on the host: left
    summing = src.replace('print(i, " ".join(str(m) for m in self.meters))', 'print(sum(m.avg for m in self.meters))')
    out, findings = convert_text(summing)
    assert "loss.item()" in out and "XLA425" not in [f.code for f in findings]


def test_a_meter_of_the_enclosing_function_is_left():
    src = _program().split("\n\ndef train")[0] + (
        "\n\ndef train(model, loader, opt, every):\n    losses = AverageMeter(\"Loss\")\n\n    def run():\n"
        "        for i, (x, y) in enumerate(loader):\n            loss = model(x.cuda(), y.cuda())\n"
        "            losses.update(loss.item(), x.size(0))\n            opt.zero_grad()\n"
        "            loss.backward()\n            opt.step()\n            if i % every == 0:\n"
        "                print(losses)\n\n    run()\n    return losses.avg\n")
    out, codes = _convert_src(src)
    assert "loss.item()" in out and "XLA425" not in codes


def test_a_loop_with_no_barrier_keeps_the_read():
    """An evaluation loop takes no optimizer step and gets no barrier: summed on
    the device, its passes would record one graph for all of them."""
    src = _program(log="").replace("        opt.zero_grad()\n        loss.backward()\n        opt.step()\n", "")
    out, findings = convert_text(src, ignore=["XLA301"])  # (with it, its device loader would sync every batch)
    assert "loss.item()" in out and "XLA425" not in [f.code for f in findings]


def _convert_src(src):
    out, findings = convert_text(src)
    return out, [f.code for f in findings]


def test_a_target_that_runs_eagerly_needs_no_barrier():
    out, codes = _convert(target="torchtpu")
    assert "loss.detach().reshape(())" in out and "sync()" not in out and "XLA425" in codes


@pytest.mark.xla
@needs_xla
def test_the_fixture_reads_no_loss_a_step_and_prints_the_cpu_originals_numbers(tmp_path):
    """fixtures/device_meters on XLA at 4 and 8 steps (two epochs, one
    progress line each): compiles flat, one execution a training step, and
    the training loop and the last pass over the data copy nothing to the
    host per step (the evaluation function, left as it is, one value a
    batch); the numbers the CPU original prints."""
    runs = {}
    for steps in (4, 8):
        result, out, _, _ = run_on_xla("device_meters", tmp_path / str(steps), "--steps", str(steps),
                                       "--print-every", "100")
        runs[steps] = (result["metrics"], out)
    (a, _), (b, out) = runs[4], runs[8]
    assert a["compiles"] == b["compiles"], (a, b)
    # two epochs of 4 more steps and 4 more evaluation reads, and the last pass's 4 more batches
    assert b["executions"] - a["executions"] == 2 * (4 + 4) + 4, (a, b)
    assert b["transfers"] - a["transfers"] == 2 * 4, (a, b)  # the evaluation function's reads alone
    assert out == original_output("device_meters", "--steps", "8", "--print-every", "100")


def test_a_suppression_on_the_update_leaves_the_meter():
    src = _program().replace("losses.update(loss.item(), x.size(0))",
                             "losses.update(loss.item(), x.size(0))  # noqa: XLA425")
    out, findings = convert_text(src)
    assert "losses.update(loss.item(), x.size(0))  # noqa: XLA425" in out
    assert "as_tensor" not in out and "XLA425" not in [f.code for f in findings]


EVAL = '''\
import torch
from torch.utils.data import DataLoader


class Meter:
    def __init__(self):
        self.sum = self.count = self.avg = 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def main(model, dataset):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    losses = Meter()
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=8):
            x, y = x.to(device), y.to(device)
            losses.update(torch.nn.functional.mse_loss(model(x), y).item(), x.size(0))
    return losses.avg
'''


def test_an_evaluation_loop_over_a_loader_the_port_wraps_sums_on_the_device():
    """No optimizer step and no barrier of its own, but XLA301 wraps its loader
    in an MpDeviceLoader, which syncs after every batch: each pass is one graph."""
    out, codes = _convert_src(EVAL)
    assert "MpDeviceLoader(DataLoader(dataset, batch_size=8)," in out and "XLA425" in codes
    assert ".item(), x.size(0))" not in out and "    losses.avg = torch.as_tensor(losses.avg).item()\n" in out
    # XLA301 turned off: the loader stays, nothing would cut the passes apart
    kept, findings = convert_text(EVAL, ignore=["XLA301"])
    assert ".item(), x.size(0))" in kept and "XLA425" not in [f.code for f in findings]


def test_a_loop_whose_barrier_is_suppressed_keeps_the_read():
    src = _program().replace("    for i, (x, y) in enumerate(loader):\n",
                             "    for i, (x, y) in enumerate(loader):  # noqa: XLA302\n")
    out, findings = convert_text(src, ignore=["XLA301"])
    assert "losses.update(loss.item(), x.size(0))" in out and "XLA425" not in [f.code for f in findings]
    # the same loop with its barrier: rewritten
    out, findings = convert_text(_program(), ignore=["XLA301"])
    assert "loss.detach().reshape(())" in out and "XLA425" in [f.code for f in findings]
