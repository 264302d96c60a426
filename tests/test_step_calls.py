"""Steps found through calls, closures and kinds of values (issue 25): each
case's barrier placement is a golden fixture (fixtures/step_calls,
fixtures/grad_accum); here the conversions run on XLA's CPU backend at two
lengths -- executions grow with the steps (a barrier cuts every step) and
compiles stay flat."""

import pytest

from xlaport.engine import Settings, transform

from test_runnable_ports import FIXTURES, needs_xla, run_on_xla


def at_two_lengths(name: str, tmp_path, flag: str, short: int, long: int):
    """The fixture's conversion run on XLA at two lengths: (its metrics and
    stdout at ``flag short``, the same at ``flag long``)."""
    a, out_a, _, _ = run_on_xla(name, tmp_path / "a", flag, str(short))
    b, out_b, _, _ = run_on_xla(name, tmp_path / "b", flag, str(long))
    return a["metrics"], out_a, b["metrics"], out_b


def one_execution_a_step(name: str, tmp_path, short: int = 3, long: int = 6) -> str:
    """The fixture's conversion on XLA at ``--steps short`` and ``long``:
    asserts that compiles stay flat and that each step more is one graph
    execution more; what it prints at ``long``."""
    a, _, b, out = at_two_lengths(name, tmp_path, "--steps", short, long)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == long - short, (a, b)
    return out


def printed_numbers(text: str) -> list:
    """Every word of ``text`` that reads as a number (brackets, commas and ``%`` stripped)."""
    found = []
    for word in text.split():
        try:
            found.append(float(word.strip("()[],%")))
        except ValueError:
            pass
    return found


