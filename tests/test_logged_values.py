"""XLA421 (codemods/logged_values.py): the values a step stores in a dict for
its log with ``.item()`` stay on the device and are read in the log's block,
after the step's barrier."""

import libcst as cst
import pytest

from tests.conftest import convert_text
from tests.test_runnable_ports import needs_xla
from tests.test_step_calls import at_two_lengths, original_output

STEP = """\
import torch


def train(model, opt, batches, log_every):
    for i, (x, y) in enumerate(batches):
        loss = model(x.cuda(), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
{middle}
"""

LOGGED = """\
        log = {}
        log["loss"] = loss.item()
        log["acc"] = (y.cuda() == 1).float().mean().item()
        if i % log_every == 0:
            print(log)
"""


def _logged(src: str):
    out, findings = convert_text(src)
    return out, [(f.line, f.fix) for f in findings if f.code == "XLA421"], [f.code for f in findings]


def test_the_values_stay_on_the_device_and_the_log_reads_them_after_the_barrier():
    out, found, codes = _logged(STEP.format(middle=LOGGED))
    assert found == [(10, True)], out
    assert '        log["loss"] = loss.detach()\n' in out
    assert '        log["acc"] = (y.to(torch_xla.device()) == 1).float().mean().detach()\n' in out
    assert ("        if i % log_every == 0:\n            torch_xla.sync()\n"
            "            log = {key: value.item() for key, value in log.items()}\n            print(log)\n") in out
    assert "XLA401" not in codes  # neither the reads it moved nor the one it wrote (after a barrier) are reported
    cst.parse_module(out)
    again, found_again, _ = _logged(out)
    assert again == out and found_again == []


def test_the_read_back_gives_the_numbers_item_gave():
    """What the block's first line makes of the kept tensors: the Python
    numbers, of the kinds, that ``.item()`` gave at the store."""
    import torch

    out, _, _ = _logged(STEP.format(middle=LOGGED))
    line = next(n.strip() for n in out.splitlines() if "for key, value in" in n)
    values = {"loss": torch.tensor(0.25), "count": torch.tensor(3), "flag": torch.tensor(True)}
    space = {"log": {k: v.detach() for k, v in values.items()}}
    exec(line, space)
    assert space["log"] == {k: v.item() for k, v in values.items()}
    assert [type(v) for v in space["log"].values()] == [float, int, bool]


def test_a_block_before_the_optimizer_step_reads_them_without_a_barrier():
    """A barrier there would cut the step in two on the log's steps."""
    src = STEP.replace("        opt.step()\n{middle}\n", "{middle}\n        opt.step()\n").format(middle=LOGGED)
    out, found, _ = _logged(src)
    assert len(found) == 1, out
    assert "            log = {key: value.item() for key, value in log.items()}\n            print(log)\n" in out
    assert "        if i % log_every == 0:\n            log = {" in out


@pytest.mark.parametrize("middle", [
    # read on every step (the print is not under the `if`)
    '        log = {}\n        log["loss"] = loss.item()\n        print(log)\n',
    # made once, before the loop: it carries the values of earlier steps
    '        log["loss"] = loss.item()\n        if i % log_every == 0:\n            print(log)\n',
    # a value of another kind stored in it
    '        log = {}\n        log["loss"] = loss.item()\n        log["lr"] = opt.param_groups[0]["lr"]\n'
    '        if i % log_every == 0:\n            print(log)\n',
    # read before a store
    '        log = {}\n        log["loss"] = loss.item()\n        if i % log_every == 0:\n            print(log)\n'
    '        log["acc"] = y.float().mean().item()\n',
    # read in two blocks
    '        log = {}\n        log["loss"] = loss.item()\n        if i % log_every == 0:\n            print(log)\n'
    '        if i % 100 == 0:\n            save(log)\n',
    # read in a function that may run at another time
    '        log = {}\n        log["loss"] = loss.item()\n        callbacks.append(lambda: print(log))\n'
    '        if i % log_every == 0:\n            print(log)\n',
    # changed in place before the log reads it: the kept tensor would change with it
    '        log = {}\n        log["loss"] = loss.item()\n        loss /= 2\n        if i % log_every == 0:\n'
    '            print(log)\n',
    # bound again
    '        log = {}\n        log["loss"] = loss.item()\n        log = dict(log)\n        if i % log_every == 0:\n'
    '            print(log)\n',
])
def test_a_dict_whose_life_is_not_all_in_view_is_left(middle):
    src = STEP.format(middle=middle)
    if 'log["loss"] = loss.item()\n        if' in middle and "log = {}" not in middle:
        src = src.replace("    for i,", "    log = {}\n    for i,")
    out, found, _ = _logged(src)
    assert found == [] and "loss.item()" in out, out


def test_a_dict_named_global_is_left():
    """Another function may read it between the steps."""
    src = STEP.format(middle=LOGGED).replace("    for i, (x, y)", "    global log\n    for i, (x, y)")
    out, found, _ = _logged(src)
    assert found == [] and 'log["loss"] = loss.item()' in out


def test_a_dict_read_after_the_loop_is_left():
    src = STEP.format(middle=LOGGED) + "    return log\n"
    out, found, _ = _logged(src)
    assert found == [] and 'log["loss"] = loss.item()' in out


def test_outside_a_step_loop_nothing_changes():
    src = ("import torch\n\nx = torch.ones(2).cuda()\nfor name in names:\n    log = {}\n"
           "    log[name] = x.sum().item()\n    if name:\n        print(log)\n")
    assert _logged(src)[1] == []


@pytest.mark.xla
@needs_xla
def test_the_fixture_runs_one_execution_a_step_and_prints_the_cpu_originals_numbers(tmp_path):
    """fixtures/logged_values: two or three `.item()` reads into a dict each
    step, printed every third.  (Its generator steps every other step: the
    steady graphs are all met by step 6.)"""
    a, _, b, out = at_two_lengths("logged_values", tmp_path, "--steps", 6, 12)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 6, (a, b)
    want = original_output("logged_values", "--steps", "12")
    assert out == want


def test_a_target_with_no_step_barrier_is_left():
    out, findings = convert_text(STEP.format(middle=LOGGED), target="torchtpu")
    assert 'log["loss"] = loss.item()' in out and "XLA421" not in [f.code for f in findings]
