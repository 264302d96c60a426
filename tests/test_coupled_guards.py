"""CUDA tests tied by what they share get one answer (XLA116,
codemods/analysis/coupled_guards.py): a test XLA would take, whose side
changes what a test XLA116 turns the other way reads, is turned with it."""

import pytest

from tests.conftest import convert_text
from tests.test_switches import HAVE_XLA, _original_and_conversion

# the shape of torchvision's and DeiT's `MetricLogger.log_every`
LOG_EVERY = '''\
import torch


def log_every(steps, every):
    log_msg = ["[{step}]", "sum {total:.1f}"]
    if torch.cuda.is_available():
        log_msg.append("max mem: {memory:.0f}")
    log_msg = "  ".join(log_msg)
    total = 0.0
    for step in steps:
        total += step
        yield step
        if step % every == 0:
            if torch.cuda.is_available():
                print(log_msg.format(step=step, total=total, memory=torch.cuda.max_memory_allocated() / 2**20))
            else:
                print(log_msg.format(step=step, total=total))


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.ones(3, device=device)
for step in log_every(range(4), 2):
    x = x * 2
print(x.sum().item(), x.device.type != "cpu")
'''


def test_a_test_whose_side_changes_what_the_kept_side_reads_is_answered_with_it():
    """Before: the first test became `if True:` and the message asked for a
    `memory` the kept side does not pass (KeyError on XLA, where the original
    ran on the CPU)."""
    out, findings = convert_text(LOG_EVERY)
    assert "max mem" not in out and "max_memory_allocated" not in out
    assert "is_available" not in out and "device = torch_xla.device()" in out  # (the device choice is still XLA's)
    tied = [f for f in findings if f.code == "XLA116" and f.line == 6]
    assert tied and "line 14" in tied[0].message and "`log_msg`" in tied[0].message


def test_what_the_dropped_side_binds_ties_a_later_test_that_reads_it():
    source = ("import torch\n\n\ndef report():\n    if torch.cuda.is_available():\n"
              "        peak = torch.cuda.max_memory_allocated()\n    print('done')\n"
              "    if torch.cuda.is_available():\n        print(peak)\n")
    out, findings = convert_text(source)
    assert "peak" not in out and "print('done')" in out
    assert [f.line for f in findings if f.code == "XLA116"] == [5, 8]


def test_tests_that_share_nothing_are_decided_each_on_its_own():
    source = ("import torch\n\n\ndef setup(model):\n    if torch.cuda.is_available():\n"
              "        model = model.cuda()\n    if torch.cuda.is_available():\n"
              "        print(torch.cuda.max_memory_allocated())\n    return model\n")
    out, findings = convert_text(source)
    assert "model = model.to(" in out and "max_memory_allocated" not in out
    assert [f.line for f in findings if f.code == "XLA116"] == [7]


def test_a_test_of_another_function_is_not_tied():
    source = ("import torch\n\nlog_msg = []\n\n\ndef a():\n    if torch.cuda.is_available():\n"
              "        log_msg.append('x')\n\n\ndef b():\n    if torch.cuda.is_available():\n"
              "        print(log_msg, torch.cuda.max_memory_allocated())\n")
    out, findings = convert_text(source)
    assert "log_msg.append('x')" in out
    assert [f.line for f in findings if f.code == "XLA116"] == [12]


def test_a_closure_shares_its_enclosing_functions_names():
    source = ("import torch\n\n\ndef run(steps):\n    fmt = ['{i}']\n    if torch.cuda.is_available():\n"
              "        fmt.append('{mem}')\n\n    def show(i):\n        if torch.cuda.is_available():\n"
              "            print(' '.join(fmt).format(i=i, mem=torch.cuda.memory_allocated()))\n"
              "        else:\n            print(' '.join(fmt).format(i=i))\n\n    for i in steps:\n"
              "        show(i)\n")
    out, findings = convert_text(source)
    assert "{mem}" not in out and "memory_allocated" not in out
    assert [f.line for f in findings if f.code == "XLA116"] == [6, 10]


def test_the_answer_is_idempotent():
    once = convert_text(LOG_EVERY)[0]
    assert convert_text(once)[0] == once


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_the_log_every_program_runs_on_xla_as_on_the_cpu(tmp_path):
    original, converted = _original_and_conversion(LOG_EVERY, tmp_path)
    assert original == "[0]  sum 0.0\n[2]  sum 3.0\n48.0 False\n"
    assert converted == original.replace("False", "True")
