"""Which functions of the program only compute tensors
(codemods/analysis/tensor_functions.py): a call of one after a step's
optimizer step joins the step's graph before the barrier, as a line of torch
ops does (analysis.step_tail).  fixtures/function_after_step is the golden
case (akamaster/pytorch_resnet_cifar10's `accuracy` shape); here what keeps a
function out, what keeps its call after the barrier, and the XLA run."""

import pytest

from xlaport.engine import Settings, transform

from test_runnable_ports import needs_xla
from test_step_calls import at_two_lengths, original_output
from test_step_tail import converted

METRIC = (
    "def score(out, y):\n"
    "    hits = out.argmax(1).eq(y)\n"
    "    return hits.float().mean() * 100\n"
)
LOOP = (
    "import math\n\nimport torch\n\n{metric}\n"
    "def train(model, opt, x, y, history):\n"
    "    for step in range(8):\n"
    "        out = model(x.cuda())\n"
    "        loss = torch.nn.functional.cross_entropy(out, y)\n"
    "        opt.zero_grad()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "{between}"
    "        acc = score(out, y)\n"
    "        history.append((loss.item(), acc.item()))\n"
)
JOINED = "        opt.step()\n        acc = score(out, y)\n        torch_xla.sync()\n"
AFTER = "        opt.step()\n        torch_xla.sync()\n"


def test_a_function_that_only_computes_tensors_joins_the_steps_graph():
    valid = {
        "torch ops and methods": METRIC,
        "a list it fills, a loop over an argument, builtins": (
            "def score(out, y, ks=(1,)):\n    rows = y.size(0)\n    res = []\n    for k in ks:\n"
            "        res.append(out.topk(max(ks), 1)[1][:, :k].eq(y.view(-1, 1)).float().sum() / rows)\n"
            "    return res[0]\n"),
        "another such function, math, an if on ints": (
            "def norm(t):\n    return t / math.sqrt(t.numel())\n\n"
            "def score(out, y):\n    if out.dim() > 1:\n        out = norm(out)\n"
            "    return torch.nn.functional.cross_entropy(out, y)\n"),
        "inside `with torch.no_grad():`": METRIC.replace("    hits =", "    with torch.no_grad():\n        hits =")
                                                 .replace("    return", "        return"),
        "under no_grad, changing its own tensor in place": (
            "@torch.no_grad()\ndef score(out, y):\n    s = out.argmax(1).eq(y).float().sum()\n    s.mul_(2)\n"
            "    return s\n"),
    }
    for why, metric in valid.items():
        code = converted(LOOP.format(metric=metric, between=""))
        assert JOINED in code, (why, code)


def test_a_function_that_does_more_than_compute_stays_after_the_barrier():
    invalid = {
        "prints": METRIC.replace("    return", "    print(hits)\n    return"),
        "reads the host": METRIC.replace("hits.float().mean()", "hits.float().mean().item()"),
        "appends to a list it did not make": METRIC.replace("    return", "    seen.append(hits)\n    return"),
        "draws random numbers": METRIC.replace("hits.float()", "(hits.float() + torch.rand(1))"),
        "dropout": METRIC.replace("hits.float()", "torch.nn.functional.dropout(hits.float())"),
        "decides by a tensor": METRIC.replace("    return", "    if hits.any():\n        y = y + 1\n    return"),
        "saves": METRIC.replace("    return", "    torch.save(hits, 'h.pt')\n    return"),
        "calls an object it is given": METRIC.replace("def score(out, y):", "def score(out, y, log=None):")
                                             .replace("    return", "    log.info(hits)\n    return"),
        "a generator": METRIC.replace("    return", "    yield hits\n    return"),
        "catches": METRIC.replace("    hits = out.argmax(1).eq(y)\n",
                                  "    try:\n        hits = out.argmax(1).eq(y)\n    except RuntimeError:\n"
                                  "        hits = y\n"),
        "a global statement": METRIC.replace("    hits =", "    global hits\n    hits ="),
        "inside another context": METRIC.replace("    hits =", "    with open('log') as f:\n        hits =")
                                        .replace("    return", "        return"),
        "a function of unknown effect": METRIC.replace("hits.float()", "helper(hits).float()"),
    }
    for why, metric in invalid.items():
        code = converted(LOOP.format(metric=metric, between=""))
        assert AFTER in code and "        torch_xla.sync()\n        acc = score(out, y)\n" in code, (why, code)


def test_a_line_skipped_over_that_uses_what_the_call_is_handed_keeps_it_after_the_barrier():
    """It may change what it is handed (`s.mul_` on a view of it): a line
    the move would skip that reads `out` keeps the call after it."""
    code = converted(LOOP.format(metric=METRIC, between="        history.append(out.cpu())\n"))
    assert AFTER + "        history.append(out.cpu())\n        acc = score(out, y)\n" in code, code
    # one that reads neither moves the call over it
    code = converted(LOOP.format(metric=METRIC, between="        history.append(loss.item())\n"))
    assert JOINED + "        history.append(loss.item())\n" in code, code


def test_a_method_or_a_call_that_does_not_match_its_parameters_is_not_one():
    method = ("class Scorer:\n    def score(self, out, y):\n        return out.argmax(1).eq(y).float().mean()\n\n"
              "scorer = Scorer()\n")
    code = converted(LOOP.format(metric=method, between="").replace("acc = score(", "acc = scorer.score("))
    assert "        torch_xla.sync()\n        acc = scorer.score(out, y)\n" in code, code
    code = converted(LOOP.format(metric=METRIC, between="").replace("acc = score(out, y)", "acc = score(out, y, 3)"))
    assert "        torch_xla.sync()\n        acc = score(out, y, 3)\n" in code, code


@pytest.mark.xla
@needs_xla
def test_the_function_in_the_steps_graph_runs_once_a_step_with_the_originals_numbers(tmp_path):
    """fixtures/function_after_step on XLA at 3 and 6 steps: compiles flat,
    one execution a step (with the call after the barrier: two, the metric a
    graph of its own), and the numbers the original prints on the CPU."""
    a, _, b, out6 = at_two_lengths("function_after_step", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"], (a, b)
    assert b["executions"] - a["executions"] == 3, (a, b)
    original = original_output("function_after_step", "--steps", "6")

    def numbers(text):
        return [float(w) for line in text.splitlines() for w in line.split()[1::2]]

    assert len(numbers(out6)) == 24 and numbers(out6) == pytest.approx(numbers(original), rel=1e-4, abs=1e-4)


def test_a_function_imported_from_a_module_of_the_project_is_read_there(tmp_path):
    """`from util import score` (SupContrast, moco and others keep their
    `accuracy` in `util.py`): the function is read in that file; one that
    prints there stays after the barrier, and so does one of a library."""
    (tmp_path / "util.py").write_text("import torch\n\n\n" + METRIC)
    main = tmp_path / "main.py"
    src = LOOP.format(metric="", between="").replace("import math\n", "from util import score\n")
    code = transform(src.encode(), Settings(), filename=str(main)).code.decode()
    assert JOINED in code, code
    (tmp_path / "util.py").write_text("import torch\n\n\n" + METRIC.replace("    return", "    print(hits)\n    return"))
    code = transform(src.encode(), Settings(), filename=str(main)).code.decode()
    assert AFTER + "        acc = score(out, y)\n" in code, code
    library = src.replace("from util import score\n", "from sklearn.metrics import score\n")
    assert AFTER + "        acc = score(out, y)\n" in transform(library.encode(), Settings(), filename=str(main)).code.decode()
