"""XLA417 (codemods/step_reads.py, analysis/step_head.py): the host reads
between a step's forward and its backward follow its optimizer step.
fixtures/reads_before_step is the golden case (pytorch/examples' imagenet
shape); here what the step may move over and what stops it, the line a
finding on a moved read names, and the XLA run."""

import pytest

from xlaport.engine import Settings, transform

from test_runnable_ports import needs_xla
from test_step_calls import at_two_lengths, original_output
from test_step_tail import converted

STEP = (
    "import torch\n\n"
    "def train(model, criterion, opt, loader, losses):\n"
    "    for i, (x, y) in enumerate(loader):\n"
    "        x, y = x.cuda(), y.cuda()\n"
    "        out = model(x)\n"
    "        loss = criterion(out, y)\n"
    "        losses.update(loss.item(), x.size(0))\n"
    "        opt.zero_grad()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
)
MOVED = ("        opt.zero_grad()\n        loss.backward()\n        opt.step()\n        torch_xla.sync()\n"
         "        losses.update(loss.item(), x.size(0))\n")


def with_line(line: str) -> str:
    return STEP.replace("        opt.zero_grad()\n", line + "        opt.zero_grad()\n")


def test_the_reads_follow_the_step_and_what_only_computes_stays_before_it():
    assert MOVED in converted(STEP)
    # names of the step's objects as attributes or keywords of something else are no use of them
    named = with_line("        log.append(dict(opt=args.step, loss=loss.item()))\n").replace("losses):", "losses, log, args):")
    assert "        opt.step()\n        torch_xla.sync()\n        losses.update(" in converted(named)
    # pytorch/examples' imagenet: an accuracy of the module's own, then meters; the accuracy stays before the step
    src = ("def accuracy(output, target, topk=(1,)):\n    with torch.no_grad():\n"
           "        pred = output.topk(max(topk), 1)[1].t()\n"
           "        return [pred[:k].eq(target.view(1, -1)).float().sum() for k in topk]\n\n")
    imagenet = STEP.replace("def train", src + "def train").replace(
        "        losses.update(", "        acc1, acc5 = accuracy(out, y, topk=(1, 5))\n        losses.update(").replace(
        "        opt.zero_grad()\n", "        top1.update(acc1, x.size(0))\n        opt.zero_grad()\n").replace(
        "losses):", "losses, top1):")
    code = converted(imagenet)
    assert ("        acc1, acc5 = accuracy(out, y, topk=(1, 5))\n        opt.zero_grad()\n        loss.backward()\n"
            "        opt.step()\n        torch_xla.sync()\n        losses.update(loss.item(), x.size(0))\n"
            "        top1.update(acc1, x.size(0))\n") in code, code
    # a print every N steps, an imported logger, a scaler's step and a clip
    logged = with_line("        if i % 10 == 0:\n            print(i, loss.item())\n"
                       "        wandb.log({'loss': loss.item()})\n")
    code = converted("import wandb\n" + logged)  # (the print and the log then go to step closures: XLA210)
    # the barrier follows the step; the closures handed over after it run at the loader's sync
    assert "        opt.step()\n        torch_xla.sync()\n        losses.update(" in code, code
    assert code.index("torch_xla.sync()") < code.index("wandb.log") and code.count("torch_xla.sync()") == 1, code
    # over no device loader, a second barrier at the end of the body runs them in their own pass
    ranged = logged.replace("    for i, (x, y) in enumerate(loader):\n", "    for i in range(9):\n        x, y = next(loader)\n")
    code = converted("import wandb\n" + ranged)
    assert "        opt.step()\n        torch_xla.sync()\n        losses.update(" in code, code
    assert code.endswith("        xm.add_step_closure(lambda loss=loss: wandb.log({'loss': loss.item()}))\n"
                         "        torch_xla.sync()\n") and code.count("torch_xla.sync()") == 2, code
    amp = STEP.replace("        loss.backward()\n        opt.step()\n",
                       "        scaler.scale(loss).backward()\n        scaler.unscale_(opt)\n"
                       "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        scaler.step(opt)\n"
                       ).replace("losses):", "losses, scaler):")
    code = converted(amp)
    # (XLA's port drops the scaler, XLA131; the clip moves with the step)
    assert ("clip_grad_norm_(model.parameters(), 1.0)\n        opt.step()\n        torch_xla.sync()\n"
            "        losses.update(loss.item(), x.size(0))\n") in code, code


