"""A rewritten CUDA test owns the code it switches on (issue 38, XLA118):
what a test decides (codemods/analysis/switches.py), and the engine keeping a
test whose decided code still holds CUDA after conversion."""

import os
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

from codemods.analysis.switches import decided_spans
from codemods.syntax.tree import TreeCache
from tests.conftest import convert_text

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def spans(source: str) -> dict:
    tree = TreeCache(cst.parse_module(source), source.encode(), source)
    try:
        return {line: sorted(found) for line, found in decided_spans(tree, lambda n: tree.import_qualnames(n)
                                                                      or set()).items()}
    finally:
        tree.release()


CARRIED = '''\
import torch

cuda = True if torch.cuda.is_available() else False
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
use = not args.cpu and cuda
if use:
    x = 1
while device.type == "cuda":
    break


def on_gpu():
    return torch.cuda.is_available()


if on_gpu():
    y = 2


def f(flag=torch.cuda.is_available()):
    if flag:
        return 1
    return 0


parser.add_argument("--cuda", default=torch.cuda.is_available())
if opts.cuda:
    z = 3
'''


def test_a_test_decides_the_code_its_value_reaches():
    found = spans(CARRIED)
    # the conditional itself, the alias chosen by the flag, the `if` of a flag of the flag
    assert found[3] == [(3, 3), (4, 4), (6, 7)]
    assert found[8] == [(8, 9)]  # a while loop's test
    assert found[13] == [(16, 17)]  # a function returning it: the tests that call it
    assert found[20] == [(21, 22)]  # a parameter default: the tests reading the parameter
    assert found[26] == [(27, 28)]  # an option's default: the tests reading the option
    assert set(found) == {3, 8, 13, 20, 26}


def test_a_name_is_followed_in_its_own_scope_only():
    source = '''\
import torch


def a():
    cuda = torch.cuda.is_available()
    if cuda:
        pass


def b(cuda):
    if cuda:
        pass
'''
    assert spans(source) == {5: [(6, 7)]}


# -- the engine ---------------------------------------------------------------------------------


def test_a_test_that_would_switch_on_unconverted_cuda_is_kept_and_reported():
    source = '''\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = Net().to(device)
if device == "cuda":
    adj = adj.to_sparse()
'''
    out, findings = convert_text(source)
    assert 'if device == "cuda":' in out  # the guard is not turned on for XLA: no sparse tensor on the device
    kept = [f for f in findings if f.code == "XLA118"]
    assert [f.line for f in kept] == [5]
    assert "`.to_sparse()` (line 6)" in kept[0].message
    assert convert_text(out)[0] == out  # idempotent


def test_a_flag_is_kept_where_one_of_its_uses_cannot_be_converted():
    source = '''\
import torch

cuda = torch.cuda.is_available()
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
if cuda:
    model.cuda()
ok = isinstance(x, Tensor)
'''
    out, findings = convert_text(source)
    assert "cuda = torch.cuda.is_available()" in out
    assert "Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor" in out  # isinstance: not converted
    assert [f.line for f in findings if f.code == "XLA118"] == [3]
    assert "`cuda.FloatTensor` (line 4)" in [f for f in findings if f.code == "XLA118"][0].message


def test_a_test_whose_side_converts_is_rewritten_and_not_reported():
    source = '''\
import torch

cuda = torch.cuda.is_available()
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
if cuda:
    model.cuda()
valid = Tensor(x.size(0), 1)
'''
    out, findings = convert_text(source)
    assert "cuda = True" in out
    assert "torch.cuda" not in out
    assert "XLA118" not in [f.code for f in findings]


def test_only_the_test_that_holds_cuda_is_kept():
    source = '''\
import torch

if torch.cuda.is_available():
    model.cuda()
if torch.cuda.is_available():
    adj = adj.to_sparse()
'''
    out, findings = convert_text(source)
    # the kept test chooses no device: the model still moves (see the next test for one that does)
    assert "if True:\n    model.to(torch_xla.device())\nif torch.cuda.is_available():\n    adj = adj" in out
    assert [f.line for f in findings if f.code == "XLA118"] == [5]


