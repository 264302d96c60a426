"""codemods/ works through LibCST's own runner too."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_libcst_tool_runs_device_swap(tmp_path):
    shutil.copy(ROOT / ".libcst.codemod.yaml", tmp_path / ".libcst.codemod.yaml")
    target = tmp_path / "train.py"
    target.write_text("import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n")
    r = subprocess.run(
        [sys.executable, "-m", "libcst.tool", "codemod", "--no-format", "devices.DeviceSwap", str(target)],
        cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert target.read_text() == (
        "import torch\nimport torch_xla\n\nmodel = torch.nn.Linear(2, 2).to(torch_xla.device())\n"
    )


def _tool(tmp_path, *args):
    shutil.copy(ROOT / ".libcst.codemod.yaml", tmp_path / ".libcst.codemod.yaml")
    return subprocess.run(
        [sys.executable, "-m", "libcst.tool", *args],
        cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_libcst_tool_lists_the_codemods_as_its_commands(tmp_path):
    r = _tool(tmp_path, "list")
    assert r.returncode == 0, r.stderr
    assert "devices.DeviceSwap - Rewrite hard-coded CUDA devices" in r.stdout
    assert "barriers.StepBarrier - Insert the XLA step barrier" in r.stdout


def test_libcst_tool_removes_the_import_a_rewrite_left_unused(tmp_path):
    target = tmp_path / "sample.py"
    target.write_text(
        "from tqdm import tqdm\n\n\ndef sample(unet, x, steps):\n"
        "    for t in tqdm(steps):\n        x = unet(x, t)\n    return x\n"
    )
    r = _tool(tmp_path, "codemod", "--no-format", "progress.BarIterables", str(target))
    assert r.returncode == 0, r.stderr
    # LibCST's RemoveImportsVisitor leaves the blank lines after the import; a file does not begin with them
    assert target.read_text() == "def sample(unet, x, steps):\n    for t in steps:\n        x = unet(x, t)\n    return x\n"


def test_lint_does_not_load_libcst_codemod_when_no_import_changes(tmp_path):
    """LibCST's codemod package (and its matchers, ~0.2 s) is imported only
    to add or remove imports; a lint that needs neither never loads it."""
    target = tmp_path / "train.py"
    target.write_text(
        "def sample(unet, x, steps):\n    for t in steps:\n        x = unet(x, t)\n"
        "        if x.abs().max().item() > 10:\n            break\n    return x\n"
    )
    probe = (
        "import sys\nfrom xlaport.cli import main\n"
        f"try:\n    main(['lint', '--no-cache', '--port-cpu', '--select', 'XLA4', {str(target)!r}])\nexcept SystemExit as e:\n    code = e.code\n"
        "print(code, 'libcst.codemod' in sys.modules, 'libcst.matchers' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip().splitlines()[-1] == "1 False False", r.stdout + r.stderr
