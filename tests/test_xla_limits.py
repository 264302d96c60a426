"""XLA160 (codemods/xla_limits.py): a slice bound counted from the end of a
tensor a loop grows is clamped to the size, on the axis the slice cuts, as
eager PyTorch clamps it (torch_xla raises; the run on XLA is in
test_runnable_ports.py).  Where the axis cannot be told it is reported."""

import pytest

from tests.conftest import convert_text

GROWN = ("import torch\n\nidx = torch.zeros((1, 1), dtype=torch.long).cuda()\nfor _ in range(4):\n"
         "    {line}\n    idx = torch.cat((idx, idx[:, -1:] + 1), dim=1)\n")


@pytest.mark.parametrize("line, clamped", [
    ("ctx = idx[:, -block_size:]", "ctx = idx[:, -min(block_size, idx.size(1)):]"),
    ("row = idx[0, -self.n:]", "row = idx[0, -min(self.n, idx.size(1)):]"),
    ("head = idx[:-k]", "head = idx[:-min(k, idx.size(0))]"),
    ("mid = idx[-a:-b, -1, :-c]", "mid = idx[-min(a, idx.size(0)):-min(b, idx.size(0)), -1, :-min(c, idx.size(2))]"),
])
def test_each_bound_from_the_end_is_clamped_on_its_axis(line, clamped):
    out, found = convert_text(GROWN.format(line=line))
    assert f"    {clamped}\n" in out, out
    assert [(f.line, f.fix) for f in found if f.code == "XLA160"] == [(5, True)], found
    again, found = convert_text(out)
    assert again == out and "XLA160" not in {f.code for f in found}


@pytest.mark.parametrize("line", [
    "ctx = idx[..., -block_size:]",  # (the axis counts from the end after an ellipsis)
    "ctx = idx[rows, -block_size:]",  # (`rows` may be a tensor: an index of several axes)
    "ctx = idx[None, -block_size:]",
])
def test_a_slice_whose_axis_cannot_be_told_is_reported_with_the_fix(line):
    out, found = convert_text(GROWN.format(line=line))
    assert f"    {line}\n" in out, out
    assert [(f.line, f.fix) for f in found if f.code == "XLA160"] == [(5, False)], found
    assert "-min(block_size, idx.size(dim))" in next(f.message for f in found if f.code == "XLA160")


@pytest.mark.parametrize("source", [
    # not grown by the loop: its size is known
    "import torch\n\nx = torch.zeros(4, 9).cuda()\nfor _ in range(4):\n    y = x[:, -n:]\n",
    # a test reads the bound first
    GROWN.format(line="ctx = idx if idx.size(1) <= n else idx[:, -n:]"),
    # a module not being ported
    GROWN.format(line="ctx = idx[:, -n:]").replace(".cuda()", ""),
])
def test_a_size_the_code_knows_is_left(source):
    out, found = convert_text(source)
    assert "-min(" not in out and "XLA160" not in {f.code for f in found}, out
