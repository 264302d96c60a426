"""XLA414: a generation loop that grows its sequence by one token a step and
feeds the model a window of it writes into a buffer of the final length
(codemods/generation.py; fixtures/generation_window is its golden test).
minGPT's chargpt (block 32, 500 sampled tokens) on XLA's CPU backend: the
process died compiling (LLVM out of memory, about one compile per token)
before; converted now, its ``generate`` compiles 21 graphs."""

import os
import subprocess
import sys

import pytest

from tests.conftest import convert_text

from test_recompile_fixes import FIXTURES, codes
from test_runnable_ports import needs_xla, run_on_xla

LOOP = '''\
import torch


@torch.no_grad()
def generate(model, idx, max_new_tokens, block_size):
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -block_size:]
        logits = model(idx_cond)
        logits = logits[:, -1, :]
        probas = torch.softmax(logits, dim=-1)
        idx_next = torch.argmax(probas, dim=-1, keepdim=True)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


model = torch.nn.Linear(4, 4).cuda()
'''


def test_a_windowed_generation_writes_into_a_buffer():
    out, findings = convert_text(LOOP)
    assert codes(findings, "XLA414") == [(12, True)], findings
    assert "XLA408" not in [f.code for f in findings]
    assert "    idx_buffer = torch.cat((idx, idx.new_zeros((idx.size(0), max(max_new_tokens, 0), *idx.shape[2:]))), dim=1)\n" \
        in out, out
    assert ("idx_cond = idx_buffer[:, torch.arange(min(idx_length, block_size), device=idx_buffer.device) + "
            "torch.tensor([max(idx_length - block_size, 0)], device=idx_buffer.device)]") in out
    assert "        idx_buffer.index_copy_(1, torch.tensor([idx_length], device=idx_buffer.device), idx_next)\n" \
           "        idx_length += 1\n" in out
    assert "    idx = idx_buffer[:, :idx_length]\n    return idx\n" in out
    again, findings = convert_text(out)
    assert again == out and not codes(findings, "XLA414")


@pytest.mark.parametrize("change", [
    ("idx_cond = idx[:, -block_size:]", "idx_cond = idx"),  # the whole sequence: exact padding needs a causal model
    ("torch.argmax(probas, dim=-1, keepdim=True)", "torch.multinomial(probas, num_samples=2)"),  # two tokens a step
    ("torch.argmax(probas, dim=-1, keepdim=True)", "torch.argmax(probas, dim=-1)"),  # no column
    ("logits = logits[:, -1, :]", "logits = logits[:, -2:, :].mean(1)"),  # not the last position's row
    ("idx_cond = idx[:, -block_size:]", "idx_cond = idx[:, -block_size:]\n        last = lambda: idx"),  # read later
    ("range(max_new_tokens)", "range(1, max_new_tokens)"),  # a count the buffer cannot take as it is
    ("        idx = torch.cat((idx, idx_next), dim=1)\n",
     "        idx = torch.cat((idx, idx_next), dim=1)\n        print(idx_next)\n"),  # the growth is not last
    ("torch.cat((idx, idx_next), dim=1)", "torch.cat((idx_next, idx), dim=1)"),  # prepended
])
def test_a_growth_the_buffer_cannot_take_stays_reported(change):
    src = LOOP.replace(*change)
    assert src != LOOP
    out, findings = convert_text(src)
    assert not codes(findings, "XLA414") and "idx_buffer" not in out, (change, out)


def test_a_loop_that_may_stop_early_keeps_the_filled_part():
    """LLMs-from-scratch's `generate` stops at its end-of-text token: the
    sequence after the loop is the buffer up to the length reached."""
    stop = LOOP.replace("        idx = torch.cat(", "        if eos is not None and idx_next == eos:\n            break\n"
                                                   "        idx = torch.cat(")
    out, findings = convert_text(stop)
    assert codes(findings, "XLA414") == [(14, True)], findings
    assert "            break\n" in out and "    idx = idx_buffer[:, :idx_length]\n" in out


def test_other_reads_read_the_filled_part():
    out, findings = convert_text(LOOP.replace("        logits = model(idx_cond)\n",
                                              "        logits = model(idx_cond)\n        last = idx[:, -1]\n"))
    assert codes(findings, "XLA414") == [(13, True)]
    assert "        last = idx_buffer[:, :idx_length][:, -1]\n" in out


def test_the_token_may_be_sampled_or_the_top_index():
    for draw in ("torch.multinomial(probas, num_samples=1)", "probas.multinomial(1)"):
        out, findings = convert_text(LOOP.replace("torch.argmax(probas, dim=-1, keepdim=True)", draw))
        assert codes(findings, "XLA414") == [(12, True)], draw
    top = LOOP.replace("idx_next = torch.argmax(probas, dim=-1, keepdim=True)", "_, idx_next = torch.topk(probas, k=1)")
    out, findings = convert_text(top)
    assert codes(findings, "XLA414") == [(12, True)], out


