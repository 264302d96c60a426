"""Notebooks: a notebook is one program (its cells one module, one added
import cell), and a converted notebook stays valid, loses no cell text and
keeps its version's form (issue 26, items 4 and 18)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli as run


def _notebook(path: Path, sources, minor: int = 4, sort_keys: bool = True) -> dict:
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
              "source": src.splitlines(keepends=True)} for src in sources]
    nb = {"cells": cells, "metadata": {"zeta": 1, "kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                  "language": "python"}},
          "nbformat": 4, "nbformat_minor": minor}
    path.write_text(json.dumps(nb, indent=1, sort_keys=sort_keys, ensure_ascii=False) + "\n")
    return nb


def test_a_cell_holding_the_join_marker_loses_nothing(tmp_path):
    f = tmp_path / "n.ipynb"
    cells = ["import torch\nx = torch.zeros(2).cuda()\n",
             "# xlaport-cell 1\ny = x + 1\n",
             "__xlaport_magic_0__\nz = y * 2\n",
             "print(z)\n"]
    _notebook(f, cells)
    result = run("convert", f)
    assert result.exit_code == 0, result.output
    out = json.loads(f.read_text())
    code = ["".join(c["source"]) for c in out["cells"] if c["cell_type"] == "code"]
    assert code[1] == "import torch\nx = torch.zeros(2).to(torch_xla.device())\n"
    assert code[2:] == cells[1:]


def test_a_converted_v4_4_notebook_stays_valid_and_keeps_its_key_order(tmp_path):
    import nbformat

    f = tmp_path / "n.ipynb"
    _notebook(f, ["import torch\nx = torch.zeros(2).cuda()\n", "print(x)\n"], minor=4, sort_keys=False)
    before_keys = list(json.loads(f.read_text())["metadata"])
    result = subprocess.run([sys.executable, "-m", "xlaport", "convert", "--no-cache", str(f)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "warn" not in result.stderr.lower()
    text = f.read_text()
    nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)  # raises on a schema error (an `id` in a 4.4 cell is one)
    data = json.loads(text)
    assert all("id" not in c for c in data["cells"])
    assert list(data["metadata"]) == before_keys  # not re-sorted
    lint = subprocess.run([sys.executable, "-m", "xlaport", "lint", "--no-cache", str(f)], capture_output=True,
                          text=True)
    assert "arning" not in lint.stdout + lint.stderr


def test_a_v4_5_notebook_gets_a_cell_id_for_the_added_cell(tmp_path):
    import nbformat

    f = tmp_path / "n.ipynb"
    nb = _notebook(f, ["import torch\nx = torch.zeros(2).cuda()\n"], minor=5)
    for k, c in enumerate(nb["cells"]):
        c["id"] = f"cell{k}"
    f.write_text(json.dumps(nb, indent=1, sort_keys=True) + "\n")
    assert run("convert", f).exit_code == 0
    out = nbformat.reads(f.read_text(), as_version=nbformat.NO_CONVERT)
    nbformat.validate(out)
    assert len(out.cells) == 2 and out.cells[0].id not in ("cell0",)
    # the id comes from the notebook, not from chance: a second conversion of the original writes the same bytes
    first = f.read_bytes()
    f.write_text(json.dumps(nb, indent=1, sort_keys=True) + "\n")
    assert run("convert", f).exit_code == 0 and f.read_bytes() == first


def test_notebook_cells(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("uses cuda"),
        nbformat.v4.new_code_cell("%matplotlib inline\nimport torch\nx = torch.ones(2).cuda()"),
        nbformat.v4.new_code_cell("def broken(:\n  x.cuda()"),
    ]
    f = tmp_path / "n.ipynb"
    f.write_text(nbformat.writes(nb))
    r = run("convert", f)
    assert r.exit_code == 2 and "cell 3" in r.output
    out = nbformat.read(str(f), as_version=4)
    assert out.cells[1].source == "import torch_xla"  # the added import cell
    assert out.cells[2].source.startswith("%matplotlib inline\nimport torch\n")
    assert "x = torch.ones(2).to(torch_xla.device())" in out.cells[2].source
    assert out.cells[3].source == "def broken(:\n  x.cuda()"


def _nbformat_notebook(tmp_path, *cells):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(c[3:]) if c.startswith("md:") else nbformat.v4.new_code_cell(c)
                for c in cells]
    f = tmp_path / "train.ipynb"
    f.write_text(nbformat.writes(nb))
    return f


def test_notebook_is_one_program_with_one_added_import_cell(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    f = _nbformat_notebook(tmp_path, "md:# Training", "%matplotlib inline\nimport torch\nfrom tqdm import tqdm\n"
                  "model = torch.nn.Linear(2, 2).cuda()",
                  "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nbatches = [torch.ones(2)] * 3",
                  "for x in tqdm(batches):\n    x = x.cuda()\n    loss = model(x).sum()\n    loss.backward()\n"
                  "    opt.step()")
    lint = json.loads(run("lint", "--format", "json", f).stdout)["findings"]
    # the loop in cell 4 is known to be a step loop, and its progress bar's import (cell 2) is known
    assert {(x["cell"], x["code"]) for x in lint} >= {(4, "XLA302"), (4, "XLA201"), (2, "XLA101"), (4, "XLA101")}
    assert all(x["line"] <= 6 for x in lint)  # lines inside the cell, not the program
    diff = run("convert", "--diff", f).stdout
    assert f"{str(f).lstrip('/')}:new cell (added imports)" in diff and ":cell 4" in diff and '"source"' not in diff
    assert run("convert", f).exit_code == 0
    out = nbformat.read(str(f), as_version=4)
    code = [c.source for c in out.cells if c.cell_type == "code"]
    assert code[0] == "import torch_xla"  # one new cell, before the first code cell
    assert sum("import torch_xla" in c for c in code) == 1
    assert "from tqdm import tqdm" not in code[1]  # no longer used anywhere in the notebook
    assert code[3].rstrip().endswith("torch_xla.sync()")
    compile("\n".join(c for c in code if not c.startswith("%")).replace("%matplotlib inline", ""), "nb", "exec")
    assert run("convert", "--check", f).exit_code == 0  # idempotent


def test_a_cell_whose_first_import_goes_is_converted_not_refused(tmp_path):
    """rasbt/LLMs-from-scratch ch07: a cell beginning `from tqdm import tqdm`
    whose bar goes (XLA201) lost the cell marker above the import, and the
    notebook was refused ("could not be cut back into its cells", XLA001)."""
    f = tmp_path / "n.ipynb"
    cells = ["import torch\nx = torch.zeros(2).cuda()\n",
             "from tqdm import tqdm  # a progress bar tool\n\n\nfor i in tqdm(range(2)):\n    print(i, x)\n",
             "print(x)\n"]
    _notebook(f, cells)
    result = run("convert", f)
    assert result.exit_code == 0 and "XLA001" not in result.output, result.output
    code = ["".join(c["source"]) for c in json.loads(f.read_text())["cells"] if c["cell_type"] == "code"]
    assert code[2] == "for i in range(2):\n    print(i, x)\n", code
    assert code[3] == cells[2]
