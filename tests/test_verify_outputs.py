"""verify's output comparison without running anything (no torch_xla needed)."""

import pytest

from xlaport.verify.comparison import Comparison
from xlaport.verify.printed import compare_text


def test_timings_are_left_out_even_when_two_reference_runs_print_the_same_value():
    """Two fast reference runs can both print `time: 0.004s`: a timing is
    recognised by its unit or the word before it, not only by varying."""
    ref = "step 0 | 12.34 ms/batch | 81.0 it/s\nloss 0.08485 time: 0.004s\n"
    cand = "step 0 | 55.10 ms/batch | 18.2 it/s\nloss 0.08485 time: 0.020s\n"
    out = Comparison()
    compare_text("stdout", [ref, ref], cand, 1e-3, 1e-5, out)
    assert all(o.ok for o in out.outputs), out.outputs
    # one entry per line whose timings were left out, naming them as written; nothing varied
    assert out.by_form == ["stdout line 1: 12.34 ms, 81.0 it/s (of `step 0 | 12.34 ms/batch | 81.0 it/s`)",
                           "stdout line 2: 0.004s (of `loss 0.08485 time: 0.004s`)"], out.by_form
    assert out.varies == []
    # the step index and the loss are still compared
    wrong = Comparison()
    compare_text("stdout", [ref, ref], cand.replace("0.08485", "0.09999"), 1e-3, 1e-5, wrong)
    assert [o.ok for o in wrong.outputs] == [True, False]


def test_numbers_that_differ_between_reference_runs_are_left_out():
    out = Comparison()
    compare_text("stdout", ["seed 17 loss 1.5\n", "seed 23 loss 1.5\n"], "seed 99 loss 1.5\n", 1e-3, 1e-5, out)
    assert all(o.ok for o in out.outputs) and out.varies == ["stdout line 1, number 1: seed 17 loss 1.5"]


def test_a_whole_model_saved_by_a_module_verify_does_not_import_still_compares(tmp_path):
    """`torch.save(model, "model.pt")` pickles the program's class by its
    module name (`model.RNNModel`): verify reads its state without importing it."""
    import subprocess
    import sys

    torch = pytest.importorskip("torch")
    from xlaport.verify.outputs import load_any

    (tmp_path / "prog").mkdir()
    (tmp_path / "prog" / "mynet_mod.py").write_text(
        "import torch.nn as nn\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = nn.Linear(2, 3)\n")
    subprocess.run([sys.executable, "-c", "import torch, mynet_mod; torch.manual_seed(0); "
                    "torch.save(mynet_mod.Net(), 'model.pt'); torch.save({'net': mynet_mod.Net(), 'k': 2}, 'ck.pt')"],
                   cwd=tmp_path / "prog", check=True)
    state = load_any(tmp_path / "prog" / "model.pt")
    assert sorted(state) == ["fc.bias", "fc.weight"] and tuple(state["fc.weight"].shape) == (3, 2)
    nested = load_any(tmp_path / "prog" / "ck.pt")
    assert nested["k"] == 2 and isinstance(nested["net"]["fc.bias"], torch.Tensor)


def test_library_frames_from_another_environment_are_not_user_code(tmp_path):
    """A venv with `--system-site-packages`, or a `.pth` pointing at another
    environment: torch_xla's own frames there are not the user's lines (a
    per-step sync site was reported at torch_xla.py:87)."""
    from xlaport.verify import harness

    other = tmp_path / "base" / "lib" / "python3.11" / "site-packages"
    other.mkdir(parents=True)
    project = tmp_path / "project"
    roots = harness.system_roots([str(project), str(other), str(tmp_path / "base" / "dist-packages")])
    assert str(other.resolve()) in roots and str((tmp_path / "base" / "dist-packages").resolve()) in roots
    assert not any(str(project.resolve()).startswith(r) for r in roots)


def test_an_output_off_by_the_originals_own_float_order_noise_is_accepted_and_said():
    from xlaport.verify.outputs import Compared, within_float_order

    compared = Comparison(outputs=[Compared("w.pth[a]", False, 4e-4, 0.3), Compared("w.pth[b]", False, 4e-3, 2.0),
                                   Compared("w.pth[c]", False, 1e-6, 0.1), Compared("w.pth[d]", True, 0.0, 0.0)])
    # the original moved [a] and [b] by 1e-4 with another thread count, [c] not at all
    within_float_order(compared, {"w.pth[a]": 1e-4, "w.pth[b]": 1e-4, "w.pth[c]": 0.0}, "with 1 thread instead of 2")
    assert [o.ok for o in compared.outputs] == [True, False, False, True]  # 4x the noise; 40x; no noise at all
    assert compared.float_order == ["w.pth[a]: off by 0.0004; the original moved by 0.0001 with 1 thread instead of 2"]


