"""Statements a rule removes (``codemods/syntax/edits.py``): the blank and
comment lines above one are the user's, and stay: above the statement that
follows it, at the end of its block when it was the last, above the ``pass``
of a block it leaves empty."""

import ast

import pytest

from tests.conftest import assert_formatted_as_input, convert_text
from xlaport.style import ruff_binary

SOURCE = """\
import torch


def step(model, x):
    y = model(x.cuda())
    # memory stats, between steps
    torch.cuda.empty_cache()


def setup(x):
    x = x.cuda()

    torch.cuda.empty_cache()


def tidy():
    # free what is cached
    torch.cuda.empty_cache()


for i in range(3):
    print(step(torch.nn.Identity(), torch.ones(2)))
    # the next step waits for this one
    torch.cuda.empty_cache(); torch.cuda.empty_cache()
    # and the loop's last words
    torch.cuda.empty_cache()

# the end of the file
torch.cuda.empty_cache()
"""


@pytest.fixture(scope="module")
def converted():
    out, findings = convert_text(SOURCE)
    return out, findings


def test_every_statement_went(converted):
    out, findings = converted
    assert "empty_cache" not in out, out
    assert sorted({f.code for f in findings}) == ["XLA101", "XLA112"], [(f.code, f.line) for f in findings]
    ast.parse(out)


def test_the_comment_above_the_last_statement_of_a_block_stays_at_its_end(converted):
    out, _ = converted
    assert "    y = model(x.to(torch_xla.device()))\n    # memory stats, between steps\n\n\ndef setup" in out, out
    assert "    # and the loop's last words\n\n# the end of the file\n" in out, out


def test_a_block_left_empty_keeps_its_comment_above_its_pass(converted):
    out, _ = converted
    assert "def tidy():\n    # free what is cached\n    pass\n" in out, out


def test_the_comment_above_a_statement_in_the_middle_moves_down(converted):
    out, _ = converted
    assert "    # the next step waits for this one\n    # and the loop's last words\n" in out, out


def test_the_comment_at_the_end_of_the_module_stays(converted):
    out, _ = converted
    assert out.endswith("\n# the end of the file\n"), out


def test_every_comment_of_the_input_is_in_the_output(converted):
    out, _ = converted
    comments = [line.strip() for line in SOURCE.splitlines() if line.strip().startswith("#")]
    assert [line.strip() for line in out.splitlines() if line.strip().startswith("#")] == comments


def test_a_second_conversion_changes_nothing(converted):
    out, _ = converted
    assert convert_text(out)[0] == out


def test_blank_lines_alone_are_not_kept_at_the_end_of_a_block(converted):
    out, _ = converted
    assert "def setup(x):\n    x = x.to(torch_xla.device())\n\n\ndef tidy" in out, out


@pytest.mark.skipif(ruff_binary() is None, reason="needs ruff (a dependency of xlaport)")
def test_the_output_is_formatted_where_the_input_was(tmp_path):
    source = SOURCE.replace("torch.cuda.empty_cache(); torch.cuda.empty_cache()", "torch.cuda.empty_cache()")
    assert_formatted_as_input(tmp_path, source)
