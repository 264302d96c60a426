"""XLA422 (codemods/flag_first.py): a host flag is tested before the tensor
condition it is ``and``/``or``-ed with, where the test runs every step."""

import libcst as cst
import pytest

from tests.conftest import convert_text

LOOP = """\
import torch

DEBUG = False
for x in loader:
    out = model(x.cuda())
    if {test}:
        print("bad")
"""


def _swapped(test: str):
    out, findings = convert_text(LOOP.format(test=test))
    found = [f.line for f in findings if f.code == "XLA422"]
    line = next(n.strip() for n in out.splitlines() if n.strip().startswith("if "))
    return line, found, out


@pytest.mark.parametrize("test, want", [
    ("torch.isnan(out).any() and DEBUG", "if DEBUG and torch.isnan(out).any():"),
    ("(torch.isnan(out).any() or torch.isinf(out).any()) and DEBUG",  # nerf-pytorch's render_rays
     "if DEBUG and (torch.isnan(out).any() or torch.isinf(out).any()):"),
    ("out.abs().max() > 1e4 or args.verbose", "if args.verbose or out.abs().max() > 1e4:"),
    ("torch.isnan(out).any() and not self.quiet", "if not self.quiet and torch.isnan(out).any():"),
])
def test_the_flag_is_tested_first(test, want):
    line, found, out = _swapped(test)
    assert line == want and found == [6], out
    cst.parse_module(out)
    assert convert_text(out)[0] == out


@pytest.mark.parametrize("test", [
    "DEBUG and torch.isnan(out).any()",  # the flag first already
    "check(out).any() and DEBUG",  # a call that may do more than compute
    "out.mul_(2).any() and DEBUG",  # changes the tensor: it must run
    "torch.isnan(out).any() and out.sum()",  # no host flag
    "torch.isnan(out).any() and flags()",  # a call on the right
    "step > 10 and DEBUG",  # no tensor read to save
])
def test_a_test_it_cannot_reorder_safely_is_left(test):
    line, found, _ = _swapped(test)
    assert found == [] and line == f"if {test}:"


def test_a_test_that_runs_once_is_left():
    src = "import torch\n\nout = model(x.cuda())\nif torch.isnan(out).any() and DEBUG:\n    print('bad')\n"
    out, findings = convert_text(src)
    assert "XLA422" not in [f.code for f in findings] and "if torch.isnan(out).any() and DEBUG:" in out


@pytest.mark.parametrize("test", ["(torch.isnan(out).any() or torch.isinf(out).any()) and DEBUG",
                                  "out.abs().max() > 1e4 or DEBUG"])
def test_the_reordered_test_decides_as_the_original(test):
    """The converted test, evaluated for each flag and each kind of output,
    decides as the user's did."""
    import torch

    line, _, _ = _swapped(test)
    converted = line[len("if "):-1]
    assert converted != test
    for debug in (False, True):
        for out in (torch.ones(3), torch.tensor([1.0, float("nan")]), torch.tensor([float("inf"), 1e5])):
            space = {"torch": torch, "out": out, "DEBUG": debug}
            assert bool(eval(converted, space)) == bool(eval(test, space)), (debug, out)