def test_files_named_by_the_time_or_the_process_are_not_missing(tmp_path):
    """makemore's TensorBoard event file (events.out.tfevents.<time>.<host>.<pid>.0)
    has another name in every run: not a file one side failed to write."""
    from xlaport.verify.outputs import compare_files

    def files(*names):
        made = {}
        for n in names:
            (tmp_path / n).write_text("1.0\n")
            made[n] = tmp_path / n
        return made

    refs = [files("log.txt", "events.out.tfevents.17956.vm.4491.0"), files("log.txt", "events.out.tfevents.17957.vm.4503.0")]
    out = Comparison()
    compare_files(refs, files("log.txt", "events.out.tfevents.17958.vm.4537.0"), 1e-3, 1e-5, out)
    assert all(o.ok for o in out.outputs) and [o.name.split(":")[0] for o in out.outputs] == ["log.txt line 1"]
    assert out.varies == ["events.out.tfevents.17956.vm.4491.0 (written under another name by each run)"]
    # a file of a stable name that the conversion does not write still fails; so does an extra one
    out = Comparison()
    compare_files(refs, files("events.out.tfevents.17958.vm.4537.0", "other.txt"), 1e-3, 1e-5, out)
    assert sorted(o.name for o in out.outputs if not o.ok) == ["log.txt (not written by the conversion)",
                                                                "other.txt (not written by the reference)"]


@pytest.mark.parametrize("ref,cand", [
    ("epoch 1 loss 0.5000 781ms\n", "epoch 1 loss 0.5000 1m2s\n"),  # each side's duration by its own form
    ("step 3 loss 0.25 eta 0:01:23 mem 1.2GB\n", "step 3 loss 0.25 eta 1:02:03 mem 3.4GB\n"),
    ("2026-11-26 19:38:53 loss 0.25\n", "2026-11-27 01:00:00 loss 0.25\n"),
])
def test_durations_dates_and_sizes_are_not_outputs_by_their_form(ref, cand):
    """Issue 39: one reference run, so nothing 'varies': the form alone says
    these numbers are not results.  The loss is still compared."""
    out = Comparison()
    compare_text("stdout", [ref], cand, 1e-3, 1e-5, out)
    assert [o.ok for o in out.outputs] == [True], out.outputs
    wrong = Comparison()
    compare_text("stdout", [ref], cand.replace("0.25", "0.35").replace("0.5000", "0.6000"), 1e-3, 1e-5, wrong)
    assert [o.ok for o in wrong.outputs] == [False]


@pytest.mark.torch
def test_images_and_numpy_files_are_compared_as_arrays(tmp_path):
    """Issue 39: an image a program writes is compared pixel by pixel (one
    level of 255 apart is rounding); an inverted image fails; `.npy` and
    `.npz` arrays are compared like tensors."""
    import numpy as np
    from PIL import Image

    from xlaport.verify.outputs import compare_files

    a = (np.arange(64).reshape(8, 8) * 3).astype("uint8")
    for name, arr in (("ref.png", a), ("near.png", a + 1), ("inverted.png", 255 - a)):
        Image.fromarray(arr).save(tmp_path / name)
    np.save(tmp_path / "ref.npy", a / 7.0)
    np.save(tmp_path / "near.npy", a / 7.0 + 1e-9)
    np.savez(tmp_path / "ref.npz", x=a / 7.0)
    np.savez(tmp_path / "neg.npz", x=-a / 7.0)

    def judged(ref, cand):
        out = Comparison()
        suffix = ref[ref.rindex("."):]
        compare_files([{f"out{suffix}": tmp_path / ref}], {f"out{suffix}": tmp_path / cand}, 1e-3, 1e-5, out)
        assert not out.not_compared, out.not_compared
        return [(o.name, o.ok) for o in out.outputs]

    assert judged("ref.png", "near.png") == [("out.png", True)]
    assert judged("ref.png", "inverted.png") == [("out.png", False)]
    assert judged("ref.npy", "near.npy") == [("out.npy", True)]
    assert judged("ref.npz", "neg.npz") == [("out.npz[x]", False)]


