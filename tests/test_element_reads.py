"""XLA416 (codemods/element_reads.py, the walk's conditions in
codemods/analysis/element_walks.py): a walk over a device tensor that reads
each element as a number reads the tensor once.  The rule's own examples run
in tests/test_rules.py; fixtures/element_reads is the golden program, run
here on XLA's CPU backend at two lengths against the original on the CPU and
against its conversion with the rule turned off."""

import os
import subprocess
import sys

import pytest

from tests.conftest import convert_text
from xlaport.engine import Settings, transform

from test_runnable_ports import FIXTURES, OBSERVER, needs_xla

LOOP = ("import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\n\n\ndef decode(loader, words):\n"
        "    for x in loader:\n        y = model(x.cuda()).argmax(-1)\n{body}")


def fixed(src):
    out, findings = convert_text(src)
    return out, [f.line for f in findings if f.code == "XLA416"]


@pytest.mark.parametrize("body, expected", [
    ("        words.append([int(i) for i in y])\n", "        words.append([int(i) for i in y.flatten().tolist()])\n"),
    ("        words.append({int(i): float(i) for i in y if bool(i)})\n",
     "        words.append({int(i): float(i) for i in y.flatten().tolist() if bool(i)})\n"),
    ("        words.append(sum(float(i) for i in y))\n",
     "        words.append(sum(float(i) for i in y.flatten().tolist()))\n"),
    ("        for i in y:\n            words.append(i.item())\n",
     "        for i in y.flatten().tolist():\n            words.append(i)\n"),
    # the element's name bound again by a later loop before it is read there
    ("        for i in y:\n            words.append(int(i))\n        for i in range(3):\n            words.append(i)\n",
     "        for i in y.flatten().tolist():\n            words.append(int(i))\n        for i in range(3):\n"
     "            words.append(i)\n"),
])
def test_a_walk_that_reads_numbers_reads_the_tensor_once(body, expected):
    out, lines = fixed(LOOP.format(body=body))
    assert lines == [9], out
    assert expected in out, out
    assert transform(out.encode(), Settings()).code.decode() == out  # idempotent


@pytest.mark.parametrize("body", [
    "        words.append([i.sum() for i in y])\n",  # the element used as a tensor
    "        words.append([int(i) + int(y[0]) for i in y])\n",  # the tensor named in the walk
    "        for i in y:\n            y[0] = int(i)\n",  # written while walked (its elements are views)
    "        for i in y:\n            words.append(int(i))\n        words.append(i)\n",  # read after the loop
    "        for i in y:\n            words.append(int(i))\n        else:\n            words.append(int(i))\n",
    "        g = (int(i) for i in y)\n        words.append(g)\n",  # consumed later: it walks the tensor as it is then
    "        words.append([int(i) for i in y.tolist()])\n",  # a host copy already
    "        words.append([int(i) for i in range(3)])\n",
    # the pieces of a split are a tuple of tensors: `.flatten()` is no method of a tuple
    "        parts = y.split(1)\n        words.append([int(i) for i in parts])\n",
    "        rows = y.unbind(0)\n        words.append([int(i) for i in rows])\n",
    "        halves = torch.chunk(y, 2)\n        words.append([int(i) for i in halves])\n",
])
def test_what_is_not_a_walk_for_numbers_is_left(body):
    out, lines = fixed(LOOP.format(body=body))
    assert lines == [], out
    assert ".flatten().tolist()" not in out


@pytest.mark.parametrize("body, expected", [
    ("        for k, i in enumerate(y):\n            words.append(int(i))\n",
     "        for k, i in enumerate(y.cpu()):\n"),
    ("        words.append([int(s * 10) for s in y])\n", "        words.append([int(s * 10) for s in y.cpu()])\n"),
    # the forums' confusion matrix: both tensors walked as host copies, their elements index a host tensor
    ("        conf = torch.zeros(4, 4)\n        for t, p in zip(y.view(-1), y.flatten()):\n"
     "            conf[t.long(), p.long()] += 1\n",
     "        for t, p in zip(y.view(-1).cpu(), y.flatten().cpu()):\n"),
    # the CIFAR-10 tutorial's count per class: a truth, and an index of a tuple of names
    ("        names = ('a', 'b', 'c', 'd')\n        for t, p in zip(y, y):\n            if t == p and not t < 0:\n"
     "                words[names[t]] += 1\n",
     "        for t, p in zip(y.cpu(), y.cpu()):\n"),
    # a list walked beside the tensor is left as it is (a literal one too)
    ("        for k, t in zip([1, 2, 3, 4], y):\n            words.append(k * int(t))\n",
     "        for k, t in zip([1, 2, 3, 4], y.cpu()):\n"),
    ("        for t, w in zip(y, words):\n            w.append(int(t))\n", "        for t, w in zip(y.cpu(), words):\n"),
])
def test_a_walk_that_uses_its_elements_on_the_host_walks_a_host_copy(body, expected):
    out, lines = fixed(LOOP.format(body=body))
    assert len(lines) == 1, out
    assert expected in out, out
    assert transform(out.encode(), Settings()).code.decode() == out  # idempotent


