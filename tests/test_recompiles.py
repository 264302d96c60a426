"""XLA409/XLA410 (codemods/recompiles.py): data-dependent control flow and
shapes that recompile, reported on their lines (issue 38, item 7)."""

from tests.conftest import convert_text

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
