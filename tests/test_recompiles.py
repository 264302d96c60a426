"""XLA409/XLA410 (codemods/recompiles.py): data-dependent control flow and
shapes that recompile, reported on their lines (issue 38, item 7); a host
coin choosing between two tensors chosen on the device (issue 40), and
fixtures/teacher_forcing run on XLA's CPU backend at two lengths against the
original on the CPU."""

import os
import subprocess
import sys

import pytest

from tests.conftest import convert_text
from xlaport.engine import Settings

from test_recompile_fixes import codes
from test_runnable_ports import FIXTURES, needs_xla, run_on_xla

COINS = '''\
import random
import numpy as np
import torch

model = model.cuda()
for t in range(1, T):
    out, h = model(inp, h)
    teacher_force = random.random() < ratio
    inp = trg[t] if teacher_force else out.argmax(1)
    p = np.random.random()
    if p > 0.5:
        h = model(h)
    idx = np.random.choice(np.arange(10), 3, replace=False)
    if len(idx) == 0:
        pass
    perm = np.random.permutation(5)
    if perm[0] not in bad:
        pass
if random.random() < 0.5:
    model = model.half()
'''


def test_a_coin_drawn_on_the_host_in_a_loop_is_reported_and_arrays_of_draws_are_not():
    out, findings = convert_text(COINS)
    # a flag bound to a comparison with a draw (teacher forcing), a draw compared in the test (layerdrop);
    # not numpy arrays of draws (data, not a choice), not a choice made once outside any loop
    assert [f.line for f in findings if f.code == "XLA409"] == [9, 11]
    # the conditional expression between two tensors chooses on the device (tests/test_recompile_fixes.py);
    # the `if` statement on a drawn number stays reported
    assert [f.fix for f in findings if f.code == "XLA409"] == [True, False]


def test_per_batch_padding_is_reported_only_in_code_being_ported():
    ported = ("import torch\nfrom torch.nn.utils.rnn import pad_sequence\n\n"
              "def collate(batch):\n    return pad_sequence(batch).cuda()\n")
    assert [f.line for f in convert_text(ported)[1] if f.code == "XLA410"] == [5]
    host_only = "from torch.nn.utils.rnn import pad_sequence\n\ndef collate(batch):\n    return pad_sequence(batch)\n"
    assert "XLA410" not in [f.code for f in convert_text(host_only)[1]]


# ------------------------------------------------------------------ XLA409
COIN = ("import random\nimport torch\n\nmodel = model.cuda()\n"
        "for t in range(1, T):\n    out, h = model(inp, h)\n    pred = out.argmax(1)\n"
        "    force = random.random() < ratio\n    inp = trg[t] if force else pred\n")


def test_a_host_coin_between_two_tensors_chooses_on_the_device():
    out, findings = convert_text(COIN)
    assert codes(findings, "XLA409") == [(9, True)]
    assert "    inp = torch.where(torch.tensor([force], device=pred.device)[0], trg[t], pred)\n" in out
    assert "    force = random.random() < ratio\n" in out  # the draw stays where it was


@pytest.mark.parametrize("side, device", [
    ("trg[:, t].unsqueeze(1) if force else pred", "pred"),  # a pure op of a batch's element
    ("trg[t] if force else torch.argmax(out, dim=1)", "out"),  # the device of the tensor the op reads
    ("trg[t] if force else out.max(1)[1]", "out"),
])
def test_the_spellings_of_teacher_forcing_on_real_programs_choose_on_the_device(side, device):
    out, findings = convert_text(COIN.replace("trg[t] if force else pred", side))
    assert codes(findings, "XLA409") == [(9, True)]
    then, other = side.split(" if force else ")
    assert f"inp = torch.where(torch.tensor([force], device={device}.device)[0], {then}, {other})" in out


@pytest.mark.parametrize("draw", [
    "torch.rand(1).item() < ratio",  # torch's CPU generator, read as a number (a seq2seq's teacher forcing)
    "ratio > torch.randint(0, 10, (1,)).item()",
])
def test_a_coin_drawn_by_torch_and_read_as_a_number_chooses_on_the_device(draw):
    out, findings = convert_text(COIN.replace("random.random() < ratio", draw))
    assert codes(findings, "XLA409") == [(9, True)], out
    assert "    inp = torch.where(torch.tensor([force], device=pred.device)[0], trg[t], pred)\n" in out
    assert f"    force = {draw}\n" in out  # the draw stays where it was, from the same generator


