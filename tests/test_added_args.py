"""An argument a rule adds to a call (``codemods/syntax/nodes.py``'s
``with_arg``: ``force=True``, ``drop_last=True``, ``map_location="cpu"``,
``type=``) takes the call's own layout: one argument a line where the call has
them so, the closing bracket where it was, a trailing comma kept."""


import libcst as cst
import pytest

from codemods.syntax.nodes import keyword_arg, with_arg
from tests.conftest import assert_formatted_as_input, convert_text
from xlaport.style import ruff_binary


def added(source: str) -> str:
    call = cst.parse_expression(source)
    assert isinstance(call, cst.Call)
    return cst.Module([]).code_for_node(with_arg(call, keyword_arg("force", cst.Name("True"))))


@pytest.mark.parametrize("before, after", [
    ("f()", "f(force=True)"),
    ("f(a)", "f(a, force=True)"),
    ("f(a, b)", "f(a, b, force=True)"),
    ("f(a=[\n    1])", "f(a=[\n    1], force=True)"),
    # one argument a line, the bracket on a line of its own
    ("f(\n    a,\n    b\n)", "f(\n    a,\n    b,\n    force=True\n)"),
    ("f(\n    a=1\n)", "f(\n    a=1,\n    force=True\n)"),
    # a trailing comma stays trailing
    ("f(\n    a,\n    b,\n)", "f(\n    a,\n    b,\n    force=True,\n)"),
    ("f(\n    a,\n)", "f(\n    a,\n    force=True,\n)"),
    # the bracket indented as DiT's train.py has it: it stays after the new argument
    ("f(\n    a,\n    b\n    )", "f(\n    a,\n    b,\n    force=True\n    )"),
    # a comment after an argument is not copied to the new line
    ("f(\n    a,  # the level\n    b\n)", "f(\n    a,  # the level\n    b,\n    force=True\n)"),
])
def test_the_new_argument_takes_the_calls_layout(before, after):
    assert added(before) == after
    cst.parse_expression(added(before))


CONFIGURED = '''\
import logging

import torch

logging.basicConfig(
    level=logging.INFO,
    format="%(message)s",
    handlers=[logging.StreamHandler(), logging.FileHandler("log.txt")]
    )
model = torch.nn.Linear(2, 2).cuda()
'''


def test_a_multi_line_call_gets_the_argument_on_a_line_of_its_own():
    out = convert_text(CONFIGURED)[0]
    assert '    handlers=[logging.StreamHandler(), logging.FileHandler("log.txt")],\n    force=True\n    )\n' in out
    assert not any(line != line.rstrip() for line in out.splitlines())  # no space left at a line's end


@pytest.mark.skipif(ruff_binary() is None, reason="needs ruff (a dependency of xlaport)")
def test_the_output_is_formatted_where_the_input_was(tmp_path):
    source = CONFIGURED.replace('")]\n    )\n', '")],\n)\n')
    assert_formatted_as_input(tmp_path, source)
