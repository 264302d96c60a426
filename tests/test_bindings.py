"""codemods.analysis.bindings against LibCST's ScopeProvider: the same
binding nodes for every name, on real modules and on scoping corner cases."""

import random
import sysconfig
from pathlib import Path
from typing import Tuple

import libcst as cst
import pytest
from libcst.metadata import Assignment, MetadataWrapper, QualifiedNameProvider, ScopeProvider

from codemods.analysis.bindings import binding_nodes, import_qualnames
from codemods.syntax.tree import TreeCache, dotted, walk

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


# where each part of a scope's node is read: decorators and parameter
# defaults outside it, a comprehension's first iterable outside, its later
# iterables and conditions inside
PLACES = '''
deco = print
@(d := deco)
def f(a=(t := 1), cb=lambda v: v * t):
    return a, cb, d, t
data = [[1]]
flat = [a for xs in data for a in xs if (hit := a)]
sums = {k: [k + j for j in data[0]] for k in (lambda m=data: m[0])()}
@(cd := deco)
class K:
    size = (n := 4)
    def m(self, q=size):
        return q, n, cd, m, flat, sums
'''


def test_scoping_corner_cases():
    assert _compare(CORNERS.encode()) > 40


def test_each_part_of_a_scope_is_read_where_python_reads_it():
    assert _compare(PLACES.encode()) > 30


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


# -- import_qualnames: QualifiedNameProvider's answer where imports are rebound

REBOUND = '''
import torch
import torch.nn.functional as F
try:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
except ImportError:
    FSDP = None

def shape_of(x):
    B, C, F, H, W = x.shape
    return F * 2, torch.cat([x]), FSDP(x)

def resize(x):
    return F.interpolate(x), F.pad(x, (1, 1))

def writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
        made = SummaryWriter()
    except ImportError:
        from tensorboardX import SummaryWriter
        made = SummaryWriter()
    return made, SummaryWriter

def late():
    first = device("cpu")
    from torch import device
    return first, device("cpu")

class Net:
    F = "class attribute"
    act = F
    def forward(self, x):
        return F.relu(x), [F.gelu(y) for y in x], (lambda z: F.silu(z))(x)
'''


def _compare_qualnames(source: bytes) -> Tuple[int, int]:
    """(nodes answered, nodes declined); every answer equals the provider's."""
    module = cst.parse_module(source)
    provided = MetadataWrapper(module, unsafe_skip_copy=True).resolve(QualifiedNameProvider)
    tree = TreeCache(module, b"")
    answered = declined = 0
    for n in walk(module):
        if not isinstance(n, (cst.Name, cst.Attribute)):
            continue
        parent = tree.parents.get(id(n))
        if isinstance(parent, cst.Attribute) and parent.attr is n:
            continue  # an attribute's own name: nothing asks for it
        if isinstance(parent, (cst.Arg, cst.Param, cst.FunctionDef, cst.ClassDef)) and getattr(
                parent, "keyword" if isinstance(parent, cst.Arg) else "name") is n:
            continue  # a keyword, a parameter's or a definition's own name
        if _in_import(tree, n):
            continue
        mine = import_qualnames(tree, n)
        if mine is None:
            declined += 1
            continue
        theirs = provided.get(n, ())
        theirs = theirs() if callable(theirs) else theirs
        assert mine == {q.name for q in theirs}, (dotted(n), mine)
        answered += 1
    return answered, declined


def _in_import(tree: TreeCache, node: cst.CSTNode) -> bool:
    while node is not None and not isinstance(node, (cst.Import, cst.ImportFrom)):
        node = tree.parents.get(id(node))
    return node is not None


def test_import_qualnames_corner_cases():
    answered, declined = _compare_qualnames(REBOUND.encode())
    # declined: the targets themselves, names in comprehensions and lambdas, builtins
    assert answered >= 25 and declined <= 25, (answered, declined)
    module = cst.parse_module(REBOUND)
    tree = TreeCache(module, b"")
    calls = {dotted(c.func): c.func for c in walk(module) if isinstance(c, cst.Call)}
    assert import_qualnames(tree, calls["F.interpolate"]) == {"torch.nn.functional.interpolate"}
    assert import_qualnames(tree, calls["FSDP"]) == {"torch.distributed.fsdp.FullyShardedDataParallel", "FSDP"}
    assert import_qualnames(tree, calls["F.relu"]) == {"torch.nn.functional.relu"}  # past the class's own F
    writers = [import_qualnames(tree, c.func) for c in walk(module)
               if isinstance(c, cst.Call) and dotted(c.func) == "SummaryWriter"]
    # each call sees the import before it in its own block, as LibCST counts
    assert sorted(map(sorted, writers)) == [["tensorboardX.SummaryWriter", "torch.utils.tensorboard.SummaryWriter"],
                                            ["torch.utils.tensorboard.SummaryWriter"]]


@pytest.mark.parametrize("name", ["diffusers/training_utils.py", "diffusers/models/attention_dispatch.py",
                                  "transformers/integrations/integration_utils.py",
                                  "transformers/models/blip/modeling_blip_text.py"])
def test_import_qualnames_on_real_modules(name):
    path = SITE / name
    if not path.exists():
        pytest.skip(f"{name} is not installed")
    answered, _ = _compare_qualnames(path.read_bytes())
    assert answered > 0