@pytest.mark.parametrize("draw", [
    "torch.rand(1) < ratio",  # a tensor compared: its truth is read by the `if`, not chosen here
    "torch.rand(4).mean() < ratio",
])
def test_torch_draws_not_read_as_one_number_are_not_coins(draw):
    out, findings = convert_text(COIN.replace("random.random() < ratio", draw))
    assert "XLA409" not in [f.code for f in findings] and "torch.where" not in out, out


@pytest.mark.parametrize("change", [
    ("inp = trg[t] if force else pred", "inp = model.embed(trg[t]) if force else pred"),  # a call: side effects
    ("inp = trg[t] if force else pred", "inp = trg[t] if force else None"),  # not a tensor
    ("    inp = trg[t] if force else pred\n", "    if force:\n        inp = trg[t]\n        n += 1\n    else:\n"
     "        inp = pred\n"),  # an `if` that does more than choose
])
def test_a_coin_that_cannot_move_to_the_device_stays_reported(change):
    out, findings = convert_text(COIN.replace(*change))
    assert [fix for _, fix in codes(findings, "XLA409")] == [False], out
    assert "torch.where" not in out




IF_ELSE = "    if force:\n        inp = trg[t]\n    else:\n        inp = pred\n"
WHERE = "    inp = torch.where(torch.tensor([force], device=pred.device)[0], trg[t], pred)\n"


@pytest.mark.parametrize("spelling, chosen", [
    (IF_ELSE, WHERE),  # the `if` statement most seq2seq programs write
    ("    inp = pred\n    if force:\n        inp = trg[t]\n",  # the guess, overridden by the truth
     "    inp = pred\n    inp = torch.where(torch.tensor([force], device=inp.device)[0], trg[t], inp)\n"),
    ("    if force:\n        dec[:, t] = trg[t]\n    else:\n        dec[:, t] = pred\n",
     "    dec[:, t] = torch.where(torch.tensor([force], device=pred.device)[0], trg[t], pred)\n"),
])
def test_teacher_forcing_as_an_if_statement_is_one_assignment_chosen_on_the_device(spelling, chosen):
    out, findings = convert_text(COIN.replace("    inp = trg[t] if force else pred\n", spelling))
    assert codes(findings, "XLA409") == [(9 + spelling.split("if force")[0].count("\n"), True)], out
    assert chosen in out, out
    assert "if force" not in out


def test_the_comments_of_the_branches_are_kept_above_the_assignment():
    spelling = ("    # teacher forcing\n    if force:  # the truth\n        inp = trg[t]\n    else:\n"
                "        # or the model's guess\n        inp = pred  # its argmax\n")
    out, _ = convert_text(COIN.replace("    inp = trg[t] if force else pred\n", spelling))
    assert ("    # teacher forcing\n    # the truth\n    # or the model's guess\n    # its argmax\n" + WHERE) in out, out


@pytest.mark.parametrize("spelling", [
    "    if force:\n        inp = trg[t]\n    elif h is None:\n        inp = pred\n",  # a third way
    "    if force:\n        inp = trg[t]\n    else:\n        other = pred\n",  # two different names
    "    if force:\n        inp = trg[t]\n",  # no value before it in this block: the old one may be unbound
    "    other = pred\n    if force:\n        inp = trg[t]\n",  # the statement before binds another name
    "    inp = None\n    if force:\n        inp = trg[t]\n",  # not a tensor before it
    "    if force:\n        inp = trg[t]\n    else:\n        inp = model.embed(pred)\n",  # a call: side effects
    "    if force:\n        inp, h = trg[t], h\n    else:\n        inp, h = pred, h\n",  # a tuple
])
def test_an_if_statement_that_is_not_one_choice_between_two_tensors_stays_reported(spelling):
    out, findings = convert_text(COIN.replace("    inp = trg[t] if force else pred\n", spelling))
    assert [fix for _, fix in codes(findings, "XLA409")] == [False], out
    assert "torch.where" not in out


