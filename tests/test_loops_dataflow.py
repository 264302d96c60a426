"""Loops, devices and loaders by dataflow (issue 11): each defect found on
real programs, statically and, where it matters, on XLA's CPU backend."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import convert_text

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
needs_xla = pytest.mark.xla


def test_state_fed_back_through_an_intermediate_gets_a_barrier():
    out, _ = convert_text("for i, t in enumerate(ts):\n    outs = p_sample_ddim(img, c, t, index=i)\n"
                          "    img, pred_x0 = outs\n")
    assert out.endswith("    img, pred_x0 = outs\n    torch_xla.sync()\n")
    out, _ = convert_text("for i in range(n):\n    eps = model(latents, t[i])\n"
                          "    latents = a[i] * latents - b[i] * eps\n")
    assert out.endswith("    latents = a[i] * latents - b[i] * eps\n    torch_xla.sync()\n")


def test_carried_state_without_a_model_call_is_no_step_loop():
    src = "for x in batches:\n    y = x * 2\n    total = total + y\n"
    assert convert_text(src)[0] == src


def test_barrier_before_break_when_prints_are_deferred():
    out = (FIXTURES / "break_print" / "expected.py").read_text()
    assert "    if step == 3:\n        torch_xla.sync()\n        break\n" in out


def test_host_reads_in_a_loop_found_by_dataflow_are_every_step():
    """The CompVis loop's reads were labelled "once per call" when the loop was missed."""
    src = ("import torch\n\nfor i in range(n):\n    eps = model(latents)\n"
           "    latents = a * latents - b * eps\n    print(latents.norm().item())\n")
    _, findings = convert_text(src, select=["XLA4"])
    assert [f.hot for f in findings if f.code.startswith("XLA4")] and all(
        f.hot for f in findings if f.code.startswith("XLA4"))


@pytest.mark.xla
@needs_xla
def test_broken_off_loop_prints_every_line_the_cpu_run_prints():
    from xlaport.verify.verification import verify

    report = verify(FIXTURES / "break_print" / "input.py", timeout=300, root=FIXTURES / "break_print")
    assert report.verdict == "pass", report.failures
    lines = [o for o in report.outputs if o.name.startswith("stdout line")]
    assert len(lines) == 4 and all(o.ok for o in lines)


@pytest.mark.xla
@needs_xla
def test_compvis_sampler_compiles_the_same_at_two_lengths():
    _verified_flat("compvis_sampler")


def _verified_flat(name):
    """verify of fixtures/<name> at --steps 4, 8 (and the 12 it adds): pass,
    the same compiles at every length."""
    from xlaport.verify.verification import verify

    report = verify(FIXTURES / name / "input.py", lengths="--steps=4,8", timeout=300, root=FIXTURES / name)
    assert report.verdict == "pass", report.failures
    runs = report.metrics["lengths"]
    assert len(runs) == 3 and len({r["compiles"] for r in runs}) == 1, runs


DEVICE_LOADER_PROGRAM = '''\
import torch
import torch.nn as nn
import torch_xla
import torch_xla.distributed.parallel_loader as pl
from torch.utils.data import DataLoader, TensorDataset


def train_loop_fn(loader, model, opt):
    seen = 0
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        seen += 1
    return seen


device = torch_xla.device()
model = nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train_loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.randn(40, 1)), batch_size=8)
train_device_loader = pl.MpDeviceLoader(train_loader, device)
print("batches", train_loop_fn(train_device_loader, model, opt))
'''


@pytest.mark.xla
@needs_xla
def test_device_loader_passed_to_the_loop_is_not_wrapped_again_and_iterates(tmp_path):
    """Wrapped twice, the loader thread dies and the loop sees 0 batches (exit 0)."""
    out, findings = convert_text(DEVICE_LOADER_PROGRAM)
    assert out.count("MpDeviceLoader(") == 1 and "torch_xla.sync()" not in out
    script = tmp_path / "train.py"
    script.write_text(out)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "batches 5" in run.stdout


