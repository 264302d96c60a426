"""XLA210 (codemods/prints.py) where the pass has synced before it prints:
karpathy/makemore syncs (``torch.cuda.synchronize()`` under ``if
args.device.startswith('cuda')``, converted) to time its step, then logs
``loss.item()``.  Deferred to a step closure, the log ran at the next pass's
sync -- a pass late -- and the last pass's never ran: converted makemore at
21 steps printed its steps 0 and 10, not 20.  The loss is computed by then:
the print copies it and stays where it is.  A loop that defers a print and
is left by ``break`` gets a barrier before the break even when it syncs by
hand (codemods/barriers.py)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import convert_text

LOOP = '''\
import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--device", type=str, default="cpu", help="cpu|cuda|cuda:2")
args = parser.parse_args()
device = args.device
torch.manual_seed(0)
model = torch.nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.ones(8, 4).to(device)
step = 0
while True:
    t0 = time.time()
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t1 = time.time()
    if step % 5 == 0:
        print(f"step {step} | loss {loss.item():.5f} | {(t1 - t0) * 1000:.2f}ms")
    step += 1
    if step >= args.steps:
        break
'''
PRINT = '        print(f"step {step} | loss {loss.item():.5f} | {(t1 - t0) * 1000:.2f}ms")\n'


def test_a_print_after_the_passs_sync_stays_where_it_is():
    out, findings = convert_text(LOOP)
    assert PRINT in out and "add_step_closure" not in out, out
    assert "XLA210" not in {f.code for f in findings}
    assert '    if device.startswith("xla"):\n        torch_xla.sync(wait=True)\n' in out, out
    assert "        torch_xla.sync()\n        break\n" not in out  # (nothing deferred, nothing to flush)


@pytest.mark.parametrize("change", [
    # the sync may not run on XLA
    ('    if device.startswith("cuda"):\n        torch.cuda.synchronize()\n', "    pass\n"),
    # the print comes before it
    ('    if step % 5 == 0:\n' + PRINT, ""),
    # it prints a tensor computed after the sync
    ("    t1 = time.time()\n", "    t1 = time.time()\n    loss = loss * 2\n"),
])
def test_a_print_the_pass_has_not_synced_for_is_deferred(change):
    source = LOOP.replace(*change)
    if not change[1] and change[0].startswith("    if step"):  # (moved before the sync)
        source = source.replace("    opt.step()\n", "    opt.step()\n    if step % 5 == 0:\n" + PRINT)
    out, findings = convert_text(source)
    assert "xm.add_step_closure(lambda" in out and "XLA210" in {f.code for f in findings}, out
    # and the break that would leave the last pass's closure behind has a barrier before it
    assert "        torch_xla.sync()\n        break\n" in out, out


@pytest.mark.xla
def test_the_converted_loop_prints_every_line_of_the_original_on_xla(tmp_path):
    """11 and 21 steps: the original's lines on the CPU, one graph execution a
    step, the same compiles at both lengths (deferred, the line of step 20 was
    never printed)."""
    from test_runnable_ports import OBSERVER

    source = LOOP.replace('if device.startswith("cuda")', 'if args.device.startswith("cuda")')  # (as makemore)
    (tmp_path / "conv.py").write_text(convert_text(source)[0])
    (tmp_path / "orig.py").write_text(source)
    seen = {}
    for n in (11, 21):
        original = subprocess.run([sys.executable, "orig.py", "--steps", str(n)], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=300)
        metrics = tmp_path / f"m{n}.json"
        converted = subprocess.run([sys.executable, "conv.py", "--steps", str(n), "--device", "cuda"], cwd=tmp_path, capture_output=True, text=True,
                                   timeout=300, env={**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(OBSERVER),
                                                     "XLAPORT_TEST_METRICS": str(metrics)})
        assert converted.returncode == 0, converted.stderr[-2000:]

        def losses(text):
            return [line.split("|")[:2] for line in text.splitlines()]

        assert losses(converted.stdout) == losses(original.stdout) and len(losses(original.stdout)) == n // 5 + 1
        seen[n] = json.loads(metrics.read_text())
    assert seen[11]["compiles"] == seen[21]["compiles"], seen
    assert seen[21]["executions"] - seen[11]["executions"] == 10, seen


def test_a_keyword_or_an_attribute_named_like_a_tensor_is_no_read():
    """akamaster/pytorch_resnet_cifar10 prints its meters with
    `'{loss.val:.4f}'.format(loss=losses)` in a step where `loss` is a
    tensor: the keyword (and `meter.loss`) names no tensor, so the print
    reads nothing and stays; deferred, it kept the step's barrier away (a
    closure after the step would run a step late)."""
    src = ("import torch\n\ndef train(model, opt, loader, losses, meter):\n    for i, (x, y) in enumerate(loader):\n"
           "        loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())\n        opt.zero_grad()\n"
           "        loss.backward()\n        opt.step()\n        losses.update(loss.item())\n"
           "        print('Loss {loss.val:.4f} {m}'.format(loss=losses, m=meter.loss))\n")
    out, findings = convert_text(src)
    assert "add_step_closure" not in out and "XLA210" not in [f.code for f in findings], out
    assert "        opt.step()\n        torch_xla.sync()\n        losses.update(loss.item())\n" in out, out
    # the tensor itself, by a keyword: deferred as before
    read = convert_text(src.replace("loss=losses", "loss=loss"))[0]
    assert "add_step_closure" in read, read


SCHEDULED = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
x = torch.ones(8, 4).cuda()
for step in range(4):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step {} loss {:.5f} lr {:.5f}".format(step, loss.item(), opt.param_groups[0]["lr"]))
    sched.step()
"""


