"""The whole CUDA surface: nothing silently missed, and converted trainers run
on XLA's CPU backend, agree with the eager CPU run, keep their compile count
at two run lengths and resume from their own checkpoints."""

import os
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

from codemods.analysis.cuda import count_references, cuda_references
from codemods.base import TreeCache
from tests.conftest import convert_text
from tests.test_runnable_ports import needs_xla
from xlaport.engine import Settings, transform
from xlaport.linemap import line_map as _line_map

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CUDA_FIXTURES = ["gpt_amp", "ddp_spawn", "torchrun_ddp", "device_choice", "surface_zoo", "device_zoo"]


def _left_lines(code: bytes):
    tree = TreeCache(cst.parse_module(code), code)
    from libcst.metadata import MetadataWrapper, PositionProvider

    positions = MetadataWrapper(tree.module, unsafe_skip_copy=True).resolve(PositionProvider)
    return {positions[n].start.line for n, _ in cuda_references(tree, lambda n: tree.import_qualnames(n) or set())}


@pytest.mark.parametrize("name", CUDA_FIXTURES)
def test_every_cuda_reference_is_rewritten_or_reported(name):
    """No silent misses: each CUDA reference left in the output has a report
    on its line (mapped back to the input), and the counts add up."""
    source = (FIXTURES / name / "input.py").read_bytes()
    outcome = transform(source, Settings())
    found, left = outcome.cuda
    assert found == count_references(TreeCache(cst.parse_module(source), source))
    assert found > 0 and 0 <= left <= found
    reported = {f.line for f in outcome.findings if not f.fix}
    out_lines = _left_lines(outcome.code)
    assert len(out_lines) <= left
    # every reference left is reported: through the line map verify uses too
    back = _line_map(source.decode(), outcome.code.decode())
    for line in out_lines:
        assert back(line) in reported, f"{name}: output line {line} (input {back(line)}) left unreported"


def test_surface_zoo_counts():
    """Measured on the zoo: 36 references, 7 left for review: 5 with no XLA
    counterpart (memory statistics, NVTX, the device name, an int device
    index) plus a launch-time device count and the availability test
    guarding that index (an index to place on is no CUDA-only side: XLA116
    leaves it).  Its stream, only entered, goes (XLA110)."""
    outcome = transform((FIXTURES / "surface_zoo" / "input.py").read_bytes(), Settings())
    assert outcome.cuda == (36, 7)
    codes = {f.code for f in outcome.findings}
    assert {"XLA105", "XLA108", "XLA110", "XLA111", "XLA112", "XLA113", "XLA114", "XLA115", "XLA121", "XLA122", "XLA131",
            "XLA132", "XLA141", "XLA142", "XLA143", "XLA144"} <= codes
    assert "XLA199" not in codes  # every idiom in it has its own rule


def test_trainers_have_no_cuda_left():
    for name in ("gpt_amp", "torchrun_ddp", "device_choice"):
        assert transform((FIXTURES / name / "input.py").read_bytes(), Settings()).cuda[1] == 0, name


def test_catch_all_reports_an_unknown_cuda_api_with_its_line():
    out, findings = convert_text("import torch\n\nx = 1\ntorch.cuda.jiterator._create_jit_fn(code)\n")
    assert [(f.code, f.line) for f in findings] == [("XLA199", 4)]


def test_catch_all_respects_the_owner_rule_being_off():
    src = "import torch\nx = torch.zeros(2).cuda()\n"
    _, findings = convert_text(src, ignore=["XLA101"])
    assert findings == []
    _, findings = convert_text(src, select=["XLA199"])
    assert [f.code for f in findings] == ["XLA199"]


def test_synchronize_does_not_count_as_a_hand_placed_barrier():
    """A converted torch.cuda.synchronize() is xlaport's own sync: the step
    loop still gets its barrier (this was missed on nanoGPT-style scripts)."""
    src = ("import torch\n\nfor x in batches:\n    model(x).sum().backward()\n    opt.step()\n\n"
           "torch.cuda.synchronize()\n")
    out, findings = convert_text(src)
    assert "    opt.step()\n    torch_xla.sync()\n" in out
    assert "torch_xla.sync(wait=True)" in out


def test_availability_guarding_an_unsupported_api_takes_the_other_side():
    src = ("import torch\n\nif torch.cuda.is_available():\n    print(torch.cuda.memory_allocated())\n"
           "else:\n    print(0)\n")
    out, findings = convert_text(src)
    assert out == "import torch\n\nprint(0)\n"
    assert ("XLA116", True) in {(f.code, f.fix) for f in findings}