def test_a_break_after_the_moved_step_gets_its_barrier_once():
    """pytorch/examples' dry runs: `if args.dry_run: break` after the step, in a loop that defers its
    prints. The barrier follows the step, another goes before the break; a second run adds nothing and
    says nothing (verify re-reads the conversion for a step loop without its barrier)."""
    src = with_line("        print(i, loss.item())\n").replace(
        "        opt.step()\n", "        opt.step()\n        if args.dry_run:\n            break\n").replace(
        "losses):", "losses, args):")
    code = converted(src)
    assert "        opt.step()\n        torch_xla.sync()\n" in code and \
        "        if args.dry_run:\n            torch_xla.sync()\n            break\n" in code, code
    assert not [f for f in transform(code.encode(), Settings()).findings if f.code == "XLA302"]


def test_a_line_that_may_see_the_step_keeps_the_reads_where_they_are():
    stops = {
        "calls the model": with_line("        seen = model(x).sum().item()\n"),
        "calls what computed the loss": with_line("        again = criterion(out, y).item()\n"),
        "runs the model by a method": with_line("        again = model.forward(x).sum().item()\n"),
        "reads the optimizer": with_line("        print(opt.param_groups[0]['lr'], loss.item())\n"),
        "reads a gradient": with_line("        g = out.grad\n"),
        "reads the parameters": with_line("        n = sum(p.numel() for p in x.parameters())\n"),
        "rebinds the loss": with_line("        loss = loss / 2\n"),
        "can leave the body": with_line("        if loss.item() > 10:\n            break\n"),
        "decides by a tensor": with_line("        if loss > 10:\n            print('high')\n"),
        "a function of the module": "def log(v):\n    print(v)\n\n" + with_line("        log(loss)\n"),
        "a method of self": with_line("        self.log(loss)\n"),
    }
    for why, src in stops.items():
        code = converted(src)
        assert code.index("losses.update(") < code.index("opt.zero_grad()"), (why, code)
    # a read left before the moved lines: two graphs a step whatever moves, so nothing does (a print
    # there would go to a step closure, XLA210: no read then)
    early = STEP.replace("        out = model(x)\n", "        out = model(x)\n        sums.append(out.sum().item())\n")
    code = converted(early)
    assert code.index("losses.update(") < code.index("opt.zero_grad()"), code


def test_a_function_imported_from_the_project_is_read_where_it_is_defined(tmp_path):
    """`from util import f`: a logging helper may follow the step; one that
    takes a step or calls a model's method (through what it is handed or a
    global of its module) keeps the reads where they are."""
    src = "from util import record\n" + with_line("        record(i, loss.item())\n")
    (tmp_path / "main.py").write_text(src)
    helpers = {
        "def record(i, v):\n    print(i, v)\n": True,
        "def record(i, v):\n    MODEL.eval()\n    print(i, v)\n": False,
        "def record(i, v):\n    OPT.step()\n": False,
        "def record(i, v):\n    global SEEN\n    SEEN = v\n": False,
    }
    for helper, moves in helpers.items():
        (tmp_path / "util.py").write_text(helper)
        code = transform(src.encode(), Settings(), filename=str(tmp_path / "main.py")).code.decode()
        assert (code.index("record(") > code.index("opt.step()")) is moves, (helper, code)


def test_the_finding_on_a_moved_read_names_its_line_in_the_users_file():
    out = transform(STEP.encode(), Settings())
    lines = {f.code: f.line for f in out.findings}
    assert lines["XLA417"] == 8 and lines["XLA401"] == 8, [(f.code, f.line) for f in out.findings]