NANOGPT_GENERATE = '''\
import torch
import torch.nn as nn
from torch.nn import functional as F


class GPT(nn.Module):
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.block_size else idx[:, -self.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
'''


def test_generation_loop_of_a_module_is_a_step_loop_and_its_reads_run_every_step():
    """nanoGPT's generate(): one step per token; its mask indexing runs every step."""
    out, findings = convert_text(NANOGPT_GENERATE)
    # (its growth written into a buffer: XLA414, tests/test_generation.py)
    assert "            idx_length += 1\n            torch_xla.sync()\n        idx = idx_buffer[:, :idx_length]\n" in out
    masks = [f for f in findings if f.code == "XLA406"]
    assert masks and all(f.hot for f in masks)


def test_slicing_with_the_loop_counter_is_reported():
    src = ("import torch\n\ndata = torch.randn(100, 4).cuda()\nfor i in range(0, 100, 35):\n"
           "    x = data[i:i + 35]\n    model(x).sum().backward()\n    opt.step()\n")
    _, findings = convert_text(src, select=["XLA407"])
    assert [(f.code, f.line) for f in findings] == [("XLA407", 5)]
    # a host tensor sliced by the counter (then moved) costs XLA nothing (issue 25)
    _, findings = convert_text(src.replace(".cuda()", ""), select=["XLA407"])
    assert findings == []


def test_loader_in_code_that_takes_its_device_from_the_caller_is_reported_not_wrapped():
    """timm's PrefetchLoader(loader, device=...): the caller picks the device."""
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\n\nclass PrefetchLoader:\n"
           "    def __init__(self, loader, device=None):\n        self.loader, self.device = loader, device\n\n"
           "    def __iter__(self):\n        for x, y in self.loader:\n            yield x.to(self.device), y\n")
    out, findings = convert_text(src)
    assert out == src
    assert [(f.code, f.fix) for f in findings if f.code == "XLA301"] == [("XLA301", False)]


def test_module_that_already_supports_xla_keeps_its_own_loaders():
    """transformers' Trainer wraps its loaders for XLA itself: wrapping again
    would nest device loaders (0 batches)."""
    src = ("from torch.utils.data import DataLoader\nfrom .utils import is_torch_xla_available\n\n"
           "def evaluation_loop(self, dataloader):\n    for step, inputs in enumerate(dataloader):\n"
           "        self.prediction_step(inputs)\n")
    out, findings = convert_text(src)
    assert out == src
    assert all(not f.fix for f in findings)


def test_functions_called_from_the_step_loop_run_every_step():
    src = ("def log_metrics(loss):\n    print(loss.item())\n\n\n"
           "def train_step(batch):\n    loss = model(batch).sum()\n    loss.backward()\n    opt.step()\n"
           "    log_metrics(loss)\n\n\n"
           "class Trainer:\n    def fit(self):\n        for b in batches:\n            self.one(b)\n\n"
           "    def one(self, b):\n        loss = model(b).sum()\n        loss.backward()\n        opt.step()\n"
           "        return float(loss.sum().item())\n\n\n"
           "def evaluate(data):\n    return [model(x).sum().item() for x in data]\n\n\n"
           "for batch in batches:\n    train_step(batch)\nevaluate(batches)\n")
    _, findings = convert_text(src, select=["XLA401"])
    every = {(f.line, f.hot) for f in findings}
    assert (2, True) in every  # log_metrics, reached through train_step
    assert (21, True) in every  # Trainer.one, through self.one in fit's loop
    assert not any(f.line == 25 for f in findings)  # evaluate runs once: not reported without --include-cold
    msg = next(f.message for f in findings if f.line == 2)
    assert "called from `train_step()`" in msg