def test_scaler_passed_to_a_function_is_kept_disabled():
    src = ("import torch\n\nscaler = torch.cuda.amp.GradScaler()\ntrain(model, scaler)\n"
           "def train(model, scaler):\n    scaler.scale(model()).backward()\n")
    out, _ = convert_text(src)
    assert 'scaler = torch.amp.GradScaler("cpu", enabled=False)\n' in out
    assert "    model().backward()\n" in out


def test_cuda_with_a_callers_device_keeps_it():
    out, _ = convert_text("def place(m, device, gpu):\n    a = m.cuda(device)\n    return m.cuda(gpu)\n")
    assert "a = m.to(device)" in out
    assert "return m.to(torch_xla.device())" in out


def test_cpu_target_neutralises_cuda_only_calls():
    """verify's reference: the same program, runnable on a host with no GPU."""
    source = (FIXTURES / "surface_zoo" / "input.py").read_bytes()
    out = transform(source, Settings(select=["XLA1"], target="cpu")).code.decode()
    for gone in ("torch.cuda.synchronize", "torch.cuda.empty_cache", "cuda.set_device", "GradScaler()",
                 '"nccl"', "device_ids", "mp.spawn", "pin_memory=True"):
        assert gone not in out, gone
    assert 'torch.autocast("cpu", dtype=torch.bfloat16)' in out
    assert 'init_process_group("gloo"' in out
    assert "worker(0, *(1,))" in out
    assert "torch_xla" not in out


@pytest.mark.parametrize("target", ["torch_xla-2.9", "cpu", "torchtpu"])
def test_a_cuda_device_context_becomes_a_null_context(target):
    """SimCLR's `with torch.cuda.device(args.gpu_index):` -- a no-op where
    its CUDA test set the index to -1, a CUDA initialisation (and a crash)
    once the test is true on XLA."""
    source = "import torch\n\nwith torch.cuda.device(args.gpu_index):\n    train()\n"
    out, findings = convert_text(source, target=target)
    assert "with contextlib.nullcontext():\n    train()" in out and "import contextlib" in out
    assert [f.code for f in findings if f.fix] == ["XLA112"]


def test_a_location_read_elsewhere_or_suppressed_stays():
    """The `loc` made for a `map_location` goes with it only where nothing
    else reads it and the rewrite is made (XLA131's own examples drop one)."""
    source = ('import torch\n\n\ndef resume(path, gpu):\n    loc = "cuda:{}".format(gpu)\n    print(loc)\n'
              "    return torch.load(path, map_location=loc)\n")
    assert "    loc = " in convert_text(source)[0]
    suppressed = source.replace("    print(loc)\n", "").replace("map_location=loc)", "map_location=loc)  # noqa: XLA131")
    assert "    loc = " in convert_text(suppressed)[0]


LOADS = ("import torch\n\nmodel = torch.nn.Linear(2, 1).cuda()\nstate = torch.load('ckpt.pt')\n"
         "model.load_state_dict(state)\nprint(model(torch.ones(1, 2).cuda()).item())\n")


def test_a_load_with_no_location_loads_to_the_cpu():
    out, findings = convert_text(LOADS)
    assert "state = torch.load('ckpt.pt', map_location=\"cpu\")\n" in out, out
    assert [f.line for f in findings if f.code == "XLA131" and f.fix] == [4]
    assert convert_text(out)[0] == out
    # a location given, a second positional argument or keywords that may hold one: as before
    for call in ("torch.load('ckpt.pt', map_location='cpu')", "torch.load('ckpt.pt', 'cpu')",
                 "torch.load('ckpt.pt', **opts)"):
        assert call in convert_text(LOADS.replace("torch.load('ckpt.pt')", call))[0]


def _saved_on_a_gpu(path, state):
    """A checkpoint whose tensors say they were saved on ``cuda:0`` (as the
    original's are on its GPU), made on this host without one."""
    import torch
    import torch.serialization as serialization

    tag = serialization.location_tag
    serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(state, path)
    finally:
        serialization.location_tag = tag


# ------------------------------------------------------------------ on XLA

needs_xla = pytest.mark.xla


