"""The engine's shortcuts must not change results: import insertion on the
module head only, import-table name resolution, and pruned passes."""

from pathlib import Path

import libcst as cst
import pytest

from codemods.base import TreeCache
from tests.conftest import convert_text

ROOT = Path(__file__).resolve().parent.parent

# (input, expected) pairs for where the new import goes.
IMPORT_PLACEMENT = [
    # after the leading import block
    (
        "import torch\nimport os\n\nx = torch.zeros(3).cuda()\n",
        "import torch\nimport os\nimport torch_xla\n\nx = torch.zeros(3).to(torch_xla.device())\n",
    ),
    # after the docstring and __future__ import
    (
        '"""Doc."""\nfrom __future__ import annotations\nimport torch\n\nx = torch.ones(2).cuda()\n',
        '"""Doc."""\nfrom __future__ import annotations\nimport torch\nimport torch_xla\n\n'
        "x = torch.ones(2).to(torch_xla.device())\n",
    ),
    # code before the first import: the new import goes first (LibCST adds
    # the blank line that separates an import block from code)
    (
        "x = 1\nimport torch\ny = torch.ones(2).cuda()\n",
        "import torch_xla\n\nx = 1\nimport torch\ny = torch.ones(2).to(torch_xla.device())\n",
    ),
    # the rewritten line is far below the head; everything in between is kept
    (
        "import torch\n\n\ndef f():\n    return 1\n\n\nclass A:\n    pass\n\n\nz = torch.ones(1).cuda()\n# end\n",
        "import torch\nimport torch_xla\n\n\ndef f():\n    return 1\n\n\nclass A:\n    pass\n\n\n"
        "z = torch.ones(1).to(torch_xla.device())\n# end\n",
    ),
]


@pytest.mark.parametrize("before,after", IMPORT_PLACEMENT)
def test_import_placement(before, after):
    out, _ = convert_text(before)
    assert out == after
    again, _ = convert_text(out)
    assert again == out


def test_import_not_duplicated_when_present():
    src = "import torch\nimport torch_xla\n\nx = torch.zeros(3).cuda()\n"
    out, _ = convert_text(src)
    assert out.count("import torch_xla\n") == 1


def _table(src):
    return TreeCache(cst.parse_module(src))


def test_import_table_resolves_aliases():
    t = _table("import torch as T\nfrom torch import cuda\nfrom torch.utils.data import DataLoader as DL\n")
    attr = cst.parse_expression("T.cuda.is_available")
    assert t.import_qualnames(attr) == {"torch.cuda.is_available"}
    assert t.import_qualnames(cst.parse_expression("cuda.is_available")) == {"torch.cuda.is_available"}
    assert t.import_qualnames(cst.parse_expression("DL")) == {"torch.utils.data.DataLoader"}
    assert t.import_qualnames(cst.parse_expression("model.cuda")) == set()


def test_import_table_defers_to_scope_analysis_when_rebound():
    t = _table("import torch\n\ndef f(torch):\n    return torch.device('cuda')\n")
    assert t.import_qualnames(cst.parse_expression("torch.device")) is None  # unsure: ask LibCST
    other = _table("import numpy as np\nnp = None\n")
    # a package no rule looks at needs no scope analysis even when rebound
    assert other.import_qualnames(cst.parse_expression("np.zeros")) == {"numpy.zeros"}


def test_shadowed_torch_is_not_a_torch_call():
    # `torch` here is a parameter, not the module: LibCST's scope analysis
    # (used because the name is rebound) says torch.device is not torch's.
    src = "import torch\n\n\ndef f(torch):\n    return torch.device('cuda')\n"
    _, findings = convert_text(src, select=["XLA102"])
    assert not [f for f in findings if f.fix and f.line == 5 and "torch.device" in f.message]
    plain = "import torch\n\n\ndef f():\n    return torch.device('cuda')\n"
    out, _ = convert_text(plain, select=["XLA102"])
    assert "torch_xla.device()" in out


def test_pruned_pass_equals_whole_pass():
    """A large file where only one statement matters converts exactly as the
    same statement alone does (the rest is skipped, not lost)."""
    filler = "".join(f"def helper_{i}(a, b):\n    return [a + b for _ in range({i})]\n\n\n" for i in range(200))
    src = "import torch\n\n\n" + filler + "x = torch.zeros(3).cuda()\n"
    out, findings = convert_text(src)
    assert out == src.replace("import torch\n", "import torch\nimport torch_xla\n", 1).replace(
        ".cuda()", ".to(torch_xla.device())"
    )
    assert [f.line for f in findings] == [src.count("\n")]


