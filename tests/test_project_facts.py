"""What a rule knows of the program's other modules (codemods/analysis/project.py):
a sparse tensor another module's function returns is said where this module
moves it (XLA158), the CUDA test that would switch the move on is kept
(XLA118), the conversion runs where the original ran, and a cached answer is
not reused once that other module changes."""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from codemods.analysis.project import imported_modules, resolve, sparse_returns, tensor_returns
from xlaport.cli import main

UTILS = '''\
import numpy as np
import torch


def to_torch_sparse(m):
    dense = torch.from_numpy(m)
    return dense.to_sparse()


def load_data():
    adj = np.eye(4, dtype=np.float32)
    adj = to_torch_sparse(adj)
    features = torch.ones(4, 3)
    return adj, features, torch.arange(4)
'''

TRAIN = '''\
import torch

from utils import load_data

use_cuda = torch.cuda.is_available()
adj, features, labels = load_data()
weight = torch.full((3, 2), 0.5)
if use_cuda:
    adj = adj.cuda()
    features = features.cuda()
    weight = weight.cuda()
out = torch.spmm(adj, features @ weight)
print(out.sum().item())
'''


def _lint(*args):
    return CliRunner().invoke(main, ["lint", "--format", "concise", *map(str, args)])


def _codes(output: str, name: str = "train.py"):
    return sorted((int(line.split(":")[1]), line.split()[1]) for line in output.splitlines()
                  if line.startswith(name) or f"/{name}:" in line.split(" ")[0])


@pytest.fixture
def program(tmp_path):
    root = tmp_path / "prog"
    root.mkdir()
    (root / "utils.py").write_text(UTILS)
    (root / "train.py").write_text(TRAIN)
    return root


def test_which_functions_return_a_sparse_tensor_and_where_in_the_tuple(tmp_path):
    (tmp_path / "utils.py").write_text(UTILS + "\n\ndef dense_again(x):\n    x = x.to_sparse()\n"
                                       "    x = x.to_dense()\n    return x\n")
    facts = sparse_returns(tmp_path / "utils.py")
    # through the helper (a function of the module that returns one), at
    # element 0 only; the last assignment before the return is what counts
    assert facts == {"to_torch_sparse": frozenset({None}), "load_data": frozenset({0})}


def test_an_import_names_a_project_file_relative_or_from_the_root(tmp_path):
    pkg = tmp_path / "repo" / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "utils.py", "sub/__init__.py", "sub/train.py"):
        (pkg / f).write_text("")
    train = str(pkg / "sub" / "train.py")
    assert resolve(train, "..utils") == pkg / "utils.py"
    assert resolve(train, ".") == pkg / "sub" / "__init__.py"
    assert resolve(train, "pkg.utils") == pkg / "utils.py"  # run from the repository's root
    assert resolve(train, "torch.nn") is None  # an installed library is not looked into
    assert resolve(None, ".utils") is None


def test_only_import_statements_name_modules(tmp_path):
    # at a line's start, after its indent: not a word that ends in "import",
    # not a statement after another on its line, not the import in a "from"
    for name in ("utils", "helpers", "late", "other", "also"):
        (tmp_path / f"{name}.py").write_text("")
    source = (b"from utils import a\n"
              b"def f():\n    import helpers as h\n\timport late\n"
              b"x = 1; import other\n"
              b"reimport also\n"
              b"s = 'from also import b'\n")
    found = imported_modules(str(tmp_path / "train.py"), source)
    assert list(found) == ["utils", "helpers", "late"] and found["utils"] == tmp_path / "utils.py"
    assert imported_modules(str(tmp_path / "train.py"), source) is found  # asked twice for the same bytes: once


def test_a_sparse_tensor_from_another_module_keeps_the_test_that_would_move_it(program):
    result = _lint("--no-cache", program / "train.py")
    found = _codes(result.output)
    assert (5, "XLA118") in found and (9, "XLA158") in found, result.output
    assert "switch on moving sparse `adj` (line 9)" in result.output
    # the helper module's own construction is said there, as before
    assert (7, "XLA158") in _codes(_lint("--no-cache", program).output, "utils.py")
    # a module that returns a dense tensor: the test is rewritten, the move not said
    (program / "utils.py").write_text(UTILS.replace("return dense.to_sparse()", "return dense"))
    found = _codes(_lint("--no-cache", program / "train.py").output)
    assert (5, "XLA105") in found and (5, "XLA118") not in found and (9, "XLA158") not in found, found


