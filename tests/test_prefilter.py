"""The ast prefilter (codemods.analysis.prefilter) and the light positions
(codemods.syntax.positions): shortcuts that must not change a single result."""

import random
import sysconfig
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from codemods import registry
from codemods.analysis.loops import ModuleFacts
from codemods.analysis.prefilter import (IMPORTS_TORCH, LOADER_LOOP, OUTPUT_IN_LOOP, STEP_LOOP, STEP_METHOD,
                                         file_facts, holds)
from codemods.syntax.positions import start_positions, statement_starts
from codemods.syntax.tree import TreeCache, walk
from xlaport.engine import Settings, transform

SITE = Path(sysconfig.get_paths()["purelib"])
ROOT = Path(__file__).resolve().parent.parent


def _real_files():
    """A fixed sample of real modules: schedulers and pipelines (step loops),
    training utilities, models (layer loops only), and the fixtures."""
    picks = []
    for pattern, n in (("diffusers/schedulers/scheduling_*.py", 12), ("diffusers/pipelines/*/pipeline_*.py", 12),
                       ("diffusers/models/*.py", 8), ("diffusers/training_utils.py", 1),
                       ("transformers/models/bert/*.py", 6), ("transformers/generation/*.py", 4)):
        found = sorted(SITE.glob(pattern))
        picks += random.Random(pattern).sample(found, min(n, len(found)))
    picks += sorted((ROOT / "fixtures").glob("*/input.py"))
    return [p for p in picks if p.stat().st_size < 120_000]


REAL = _real_files()


@pytest.mark.skipif(not REAL, reason="diffusers/transformers not installed")
def test_findings_and_rewrites_are_the_same_with_and_without_the_prefilter():
    skipped = 0
    for path in REAL:
        data = path.read_bytes()
        fast = transform(data, Settings(), str(path))
        slow = transform(data, Settings(prefilter=False), str(path))
        assert fast.code == slow.code, path
        assert [f.as_dict() for f in fast.findings] == [f.as_dict() for f in slow.findings], path
        assert fast.cuda == slow.cuda, path
        codes = Settings().selected_codes()
        skipped += len(registry.applicable(data, codes, prefilter=False)) - len(registry.applicable(data, codes))
    assert skipped > len(REAL)  # the filter did rule codemods out on these files


@pytest.mark.parametrize("source, count", [
    # the only CUDA references are calls the runtime rule knows, "cuda" only in a comment (accelerate's test_metrics.py)
    (b"import torch\n\n\ndef evaluate(model, loader):\n    with torch.inference_mode():  # was on cuda\n"
     b"        for batch in loader:\n            print(model(batch))\n", 1),
    # "fused" only inside a name, an int device: no word of CUDA in the code, nothing counted either way
    (b"import torch\n\nfused_proj = torch.nn.Linear(2, 2).to(0)\n", 0),
])
def test_the_cuda_count_is_the_same_with_and_without_the_prefilter(source, count):
    fast = transform(source, Settings(), "metrics.py")
    slow = transform(source, Settings(prefilter=False), "metrics.py")
    assert slow.cuda[0] == count and fast.cuda == slow.cuda


@pytest.mark.skipif(not REAL, reason="diffusers/transformers not installed")
def test_prefilter_facts_cover_what_the_libcst_analysis_finds():
    for path in REAL:
        data = path.read_bytes()
        facts = file_facts(data)
        assert facts is not None
        found = ModuleFacts(TreeCache(cst.parse_module(data), data))
        if found.step_loops:
            assert STEP_LOOP in facts, path
        if found.loader_loops:
            assert LOADER_LOOP in facts, path
        if found.step_methods:
            assert STEP_METHOD in facts, path