# Import removal on the import block alone must equal LibCST's run on the whole module.
REMOVALS = [
    # unused after the rewrite: removed (on the head alone)
    ("from tqdm import tqdm\nimport torch\n\n\ndef f(x):\n    return torch.relu(x)\n", True),
    ('"""Doc."""\nimport os\nfrom tqdm.auto import tqdm\n\nx = os.sep\n', True),
    ("from tqdm import tqdm\n", True),
    # still used: kept
    ("from tqdm import tqdm\n\nfor i in tqdm(range(3)):\n    pass\n", False),
    # named in __all__ or in a string annotation: kept (LibCST reads those strings)
    ('from tqdm import tqdm\n\n__all__ = ["tqdm"]\n', False),
    ('from tqdm import tqdm\n\n\ndef f(bar: "tqdm") -> None:\n    pass\n', False),
    # imported inside a function: the whole module decides
    ("import torch\n\n\ndef f():\n    from tqdm import tqdm\n    return 1\n", False),
]


def _ours_and_libcsts(source, requests, adding):
    """(our import change of ``source``, LibCST's visitor on the whole module)."""
    from libcst.codemod import Codemod, CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

    from codemods.syntax import imports
    from codemods.base import Context

    ctx, ref = Context(scratch={}), CodemodContext()
    for r in requests:
        (imports.need if adding else imports.drop)(ctx, *r)
        (AddImportsVisitor.add_needed_import if adding else RemoveImportsVisitor.remove_unused_import)(ref, *r)
    got, _ = imports.apply(ctx, cst.parse_module(source))
    visitor = (AddImportsVisitor if adding else RemoveImportsVisitor)(ref)
    want = Codemod.transform_module(visitor, cst.parse_module(source))
    # (an import added for its effect alone is marked, whoever inserted it: see imports._for_its_effect)
    return got, imports._for_its_effect(list(requests), want) if adding else want


@pytest.mark.parametrize("source, on_head", REMOVALS)
def test_import_removal_on_the_head_equals_the_whole_module(source, on_head):
    from codemods.syntax import imports

    requests = [("tqdm", "tqdm", None), ("tqdm.auto", "tqdm", None), ("tqdm", None, None)]
    got, want = _ours_and_libcsts(source, requests, adding=False)
    assert got.code == want.code
    assert bool(imports._removable(requests, cst.parse_module(source))) == on_head


def test_an_import_whose_name_code_still_reads_is_kept():
    """A name the code reads keeps its import, without a scope analysis --
    even where only a local of that name is read (LibCST's visitor would
    remove it there: an unused import left in place is harmless)."""
    from codemods.syntax import imports
    from codemods.base import Context

    source = "from tqdm import tqdm\n\n\ndef f(tqdm):\n    return tqdm\n"
    ctx = Context(scratch={})
    imports.drop(ctx, "tqdm", "tqdm")
    got, changed = imports.apply(ctx, cst.parse_module(source))
    assert (got.code, changed) == (source, False)


# Import insertion on the head (with a stand-in for a large statement after
# it) must equal LibCST's AddImportsVisitor on the whole module.
ADDITIONS = [
    "import os\n\n\nclass Big:\n    def f(self):\n        return os.sep\n",
    "import os\nclass Big:\n    pass\n",  # no blank line: the visitor adds one
    "import os\n# a comment about Big\nclass Big:\n    pass\n",
    '"""Doc."""\n\n\ndef f():\n    import torch_xla\n    return 1\n',
    "import os\ntry:\n    from torch_xla import runtime\nexcept ImportError:\n    pass\n",  # an import in it: no stand-in
    "from torch_xla import runtime\nif True:\n    x = 1\n",
    "@decorator\ndef f():\n    pass\n",
    "",
    # a long head: imports of other modules stand in as small ones
    '"""Doc."""\nfrom __future__ import annotations\n\nimport os, sys\nimport torch\n# about utils\n'
    "from ...utils import (\n    a,\n    b,\n)\nfrom . import c\nimport numpy as np\n\n\nclass Big:\n    x = os.sep\n",
    # imports of the package asked for are shown as they are
    "import torch\nimport torch_xla\nfrom torch_xla import runtime as xr\nimport torch_xla.core.xla_model as xm\n"
    "from ..x import y\nlogger = get_logger()\n",
    "from torch_xla import other\nfrom os import path\nimport a; import b\nimport c\n\nx = 1\n",
    "import os\nimport sys  # trailing\n\n\n\ndef main():\n    pass\n",
]


@pytest.mark.parametrize("source", ADDITIONS)
def test_import_insertion_on_the_head_equals_the_whole_module(source):
    requests = [("torch_xla", None, None), ("torch_xla", "runtime", "xr"), ("torch_xla.core.xla_model", None, "xm")]
    got, want = _ours_and_libcsts(source, requests, adding=True)
    assert got.code == want.code
    assert "import torch_xla" in got.code


@pytest.mark.parametrize("literal", [
    "''", "''''''", "'''a'''", '"\'"', '"""a"b"""', "'cuda'", '"cuda:0"', "'a\\nb'", "r'a\\n'", "b'x'", "u'x'",
    "'''\r\nx'''", "'\\x63uda'", '"""\n  multi\n  line\n"""',
])
def test_string_value_reads_a_literal_as_python_does(literal):
    """string_value reads unprefixed, escape-free literals as written (no
    literal_eval): the value must still be Python's."""
    from codemods.syntax.tree import string_value

    node = cst.SimpleString(literal)
    value = node.evaluated_value
    assert string_value(node) == (value if isinstance(value, str) else None)


