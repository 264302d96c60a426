"""XLA107 (codemods/generators.py): random generators on a CUDA device, or on
one the conversion may make XLA's, become CPU generators where the device is
XLA's -- torch_xla cannot make one on its device
(``torch.Generator(device="xla")`` raises "XLA device type not an accelerator")."""

import os
import subprocess
import sys

import libcst as cst
import pytest

from tests.conftest import convert_text
from tests.test_runnable_ports import FIXTURES, needs_xla, run_on_xla


def _generators(src: str):
    out, findings = convert_text(src)
    return out, [(f.line, f.fix) for f in findings if f.code == "XLA107"]


HEAD = "import torch\n\n"


@pytest.mark.parametrize("device", ["device", "self.device", "x.device", "args.device", "pipe.unet.device"])
def test_a_generator_on_a_chosen_device_is_made_on_the_cpu_only_where_that_device_is_xlas(device):
    out, found = _generators(HEAD + f"g = torch.Generator(device={device}).manual_seed(0)\n")
    assert found == [(3, True)]
    assert f'torch.Generator(device="cpu" if str({device}).startswith("xla") else {device})' in out
    cst.parse_module(out)
    assert _generators(out) == (out, [])  # a second run leaves it


def test_the_choice_keeps_every_device_but_xlas():
    """The rewritten expression, evaluated as the program will: the XLA device
    (its string or its object) gives "cpu"; the CPU, None, a CUDA device are kept."""
    out, _ = _generators(HEAD + "g = torch.Generator(device=d)\n")
    choice = cst.parse_module(out).body[-1].body[0].value.args[0].value  # type: ignore[attr-defined]
    expression = cst.Module([]).code_for_node(choice)

    class XlaDevice:  # (what str() of torch_xla.device() gives)
        def __str__(self):
            return "xla:0"

    for d, made_on in [("xla", "cpu"), ("xla:1", "cpu"), (XlaDevice(), "cpu"), ("cpu", "cpu"), (None, None),
                       ("cuda", "cuda"), ("cuda:1", "cuda:1"), ("mps", "mps")]:
        assert eval(expression, {"d": d}) == made_on, d


def test_a_cuda_generator_becomes_a_cpu_one():
    out, found = _generators(HEAD + 'g = torch.Generator("cuda:1")\nh = torch.Generator(device=torch.device("cuda"))\n')
    assert found == [(3, True), (4, True)]
    assert 'g = torch.Generator("cpu")' in out and 'h = torch.Generator(device="cpu")' in out


def test_a_generator_on_the_xla_device_already_becomes_a_cpu_one():
    """A hand port's `torch.Generator("xla")` raises on XLA as the CUDA one would."""
    out, found = _generators(HEAD + 'g = torch.Generator("xla:0")\n')
    assert found == [(3, True)] and 'g = torch.Generator("cpu")' in out, out


@pytest.mark.parametrize("src", [
    "g = torch.Generator()\n",
    'g = torch.Generator(device="cpu")\n',
    "g = torch.Generator(device=None)\n",
    'g = torch.Generator("mps")\n',
    "g = random.Generator(device)\n",  # not torch's
])
def test_generators_on_the_cpu_or_not_torchs_are_left_alone(src):
    out, found = _generators("import random\n" + HEAD + src)
    assert found == [] and out == "import random\n" + HEAD + src


def test_a_device_written_as_a_call_is_reported_not_rewritten():
    """Read twice, a call could answer otherwise (and run twice): reported, with the fix."""
    src = HEAD + "g = torch.Generator(device=pick_device())\n"
    out, findings = convert_text(src)
    found = [f for f in findings if f.code == "XLA107"]
    assert out == src and [(f.line, f.fix) for f in found] == [(3, False)]
    assert 'startswith("xla")' in found[0].message


def test_a_module_naming_no_cuda_that_makes_a_generator_on_its_callers_device_is_rewritten():
    """hkproj/pytorch-stable-diffusion's pipeline.py names no CUDA: its caller
    (a notebook) hands it the device."""
    src = HEAD + "def generate(device=None, seed=None):\n    generator = torch.Generator(device=device)\n" \
                 "    generator.manual_seed(seed)\n    return torch.randn(4, generator=generator, device=device)\n"
    out, found = _generators(src)
    assert found == [(4, True)], out


@pytest.mark.xla
@needs_xla
def test_generators_on_the_chosen_device_run_on_xla_and_draw_the_cpu_originals_numbers(tmp_path):
    """Before XLA107 read the device a generator is made on, this conversion
    raised at its first ``torch.Generator(device=device)`` (the device "xla")."""
    _, stdout, _, work = run_on_xla("generator_devices", tmp_path)
    original = subprocess.run([sys.executable, str(FIXTURES / "generator_devices" / "input.py")], cwd=work,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                              timeout=300)
    assert original.returncode == 0, original.stderr[-2000:]
    assert stdout.splitlines()[0] == "on xla" and original.stdout.splitlines()[0] == "on cpu"
    assert stdout.splitlines()[1:] == original.stdout.splitlines()[1:]  # (printed to 5 decimals)
    assert len(stdout.split()) == 2 + 8 + 2
