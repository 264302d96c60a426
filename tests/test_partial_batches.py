"""XLA413 (codemods/partial_batches.py): a DataLoader that keeps its last,
partial batch is reported where it is made, its keywords read through the
dicts pytorch/examples builds them in; fixtures/partial_batches shows on
XLA's CPU backend what the report claims (one graph more for each loader,
the same however many epochs) and why it is not rewritten by default
(``drop_last`` changes the numbers); fixtures/drop_last, what
``--unsafe-fixes`` makes of a shuffled loader (``drop_last=True``)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import convert_text

import test_runnable_ports
from test_runnable_ports import FIXTURES, needs_xla, run_on_xla

HEAD = "import torch\nfrom torch.utils.data import DataLoader\n\ndevice = torch.device('cuda')\n"


def reported(source: str):
    return [(f.line, f.message) for f in convert_text(HEAD + source)[1] if f.code == "XLA413"]


def test_keywords_read_through_the_dicts_and_updates_pytorch_examples_builds():
    found = reported(
        "train_kwargs = {'batch_size': args.batch_size}\n"
        "test_kwargs = {'batch_size': args.test_batch_size}\n"
        "cuda_kwargs = {'num_workers': 1, 'pin_memory': True, 'shuffle': True}\n"
        "train_kwargs.update(cuda_kwargs)\n"
        "train_loader = torch.utils.data.DataLoader(ds, **train_kwargs)\n"
        "test_loader = torch.utils.data.DataLoader(ds, **test_kwargs)\n")
    assert [line for line, _ in found] == [9, 10]
    # the shuffled one is told drop_last; the other one (an evaluation loader) to pad
    assert "`drop_last=True` suits a shuffled training loader" in found[0][1]
    assert "args.batch_size" in found[0][1]
    assert "drop_last" not in found[1][1] and "pad its dataset to a multiple of `args.test_batch_size`" in found[1][1]


@pytest.mark.parametrize("call", [
    "DataLoader(ds, 32, True, None, None, 0, None, False, True)",  # drop_last by position
    "DataLoader(ds, batch_size=1)",
    "DataLoader(ds, batch_size=None)",
    "DataLoader(ds, batch_size=8, drop_last=args.drop_last)",
    "DataLoader(ds, batch_sampler=sampler)",
    "DataLoader(ds, *args)",
])
def test_a_loader_without_partial_batches_or_whose_choice_is_made_at_run_time_is_left(call):
    assert reported(f"loader = {call}\n") == []


def test_a_dict_whose_keys_cannot_all_be_read_is_left():
    assert reported("def make(kw):\n    return DataLoader(ds, **kw)\n") == []
    assert reported("kw = {'batch_size': 8}\nkw.update(other())\nloader = DataLoader(ds, **kw)\n") == []
    assert reported("kw = {'batch_size': 8}\nkw[key] = True\nloader = DataLoader(ds, **kw)\n") == []
    # a key set by subscript counts: here drop_last, when the run asks for it
    assert reported("kw = {'batch_size': 8}\nif args.drop:\n    kw['drop_last'] = True\n"
                    "loader = DataLoader(ds, **kw)\n") == []
    assert [line for line, _ in reported("kw = dict(batch_size=8, shuffle=True)\n"
                                         "loader = DataLoader(ds, **kw, num_workers=2)\n")] == [6]


def test_a_sampler_counts_as_shuffling_unless_it_is_sequential():
    random = reported("loader = DataLoader(ds, 16, sampler=DistributedSampler(ds))\n")
    ordered = reported("loader = DataLoader(ds, 16, sampler=SequentialSampler(ds))\n")
    assert "drop_last" in random[0][1] and "drop_last" not in ordered[0][1]


def _run(name, tmp_path, *args):
    result, stdout, _, _ = run_on_xla(name, tmp_path, *args)
    return result["metrics"], stdout


@pytest.mark.xla
@needs_xla
def test_the_partial_batch_costs_a_graph_per_loader_once_and_drop_last_would_change_the_numbers(tmp_path, monkeypatch):
    full, _ = _run("partial_batches", tmp_path / "a", "--rows", "12")
    one, out1 = _run("partial_batches", tmp_path / "b", "--rows", "14")
    two, out2 = _run("partial_batches", tmp_path / "c", "--rows", "14", "--epochs", "2")
    # 14 rows in batches of 4: a batch of 2 in training and in evaluation, one graph more each,
    # compiled in the first epoch only
    assert one["compiles"] == full["compiles"] + 2, (full, one)
    assert two["compiles"] == one["compiles"], (one, two)
    # the conversion prints the original's numbers
    original = subprocess.run([sys.executable, str(FIXTURES / "partial_batches" / "input.py"), "--rows", "14",
                               "--epochs", "2"], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert original.returncode == 0, original.stderr
    assert out2 == original.stdout
    # the fix the report names, made by hand: the graphs of 12 rows, but other numbers
    fixtures = tmp_path / "fixtures"
    (fixtures / "partial_batches").mkdir(parents=True)
    source = (FIXTURES / "partial_batches" / "input.py").read_text()
    (fixtures / "partial_batches" / "input.py").write_text(
        source.replace('{"batch_size": 4}', '{"batch_size": 4, "drop_last": True}'))
    monkeypatch.setattr(test_runnable_ports, "FIXTURES", fixtures)
    dropped, out_dropped = _run("partial_batches", tmp_path / "d", "--rows", "14", "--epochs", "2")
    assert dropped["compiles"] == full["compiles"], (full, dropped)
    assert out_dropped != out2


def test_code_being_ported_through_torch_accelerator_is_told_as_well():
    """pytorch/examples' mnist names no CUDA: it asks ``torch.accelerator``,
    which is CUDA on a CUDA host (analysis.cuda.being_ported)."""
    source = ("import torch\nfrom torch.utils.data import DataLoader\n\n"
              "device = torch.accelerator.current_accelerator()\nloader = DataLoader(ds, batch_size=8)\n")
    assert [f.line for f in convert_text(source)[1] if f.code == "XLA413"] == [5]
    host = "import torch\nfrom torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=8)\n"
    assert [f.code for f in convert_text(host)[1]] == []


def test_a_loader_read_for_its_first_batch_only_is_left():
    """pytorch/examples' mnist_forward_forward takes one batch of each loader."""
    assert reported("x, y = next(iter(DataLoader(ds, batch_size=64)))\n") == []
    assert reported("def main():\n    dl = DataLoader(ds, batch_size=64)\n    x, y = next(iter(dl))\n") == []
    both = "def main():\n    dl = DataLoader(ds, batch_size=64)\n    x, y = next(iter(dl))\n    for b in dl:\n        f(b)\n"
    assert [line for line, _ in reported(both)] == [6]
    assert [line for line, _ in reported("dl = DataLoader(ds, batch_size=64)\nit = iter(dl)\n")] == [5]


