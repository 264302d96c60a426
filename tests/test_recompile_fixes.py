"""Recompilation traps convert rewrites (issue 40): a device table indexed by
a step's Python int (XLA411, codemods/device_index.py), a per-step
`.item()` summed into a Python number (XLA412, codemods/accumulators.py); a
host coin choosing between two tensors (XLA409) is tested in
tests/test_recompiles.py.
Each rule's own examples run in tests/test_rules.py; fixtures/recompile_fixes
is the golden program, run here on XLA's CPU backend at two lengths against
the original on the CPU."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import convert_text
from xlaport.engine import Settings, transform

from test_runnable_ports import FIXTURES, needs_xla, run_on_xla

HEAD = "import torch\n\n"


def codes(findings, code):
    return [(f.line, f.fix) for f in findings if f.code == code]


# ------------------------------------------------------------------ XLA411
SAMPLER = HEAD + (
    "class S(torch.nn.Module):\n"
    "    def __init__(self, net, n):\n        super().__init__()\n        self.net = net\n"
    "        self.register_buffer('alphas', torch.linspace(0.9, 0.1, n + 1))\n\n"
    "    def sample(self, x, n):\n"
    "        for i in range(n):\n"
    "            x = self.net(x) * self.alphas[i] + self.alphas[n - i]\n"
    "        return x\n\n\nnet = S(torch.nn.Linear(4, 4), 4).cuda()\n"
)


def test_a_step_int_index_into_a_device_table_is_sent_to_the_device():
    out, findings = convert_text(SAMPLER)
    assert codes(findings, "XLA411") == [(11, True), (11, True)]
    assert "self.alphas[torch.tensor([i], device=self.alphas.device)][0]" in out
    assert "self.alphas[torch.tensor([n - i], device=self.alphas.device)][0]" in out
    assert "XLA407" not in [f.code for f in findings]  # what is fixed is not also reported


@pytest.mark.parametrize("change", [
    # a store into the table, a tuple index, an index that is itself a tensor or a call (a slice: test_step_slices.py)
    ("x = self.net(x) * self.alphas[i] + self.alphas[n - i]", "self.alphas[i] = self.net(x).sum()"),
    ("self.alphas[i] + self.alphas[n - i]", "self.alphas[i, None].sum()"),
    ("self.alphas[i] + self.alphas[n - i]", "self.alphas[int(i)] + self.alphas[len(x)]"),
    # a table on the host (a plain class: nothing puts it on the device), a table in a lambda
    ("class S(torch.nn.Module):", "class S:"),
    ("x = self.net(x) * self.alphas[i] + self.alphas[n - i]", "x = (lambda k: self.net(x) * self.alphas[k])(i)"),
])
def test_what_is_not_a_read_of_a_device_table_by_a_step_int_is_left(change):
    src = SAMPLER.replace(*change).replace("        super().__init__()\n", "" if change[1] == "class S:" else
                                           "        super().__init__()\n")
    assert change[1] in src
    out, findings = convert_text(src)
    assert "XLA411" not in [f.code for f in findings], out
    assert "torch.tensor([" not in out


def test_a_counter_of_a_loop_inside_the_step_is_one_graph_already():
    src = HEAD + ("w = torch.ones(5).cuda()\nfor x in loader:\n    loss = 0\n    for k in range(5):\n"
                  "        loss = loss + model(x).sum() * w[k]\n    loss.backward()\n    opt.step()\n"
                  "for epoch in range(3):\n    for x in loader:\n        loss = model(x).sum() * w[epoch]\n"
                  "        loss.backward()\n        opt.step()\n")
    out, findings = convert_text(src)
    # the inner loop's `k` is not rewritten; the epoch loop around the step loop changes every epoch: it is
    assert codes(findings, "XLA411") == [(12, True)], findings
    assert "w[k]" in out and "w[torch.tensor([epoch], device=w.device)][0]" in out


COMPUTED = HEAD + (
    "class S(torch.nn.Module):\n"
    "    def __init__(self, net, n):\n        super().__init__()\n        self.net = net\n"
    "        for k, v in {'alphas': torch.linspace(0.9, 0.1, n + 1)}.items():\n"
    "            self.register_buffer(k, v)\n\n"
    "    def sample(self, x, n):\n"
    "        for i in range(n):\n"
    "            x = self.net(x) * self.alphas[i]\n"
    "        return x\n\n\nnet = S(torch.nn.Linear(4, 4), 4).cuda()\n"
)


def test_a_buffer_registered_under_a_computed_name_is_a_device_table():
    """minDiffusion's DDPM registers its schedule with `self.register_buffer(k, v)`
    over a dict: `self.alphas` is nothing else the class could read."""
    out, findings = convert_text(COMPUTED)
    assert codes(findings, "XLA411") == [(12, True)], findings
    assert "self.alphas[torch.tensor([i], device=self.alphas.device)][0]" in out


def test_a_subclass_of_such_a_model_in_the_same_module_reads_its_buffers():
    """A DDIM sampler subclassing the DDPM that registers the schedule."""
    sub = COMPUTED.replace("    def sample(self, x, n):", "    def forward(self, x):\n        return x\n\n\n"
                           "class D(S):\n    def sample(self, x, n):").replace("net = S(", "net = D(")
    assert "class D(S):" in sub
    out, findings = convert_text(sub)
    assert codes(findings, "XLA411") == [(17, True)], findings
    assert "self.alphas[torch.tensor([i], device=self.alphas.device)][0]" in out
    stored = sub.replace("class D(S):\n", "class D(S):\n    alphas = [0.5] * 8\n\n")  # the subclass's own
    assert "XLA411" not in [f.code for f in convert_text(stored)[1]]


@pytest.mark.parametrize("change", [
    # the attribute is stored somewhere (here, in a tuple; elsewhere in the module), or set by setattr
    ("        self.net = net\n", "        self.net, self.alphas = net, [0.5] * 8\n"),
    ("net = S(", "S.x = 1\nnet = S("),
    ("        self.net = net\n", "        self.net = net\n        setattr(self, 'alphas', [0.5] * 8)\n"),
    # a base of the module's own could set it; the class answers unknown attributes itself
    ("class S(torch.nn.Module):", "class S(Base):"),
    ("    def sample(", "    def __getattr__(self, name):\n        return [0.5] * 8\n\n    def sample("),
])
def test_an_attribute_that_may_be_no_buffer_is_left(change):
    src = COMPUTED.replace(*change)
    assert src != COMPUTED
    if change[0] == "net = S(":
        src = src.replace("S.x = 1", "S.alphas = [0.5] * 8")
    out, findings = convert_text(src)
    assert "XLA411" not in [f.code for f in findings], out


# ------------------------------------------------------------------ XLA412
TRAIN = HEAD + (
    "def train(model, loader, opt):\n"
    "    total = 0.0\n"
    "    correct = 0\n"
    "    print('start', total)\n"
    "    for i, (x, y) in enumerate(loader):\n"
    "        out = model(x.cuda())\n"
    "        loss = torch.nn.functional.cross_entropy(out, y.cuda())\n"
    "        total += loss.item() * x.size(0)\n"
    "        correct += (out.argmax(1) == y.cuda()).sum().item()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "        if i % 10 == 9:\n"
    "            print(f'{total / (i + 1):.3f}')\n"
    "    return total / len(loader), correct\n"
)


def test_a_sum_of_item_reads_is_summed_on_the_device_and_read_back_after_the_loop():
    out, findings = convert_text(TRAIN)
    assert codes(findings, "XLA412") == [(10, True), (11, True)]
    assert "total += loss.detach() * x.size(0)\n" in out
    assert "correct += (out.argmax(1) == y.to(torch_xla.device())).sum().detach()\n" in out
    # read where the loop reads it (every 10 steps), and once right after the loop, in the order summed
    assert "torch.as_tensor(total).item() / (i + 1):.3f" in out
    assert ("    total = torch.as_tensor(total).item()\n    correct = torch.as_tensor(correct).item()\n"
            "    return total / len(loader), correct\n") in out
    # before the loop it is still the literal: left as it is
    assert "total = 0.0\n    correct = 0\n    print('start', total)\n" in out
    assert "XLA401" not in [f.code for f in findings]


def test_a_sum_scaled_after_its_loop_is_a_number_again_there():
    """pytorch/examples' mnist: `test_loss /= len(dataset)` after the loop."""
    src = TRAIN.replace("    return total / len(loader), correct\n",
                        "    total /= len(loader)\n    return total, correct\n")
    out, findings = convert_text(src)
    assert codes(findings, "XLA412") == [(10, True), (11, True)]
    assert "    correct = torch.as_tensor(correct).item()\n    total /= len(loader)\n" in out


