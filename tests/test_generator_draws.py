"""XLA420 (codemods/generator_draws.py): a draw from a generator on the device,
where it runs every step, is drawn on the generator's own device and moved --
on XLA the generator is a CPU one, and the draw would fall back to the CPU,
a graph execution of its own each time."""

import libcst as cst
import pytest

from tests.conftest import convert_text
from tests.test_runnable_ports import needs_xla
from tests.test_step_calls import at_two_lengths, original_output


def _draws(src: str):
    out, findings = convert_text(src)
    return out, [(f.line, f.fix) for f in findings if f.code == "XLA420"]


LOOP = "import torch\n\nfor t in timesteps:\n    x = model(x, t)\n    {line}\n"


@pytest.mark.parametrize("draw", [
    "torch.randn(x.shape, generator=gen, device=x.device)",
    "torch.rand(4, 4, generator=self.gen, device=device, dtype=torch.float16)",
    "torch.randint(0, 10, (4,), generator=gen, device=device)",
    "torch.randperm(8, device=device, generator=gen)",
])
def test_a_draw_every_step_is_made_on_its_generators_device_and_moved(draw):
    out, found = _draws(LOOP.format(line=f"noise = {draw}"))
    assert found == [(5, True)], out
    g = draw.split("generator=")[1].split(",")[0].rstrip(")")
    d = draw.split("device=")[1].split(",")[0].rstrip(")")
    line = next(n for n in out.splitlines() if "noise =" in n)
    assert f"device={d} if {g} is None else {g}.device" in line and line.endswith(f").to({d})")
    cst.parse_module(out)
    assert _draws(out) == (out, [])  # a second run leaves it


def test_a_draw_on_a_cuda_device_the_conversion_made_xlas_is_drawn_on_its_generators_device():
    out, found = _draws(LOOP.format(line='noise = torch.randn(4, generator=gen, device="cuda")'))
    assert found == [(5, True)], out
    assert "noise = torch.randn(4, generator=gen, device=torch_xla.device() if gen is None else gen.device)" \
           ".to(torch_xla.device())" in out
    assert _draws(out)[1] == []


def test_the_device_chosen_keeps_every_other_draw_as_it_was():
    """Evaluated as the program will: no generator -> the device asked for;
    a generator -> its own device (then moved to the one asked for)."""
    out, _ = _draws(LOOP.format(line="noise = torch.randn(4, generator=g, device=d)"))
    line = next(n for n in out.splitlines() if "noise =" in n)
    expression = line.split("device=")[1].rsplit(").to(", 1)[0]

    class Generator:
        device = "cpu"

    assert eval(expression, {"g": None, "d": "xla"}) == "xla"
    assert eval(expression, {"g": Generator(), "d": "xla"}) == "cpu"


@pytest.mark.parametrize("line", [
    "noise = torch.randn(4, generator=gen)",  # drawn on the CPU already
    "noise = torch.randn(4, device=device)",  # no generator
    "noise = torch.randn(4, generator=gen, device=device, requires_grad=True)",  # a leaf: moved, another tensor
    "noise = torch.randn(4, generator=gen, device=device, out=buf)",
    "noise = torch.randn(4, generator=make_gen(), device=device)",  # read twice, a call could differ
    "noise = torch.randn(4, generator=None, device=device)",
    "noise = torch.randn(4, generator=gen, device=d1 if c else d2)",  # (written into `... if gen is None else`)
    "noise = torch.randn(4, generator=g1 or g2, device=device)",
    "noise = torch.randn_like(x)",
])
def test_draws_that_do_not_fall_back_or_would_change_are_left(line):
    out, found = _draws(LOOP.format(line=line))
    assert found == [] and f"    {line}\n" in out  # (a barrier ends the loop)


def test_a_draw_that_runs_once_is_left():
    src = "import torch\n\nnoise = torch.randn(4, generator=gen, device=device)\n"
    assert _draws(src) == (src, [])


@pytest.mark.xla
@needs_xla
def test_a_samplers_draw_is_one_execution_a_step_with_the_cpu_originals_numbers(tmp_path):
    """fixtures/generator_devices: its Sampler.step draws from the generator
    it was handed.  Before XLA420 each draw fell back to the CPU (9 -> 15
    executions at 3 -> 6 steps, 2 a step); now 1 a step, compiles flat."""
    a, _, b, out = at_two_lengths("generator_devices", tmp_path, "--steps", 3, 6)
    assert a["compiles"] == b["compiles"] and b["executions"] - a["executions"] == 3, (a, b)
    assert b["fallbacks"].get("aten::normal_", 0) == a["fallbacks"].get("aten::normal_", 0) <= 1, (a, b)
    assert out.splitlines()[1:] == original_output("generator_devices", "--steps", "6").splitlines()[1:]


@pytest.mark.parametrize("line", [
    "tokens = torch.multinomial(probs, 1, generator=gen)",
    "noise = x.normal_(generator=gen)",
])
def test_a_draw_from_a_device_tensor_with_a_generator_is_reported(line):
    src = ("import torch\n\nmodel = torch.nn.Linear(4, 4).cuda()\nfor t in timesteps:\n"
           "    x = model(x.cuda())\n    probs = x.softmax(-1)\n    " + line + "\n")
    out, found = _draws(src)
    assert found == [(7, False)], out
    assert f"    {line}\n" in out


def test_a_draw_from_a_host_tensor_with_a_generator_is_not_reported():
    src = ("import torch\n\nfor t in timesteps:\n    probs = torch.ones(4) / 4\n"
           "    tokens = torch.multinomial(probs, 1, generator=gen)\n    step(tokens)\n")
    assert _draws(src)[1] == []
