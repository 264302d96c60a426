"""Where a tensor lives (codemods/analysis/placement.py): arithmetic with
numbers and torch functions keep the placement of the tensor they compute
from, so a schedule table made from a device tensor is a device table, and a
host tensor's read costs XLA nothing."""

import libcst as cst
import pytest

from codemods.analysis.placement import DEVICE, HOST, placement
from codemods.syntax.tree import TreeCache
from xlaport.engine import Settings, transform


def placed(source: str, name: str):
    """The placement of the last read of ``name`` in ``source``."""
    tree = TreeCache(cst.parse_module(source))
    reads = [n for n in tree.nodes((cst.Name,)) if n.value == name]
    return placement(tree, reads[-1])


@pytest.mark.parametrize("made, expected", [
    ("betas = torch.linspace(1e-4, 0.02, 10).cuda()\nalphas = 1.0 - betas\n", DEVICE),
    ("betas = torch.linspace(1e-4, 0.02, 10).cuda()\nalphas = torch.cumprod(1.0 - betas, dim=0)\n", DEVICE),
    ("nt = torch.randn((4,)).cuda()\nalphas = torch.sigmoid(-nt)\n", DEVICE),
    ("alphas = torch.randn(1) * 5\n", HOST),  # (pytorch/examples' regression: b_target)
    ("betas = torch.linspace(1e-4, 0.02, 10)\nalphas = torch.cumprod(betas, dim=0)\n", HOST),
    # a device tensor beside a host one, or beside a name it cannot tell: it cannot say
    ("a = torch.zeros(3).cuda()\nb = torch.zeros(3)\nalphas = a - b\n", None),
    ("a = torch.zeros(3).cuda()\nalphas = a * scale\n", None),
    ("alphas = torch.load(path)\n", None),
])
def test_arithmetic_and_torch_functions_keep_their_tensors_placement(made, expected):
    assert placed("import torch\n\n" + made + "print(alphas)\n", "alphas") == expected


def test_a_walk_over_zip_of_a_device_tensor_is_reported_where_it_runs_every_step():
    """minRF's ``RF.forward``: ``t = torch.sigmoid(nt)`` on the device, walked
    with ``zip(t, tlist)`` into a list the caller reads: reported (XLA407) in
    the method the step loop calls."""
    src = ("import torch\n\n\nclass RF:\n    def __init__(self, model):\n        self.model = model\n\n"
           "    def forward(self, x):\n        nt = torch.randn((x.size(0),)).to(x.device)\n"
           "        t = torch.sigmoid(nt)\n        loss = ((self.model(x) - x) ** 2).mean(dim=1)\n"
           "        tlist = loss.detach().cpu().tolist()\n        return loss.mean(), [(tv, tl) for tv, tl in zip(t, tlist)]\n\n\n"
           "model = torch.nn.Linear(4, 4).cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nrf = RF(model)\n"
           "for x in loader:\n    loss, seen = rf.forward(x.cuda())\n    loss.backward()\n    opt.step()\n")
    found = {(f.code, f.line): f.message for f in transform(src.encode(), Settings()).findings}
    assert "comprehension over device tensor `t`" in found[("XLA407", 13)]
    assert "in `forward()`, called from the loop at line 19" in found[("XLA407", 13)]


def test_a_host_tensors_read_is_no_host_read():
    """pytorch/examples' regression: ``b_target = torch.randn(1) * 5`` lives
    on the host, and ``b_target.item()`` in the step's helper copies nothing."""
    src = ("import torch\n\nW = torch.randn(3, 1) * 5\nb = torch.randn(1) * 5\n\n\n"
           "def f(x):\n    return x.mm(W) + b.item()\n\n\nmodel = torch.nn.Linear(3, 1).cuda()\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(10):\n"
           "    x = torch.randn(4, 3)\n    y = f(x).cuda()\n    loss = (model(x.cuda()) - y).pow(2).mean()\n"
           "    loss.backward()\n    opt.step()\n")
    assert ("XLA401", 8) not in [(f.code, f.line) for f in transform(src.encode(), Settings()).findings]


@pytest.mark.parametrize("before, reported", [
    ("        xm.mark_step()\n", False),  # the barrier ran the step: the read copies a computed value
    ("        torch_xla.sync()\n", False),
    ("        torch_xla.sync()\n        print('step')\n", True),  # a statement between: judged as before
    ("", True),
])
def test_a_read_right_after_a_barrier_in_a_guarded_block_is_no_host_read(before, reported):
    src = ("import torch\nimport torch_xla\nimport torch_xla.core.xla_model as xm\n\n"
           "model = torch.nn.Linear(3, 1).to(torch_xla.device())\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "for i, x in enumerate(batches):\n    loss = model(x.to(torch_xla.device())).sum()\n    loss.backward()\n"
           "    opt.step()\n    if i % 10 == 0:\n" + before + "        losses.append(loss.item())\n")
    line = src.count("\n")
    found = [(f.code, f.line) for f in transform(src.encode(), Settings()).findings]
    assert (("XLA401", line) in found) == reported, found


def test_a_read_right_after_a_barrier_on_every_pass_is_reported():
    """The host waits for every step there (XLA418's deferred reads)."""
    src = ("import torch\nimport torch_xla\n\nmodel = torch.nn.Linear(3, 1).to(torch_xla.device())\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in batches:\n"
           "    loss = model(x.to(torch_xla.device())).sum()\n    loss.backward()\n    opt.step()\n"
           "    torch_xla.sync()\n    losses.append(loss.item())\n")
    assert ("XLA401", 11) in [(f.code, f.line) for f in transform(src.encode(), Settings()).findings]