@pytest.mark.parametrize("body", [
    "        for i in y:\n            words.append(int(i * y.sum()))\n",  # the tensor named in the walk
    "        for i in y:\n            words.append(float(model.weight[i]))\n",  # an index of a device tensor
    "        words.append([i for i in y])\n",  # the element kept: a tensor outside the walk
    "        words.append([int(i * k) for i in y])\n",  # arithmetic with a value of unknown kind (a tensor?)
    "        for i in y:\n            if i == k:\n                words.append(1)\n",
    "        for i in y:\n            words.append(int(i))\n            i = i + 1\n",  # bound again in the walk
    "        for k, i in enumerate(y):\n            words.append(int(i))\n        words.append(i)\n",  # read after
    "        for v in y.max(0):\n            words.append(float(v))\n",  # the values and the indices: a tuple
    "        for t, w in zip(y, words):\n            w.append(t)\n",
])
def test_what_is_not_a_host_walk_is_left(body):
    out, lines = fixed(LOOP.format(body=body))
    assert lines == [], out
    assert ".cpu()" not in out.split("def decode", 1)[1], out


INDEXED = ("import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nclasses = ('a', 'b', 'c', 'd')\n\n\n"
           "def count(loader, correct, total):\n    for x, labels in loader:\n        labels = labels.cuda()\n"
           "        pred = model(x.cuda()).argmax(-1)\n        c = (pred == labels).squeeze()\n{body}")


def test_an_index_walk_indexes_host_copies_made_once_before_the_loop():
    """The older CIFAR-10 tutorial: ``label = labels[i]``, ``c[i].item()``."""
    body = ("        for i in range(4):\n            label = labels[i]\n            correct[classes[label]] += c[i].item()\n"
            "            total[classes[label]] += 1\n")
    out, findings = convert_text(INDEXED.format(body=body))
    assert [f.line for f in findings if f.code == "XLA416"] == [12], out
    assert ("        c_host = c.cpu()\n        labels_host = labels.cpu()\n        for i in range(4):\n"
            "            label = labels_host[i]\n            correct[classes[label]] += c_host[i].item()\n") in out, out
    assert transform(out.encode(), Settings()).code.decode() == out  # idempotent
    # a tensor on the host already is indexed as it is
    host = INDEXED.replace("        c = (pred == labels).squeeze()\n", "        c = (pred == labels).squeeze().cpu()\n")
    out = convert_text(host.format(body=body))[0]
    assert "        labels_host = labels.cpu()\n        for i in range(4):\n" in out and "c_host" not in out, out
    # a name the module already has is not taken for the copy
    taken = INDEXED.replace("classes = ", "c_host = 1\nclasses = ").format(body=body)
    assert "c_host_1 = c.cpu()" in convert_text(taken)[0]


@pytest.mark.parametrize("body", [
    "        for i in range(4):\n            correct[0] += c[i]\n",  # a tensor kept: summed on the device
    "        for i in range(4):\n            labels[i] = 0\n",  # written
    "        for i in range(4):\n            label = labels[i]\n            correct[label] += 1\n        print(label)\n",
    "        for i in range(4):\n            label = labels[i]\n            label = label + 1\n            correct[int(label)] += 1\n",
    "        for i in range(4):\n            correct[int(labels[i])] += int(labels[0])\n",  # named otherwise
    "        for i in range(4):\n            correct[0] += float(model.weight[labels[i]].sum())\n",  # a device index
    "        for i in range(labels.size(0)):\n            correct[0] += float(c[i] * labels)\n",
    # taken only sometimes (minGPT's demo prints a few mistakes): a copy every batch would read more
    "        for i in range(4):\n            if total[0] < 3:\n                print(c[i].tolist())\n",
])
def test_what_is_not_an_index_walk_is_left(body):
    out, findings = convert_text(INDEXED.format(body=body))
    assert "XLA416" not in [f.code for f in findings], out
    assert "_host" not in out


