"""xlaport's parse (codemods.syntax.parsing): LibCST's tree, its nodes
unchecked while the parser makes them, checked again afterwards."""

from pathlib import Path

import libcst as cst
import pytest

from codemods.syntax import parsing
from tests.conftest import convert_text

ROOT = Path(__file__).resolve().parent.parent


def _sources():
    return sorted(ROOT.glob("fixtures/*/input.py")) + sorted((ROOT / "codemods").rglob("*.py"))


def test_this_libcst_is_one_whose_checks_can_be_skipped():
    # the speed-up is only there when the installed LibCST checks nodes in
    # CSTNode.__post_init__ alone; the pinned one does
    assert parsing.SKIPS_CHECKS


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_tree_is_libcsts(path):
    source = path.read_bytes()
    ours, theirs = parsing.parse_module(source), cst.parse_module(source)
    assert ours.deep_equals(theirs)
    assert ours.code == theirs.code == source.decode("utf-8")


def test_nodes_made_after_a_parse_are_checked():
    parsing.parse_module("x = 1\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("two words")


def test_nodes_are_checked_again_after_a_parse_that_fails():
    with pytest.raises(cst.ParserSyntaxError):
        parsing.parse_module("def (:\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("two words")


def test_valid_python_that_libcsts_check_rejects_is_converted():
    # Instagram/LibCST#1061: the parser builds this, its check raises TypeError
    # (a rewrite that rebuilds the expression itself still meets the check)
    source = "import torch\n\ny = torch.zeros(2).cuda()\n\n\ndef f():\n    return () if 0 else(lambda:())\n"
    with pytest.raises(TypeError):
        cst.parse_module(source)
    code, findings = convert_text(source)
    assert code == source.replace("import torch\n", "import torch\nimport torch_xla\n").replace(
        ".cuda()", ".to(torch_xla.device())")
    assert [f.code for f in findings] == ["XLA101"]


def test_every_class_the_parser_makes_gets_the_unchecked_constructor_and_its_own_back():
    # the parse's speed-up: a class left out would silently cost the slow
    # constructor again; a constructor left swapped would skip the checks
    from codemods.syntax.nodes import walk

    source = (ROOT / "fixtures" / "traps_through_calls" / "input.py").read_bytes()
    inits = parsing._fast_inits()
    tree = parsing.parse_module(source)
    made = {type(n) for n in walk(tree)}
    assert len(made) > 30
    assert made <= set(inits)
    assert all(kind.__dict__["__init__"] is own for kind, (_, own) in inits.items())


def test_the_unchecked_constructor_sets_every_field_and_default():
    fast, _ = parsing._fast_inits()[cst.FunctionDef]
    node = cst.FunctionDef.__new__(cst.FunctionDef)
    fast(node, cst.Name("f"), cst.Parameters(), cst.IndentedBlock(body=[]))
    assert node.deep_equals(cst.FunctionDef(cst.Name("f"), cst.Parameters(), cst.IndentedBlock(body=[])))
    assert node.whitespace_after_def is not None and node.decorators == ()


def test_plain_whitespace_is_shared_and_the_classes_are_libcsts_again():
    source = b"if x: y = 1  # c\nz = f(a, b)\nw = [\n    1,\n]\n"
    tree = parsing.parse_module(source)
    assert tree.deep_equals(cst.parse_module(source)) and tree.code == source.decode()
    first, second = tree.body[1].body[0], tree.body[2].body[0]
    assert first.targets[0].whitespace_before_equal is second.targets[0].whitespace_before_equal  # " "
    assert tree.body[1].trailing_whitespace is tree.body[2].trailing_whitespace  # no comment, "\n"
    assert tree.body[0].body.trailing_whitespace.comment.value == "# c"  # a comment: a node of its own
    assert (cst.SimpleWhitespace, cst.Newline, cst.TrailingWhitespace) == (
        cst.SimpleWhitespace(" ").__class__, type(cst.Newline()), type(cst.TrailingWhitespace()))
    assert isinstance(cst.SimpleWhitespace, type) and isinstance(cst.TrailingWhitespace, type)
    # no walker meets a shared node: every node it indexes is there once
    from codemods.syntax.tree import TreeCache

    assert TreeCache(tree).nodes_unique()