def test_verify_ties_the_graph_of_the_last_batch_to_the_loader_lint_reported():
    """What verify saw on fixtures/partial_batches (`--rows 14 --epochs 2`):
    a graph compiled once more in each loop and run again the next epoch."""
    from xlaport.verify.predicted import predicted

    path = str(FIXTURES / "partial_batches" / "input.py")
    lines = (FIXTURES / "partial_batches" / "input.py").read_text().splitlines()
    at = {text: next(i for i, line in enumerate(lines, 1) if text in line)
          for text in ("for inputs, labels in train_loader", "correct += ", "train_loader = DataLoader",
                       "test_loader = DataLoader")}
    events = [{"kind": "recurring", "original_path": path, "original_line": at[key], "detail": "d"}
              for key in ("for inputs, labels in train_loader", "correct += ")]
    events.append({"kind": "new_graph", "original_path": path, "original_line": 1, "detail": "d"})  # in no loop
    predicted(events)
    assert [e.get("predicted") for e in events] == [
        f"XLA413 at line {at['train_loader = DataLoader']}", f"XLA413 at line {at['test_loader = DataLoader']}", None]
    assert events[0]["detail"] == f"d; the last, smaller batch of the loader made at line " \
                                  f"{at['train_loader = DataLoader']} (predicted by XLA413)"


# -- the unsafe fix: `drop_last=True` on a shuffled loader (--unsafe-fixes) ---

