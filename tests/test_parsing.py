"""xlaport's parse (codemods.syntax.parsing): LibCST's public API, nothing of
LibCST replaced -- also while a parse runs in another thread."""

import threading
from pathlib import Path

import libcst as cst
import pytest

from codemods.syntax import parsing

ROOT = Path(__file__).resolve().parent.parent


def _sources():
    return sorted(ROOT.glob("fixtures/*/input.py")) + sorted((ROOT / "codemods").rglob("*.py"))


@pytest.mark.parametrize("path", _sources()[:40], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_tree_is_libcsts(path):
    source = path.read_bytes()
    ours, theirs = parsing.parse_module(source), cst.parse_module(source)
    assert ours.deep_equals(theirs)
    assert ours.code == theirs.code == source.decode("utf-8")


def test_libcst_checks_its_nodes_while_xlaport_parses_in_another_thread():
    """Issue 42, item 1: the parse used to switch LibCST's node checks off
    (and stand its whitespace classes in) process-wide for its length: a
    thread making nodes meanwhile could build an invalid one unchecked, and
    `isinstance(x, cst.Newline)` saw a function.  Every node made here while
    large files parse must still be checked."""
    source = b"".join(p.read_bytes() for p in sorted((ROOT / "codemods").glob("*.py"))[:12])
    done = threading.Event()

    def parse():
        for _ in range(3):
            parsing.parse_module(source)
        done.set()

    worker = threading.Thread(target=parse)
    worker.start()
    unchecked = tries = 0
    while not done.is_set():
        tries += 1
        try:
            cst.Name("two words")
            unchecked += 1
        except cst.CSTValidationError:
            pass
        assert isinstance(cst.Newline, type) and isinstance(cst.SimpleWhitespace, type)
    worker.join()
    assert tries > 10 and unchecked == 0, (tries, unchecked)


def test_valid_python_that_libcst_rejects_is_reported_on_its_line_and_left_alone(tmp_path):
    # Instagram/LibCST#1061: the parser builds this, its check raises TypeError
    source = "import torch\n\ny = torch.zeros(2).cuda()\n\n\ndef f():\n    return () if 0 else(lambda:())\n"
    with pytest.raises(TypeError):
        cst.parse_module(source)
    with pytest.raises(parsing.LibcstRejects) as raised:
        parsing.parse_module(source)
    assert raised.value.line == 7 and "Instagram/LibCST#1061" in raised.value.message
    from click.testing import CliRunner

    from xlaport.cli import main

    f = tmp_path / "f.py"
    f.write_text(source)
    result = CliRunner().invoke(main, ["convert", "--no-cache", str(f)])
    assert result.exit_code == 2 and f.read_text() == source
    assert f"{f}:7:1: XLA001 LibCST cannot build this valid Python" in result.output