@pytest.mark.parametrize("source, expected", [
    ("for x, y in loader:\n    loss = model(x)\n    loss.backward()\n", {STEP_LOOP, LOADER_LOOP}),
    ("def train_one(b):\n    opt.step()\nfor b in batches:\n    train_one(b)\n", {STEP_LOOP}),
    ("while True:\n    logits = self(idx)\n    idx = torch.cat([idx, logits.argmax(-1)])\n", {STEP_LOOP}),
    # a model called in a loop that carries nothing from one iteration to the next (tiled decoding)
    ("while True:\n    logits = self(idx)\n", set()),
    ("for i in range(n):\n    tile = self.encoder(x[i])\n    tile = self.quant(tile)\n    rows.append(tile)\n", set()),
    # written only under a branch: what is read may come from the last iteration
    ("for t in ts:\n    if t:\n        h = 0\n    h = model(h)\n", {STEP_LOOP}),
    ("for t in ts:\n    with ctx:\n        h = 0\n    h = model(h)\n", set()),
    # ... but written on every path (both branches, a `finally`, earlier in the same branch): this iteration's
    ("for t in ts:\n    if t:\n        h = 0\n    else:\n        h = 1\n    h = model(h)\n", set()),
    ("for t in ts:\n    if t:\n        h = 0\n    elif t > 1:\n        h = 1\n    h = model(h)\n", {STEP_LOOP}),
    ("for t in ts:\n    try:\n        pass\n    finally:\n        h = 0\n    h = model(h)\n", set()),
    ("for t in ts:\n    if t:\n        h = 0\n        h = model(h)\n", set()),
    # a name that fetches or builds a model does not run one
    ("for k in keys:\n    out = get_model_file(out)\n", set()),
    ("for k in keys:\n    out = UNetModel(out)\n", set()),
    ("class Sched:\n    def step(self, out, t, x):\n        return x\n", {STEP_METHOD}),
    ("class Net:\n    def forward(self, x):\n        for layer in self.layers:\n            x = layer(x)\n"
     "        return x\n", set()),
    ("for name in names:\n    print(name.upper())\n", set()),
    ("from torch.utils.data import DataLoader\nfor batch in make_batches():\n    pass\n", {LOADER_LOOP}),
    # state carried through the model's output, over two statements
    ("for t in ts:\n    eps = unet(x, t)\n    x = x - eps\n", {STEP_LOOP}),
    # a model made each iteration while a path is carried: the path does not come from the model
    ("while isdir(p):\n    m = Adapter.from_pretrained(p)\n    ms.append(m)\n    p = base + str(len(ms))\n", set()),
    # `obj.m(...)` on something other than self runs a model only by its name
    ("def load_model(p):\n    return model(p)\nfor k in keys:\n    out = d.load_model(k)\n    n = n + 1\n", set()),
])
def test_facts(source, expected):
    loop_facts = {STEP_LOOP, LOADER_LOOP, STEP_METHOD}
    assert {f for f in file_facts(source.encode()) if f in loop_facts} == expected


def test_output_in_loop_is_a_print_or_log_inside_a_loop():
    assert OUTPUT_IN_LOOP in file_facts(b"for b in loader:\n    logger.info(b)\n")
    assert OUTPUT_IN_LOOP in file_facts(b"while True:\n    if x:\n        print(x)\n")
    assert OUTPUT_IN_LOOP not in file_facts(b"print(1)\nfor b in loader:\n    step(b)\n")


@pytest.mark.parametrize("source, words", [
    ('"""Example:\n    pipe.to("cuda")\n"""\nimport os\n', set()),  # a usage example in a docstring
    ('EXAMPLE = """\n    >>> pipe.to("cuda")\n"""\n', set()),  # ... or in a module-level string
    ('raise ValueError(f"needs cuda, got {d}")\n', set()),  # a message is prose
    ('x = b"cuda"\n', {"cuda"}),
    ("import os  # runs on cuda too\n", set()),
    ('x.to("cuda:0")\n', {"cuda"}),
    ('def f():\n    "cuda"\n', {"cuda"}),  # a lone device string is no prose
    ("torch.backends.cudnn.benchmark = True\n", {"cudnn"}),
    ('cfg = {"pin_memory": True}\nmp.spawn(f)\n', {"pin_memory", "spawn"}),
    ('dev = f"cuda:{rank}"\n', {"cuda"}),
])
def test_code_words_are_the_trigger_words_outside_comments_and_prose(source, words):
    assert {f[5:] for f in file_facts(source.encode()) if f.startswith("code~")} == words


def test_imports_torch_and_needs_that_name_two_facts():
    facts = file_facts(b"import re\npattern = re.compile('x')\n")
    assert IMPORTS_TORCH not in facts and not holds("name:compile&imports:torch", facts)
    facts = file_facts(b"from torch import compile\nf = compile(f)\n")
    assert IMPORTS_TORCH in facts and holds("name:compile&imports:torch", facts)
    assert IMPORTS_TORCH not in file_facts(b"from .torch import load\n")
    # torch:X -- X can resolve to torch.[...].X: imported from torch, or read off a name bound to torch
    facts = file_facts(b"import json\nimport torch.distributed as dist\nfrom torch.nn.parallel import "
                       b"DistributedDataParallel as DDP\nx = json.load(f)\ndist.init_process_group()\n"
                       b"torch.save(x)\n")
    assert {f for f in facts if f.startswith("torch:")} == {
        "torch:dist", "torch:init_process_group", "torch:DistributedDataParallel", "torch:DDP"}
    # a file that says "cuda" only in an example is not parsed for the CUDA rules
    doc = b'"""Usage:\n\n    model.to("cuda")\n"""\nimport torch\n\n\ndef f(x):\n    return x\n'
    assert not [c.name for c in registry.applicable(doc, Settings().selected_codes())]