def test_a_deferred_print_does_not_bind_its_comprehensions_own_name():
    """The print rule binds what a deferred print reads as lambda defaults;
    a comprehension's own name is not the step's (`i=i` raised NameError
    where the lambda was made)."""
    src = LOOP.format(body="        print(''.join([str(int(i)) for i in y]))\n")
    out, findings = convert_text(src)
    assert "lambda y=y: print(" in out, out
    assert "i=i" not in out
    # the walk is read once in the print, before the print is deferred (in the step closure it would still
    # take a graph per element)
    assert "xm.add_step_closure(lambda y=y: print(''.join([str(int(i)) for i in y.flatten().tolist()])))" in out
    assert {"XLA210", "XLA416"} <= {f.code for f in findings if f.line == 9}
    assert transform(out.encode(), Settings()).code.decode() == out  # idempotent


def _run(script, cwd, n, xla):
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    if xla:
        env.update(PYTHONPATH=str(OBSERVER), XLAPORT_TEST_METRICS=str(cwd / f"m{n}.json"))
    done = subprocess.run([sys.executable, script, "--batches", str(n)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.xla
@needs_xla
def test_the_walks_run_one_execution_a_batch_and_print_the_originals_lines(tmp_path):
    import json

    original = _run(str(FIXTURES / "element_reads" / "input.py"), tmp_path, 8, xla=False)
    source = (FIXTURES / "element_reads" / "input.py").read_bytes()
    runs = {}
    for name, settings in (("fixed", Settings()), ("left", Settings(ignore=("XLA416",)))):
        work = tmp_path / name
        work.mkdir()
        (work / "main.py").write_bytes(transform(source, settings).code)
        out = {n: _run("main.py", work, n, xla=True) for n in (4, 8)}
        runs[name] = {n: json.loads((work / f"m{n}.json").read_text()) for n in (4, 8)}
        assert out[8] == original  # the same labels, sums and counts, line for line
    fixed_runs, left = runs["fixed"], runs["left"]
    assert fixed_runs[8]["compiles"] == fixed_runs[4]["compiles"], fixed_runs
    per_batch = (fixed_runs[8]["executions"] - fixed_runs[4]["executions"]) / 4
    per_batch_left = (left[8]["executions"] - left[4]["executions"]) / 4
    # measured: 3 compiles, 3 executions a batch (one read a walk); left: 13 compiles, 25 executions a batch
    assert per_batch <= 3, runs  # one read a walk
    assert per_batch_left >= 18, runs  # an element a graph: 3 walks of 6 elements
    assert fixed_runs[8]["compiles"] < left[8]["compiles"], runs
    assert not fixed_runs[8]["fallbacks"], runs  # (left: `aten::_local_scalar_dense` per element)


@pytest.mark.xla
@needs_xla
def test_counts_per_class_and_a_confusion_matrix_read_each_batch_once(tmp_path):
    """fixtures/element_metrics on XLA at 3 and 6 batches of 4: compiles flat,
    a few reads a batch instead of two graphs an element (measured: 4
    compiles, 5 executions a batch; with XLA416 off 21 compiles, 95 -> 183
    executions at 3 -> 6), and the original's counts, matrix and scores."""
    from test_step_calls import at_two_lengths, original_output

    a, _, b, out = at_two_lengths("element_metrics", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] <= 4 and b["executions"] - a["executions"] <= 3 * 5, (a, b)
    assert out == original_output("element_metrics", "--steps", "6")


@pytest.mark.xla
@needs_xla
def test_an_index_walk_runs_one_execution_a_batch_with_the_originals_counts(tmp_path):
    """fixtures/index_metrics (the older CIFAR-10 tutorial's count per class)
    on XLA at 3 and 6 batches: measured 9 compiles and 21 executions a batch
    before, 1 compile and one execution a batch after; the original's lines."""
    from test_step_calls import one_execution_a_step, original_output

    out = one_execution_a_step("index_metrics", tmp_path)
    assert out == original_output("index_metrics", "--steps", "6")


HANDED = ("import torch\n\n\nclass Flow:\n    def __init__(self, model):\n        self.model = model\n\n"
          "    def forward(self, x):\n        t = torch.sigmoid(self.model(x).sum(1))\n"
          "        tlist = t.detach().cpu().tolist()\n        pairs = [(tv, tl) for tv, tl in zip(t, tlist)]\n"
          "        return t.mean(), pairs\n\n\nmodel = torch.nn.Linear(4, 4).cuda()\nflow = Flow(model)\n"
          "bins = {{i: 0.0 for i in range(10)}}\nfor x in loader:\n    loss, pairs = flow.forward(x.cuda())\n"
          "    loss.backward()\n{caller}")
WALKED = "    for t, l in pairs:\n        bins[int(t * 10)] += l\n"


def test_pairs_of_device_elements_handed_back_to_a_caller_that_bins_them_walk_a_host_copy():
    """minRF's `RF.forward`: the pairs leave the method; its one caller uses the device elements only on the host."""
    out, lines = fixed(HANDED.format(caller=WALKED))
    assert lines == [11], out
    assert "pairs = [(tv, tl) for tv, tl in zip(t.cpu(), tlist)]" in out
    assert fixed(out)[0] == out


@pytest.mark.parametrize("caller", [
    WALKED + "    kept.append(pairs)\n",  # the pairs read elsewhere
    "    for t, l in pairs:\n        kept.append(t)\n",  # an element kept (a device tensor there)
    "    for t, l in pairs:\n        bins[int(t * 10)] += l\n        x = x + t\n",  # an element on the device
    WALKED + "    step = flow.forward\n",  # the method named, not called: who else walks its pairs?
    WALKED + "    print(t)\n",  # the element read after the loop
])
def test_handed_back_pairs_a_caller_may_use_on_the_device_are_left(caller):
    out, lines = fixed(HANDED.format(caller=caller))
    assert lines == [] and "zip(t, tlist)" in out, out


@pytest.mark.parametrize("made", [
    "t = self.times",  # state the caller's step may change in place: its views would show it, a copy not
    "t = self.times.view(-1)",
    "t = self.next_times()",
])
def test_pairs_of_a_tensor_the_function_did_not_make_are_left(made):
    src = HANDED.format(caller=WALKED).replace("t = torch.sigmoid(self.model(x).sum(1))", made).replace(
        "        self.model = model\n", "        self.model = model\n        self.times = torch.rand(4).cuda()\n\n"
        "    def next_times(self):\n        return self.times\n")
    out, lines = fixed(src)
    assert lines == [] and "zip(t, tlist)" in out, out


def test_a_comprehension_that_does_more_than_regroup_is_not_a_handed_back_walk():
    src = HANDED.format(caller=WALKED).replace("[(tv, tl) for tv, tl in zip(t, tlist)]",
                                                "[(tv * 2, tl) for tv, tl in zip(t, tlist)]")
    out, lines = fixed(src)
    assert lines == [] and "zip(t, tlist)" in out


def test_a_module_another_module_imports_keeps_its_handed_back_pairs(tmp_path):
    """Another module may call the method and use the elements on the device."""
    (tmp_path / "flow.py").write_text(HANDED.format(caller=WALKED))
    (tmp_path / "other.py").write_text("from flow import Flow\n")
    out = transform((tmp_path / "flow.py").read_bytes(), Settings(), filename=str(tmp_path / "flow.py"))
    assert "zip(t, tlist)" in out.code.decode() and not [f for f in out.findings if f.code == "XLA416"]


@pytest.mark.xla
@needs_xla
def test_handed_back_pairs_run_flat_with_the_originals_bins(tmp_path):
    """fixtures/handed_pairs (minRF's loss bins) on XLA at 3 and 6 steps of 16
    samples: measured 18 compiles and 34 executions a step before, 3 compiles
    and 3 executions a step after (the read before the backward, reported as
    XLA402, the host copy, the barrier); the CPU original's bins."""
    from test_step_calls import at_two_lengths, original_output

    a, _, b, out = at_two_lengths("handed_pairs", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] <= 3 and b["executions"] - a["executions"] <= 3 * 3, (a, b)
    assert out == original_output("handed_pairs", "--steps", "6")