@pytest.mark.xla
@needs_xla
def test_the_step_runs_once_with_the_originals_numbers(tmp_path):
    """fixtures/reads_before_step on XLA at 3 and 6 steps: compiles flat, one
    execution a step (with the read before the backward: two), and the
    numbers the original prints on the CPU."""
    a, _, b, out6 = at_two_lengths("reads_before_step", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 3, (a, b)
    original = original_output("reads_before_step", "--steps", "6")

    def numbers(text):
        return [float(line.split()[-1]) for line in text.splitlines()]

    assert len(numbers(out6)) == 6 and numbers(out6) == pytest.approx(numbers(original), rel=1e-4, abs=1e-5)


@pytest.mark.xla
@needs_xla
def test_prints_deferred_after_the_step_run_at_the_loaders_sync(tmp_path):
    """fixtures/prints_before_step on XLA at 3 and 6 batches: the print
    between the forward and the backward goes to a step closure after the
    moved step and its barrier; compiles flat, one execution a step (with no
    barrier after the step: two compiles and two executions a step), and
    every line the original prints on the CPU."""
    a, _, b, out6 = at_two_lengths("prints_before_step", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] == 1 and b["executions"] - a["executions"] == 3, (a, b)
    original = original_output("prints_before_step", "--steps", "6")

    def numbers(text):
        return [float(line.split()[-1]) for line in text.splitlines()]

    assert len(numbers(out6)) == 4 and numbers(out6) == pytest.approx(numbers(original), rel=1e-4, abs=1e-5)


# -- a step taken by a scaler object (timm's `NativeScaler`: DeiT, MAE, ConvNeXt) ---------------------------

SCALER_STEP = (
    "import math\nimport sys\n\nimport torch\n\n"
    "def train(model, criterion, optimizer, batches, loss_scaler, log):\n"
    "    for x, y in log.log_every(batches, 10):\n"
    "        loss = criterion(model(x.cuda()), y.cuda())\n"
    "        loss_value = loss.item()\n"
    "        if not math.isfinite(loss_value):\n"
    "            sys.exit(1)\n"
    "        optimizer.zero_grad()\n"
    "        is_second_order = hasattr(optimizer, 'is_second_order') and optimizer.is_second_order\n"
    "        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters(), create_graph=is_second_order)\n"
    "{sync}"
    "        log.update(loss=loss_value)\n"
)
SCALER_MOVED = (
    "        optimizer.zero_grad()\n"
    "        is_second_order = hasattr(optimizer, 'is_second_order') and optimizer.is_second_order\n"
    "        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters(), create_graph=is_second_order)\n"
    "        torch_xla.sync({wait})\n"
    "        loss_value = loss.item()\n"
)


def test_a_scaler_called_with_the_optimizer_takes_the_step_and_the_reads_follow_it():
    """Before: no step was read in such a loop; with no sync of its own it got
    no barrier (its graph grew every step), with DeiT's
    `torch.cuda.synchronize()` after the step the read ran the forward alone
    first: two executions a step."""
    plain = converted(SCALER_STEP.format(sync=""))
    assert SCALER_MOVED.format(wait="") in plain  # the barrier XLA302 puts after the step
    timed = converted(SCALER_STEP.format(sync="        torch.cuda.synchronize()\n"))
    assert SCALER_MOVED.format(wait="wait=True") in timed and timed.count("torch_xla.sync(") == 1
    codes = {f.code for f in transform(SCALER_STEP.format(sync="").encode(), Settings()).findings}
    assert {"XLA302", "XLA417"} <= codes


def test_a_scaler_called_without_the_optimizer_or_built_is_no_step():
    source = ("import torch\n\ndef run(model, xs, scaler):\n    for x in xs:\n        loss = model(x.cuda()).sum()\n"
              "        scaler(loss)\n        grad_scaler = torch.cuda.amp.GradScaler()\n")
    assert "torch_xla.sync()" not in converted(source)


@pytest.mark.xla
@needs_xla
def test_the_scaler_step_runs_once_with_the_originals_numbers(tmp_path):
    """fixtures/scaler_step on XLA at 3 and 6 steps: compiles flat, one
    execution a step, and the losses the original prints on the CPU."""
    a, _, b, out6 = at_two_lengths("scaler_step", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 3, (a, b)
    original = original_output("scaler_step", "--steps", "6")

    def numbers(text):
        return [float(line.split()[-1]) for line in text.splitlines()]

    assert len(numbers(out6)) == 7 and numbers(out6) == pytest.approx(numbers(original), rel=1e-4, abs=1e-5)
