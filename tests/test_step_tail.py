"""What follows a step's barrier and joins the step's graph
(codemods/analysis/step_tail.py): lines that only compute tensors, and the
tensor a host read computes, move before the barrier -- only where what they
skip over neither binds what they use, nor uses or binds what they bind, nor
may change a tensor they use.  fixtures/metric_after_step,
fixtures/loader_reads and fixtures/eval_reads are its golden cases; here
the edges, and the conversions run on XLA's CPU backend."""


import pytest

from xlaport.engine import Settings, transform

from test_runnable_ports import FIXTURES, needs_xla
from test_step_calls import at_two_lengths, original_output

STEP = (
    "import torch\n\n"
    "def train(model, opt, loader, device, log):\n"
    "    correct = 0\n"
    "    for x, y in loader:\n"
    "        x, y = x.to(device), y.to(device)\n"
    "        out = model(x)\n"
    "        loss = torch.nn.functional.cross_entropy(out, y)\n"
    "        opt.zero_grad()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "        log.append(loss.item())\n"
    "        _, predicted = out.max(1)\n"
    "        correct += predicted.eq(y).sum().item()\n"
    "        log.append(correct)\n"  # (read every step: not summed on the device, XLA412)
    "    return correct\n"
)


def converted(src: str) -> str:
    code = transform(src.encode(), Settings()).code.decode()
    assert transform(code.encode(), Settings()).code.decode() == code  # idempotent
    compile(code, "<converted>", "exec")
    return code


def test_the_accuracy_after_the_reads_joins_the_steps_graph():
    code = converted(STEP)
    assert ("        opt.step()\n        _, predicted = out.max(1)\n        correct_step = predicted.eq(y).sum()\n"
            "        torch_xla.sync()\n        log.append(loss.item())\n        correct += correct_step.item()\n") in code, code


def test_a_line_skipped_over_that_binds_uses_or_may_change_what_moves_keeps_it_after_the_barrier():
    cases = {
        # the skipped line binds a name the moved line uses (a line that only computes tensors moves with it:
        # `out = out * 2` would go first, in its order)
        "rebinds": STEP.replace("        log.append(loss.item())\n", "        log.append(loss.item())\n"
                                "        out = out.cpu()\n"),
        # it changes the tensor in place
        "in place": STEP.replace("        log.append(loss.item())\n",
                                 "        log.append(loss.item())\n        out.clamp_(0)\n"),
        # a function of the program is handed the tensor
        "handed": STEP.replace("        log.append(loss.item())\n", "        log.append(loss.item())\n        show(out)\n"),
        # it reads the old value of the name the moved line binds
        "reads the old": STEP.replace("        log.append(loss.item())\n",
                                      "        log.append(loss.item())\n        seen = predicted.cpu()\n"),
    }
    for why, src in cases.items():
        code = converted(src)
        assert "        opt.step()\n        torch_xla.sync()\n" in code, (why, code)
        assert "        correct += predicted.eq(y).sum().item()\n" in code, (why, code)


def test_a_call_whose_read_computes_its_tensor_is_split_too():
    """`top1.update((out.argmax(1) == y).float().mean().item(), n)`: the
    tensor is computed into a name after the object (`top1_step`) before the
    barrier, the call reads that name after it."""
    src = STEP.replace("        correct += predicted.eq(y).sum().item()\n",
                       "        top1.update(predicted.eq(y).float().mean().item(), x.size(0))\n").replace(
        "log):", "log, top1):")
    code = converted(src)
    assert ("        _, predicted = out.max(1)\n        top1_step = predicted.eq(y).float().mean()\n"
            "        torch_xla.sync()\n        log.append(loss.item())\n"
            "        top1.update(top1_step.item(), x.size(0))\n") in code, code


def test_the_split_name_is_new_to_the_function():
    src = STEP.replace("    correct = 0\n", "    correct = 0\n    correct_step = 1\n")
    code = converted(src)
    assert "        correct_step2 = predicted.eq(y).sum()\n" in code and "correct += correct_step2.item()" in code, code


def test_a_read_of_what_a_call_of_the_program_gives_or_after_one_handed_its_tensor_stays_whole():
    for old, new in (("predicted.eq(y).sum().item()", "metric(predicted, y).item()"),
                     ("predicted.eq(y).sum().item()", "f(predicted) + predicted.eq(y).sum().item()")):
        code = converted(STEP.replace(old, new))
        assert f"        correct += {new}\n" in code, code


