"""XLA419 (codemods/inplace_results.py, analysis/inplace_results.py): the
in-place op whose result a function hands back, on a tensor it has just made,
is made out-of-place.  fixtures/inplace_accuracy is the golden case
(pytorch/examples' imagenet `accuracy`); here the shapes that are rewritten,
those that are not, and the XLA run."""

import pytest

from test_runnable_ports import needs_xla
from test_step_calls import one_execution_a_step, original_output, printed_numbers
from test_step_tail import converted

IMAGENET = (
    "import torch\n\n"
    "def accuracy(output, target, topk=(1,)):\n"
    "    with torch.no_grad():\n"
    "        maxk = max(topk)\n"
    "        batch_size = target.size(0)\n"
    "        _, pred = output.topk(maxk, 1, True, True)\n"
    "        pred = pred.t()\n"
    "        correct = pred.eq(target.view(1, -1).expand_as(pred))\n"
    "        res = []\n"
    "        for k in topk:\n"
    "            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)\n"
    "            res.append(correct_k.mul_(100.0 / batch_size))\n"
    "        return res\n\n"
    "model = model.cuda()\n"
)


def test_imagenets_accuracy_returns_a_new_tensor():
    code = converted(IMAGENET)
    assert "res.append(correct_k.mul(100.0 / batch_size))" in code and "mul_" not in code


@pytest.mark.parametrize("before, after", [
    ("    return y.mul_(2)\n", "    return y.mul(2)\n"),
    ("    return y.div_(n * 2.0)\n", "    return y.div(n * 2.0)\n"),
    ("    return y.clamp_(0, 1)\n", "    return y.clamp(0, 1)\n"),
    ("    return y.neg_()\n", "    return y.neg()\n"),
])
def test_what_is_rewritten(before, after):
    src = f"import torch\n\ndef f(x):\n    n = x.size(0)\n    y = x.sum(0) + 1\n{before}\nmodel = model.cuda()\n"
    assert after in converted(src)


@pytest.mark.parametrize("body", [
    # a view of what the caller handed in: the caller's tensor changes
    "    y = x[0]\n    return y.mul_(2)\n",
    "    y = x.view(-1)\n    return y.mul_(2)\n",
    # `.float()` / `.contiguous()` may be the tensor itself
    "    y = x.float()\n    return y.mul_(2)\n",
    # a parameter
    "    return x.mul_(2)\n",
    # the tensor read again, or held by another name or a list first
    "    y = x.sum(0)\n    out = y.mul_(2)\n    return out, y\n",
    "    y = x.sum(0)\n    z = y\n    return y.mul_(2)\n",
    "    y = x.sum(0)\n    keep = [y]\n    return y.mul_(2)\n",
    # a function inside that could hold it
    "    y = x.sum(0)\n    g = lambda: y\n    return y.mul_(2)\n",
    # a tensor, a keyword or an unknown name as an argument
    "    y = x.sum(0)\n    return y.mul_(x)\n",
    "    y = x.sum(0)\n    return y.add_(1, alpha=2)\n",
    "    y = x.sum(0)\n    return y.mul_(scale)\n",
    # the result is not handed back
    "    y = x.sum(0)\n    y.mul_(2)\n    return y\n",
    "    y = x.sum(0)\n    print(y.mul_(2))\n",
    # an op with no out-of-place twin of the same arguments
    "    y = x.sum(0)\n    return y.copy_(x)\n",
])
def test_what_is_left(body):
    src = f"import torch\n\ndef f(x):\n{body}\nmodel = model.cuda()\n"
    assert converted(src) == src.replace("model.cuda()", "model.to(torch_xla.device())").replace(
        "import torch\n", "import torch\nimport torch_xla\n", 1), converted(src)


def test_only_in_code_being_ported():
    src = IMAGENET.replace("model = model.cuda()\n", "")
    assert converted(src) == src


@pytest.mark.xla
@needs_xla
def test_the_meters_prints_copy_with_the_originals_numbers(tmp_path):
    """fixtures/inplace_accuracy on XLA at 3 and 6 batches: compiles flat, one
    execution a step (with `mul_`: each print of the two meters' views runs
    graphs of its own), and every line the original prints on the CPU."""
    out6 = one_execution_a_step("inplace_accuracy", tmp_path)
    original = original_output("inplace_accuracy", "--steps", "6")
    assert len(out6.splitlines()) == 6 and printed_numbers(out6) == pytest.approx(printed_numbers(original), rel=1e-4,
                                                                                  abs=1e-4)
