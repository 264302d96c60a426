"""Which lines after the optimizer step only update tensors on the device
(codemods/analysis/step_updates.py): an average of the weights kept by a
function or a helper object.  The step barrier follows them (XLA302), so the
average joins the step's graph.  fixtures/ema_after_step is the golden case;
here the shapes an update takes, what keeps the barrier before it, and the
XLA run."""

import libcst as cst
import pytest

from codemods.analysis.step_updates import update_call
from codemods.syntax.tree import TreeCache
from test_runnable_ports import needs_xla
from test_step_calls import one_execution_a_step, original_output, printed_numbers
from test_step_tail import converted

DDPM = (
    "def ema(source, target, decay):\n"
    "    source_dict = source.state_dict()\n"
    "    target_dict = target.state_dict()\n"
    "    for key in source_dict.keys():\n"
    "        target_dict[key].data.copy_(target_dict[key].data * decay + source_dict[key].data * (1 - decay))\n"
)
STYLEGAN = (
    "def accumulate(model1, model2, decay=0.999):\n"
    "    par1 = dict(model1.named_parameters())\n"
    "    par2 = dict(model2.named_parameters())\n"
    "    for k in par1.keys():\n"
    "        par1[k].data.mul_(decay).add_(par2[k].data, alpha=1 - decay)\n"
)
INLINE_ZIP = (
    "@torch.no_grad()\n"
    "def update_average(ema_model, model, beta):\n"
    "    for p_ema, p in zip(ema_model.parameters(), model.parameters()):\n"
    "        p_ema.lerp_(p, 1 - beta)\n"
    "    for b_ema, b in zip(ema_model.buffers(), model.buffers()):\n"
    "        b_ema.copy_(b)\n"
)
FOREACH = (
    "def ema(ema_model, model, decay):\n"
    "    with torch.no_grad():\n"
    "        torch._foreach_lerp_(list(ema_model.parameters()), list(model.parameters()), 1 - decay)\n"
)
HELPER = (
    "class EMAHelper(object):\n"
    "    def __init__(self, mu=0.999):\n"
    "        self.mu = mu\n"
    "        self.shadow = {}\n\n"
    "    def update(self, module):\n"
    "        if isinstance(module, nn.DataParallel):\n"
    "            module = module.module\n"
    "        for name, param in module.named_parameters():\n"
    "            if param.requires_grad:\n"
    "                self.shadow[name].data = (1.0 - self.mu) * param.data + self.mu * self.shadow[name].data\n"
)

METHODS = (  # dome272/Diffusion-Models-pytorch's EMA: its methods call each other
    "class EMA:\n"
    "    def __init__(self, beta):\n"
    "        super().__init__()\n"
    "        self.beta = beta\n"
    "        self.step = 0\n\n"
    "    def update_model_average(self, ma_model, current_model):\n"
    "        for current_params, ma_params in zip(current_model.parameters(), ma_model.parameters()):\n"
    "            old_weight, up_weight = ma_params.data, current_params.data\n"
    "            ma_params.data = self.update_average(old_weight, up_weight)\n\n"
    "    def update_average(self, old, new):\n"
    "        if old is None:\n"
    "            return new\n"
    "        return old * self.beta + (1 - self.beta) * new\n\n"
    "    def step_ema(self, ema_model, model, step_start_ema=2000):\n"
    "        if self.step < step_start_ema:\n"
    "            self.reset_parameters(ema_model, model)\n"
    "            self.step += 1\n"
    "            return\n"
    "        self.update_model_average(ema_model, model)\n"
    "        self.step += 1\n\n"
    "    def reset_parameters(self, ema_model, model):\n"
    "        ema_model.load_state_dict(model.state_dict())\n"
)


def is_update(defs: str, line: str) -> bool:
    made = "EMA(0.995)" if "class EMA:" in defs else "EMAHelper()"
    # (the helper is None where the configuration turns the average off)
    src = (f"import torch\nimport torch.nn as nn\n\n{defs}\n\n"
           f"if config:\n    helper = {made}\nelse:\n    helper = None\n{line}\n")
    module = cst.parse_module(src)
    tree = TreeCache(module, src.encode())
    return update_call(tree, module.body[-1], lambda node: tree.import_qualnames(node) or set())