def _adamw_weights(steps, bf16):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.zeros_(m.bias)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = (model(x).float() - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.torch
def test_tensors_are_judged_norm_wise_at_the_precision_that_ran(tmp_path):
    """Issue 39: bf16 autocast with AdamW and zero-initialised biases failed
    on the relative error of bias elements near zero; judged against each
    tensor's own norm it passes, and a dropped step or a sign error in one
    bias element still fails."""
    import torch

    from xlaport.verify.outputs import compare_files, tolerance

    ref, port = _adamw_weights(3, bf16=False), _adamw_weights(3, bf16=True)
    dropped = _adamw_weights(2, bf16=True)
    flipped = {k: v.clone() for k, v in port.items()}
    flipped["0.bias"][3] = -flipped["0.bias"][3]
    rtol, atol, _ = tolerance(None, None, ["torch.bfloat16"])
    paths = {}
    for name, weights in (("ref", ref), ("port", port), ("dropped", dropped), ("flipped", flipped)):
        paths[name] = tmp_path / f"{name}.pt"
        torch.save(weights, paths[name])

    def failed(name):
        out = Comparison()
        compare_files([{"w.pt": paths["ref"]}], {"w.pt": paths[name]}, rtol, atol, out, follow=True)
        return sorted(o.name for o in out.outputs if not o.ok)

    assert failed("port") == []
    assert failed("dropped") == ["w.pt[0.bias]", "w.pt[2.bias]"]  # (3 steps move the weights less than bf16 noise)
    assert failed("flipped") == ["w.pt[0.bias]"]


def test_a_word_that_ends_like_a_duration_word_is_not_one():
    """`beta1=0.5` is no `eta`: the words that announce a duration are whole
    words (dcgan's argument dump lost its numbers to this)."""
    from xlaport.verify.printed import _values

    assert _values("Namespace(beta1=0.5, lr=0.0002, niter=1)") == ["1", "0.5", "0.0002", "1"]
    assert _values("eta 12 loss 0.5") == ["0.5"]


def test_a_sampled_text_is_compared_word_for_word():
    """A sampler prints words, not numbers (nanoGPT's `sample.py`): its lines
    are outputs.  A line that differs between the reference runs (a random
    name, a path) is left out; the devices are named alike."""
    ref = "Using device cuda\nKING RICHARD: thou art\nsaved to run_ab\n"
    refs = [ref, ref.replace("run_ab", "run_xy")]
    out = Comparison()
    compare_text("stdout", refs, ref.replace("cuda", "xla"), 1e-3, 1e-5, out)
    assert [(o.name, o.ok) for o in out.outputs] == [("stdout lines without numbers (2 alike, word for word)", True)]
    assert out.varies == ["stdout: 1 line(s) without numbers"]
    wrong = Comparison()
    compare_text("stdout", refs, ref.replace("thou art", "thou arf"), 1e-3, 1e-5, wrong)
    assert [o.ok for o in wrong.outputs] == [False, True]
    assert "'KING RICHARD: thou art', the conversion printed 'KING RICHARD: thou arf'" in wrong.outputs[0].name
    fewer = Comparison()
    compare_text("stdout", refs, "Using device xla\n", 1e-3, 1e-5, fewer)
    assert [o.ok for o in fewer.outputs] == [False]


@pytest.mark.torch
def test_integer_tensors_agree_element_for_element(tmp_path):
    """Tokens a sampler drew are compared exactly (one token off fails, at
    any tolerance); among thousands of argmax labels, as many may differ as
    rtol allows of their number (a near tie)."""
    import torch

    from xlaport.verify.outputs import compare_files

    tokens = torch.tensor([[5, 17, 3, 9, 40000, 2]])
    labels = torch.arange(5000) % 10

    def failed(toks, labs):
        torch.save({"y": tokens, "pred": labels}, tmp_path / "ref.pt")
        torch.save({"y": toks, "pred": labs}, tmp_path / "cand.pt")
        out = Comparison()
        compare_files([{"o.pt": tmp_path / "ref.pt"}], {"o.pt": tmp_path / "cand.pt"}, 1.6e-2, 1e-5, out)
        return sorted(o.name for o in out.outputs if not o.ok)

    one_off = tokens.clone()
    one_off[0, 4] = 40001  # within 1.6e-2 of 40000 as a number, another token as a token
    flipped = labels.clone()
    flipped[:3] = 9
    assert failed(tokens, labels) == []
    assert failed(one_off, labels) == ["o.pt[y]"]
    assert failed(tokens, flipped) == []  # 3 of 5000
    flipped[:100] = 9
    assert failed(tokens, flipped) == ["o.pt[pred]"]  # 90 of 5000 differ: more than 1.6e-2 of them


def test_a_programs_own_messages_are_not_values(tmp_path):
    """`print("done")` is compared, but it is the program's own string: a run
    whose only output it is compared no value.  A sampled text is not in the
    source: it is a value."""
    from xlaport.verify.printed import messages_only

    src = tmp_path / "train.py"
    src.write_text('print("Training finished!")\nprint(f"{model} on {device}")\nprint("done")\n')
    assert messages_only("Training finished!\ndone\n", [src])
    assert not messages_only("Training finished!\nKING RICHARD: thou art\n", [src])
    assert not messages_only("loss 0.5\n", [src])  # (no line without numbers: nothing to say)


def test_a_global_the_conversion_holds_as_a_number_is_compared_by_its_value(tmp_path):
    """XLA416 reads a walk's elements as numbers: a module-level `for i in y`
    leaves `i` a 0-dim tensor in the original and an int in the conversion.
    A run's leftover numbers are compared with a tensor the other run holds
    there, by value; numbers on both sides (a device count, a timing) are not
    compared at all."""
    torch = pytest.importorskip("torch")
    from xlaport.verify.outputs import LEFTOVERS, compare_files

    def run(name, **values):
        torch.save(values, tmp_path / name)
        return {LEFTOVERS: tmp_path / name}

    refs = [run("r1.pt", i=torch.tensor(4), w=torch.ones(2), gpus=0), run("r2.pt", i=torch.tensor(4),
                                                                           w=torch.ones(2), gpus=0)]
    for cand, ok in ((run("same.pt", i=4, w=torch.ones(2), gpus=1), True),
                     (run("other.pt", i=3, w=torch.ones(2), gpus=1), False)):
        out = Comparison()
        compare_files(refs, cand, 1e-3, 1e-5, out)
        by_key = {o.name: o.ok for o in out.outputs}
        assert by_key == {f"{LEFTOVERS}[i]": ok, f"{LEFTOVERS}[w]": True}, by_key
    # a global only the conversion has is a name it added (XLA418's `d_x_step`): not the program's;
    # one only the original has is an output the conversion lost
    out = Comparison()
    compare_files(refs, run("added.pt", i=4, w=torch.ones(2), d_x_step=torch.ones(1)), 1e-3, 1e-5, out)
    assert {o.name: o.ok for o in out.outputs} == {f"{LEFTOVERS}[i]": True, f"{LEFTOVERS}[w]": True}
    out = Comparison()
    compare_files(refs, run("lost.pt", i=4), 1e-3, 1e-5, out)
    assert {o.name: o.ok for o in out.outputs} == {f"{LEFTOVERS}[i]": True, f"{LEFTOVERS}[w]": False}


def test_a_runs_leftovers_hold_its_global_tensors_and_numbers(tmp_path):
    torch = pytest.importorskip("torch")
    from xlaport.verify.observer import _save_leftovers

    path = tmp_path / "left.pt"
    _save_leftovers({"i": 4, "lr": 0.5, "t": torch.ones(2), "flag": True, "name": "x", "mask": torch.ones(2) > 0,
                     "_private": 3}, str(path))
    saved = torch.load(path)
    assert set(saved) == {"i", "lr", "t"} and saved["i"] == 4 and saved["lr"] == 0.5


@pytest.mark.torch
def test_a_state_dict_saved_through_a_wrapper_the_reference_did_not_make_compares_by_the_modules_names(tmp_path):
    """kuangliu/pytorch-cifar: `if device == 'cuda': net = nn.DataParallel(net)`.
    The reference on the CPU does not wrap, the conversion (`'xla'`) does: its
    checkpoint's names start with `module.` (`_orig_mod.` for torch.compile).
    The values are compared under the module's own names, and still fail where
    they differ; two dicts whose names differ otherwise are not matched up."""
    import torch

    from xlaport.verify.outputs import compare_files

    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    ref = net.state_dict()

    def failed(cand):
        torch.save({"net": ref, "acc": 1.0}, tmp_path / "ref.pt")
        torch.save({"net": cand, "acc": 1.0}, tmp_path / "cand.pt")
        out = Comparison()
        compare_files([{"ck.pt": tmp_path / "ref.pt"}], {"ck.pt": tmp_path / "cand.pt"}, 1e-3, 1e-5, out)
        return sorted(o.name for o in out.outputs if not o.ok), len(out.outputs)

    assert failed(torch.nn.DataParallel(net).state_dict()) == ([], len(ref) + 1)
    assert failed({f"_orig_mod.{k}": v for k, v in ref.items()}) == ([], len(ref) + 1)
    moved = {f"module.{k}": v.clone() for k, v in ref.items()}
    moved["module.0.bias"] += 1
    assert failed(moved)[0] == ["ck.pt[net][0.bias]"]
    renamed = {f"other.{k}": v for k, v in ref.items()}
    assert len(failed(renamed)[0]) == 2 * len(ref)  # nothing matched: each name is missing on one side
