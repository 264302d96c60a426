"""Which method calls only store what they compute in their object
(codemods/analysis/store_methods.py): a meter's `update` handed a tensor
after the step joins the step's graph before the barrier
(analysis.step_tail).  fixtures/meters_after_step is the golden case
(pytorch/examples' imagenet and SupContrast's AverageMeter); here what keeps
a call after the barrier, a meter imported from a module of the project, and
the XLA run."""

import pytest

from test_runnable_ports import needs_xla
from test_step_calls import one_execution_a_step, original_output, printed_numbers
from test_step_tail import converted

METER = (
    "class AverageMeter(object):\n"
    "    def __init__(self):\n"
    "        self.sum, self.count, self.avg = 0, 0, 0\n\n"
    "    def update(self, val, n=1):\n"
    "        self.val = val\n"
    "        self.sum += val * n\n"
    "        self.count += n\n"
    "        self.avg = self.sum / self.count\n"
)
LOOP = (
    "import torch\n\n{meter}\n"
    "def train(model, opt, loader, log):\n"
    "    losses = AverageMeter()\n"
    "    top1 = AverageMeter()\n"
    "    for x, y in loader:\n"
    "        out = model(x.cuda())\n"
    "        loss = torch.nn.functional.cross_entropy(out, y)\n"
    "        opt.zero_grad()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "        losses.update(loss.item(), x.size(0))\n"
    "{between}"
    "        top1.update(out.argmax(1).eq(y).float().mean(), x.size(0))\n"
    "        print(losses.avg, top1.avg)\n"
)
JOINED = ("        opt.step()\n        top1.update(out.argmax(1).eq(y).float().mean(), x.size(0))\n"
          "        torch_xla.sync()\n")


def loop(meter: str = METER, between: str = "") -> str:
    return LOOP.format(meter=meter, between=between)


def test_a_meters_update_of_a_tensor_joins_the_steps_graph():
    code = converted(loop())
    assert JOINED in code and code.index("losses.update(") > code.index("torch_xla.sync()"), code
    # a plain line between that reaches no object
    assert JOINED in converted(loop(between="        n = len(y)\n"))
    # meters made on one line
    paired = loop().replace("    losses = AverageMeter()\n    top1 = AverageMeter()\n",
                            "    losses, top1 = AverageMeter(), AverageMeter()\n")
    assert JOINED in converted(paired)


def test_what_keeps_the_update_after_the_barrier():
    stops = {
        "a base class": METER.replace("(object)", "(Base)"),
        "a class decorator": "@register\n" + METER,
        "an attribute hook": METER + "\n    def __setattr__(self, k, v):\n        object.__setattr__(self, k, v)\n",
        "a property setter": METER + "\n    @val.setter\n    def val(self, v):\n        print(v)\n",
        "a print": METER.replace("        self.val = val\n", "        print(val)\n"),
        "a host read": METER.replace("        self.val = val\n", "        self.val = val.item()\n"),
        "a list it keeps": METER.replace("        self.val = val\n", "        self.history.append(val)\n"),
        "a branch": METER.replace("        self.val = val\n", "        if n:\n            self.val = val\n"),
        "another method": METER.replace("        self.val = val\n", "        self.reset()\n"),
        "changes what it is handed": METER.replace("        self.val = val\n", "        self.val = val.mul_(n)\n"),
    }
    for why, meter in stops.items():
        code = converted(loop(meter))
        assert code.index("top1.update(") > code.index("torch_xla.sync()"), (why, code)
    lines = {
        "names the meter": "        progress.display(top1)\n",
        "calls a function that may see it": "        show()\n",
        "rebinds what it is handed": "        y = y.cpu()\n",
        "changes what it is handed": "        out.mul_(2)\n",
    }
    for why, between in lines.items():
        code = converted(loop(between=between))
        assert code.index("top1.update(") > code.index("torch_xla.sync()"), (why, code)
    # a meter bound to another class too, or handed in: what its method does is not known
    twice = loop().replace("    top1 = AverageMeter()\n", "    top1 = AverageMeter()\n    if log:\n        top1 = Other()\n")
    unpacked = loop().replace("    top1 = AverageMeter()\n", "    top1, other = meters()\n")
    handed = loop().replace("    top1 = AverageMeter()\n", "").replace("loader, log)", "loader, log, top1)")
    # a number that is no tensor's (a time) is host work: it keeps its place
    timed = loop().replace("top1.update(out.argmax(1).eq(y).float().mean(), x.size(0))",
                           "top1.update(out.argmax(1).eq(y).float().mean(), time.time())")
    for src in (twice, unpacked, handed, timed):
        code = converted(src)
        assert code.index("top1.update(") > code.index("torch_xla.sync()"), code


def test_a_meter_imported_from_a_module_of_the_project_is_read_there(tmp_path):
    """SupContrast: `from util import AverageMeter`."""
    from xlaport.engine import Settings, transform

    (tmp_path / "util.py").write_text(METER)
    src = "from util import AverageMeter\n" + loop(meter="")
    (tmp_path / "main.py").write_text(src)
    code = transform(src.encode(), Settings(), filename=str(tmp_path / "main.py")).code.decode()
    assert JOINED in code, code
    (tmp_path / "util.py").write_text(METER.replace("        self.val = val\n", "        print(val)\n"))
    code = transform(src.encode(), Settings(), filename=str(tmp_path / "main.py")).code.decode()
    assert code.index("top1.update(") > code.index("torch_xla.sync()"), code


@pytest.mark.xla
@needs_xla
def test_the_meters_sums_join_the_step_with_the_originals_numbers(tmp_path):
    """fixtures/meters_after_step on XLA at 3 and 6 batches: compiles flat,
    one execution a step (with the meter's sums after the barrier: five
    compiles and three executions a step), and every progress line the
    original prints on the CPU."""
    out6 = one_execution_a_step("meters_after_step", tmp_path)
    original = original_output("meters_after_step", "--steps", "6")
    assert len(out6.splitlines()) == 6 and printed_numbers(out6) == pytest.approx(printed_numbers(original), rel=1e-4,
                                                                                  abs=1e-4)