def test_find_all_from_the_index_equals_a_walk():
    """find_all below a node of an indexed tree answers from the type index
    (a subtree is one run of walk order): the same nodes, in the same order,
    as walking the subtree, with and without stop types."""
    import importlib.util
    import random
    from pathlib import Path

    from codemods.syntax.tree import find_all, node_types, walk

    sources = [(Path(__file__).parent.parent / "fixtures" / "train_mlp" / "input.py").read_text()]
    spec = importlib.util.find_spec("diffusers")
    if spec is not None and spec.origin:
        sources.append((Path(spec.origin).parent / "pipelines/stable_diffusion/pipeline_stable_diffusion.py").read_text())
    kinds = [cst.Call, cst.Name, (cst.For, cst.While), (cst.Call, cst.Attribute), cst.FunctionDef]
    stops = [(), (cst.FunctionDef, cst.ClassDef), (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda),
             (cst.Call,)]
    rng = random.Random(7)
    for source in sources:
        module = cst.parse_module(source)
        tree = TreeCache(module)
        tree.parents  # builds the index
        for _ in range(300):
            node, kind, stop = rng.choice(tree._seq), rng.choice(kinds), rng.choice(stops)
            expected = [n for n in walk(node, stop) if type(n) in node_types(kind)]
            got = find_all(node, kind, stop)
            assert [id(n) for n in got] == [id(n) for n in expected], (type(node).__name__, kind, stop)


def test_a_tree_sharing_a_node_is_found_while_indexing():
    module = cst.parse_module("a = f(1)\nb = g(2)\n")
    assert TreeCache(module).nodes_unique()
    shared = cst.Name("x")
    twice = module.with_changes(body=[s.with_changes(body=[s.body[0].with_changes(value=shared)])
                                      for s in module.body])
    assert twice.code == "a = x\nb = x\n"
    assert not TreeCache(twice).nodes_unique()
    assert TreeCache(twice.deep_clone()).nodes_unique()


def test_a_converted_file_leaves_no_tree_for_the_cycle_collector():
    """The analyses a TreeCache memoises point back at it: the engine empties
    them at the end, so that trees are freed by reference counting as soon as
    a file is done (the collector's time was 10% of a corpus run)."""
    import gc

    from xlaport.engine import Settings, transform

    source = (ROOT / "fixtures" / "diffusers_sd" / "input.py").read_bytes()
    gc.collect()
    gc.disable()
    try:
        before = sum(isinstance(o, cst.Module) for o in gc.get_objects())
        out = transform(source, Settings(), "input.py")
        after = sum(isinstance(o, cst.Module) for o in gc.get_objects())
    finally:
        gc.enable()
    assert out.findings and out.code != source  # the analyses did run
    assert after == before


@pytest.mark.parametrize("path", sorted(ROOT.glob("fixtures/*/input.py")), ids=lambda p: p.parent.name)
def test_no_syntax_tree_is_left_in_a_reference_cycle(path):
    """Nested functions that call each other, or a class made inside a
    function, form reference cycles; one that reaches a tree keeps it alive
    until the cycle collector runs, and makes every collection slower (five
    times the collector's time on diffusers).  After a file is done, the
    collector finds no module among what is unreachable."""
    import gc

    from xlaport.engine import Settings, transform

    source = path.read_bytes()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        transform(source, Settings(), "input.py")
        gc.collect()
        left = [o for o in gc.garbage if type(o) is cst.Module]
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
    assert left == []


def _golden_inputs():
    return sorted(ROOT.glob("fixtures/*/input.py")) + sorted(ROOT.glob("fixtures/projects/*/*.py"))


@pytest.mark.parametrize("path", _golden_inputs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_left_for_later_give_the_same_output_and_findings(path):
    """`lint` leaves the imports pass out (engine.transform(imports_later=True));
    finish_imports then gives the very bytes a full transform gives, and the
    findings do not depend on it."""
    from xlaport.engine import Settings, finish_imports, transform

    source = path.read_bytes()
    full = transform(source, Settings(), str(path))
    later = transform(source, Settings(), str(path), imports_later=True)
    assert [(f.code, f.line, f.col, f.message) for f in later.findings] == \
        [(f.code, f.line, f.col, f.message) for f in full.findings]
    assert full.imports is None
    done = finish_imports(later.code, later.imports) if later.imports is not None else later.code
    assert done == full.code


def test_some_golden_input_leaves_imports_for_later():
    # (the test above compares something: most fixtures ask for torch_xla imports)
    from xlaport.engine import Settings, transform

    left = [p for p in _golden_inputs() if transform(p.read_bytes(), Settings(), str(p), imports_later=True).imports]
    assert len(left) > 10