def test_the_check_holds_when_only_the_rewriting_rule_is_selected():
    source = "import torch\n\nif torch.cuda.is_available():\n    stream = torch.cuda.Stream()\n"
    out, findings = convert_text(source, select=["XLA105"])
    assert out == source
    assert not [f for f in findings if f.fix]


def test_a_kept_test_can_be_suppressed_and_is_still_kept():
    source = ("import torch\n\nif torch.cuda.is_available():  # xlaport: ignore[XLA118]\n"
              "    adj = adj.to_sparse()\n")
    out, findings = convert_text(source)
    assert out == source
    assert "XLA118" not in [f.code for f in findings]


# -- devices by value ---------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ['f"cuda"', 'f"cuda:{i}"', '"cuda:" + str(i)', '"cuda:{}".format(i)',
                                      '"cuda:%d" % i'])
def test_a_cuda_device_is_known_by_its_value(spelling):
    source = f"import torch\n\nx = torch.ones(2, device={spelling})\n"
    out, findings = convert_text(source)
    assert out == "import torch\nimport torch_xla\n\nx = torch.ones(2, device=torch_xla.device())\n"
    assert convert_text(source, select=["XLA199"])[1], "the spelling is counted and reported when left"


def test_a_function_returning_a_device_string_returns_the_xla_one():
    source = '''\
import torch


def gpu_name(index):
    return "cuda:" + str(index)


x = torch.ones(2).to(gpu_name(0))
'''
    out, findings = convert_text(source)
    assert 'return "xla"' in out and "import torch_xla" in out
    assert "XLA199" not in [f.code for f in findings]


# -- the programs run as the user runs them ------------------------------------------------------

try:
    import torch_xla  # noqa: F401

    HAVE_XLA = True
except ImportError:  # pragma: no cover
    HAVE_XLA = False


