"""Every line a user is shown is a line of the user's file (issue 26):
lines inside messages, findings after an in-place convert, parse errors,
ignores that silence a line whichever rule speaks there, and `--diff`."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from xlaport.cli import main

CUDA = "import torch\nx = torch.zeros(2).cuda()\n"


def xlaport(*args):
    return CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)


# ------------------------------------------------------------------ item 14

LOOP_AFTER_DROPPED_FLAGS = """import torch

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = True

for x in loader:
    loss = model(x)
    loss.backward()
    opt.step()
    if loss > 10:
        break
"""


def test_lines_inside_messages_are_lines_of_the_users_file(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(LOOP_AFTER_DROPPED_FLAGS)
    out = xlaport("lint", "--format", "concise", f).output
    assert "train.py:10:8: XLA404" in out
    assert "(in the loop at line 6)" in out  # the loop is on line 6; two rewrites remove lines 3-4


# ------------------------------------------------------------------ item 15

def test_findings_of_a_file_converted_in_place_point_into_the_file_as_written(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(LOOP_AFTER_DROPPED_FLAGS)
    result = xlaport("convert", "--format", "concise", f)
    written = f.read_text().splitlines()
    review = [line for line in result.output.splitlines() if line.startswith(str(f)) and " XLA404 " in line]
    assert len(review) == 1
    line = int(review[0].split(":")[1])
    assert written[line - 1].strip() == "if loss > 10:"
    loop = int(review[0].rsplit("in the loop at line ", 1)[1].rstrip(")"))
    assert written[loop - 1].startswith("for x in")
    assert "Lines are those of the files as written." in result.output


# ------------------------------------------------------------------ item 16

def _error_at(tmp_path, body: bytes) -> str:
    f = tmp_path / "bad.py"
    f.write_bytes(body)
    result = xlaport("lint", "--format", "concise", f)
    assert result.exit_code == 2
    return [line for line in result.stdout.splitlines() if "XLA001" in line][0]


def test_parse_errors_point_at_the_line_python_names(tmp_path):
    assert "bad.py:4:7: XLA001 cannot parse: invalid syntax" in _error_at(
        tmp_path, b"import torch\n\nx = torch.zeros(1).cuda()\ndef f(:\n    pass\n")
    tabs = _error_at(tmp_path, b"import torch\nif True:\n        x = torch.zeros(1).cuda()\n\ty = 2\n")
    assert tabs.startswith(str(tmp_path / "bad.py") + ":4:") and "tabs and spaces" in tabs


def test_decode_errors_give_the_line_and_column_of_the_byte(tmp_path):
    line = _error_at(tmp_path, b"import torch\n# comment\nx = torch.zeros(2).cuda()\ns = \"caf\xe9 is here\"\n")
    assert ":4:9: XLA001 cannot decode as utf-8: byte 0xe9" in line


# ------------------------------------------------------------------ item 17

COMPARISONS = """import torch

x = torch.zeros(2)
if cfg.backend == "cuda":
    print("gpu")
if cfg.backend == "cuda":  # noqa: XLA104
    print("gpu")
"""


def test_ignoring_a_rule_silences_its_lines_whichever_rule(tmp_path):
    f = tmp_path / "cmp.py"
    f.write_text(COMPARISONS)
    full = xlaport("lint", "--format", "concise", f).stdout
    assert full.count("XLA104") == 1 and "XLA199" not in full  # the noqa silences line 6 entirely
    ignored = xlaport("lint", "--format", "concise", "--ignore", "XLA104", f)
    assert ignored.exit_code == 0, ignored.output
    assert "XLA199" not in ignored.output
    (tmp_path / "pyproject.toml").write_text('[tool.xlaport]\nper-file-ignores = {"cmp.py" = ["XLA104"]}\n')
    assert "XLA199" not in xlaport("lint", "--format", "concise", f).stdout


def test_ignoring_the_only_rule_of_a_codemod_still_silences_the_catch_all(tmp_path):
    """XLA109 is its codemod's only rule: ignored, that codemod has nothing
    to rewrite, but it still says where it would have spoken (the catch-all
    used to report the device option's "cuda" as XLA199)."""
    f = tmp_path / "ds.py"
    f.write_text('import argparse\nimport torch\n\np = argparse.ArgumentParser()\n'
                 'p.add_argument("--device", default="cuda")\nx = torch.zeros(2, device=p.parse_args().device)\n')
    assert "XLA109" in xlaport("lint", "--format", "concise", f).stdout
    ignored = xlaport("lint", "--format", "concise", "--ignore", "XLA109", f)
    assert ignored.exit_code == 0 and "XLA199" not in ignored.output, ignored.output
    only = xlaport("lint", "--format", "concise", "--select", "XLA199", f)
    assert "XLA199" in only.output, only.output  # chosen alone, the catch-all speaks for every rule


# ------------------------------------------------------------------ item 10

def test_convert_diff_names_the_files_it_could_not_process_and_the_items_to_review(tmp_path):
    (tmp_path / "bad.py").write_text("import torch\nx = torch.zeros(1).cuda()\ndef f(:\n")
    (tmp_path / "cmp.py").write_text(COMPARISONS)
    (tmp_path / "gpu.py").write_text(CUDA)
    result = CliRunner().invoke(main, ["convert", "--diff", str(tmp_path)])
    assert result.exit_code == 2
    err = result.stderr
    assert "bad.py:3:7: XLA001" in err
    assert "cmp.py:4:4: XLA104" in err
    assert "+x = torch.zeros(2).to(torch_xla.device())" in result.stdout
    assert "XLA104" not in result.stdout  # the diff stays a diff


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs patch(1)")
def test_convert_diff_output_applies_as_a_patch(tmp_path):
    (tmp_path / "gpu.py").write_text(CUDA)
    diff = subprocess.run([sys.executable, "-m", "xlaport", "convert", "--diff", "--no-cache", "gpu.py"],
                          cwd=tmp_path, capture_output=True, text=True, env={**os.environ})
    assert diff.returncode == 1
    patched = subprocess.run(["patch", "-p1"], input=diff.stdout, cwd=tmp_path, capture_output=True, text=True)
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert Path(tmp_path / "gpu.py").read_text().count("torch_xla.device()") == 1