UNSAFE = {"options": {"unsafe_fixes": True}}


def test_an_unsafe_fix_drops_the_last_batch_of_a_shuffled_loader_only():
    source = HEAD + ("train = DataLoader(\n    ds,\n    batch_size=4,\n    shuffle=True,\n)\n"
                     "kw = {'batch_size': 8, 'shuffle': True}\nother = DataLoader(ds, **kw)\n"
                     "test = DataLoader(ds, batch_size=4)\n"
                     "kept = DataLoader(ds, batch_size=4, shuffle=True, drop_last=False)\n")
    out, findings = convert_text(source, **UNSAFE)
    # laid out as written: a trailing comma stays trailing; after a ** dict whose keys hold no drop_last
    assert "    shuffle=True,\n    drop_last=True,\n)\n" in out
    assert "other = DataLoader(ds, **kw, drop_last=True)\n" in out
    # unshuffled (an evaluation loader: its metric needs every row), or drop_last=False written: said, left
    assert "test = DataLoader(ds, batch_size=4)\n" in out and "drop_last=False)\n" in out
    said = {f.line: f for f in findings if f.code == "XLA413"}
    assert sorted(said) == [5, 11, 12, 13] and [said[n].fix for n in (5, 11, 12, 13)] == [True, True, False, False]
    assert "an unsafe fix: every epoch leaves out its last `len(dataset) % 4` rows" in said[5].message
    again, more = convert_text(out, **UNSAFE)
    assert again == out and not [f for f in more if f.fix and f.code == "XLA413"]
    # by default: reported, with the way to ask for it; the two it would fix are hidden fixes
    plain, reports = convert_text(source)
    assert "drop_last=True" not in plain
    assert "(`--unsafe-fixes` adds it)" in [f.message for f in reports if f.code == "XLA413"][0]
    hidden = {f.line: f.unsafe_fix for f in reports if f.code == "XLA413"}
    assert hidden == {5: True, 11: True, 12: False, 13: False}
    assert not [f for f in findings if f.unsafe_fix]  # (made: none hidden)


EVALUATION = (
    "def test(model, loader):\n    model.eval()\n    with torch.no_grad():\n"
    "        for x, y in loader:\n            print(model(x.cuda()).sum())\n"
    "    print(len(loader.dataset))\n\n\n"
    "@torch.no_grad()\ndef check(model):\n    for i, (x, y) in enumerate(tqdm(checked, desc='check')):\n"
    "        print(model(x.cuda()).sum())\n\n\n"
    "test_loader = DataLoader(ds, batch_size=4, shuffle=True)\n"
    "checked = DataLoader(ds, batch_size=4, shuffle=True)\n"
    "test(model, test_loader)\ncheck(model)\n"
)


def test_a_shuffled_loader_walked_only_with_autograd_off_is_an_evaluation_loader_and_keeps_its_rows():
    """pytorch/examples' mnist shuffles its test loader too (its CUDA
    keywords go to both): handed to ``test()``, walked under
    ``torch.no_grad()``, its metric counts every row; it is told to pad,
    and no unsafe fix drops its rows."""
    source = HEAD + "from tqdm import tqdm\n\n" + EVALUATION
    out, findings = convert_text(source, **UNSAFE)
    assert "drop_last" not in out, out
    said = [f for f in findings if f.code == "XLA413"]
    assert [(f.line, f.fix, f.unsafe_fix) for f in said] == [(21, False, False), (22, False, False)], said
    assert all("it is an evaluation loader (its loops run under `torch.no_grad()`): pad its dataset to a multiple "
               "of `4`" in f.message for f in said)
    assert not [f for f in convert_text(source)[1] if f.unsafe_fix]  # (no hidden fix either)


