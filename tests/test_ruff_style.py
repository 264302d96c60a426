"""Converted code passes Ruff's default check and format wherever the input
did (issue 26, item 20; ``xlaport/style.py``): every fixture program, made
Ruff-clean first, converted as a user converts it."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xlaport.style import ruff_binary

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted(p for p in (ROOT / "fixtures").glob("*/input.py"))

pytestmark = pytest.mark.skipif(ruff_binary() is None, reason="needs ruff (a dependency of xlaport)")


def ruff(*args, cwd):
    return subprocess.run([ruff_binary(), *args], cwd=cwd, capture_output=True, text=True)


def codes(path: Path):
    out = ruff("check", "--isolated", "--output-format", "json", "--exit-zero", path.name, cwd=path.parent)
    return sorted({d["code"] for d in json.loads(out.stdout)})


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(input, output) pairs: each fixture formatted and import-sorted by
    Ruff, then converted in place by `xlaport convert`."""
    tmp = tmp_path_factory.mktemp("ruff")
    src, out = tmp / "src", tmp / "out"
    src.mkdir()
    for f in FIXTURES:
        shutil.copy(f, src / f"{f.parent.name}.py")
    ruff("check", "--isolated", "--select", "I", "--fix", "-q", ".", cwd=src)
    ruff("format", "--isolated", "-q", ".", cwd=src)
    shutil.copytree(src, out)
    done = subprocess.run([sys.executable, "-m", "xlaport", "convert", "--no-cache", "-q", "."], cwd=out,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [(src / f"{f.parent.name}.py", out / f"{f.parent.name}.py") for f in FIXTURES]


def test_ruff_check_reports_nothing_the_input_did_not_have(converted):
    changed = 0
    for before, after in converted:
        changed += before.read_bytes() != after.read_bytes()
        new = sorted(set(codes(after)) - set(codes(before)))
        assert not new, f"{after.name}: {new}"
    assert changed >= 10  # the fixtures are CUDA programs: most of them change


def test_ruff_format_leaves_converted_files_as_they_are(converted):
    for before, after in converted:
        if ruff("format", "--isolated", "--check", before.name, cwd=before.parent).returncode == 0:
            check = ruff("format", "--isolated", "--check", "--diff", after.name, cwd=after.parent)
            assert check.returncode == 0, check.stdout


def test_a_style_the_input_did_not_follow_is_not_imposed(tmp_path):
    f = tmp_path / "messy.py"
    messy = "import torch\nx   =   torch.zeros(2).cuda()\ny = [1,2,3]\n"
    f.write_text(messy)
    done = subprocess.run([sys.executable, "-m", "xlaport", "convert", "--no-cache", str(f)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert "x   =   torch.zeros(2).to(torch_xla.device())" in f.read_text()
    assert "y = [1,2,3]" in f.read_text()