def _run(script: Path, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True)
    (cwd / "main.py").write_bytes(script.read_bytes())
    return subprocess.run([sys.executable, "main.py"], cwd=cwd, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
@pytest.mark.parametrize("name", ["legacy_types", "kept_switches"])
def test_the_conversion_runs_with_plain_python_where_the_original_ran(name, tmp_path):
    """The original on the CPU (no CUDA), the expected conversion on XLA's CPU
    backend, each with plain `python` from its own directory: both exit 0 with
    the same numbers, and the conversion ran graphs on XLA."""
    original = _run(FIXTURES / name / "input.py", tmp_path / "original", {"CUDA_VISIBLE_DEVICES": ""})
    assert original.returncode == 0, original.stderr[-3000:]
    metrics = tmp_path / "metrics.txt"
    converted = _run(FIXTURES / name / "expected.py", tmp_path / "converted",
                     {"PJRT_DEVICE": "CPU", "XLA_METRICS_FILE": str(metrics)})
    assert converted.returncode == 0, converted.stderr[-3000:]
    if name == "legacy_types":
        assert original.stdout.replace("probe 4.0 cpu", "probe 4.0 xla") == converted.stdout
        assert "Metric: ExecuteTime" in metrics.read_text()  # graphs ran on XLA
    else:
        # DataParallel, switched on as on CUDA, calls the model: the same values, saved under "module."
        assert original.stdout.replace("'bias', 'weight'", "'module.bias', 'module.weight'") == converted.stdout
        assert "keys ['module.bias', 'module.weight']" in converted.stdout


# -- what XLA cannot do (XLA158, XLA159) --------------------------------------------------------

SPARSE = '''\
import torch

use_cuda = torch.cuda.is_available()
adj = torch.eye(3).to_sparse()
x = torch.randn(3, 2)
if use_cuda:
    adj = adj.cuda()
    x = x.cuda()
print(torch.spmm(adj, x).sum().item())
'''


def test_a_sparse_tensor_sent_to_the_device_is_said_on_its_line_and_keeps_the_test():
    out, findings = convert_text(SPARSE)
    assert [(f.line, f.code) for f in findings if f.code in ("XLA118", "XLA158")] == [
        (3, "XLA118"), (4, "XLA158"), (7, "XLA158"), (9, "XLA158")]
    assert "use_cuda = torch.cuda.is_available()" in out  # the move stays off: the program runs where it ran


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_a_kept_sparse_program_runs_with_plain_python(tmp_path):
    _converted_run(SPARSE, tmp_path)


def _converted_run(text: str, tmp_path: Path) -> str:
    """What TEXT's conversion printed, run with plain `python` on XLA's CPU backend (it must exit 0)."""
    script = tmp_path / "converted.py"
    script.write_text(convert_text(text)[0])
    done = _run(script, tmp_path / "run", {"PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


CHOSEN = '''\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true")
parser.add_argument("--no-cuda", action="store_true")
args = parser.parse_args()
opted = args.cuda and torch.cuda.is_available()
if opted:
    device = torch.device("cuda")
else:
    device = torch.device("cpu")
default_on = torch.device("cuda" if not args.no_cuda and torch.cuda.is_available() else "cpu")
x = torch.ones(2).to(device) * 2
y = torch.ones(2).to(default_on) * 3
named = "cuda" if args.cuda and torch.cuda.is_available() else "cpu"
z = torch.ones(2).to(named)
print(x.device.type, y.device.type, z.device.type, (x.cpu() + y.cpu()).sum().item())
'''


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_the_users_device_choice_keeps_its_meaning(tmp_path):
    """pytorch/examples' mnist_hogwild asks for CUDA with `--cuda` (off by
    default): its conversion took XLA whatever the user chose, and crashed in
    `share_memory()`.  A choice read from an option is kept: CPU stays CPU,
    the CUDA side becomes XLA, and a default that took CUDA takes XLA."""
    script = tmp_path / "chosen.py"
    script.write_text(convert_text(CHOSEN)[0])
    for args, expected in (([], "cpu xla cpu 10.0"), (["--cuda"], "xla xla xla 10.0"),
                           (["--no-cuda"], "cpu cpu cpu 10.0")):
        done = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PJRT_DEVICE": "CPU"}, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == expected, (args, done.stdout)


# -- one question, one answer -------------------------------------------------------------------

HALVES = '''\
import torch


def build():
    torch.manual_seed(0)
    use_accel = torch.accelerator.is_available()
    if use_accel:
        device = torch.accelerator.current_accelerator()
    else:
        device = torch.device("cpu")
    model = torch.nn.Linear(4, 2).to(device)
    if use_accel:
        model.mask = torch.eye(2, 4).to_sparse().to(device)
    return model


def evaluate(model, x):
    use_accel = torch.accelerator.is_available()
    device = torch.device("cuda") if use_accel else torch.device("cpu")
    return model(x.to(device)).sum().item()


if __name__ == "__main__":
    print(round(evaluate(build(), torch.ones(3, 4)), 4))
'''


def test_a_kept_test_that_chooses_the_device_keeps_the_same_question_elsewhere():
    """pytorch/examples' imagenet: main_worker's test is kept, validate's
    asked again; answered True there alone, the batches went to XLA while the
    model stayed on the CPU ("Expected XLA tensor")."""
    out, findings = convert_text(HALVES)
    kept = {f.line: f.message for f in findings if f.code == "XLA118"}
    assert sorted(kept) == [6, 18]
    assert "asks what the test at line 6 asks" in kept[18]
    assert out.count("use_accel = torch.accelerator.is_available()") == 2
    assert 'torch.device("cpu")' in out.split("def evaluate")[1]  # the choice stays, and takes the CPU
    assert convert_text(out)[0] == out


def test_data_parallel_does_not_keep_a_test():
    """Without CUDA, DataParallel holds no device ids and calls its module."""
    source = "import torch\n\nif torch.cuda.is_available():\n    model = torch.nn.DataParallel(model).cuda()\n"
    out, findings = convert_text(source)
    assert "if True:" in out and "XLA118" not in [f.code for f in findings]


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_the_program_with_one_question_kept_runs_where_the_original_ran(tmp_path):
    original, converted = _original_and_conversion(HALVES, tmp_path)
    assert converted == original


def _original_and_conversion(text: str, tmp_path: Path):
    """What the program printed: on the CPU as written (no CUDA), and
    converted, on XLA's CPU backend; each must exit 0."""
    source, converted = tmp_path / "original.py", tmp_path / "converted.py"
    source.write_text(text)
    converted.write_text(convert_text(text)[0])
    out = []
    for script, env in ((source, {"CUDA_VISIBLE_DEVICES": ""}), (converted, {"PJRT_DEVICE": "CPU"})):
        done = _run(script, tmp_path / script.stem, env)
        assert done.returncode == 0, done.stderr[-3000:]
        out.append(done.stdout)
    return out


@pytest.mark.parametrize("target, kind", [("torch_xla-2.9", "xla"), ("cpu", "cpu"), ("torchtpu", "tpu")])
def test_a_device_type_compared_with_cuda_is_compared_with_the_targets(target, kind):
    """verify's CPU reference of pytorch/examples' imagenet compared with
    "xla" and so skipped the GPU's side (its DataParallel) that the
    conversion took: every state-dict key differed."""
    source = "import torch\n\ndevice = torch.device('cpu')\nif device.type == 'cuda':\n    model = wrap(model)\n"
    out, findings = convert_text(source, select=["XLA104"], target=target)
    assert f"if device.type == '{kind}':" in out


# -- the default tensor type and device ---------------------------------------------------------

DEFAULTS = '''\
import torch

if torch.cuda.is_available():
    torch.set_default_tensor_type('torch.cuda.FloatTensor')
x = torch.randn(3)
torch.set_default_device("cuda")
print(x.device.type, torch.ones(2).device.type)
'''


def test_a_cuda_default_tensor_type_and_device_become_the_xla_device():
    """Before: the test was rewritten around a string no rule read, and the
    conversion failed where the original ran ("Found no NVIDIA driver")."""
    out, findings = convert_text(DEFAULTS)
    assert "    torch.set_default_device(torch_xla.device())\n" in out
    assert 'torch.set_default_device("cuda")' not in out and out.count("set_default_device(torch_xla.device())") == 2
    assert [f.code for f in findings if f.fix] == ["XLA105", "XLA119", "XLA102"]


def test_another_cuda_default_tensor_type_keeps_its_test():
    source = "import torch\n\nif torch.cuda.is_available():\n    torch.set_default_tensor_type('torch.cuda.DoubleTensor')\n"
    out, findings = convert_text(source)
    assert out == source
    assert "`cuda.DoubleTensor` (line 4)" in [f.message for f in findings if f.code == "XLA118"][0]


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_the_default_device_program_runs_on_xla(tmp_path):
    assert _converted_run(DEFAULTS, tmp_path) == "xla xla\n"


# -- what runs by `and` / `or` ------------------------------------------------------------------

SHORT_CIRCUIT = '''\
import torch

use_gpu = torch.cuda.is_available()
half = use_gpu and torch.cuda.get_device_capability()[0] >= 7
full = not use_gpu or torch.cuda.get_device_capability()[0] < 7
dtype = torch.float16 if half else torch.float32
x = torch.arange(4, dtype=dtype, device="cuda" if use_gpu else "cpu")
print(x.sum().item(), half, full)
'''


def test_the_right_side_of_and_that_only_cuda_has_goes_and_the_test_is_rewritten():
    """Before: the flag became True and `get_device_capability()` ran on XLA
    ("Found no NVIDIA driver"), where the original never called it."""
    out, findings = convert_text(SHORT_CIRCUIT)
    assert "half = False\nfull = True\n" in out and "use_gpu = True" in out
    assert [f.line for f in findings if f.code == "XLA116"] == [4, 5]


def test_a_right_side_xla_cannot_run_keeps_the_test():
    source = "import torch\n\nuse_gpu = torch.cuda.is_available()\nsparse = use_gpu and adj.to_sparse()\n"
    out, findings = convert_text(source)
    assert "use_gpu = torch.cuda.is_available()" in out
    assert "`.to_sparse()` (line 4)" in [f.message for f in findings if f.code == "XLA118"][0]


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_the_short_circuit_program_runs_on_xla_as_on_the_cpu(tmp_path):
    original, converted = _original_and_conversion(SHORT_CIRCUIT, tmp_path)
    assert converted == original == "6.0 False True\n"