def test_a_cached_answer_is_not_reused_once_the_other_module_changes(program, tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPORT_CACHE_DIR", str(tmp_path / "cache"))
    (program / "utils.py").write_text(UTILS.replace("return dense.to_sparse()", "return dense"))
    assert "XLA118" not in _lint(program / "train.py").output
    assert "XLA118" not in _lint(program / "train.py").output  # (answered from the cache)
    (program / "utils.py").write_text(UTILS)  # train.py itself unchanged
    assert "XLA118" in _lint(program / "train.py").output


@pytest.mark.xla
@pytest.mark.xla
def test_the_conversion_runs_with_plain_python_where_the_original_ran(program, tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PJRT_DEVICE": "CPU"}
    original = subprocess.run([sys.executable, "train.py"], cwd=program, env=env, capture_output=True, text=True,
                              timeout=300)
    assert original.returncode == 0, original.stderr[-2000:]
    out = tmp_path / "converted"
    result = CliRunner().invoke(main, ["convert", "--no-cache", "-q", str(program), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "use_cuda = torch.cuda.is_available()" in (out / "train.py").read_text()
    converted = subprocess.run([sys.executable, "train.py"], cwd=out, env=env, capture_output=True, text=True,
                               timeout=300)
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert converted.stdout == original.stdout == "12.0\n"


@pytest.mark.xla
@pytest.mark.xla
def test_verify_says_which_kept_test_left_the_conversion_on_the_cpu(program, tmp_path):
    """The conversion runs, on the CPU (its test kept): verify fails it for
    doing no work on XLA, and says which test, where, and why."""
    import json

    old = os.getcwd()
    os.chdir(program)
    try:
        result = CliRunner().invoke(main, ["verify", "--json", str(tmp_path / "r.json"), "--reference-runs", "1",
                                           "train.py"])
    finally:
        os.chdir(old)
    report = json.loads((tmp_path / "r.json").read_text())
    assert result.exit_code == 1 and report["verdict"] == "fail", result.output
    [cpu] = [f for f in report["failures"] if f.startswith("the conversion did no work on XLA")]
    assert "xlaport kept 1 CUDA test(s) as they were" in cpu and "train.py:5: " in cpu, cpu
    assert "moving sparse `adj` (line 9)" in cpu


def test_a_module_imported_whole_is_read_too(program):
    """`import utils` then `utils.load_data()`: the same fact, through the
    module's name."""
    (program / "train.py").write_text(TRAIN.replace("from utils import load_data", "import utils").replace(
        "= load_data()", "= utils.load_data()"))
    found = _codes(_lint("--no-cache", program / "train.py").output)
    assert (5, "XLA118") in found and (9, "XLA158") in found, found


# -- tensors another module's function returns (TCN: `data_generator`) --------

GENERATOR_TENSORS = '''\
import torch
from torch.autograd import Variable


def data_generator(n, length):
    seq = torch.rand(n, length)
    x = torch.cat((seq, seq), 1)
    y = torch.zeros(n).long()
    return Variable(x), y


def sizes(x):
    return x.size(0), len(x)
'''

GENERATOR_LOADERS = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset


def data_generator(n, length):
    ds = TensorDataset(torch.rand(n, length), torch.zeros(n))
    return DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4)
'''

STEPS = '''\
import torch

from utils import data_generator

device = torch.device("cuda")
model = torch.nn.Linear(8, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train_x, train_y = data_generator(16, 8)
train_x = train_x.to(device)
for epoch in range(2):
    for batch in train_x:
        loss = model(batch).sum()
        loss.backward()
        opt.step()
'''


def test_which_functions_return_a_tensor_and_where_in_the_tuple(tmp_path):
    (tmp_path / "utils.py").write_text(GENERATOR_TENSORS)
    # made by torch (`Variable` is torch's too), through a method that keeps a
    # tensor (`.long()`); `.size(0)` and `len` are numbers
    assert tensor_returns(tmp_path / "utils.py") == {"data_generator": frozenset({0, 1})}
    (tmp_path / "utils.py").write_text(GENERATOR_LOADERS)
    assert tensor_returns(tmp_path / "utils.py") == {}


def test_a_function_named_like_a_model_holds_tensors_only_where_its_module_returns_them(tmp_path):
    """TCN's `data_generator` returns tensors in one program and loaders in
    another; the name (`generator`) said tensors for both: XLA407 on walking
    `train_loader`.  The project module that defines it says which."""
    root = tmp_path / "prog"
    root.mkdir()
    (root / "train.py").write_text(STEPS)
    (root / "utils.py").write_text(GENERATOR_TENSORS)
    assert (11, "XLA407") in _codes(_lint("--no-cache", root / "train.py").output)
    # (loaders are not moved: `pmnist_test.py` walks them as they come)
    (root / "train.py").write_text(STEPS.replace("train_x = train_x.to(device)\n", ""))
    assert (10, "XLA407") in _codes(_lint("--no-cache", root / "train.py").output)  # (the module's tensors)
    (root / "utils.py").write_text(GENERATOR_LOADERS)
    assert "XLA407" not in _lint("--no-cache", root / "train.py").output
    # a library's function named like a model: no tensor by its name alone
    (root / "train.py").write_text(STEPS.replace("train_x = train_x.to(device)\n", "").replace(
        "from utils import data_generator", "from somelib.data import data_generator"))
    assert "XLA407" not in _lint("--no-cache", root / "train.py").output