def test_xla408_still_reports_what_xla414_leaves_or_is_not_selected():
    _, findings = convert_text(LOOP.replace("idx_cond = idx[:, -block_size:]", "idx_cond = idx"))
    assert codes(findings, "XLA408") == [(12, False)]
    out, findings = convert_text(LOOP, select=("XLA408", "XLA101"))
    assert codes(findings, "XLA408") == [(12, False)] and "idx_buffer" not in out


@pytest.mark.xla
@needs_xla
def test_the_converted_generation_compiles_flat_past_the_window_with_the_originals_tokens(tmp_path):
    """8 and 16 tokens after a prompt of 2, window 6: the same compiles, the CPU original's tokens."""
    original = subprocess.run([sys.executable, str(FIXTURES / "generation_window" / "input.py"), "--steps", "16"],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert original.returncode == 0, original.stderr
    short, _, _, _ = run_on_xla("generation_window", tmp_path / "a", "--steps", "8")
    long, out16, _, _ = run_on_xla("generation_window", tmp_path / "b", "--steps", "16")
    assert short["metrics"]["compiles"] == long["metrics"]["compiles"], (short, long)
    assert out16 == original.stdout


@pytest.mark.xla
@needs_xla
def test_left_as_it_was_the_generation_compiles_once_per_token(tmp_path, monkeypatch):
    """What the rewrite is worth, and that the test above can fail."""
    import test_runnable_ports
    from xlaport.engine import Settings

    monkeypatch.setattr(test_runnable_ports, "Settings", lambda: Settings(ignore=("XLA414",)))
    short, _, _, _ = run_on_xla("generation_window", tmp_path / "a", "--steps", "8")
    long, _, _, _ = run_on_xla("generation_window", tmp_path / "b", "--steps", "16")
    assert long["metrics"]["compiles"] >= short["metrics"]["compiles"] + 8, (short, long)


@pytest.mark.torch
def test_the_buffer_gives_the_originals_sequence_for_any_count():
    """Run on the CPU, original and rewrite: the same tokens for counts
    below, at and past the window, a count of 0 and a negative one, and a
    loop that stops at an end token."""
    import torch

    src = LOOP.replace("model = torch.nn.Linear(4, 4).cuda()\n", "").replace(
        "        idx = torch.cat(", "        if eos is not None and bool((idx_next == eos).all()):\n            break\n"
                                   "        idx = torch.cat(").replace("block_size):", "block_size, eos=None):")
    out, findings = convert_text(src, select=["XLA414"])
    assert codes(findings, "XLA414") == [(14, True)], out
    torch.manual_seed(0)
    table = torch.randn(12, 12)

    def model(idx):  # each position sees the ones before it, so a longer window changes the answer
        emb = table[idx]
        return emb.cumsum(dim=1) / torch.arange(1, idx.size(1) + 1).view(1, -1, 1)

    for count in (-1, 0, 2, 9):
        for eos in (None, 3):
            prompt = torch.tensor([[1, 5, 7], [2, 2, 9]])
            want, got = {}, {}
            exec(src, want)
            exec(out, got)
            expected = want["generate"](model, prompt, count, 4, eos)
            assert torch.equal(got["generate"](model, prompt, count, 4, eos), expected), (count, eos)


# LLMs-from-scratch's `generate`: top-k filtering and temperature in branches before the token is drawn
FILTERED = LOOP.replace('''        probas = torch.softmax(logits, dim=-1)
        idx_next = torch.argmax(probas, dim=-1, keepdim=True)
''', '''        if top_k is not None:
            top_logits, _ = torch.topk(logits, top_k)
            min_val = top_logits[:, -1:]
            logits = torch.where(logits < min_val, torch.tensor(float("-inf")).to(logits.device), logits)
        if temperature > 0.0:
            logits = logits / temperature
            logits = logits - logits.max(dim=-1, keepdim=True).values
            probs = torch.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
        else:
            idx_next = torch.argmax(logits, dim=-1, keepdim=True)
''').replace("block_size):", "block_size, temperature=0.0, top_k=None):")


def test_a_row_filtered_or_scaled_in_branches_is_still_the_last_positions_row():
    out, findings = convert_text(FILTERED)
    assert codes(findings, "XLA414") == [(21, True)], findings
    assert "idx_buffer.index_copy_(" in out and "    idx = idx_buffer[:, :idx_length]\n" in out
    again, findings = convert_text(out)
    assert again == out and not codes(findings, "XLA414")


WHERE = '            logits = torch.where(logits < min_val, torch.tensor(float("-inf")).to(logits.device), logits)\n'


@pytest.mark.parametrize("change", [
    # a branch binds the row from something else
    (WHERE, "            logits = other / 2\n"),
    # through another name the `if` binds: what it held before the `if` does not say
    (WHERE, "            scaled = logits.mean(1)\n            logits = scaled\n",
     "        if top_k is not None:\n", "        scaled = logits * 2\n        if top_k is not None:\n"),
    # arithmetic with the row on the right (its shape is the left side's)
    (WHERE, "            logits = bias / logits\n"),
    # bound in a loop inside the branch
    (WHERE, "            for _ in range(2):\n                logits = logits / 2\n"),
    # `torch.where` choosing between two other things
    (WHERE, "            logits = torch.where(logits < min_val, a, b)\n"),
])
def test_a_branch_that_may_not_keep_the_row_leaves_the_growth(change):
    src = FILTERED
    for old, new in zip(change[::2], change[1::2]):
        src = src.replace(old, new)
    assert src != FILTERED
    out, findings = convert_text(src)
    assert not codes(findings, "XLA414") and "idx_buffer" not in out, (change, out)


@pytest.mark.torch
def test_the_filtered_generation_gives_the_originals_tokens_on_the_cpu():
    import torch

    src = FILTERED.replace("model = torch.nn.Linear(4, 4).cuda()\n", "")
    out, _ = convert_text(src, select=["XLA414"])
    assert "idx_buffer" in out
    table = torch.randn(12, 12, generator=torch.Generator().manual_seed(0))

    def model(idx):
        return table[idx].cumsum(dim=1)

    for temperature, top_k in ((0.0, None), (0.0, 3), (1.5, 4), (0.7, None)):
        want, got = {}, {}
        exec(src, want)
        exec(out, got)
        prompt = torch.tensor([[1, 5, 7], [2, 2, 9]])
        torch.manual_seed(1)
        expected = want["generate"](model, prompt, 9, 4, temperature, top_k)
        torch.manual_seed(1)
        assert torch.equal(got["generate"](model, prompt, 9, 4, temperature, top_k), expected), (temperature, top_k)


# -- the whole sequence to the model: no buffer, no barrier ---------------------

WHOLE = ("idx_cond = idx[:, -block_size:]", "idx_cond = idx")


def test_a_generation_that_feeds_the_model_all_it_grew_gets_no_barrier():
    """bigram.py of karpathy/ng-video-lecture: `logits, loss = self(idx)`.
    A barrier each token would compile each new shape (45 -> 85 compiles at
    40 -> 80 tokens); without one the loop is one graph (5 -> 5)."""
    out, findings = convert_text(LOOP.replace(*WHOLE))
    assert "torch_xla.sync()" not in out and "idx_buffer" not in out, out
    [message] = [f.message for f in findings if f.code == "XLA408"]
    assert "left without a barrier, the loop is one graph" in message
    # a host read each token runs a graph each token anyway: the barrier stays, before it
    out, _ = convert_text(LOOP.replace(*WHOLE).replace("        idx = torch.cat(",
                                                       "        seen.append(idx_next.item())\n        idx = torch.cat("))
    assert "        torch_xla.sync()\n        seen.append(idx_next.item())\n" in out, out


@pytest.mark.xla
@needs_xla
def test_the_whole_sequence_generation_compiles_once_for_each_count_with_the_originals_tokens(tmp_path):
    source = (FIXTURES / "generation_window" / "input.py").read_text().replace(
        "idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]", "idx_cond = idx").replace(
        "block_size = 6", "block_size = 32")
    (tmp_path / "orig.py").write_text(source)
    from xlaport.engine import Settings, transform

    converted = transform(source.encode(), Settings()).code.decode()
    assert "torch_xla.sync()" not in converted
    (tmp_path / "conv.py").write_text(converted)
    from test_runnable_ports import OBSERVER
    import json

    seen = {}
    for n in (8, 16):
        original = subprocess.run([sys.executable, "orig.py", "--steps", str(n)], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        metrics = tmp_path / f"m{n}.json"
        done = subprocess.run([sys.executable, "conv.py", "--steps", str(n)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PJRT_DEVICE": "CPU",
                                                           "PYTHONPATH": str(OBSERVER),
                                                           "XLAPORT_TEST_METRICS": str(metrics)})
        assert done.returncode == 0 and done.stdout == original.stdout, (done.stdout, original.stdout, done.stderr)
        seen[n] = json.loads(metrics.read_text())
    assert seen[8]["compiles"] == seen[16]["compiles"] and seen[16]["executions"] == seen[8]["executions"], seen
