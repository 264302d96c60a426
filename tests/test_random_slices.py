"""XLA424: a function called every step with a device tensor that slices it
at host-random offsets is reported at the call (codemods/random_slices.py,
codemods/analysis/random_slices.py).  The rule's own example is run by
tests/test_rules.py."""

from pathlib import Path

import pytest

from codemods.analysis.random_slices import slicing_functions
from conftest import convert_text
from xlaport.engine import Settings, transform

LOOP = (
    "device = torch.device('cuda')\n"
    "for gt in loader:\n"
    "    gt = gt.to(device)\n"
    "    {call}\n"
    "    loss = model(gt).sum()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
)

# Lornatang/SRGAN-PyTorch's imgproc.random_crop_torch, cut down: one draw, a derived offset, two branches
CROP = (
    "import random\n\nimport torch\n\n\n"
    "def random_crop_torch(gt, lr, size, scale):\n"
    "    top = random.randint(0, lr.size(-2) - size)\n"
    "    gt_top = int(top * scale)\n"
    "    if torch.is_tensor(lr):\n"
    "        lr = lr[:, :, top:top + size]\n"
    "    gt = gt[:, :, gt_top:gt_top + size * scale]\n"
    "    return gt, lr\n"
)


def _found(findings, code="XLA424"):
    return [f for f in findings if f.code == code]


def test_which_functions_slice_a_parameter_at_a_draw_and_where():
    source = CROP + (
        "\n\ndef center(x, size):\n    return x[:, :, 2:2 + size]\n"
        "\n\ndef noisy(x):\n    import numpy as np\n    return x + np.random.normal()\n"
        "\n\ndef np_crop(x):\n    left = np.random.randint(4)\n    return x[..., left:]\n"
        # a random chunk of the module's own text: no parameter is cut
        "\n\ndef chunk(model, n):\n    i = random.randint(0, len(TEXT) - n)\n    return model(TEXT[i:i + n])\n"
    )
    found = slicing_functions(("import numpy as np\n" + source).encode())
    assert {name: (s.line, s.params, s.sliced) for name, s in found.items()} == {
        "random_crop_torch": (11, ("gt", "lr", "size", "scale"), frozenset({"gt", "lr"})),
        "np_crop": (27, ("x",), frozenset({"x"})),
    }
    crop = found["random_crop_torch"]
    assert crop.cuts(0, None) and crop.cuts(None, "lr") and not crop.cuts(2, None) and not crop.cuts(9, None)


def test_a_list_made_of_a_parameter_is_followed_into_its_comprehension():
    """SRGAN's shape: `lr_images = [lr_images]`, then `[x[:, :, top:top + k] for x in lr_images]`."""
    source = (
        "import random\n\n\ndef crop(lr_images, k):\n"
        "    if not isinstance(lr_images, list):\n        lr_images = [lr_images]\n"
        "    top = random.randint(0, 8)\n"
        "    return [x[:, :, top:top + k] for x in lr_images]\n"
    )
    assert slicing_functions(source.encode())["crop"].sliced == frozenset({"lr_images"})


def test_a_crop_of_this_module_run_every_step_is_reported_at_its_slices():
    """The module's own function, which its step loop calls: each random slice of a device tensor, where it is."""
    src = CROP + "\n\n" + LOOP.format(call="gt, lr = random_crop_torch(gt, gt, 8, 2)")
    _, findings = convert_text(src, select=["XLA424"])
    assert [f.line for f in _found(findings)] == [10, 11], findings
    assert "`lr` is sliced at an offset drawn" in findings[0].message
    assert "in `random_crop_torch()`, called from the loop at line 16" in findings[0].message


def test_a_slice_in_the_step_loop_itself():
    src = "import random\n\nimport torch\n\n" + LOOP.format(
        call="i = random.randint(0, 8)\n    gt = gt[:, :, i:i + 32]\n    j = i * 2\n    gt = gt[..., j:]")
    _, findings = convert_text(src, select=["XLA424"])
    assert [f.line for f in _found(findings)] == [9, 11], findings
    assert "runs every step (in the loop at line 6)" in findings[0].message


def test_a_crop_imported_from_another_module_of_the_project_names_its_file(tmp_path):
    (tmp_path / "imgproc.py").write_text(CROP)
    main = "from imgproc import random_crop_torch\n\n" + LOOP.format(call="gt, lr = random_crop_torch(gt, gt, 8, 2)")
    (tmp_path / "train.py").write_text(main)
    out = transform(main.encode(), Settings(select=["XLA424"]), filename=str(tmp_path / "train.py"))
    [f] = _found(out.findings)
    assert f.line == 6 and "(imgproc.py:10)" in f.message


@pytest.mark.parametrize("head, call", [
    # cropped on the host, before the batch moves: the CPU slices it
    ("", "lr = random_crop_torch(cpu_batch, cpu_batch, 8, 2)"),
    # a crop at a fixed offset: one graph
    ("def center(x, size):\n    return x[:, :, 2:2 + size]\n\n\n", "gt = center(gt, 8)"),
    # the device tensor goes where no slice cuts it
    ("def pick(x, table):\n    i = random.randint(0, 4)\n    return x * len(table[i:i + 2])\n\n\n",
     "gt = pick(gt, cpu_batch.tolist())"),
])
def test_not_reported_where_no_graph_depends_on_a_draw(head, call):
    src = CROP + "\n\n" + head + "cpu_batch = torch.zeros(2, 3, 16, 16)\n" + LOOP.format(call=call)
    _, findings = convert_text(src, select=["XLA424"])
    assert _found(findings) == []


def test_an_offset_drawn_once_before_the_loop_is_one_graph():
    src = "import random\n\nimport torch\n\ni = random.randint(0, 8)\n" + LOOP.format(call="gt = gt[:, :, i:i + 32]")
    _, findings = convert_text(src, select=["XLA424"])
    assert _found(findings) == []


def test_a_crop_called_once_is_not_reported():
    src = CROP + "\n\nx = torch.zeros(1, 3, 16, 16).to(device)\ngt, lr = random_crop_torch(x, x, 8, 2)\n"
    _, findings = convert_text(src, select=["XLA424"])
    assert _found(findings) == []


def test_a_module_that_does_not_resolve_is_not_read(tmp_path):
    main = "from missing import random_crop_torch\n\n" + LOOP.format(call="gt, lr = random_crop_torch(gt, gt, 8, 2)")
    out = transform(main.encode(), Settings(select=["XLA424"]), filename=str(Path(tmp_path) / "train.py"))
    assert _found(out.findings) == []