def test_names_are_the_identifiers_libcst_would_show():
    facts = file_facts(b"import torch.distributed as dist\nfrom a.b import c as d\n"
                       b"def f(p, *, kw=1):\n    global g\n    return dist.init_process_group(backend=p)\n"
                       b"# tqdm in a comment\ns = 'tqdm in a string'\n")
    names = {f[5:] for f in facts if f.startswith("name:")}
    assert {"torch", "distributed", "dist", "a", "b", "c", "d", "f", "p", "kw", "g", "init_process_group",
            "backend", "s"} == names
    assert holds("name~distrib", facts) and not holds("name:tqdm", facts)


def test_unreadable_source_is_not_filtered():
    assert file_facts(b"print 'python 2'\nfor x in loader: pass\n") is None
    assert [c.name for c in registry.applicable(b"print 'python 2'\n", Settings().selected_codes())] == [
        c.name for c in registry.applicable(b"print 'python 2'\n", Settings().selected_codes(), prefilter=False)]


@pytest.mark.skipif(not REAL, reason="diffusers/transformers not installed")
@pytest.mark.parametrize("seed", range(3))
def test_light_positions_equal_libcst_positions(seed):
    rng = random.Random(seed)
    for path in rng.sample(REAL, 4):
        module = cst.parse_module(path.read_bytes())
        nodes = list(walk(module))
        full = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        pick = rng.sample(nodes, min(300, len(nodes)))
        light = start_positions(module, pick)
        assert {id(n): (full[n].start.line, full[n].start.column + 1, full[n].end.line, full[n].end.column + 1)
                for n in pick} == light, path


def test_tree_cache_places_a_block_at_its_first_statement():
    module = cst.parse_module(b"x = 1\nif x:\n    y = 2\n")
    cache = TreeCache(module, b"")
    block = module.body[1].body
    assert cache.start_positions([block]) == {id(block): (3, 5, 3, 10)}


TRICKY = '''#!/usr/bin/env python
# a header comment

"""Docstring."""
import os; import sys


# comments before a decorated function
@decorator  # on the decorator line
# between decorators
@other(
    arg,
)
async def f(x):
    return (x
            + 1)
    # a comment after the last statement of the block

class C(  # open
    Base,
):
    x = 1


if x:
    pass
elif y:  # trailing
    y = [
        1,
    ]
else:
    z = \\
        2

for i in range(3):  # a loop: a statement of its body is the anchor
    # a leading comment
    w = call(i,
             2)
    while w:
        with ctx() as c:
            v = [
                c]
else:
    pass
'''


@pytest.mark.parametrize("seed", range(2))
def test_statement_anchored_positions_equal_libcst_positions(seed):
    """With the module's text, only the statements holding the asked nodes
    are generated, each from the line ``ast`` says it starts on."""
    rng = random.Random(seed)
    sources = [TRICKY] + [p.read_text() for p in rng.sample(REAL, min(4, len(REAL)))]
    for text in sources:
        module = cst.parse_module(text)
        nodes = [n for n in walk(module) if n is not module]
        full = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        pick = rng.sample(nodes, min(300, len(nodes)))
        assert statement_starts(module, text) is not None  # the anchored path, not the whole-module one
        anchored = TreeCache(module, b"", text).start_positions(pick)
        assert {id(n): (full[n].start.line, full[n].start.column + 1, full[n].end.line, full[n].end.column + 1)
                for n in pick if n in full} == anchored


STATEMENTS = '''# -*- coding: utf-8 -*-
x = "é"; y = 2
if x: z = "ü"
for i in range(3):
    s = "naïve"  # ü
    if i:
        pass
    elif s:
        t = 1
    else:
        t = "ß" + \\
            "é"
else:
    u = 1
while x:
    with open(f) as h, open(g):
        break
try:
    v = 1
except ValueError as e:
    v = "è"
except Exception:
    pass
else:
    w = 1
finally:
    w = 2
match x:
    case 1:
        y = 3
def f():
    x = 1;
    return "ö"
'''


@pytest.mark.parametrize("seed", range(2))
def test_statement_positions_from_ast_equal_libcst_positions(seed):
    """Statements are placed from Python's ast, not generated: at every
    depth, with non-ASCII text before a statement's end (ast counts bytes),
    after an elif, a one-line suite and a semicolon (left to the generator)."""
    import ast

    from codemods.syntax.positions import statement_positions

    rng = random.Random(seed)
    sources = [STATEMENTS, TRICKY] + [p.read_text() for p in rng.sample(REAL, min(4, len(REAL)))]
    for text in sources:
        module = cst.parse_module(text)
        full = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        known = statement_positions(module, text, ast.parse(text))
        statements = [n for n in walk(module) if isinstance(n, (cst.BaseCompoundStatement, cst.SimpleStatementLine))]
        assert len(known) > len(statements) // 2
        by_id = {id(n): n for n in statements}
        assert set(known) <= set(by_id)
        assert {i: known[i] for i in known} == {
            i: (full[by_id[i]].start.line, full[by_id[i]].start.column + 1, full[by_id[i]].end.line,
                full[by_id[i]].end.column + 1) for i in known}
    # the statements after a semicolon and in a one-line suite are not read from ast; those around them are
    module = cst.parse_module(STATEMENTS)
    known = statement_positions(module, STATEMENTS, ast.parse(STATEMENTS))
    assert id(module.body[0]) in known and id(module.body[1]) in known
    assert id(module.body[1].body) not in known