@pytest.mark.parametrize("defs, line", [
    (DDPM, "ema(net_model, ema_model, FLAGS.ema_decay)"),
    (STYLEGAN, "accumulate(g_ema, generator, 0.5 ** (32 / (10 * 1000)))"),
    (INLINE_ZIP, "update_average(ema, model, beta=0.995)"),
    (FOREACH, "ema(ema_model, model, min(decay, (1 + step) / (10 + step)))"),
    (HELPER, "helper.update(model)"),
    (METHODS, "helper.step_ema(ema_model, model)"),
    # ermongroup/ddim: the average turned on by the configuration
    (HELPER, "if config.model.ema:\n    helper.update(model)"),
    # blocks of the body: WGAN's clipped critic, an average kept inline
    ("", "for p in netD.parameters():\n    p.data.clamp_(-opt.clip_value, opt.clip_value)"),
    # timm's ModelEmaV2 shape: the state dicts' values walked together, a dict of the object's updated in place
    ("", "with torch.no_grad():\n    for e, m in zip(ema.state_dict().values(), model.state_dict().values()):\n"
         "        e.copy_(e * 0.99 + (1.0 - 0.99) * m)"),
    (HELPER.replace("self.shadow[name].data = (1.0 - self.mu) * param.data + self.mu * self.shadow[name].data",
                    "self.shadow[name].mul_(self.mu).add_(param.data, alpha=1 - self.mu)"), "helper.update(model)"),
    ("", "with torch.no_grad():\n    for e, p in zip(ema.parameters(), model.parameters()):\n"
         "        e.mul_(0.999).add_(p.detach(), alpha=0.001)"),
])
def test_an_average_of_the_weights_is_an_update(defs, line):
    assert is_update(defs + ("" if "class EMA" in defs else "\n" + HELPER), line)


@pytest.mark.parametrize("defs, line", [
    # it reads the host: the read runs the step's graph before the barrier
    (DDPM.replace("    for key", "    print(decay)\n    for key"), "ema(a, b, 0.9)"),
    (DDPM.replace("(1 - decay))", "(1 - decay))\n    return source_dict['w'].sum().item()"), "ema(a, b, 0.9)"),
    (DDPM.replace("        target_dict[key]", "        if source_dict[key].sum() > 0:\n            target_dict[key]"),
     "ema(a, b, 0.9)"),
    # a call it cannot see into, or one that does more than compute
    (DDPM.replace("    for key", "    logger.info('ema')\n    for key"), "ema(a, b, 0.9)"),
    (DDPM.replace("    for key", "    torch.save(source_dict, 'ema.pt')\n    for key"), "ema(a, b, 0.9)"),
    (DDPM.replace(".copy_(", ".normal_(").replace(" * (1 - decay))", " * (1 - decay), 1.0)"), "ema(a, b, 0.9)"),
    # an argument read on the host, a callee that is not the program's
    (DDPM, "ema(a, b, decay.item())"),
    (DDPM, "ema_lib.update(a, b, 0.9)"),
    (DDPM, "ema(*models, 0.9)"),
    # a helper whose class is not a plain one (a module's `__call__` could run anything)
    (HELPER.replace("class EMAHelper(object)", "class EMAHelper(nn.Module)"), "helper.update(model)"),
    # a method of the object that does more than update
    (METHODS.replace("        ema_model.load_state_dict(", "        print(self.step)\n        ema_model.load_state_dict("),
     "helper.step_ema(ema_model, model)"),
    # an `if` decided by a call, or one that does more than update in a branch
    (HELPER, "if use_ema(step):\n    helper.update(model)"),
    (HELPER, "if config.model.ema:\n    helper.update(model)\nelse:\n    print('no average')"),
    # a block that reads, logs or leaves the body
    ("", "for name, p in model.named_parameters():\n    writer.add_histogram(name, p, step)"),
    ("", "for p in netD.parameters():\n    total += p.data.norm().item()"),
    ("", "for p in netD.parameters():\n    p.data.clamp_(-0.01, 0.01)\n    break"),
    ("", "with open('w.txt', 'w') as f:\n    for p in netD.parameters():\n        p.data.clamp_(-0.01, 0.01)"),
    # more than one call on the line
    (DDPM, "ema(a, b, 0.9); print('done')"),
])
def test_what_is_no_update(defs, line):
    assert not is_update(defs + ("" if "class EMA" in defs else "\n" + HELPER), line)


LOOP = (
    "import torch\nimport copy\n\n{defs}\n"
    "def train(model, opt, loader, log):\n"
    "    ema_model = copy.deepcopy(model)\n"
    "    for x, y in loader:\n"
    "        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())\n"
    "        opt.zero_grad()\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "        ema(model, ema_model, 0.99)\n"
    "        log.append(loss.item())\n"
)


def test_the_barrier_follows_the_update():
    code = converted(LOOP.format(defs=DDPM))
    assert ("        opt.step()\n        ema(model, ema_model, 0.99)\n        torch_xla.sync()\n"
            "        log.append(loss.item())\n") in code, code


def test_an_update_that_reads_keeps_the_barrier_before_it():
    reading = DDPM.replace("    for key", "    print(decay)\n    for key")
    code = converted(LOOP.format(defs=reading))
    assert ("        opt.step()\n        torch_xla.sync()\n        ema(model, ema_model, 0.99)\n") in code, code


@pytest.mark.xla
@needs_xla
def test_the_average_joins_the_step_with_the_originals_numbers(tmp_path):
    """fixtures/ema_after_step on XLA at 3 and 6 batches: compiles flat, one
    execution a step (with the barrier before the two updates: two a step),
    and the losses and both averages the original prints on the CPU."""
    out6 = one_execution_a_step("ema_after_step", tmp_path)
    original = original_output("ema_after_step", "--steps", "6")
    assert len(out6.splitlines()) == 8 and printed_numbers(out6) == pytest.approx(printed_numbers(original), rel=1e-4,
                                                                                  abs=1e-4)