def _verify(name, *args, **options):
    from xlaport.verify.verification import verify

    report = verify(FIXTURES / name / "input.py", args=args, timeout=300, root=FIXTURES / name, **options)
    assert report.error is None, report.error
    assert report.verdict == "pass", (report.failures, [o for o in report.outputs if not o.ok])
    assert report.metrics["executions"] > 0
    return report


@pytest.mark.xla
@needs_xla
def test_gpt_trainer_runs_agrees_and_compiles_the_same_at_two_lengths(tmp_path):
    # bf16 autocast on XLA against the CPU run (nanoGPT disables autocast on CPU)
    four = _verify("gpt_amp", "--max-iters", "4", "--out-dir", ".", rtol=5e-2, atol=2e-2)
    eight = _verify("gpt_amp", "--max-iters", "8", "--out-dir", ".", rtol=5e-2, atol=2e-2)
    assert four.metrics["compiles"] == eight.metrics["compiles"] == 2
    assert any(o.name.startswith("ckpt.pt[model]") for o in four.outputs)
    assert eight.metrics["steps"] == 8


@pytest.mark.xla
@needs_xla
def test_converted_gpt_trainer_resumes_from_its_own_checkpoint(tmp_path):
    converted = tmp_path / "train.py"
    converted.write_bytes(transform((FIXTURES / "gpt_amp" / "input.py").read_bytes(), Settings()).code)
    env = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, str(converted), "--max-iters", "3", "--out-dir", "ck"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run([sys.executable, str(converted), "--max-iters", "5", "--out-dir", "ck", "--resume"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resumed at iter 3" in second.stdout
    import torch

    state = torch.load(tmp_path / "ck" / "ckpt.pt", map_location="cpu")
    assert state["iter_num"] == 5
    assert all(t.device.type == "cpu" for t in state["model"].values())  # xm.save wrote CPU tensors


@pytest.mark.xla
@needs_xla
def test_spawned_ddp_trainer_agrees_exactly_and_compiles_the_same_at_two_lengths():
    two = _verify("ddp_spawn", "--epochs", "2", warmup_steps=4)
    three = _verify("ddp_spawn", "--epochs", "3", warmup_steps=4)
    assert two.metrics["compiles"] == three.metrics["compiles"]
    assert all(o.max_abs_err < 1e-5 for o in two.outputs)
    assert three.metrics["steps"] >= 24  # 8 batches x 3 epochs (in the process torch_xla.launch started, seen in the graph dump)


@pytest.mark.xla
@needs_xla
def test_torchrun_trainer_runs_under_emulated_torchrun(monkeypatch):
    monkeypatch.setenv("XLAPORT_TORCHRUN", "1")
    six = _verify("torchrun_ddp", "--steps", "6", warmup_steps=4, rtol=5e-2, atol=2e-2)
    ten = _verify("torchrun_ddp", "--steps", "10", warmup_steps=4, rtol=5e-2, atol=2e-2)
    assert any(o.name.startswith("torchrun.pt") for o in six.outputs)
    assert six.metrics["compiles"] == ten.metrics["compiles"]


# ------------------------------------------------------------------ found on real code (timm 1.0.11)


def test_assert_that_cuda_exists_is_left_and_reported():
    """timm's optimizer factory: `assert has_apex and torch.cuda.is_available()`
    protects CUDA-only kernels; making it true would hide that."""
    src = "import torch\n\nassert has_apex and torch.cuda.is_available(), 'APEX and CUDA required'\n"
    out, findings = convert_text(src)
    assert out == src
    assert [(f.code, f.fix) for f in findings] == [("XLA105", False)]
    raising = ("import torch\n\nif not torch.cuda.is_available():\n"
               "    raise ImportError('bitsandbytes < 0.43.1 requires CUDA')\n")  # transformers' bnb quantizer
    out, findings = convert_text(raising)
    assert out == raising and [(f.code, f.fix) for f in findings] == [("XLA105", False)]


def test_backend_chosen_at_run_time_is_reported_not_forced():
    """timm picks gloo on the CPU from a table: forcing "xla" would break that."""
    src = ("import torch\n\nbackend = backends.get(device_type, 'gloo')\n"
           "torch.distributed.init_process_group(backend=backend, init_method=url)\n")
    out, findings = convert_text(src)
    assert out == src
    assert ("XLA141", False) in {(f.code, f.fix) for f in findings}
    argparse_default = ("import argparse\nimport torch.distributed as dist\n\n"
                        "parser.add_argument('--dist-backend', default='nccl')\n"
                        "dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url)\n")
    out, _ = convert_text(argparse_default)
    assert 'dist.init_process_group("xla", init_method="xla://")' in out


def test_module_that_already_supports_xla_keeps_its_cuda_branches():
    """accelerate 1.1.1 picks among backends itself: its CUDA tests are
    deliberate, so they are reported (what would change), not rewritten."""
    src = ("import torch\nfrom accelerate.utils import is_torch_xla_available\n\n"
           "if is_torch_xla_available():\n    backend = 'xla'\nelif torch.cuda.is_available():\n    backend = 'nccl'\n")
    out, findings = convert_text(src)
    assert out == src
    [finding] = [f for f in findings if f.code == "XLA105"]
    assert not finding.fix and "already supports XLA" in finding.message


def test_state_of_an_object_only_named_like_a_scaler_is_kept():
    """timm's NativeScaler is handed in as `loss_scaler`: its state is real."""
    src = ("def resume(checkpoint, loss_scaler=None):\n"
           "    loss_scaler.load_state_dict(checkpoint['scaler'])\n    return loss_scaler.state_dict()\n")
    out, _ = convert_text(src)
    assert out == src


def test_a_device_count_before_a_spawn_in_the_main_block_is_not_at_import_time():
    """ddp-tutorial-series' multigpu.py: `world_size = torch.cuda.device_count()`
    then `mp.spawn(...)` under `if __name__ == "__main__":` runs before the
    processes are launched, never on import; a module-level count in a
    library module is still at import time."""
    main = ("import torch\nimport torch.multiprocessing as mp\n\n\ndef main(rank, world_size):\n"
            "    print(rank, world_size)\n\n\nif __name__ == \"__main__\":\n"
            "    world_size = torch.cuda.device_count()\n    mp.spawn(main, args=(world_size,), nprocs=world_size)\n")
    found = [f.message for f in transform(main.encode(), Settings()).findings if f.code == "XLA114"]
    assert len(found) == 1 and "before the processes are launched" in found[0], found
    library = "import torch\n\nN_GPUS = torch.cuda.device_count()\n"
    found = [f.message for f in transform(library.encode(), Settings()).findings if f.code == "XLA114"]
    assert len(found) == 1 and "at import time" in found[0], found


@pytest.mark.xla
@needs_xla
def test_a_checkpoint_the_gpu_saved_loads_in_the_conversion(tmp_path):
    """Loaded as it was (no map_location), the GPU's checkpoint fails where
    there is no CUDA; the conversion loads it to the CPU and runs."""
    import torch

    torch.manual_seed(0)
    _saved_on_a_gpu(tmp_path / "ckpt.pt", torch.nn.Linear(2, 1).state_dict())
    (tmp_path / "main.py").write_text(convert_text(LOADS)[0])
    done = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stderr[-2000:]
    expected = torch.nn.Linear(2, 1)
    expected.load_state_dict(torch.load(tmp_path / "ckpt.pt", map_location="cpu"))
    assert float(done.stdout) == pytest.approx(expected(torch.ones(1, 2)).item(), rel=1e-6)
    (tmp_path / "main.py").write_text(LOADS.replace(".cuda()", ""))  # the original's load, on this host
    left = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert left.returncode != 0 and "CUDA" in left.stderr


@pytest.mark.parametrize("target, report", [("torch_xla-2.9", "torch_xla.debug.metrics.short_metrics_report()"),
                                            ("cpu", '""')])
def test_a_printed_memory_summary_becomes_the_targets_report(target, report):
    """weiaicunzai/pytorch-cifar100 `train.py -gpu` prints
    `torch.cuda.memory_summary()` after each evaluation: where CUDA never ran
    it raises (KeyError 'allocated_bytes.all.current')."""
    source = "import torch\n\nif args.gpu:\n    print(torch.cuda.memory_summary(), end='')\n"
    out, findings = convert_text(source, target=target)
    assert f"print({report}, end='')" in out
    assert ("XLA114", True) in {(f.code, f.fix) for f in findings}


@pytest.mark.xla
@needs_xla
def test_the_metrics_report_prints_on_xla(tmp_path):
    script = tmp_path / "main.py"
    script.write_text(convert_text("import torch\n\nx = torch.ones(2).cuda() * 2\nprint(x.sum().item())\n"
                                   "print(torch.cuda.memory_summary())\n")[0])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("4.0\n") and "CompileTime" in done.stdout