@pytest.mark.xla
@needs_xla
def test_models_known_by_dataflow_get_barriers_and_compile_the_same_at_two_lengths(tmp_path):
    """`net` (a parameter) and `policy` match no model name: before the
    dataflow analysis both loops ran as one graph that grew with --steps."""
    from xlaport.verify.verification import verify

    source = FIXTURES / "edm_policy" / "input.py"
    report = verify(source, lengths="--steps=4,8", timeout=300)
    assert report.verdict == "pass", report.failures
    runs = report.metrics["lengths"]
    assert len(runs) == 3  # the two lengths asked for and a third verify adds
    assert len({r["compiles"] for r in runs}) == 1 and len({r["largest_graph"] for r in runs}) == 1, runs
    # the same program with both barriers suppressed: verify sees the growth
    text = source.read_text()
    for header in ("    for i in range(num_steps):\n", "for t in range(args.steps):\n"):
        assert header in text
        text = text.replace(header, header[:-1] + "  # xlaport: ignore[XLA302]\n")
    unsynced = tmp_path / "input.py"
    unsynced.write_text(text)
    report = verify(unsynced, lengths="--steps=4,8", timeout=300)
    assert report.verdict == "fail"
    assert any("largest graph grows with --steps" in f for f in report.failures), report.failures


@pytest.mark.xla
@needs_xla
def test_a_loop_around_a_sampler_needs_no_barrier_of_its_own(tmp_path):
    """fixtures/outer_loop: the round loop calls a function holding the
    denoising loop; only the inner loop gets a barrier, and the conversion
    compiles the same graphs at 3 rounds and at 6."""
    from xlaport.verify.verification import verify

    source = FIXTURES / "outer_loop" / "input.py"
    expected = (FIXTURES / "outer_loop" / "expected.py").read_text()
    assert expected.count("torch_xla.sync()") == 1 and "        x = x - 0.1 * eps\n        torch_xla.sync()\n" in expected
    report = verify(source, lengths="--steps=3,6", timeout=300)
    assert report.verdict == "pass", report.failures
    runs = report.metrics["lengths"]
    assert len(runs) == 3  # the two lengths asked for and a third verify adds
    assert len({r["compiles"] for r in runs}) == 1 and len({r["largest_graph"] for r in runs}) == 1, runs
    # without the inner barrier nothing cuts a round: verify sees the growth
    header = "    for i in range(num_steps):\n"
    text = source.read_text()
    assert header in text
    unsynced = tmp_path / "input.py"
    unsynced.write_text(text.replace(header, header[:-1] + "  # xlaport: ignore[XLA302]\n"))
    report = verify(unsynced, lengths="--steps=3,6", timeout=300)
    assert report.verdict == "fail"
    assert any("grows with --steps" in f for f in report.failures), report.failures


def test_an_assert_on_a_tensor_in_the_loop_is_a_tensor_condition():
    """Pytorch-UNet's evaluation loop checks every batch's mask on the host
    (``assert mask.min() >= 0 and ...``): the names come from the batch pair
    by pair; an assert on shapes or on ``dim()`` reads nothing."""
    src = ("import torch\n\n\ndef evaluate(net, loader, device):\n    score = 0\n    for batch in loader:\n"
           "        image, mask = batch['image'], batch['mask']\n        image = image.to(device)\n"
           "        mask = mask.to(device)\n        assert image.dim() == 4 and image.shape[1] == 3\n"
           "        pred = net(image)\n        assert n > 0 and mask.min() >= 0 and mask.max() < 2, 'bad mask'\n"
           "        score += (pred == mask).float().mean()\n    return score\n\n\n"
           "device = torch.device('cuda')\n")
    _, findings = convert_text(src, select=["XLA404"])
    assert [(f.code, f.line, f.hot) for f in findings] == [("XLA404", 12, True)]


