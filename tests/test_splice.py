"""codemods.syntax.splice: the code of a rewritten tree, generated statement by
statement, equals LibCST generating the whole module."""

from __future__ import annotations

import libcst as cst
import pytest

from codemods.syntax.positions import statement_starts
from codemods.syntax.splice import spliced_code
from codemods.syntax.traverse import transform_module

TRICKY = '''\
"""Module doc."""
import os

# a comment before the class


@decorator  # trailing
# between decorators
@other
class A(Base):
    """Doc."""

    x = target(1); y = 2

    def f(self):
        if cond:
            target(2)
        return target(3)
            # deeper comment: the block's footer

    # a comment about g
    def g(self):
        def inner():
            return target(4)
        return inner

    class Nested:
        def h(self):
            target(5)
\f
def last(a,
         b):  # continuation lines keep their own whitespace
    value = call(a,
                 b)
    target(6)


def blocks(xs):
    for x in xs:  # a loop: its body is descended into
        # a leading comment
        target(7)

            # deeper: the loop body's footer
    else:
        target(8)
    while cond:
        with ctx() as c:
            target(9)
            # the with-body's footer
    # before the if
    if a:
        target(10)
    elif b:
        target(11)
    for y in xs: target(12)

# the module's footer
'''


class Rewrite(cst.CSTTransformer):
    """Renames calls of `target`, removes or doubles some statements."""

    def __init__(self, remove=(), double=(), header=False):
        super().__init__()
        self.remove, self.double, self.header = remove, double, header

    def leave_Name(self, original_node, updated_node):
        return updated_node.with_changes(value="renamed") if updated_node.value == "target" else updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        code = cst.Module([]).code_for_node(original_node).strip()
        if any(r in code for r in self.remove):
            return cst.RemoveFromParent()
        if any(d in code for d in self.double):
            return cst.FlattenSentinel([updated_node, updated_node.deep_clone()])
        return updated_node

    def leave_FunctionDef(self, original_node, updated_node):
        if self.header and updated_node.name.value == "h":
            return updated_node.with_changes(name=cst.Name("h2"))
        return updated_node


CASES = {
    "rename": Rewrite(),
    "remove the last statement of a body": Rewrite(remove=("target(3)", "target(6)", "target(9)", "target(10)")),
    "remove a semicolon line": Rewrite(remove=("x = target(1)",)),
    "add after the last statement of a body": Rewrite(double=("target(5)", "target(6)", "return inner", "target(7)",
                                                              "target(9)")),
    "add after the first statement": Rewrite(double=("import os",)),
    "a changed function header": Rewrite(header=True),
}


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("case", list(CASES))
def test_spliced_code_equals_the_whole_module_generated(case, newline):
    text = TRICKY.replace("\n", newline)
    old = cst.parse_module(text)
    new = transform_module(old, CASES[case])
    assert new.code != text  # the transform changed something
    got = spliced_code(old, text, new, statement_starts(old, text))
    assert got == new.code


def test_unchanged_is_the_old_text_and_unknown_is_none():
    old = cst.parse_module(TRICKY)
    starts = statement_starts(old, TRICKY)
    assert spliced_code(old, TRICKY, old, starts) is TRICKY
    new = transform_module(old, Rewrite())
    assert spliced_code(old, TRICKY, new, None) is None  # no statement lines: the caller generates it all
    # a module with no trailing newline: left to LibCST's generator
    bare = cst.parse_module("x = target(1)")
    assert spliced_code(bare, "x = target(1)", transform_module(bare, Rewrite()),
                        statement_starts(bare, "x = target(1)")) is None


def test_only_the_changed_statement_is_generated(monkeypatch):
    """A change deep in one method generates that statement, not its class."""
    import codemods.syntax.splice as splice

    generated = []
    real = splice._generate

    def spy(stmts, indents, module):
        generated.extend(stmts)
        return real(stmts, indents, module)

    monkeypatch.setattr(splice, "_generate", spy)
    old = cst.parse_module(TRICKY)
    new = transform_module(old, Rewrite())
    assert spliced_code(old, TRICKY, new, statement_starts(old, TRICKY)) == new.code
    code = [cst.Module([]).code_for_node(s).strip() for s in generated]
    # A's attribute line, the call in f's `if` (its header is the same) and f's return, inner's return,
    # h's call, last's call
    assert code == ["x = renamed(1); y = 2", "renamed(2)", "return renamed(3)",
                    "return renamed(4)", "renamed(5)", "renamed(6)",
                    "for x in xs:  # a loop: its body is descended into\n    # a leading comment\n    renamed(7)\n\n"
                    "        # deeper: the loop body's footer\nelse:\n    renamed(8)", "renamed(9)",
                    "# before the if\nif a:\n    renamed(10)\nelif b:\n    renamed(11)", "for y in xs: renamed(12)"]


def test_adding_an_import_below_a_comment_header_keeps_the_header_and_splices():
    """LibCST's AddImportsVisitor gives back a copy of the comment header
    (a licence); the engine keeps the original objects, so the code of the
    module with its new import is spliced rather than generated whole."""
    from codemods.syntax import imports

    class Ctx:
        scratch: dict = {}

    text = "# Copyright line one\n# line two\n\nimport os\n\n\ndef f():\n    return os.sep\n"
    old = cst.parse_module(text)
    ctx = Ctx()
    ctx.scratch = {}
    imports.need(ctx, "torch_xla")
    new, changed = imports.apply(ctx, old)
    assert changed
    assert len(new.header) == len(old.header) == 3 and all(a is b for a, b in zip(new.header, old.header))
    got = spliced_code(old, text, new, statement_starts(old, text))
    assert got is not None and got == new.code
    assert "import torch_xla  # noqa: F401\n" in got and got.startswith("# Copyright line one\n# line two\n")
