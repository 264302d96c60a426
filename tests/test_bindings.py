"""codemods.analysis.bindings against LibCST's ScopeProvider: the same
binding nodes for every name, on real modules and on scoping corner cases."""

import random
import sysconfig
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import Assignment, MetadataWrapper, ScopeProvider

from codemods.analysis.bindings import binding_nodes
from codemods.tree import TreeCache, walk

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(sysconfig.get_paths()["purelib"])

CORNERS = '''
import os.path as osp, torch
from a import b as c
x = 1
def f(p, *args, k=x, **kw):
    global g
    g = p
    y = [x for x in args if x]
    z = (w := 3)
    def inner():
        nonlocal y
        y = 2
        return y, z, w
    with open(p) as (fh):
        pass
    try:
        pass
    except Exception as exc:
        pass
    for i, (j, *rest) in enumerate(args):
        loader = j
    return lambda q, r=loader: q + r + x
class C:
    attr = x
    def m(self):
        return attr, x, C
'''


def _compare(source: bytes) -> int:
    module = cst.parse_module(source)
    scopes = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    tree = TreeCache(module, b"")
    checked = 0
    for n in walk(module):
        scope = scopes.get(n) if isinstance(n, cst.Name) else None
        if scope is None:
            continue
        theirs = {id(a.node) for a in scope[n.value] if isinstance(a, Assignment)}
        assert {id(b) for b in binding_nodes(tree, n)} == theirs, n.value
        checked += 1
    return checked


def test_scoping_corner_cases():
    assert _compare(CORNERS.encode()) > 40


def _real():
    files = sorted((ROOT / "fixtures").glob("*/input.py"))
    for pattern, k in (("diffusers/pipelines/*/pipeline_*.py", 6), ("diffusers/schedulers/*.py", 4),
                       ("transformers/trainer*.py", 3), ("transformers/models/gpt2/*.py", 2)):
        found = sorted(SITE.glob(pattern))
        files += random.Random(pattern).sample(found, min(k, len(found)))
    return files


@pytest.mark.parametrize("path", _real(), ids=lambda p: p.name)
def test_same_bindings_as_scope_provider_on_real_modules(path):
    assert _compare(path.read_bytes()) > 0
