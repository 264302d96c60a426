"""codemods.syntax.traverse against LibCST's own ``CSTNode.visit``: the same
callbacks in the same order, the same output, and unchanged subtrees shared."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import libcst as cst
import pytest

from codemods.syntax.traverse import transform, transform_module
from codemods.syntax.tree import walk

SAMPLE = '''\
from . import a as b, c
from ..pkg.mod import (x, y as z)
import os.path as osp

@decorator(arg=1)
@other
async def f(p, /, q: int = 1, *args, r, s=2, **kw) -> "T":
    async for i in aiter(q):
        async with ctx() as (u, v), other():
            pass
    return [e async for e in g if e if not e] or {k: v for k, v in d.items()}

class C(Base, metaclass=M, **extra):
    """doc"""
    attr: int = 3
    def m(self, *, key=None):
        lam = lambda a, *b, c=1, **d: a if b else c
        try:
            x = data[1:2:3, ::4, a:]
        except (ValueError, TypeError) as err:
            raise RuntimeError("bad") from err
        else:
            y = f"{x!r:>{width}} and {y=}"
        finally:
            del x
        try:
            pass
        except* OSError as group:
            pass
        while (n := next(it)) is not None:
            yield from n
        else:
            global G
        match cmd:
            case [Point(x=0, y=0), *rest] if rest:
                pass
            case {"k": v, **others} | None:
                pass
        for t, (u, *w) in zip(a, b):
            continue
        print(*args, sep="", **kw); z = not a and b or c
        assert x, "msg"
        return await other(x)[0].attr
'''


class Recorder(cst.CSTTransformer):
    """Records every callback; changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.events = []

    def on_visit(self, node):
        self.events.append(("visit", id(node)))
        return True

    def on_leave(self, original_node, updated_node):
        self.events.append(("leave", id(original_node)))
        return updated_node


def _sources():
    yield "sample", SAMPLE
    spec = importlib.util.find_spec("diffusers")
    if spec is not None and spec.origin:  # real code, when the test subject is installed
        root = Path(spec.origin).parent
        for rel in ("pipelines/stable_diffusion/pipeline_stable_diffusion.py", "schedulers/scheduling_ddim.py"):
            path = root / rel
            if path.exists():
                yield rel, path.read_text()


@pytest.mark.parametrize("name,source", list(_sources()))
def test_same_callbacks_in_the_same_order_as_libcst(name, source):
    module = cst.parse_module(source)
    entered = {id(n) for n in walk(module)}  # all but whitespace, comments, punctuation
    theirs, ours = Recorder(), Recorder()
    module.visit(theirs)
    assert transform_module(module, ours) is module  # nothing changed: the same tree
    assert [e for e in theirs.events if e[1] in entered] == ours.events
    assert len(ours.events) == 2 * len(entered)


class Rename(cst.CSTTransformer):
    def leave_Name(self, original_node, updated_node):
        return updated_node.with_changes(value="renamed") if updated_node.value == "x" else updated_node


class DropPass(cst.CSTTransformer):
    def leave_SimpleStatementLine(self, original_node, updated_node):
        if any(isinstance(s, cst.Pass) for s in updated_node.body):
            return cst.RemoveFromParent()
        if any(isinstance(s, cst.Del) for s in updated_node.body):  # one statement becomes two
            return cst.FlattenSentinel([updated_node, updated_node])
        return updated_node


class DropOptional(cst.CSTTransformer):
    """Removal of a one-node field: an optional one becomes None, a
    ``MaybeSentinel`` one its default."""

    def leave_Annotation(self, original_node, updated_node):
        return cst.RemoveFromParent()

    def leave_ParamStar(self, original_node, updated_node):
        return cst.RemoveFromParent()


@pytest.mark.parametrize("transformer,source", [
    (Rename, SAMPLE), (DropPass, SAMPLE),
    (DropOptional, "def g(a: int, *, b: int = 1) -> int:\n    return a\n"),
])
def test_same_output_as_libcst(transformer, source):
    module = cst.parse_module(source)
    expected = module.visit(transformer()).code
    got = transform_module(module, transformer()).code
    assert got == expected
    assert got != module.code  # the transform did something


def test_unchanged_subtrees_are_shared():
    module = cst.parse_module("def f():\n    return x\n\ndef g():\n    return y\n")
    new = transform_module(module, Rename())
    assert new.code == "def f():\n    return renamed\n\ndef g():\n    return y\n"
    assert new.body[1] is module.body[1]  # g: untouched, not copied
    assert new.body[0] is not module.body[0]


def test_a_removed_required_field_is_an_error():
    class Bad(cst.CSTTransformer):
        def leave_Return(self, original_node, updated_node):
            return updated_node

        def leave_Name(self, original_node, updated_node):
            return cst.RemoveFromParent()

    module = cst.parse_module("x.y = 1\n")
    with pytest.raises(Exception):
        module.visit(Bad())
    with pytest.raises(TypeError, match="Attribute.value"):
        transform(module, Bad())