@pytest.mark.parametrize("more", [
    "for x, y in test_loader:\n    loss = model(x.cuda()).sum()\n    loss.backward()\n",  # also trained on
    "fit(model, test_loader)\n",  # handed to a function not of the module: may train on it
    "loaders = [test_loader]\n",  # kept: walked nobody knows where
    "with torch.no_grad():\n    for x, y in test_loader:\n        model(x.cuda()).sum().backward()\n",
])
def test_a_shuffled_loader_that_may_be_trained_on_still_gets_drop_last(more):
    source = HEAD + "from tqdm import tqdm\n\n" + EVALUATION + more
    out, findings = convert_text(source, **UNSAFE)
    assert "test_loader = DataLoader(ds, batch_size=4, shuffle=True, drop_last=True)\n" in out, out
    assert "checked = DataLoader(ds, batch_size=4, shuffle=True)\n" in out


def test_the_unsafe_fix_is_asked_for_on_the_command_line_or_in_the_config(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from xlaport.cli import main

    monkeypatch.setenv("XLAPORT_CACHE_DIR", str(tmp_path / "cache"))
    source = HEAD + "loader = DataLoader(ds, batch_size=4, shuffle=True)\n"
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "train.py").write_text(source)

    def converted(*args):
        result = CliRunner().invoke(main, ["convert", "--diff", *args, str(prog / "train.py")])
        assert result.exit_code in (0, 1), result.output
        return "+loader = DataLoader(ds, batch_size=4, shuffle=True, drop_last=True)" in result.output

    # (each answer from the cache the second time: the option is part of its key)
    assert [converted(), converted("--unsafe-fixes"), converted(), converted("--unsafe-fixes")] == [
        False, True, False, True]
    (prog / "pyproject.toml").write_text("[tool.xlaport]\nunsafe-fixes = true\n")
    assert converted() and not converted("--no-unsafe-fixes")
    # Ruff's summary line for what the option would fix, in text; a field in JSON; the same from the cache
    (prog / "pyproject.toml").unlink()
    for _ in range(2):
        lint = CliRunner().invoke(main, ["lint", str(prog / "train.py")])
        assert "1 hidden fix can be enabled with the `--unsafe-fixes` option" in lint.output, lint.output
        assert "`xlaport explain XLA413`" in lint.output
        as_json = CliRunner().invoke(main, ["lint", "--format", "json", str(prog / "train.py")])
        rows = [r for r in json.loads(as_json.stdout)["findings"] if r["code"] == "XLA413"]
        assert [r.get("unsafe_fix") for r in rows] == [True]
    made = CliRunner().invoke(main, ["lint", "--unsafe-fixes", str(prog / "train.py")])
    assert "hidden fix" not in made.output and "XLA413" in made.output
    (prog / "pyproject.toml").write_text("[tool.xlaport]\nunsafe-fixes = 'yes'\n")
    bad = CliRunner().invoke(main, ["convert", "--diff", str(prog / "train.py")])
    assert bad.exit_code == 2 and "unsafe-fixes must be true or false" in bad.output


@pytest.mark.xla
@needs_xla
def test_the_unsafe_fix_leaves_the_training_steps_one_graph_at_two_lengths(tmp_path):
    """fixtures/drop_last converted with --unsafe-fixes: 12 rows and 14 rows
    compile the training step once (the shuffled loader drops its last 2
    rows); only the evaluation loader, reported, compiles once more.  The
    numbers are the original's with `drop_last=True` made by hand."""
    from xlaport.engine import Settings

    def run(tag, *args):
        result, stdout, _, _ = run_on_xla("drop_last", tmp_path / tag, *args,
                                          settings=Settings(options={"unsafe_fixes": True}))
        return result["metrics"], stdout

    full, _ = run("a", "--rows", "12")
    one, _ = run("b", "--rows", "14")
    two, out2 = run("c", "--rows", "14", "--epochs", "2")
    assert one["compiles"] == full["compiles"] + 1, (full, one)  # the evaluation forward's smaller batch only
    assert two["compiles"] == one["compiles"], (one, two)
    by_hand = tmp_path / "by_hand.py"
    by_hand.write_text((FIXTURES / "drop_last" / "input.py").read_text().replace(
        "shuffle=True,\n    )", "shuffle=True,\n        drop_last=True,\n    )"))
    assert "drop_last=True" in by_hand.read_text()
    original = subprocess.run([sys.executable, str(by_hand), "--rows", "14", "--epochs", "2"], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert original.returncode == 0, original.stderr
    assert out2 == original.stdout