def test_an_evaluation_loop_that_reads_every_batch_gets_the_barrier_before_its_first_read():
    """kuangliu/pytorch-cifar's `test` (fixtures/eval_reads): over a device
    loader, or over a progress bar kept (a plain DataLoader loop)."""
    src = (FIXTURES / "eval_reads" / "input.py").read_text()
    joined = ("            loss = criterion(outputs, targets)\n            _, predicted = outputs.max(1)\n"
              "            correct_step = predicted.eq(targets).sum()\n            torch_xla.sync()\n\n"
              "            test_loss += loss.item()\n            total += targets.size(0)\n"
              "            correct += correct_step.item()\n")
    out = transform(src.encode(), Settings())
    assert joined in out.code.decode(), out.code.decode()
    assert [f.message for f in out.findings if f.code == "XLA302"] == [
        "loop over a device loader that reads the host every batch (an evaluation pass): `torch_xla.sync()` added "
        "right before its first read, the tensors its reads need computed first (the loader syncs at the next "
        "batch only: each read would run the forward again)"]
    bar = src.replace("        for batch_idx, (inputs, targets) in enumerate(loader):\n",
                      "        pbar = tqdm(loader)\n        for batch_idx, (inputs, targets) in enumerate(pbar):\n"
                      ).replace('            print(f"', '            pbar.set_description(f"')
    assert joined in converted("from tqdm import tqdm\n" + bar)
    # nothing read: the loader's own sync, no barrier
    quiet = src.replace("loss.item()", "float(len(targets))").replace(".sum().item()", ".sum()")
    assert "sync()" not in converted(quiet)


@pytest.mark.xla
@needs_xla
def test_the_evaluation_loop_runs_once_a_batch_with_the_originals_numbers(tmp_path):
    """fixtures/eval_reads on XLA at 3 and 6 batches: one execution a batch
    (without the barrier: 3 -- each read ran the forward pass, and the
    loader's sync it again) and the numbers the original prints on the CPU."""
    a, _, b, out6 = at_two_lengths("eval_reads", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 3, (a, b)
    original = original_output("eval_reads", "--steps", "6")

    def numbers(text):
        return [float(w.rstrip("%")) for line in text.splitlines() for w in line.split()[::2]]

    assert len(out6.splitlines()) == 6 and numbers(out6) == pytest.approx(numbers(original), rel=1e-4, abs=1e-3)


def test_a_function_of_the_program_that_reads_the_host_is_a_read_for_the_barrier():
    """`record(step, loss, out)` whose body reads `loss.item()`: the barrier
    goes before the call, right after the step (at the end of the body, the
    read ran the forward pass as a graph of its own, and the barrier the
    step again: 3 executions a step on XLA's CPU backend, 2 with it here).
    Two calls down too; a function that reads nothing is no read."""
    src = ("import torch\n\n"
           "def record(step, loss, out):\n    history.append((step, loss.item()))\n\n"
           "def train(model, opt, x, y):\n    for step in range(8):\n        out = model(x.cuda())\n"
           "        loss = torch.nn.functional.cross_entropy(out, y)\n        opt.zero_grad()\n"
           "        loss.backward()\n        opt.step()\n        record(step, loss, out)\n")
    code = converted(src)
    assert "        opt.step()\n        torch_xla.sync()\n        record(step, loss, out)\n" in code, code
    deeper = src.replace("def record(step, loss, out):\n", "def record(step, loss, out):\n    keep(loss)\n\n"
                         "def keep(loss):\n").replace("    history.append((step, loss.item()))\n",
                                                      "    history.append(loss.item())\n", 1)
    assert "        opt.step()\n        torch_xla.sync()\n        record(step, loss, out)\n" in converted(deeper)
    quiet = src.replace("loss.item()", "loss.detach()")
    assert converted(quiet).endswith("        record(step, loss, out)\n        torch_xla.sync()\n")


def test_an_evaluation_loop_that_keeps_its_metrics_in_objects_gets_the_barrier_too():
    """akamaster/pytorch_resnet_cifar10's `validate`: `losses.update(loss.item())`
    carries nothing by name and takes no step -- no step loop -- but over a
    device loader each read still ran the forward pass again; the barrier
    goes before the first read, the accuracy computed before it; in a module
    of evaluation passes alone (an `evaluate.py`) too."""
    src = ("import torch\n\ndef train(model, opt, loader):\n    for x, y in loader:\n"
           "        torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()\n        opt.step()\n\n"
           "def validate(model, loader, losses, top1, accuracy):\n    with torch.no_grad():\n"
           "        for i, (x, y) in enumerate(loader):\n            out = model(x.cuda())\n"
           "            loss = torch.nn.functional.cross_entropy(out, y.cuda())\n"
           "            prec1 = accuracy(out, y)[0]\n            losses.update(loss.item(), x.size(0))\n"
           "            top1.update(prec1.item(), x.size(0))\n")
    code = converted(src)
    assert "pl.MpDeviceLoader(loader, torch_xla.device())" in code, code
    assert ("            prec1 = accuracy(out, y)[0]\n            torch_xla.sync()\n"
            "            losses.update(loss.item(), x.size(0))\n") in code, code
    alone = src[:src.index("def train")] + src[src.index("def validate"):]
    assert ("            prec1 = accuracy(out, y)[0]\n            torch_xla.sync()\n"
            "            losses.update(loss.item(), x.size(0))\n") in converted(alone)
    # over a plain loader it is no device loader's loop: left as it was (a list of batches, say)
    plain = converted(src.replace("enumerate(loader)", "enumerate(batches)").replace(", loader,", ", batches,"))
    assert "sync()" not in plain[plain.index("def validate"):], plain