def original_output(name: str, *args: str) -> str:
    """What the fixture's unconverted program prints on the CPU (CUDA hidden)."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(FIXTURES / name / "input.py"), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    return done.stdout


def lint_codes(source: str):
    return [(f.code, f.line) for f in transform(source.encode(), Settings()).findings]


def test_a_step_two_calls_deep_makes_a_step_loop():
    src = (FIXTURES / "step_calls" / "input.py").read_text()
    barriers = [line for code, line in lint_codes(src) if code == "XLA302"]
    loop = src.splitlines().index("        while step < steps:") + 1
    closure_loop = src.splitlines().index("    while n < steps:") + 1
    # the trainer's loop (run_step -> forward_backward -> backward) and the closure's loop;
    # not the loop that sums the loss module over targets
    assert barriers == [loop, closure_loop]


def test_a_sync_under_a_flag_is_no_barrier():
    src = ("import torch\n\ndef train(model, opt, batches, args):\n    for x in batches:\n"
           "        model(x.cuda()).sum().backward()\n        opt.step()\n"
           "        if args.synchronize_step:\n            torch.cuda.synchronize()\n")
    out = transform(src.encode(), Settings()).code.decode()
    assert out.endswith("            torch_xla.sync(wait=True)\n        torch_xla.sync()\n"), out
    # a sync on both arms of the branch is one on every path
    both = src + "        else:\n            torch.cuda.synchronize()\n"
    assert "XLA302" not in [c for c, _ in lint_codes(both)]


def test_a_parameter_named_like_the_training_function_does_not_hide_it():
    src = ("import torch\n\nclass Net(torch.nn.Module):\n    def __init__(self, train):\n"
           "        super().__init__()\n        self.flag = train\n\n"
           "def train(model, opt, batches):\n    for x in batches:\n        model(x.cuda()).sum().backward()\n"
           "        opt.step()\n")
    assert ("XLA302", 9) in lint_codes(src)
    # while a function a model's __init__ really refers to is model code
    calls = src.replace("self.flag = train", "self.fn = train")
    assert ("XLA302", 9) not in lint_codes(calls.replace("def __init__(self, train)", "def __init__(self)"))


def test_losses_and_metrics_are_not_models():
    for ctor in ("nn.MSELoss()", "nn.CrossEntropyLoss(reduction='sum')", "PerceptualLoss()"):
        src = ("import torch\nimport torch.nn as nn\n\nclass PerceptualLoss(nn.Module):\n"
               "    def forward(self, a, b):\n        return (a - b).abs().mean()\n\n"
               f"crit = {ctor}\nloss = 0\nfor t in targets:\n    loss = loss + crit(y, t)\n")
        assert "XLA302" not in [c for c, _ in lint_codes(src)], ctor
    # a model in the same place still carries its output
    src = ("import torch.nn as nn\nnet = nn.Linear(4, 4)\nx = x0\nfor t in range(4):\n    x = net(x)\n")
    assert "XLA302" in [c for c, _ in lint_codes(src)]


@pytest.mark.xla
@needs_xla
def test_steps_through_calls_run_one_graph_per_step(tmp_path):
    a, out3, b, out6 = at_two_lengths("step_calls", tmp_path, "--steps", 3, 6)
    # two loops, a barrier each step: three more steps are six more executions
    assert b["executions"] - a["executions"] >= 6, (a, b)
    assert a["compiles"] == b["compiles"], (a, b)
    assert "trainer loss" in out3 and "closure loss" in out6


@pytest.mark.xla
@needs_xla
def test_gradient_accumulation_compiles_one_graph_per_optimizer_step(tmp_path):
    """The barrier after the optimizer step only (measured against the other
    placements in docs/internals.md): the same compiles at 2 and 4
    iterations, one execution per iteration after the first."""
    a, _, b, _ = at_two_lengths("grad_accum", tmp_path, "--iters", 2, 4)
    assert a["compiles"] == b["compiles"] == 2, (a, b)
    assert b["executions"] - a["executions"] == 2, (a, b)


_READ_AFTER_STEP = ("import torch\n\ndef train(model, opt, sched, batches):\n    total = 0.0\n"
                    "    for x in batches:\n        loss = model(x.cuda()).sum()\n"
                    "        loss.backward()\n        opt.step()\n        sched.step()\n"
                    "        opt.zero_grad(set_to_none=True)\n"
                    "        total += loss.item()\n    return total\n")


KEEP_READS = ("XLA412",)


def test_a_host_read_after_the_optimizer_step_gets_the_barrier_before_it():
    # (a sum of `.item()` is summed on the device by XLA412: kept here as a read, to place the barrier around it)
    out = transform(_READ_AFTER_STEP.encode(), Settings(ignore=KEEP_READS))
    assert "sched.step()\n        opt.zero_grad(set_to_none=True)\n        torch_xla.sync()\n        total += loss.item()\n" in \
        out.code.decode(), out.code.decode()
    assert [f.message for f in out.findings if f.code == "XLA302"] == [
        "step loop: `torch_xla.sync()` added right after its optimizer step (the host reads after it find the step "
        "computed)"]
    # nothing read after the step, or a read before it: the end of the body, as before (XLA417, off here,
    # would move the step before that read: tests/test_step_reads.py)
    for src in (_READ_AFTER_STEP.replace("        total += loss.item()\n", "        total += loss\n"),
                _READ_AFTER_STEP.replace("        total += loss.item()\n", "").replace(
                    "        loss.backward()\n", "        total += loss.item()\n        loss.backward()\n")):
        code = transform(src.encode(), Settings(ignore=KEEP_READS + ("XLA417",))).code.decode()
        assert code.endswith("\n        torch_xla.sync()\n    return total\n") and code.count("sync()") == 1, code
    # a step under a condition (accumulation), a `continue` after the step, a
    # print deferred to a step closure (it would run a step late): the end
    for old, new in (("        opt.step()\n", "        if x.sum() > 0:\n            opt.step()\n"),
                     ("        total += loss.item()\n", "        total += loss.item()\n        if total > 9:\n"
                                                        "            continue\n        total -= 1\n"),
                     ("        total += loss.item()\n", "        print(loss.item())\n")):
        code = transform(_READ_AFTER_STEP.replace(old, new).encode(), Settings(ignore=KEEP_READS)).code.decode()
        assert "set_to_none=True)\n        torch_xla.sync()\n" not in code, code


@pytest.mark.xla
@needs_xla
def test_a_read_after_the_step_finds_it_computed_on_xla(tmp_path):
    """fixtures/read_after_step: one graph and one execution per step (with
    the barrier at the end of the body: two of each -- the loss read runs
    the forward pass as a graph of its own; docs/internals.md)."""
    a, out3, b, _ = at_two_lengths("read_after_step", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] == 1, (a, b)
    assert b["executions"] - a["executions"] == 3, (a, b)
    assert "mean loss" in out3


def test_a_loop_over_a_device_loader_that_reads_after_its_step_gets_the_barrier_right_after_it():
    """fixtures/loader_reads (kuangliu/pytorch-cifar's shape): MpDeviceLoader
    syncs at the next batch only, so each read after the step ran the
    forward pass again as a graph of its own (a 5-layer conv net on XLA's
    CPU backend: 8 steps in 6.5 s; with the barrier after the step 4.4 s,
    the same numbers).  The barrier goes right after the step; nothing read
    after it, or a pass that can end early after it: the loader's sync as before."""
    src = (FIXTURES / "loader_reads" / "input.py").read_text()
    out = transform(src.encode(), Settings())
    code = out.code.decode()
    # the accuracy computed after the step joins its graph (analysis.step_tail): the sum the read
    # computes is computed into a name of its own before the barrier, and read after it
    assert ("        optimizer.step()\n        _, predicted = outputs.max(1)\n"
            "        correct_step = predicted.eq(targets).sum()\n        torch_xla.sync()\n\n"
            "        train_loss += loss.item()\n        total += targets.size(0)\n"
            "        correct += correct_step.item()\n") in code, code
    assert code.count("sync()") == 1 and "pl.MpDeviceLoader(loader, torch_xla.device())" in code
    assert [f.message for f in out.findings if f.code == "XLA302"] == [
        "step loop over a device loader that reads the host after its optimizer step: `torch_xla.sync()` added "
        "right after that step and the lines after it that only compute tensors (the loader syncs at the next "
        "batch only: each read would run the forward again)"]
    assert transform(code.encode(), Settings()).code.decode() == code
    no_reads = src.replace("loss.item()", "float(len(targets))").replace(".sum().item()", ".sum()")
    for other in (no_reads, src.replace("        print(f", "        if batch_idx > 99:\n            continue\n"
                                                          "        print(f")):
        assert "sync()" not in transform(other.encode(), Settings()).code.decode()


@pytest.mark.xla
@needs_xla
def test_reads_after_the_step_of_a_device_loader_loop_agree_with_the_original(tmp_path):
    """fixtures/loader_reads converted and run on XLA at 3 and 6 batches:
    compiles flat, one execution a batch (with the accuracy's sum computed
    after the barrier: two), and every progress line the original prints on
    the CPU."""
    import os
    import subprocess
    import sys

    a, out3, b, out6 = at_two_lengths("loader_reads", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"], (a, b)
    assert b["executions"] - a["executions"] == 3, (a, b)  # one a batch: the accuracy is in the step's graph
    original = subprocess.run([sys.executable, str(FIXTURES / "loader_reads" / "input.py"), "--steps", "6"],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert original.returncode == 0, original.stderr

    def numbers(text):
        return [float(w.rstrip("%")) for line in text.splitlines() for w in line.split()[::2]]

    assert len(out6.splitlines()) == 6 and numbers(out6) == pytest.approx(numbers(original.stdout), rel=1e-4, abs=1e-3)


def test_traps_through_calls_are_found_on_their_line_in_the_callee():
    src = (FIXTURES / "traps_through_calls" / "input.py").read_text()
    lines = src.splitlines()
    found = {(f.code, f.line): f.message for f in transform(src.encode(), Settings()).findings}
    helper = lines.index("    return source[i:i + n]") + 1
    # the counter the loop hands `get_batch` slices the batch in the helper: rewritten there (XLA411), so the
    # call is not reported (XLA407); tests/test_recompile_fixes.py runs that rewrite
    assert "handed to this function" in found[("XLA411", helper)]
    grow = lines.index("            idx = torch.cat((idx, nxt), dim=1)") + 1
    assert ("XLA408", grow) in found
    # `losses[k]` indexes a host tensor: no XLA407 there
    assert [line for code, line in found if code == "XLA407"] == []


def test_host_ints_and_fill_values_are_traps_in_a_sampler_class():
    src = (FIXTURES / "sampler_traps" / "input.py").read_text()
    lines = src.splitlines()
    found = {(f.code, f.line, f.col): f for f in transform(src.encode(), Settings()).findings}
    pair = lines.index("            a, a_next = self.alphas[t], self.alphas[t_next]") + 1
    call = lines.index("            x = self.model(x) * a + self.noise_level(x, t) * a_next") + 1
    fill = lines.index("        return torch.full((x.shape[0], 1), self.alphas[index], device=x.device)") + 1
    loop = lines.index("        for t, t_next in zip(times[:-1], times[1:]):") + 1
    # both ints drawn from the host list by zip index the device table: sent to the device (XLA411);
    # the index reached through the call stays reported
    assert sorted((c, line) for c, line, _ in found if c in ("XLA407", "XLA411")) == \
        [("XLA407", call)] + [("XLA411", pair)] * 2
    assert all(found[k].fix for k in found if k[0] == "XLA411")
    through = next(f for (c, line, _), f in found.items() if (c, line) == ("XLA407", call))
    assert through.related == ((fill, fill),)  # the callee's line, for verify to tie events to
    scalar = next(f for (c, line, _), f in found.items() if (c, line) == ("XLA403", fill))
    assert f"called from the loop at line {loop}" in scalar.message
    # a table on the host, or a fill value that is a number, is no trap
    host = src.replace(".to(device)\n", "\n").replace("self.alphas[index]", "0.5")
    assert not [c for c, _, _ in ((f.code, f.line, 0) for f in transform(host.encode(), Settings()).findings)
                if c.startswith("XLA40")]


def test_a_deeper_chain_is_named_and_a_growing_value_names_its_loop():
    src = ("import torch\n\ndef inner(x, mask):\n    return x[mask.nonzero()]\n\n"
           "def outer(x):\n    return inner(x, x > 0)\n\n"
           "def gen(model, idx, n):\n    for _ in range(n):\n        out = model(idx)\n"
           "        outer(out)\n        idx = torch.cat((idx, out[:, -1:]), dim=1)\n    return idx\n")
    found = {f.code: f for f in transform(src.encode(), Settings(select=["XLA4"])).findings}
    assert "in `inner()`, called from `outer()`, called from the loop at line 10" in found["XLA405"].message
    assert found["XLA408"].related == ((10, 13),)


@pytest.mark.xla
@needs_xla
@pytest.mark.parametrize("name", ["traps_through_calls", "sampler_traps"])
def test_the_reported_traps_do_recompile_on_xla(tmp_path, name):
    """What lint reports is what XLA does: with the traps in place, three
    more steps are more compilations."""
    a, _, b, _ = at_two_lengths(name, tmp_path, "--steps", 3, 6)
    assert b["compiles"] >= a["compiles"] + 3, (a, b)


def test_the_cheap_readers_derive_from_the_one_definition_of_a_step():
    """The model-call names of state and of the ``ast`` pre-check are one
    reading (steps.called_like_a_model, on MODEL_CALL_RE), and XLA302's
    trigger bytes come from codemods.analysis.steps: every name the reading
    accepts, the trigger bytes accept."""
    from codemods.analysis import prefilter, state, steps
    from codemods.barriers import StepBarrier

    assert state.called_like_a_model is steps.called_like_a_model is prefilter.called_like_a_model
    assert steps.called_like_a_model("self.unet") and steps.called_like_a_model("p_sample")
    assert not any(steps.called_like_a_model(n) for n in (
        "get_model_file", "load_model", "UNetModel", "x.latent_dist.sample", "model.items", ""))
    words = list(steps.MODEL_WORDS) + list(steps.MODEL_NAMES) + ["sampler", "sample", "net"]
    names = [f(w) for w in words for f in (str, str.capitalize, str.upper, lambda w: f"my_{w}", lambda w: f"{w}_fn",
                                            lambda w: f"Res{w.capitalize()}")]
    accepted = [n for n in names if steps.MODEL_CALL_RE.search(n)]
    assert len(accepted) > 40
    for name in accepted + sorted(steps.STEP_CALLS):
        assert any(t in name.encode() for t in StepBarrier.TRIGGERS), name
    assert not steps.MODEL_CALL_RE.search("upsampler") and not steps.MODEL_CALL_RE.search("steps")


def test_pairs_of_host_ints_through_a_name_and_a_progress_bar_index_a_registered_buffer():
    """A DDIM-style sampler: the pairs are made once (`pairs = list(zip(...))`)
    and iterated through a progress bar; the table is a buffer the model
    registers (through a helper of the same name), so it lives on the device."""
    src = ("import torch\nfrom torch import nn\nfrom tqdm import tqdm\n\n\nclass Diffusion(nn.Module):\n"
           "    def __init__(self, net, steps):\n        super().__init__()\n        self.net = net\n"
           "        register_buffer = lambda name, val: self.register_buffer(name, val.float())\n"
           "        register_buffer('alphas', torch.linspace(0.9, 0.1, steps))\n"
           "        self.register_buffer('sigmas', torch.linspace(1.0, 0.0, steps))\n\n"
           "    @torch.no_grad()\n    def sample(self, x, steps):\n"
           "        times = list(reversed(torch.arange(steps).tolist()))\n"
           "        pairs = list(zip(times[:-1], times[1:]))\n"
           "        for t, t_next in tqdm(pairs, desc='sampling'):\n"
           "            x = self.net(x) * self.alphas[t] + self.sigmas[t_next]\n        return x\n")
    found = [(f.code, f.line, f.col) for f in transform(src.encode(), Settings(select=["XLA407"])).findings]
    assert [(c, line) for c, line, _ in found] == [("XLA407", 19), ("XLA407", 19)], found
    # (and what convert does with them: both indexes sent to the device)
    fixed = transform(src.encode(), Settings(select=["XLA4"]))
    assert [(f.code, f.line) for f in fixed.findings] == [("XLA411", 19)] * 2
    assert "self.alphas[torch.tensor([t], device=self.alphas.device)][0]" in fixed.code.decode()
    # a plain class's table is not known to be on the device; nor are pairs of strings
    plain = src.replace("class Diffusion(nn.Module):", "class Diffusion:").replace("        super().__init__()\n", "")
    assert not transform(plain.encode(), Settings(select=["XLA4"])).findings
    moved = plain.replace("register_buffer('alphas', torch.linspace(0.9, 0.1, steps))",
                          "self.alphas = torch.linspace(0.9, 0.1, steps).cuda()")
    assert [f.line for f in transform(moved.encode(), Settings(select=["XLA4"])).findings] == [18]
    words = src.replace("times = list(reversed(torch.arange(steps).tolist()))", "times = ['a', 'b', 'c']")
    assert not transform(words.encode(), Settings(select=["XLA4"])).findings


def test_calls_are_read_through_the_scopes_closures_included():
    # a closure of a function the sampling loop calls runs every step: its
    # tensor-valued `if` is reported with the chain (by name it was never found)
    src = ("import torch\nimport torch.nn as nn\n\nnet = nn.Linear(4, 4)\n\n\ndef update(x, sigma):\n    def first(y):\n"
           "        scale = torch.sqrt(sigma)\n        if scale > 0:\n            return y / scale\n        return y\n\n"
           "    return first(x)\n\n\ndef sample(x, sigmas):\n    for s in sigmas:\n        x = net(x)\n        x = update(x, s)\n"
           "    return x\n")
    found = {(f.code, f.line): f.message for f in transform(src.encode(), Settings()).findings}
    assert ("XLA302", 18) in found
    assert "in `first()`, called from `update()`, called from the loop at line 18" in found[("XLA404", 10)]


def test_a_method_of_the_same_name_is_not_the_function_a_loop_calls():
    # `sync` here is imported; the class's `sync` method marks a step, but the
    # loop does not call it: the loop has no barrier and gets one
    src = ("import torch\nimport torch_xla.core.xla_model as xm\nfrom helpers import sync\n\n\nclass Logger:\n"
           "    def sync(self):\n        xm.mark_step()\n\n\ndef train(model, opt, batches):\n    for x in batches:\n"
           "        model(x.cuda()).sum().backward()\n        opt.step()\n        sync()\n")
    assert ("XLA302", 12) in lint_codes(src)
    # the method itself, called on its instance's class, still counts
    method = src.replace("class Logger:", "class Trainer:").replace(
        "def train(model, opt, batches):", "    def train(self, model, opt, batches):").replace(
        "\n    for x in batches:\n        model(x.cuda()).sum().backward()\n        opt.step()\n        sync()\n",
        "\n        for x in batches:\n            model(x.cuda()).sum().backward()\n            opt.step()\n"
        "            self.sync()\n")
    method = method.replace("\n\n\n    def train", "\n\n    def train")
    assert "XLA302" not in [c for c, _ in lint_codes(method)], method


def test_an_optimizer_is_known_by_what_it_holds_not_its_name():
    # `self.adam` steps (through a closure) one method below the loop: a step
    # loop; `self.optim_sched` is an LR scheduler, named like an optimizer:
    # the loop that steps it once per epoch is none (by name it got the barrier)
    src = (FIXTURES / "optimizer_kinds" / "input.py").read_text()
    lines = src.splitlines()
    barriers = [line for code, line in lint_codes(src) if code == "XLA302"]
    assert barriers == [lines.index("        for i in range(steps):") + 1]


@pytest.mark.xla
@needs_xla
def test_a_step_through_an_optimizer_closure_runs_one_graph_per_step(tmp_path):
    a, out, b, _ = at_two_lengths("optimizer_kinds", tmp_path, "--steps", 2, 4)
    assert b["executions"] > a["executions"], (a, b)
    assert a["compiles"] == b["compiles"], (a, b)
    assert "adam loss" in out


def test_the_loop_a_chain_names_is_the_users_line_after_an_earlier_rewrite():
    """A barrier inserted in an earlier loop moves every later line of the
    tree the host-read rule reads; the loop its message names is still the
    line of the user's file (pix2pix-zero named the line two below its
    denoising loop)."""
    src = ("import torch\n\ndef inner(x, mask):\n    return x[mask.nonzero()]\n\n"
           "def train(model, opt, batches):\n    for b in batches:\n        loss = model(b)\n"
           "        loss.backward()\n        opt.step()\n\n"
           "def gen(model, idx, n):\n    for _ in range(n):\n        out = model(idx)\n"
           "        inner(out, out > 0)\n        idx = out\n    return idx\n")
    outcome = transform(src.encode(), Settings())
    out, findings = outcome.code.decode(), outcome.findings
    assert "torch_xla.sync()" in out.splitlines()[11]  # the barrier went in before the sampling loop
    found = next(f for f in findings if f.code == "XLA405")
    assert src.splitlines()[12].strip() == "for _ in range(n):"
    assert "in `inner()`, called from the loop at line 13" in found.message, found.message


def test_a_loop_over_a_device_tensor_is_hot_where_it_runs():
    """fixtures/element_loop: the loop walks a device tensor in a helper
    called once: the loop, the read and the indexed write are reported with
    the loop's line; a loop over a host copy is not."""
    src = (FIXTURES / "element_loop" / "input.py").read_text()
    lines = src.splitlines()
    found = {(f.code, f.line): f.message for f in transform(src.encode(), Settings()).findings}
    loop = lines.index("    for idx, y_samp in enumerate(y):") + 1
    read = lines.index("        allowed = [c for c in range(classes) if c != y_samp.item()]") + 1
    write = lines.index("        y_neg[idx] = allowed[idx % len(allowed)]") + 1
    per_element = f"runs once per element of device tensor `y` (the loop at line {loop})"
    assert {k for k in found if k[0].startswith("XLA4")} == {("XLA407", loop), ("XLA401", read), ("XLA407", write)}
    assert all(found[k].endswith(per_element) for k in (("XLA407", loop), ("XLA401", read), ("XLA407", write)))
    # the same loop over a host copy (`y.cpu()`): nothing crosses, nothing is reported
    host = src.replace("    y_neg = y.clone()\n", "    y = y.cpu()\n    y_neg = y.clone()\n")
    assert not [c for c, _ in lint_codes(host) if c.startswith("XLA4")]


def test_a_loop_over_a_module_moved_to_the_device_walks_no_tensor():
    """pytorch/xla's test_grad_checkpoint.py: `for n_l, layer in
    enumerate(model)` over `nn.ModuleList([...]).to(device)` runs its layers;
    it was reported as iterating a device tensor."""
    src = ("import torch\nimport torch_xla\n\ndef run():\n    device = torch_xla.device()\n"
           "    model = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)]).to(device)\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for step in range(20):\n"
           "        x = torch.zeros(2, 4, device=device)\n        for n_l, layer in enumerate(model):\n"
           "            x = layer(x)\n        x.sum().backward()\n        opt.step()\n")
    assert "XLA407" not in [c for c, _ in lint_codes(src)]
    # (a loop over a device tensor still is: test_a_loop_over_a_device_tensor_is_hot_where_it_runs)


def test_a_comprehension_over_a_device_tensor_is_reported_like_a_loop():
    """A comprehension walks a device tensor element by element as a `for`
    does (one graph and one read each): reported where the elements are
    tensors (`float((i * 2).exp())`; where they are only used on the host, XLA416
    reads the tensor once: tests/test_element_reads.py); over `y.tolist()`,
    or a module moved to the device, not."""
    src = ("import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nitos = {0: 'a', 1: 'b', 2: 'c', 3: 'd'}\n\n"
           "def decode(loader, words):\n    for x in loader:\n        y = model(x.cuda()).argmax(-1)\n"
           "        words.append([float((i * 2).exp()) for i in y])\n")
    found = [(f.code, f.line, f.col) for f in transform(src.encode(), Settings()).findings if f.code == "XLA407"]
    assert found == [("XLA407", 9, 53)], found  # (on `y`)
    message = next(f.message for f in transform(src.encode(), Settings()).findings if f.code == "XLA407")
    assert "`y.tolist()`" in message and message.endswith("runs every step (in the loop at line 7)")
    assert "XLA407" not in [c for c, _ in lint_codes(src.replace("for i in y]", "for i in y.tolist()]"))]
    layers = src.replace("model = torch.nn.Linear(4, 4).cuda()", "model = torch.nn.Linear(4, 4).cuda()\n"
                         "layers = torch.nn.ModuleList([torch.nn.Linear(4, 4)]).cuda()").replace(
        "words.append([float((i * 2).exp()) for i in y])", "outs = [layer(x) for layer in layers]")
    assert "XLA407" not in [c for c, _ in lint_codes(layers)]


@pytest.mark.xla
@needs_xla
def test_a_loop_over_a_device_tensor_compiles_per_element_on_xla(tmp_path):
    """What lint predicts for fixtures/element_loop: the compiles grow with
    the number of elements walked (each element, and each write at a
    Python index, is a graph of its own)."""
    a, _, b, out = at_two_lengths("element_loop", tmp_path, "--batch", 4, 8)
    assert b["compiles"] - a["compiles"] >= 4, (a, b)
    assert "loss" in out


AUTOGRAD_FUNCTION = '''\
import torch
{head}

class MyReLU({base}):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        print(x.sum().item())
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad_output):
        x, = ctx.saved_tensors
        grad_x = grad_output.clone()
        grad_x[x < 0] = 0
        return grad_x

{alias}
device = torch.device("cuda")
x = torch.randn(8, 4, device=device)
w = torch.randn(4, 2, device=device, requires_grad=True)
for t in range(3):
    loss = {call}(x.mm(w)).sum()
    loss.backward()
    with torch.no_grad():
        w -= 1e-3 * w.grad
        w.grad.zero_()
'''


@pytest.mark.parametrize("head, base, alias, call", [
    ("", "torch.autograd.Function", "", "MyReLU.apply"),
    ("from torch.autograd import Function", "Function", "", "MyReLU.apply"),
    ("", "torch.autograd.Function", "relu = MyReLU.apply", "relu"),  # PyTorch's tutorial
])
def test_an_autograd_functions_passes_run_every_step_where_the_loop_applies_it(head, base, alias, call):
    """jcjohnson/pytorch-examples' two_layer_net_custom_function: the loop
    calls ``MyReLU.apply``; its ``forward`` runs there and its ``backward``
    at ``loss.backward()``, every step.  The mask assignment in the backward
    (a CPU fallback and a graph per step on XLA: 20 recompilations in 50
    steps, measured) and the read in the forward are on the hot path."""
    src = AUTOGRAD_FUNCTION.format(head=head, base=base, alias=alias, call=call)
    found = {(f.code, f.line): f for f in transform(src.encode(), Settings()).findings}
    lines = src.splitlines()
    mask = lines.index("        grad_x[x < 0] = 0") + 1
    read = lines.index("        print(x.sum().item())") + 1
    assert ("XLA406", mask) in found and "runs every step: in `backward()`" in found["XLA406", mask].message
    assert ("XLA401", read) in found and "runs every step: in `forward()`" in found["XLA401", read].message


def test_a_class_named_like_an_autograd_function_that_is_not_one_runs_nothing_every_step():
    src = AUTOGRAD_FUNCTION.format(head="", base="object", alias="", call="MyReLU.apply")
    assert not [code for code, _ in lint_codes(src) if code in ("XLA406", "XLA401")]


def test_lines_that_only_compute_tensors_after_the_step_go_before_its_barrier():
    """fixtures/metric_after_step: the accuracy computed from the step's
    outputs after the optimizer step joins the step's graph (the barrier
    after it, before the first read).  A line that reads, calls a function
    of the program, or changes what it would skip over stays after it."""
    src = (FIXTURES / "metric_after_step" / "input.py").read_text()
    out = transform(src.encode(), Settings())
    code = out.code.decode()
    assert ("        optimizer.step()\n        correct = (out.argmax(dim=1) == y).sum()\n"
            "        acc = correct.float() / y.numel()\n        torch_xla.sync()\n"
            "        history.append((loss.item(), acc.item()))\n") in code, code
    assert [f.message for f in out.findings if f.code == "XLA302"] == [
        "step loop: `torch_xla.sync()` added right after its optimizer step and the lines after it that only compute "
        "tensors (the host reads after it find the step computed)"]
    stops = (("        acc = correct.float() / y.numel()\n", "        n = correct.item()\n        acc = n / 16\n"),
             ("        acc = correct.float() / y.numel()\n", "        acc = metric(correct, y)\n"),
             ("        acc = correct.float() / y.numel()\n", "        correct.clamp_(0)\n"
              "        acc = correct.float() / 16\n"))
    for old, new in stops:
        changed = transform(src.replace(old, new).encode(), Settings()).code.decode()
        assert "        correct = (out.argmax(dim=1) == y).sum()\n        torch_xla.sync()\n" in changed, changed
    # the comparison is a tensor: `(out.argmax(dim=1) == y)` alone, too
    alone = src.replace("        correct = (out.argmax(dim=1) == y).sum()\n        acc = correct.float() / y.numel()\n",
                        "        hits = out.argmax(dim=1) == y\n        acc = hits.float().mean()\n")
    assert "        acc = hits.float().mean()\n        torch_xla.sync()\n" in transform(alone.encode(), Settings()).code.decode()


@pytest.mark.xla
@needs_xla
def test_the_metric_in_the_steps_graph_runs_once_a_step_with_the_originals_numbers(tmp_path):
    """fixtures/metric_after_step on XLA at 3 and 6 steps: compiles flat, one
    execution a step (with the barrier right after the step: two, the
    accuracy a graph of its own), and the numbers the original prints on
    the CPU."""
    a, out3, b, out6 = at_two_lengths("metric_after_step", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"], (a, b)
    assert b["executions"] - a["executions"] == 3, (a, b)
    original = original_output("metric_after_step", "--steps", "6")

    def numbers(text):
        return [float(w) for line in text.splitlines() for w in line.split()[1::2]]

    assert len(numbers(out6)) == 18 and numbers(out6) == pytest.approx(numbers(original), rel=1e-4, abs=1e-5)


# -- a plain helper object's method, called from a step loop -----------------------------------------------------

OBJECT_HELPER = ("import torch\n\n\nclass RF:\n    def __init__(self, model):\n        self.model = model\n\n"
                 "    def forward(self, x):\n        out = self.model(x)\n        loss = (out ** 2).mean(dim=1)\n"
                 "        seen = loss.detach().cpu().tolist()\n        return loss.mean(), seen\n\n\n"
                 "model = torch.nn.Linear(4, 4).cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                 "rf = RF(model)\nfor x in loader:\n    loss, seen = rf.forward(x.cuda())\n    loss.backward()\n"
                 "    opt.step()\n")


def test_a_plain_objects_method_called_from_the_step_loop_runs_every_step():
    """minRF's ``rf = RF(model)``, then ``rf.forward(x, c)`` in the step
    loop: the method runs every step, and its host read says so, with the
    call it is reached through."""
    found = {(f.code, f.line): f.message for f in transform(OBJECT_HELPER.encode(), Settings()).findings}
    assert "runs every step: in `forward()`, called from the loop at line 18" in found[("XLA402", 11)]


@pytest.mark.parametrize("change", [
    ("class RF:", "class RF(Base):"),  # a base class: not a plain object
    ("rf = RF(model)\n", "rf = RF(model)\nif flag:\n    rf = Other()\n"),  # bound to two kinds of objects
    ("rf = RF(model)\n", "rf = make_rf(model)\n"),  # made by something else
])
def test_an_object_that_is_not_plainly_one_classes_is_not_followed(change):
    source = OBJECT_HELPER.replace(*change)
    assert ("XLA402", 11) not in [(f.code, f.line) for f in transform(source.encode(), Settings()).findings]


def test_a_counter_handed_to_a_plain_objects_method_indexes_its_tables_with_a_device_int():
    """fixtures/object_sampler: ``schedule.ddim_step(model, x, i)`` in the
    sampling loop, ``self.alphas_cumprod[t]`` in the method (XLA411)."""
    found = lint_codes((FIXTURES / "object_sampler" / "input.py").read_text())
    assert [line for code, line in found if code == "XLA411"] == [24, 25]


@pytest.mark.xla
@needs_xla
def test_the_object_sampler_compiles_once_with_the_originals_numbers(tmp_path):
    """Its conversion on XLA at 3 and 6 steps: compiles flat (4 -> 7 before
    the method was followed), one execution a step, and the sample the
    original prints on the CPU."""
    out6 = one_execution_a_step("object_sampler", tmp_path)
    original = original_output("object_sampler", "--steps", "6")
    assert len(printed_numbers(out6)) == 16
    assert printed_numbers(out6) == pytest.approx(printed_numbers(original), rel=1e-4, abs=1e-5)