DETR = SITE / "transformers" / "models" / "detr" / "modeling_detr.py"


@pytest.mark.skipif(not DETR.exists(), reason="transformers not installed")
def test_a_model_file_gets_the_same_findings_with_and_without_the_prefilter():
    """A model's own layer loop is no step loop, so no loop over a device
    tensor counts there (DETR's backbone loops over its encoder's output
    list): the prefilter, which rules HostReads out of such a file, changes
    nothing."""
    data = DETR.read_bytes()
    facts = file_facts(data)
    assert STEP_LOOP not in facts and LOADER_LOOP not in facts and STEP_METHOD not in facts
    fast = transform(data, Settings(), str(DETR))
    slow = transform(data, Settings(prefilter=False), str(DETR))
    assert [f.as_dict() for f in fast.findings] == [f.as_dict() for f in slow.findings]
    assert not any(f.code == "XLA407" for f in slow.findings)


def test_a_fact_that_names_a_word_may_hold_only_where_the_bytes_hold_it():
    """``may_hold`` (a file an importer search need not parse) is derived
    from the facts: every fact of every fixture that names a word is allowed
    by its bytes, and a word missing from the bytes rules the fact out."""
    from codemods.analysis.prefilter import BEING_PORTED, may_hold

    checked = 0
    for path in sorted((ROOT / "fixtures").rglob("*.py")):
        data = path.read_bytes()
        facts = file_facts(data) or frozenset()
        for fact in facts:
            assert may_hold(fact, data), (path, fact)
            checked += 1
        for need in BEING_PORTED:
            assert not holds(need, facts) or may_hold(need, data), (path, need)
    assert checked > 1000
    assert not may_hold("code~cuda", b"x = 1  # runs on the GPU\n")
    assert not may_hold("torch:accelerator", b"import torch\n")
    assert not may_hold("name~Scaler", b"import torch\n") and may_hold("name~Scaler", b"s = GradScaler()\n")
    assert not may_hold(f"{STEP_LOOP}&code~cuda", b"for x in loader:\n    opt.step()\n")
    assert may_hold(STEP_LOOP, b"") and may_hold(IMPORTS_TORCH, b"")  # (no word to look for)


@pytest.mark.parametrize("source, expected", [
    # XLA161's try: a handler that catches IndexError, `name = <call>[...]` in its body (at any depth)
    ("try:\n    i = torch.squeeze(c.nonzero())[j]\nexcept IndexError:\n    i = 0\n", {"caught_index"}),
    ("try:\n    if k:\n        i = f(c)[0]\nexcept (KeyError, LookupError):\n    pass\n", {"caught_index"}),
    ("try:\n    i = f(c)[0]\nexcept:\n    pass\n", {"caught_index"}),
    ("try:\n    i = f(c)[0]\nexcept builtins.Exception:\n    pass\n", {"caught_index"}),
    ("try:\n    i = f(c)[0]\nexcept KeyError:\n    pass\n", set()),  # (does not catch it)
    ("try:\n    i = items[0]\nexcept IndexError:\n    pass\n", set()),  # (a name's subscript: no tensor op)
    ("try:\n    pass\nexcept IndexError:\n    i = f(c)[0]\n", set()),  # (in the handler)
    # XLA160's slice bound counted from the end by what is not a number
    ("y = x[-n:]\n", {"from_the_end"}),
    ("y = x[:, :-self.block]\n", {"from_the_end"}),
    ("y = x[-1:]\nz = x[:-2]\nw = x[-n]\n", set()),
])
def test_the_facts_of_two_rare_traps(source, expected):
    assert {f for f in file_facts(source.encode()) if f in ("caught_index", "from_the_end")} == expected
    # (each a superset of what the rule acts on: a file without it is not parsed for the rule)
    codemods = {c.name for c in registry.applicable(("import torch\nx = torch.ones(2).cuda()\n" + source).encode(),
                                                    ["XLA160", "XLA161"])}
    assert ("CaughtIndexErrors" in codemods) == ("caught_index" in expected)
    assert ("XlaLimits" in codemods) == ("from_the_end" in expected)