@pytest.mark.parametrize("change", [
    # read on every step (a test is read every time), rebound to something else, scaled, used in a closure
    ("        if i % 10 == 9:\n            print", "        if total > 9:\n            print"),
    ("        if i % 10 == 9:\n            print", "        print(total)\n        if i % 10 == 9:\n            print"),
    ("    total = 0.0\n", "    total = start_value()\n"),
    ("        opt.step()\n", "        opt.step()\n        total *= 0.9\n"),
    ("    return total / len(loader), correct\n", "    return lambda: total\n"),
    # a sum that calls something on the host value
    ("total += loss.item() * x.size(0)", "total += math.log(loss.item())"),
])
def test_a_name_not_only_summed_and_read_now_and_then_is_left(change):
    src = TRAIN.replace(*change)
    assert change[1] in src
    out, findings = convert_text(src)
    assert 10 not in [line for line, _ in codes(findings, "XLA412")], out
    assert "total += loss.item()" in out or "math.log(loss.item())" in out


def test_a_sum_outside_any_step_loop_is_left():
    src = HEAD + "total = 0\nfor x in xs:\n    total += x.cuda().sum().item()\nprint(total)\n"
    out, findings = convert_text(src)
    assert "XLA412" not in [f.code for f in findings] and ".item()" in out