@pytest.mark.xla
@needs_xla
def test_teacher_forcing_in_if_statements_compiles_once_and_prints_the_originals_numbers(tmp_path):
    """fixtures/teacher_forcing on XLA at 4 and 8 steps: one compile, one
    execution a step, the original's losses (on the CPU); with XLA409 off,
    a compile a step."""
    original = subprocess.run([sys.executable, str(FIXTURES / "teacher_forcing" / "input.py"), "--steps", "8"],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert original.returncode == 0, original.stderr
    runs = {n: run_on_xla("teacher_forcing", tmp_path / str(n), "--steps", str(n)) for n in (4, 8)}
    (a, _, _, _), (b, out8, _, _) = runs[4], runs[8]
    assert a["metrics"]["compiles"] == b["metrics"]["compiles"], (a, b)
    assert b["metrics"]["executions"] - a["metrics"]["executions"] == 4, (a, b)
    assert out8 == original.stdout
    kept = Settings(ignore=("XLA409",))
    grown = [run_on_xla("teacher_forcing", tmp_path / f"kept{n}", "--steps", str(n), settings=kept)[0]["metrics"]
             for n in (4, 8)]
    assert grown[1]["compiles"] > grown[0]["compiles"], grown



HELPER = '''\
import random
import torch
from torch import Tensor

model = model.cuda()


def teacher_forcing(out: Tensor, target: Tensor, ratio=0.5) -> Tensor:
    use_teacher_forcing = True if random.random() < ratio else False
    if use_teacher_forcing:
        inp = target.unsqueeze(0)
    else:
        inp = out.argmax(2)
    return inp


def decode(trg, h):
    inp = trg[0]
    for t in range(1, trg.shape[0]):
        out, h = model(inp, h)
        inp = teacher_forcing(out, trg[t])
    return h
'''


def test_a_coin_in_a_helper_the_decoder_loop_calls_chooses_on_the_device():
    """A helper called every time step draws the coin (a flag made with
    `True if coin else False`, its tensors known by their annotations):
    chosen on the device there; the flag itself is no choice to report."""
    out, findings = convert_text(HELPER)
    assert codes(findings, "XLA409") == [(10, True)], findings
    assert ("    inp = torch.where(torch.tensor([use_teacher_forcing], device=target.device)[0], "
            "target.unsqueeze(0), out.argmax(2))\n") in out, out
    # called once, outside any loop: one graph, nothing to choose on the device
    once = HELPER.replace("    for t in range(1, trg.shape[0]):\n        out, h = model(inp, h)\n"
                          "        inp = teacher_forcing(out, trg[t])\n",
                          "    out, h = model(inp, h)\n    inp = teacher_forcing(out, trg[1])\n")
    out, findings = convert_text(once)
    assert "XLA409" not in [f.code for f in findings] and "torch.where" not in out, out


@pytest.mark.parametrize("test, truth", [
    ("ratio and random.random() < ratio", "bool(ratio and random.random() < ratio)"),  # 0.0 where ratio is
    ("force and random.random() < 0.5", "force and random.random() < 0.5"),  # a bool already
    ("not force", "not force"),
])
def test_the_choice_is_sent_as_a_bool_whatever_the_test_evaluates_to(test, truth):
    """`torch.where` takes a bool tensor only: a test that may evaluate to a
    number (`ratio and ...` is `0.0` where `ratio` is) is sent as its truth,
    and the converted line runs where the original did."""
    import torch

    out, findings = convert_text(COIN.replace("trg[t] if force else pred", f"trg[t] if {test} else pred"))
    line = next(line.strip() for line in out.splitlines() if "torch.where" in line)
    assert line == f"inp = torch.where(torch.tensor([{truth}], device=pred.device)[0], trg[t], pred)", out
    for ratio in (0.0, 1.0):
        scope = {"torch": torch, "random": _Always(), "ratio": ratio, "force": ratio > 0.5,
                 "trg": torch.arange(6).view(2, 3), "t": 1, "pred": torch.zeros(3, dtype=torch.long)}
        exec(line, scope)
        assert scope["inp"].tolist() == ([3, 4, 5] if eval(test, scope) else [0, 0, 0])


class _Always:
    """A stand-in for `random` whose draw is always below the ratio."""

    @staticmethod
    def random():
        return -1.0