def test_identity_tests_and_reads_kept_off_xla_are_no_tensor_condition():
    """``if mask is not None`` reads no value (27 such reports on the corpus
    were wrong); transformers' Trainer keeps its NaN test off XLA with
    ``... and not is_torch_xla_available() and torch.isnan(loss)``; a dtype
    test returns a Python bool.  The NaN test alone still reads the loss."""
    src = ("import torch\nfrom transformers.utils import is_torch_xla_available\n\n\n"
           "def train(model, loader, opt, mask=None):\n    for x in loader:\n        loss = model(x)\n"
           "        if mask is not None:\n            loss = loss * mask\n"
           "        if filt and not is_torch_xla_available() and (torch.isnan(loss) or torch.isinf(loss)):\n"
           "            continue\n        if loss.is_floating_point() and loss is not None:\n            pass\n"
           "        if torch.isnan(loss).any():\n            break\n        loss.backward()\n        opt.step()\n\n\n"
           "device = torch.device('cuda')\n")
    _, findings = convert_text(src, select=["XLA404"])
    assert [(f.code, f.line) for f in findings] == [("XLA404", 14)]


def test_reads_of_host_tensors_are_no_host_reads_and_joins_are_placed_by_their_inputs():
    """makemore moves its samples to the host before ``.tolist()`` and
    averages its losses on the host: no device read.  ``torch.cat`` and
    ``torch.zeros_like`` of device tensors are on the device (they were
    taken for host factories)."""
    src = ("import torch\n\n\ndef sample(model, idx, n, num):\n    for _ in range(n):\n"
           "        logits = model(idx)\n        nxt = torch.multinomial(logits.softmax(-1), 1)\n"
           "        idx = torch.cat((idx, nxt), dim=1)\n        done = torch.zeros_like(idx)\n"
           "        print(idx[0, 1:].tolist(), done[0].item())\n    out = idx.to('cpu')\n"
           "    losses = []\n    for i in range(num):\n        row = out[i, 1:].tolist()\n"
           "        losses.append(torch.tensor(row).float().mean().item())\n    return losses\n\n\n"
           "device = torch.device('cuda')\n")
    _, findings = convert_text(src, select=["XLA401", "XLA402"], options={"include_cold": True})
    # (line 11: the move itself, `idx.to('cpu')`, is the one read, as `.cpu()` is)
    assert sorted((f.code, f.line) for f in findings) == [("XLA401", 10), ("XLA402", 10), ("XLA402", 11)]


def test_a_loader_loop_whose_batches_stay_on_the_host_is_host_code():
    """pytorch-cifar's get_mean_and_std: the batches are reduced into host
    tensors, never moved nor handed on -- the loader is not wrapped (that
    would move the CPU work to the device) and slicing them is no trap; a
    loop that hands its batch to a model is wrapped and its slices reported."""
    from xlaport.engine import Settings, transform

    src = ("import torch\n\n\ndef stats(dataset):\n    dataloader = torch.utils.data.DataLoader(dataset, batch_size=1)\n"
           "    mean = torch.zeros(3)\n    for inputs, targets in dataloader:\n        for i in range(3):\n"
           "            mean[i] += inputs[:, i, :, :].mean()\n    return mean\n\n\n"
           "def train(model, opt, dataset):\n    loader = torch.utils.data.DataLoader(dataset)\n"
           "    for x, y in loader:\n        for t in range(3):\n            model(x[:, t].cuda()).sum().backward()\n"
           "            opt.step()\n")
    found = [(f.code, f.line) for f in transform(src.encode(), Settings()).findings]
    assert not [f for f in found if f[1] < 12], found
    assert ("XLA301", 15) in found and ("XLA407", 17) in found, found
    # handing the batch on (to a helper) or moving it makes it device work again
    for body in ("            mean[i] += helper(inputs)\n", "            mean[i] += inputs.to('cuda')[0, i].mean()\n",
                 "            x = inputs[:, i]\n            mean[i] += net(x)\n"):
        moved = src.replace("            mean[i] += inputs[:, i, :, :].mean()\n", body)
        assert ("XLA301", 7) in [(f.code, f.line) for f in transform(moved.encode(), Settings()).findings], body