@pytest.mark.xla
@needs_xla
def test_the_sum_read_back_is_the_same_kind_of_number():
    """`torch.as_tensor(x).item()`: an int for a count, a float for a loss,
    and the literal itself when no step ran (run on the CPU: no XLA needed
    for the kinds)."""
    import torch

    assert type(torch.as_tensor(0).item()) is int and type(torch.as_tensor(0.0).item()) is float
    count = 0 + torch.tensor([True, False, True]).sum().detach()
    assert torch.as_tensor(count).item() == 2 and type(torch.as_tensor(count).item()) is int
    total = 0.0 + torch.tensor(1.5).detach()
    assert torch.as_tensor(total).item() == 1.5


# ------------------------------------------------------------------ the golden program
def test_a_decoder_unrolled_inside_the_training_step_gets_no_barrier_of_its_own():
    text = (FIXTURES / "recompile_fixes" / "expected.py").read_text()
    decoder = text[text.index("        for t in range(1, trg.shape[0]):"):text.index("        total += ")]
    assert "sync()" not in decoder
    assert text.count("torch_xla.sync()") == 2  # the training step, the sampling step


def _numbers(text: str):
    return [float(n) for n in re.findall(r"-?\d+\.\d+|\d+", text)]


def _original_and_two_lengths(name, tmp_path):
    """The fixture's original on the CPU at 8 steps, its conversion on XLA at
    4 and 8: (the original's run, the two results, the conversion's output at 8)."""
    original = subprocess.run([sys.executable, str(FIXTURES / name / "input.py"), "--steps", "8"],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert original.returncode == 0, original.stderr
    short, _, _, _ = run_on_xla(name, tmp_path / "a", "--steps", "4")
    long, out8, _, _ = run_on_xla(name, tmp_path / "b", "--steps", "8")
    return original, short, long, out8


@pytest.mark.xla
@needs_xla
def test_the_fixed_traps_compile_once_and_print_the_originals_numbers(tmp_path):
    original, short, long, out8 = _original_and_two_lengths("recompile_fixes", tmp_path)
    a, b = short["metrics"], long["metrics"]
    assert a["compiles"] == b["compiles"], (a, b)
    # four more steps of training and of sampling: eight more graph executions, and two for the prints
    assert b["executions"] - a["executions"] <= 10, (a, b)
    assert out8.splitlines()[:4] == original.stdout.splitlines()[:4]  # the losses to four decimals
    assert _numbers(out8) == pytest.approx(_numbers(original.stdout), rel=1e-3, abs=1e-4)


@pytest.mark.xla
@needs_xla
def test_the_same_program_with_the_traps_left_recompiles_every_step(tmp_path, monkeypatch):
    """What the rewrites are worth, and that the test above can fail: with
    XLA409/411/412 turned off the compiles grow with the steps (and XLA417:
    the step moved before its reads cuts one graph a step less)."""
    import test_runnable_ports

    kept = Settings(ignore=("XLA409", "XLA411", "XLA412", "XLA417"))
    monkeypatch.setattr(test_runnable_ports, "Settings", lambda: kept)
    assert "torch.where" not in transform((FIXTURES / "recompile_fixes" / "input.py").read_bytes(), kept).code.decode()
    short, _, _, _ = run_on_xla("recompile_fixes", tmp_path / "a", "--steps", "4")
    long, _, _, _ = run_on_xla("recompile_fixes", tmp_path / "b", "--steps", "8")
    assert long["metrics"]["compiles"] >= short["metrics"]["compiles"] + 8, (short, long)


# ------------------------------------------------------------------ XLA302 before the read
DECODE = HEAD + (
    "import sys\n\n\nclass Step(torch.nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n        self.cell = torch.nn.GRUCell(4, 8)\n"
    "        self.head = torch.nn.Linear(8, 4)\n\n"
    "    def forward(self, x, h):\n        h = self.cell(x, h)\n        return self.head(h), h\n\n\n"
    "torch.manual_seed(0)\nmodel = Step().cuda().eval()\nh = torch.zeros(1, 8).cuda()\nx = torch.ones(1, 4).cuda()\n"
    "out = []\nwith torch.no_grad():\n    for _ in range(int(sys.argv[1])):\n"
    "        x, h = model(x, h)\n        y = x.sum()\n        out.append(round(y.item(), 5))\n"
    "        x = torch.tanh(x)\nprint(out)\n"
)


def test_a_decoder_that_reads_its_output_every_pass_gets_its_barrier_before_the_read():
    out, findings = convert_text(DECODE)
    # (`x = torch.tanh(x)` only computes a tensor, from nothing the read binds: it joins the pass's graph,
    # analysis.step_tail -- every pass then runs the same graph, the first one too)
    assert "        x = torch.tanh(x)\n        torch_xla.sync()\n        out.append(round(y.item(), 5))\n" in out, out
    assert [f.message for f in findings if f.code == "XLA302"] == [
        "step loop: `torch_xla.sync()` added right before its first host read (it finds the pass computed: one "
        "graph execution per pass)"]


COMPUTED_READ = ("        y = x.sum()\n        out.append(round(y.item(), 5))\n",
                 "        y = (x.sum() * 2).cpu()\n        out.append(round(y.item(), 5))\n")


def test_an_assignment_whose_read_computes_the_value_computes_it_before_the_barrier():
    """``ims = torch.clamp(xt, -1, 1).detach().cpu()`` (explainingai's DDPM
    sampler, pytorch/examples' word_language_model): with the barrier at the
    end, the read runs the graph up to the value and the barrier the rest;
    computed into the target before the barrier, the barrier's one graph
    holds it and the read copies it."""
    placed(COMPUTED_READ, "        y = x.sum() * 2\n        torch_xla.sync()\n        y = y.cpu()\n"
                          "        out.append(round(y.item(), 5))\n        x = torch.tanh(x)\nprint(out)",
           "right before its first host read, the value it reads computed first")


def placed(change, text: str, where: str) -> None:
    """DECODE with ``change`` converts to hold ``text``, XLA302 saying the
    barrier went ``where``; the conversion converts to itself."""
    out, findings = convert_text(DECODE.replace(*change))
    assert text in out, out
    assert [f.message for f in findings if f.code == "XLA302"] == [
        f"step loop: `torch_xla.sync()` added {where} (it finds the pass computed: one graph execution per pass)"]
    assert convert_text(out)[0] == out


@pytest.mark.parametrize("change", [
    # the read computes what it reads, but not as an assignment, not first in its statement, or twice;
    ("        y = x.sum()\n        out.append(round(y.item(), 5))\n", "        out.append(round(x.sum().item(), 5))\n"),
    ("        y = x.sum()\n", "        y = torch.ones(1).sum() + x.sum().cpu()\n"),
    ("        y = x.sum()\n", "        y = x.sum().cpu() + x.mean().cpu()\n"),
    # a pass can end early; a step closure follows
    ("        x = torch.tanh(x)\n", "        x = torch.tanh(x)\n        if len(out) > 99:\n            break\n"),
])
def test_a_read_the_barrier_cannot_precede_leaves_it_at_the_end(change):
    out, _ = convert_text(DECODE.replace(*change))
    assert out.rstrip().endswith("        torch_xla.sync()\nprint(out)"), out


def test_a_read_of_a_value_the_pass_did_not_compute_is_passed_over():
    """diffusers' ernie_image reads its timestep (``t.item()``) in each
    branch before the model runs: nothing of the pass is pending there, and
    a barrier before it would only cut the pass elsewhere."""
    out, _ = convert_text(DECODE.replace("        y = x.sum()\n",
                                         "        scale = model.head.bias.sum().item()\n        y = x.sum()\n"))
    assert ("        scale = model.head.bias.sum().item()\n        y = x.sum()\n        x = torch.tanh(x)\n"
            "        torch_xla.sync()\n        out.append(round(y.item(), 5))\n") in out, out


BRANCHED = ("        x, h = model(x, h)\n        y = x.sum()\n        out.append(round(y.item(), 5))\n",
            "        if len(out) % 3:\n            x, h = model(x, h)\n            y = x.sum()\n"
            "            out.append(round(y.item(), 5))\n        else:\n            x, h = model(-x, h)\n"
            "            z = x.mean().cpu()\n            out.append(round(z.item(), 5))\n")


def test_a_read_in_each_branch_of_a_host_decision_gets_the_barrier_in_each_branch():
    """pytorch/examples' word_language_model/generate.py reads the model's
    output in each branch of ``if is_transformer_model: ... else: ...``."""
    out, findings = convert_text(DECODE.replace(*BRANCHED))
    assert ("            y = x.sum()\n            torch_xla.sync()\n            out.append(round(y.item(), 5))\n"
            "        else:\n            x, h = model(-x, h)\n            z = x.mean()\n            torch_xla.sync()\n"
            "            z = z.cpu()\n            out.append(round(z.item(), 5))\n        x = torch.tanh(x)\nprint(out)"
            ) in out, out
    assert [f.message for f in findings if f.code == "XLA302"] == [
        "step loop: `torch_xla.sync()` added right before its first host read, the value it reads computed first, in "
        "each branch (it finds the pass computed: one graph execution per pass)"]
    assert convert_text(out)[0] == out
    # one branch without a read: the barrier stays at the end
    one = DECODE.replace(*BRANCHED).replace("            out.append(round(z.item(), 5))\n", "")
    assert convert_text(one.replace("z = x.mean().cpu()", "z = x.mean()"))[0].rstrip().endswith(
        "        torch_xla.sync()\nprint(out)")


ONE_BRANCH = ("        y = x.sum()\n        out.append(round(y.item(), 5))\n",
              "        y = x.sum()\n        # kept now and then\n        if len(out) >= 0:\n"
              "            out.append(round(y.item(), 5))\n")


def test_a_read_in_one_branch_of_a_host_decision_gets_the_barrier_before_the_if():
    """``if i % 20 == 0: store.append(x.cpu())`` (a sampler keeping some of
    its steps): with the barrier at the end a pass that reads runs two graphs;
    before the ``if``, every pass runs one."""
    out, findings = convert_text(DECODE.replace(*ONE_BRANCH))
    assert ("        y = x.sum()\n        torch_xla.sync()\n        # kept now and then\n        if len(out) >= 0:\n"
            "            out.append(round(y.item(), 5))\n        x = torch.tanh(x)\nprint(out)") in out, out
    assert convert_text(out)[0] == out
    # an `elif` reading, an `else` without a read
    elif_ = DECODE.replace(*ONE_BRANCH).replace("            out.append(round(y.item(), 5))\n",
                                                "            pass\n        elif len(out) < 0:\n"
                                                "            out.append(round(y.item(), 5))\n        else:\n"
                                                "            out.append(0)\n")
    assert "        torch_xla.sync()\n        # kept now and then\n        if len(out) >= 0:\n" in convert_text(elif_)[0]


@pytest.mark.parametrize("change", [
    ("if len(out) >= 0:", "if y > 0:"),  # the test reads the device itself
    ("            out.append(round(y.item(), 5))\n", "            out.append(len(out))\n"),  # no read in the branch
    ("            out.append(round(y.item(), 5))\n", "            out.append(round(h.sum().item(), 5))\n"
                                                    "            h = h * 0\n"),  # not one value
])
def test_an_if_that_does_not_read_a_computed_value_on_the_host_leaves_the_barrier_at_the_end(change):
    source = DECODE.replace(*ONE_BRANCH).replace(*change)
    out, _ = convert_text(source)
    assert out.rstrip().endswith("        torch_xla.sync()\nprint(out)"), out


IN_A_BLOCK = ("        x, h = model(x, h)\n        y = x.sum()\n        out.append(round(y.item(), 5))\n"
              "        x = torch.tanh(x)\n",
              "        with torch.no_grad():\n            x, h = model(x, h)\n            y = x.sum()\n"
              "            out.append(round(y.item(), 5))\n            x = torch.tanh(x)\n")


def test_a_read_in_a_with_block_around_the_pass_gets_the_barrier_there():
    """``for ...: with torch.no_grad(): ...`` (a sampler that turns off
    gradients inside its loop): the barrier goes before the read in the block."""
    out, findings = convert_text(DECODE.replace(*IN_A_BLOCK))
    assert ("            y = x.sum()\n            torch_xla.sync()\n            out.append(round(y.item(), 5))\n"
            "            x = torch.tanh(x)\nprint(out)") in out, out
    assert convert_text(out)[0] == out
    # a read at the block's start, of the pass before: nothing computed yet
    first = DECODE.replace(*IN_A_BLOCK).replace("            out.append(round(y.item(), 5))\n", "").replace(
        "        with torch.no_grad():\n", "        with torch.no_grad():\n            out.append(round(x.sum().item(), 5))\n")
    assert convert_text(first)[0].rstrip().endswith("        torch_xla.sync()\nprint(out)")


IN_A_LOOP = ("        y = x.sum()\n        out.append(round(y.item(), 5))\n",
             "        y = x.sum()\n        for k in range(2):\n            if k == 1:\n"
             "                out.append(round(y.item(), 5))\n")


def test_a_read_in_a_loop_inside_the_pass_gets_the_barrier_before_that_loop():
    """``for k in range(n): log.append(loss.item())`` inside the pass: with
    the barrier at the end a pass runs two graphs (the read's, the
    barrier's); before the loop, one."""
    placed(IN_A_LOOP, "        y = x.sum()\n        torch_xla.sync()\n        for k in range(2):\n            if k == 1:\n"
                      "                out.append(round(y.item(), 5))\n        x = torch.tanh(x)\nprint(out)",
           "right before the loop that holds its first host read")


@pytest.mark.parametrize("change", [
    # the loop reads what it computes itself
    ("                out.append(round(y.item(), 5))\n",
     "                y = x.mean()\n                out.append(round(y.item(), 5))\n"),
    # ... or reads nothing the pass computed
    ("                out.append(round(y.item(), 5))\n", "                out.append(k)\n"),
    # the loop is the pass's first statement: what it reads is the pass before's
    ("        x, h = model(x, h)\n        y = x.sum()\n        for k in range(2):\n            if k == 1:\n"
     "                out.append(round(y.item(), 5))\n",
     "        for k in range(2):\n            if k == 1:\n                out.append(round(y.item(), 5))\n"
     "        x, h = model(x, h)\n        y = x.sum()\n"),
])
def test_a_loop_inside_the_pass_that_does_not_read_the_pass_leaves_the_barrier_at_the_end(change):
    source = DECODE.replace(*IN_A_LOOP)
    assert change[0] in source
    out, _ = convert_text(source.replace(*change))
    assert out.rstrip().endswith("        torch_xla.sync()\nprint(out)"), out


LOOP_TAIL = ("out = []\nwith torch.no_grad():\n    for _ in range(int(sys.argv[1])):\n        x, h = model(x, h)\n"
             "        y = x.sum()\n        out.append(round(y.item(), 5))\n        x = torch.tanh(x)\nprint(out)\n")
DEFERRED = (LOOP_TAIL, "out, kept = [], []\nwith torch.no_grad():\n    for _ in range(int(sys.argv[1])):\n"
            "        x, h = model(x, h)\n        y = x.sum()\n        kept.append(y.to('cpu'))\n        x = torch.tanh(x)\n"
            "        z = x.mean()\n        out.append(round(z.item(), 5))\nprint(out + [round(v.item(), 5) for v in kept])\n")


def test_a_host_copy_kept_in_a_list_moves_to_the_later_read():
    """ermongroup/ddim's samplers keep ``x0_t.to('cpu')`` in ``x0_preds``,
    then compute the next state and keep ``xt_next.to('cpu')``: two graphs a
    step.  The first copy moves to just after the barrier before the second
    (the same value: nothing between changes it or touches the list)."""
    out, findings = convert_text(DECODE.replace(*DEFERRED))
    assert ("        y = x.sum()\n        x = torch.tanh(x)\n        z = x.mean()\n        torch_xla.sync()\n"
            "        kept.append(y.to('cpu'))\n        out.append(round(z.item(), 5))\n") in out, out
    assert convert_text(out)[0] == out


@pytest.mark.parametrize("between", [
    "        kept.sort()\n",  # the list is touched
    "        y = y * 2\n",  # what was copied is assigned
    "        y.mul_(2)\n",  # ... or changed in place
    "        torch.clamp(x, 0, 1, out=y)\n",
])
def test_a_kept_copy_whose_value_may_change_before_the_later_read_stays(between):
    source = DECODE.replace(*DEFERRED).replace("        z = x.mean()\n", between + "        z = x.mean()\n")
    out, _ = convert_text(source)
    # (what only computes tensors from nothing the copy reads, `x = torch.tanh(x)`, joins the pass's graph first)
    assert "        torch_xla.sync()\n        kept.append(y.to('cpu'))\n" + between in out, out


@pytest.mark.xla
@needs_xla
@pytest.mark.parametrize("change", [("", ""), COMPUTED_READ, BRANCHED, DEFERRED, ONE_BRANCH, IN_A_BLOCK, IN_A_LOOP],
                         ids=["read-of-a-name", "read-computes-its-value", "a-read-in-each-branch", "kept-copy-moved",
                              "a-read-in-one-branch", "a-read-in-a-with-block", "a-read-in-a-loop"])
def test_the_barrier_before_the_read_compiles_once_and_runs_one_graph_per_pass(tmp_path, change):
    """Measured against the barrier at the end of the pass, the same values
    as the original on the CPU: at 4 and 8 passes, compiles flat and one
    graph execution per pass (at the end: two per pass, the read's and the
    barrier's)."""
    from test_runnable_ports import OBSERVER

    source = DECODE.replace(*change)
    original = subprocess.run([sys.executable, "-c", source.replace(".cuda()", ""), "8"], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert original.returncode == 0, original.stderr
    converted = transform(source.encode(), Settings()).code.decode()
    at_end = re.sub(r"(?m)^ +torch_xla\.sync\(\)\n", "", converted).replace("\nprint(out",
                                                                        "\n        torch_xla.sync()\nprint(out")
    seen = {}
    for name, text in (("before", converted), ("end", at_end)):
        (tmp_path / f"{name}.py").write_text(text)
        for n in (4, 8):
            metrics = tmp_path / f"{name}-{n}.json"
            done = subprocess.run([sys.executable, f"{name}.py", str(n)], cwd=tmp_path, capture_output=True, text=True,
                                  timeout=300, env={**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(OBSERVER),
                                                    "XLAPORT_TEST_METRICS": str(metrics)})
            assert done.returncode == 0, done.stderr[-2000:]
            m = json.loads(metrics.read_text())
            seen[name, n] = (m["compiles"], m["executions"], done.stdout)
    import ast

    for printed in (seen["before", 8][2], seen["end", 8][2]):  # (a graph cut elsewhere rounds elsewhere)
        assert ast.literal_eval(printed) == pytest.approx(ast.literal_eval(original.stdout), abs=2e-5), printed
    assert seen["before", 4][0] == seen["before", 8][0] <= seen["end", 8][0], seen
    assert seen["before", 8][1] - seen["before", 4][1] == 4 and seen["end", 8][1] - seen["end", 4][1] >= 8, seen


# -- XLA406: a number written through a mask of the tensor's own values ------------------------

TOPK = ("import sys\n\nimport torch\n\ntorch.manual_seed(0)\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "model = torch.nn.Linear(16, 16).to(device)\nx = torch.randn(2, 16).to(device)\ntotal = 0.0\n"
        "with torch.no_grad():\n    for _ in range(int(sys.argv[1])):\n        logits = model(x)\n"
        "        v, _ = torch.topk(logits, 4)\n        logits[logits < v[:, [-1]]] = -float('Inf')\n"
        "        x = torch.softmax(logits, dim=-1) @ model.weight\n        total += x.sum().item()\n"
        "print(f'{total:.5f}')\n")


def test_a_number_written_through_a_mask_of_the_tensor_is_filled_in_place():
    out, findings = convert_text(TOPK)
    assert "        logits.masked_fill_(logits < v[:, [-1]], -float('Inf'))\n" in out
    assert [(f.code, f.fix) for f in findings if f.code == "XLA406"] == [("XLA406", True)]
    assert convert_text(out)[0] == out


@pytest.mark.parametrize("change", [
    ("logits[logits < v[:, [-1]]] = -float('Inf')", "logits[logits < v[:, [-1]]] = v[:, :1]"),  # not a number
    ("logits[logits < v[:, [-1]]]", "logits[x < v[:, [-1]]]"),  # a mask of another tensor's values
    ("logits[logits < v[:, [-1]]] = -float('Inf')", "kept = logits[logits < v[:, [-1]]]"),  # a read
])
def test_other_mask_indexing_stays_reported(change):
    out, findings = convert_text(TOPK.replace(*change))
    assert "masked_fill_" not in out
    assert [(f.code, f.fix) for f in findings if f.code == "XLA406"] == [("XLA406", False)]


@pytest.mark.xla
@needs_xla
def test_the_filled_mask_runs_without_a_cpu_fallback_and_gives_the_same_numbers(tmp_path):
    """Measured on torch_xla 2.9: the indexed form runs `aten::nonzero` on
    the CPU at every step (8 at 8 steps); filled, none, 2 compiles at 4 and 8."""
    (tmp_path / "orig.py").write_text(TOPK)
    (tmp_path / "conv.py").write_bytes(transform(TOPK.encode(), Settings()).code)
    observe = os.path.join(os.path.dirname(__file__), "observe")
    ran = {}
    for name, steps in (("orig", "8"), ("conv", "4"), ("conv", "8")):
        metrics = tmp_path / f"{name}-{steps}.json"
        env = {**os.environ, "PJRT_DEVICE": "CPU", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": observe,
               "XLAPORT_TEST_METRICS": str(metrics)}
        done = subprocess.run([sys.executable, f"{name}.py", steps], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        ran[name, steps] = (done.stdout.strip(), json.loads(metrics.read_text()) if metrics.exists() else None)
    assert float(ran["conv", "8"][0]) == pytest.approx(float(ran["orig", "8"][0]), rel=1e-5)
    four, eight = ran["conv", "4"][1], ran["conv", "8"][1]
    assert four["compiles"] == eight["compiles"], (four, eight)
    assert not eight.get("fallbacks", {}).get("aten::nonzero"), eight


# ------------------------------------------------------------------ XLA411 through a helper
LM = HEAD + (
    "def get_batch(source, i, n=6):\n"
    "    seq_len = min(n, len(source) - 1 - i)\n"
    "    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)\n\n\n"
    "data = torch.arange(40).view(20, 2).cuda()\n"
    "for i in range(0, data.size(0) - 1, 6):\n"
    "    x, y = get_batch(data, i)\n    loss = model(x, y)\n    loss.backward()\n    opt.step()\n"
)


def test_a_step_int_handed_to_a_helper_slices_with_device_indices():
    out, findings = convert_text(LM)
    assert codes(findings, "XLA411") == [(5, True), (5, True)], findings
    flat = " ".join(out.split()).replace("( ", "(").replace(" )", ")").replace("[ ", "[").replace(" ]", "]")
    assert ("source[torch.arange(max(min(i + seq_len, source.size(0)) - i, 0), device=source.device) "
            "+ torch.tensor([i], device=source.device)]") in flat, out
    assert "- (i + 1), 0)" in flat and "torch.tensor([i + 1], device=source.device)].reshape(-1)" in flat
    assert "XLA407" not in [f.code for f in findings]  # what is fixed is not also reported


@pytest.mark.torch
def test_the_gathered_rows_are_the_slices_rows_wherever_the_slice_clamps():
    # the rewrite's own expression against Python's slice, on the CPU: past
    # the end, at the end, an open end, an empty slice
    import torch

    source = torch.arange(30).view(10, 3)
    for i, n in ((0, 4), (7, 6), (9, 1), (10, 2), (12, 3)):
        got = source[torch.arange(max(min(i + n, source.size(0)) - i, 0), device=source.device)
                     + torch.tensor([i], device=source.device)]
        assert torch.equal(got, source[i:i + n]), (i, n)
        got = source[torch.arange(max(source.size(0) - i, 0), device=source.device)
                     + torch.tensor([i], device=source.device)]
        assert torch.equal(got, source[i:]), i


ONE = LM.replace("    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)\n",
                 "    return source[i:i + seq_len]\n").replace("    x, y = get_batch(data, i)\n    loss = model(x, y)\n",
                                                         "    loss = model(get_batch(data, i))\n")


@pytest.mark.parametrize("change", [
    # a slice written to or changed in place in the helper, a step, a start
    # counted from the end, no start: each stays reported
    ("    return source[i:i + seq_len]\n", "    x = source[i:i + seq_len]\n    x.add_(1)\n    return x\n"),
    ("source[i:i + seq_len]", "source[i:i + seq_len:2]"),
    ("source[i:i + seq_len]", "source[i - 1:i + seq_len]"),
    ("source[i:i + seq_len]", "source[:i + seq_len]"),
])
def test_a_helper_slice_that_is_not_a_plain_read_stays_reported(change):
    assert "torch.tensor([" in convert_text(ONE)[0]  # (the case the changes below break)
    src = ONE.replace(*change)
    assert change[1] in src
    out, findings = convert_text(src)
    assert "torch.tensor([" not in out and "XLA411" not in [f.code for f in findings], out
    assert "XLA407" in [f.code for f in findings]


def test_a_slice_written_in_the_helper_stays_as_it_is():
    out, findings = convert_text(ONE.replace("    return source[i:i + seq_len]\n",
                                             "    source[i:i + 1] = 0\n    return source[i:i + seq_len]\n"))
    assert "    source[i:i + 1] = 0\n" in out and "XLA407" in [f.code for f in findings]


def test_a_helper_slicing_a_host_list_is_left():
    out, findings = convert_text(ONE.replace("data = torch.arange(40).view(20, 2).cuda()", "data = list(range(20))"))
    assert "torch.tensor([" not in out and not {"XLA407", "XLA411"} & {f.code for f in findings}


@pytest.mark.xla
@needs_xla
def test_chunks_cut_by_a_helper_compile_once_per_length_and_train_as_the_original(tmp_path, monkeypatch):
    """fixtures/lm_batches: 4 and 8 chunks of training, each cut by
    `get_batch(source, i)`; the original on the CPU against the conversion
    on XLA: the same loss; compiles flat; left unfixed (XLA411 off), one
    more graph per chunk."""
    original, short, long, out8 = _original_and_two_lengths("lm_batches", tmp_path)
    assert short["metrics"]["compiles"] == long["metrics"]["compiles"], (short, long)
    assert _numbers(out8) == pytest.approx(_numbers(original.stdout), rel=1e-3, abs=1e-4), (out8, original.stdout)
    import test_runnable_ports

    monkeypatch.setattr(test_runnable_ports, "Settings", lambda: Settings(ignore=("XLA411",)))
    left4, _, _, _ = run_on_xla("lm_batches", tmp_path / "c", "--steps", "4")
    left8, _, _, _ = run_on_xla("lm_batches", tmp_path / "d", "--steps", "8")
    assert left8["metrics"]["compiles"] >= left4["metrics"]["compiles"] + 4, (left4, left8)
