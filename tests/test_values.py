"""What a name holds, from dataflow (codemods/analysis/values.py), and the
loop decisions that read it instead of names (issue 11)."""

import os
import subprocess
import sys

import libcst as cst
import pytest

from codemods.analysis.values import (
    DEVICE,
    DEVICE_LOADER,
    DEVICE_STR,
    HOST,
    LOADER,
    LR_SCHEDULER,
    MODULE,
    OPTIMIZER,
    SAMPLER,
    SCALER,
    TENSOR,
    UNKNOWN,
    values,
)
from codemods.syntax.tree import TreeCache, walk
from tests.conftest import convert_text


def kinds_at(src: str, name: str, nth: int = -1) -> set:
    """Kinds of the ``nth`` load of ``name`` (in source order) in ``src``."""
    tree = TreeCache(cst.parse_module(src), src.encode())
    uses = []

    class V(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            if node.value == name:
                uses.append(node)

    tree.module.visit(V())
    # only loads: skip assignment targets, parameter names and keywords
    targets = {id(t.target) for t in walk(tree.module) if isinstance(t, cst.AssignTarget)}
    targets |= {id(p.name) for p in walk(tree.module) if isinstance(p, cst.Param)}
    targets |= {id(a.keyword) for a in walk(tree.module) if isinstance(a, cst.Arg) and a.keyword is not None}
    loads = [u for u in uses if id(u) not in targets]
    return set(values(tree).of(loads[nth]))


HEADER = ("import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n"
          "import torch_xla.distributed.parallel_loader as pl\n")


@pytest.mark.parametrize("value, expected", [
    ("torch.optim.AdamW(params, lr=1e-4)", {OPTIMIZER}),
    ("torch.optim.lr_scheduler.StepLR(opt, 10)", {LR_SCHEDULER}),
    ("torch.cuda.amp.GradScaler()", {SCALER}),
    # torch.optim.swa_utils' classes are no optimizers: a model average and an LR scheduler
    ("torch.optim.swa_utils.AveragedModel(model)", {MODULE}),
    ("torch.optim.swa_utils.SWALR(opt, swa_lr=0.05)", {LR_SCHEDULER}),
    ("torch.amp.GradScaler('cuda')", {SCALER}),
    ("DataLoader(ds, batch_size=8)", {LOADER}),
    ("pl.MpDeviceLoader(DataLoader(ds), dev)", {DEVICE_LOADER}),
    ("torch.device('cuda')", {DEVICE}),
    ("'cuda:0'", {DEVICE_STR}),
    ("nn.Linear(4, 4).cuda().eval()", {MODULE}),
    ("torch.compile(nn.Linear(4, 4))", {MODULE}),
    ("torch.randn(3, device='cuda')", {TENSOR}),
    ("torch.randn(3).sum().item()", {HOST}),
    ("len(xs)", {HOST}),
])
def test_kinds_of_library_values(value, expected):
    src = HEADER + f"x = {value}\nprint(x)\n"
    assert kinds_at(src, "x") == expected


def test_kinds_of_pretrained_library_classes():
    src = ("from diffusers import UNet2DModel, DDPMScheduler\nfrom transformers import AutoTokenizer\n"
           "unet = UNet2DModel.from_pretrained('m').to('cuda')\nnoise = DDPMScheduler.from_pretrained('m')\n"
           "tok = AutoTokenizer.from_pretrained('m')\nprint(unet, noise, tok)\n")
    assert kinds_at(src, "unet") == {MODULE}
    assert kinds_at(src, "noise") == {SAMPLER}
    assert kinds_at(src, "tok") == {"object"}


def test_kinds_do_not_come_from_names():
    # an optimizer called `engine`, a model called `f`, a loader called `batches`
    src = HEADER + ("engine = torch.optim.SGD(ps, lr=0.1)\nf = nn.Sequential(nn.Linear(2, 2))\n"
                    "batches = DataLoader(ds)\nmodel = len(xs)\nengine.step(); f(x); iter(batches); model + 1\n")
    assert kinds_at(src, "engine") == {OPTIMIZER}
    assert kinds_at(src, "f") == {MODULE}
    assert kinds_at(src, "batches") == {LOADER}
    assert kinds_at(src, "model") == {HOST}


def test_module_classes_functions_and_attributes():
    src = HEADER + (
        "class Block(nn.Module):\n    pass\n\nclass Net(Block):\n    def __init__(self):\n"
        "        self.head = nn.Linear(2, 2)\n    def run(self, x):\n        return self.head(x)\n\n"
        "class Plain:\n    pass\n\n"
        "def build():\n    return Net().to('cuda'), torch.optim.Adam([])\n\n"
        "net, opt = build()\nobj = Plain()\nout = net(x)\nprint(net, opt, obj, out)\n")
    assert kinds_at(src, "net") == {MODULE}
    assert kinds_at(src, "opt") == {OPTIMIZER}
    assert kinds_at(src, "obj") == {"object"}
    assert kinds_at(src, "out") == {TENSOR}


def test_accelerate_prepare_maps_by_position_and_makes_device_loaders():
    src = HEADER + ("model = nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                    "dl = DataLoader(ds)\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
                    "for batch in dl:\n    print(batch)\n")
    assert kinds_at(src, "dl") == {DEVICE_LOADER}
    assert kinds_at(src, "model") == {MODULE}
    assert kinds_at(src, "batch") == {TENSOR}


def test_reaching_definitions():
    # an unconditional rebinding kills the earlier one
    src = HEADER + "dl = DataLoader(ds)\ndl = pl.MpDeviceLoader(dl, dev)\nfor b in dl:\n    pass\n"
    assert kinds_at(src, "dl") == {DEVICE_LOADER}
    # the earlier binding still reaches its own uses
    assert kinds_at(src, "dl", 0) == {LOADER}
    # a conditional one does not kill
    src = HEADER + "dl = DataLoader(ds)\nif xla:\n    dl = pl.MpDeviceLoader(dl, dev)\nfor b in dl:\n    pass\n"
    assert kinds_at(src, "dl") == {LOADER, DEVICE_LOADER}
    # a binding later in a loop reaches the next iteration
    src = HEADER + "x = 1\nfor i in range(3):\n    print(x)\n    x = torch.zeros(2)\n"
    assert kinds_at(src, "x", 0) == {HOST, TENSOR}
    # ... unless the use is preceded by a binding in the same iteration
    src = HEADER + "x = 1\nfor i in range(3):\n    x = torch.zeros(2)\n    print(x)\n    x = 3\n"
    assert kinds_at(src, "x", 0) == {TENSOR}


def test_parameters_from_call_sites_annotations_and_unknowns():
    src = HEADER + ("def sample(net, z, steps: int, m: nn.Module, other):\n    return net(z), steps, m, other\n\n"
                    "sample(nn.Linear(2, 2).cuda(), torch.randn(2), 3, None, None)\n"
                    "sample(net=nn.Conv2d(1, 1, 1), z=None, steps=4, m=None, other=None)\n")
    assert kinds_at(src, "net") == {MODULE}
    assert kinds_at(src, "steps") == {HOST}
    assert kinds_at(src, "m") == {MODULE}
    assert kinds_at(src, "other") == {UNKNOWN}
    assert TENSOR in kinds_at(src, "z")


# ----------------------------------------------------------- loop decisions

CUDA = "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n"

def test_a_model_with_any_name_makes_a_step_loop():
    """`policy` matches no model name: its class says it is a model."""
    src = CUDA + ("class Policy(nn.Module):\n    def forward(self, s):\n        return s\n\n"
                    "policy = Policy().cuda()\nstate = torch.zeros(4, device='cuda')\n"
                    "for t in range(100):\n    action = policy(state)\n    state = state + action\n")
    out, findings = convert_text(src)
    assert out.endswith("    state = state + action\n    torch_xla.sync()\n"), out
    assert [f.code for f in findings].count("XLA302") == 1


def test_a_sampler_that_takes_its_network_as_a_parameter_is_a_step_loop():
    """EDM's sampler: `net` is a parameter; the call site passes a model."""
    src = CUDA + (
        "def edm_sampler(net, latents, num_steps=18):\n    x_next = latents\n"
        "    for i in range(num_steps):\n        x_cur = x_next\n        denoised = net(x_cur, i)\n"
        "        d_cur = (x_cur - denoised) / (i + 1)\n        x_next = x_cur + d_cur\n    return x_next\n\n"
        "net = torch.load('net.pt').to('cuda')\nnet = nn.DataParallel(net)\n"
        "edm_sampler(net, torch.randn(1, 3, 8, 8, device='cuda'))\n")
    out, _ = convert_text(src)
    assert "        x_next = x_cur + d_cur\n        torch_xla.sync()\n" in out, out


def test_an_optimizer_with_any_name_takes_a_step():
    src = CUDA + ("adam = torch.optim.Adam(params)\nfor batch in batches:\n    grads = engine.grads(batch)\n"
                    "    adam.step()\n    adam.zero_grad()\n")
    out, _ = convert_text(src)
    assert out.endswith("    adam.zero_grad()\n    torch_xla.sync()\n"), out


def test_an_lr_scheduler_step_with_arguments_is_no_step():
    """`scheduler.step(a, b)` of an LR scheduler (ReduceLROnPlateau's metrics, epoch) steps no model."""
    src = CUDA + ("scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)\n"
                    "for epoch in range(10):\n    val = evaluate(epoch)\n    scheduler.step(val, epoch)\n")
    out, _ = convert_text(src)
    assert "sync()" not in out, out


def test_a_helper_named_like_a_sampler_that_computes_no_tensor_is_no_step():
    src = CUDA + ("import random\n\ndef sample_batch(pool):\n    return random.sample(pool, 4)\n\n"
                  "pool = list(range(9))\nfor i in range(4):\n    pool = sample_batch(pool)\n")
    out, _ = convert_text(src)
    assert "sync()" not in out, out


def test_a_helper_that_runs_the_model_makes_a_step_loop_whatever_its_name():
    src = CUDA + ("net = nn.Linear(4, 4).cuda()\n\ndef advance(x, t):\n    return x - 0.1 * net(x)\n\n"
                    "x = torch.zeros(4, device='cuda')\nfor t in range(4):\n    x = advance(x, t)\n")
    out, _ = convert_text(src)
    assert out.endswith("    x = advance(x, t)\n    torch_xla.sync()\n"), out


def test_a_loader_with_any_name_is_wrapped_and_a_device_loader_is_not():
    src = CUDA + ("batches = DataLoader(ds, batch_size=4)\nfor x, y in batches:\n"
                    "    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n")
    out, findings = convert_text(src)
    assert "XLA301" in [f.code for f in findings], out
    src = HEADER + ("batches = DataLoader(ds, batch_size=4)\nbatches = pl.MpDeviceLoader(batches, dev)\n"
                    "for x, y in batches:\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n")
    out, findings = convert_text(src)
    assert "XLA301" not in [f.code for f in findings], out


def test_an_unpickled_object_that_is_called_is_a_model():
    """word_language_model's generate.py: `lm = torch.load(f)`; `out, hidden = lm(inp, hidden)`."""
    src = ("import torch\n\nwith open('model.pt', 'rb') as f:\n    lm = torch.load(f, map_location='cuda')\n"
           "lm.eval()\nhidden = lm.init_hidden(1)\ninp = torch.randint(100, (1, 1)).cuda()\n"
           "for i in range(20):\n    out, hidden = lm(inp, hidden)\n    inp.fill_(out.argmax())\n")
    out, _ = convert_text(src)
    assert out.endswith("    inp.fill_(out.argmax())\n    torch_xla.sync()\n"), out
    # a loaded tensor that is only read is no model
    src = ("import torch\nx = torch.load('x.pt')\nfor i in range(3):\n    y = x[i] * 2\n    x = y\n")
    assert "sync()" not in convert_text(src)[0]


def test_state_carried_through_attributes_and_dict_entries():
    """Issue 11: state rewritten through attributes or dict entries counts;
    writing one attribute of an object while reading another does not."""
    for body in ("    block.latents = unet(block.latents, t)\n",
                 "    state['x'] = unet(state['x'], t)\n",
                 "    eps = unet(self.latents, t)\n    self.latents = self.latents - 0.1 * eps\n"):
        out, _ = convert_text(CUDA + "for t in timesteps:\n" + body)
        assert out.endswith(body + "    torch_xla.sync()\n"), out
    src = CUDA + "for t in timesteps:\n    block.noise = unet(block.scaled, t)\n    block.scale = block.config + 1\n"
    assert "sync()" not in convert_text(src)[0]


def test_a_write_on_every_branch_is_a_write():
    """`x` written by both branches of an if/else and read after: this step's, not the last one's."""
    src = CUDA + ("for chat in chats:\n    if flag:\n        text = render_model(chat)\n    else:\n"
                  "        text = plain(chat)\n    text = text[:10]\n")
    assert "sync()" not in convert_text(src)[0]
    # written on one branch only: the read may see the last iteration's value
    src = CUDA + "for t in ts:\n    if t > 0:\n        x = x0\n    x = unet(x, t)\n"
    assert convert_text(src)[0].endswith("    x = unet(x, t)\n    torch_xla.sync()\n")


def test_a_loader_feeding_a_model_that_stays_on_the_host_is_reported_not_wrapped():
    """accelerate's test script trains a CPU baseline: wrapping its loader put
    the batches on the XLA device beside a CPU model."""
    src = CUDA + ("\n\nclass Reg(nn.Module):\n    def forward(self, x):\n        return x\n\n\n"
                  "def mock_training(ds):\n    train_dl = DataLoader(ds, batch_size=2)\n    model = Reg()\n"
                  "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for batch in train_dl:\n"
                  "        loss = model(batch['x']).sum()\n        loss.backward()\n        opt.step()\n")
    out, findings = convert_text(src)
    assert "MpDeviceLoader" not in out
    [f] = [f for f in findings if f.code == "XLA301"]
    assert not f.fix and "never moved" in f.message
    # moved to the device: wrapped
    moved = src.replace("    model = Reg()\n", "    model = Reg().to('cuda')\n")
    out, findings = convert_text(moved)
    assert "MpDeviceLoader(train_dl" in out, out


def test_a_model_known_by_dataflow_makes_its_output_a_tensor():
    """`policy(state)` returns a tensor: its per-step print is deferred like any tensor's."""
    src = CUDA + ("class Policy(nn.Module):\n    def forward(self, s):\n        return s\n\n"
                  "policy = Policy().cuda()\nstate = torch.zeros(4, device='cuda')\n"
                  "for t in range(100):\n    action = policy(state)\n    state = state + action\n"
                  "    print(action)\n")
    out, findings = convert_text(src)
    assert "xm.add_step_closure(lambda action=action: print(action))" in out, out


def test_a_loss_module_left_on_the_host_does_not_stop_the_wrap():
    src = CUDA + ("model = nn.Linear(4, 1).cuda()\ncriterion = nn.MSELoss()\nact = nn.ReLU()\n"
                  "loader = DataLoader(ds, batch_size=2)\nfor x, y in loader:\n"
                  "    loss = criterion(act(model(x.cuda())), y.cuda())\n    loss.backward()\n")
    out, _ = convert_text(src)
    assert "MpDeviceLoader(loader" in out, out
    # a model imported from elsewhere, built here and never moved: reported
    src = CUDA + ("from helpers import RegressionModel\nmodel = RegressionModel()\n"
                  "loader = DataLoader(ds, batch_size=2)\nfor b in loader:\n    model(b).sum().backward()\n")
    out, findings = convert_text(src)
    assert "MpDeviceLoader" not in out and any("never moved" in f.message for f in findings), out


def test_a_loop_inside_a_step_loop_gets_a_barrier_only_when_it_feeds_a_model_back():
    # a corrector loop: each iteration denoises what the last one produced
    src = CUDA + ("for t in timesteps:\n    eps = unet(x, t)\n    x = scheduler.step(eps, t, x)\n"
                  "    for _ in range(2):\n        eps = unet(x, t)\n        x = scheduler.step_correct(eps, x)\n")
    out, _ = convert_text(src)
    assert out.count("torch_xla.sync()") == 2, out
    # per-view steps accumulated into the outer state (panorama): the outer barrier bounds them
    src = CUDA + ("for t in timesteps:\n    value = torch.zeros_like(x)\n    for view in views:\n"
                  "        eps = unet(x[view], t)\n        value[view] += scheduler.step(eps, t, x[view])\n"
                  "    x = scheduler.step(value, t, x)\n")
    out, _ = convert_text(src)
    assert out.count("torch_xla.sync()") == 1 and out.endswith("    x = scheduler.step(value, t, x)\n"
                                                                "    torch_xla.sync()\n"), out


def test_a_loop_around_a_call_that_runs_a_step_loop_gets_no_barrier_of_its_own():
    # the inner sampling loop's barriers cut every round of the outer one
    src = CUDA + ("net = nn.Linear(4, 4).cuda()\n\ndef sample(x):\n    for t in range(10):\n"
                  "        x = x - 0.1 * net(x)\n    return x\n\nx = torch.randn(4, device='cuda')\n"
                  "for r in range(3):\n    x = sample(x)\n")
    out, _ = convert_text(src)
    assert out.count("torch_xla.sync()") == 1 and "        x = x - 0.1 * net(x)\n        torch_xla.sync()" in out, out
    # run only under a branch: the rounds that skip it are not cut
    src = src.replace("for r in range(3):\n    x = sample(x)\n",
                      "for r in range(3):\n    if r % 2:\n        x = sample(x)\n    x = net(x)\n")
    out, _ = convert_text(src)
    assert out.count("torch_xla.sync()") == 2, out


MODULAR = ("import torch\nfrom diffusers.modular_pipelines import LoopSequentialPipelineBlocks, "
           "ModularPipelineBlocks\n\n\n"
           "class Inner(ModularPipelineBlocks):\n    def __call__(self, components, state):\n"
           "        for i, t in enumerate(state.timesteps):\n"
           "            eps = components.transformer(state.latents, t)\n"
           "            state.latents = components.scheduler.step(eps, t, state.latents)[0]\n"
           "        return components, state\n\n\n"
           "class Update(ModularPipelineBlocks):\n    def __call__(self, components, state):\n"
           "        state.history = torch.cat([state.history, state.latents])\n        return components, state\n\n\n"
           "class ChunkLoop(LoopSequentialPipelineBlocks):\n    def __call__(self, components, state):\n"
           "        for k in range(state.num_chunks):\n"
           "            components, state = self.loop_step(components, state, k=k)\n"
           "        return components, state\n\n\n"
           "class ChunkDenoise(ChunkLoop):\n    block_classes = [Inner, Update]\n")


def test_a_modular_chunk_loop_whose_blocks_denoise_gets_no_barrier():
    out, _ = convert_text(MODULAR)
    assert out.count("torch_xla.sync()") == 1, out
    assert "[0]\n            torch_xla.sync()" in out, out
    # a second composition of the same loop without a denoising block: the
    # chunk loop is a step loop for that one, so it keeps its barrier
    out, _ = convert_text(MODULAR + "\n\nclass ChunkUpdateOnly(ChunkLoop):\n    block_classes = [Update]\n")
    assert out.count("torch_xla.sync()") == 2, out


def test_a_device_string_under_any_name_is_known_by_where_it_goes():
    # passed where a device goes: a device, whatever its name; a "cuda" label
    # that is only printed is no device and stays
    src = ("import torch\n\ntarget = 'cuda'\nlabel = 'cuda'\nprint(label)\n"
           "x = torch.ones(2).to(target)\ny = torch.zeros(2, device=target)\n")
    out, findings = convert_text(src)
    assert "target = 'xla'" in out and "label = 'cuda'" in out, out
    assert any(f.code == "XLA109" and f.line == 3 for f in findings)
    # a name that says "device" still counts where the module never uses it (a caller does)
    out, _ = convert_text("import torch\n\ndevice = 'cuda'\n")
    assert "device = 'xla'" in out, out


CONFIG_DEVICE = (
    "import torch\n\n\ndef run(cfg):\n    device = torch.device(cfg['device'])\n"
    "    if cfg['device'] == 'cuda:0':\n        print('on the accelerator')\n"
    "    return torch.ones(2, device=device) * 2\n\n\n"
    "config = {'epochs': 1, 'device': 'cuda:0', 'name': 'cuda'}\nprint(run(config).sum().item())\n"
)


def test_a_config_dicts_device_entry_is_a_device_string():
    """zoubohao's DDPM keeps ``"device": "cuda:0"`` in a dict that another
    module hands to ``torch.device``: left as it was, the port needed a GPU
    (XLA199 only).  Entries and subscripts whose key names a device are
    device strings; other entries stay."""
    out, findings = convert_text(CONFIG_DEVICE)
    assert "config = {'epochs': 1, 'device': 'xla', 'name': 'cuda'}" in out, out
    assert "if cfg['device'] == 'xla':" in out, out
    assert [f.line for f in findings if f.code == "XLA109"] == [6, 11]
    # (the "name" entry's "cuda" is left to the catch-all's report)
    left = [f for f in findings if f.code == "XLA199"]
    assert [f.line for f in left] == [11] and left[0].col > CONFIG_DEVICE.splitlines()[10].index("'name'"), left
    assert convert_text(out)[0] == out


@pytest.mark.xla
@pytest.mark.xla
def test_a_config_dicts_device_runs_on_xla(tmp_path):
    out, _ = convert_text(CONFIG_DEVICE)
    (tmp_path / "main.py").write_text(out)
    done = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["on", "the", "accelerator", "4.0"], done.stdout


def test_a_model_loaded_to_the_device_the_program_chose_goes_there():
    """Issue 38 item 4: `torch.load(f, map_location=device)` of a model, with
    `device` the program's own choice (CPU unless `--accel`): loaded to the
    CPU, then moved to that same `device` -- not to XLA whatever the choice
    (pytorch/examples' word_language_model `generate.py` without `--accel`
    crashed so: a model on XLA, its input on the CPU).  A CUDA literal goes
    to the XLA device."""
    src = ("import torch\n\ndevice = torch.device('cpu')\nif use_accel:\n    device = torch.device('cuda')\n"
           "with open('model.pt', 'rb') as f:\n    model = torch.load(f, map_location=device)\nmodel.eval()\n")
    out, findings = convert_text(src)
    assert "    model = torch.load(f, map_location=\"cpu\").to(device)\n" in out, out
    assert [f.message for f in findings if f.code == "XLA131"] == [
        'map_location -> "cpu", then the model to `device` (it is used as a model)']
    out, _ = convert_text(src.replace("map_location=device", "map_location='cuda'"))
    assert "    model = torch.load(f, map_location=\"cpu\").to(torch_xla.device())\n" in out, out