def test_a_bool_made_from_tensors_compared_by_identity_is_still_a_host_read():
    """`torch.allclose(y, ref) is False`: the identity reads nothing, but
    allclose reads both tensors to make its Python bool (every step)."""
    from xlaport.engine import Settings, transform

    src = ("import torch\n\ndef run(model, opt, xs, ref):\n    for x in xs:\n        y = model(x.cuda())\n"
           "        y.sum().backward()\n        opt.step()\n        if torch.allclose(y, ref) is False:\n"
           "            print('drift')\n        if y is None:\n            pass\n")
    found = [(f.code, f.line) for f in transform(src.encode(), Settings(select=["XLA4"])).findings]
    assert found == [("XLA404", 8)], found


def test_a_wrapped_loader_reads_batches_handed_to_numpy_back_on_the_host():
    """XLA301 puts the batches on the device: a batch the body hands to numpy
    (infogan's `labels.numpy()`) must come back first (`.cpu()`, a no-op on the
    CPU); where the body rebinds that name, the loop is reported instead."""
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = Net().cuda()\n"
        "loader = DataLoader(ds, batch_size=4)\nfor imgs, labels in loader:\n"
        "    onehot = to_categorical(labels.numpy(), 10)\n    model(imgs.cuda()).sum().backward()\n"
    )
    out, findings = convert_text(source)
    assert "for imgs, labels in pl.MpDeviceLoader(loader, torch_xla.device()):" in out
    assert "to_categorical(labels.cpu().numpy(), 10)" in out
    assert convert_text(out)[0] == out
    rebound = source.replace("    onehot", "    labels = labels + 1\n    onehot")
    out, findings = convert_text(rebound)
    assert "MpDeviceLoader" not in out and "labels.numpy()" in out
    assert [f.code for f in findings if f.code == "XLA301" and not f.fix]


def test_a_loader_whose_batches_meet_host_tensors_in_a_helper_stays_as_it_is():
    """Informer2020: the batch is handed to a method that joins it with a
    tensor made on the host before moving the result; wrapped in a device
    loader the batch would be on the device and `torch.cat` would fail."""
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n\n\nclass Exp:\n"
        "    def train(self, loader):\n        for x, y in loader:\n            out = self._one(x, y)\n"
        "            out.sum().backward()\n\n"
        "    def _one(self, x, y):\n        y = y.float()\n        pad = torch.zeros([y.shape[0], 4]).float()\n"
        "        dec = torch.cat([y[:, :2], pad], dim=1).to(self.device)\n        return self.model(x.cuda(), dec)\n\n\n"
        "loader = DataLoader(ds)\nExp().train(loader)\n"
    )
    out, findings = convert_text(source)
    assert "MpDeviceLoader" not in out
    said = [f for f in findings if f.code == "XLA301"]
    assert said and not said[0].fix and "the `cat` at line 14" in said[0].message


LIST_SAMPLER = (
    "import torch\n\n\ndef steps(x, seq, model):\n    xs = [x]\n    for i in seq:\n"
    "        xt = xs[-1].to(x.device)\n        et = model(xt, i)\n        x0 = xt - et\n"
    "        xs.append(x0.to('cpu'))\n    return xs\n"
)


def test_state_carried_through_a_list_it_appends_to_is_a_step_loop_synced_before_its_first_read():
    """ermongroup/ddim's samplers: the state goes back to the device from
    ``xs[-1]`` and each step appends its host copy.  The loop was not seen
    (no assignment carries the state); its random draws then grew one graph
    per step (the RNG seed is a chain of ops until a barrier)."""
    out, findings = convert_text(LIST_SAMPLER)
    assert "        x0 = xt - et\n        torch_xla.sync()\n        xs.append(x0.to('cpu'))\n" in out, out
    assert [f for f in findings if f.code == "XLA302" and f.fix and "first host read" in f.message]
    assert [f for f in findings if f.code == "XLA402" and '`.to("cpu")`' in f.message]
    assert convert_text(out)[0] == out