def test_a_deferred_print_reads_the_objects_it_names_where_it_was():
    """weiaicunzai/pytorch-cifar100 prints `optimizer.param_groups[0]['lr']`
    with the loss, then steps its warm-up scheduler: deferred whole, the
    closure read the learning rate at the sync, after the scheduler had
    changed it (the next step's rate).  What reads no tensor is evaluated
    where the print was, as a lambda default; only `loss.item()` waits."""
    out, findings = convert_text(SCHEDULED)
    assert ("xm.add_step_closure(lambda step=step, loss=loss, lr=opt.param_groups[0][\"lr\"]: "
            "print(\"step {} loss {:.5f} lr {:.5f}\".format(step, loss.item(), lr)))\n") in out, out
    assert convert_text(out)[0] == out
    # nothing after the print that may change the optimizer: the print is deferred as it was
    plain = convert_text(SCHEDULED.replace("    sched.step()\n", ""))[0]
    assert "lambda step=step, loss=loss, opt=opt: print(" in plain, plain
    # a name bound by the call itself, a module or a builtin is no object of the step's
    own = SCHEDULED.replace('opt.param_groups[0]["lr"]', "[g['lr'] for g in opt.param_groups][0] + math.pi")
    own = "import math\n" + own
    kept = convert_text(own)[0]
    assert "param_groups=opt.param_groups: print(" in kept and "pi=" not in kept, kept


@pytest.mark.xla
def test_the_deferred_print_shows_the_originals_learning_rates_on_xla(tmp_path):
    """Run: the same four lines as the original's on the CPU (the whole
    closure printed rates 0.05, 0.025... one step early)."""
    from test_runnable_ports import OBSERVER

    (tmp_path / "orig.py").write_text(SCHEDULED.replace(".cuda()", ""))
    (tmp_path / "conv.py").write_text(convert_text(SCHEDULED)[0])
    original = subprocess.run([sys.executable, "orig.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    converted = subprocess.run([sys.executable, "conv.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(OBSERVER)})
    assert converted.returncode == 0, converted.stderr[-2000:]
    assert original.stdout.splitlines()[3].endswith("lr 0.01250"), original.stdout
    assert converted.stdout.splitlines() == original.stdout.splitlines(), (original.stdout, converted.stdout)
