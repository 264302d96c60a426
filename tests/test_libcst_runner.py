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