@pytest.mark.parametrize("source", [
    # collecting outputs carries no state: nothing reads the list before the append
    "import torch\n\n\ndef run(batches, model):\n    outs = []\n    for x in batches:\n"
    "        outs.append(model(x))\n    return outs\n",
    # a branch that raises writes nothing the rest of the iteration reads (kandinsky's prior interpolate)
    "import torch\n\n\ndef mix(conds, model):\n    embs = []\n    for cond in conds:\n        if isinstance(cond, str):\n"
    "            emb = model(cond)\n        else:\n            raise ValueError(cond)\n        embs.append(emb * 2)\n"
    "    return embs\n",
])
def test_appends_that_carry_nothing_make_no_step_loop(source):
    assert "sync" not in convert_text(source)[0]


@pytest.mark.xla
@needs_xla
def test_list_sampler_compiles_flat_with_the_cpu_originals_values(tmp_path):
    """fixtures/list_sampler at 4 and 8 steps: the same compiles (5 -> 9
    before, one per step), one graph execution a step (two while the first
    host copy was read before the next state was computed), and the sum the
    unconverted program prints on the CPU."""
    from test_runnable_ports import run_on_xla

    def printed(text):
        return float(text.split("sample sum")[1])

    runs = []
    for steps in ("4", "8"):
        original = subprocess.run([sys.executable, str(FIXTURES / "list_sampler" / "input.py"), "--steps", steps],
                                  capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        assert original.returncode == 0, original.stderr
        result, stdout, _, _ = run_on_xla("list_sampler", tmp_path / steps, "--steps", steps)
        assert printed(stdout) == pytest.approx(printed(original.stdout), rel=1e-5, abs=1e-4)
        runs.append(result["metrics"])
    assert runs[0]["compiles"] == runs[1]["compiles"], runs
    assert runs[1]["executions"] - runs[0]["executions"] == 4, runs


FORWARD_LOOP = (
    "import torch\nimport torch.nn as nn\n\n\nclass Sampler(nn.Module):\n    def forward(self, x):\n"
    "        for step in reversed(range(self.steps)):\n            eps = self.model(x, step)\n"
    "            x = x - eps + torch.randn_like(x)\n            assert torch.isnan(x).int().sum() == 0\n"
    "        return x\n\n\nmodel = Sampler().cuda()\n"
)


def test_a_loop_in_a_forward_that_reads_every_pass_is_synced_before_the_read():
    """zoubohao's DDPM samples in an ``nn.Module``'s ``forward`` and asserts
    on the state every pass: each read ran all passes so far (one compile
    per pass).  A forward's loops get no barrier otherwise."""
    out, findings = convert_text(FORWARD_LOOP)
    assert ("            x = x - eps + torch.randn_like(x)\n            torch_xla.sync()\n"
            "            assert torch.isnan(x).int().sum() == 0\n") in out, out
    assert [f for f in findings if f.code == "XLA302" and f.fix and "model's forward" in f.message]
    assert convert_text(out)[0] == out


@pytest.mark.parametrize("change", [
    # no read, no draw: an RNN or decoder unrolled in forward keeps one graph (no barrier inside a training step)
    ("            x = x - eps + torch.randn_like(x)\n            assert torch.isnan(x).int().sum() == 0\n",
     "            x = x - eps\n"),
    # nor one that draws in a nested loop only (not every pass at its own level)
    ("            x = x - eps + torch.randn_like(x)\n            assert torch.isnan(x).int().sum() == 0\n",
     "            x = x - eps\n            for k in range(2):\n                x = x + torch.randn_like(x)\n"),
    # a layer loop that draws (noise injected per layer) walks modules: no sampler
    ("        for step in reversed(range(self.steps)):\n            eps = self.model(x, step)\n"
     "            x = x - eps + torch.randn_like(x)\n            assert torch.isnan(x).int().sum() == 0\n",
     "        for layer in self.layers:\n            x = layer(x) + torch.randn_like(x)\n"),
    # a coin drawn on the host (transformers' LayerDrop: `torch.rand([]) < p`)
    ("            x = x - eps + torch.randn_like(x)\n            assert torch.isnan(x).int().sum() == 0\n",
     "            if torch.rand([]) < 0.1:\n                continue\n            x = x - eps\n"),
    # a pass that can end early reads on some passes only
    ("            x = x - eps + torch.randn_like(x)\n            assert torch.isnan(x).int().sum() == 0\n",
     "            x = x - eps\n            if step == 3:\n                break\n"
     "            assert torch.isnan(x).int().sum() == 0\n"),
    # a read of what the model computes in the same statement: nothing to compute before it
    ("            eps = self.model(x, step)\n            x = x - eps + torch.randn_like(x)\n"
     "            assert torch.isnan(x).int().sum() == 0\n",
     "            x = x - self.model(x, step)\n            print(self.model(x, step).sum().item())\n"),
])
def test_a_forward_loop_gets_no_barrier_without_a_read_every_pass_of_its_state(change):
    assert change[0] in FORWARD_LOOP
    out, _ = convert_text(FORWARD_LOOP.replace(*change))
    assert "sync" not in out, out


@pytest.mark.parametrize("draw", ["torch.randn_like(x)", "torch.randn(x.shape, device=x.device)",
                                  "x.new_empty(x.shape).normal_()"])
def test_a_sampler_written_as_a_modules_forward_ends_each_pass_with_a_barrier(draw):
    """w86763777/pytorch-ddpm: `GaussianDiffusionSampler.forward` draws noise
    every pass and feeds `x_t` back, and reads nothing: without a barrier all
    T passes join one graph (T=32 on XLA's CPU backend: one compile, 82.5 s;
    with it: 4 compiles, 14.1 s, the same 4 at T=4 and T=8).  The barrier
    ends the pass, before a `return`/`continue` that ends it."""
    src = FORWARD_LOOP.replace("            assert torch.isnan(x).int().sum() == 0\n", "").replace(
        "torch.randn_like(x)", draw)
    out, findings = convert_text(src)
    assert f"            x = x - eps + {draw}\n            torch_xla.sync()\n        return x\n" in out, out
    assert [f for f in findings if f.code == "XLA302" and f.fix and "sampler loop" in f.message]
    assert convert_text(out)[0] == out
    ended = src.replace(f"{draw}\n", f"{draw}\n            if step == 0:\n                continue\n"
                        "            x = x.clamp(-1, 1)\n            continue\n")
    out = convert_text(ended)[0]
    assert "            x = x.clamp(-1, 1)\n            torch_xla.sync()\n            continue\n" in out, out
    # drawn on the host (a Python coin): no device draw, no barrier
    assert "sync" not in convert_text(src.replace(draw, "random.random()"))[0]


@pytest.mark.xla
@needs_xla
def test_a_sampler_that_draws_every_pass_runs_one_graph_a_pass_and_verifies(tmp_path):
    """fixtures/draw_sampler: before, one execution of one graph at 4 and at
    8 passes (a graph twice as large, compiled again for each length); now
    one execution a pass with the same compiles, and verify passes at 4, 8
    and 12 passes."""
    from test_runnable_ports import run_on_xla

    a = run_on_xla("draw_sampler", tmp_path / "4", "--steps", "4")[0]["metrics"]
    b = run_on_xla("draw_sampler", tmp_path / "8", "--steps", "8")[0]["metrics"]
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 4, (a, b)
    _verified_flat("draw_sampler")


@pytest.mark.xla
@needs_xla
def test_module_sampler_compiles_flat_and_verifies():
    """fixtures/module_sampler: 5 -> 9 compiles at 4 -> 8 steps before."""
    _verified_flat("module_sampler")
