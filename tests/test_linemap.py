"""The line map that takes findings back to the user's lines (xlaport.linemap)."""

import difflib
import random

import pytest

from xlaport.linemap import line_map, match_lines


def _difflib_map(old, new):
    old_lines, new_lines = old.splitlines(), new.splitlines()
    table = {}
    sm = difflib.SequenceMatcher(None, new_lines, old_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        for k in range(i1, i2):
            table[k + 1] = j1 + (k - i1) + 1 if tag == "equal" else min(j1 + (k - i1), max(j2 - 1, j1)) + 1
    return lambda line: table.get(line, min(line, max(len(old_lines), 1)))


def _edit(lines, rng, edits):
    out = list(lines)
    for _ in range(edits):
        k = rng.randrange(len(out))
        kind = rng.choice("rid")
        if kind == "r":
            out[k] = out[k].replace("cuda", "xla") + "  # changed"
        elif kind == "i":
            out.insert(k, "    torch_xla.sync()")
        elif len(out) > 1:
            del out[k]
    return out


def _program(n, rng):
    lines = []
    for k in range(n // 5):
        lines += [f"def f{k}(x):", "    y = x.cuda()", "", "    return y", ""]
    return lines


@pytest.mark.parametrize("seed", range(20))
def test_pairs_are_equal_lines_in_order(seed):
    rng = random.Random(seed)
    old = _program(rng.randrange(5, 2000), rng)
    new = _edit(old, rng, rng.randrange(1, 200))
    pairs = match_lines(new, old)
    assert all(new[i] == old[j] for i, j in pairs)
    assert all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))


@pytest.mark.parametrize("seed", range(20))
def test_unchanged_unique_lines_map_to_themselves(seed):
    # (difflib itself sometimes maps such a line into a neighbouring replaced block)
    rng = random.Random(100 + seed)
    old = _program(rng.randrange(5, 600), rng)
    new = _edit(old, rng, rng.randrange(1, 40))
    ours = line_map("\n".join(old), "\n".join(new))
    once = {line for line in new if new.count(line) == 1 and old.count(line) == 1}
    for k, line in enumerate(new, 1):
        if line in once:
            assert old[ours(k) - 1] == line, (k, line)
        assert 1 <= ours(k) <= max(len(old), 1)


@pytest.mark.parametrize("seed", range(10))
def test_same_map_as_difflib_where_difflib_has_one_answer(seed):
    # a single edit: both must agree line for line
    rng = random.Random(200 + seed)
    old = _program(rng.randrange(5, 400), rng)
    new = _edit(old, rng, 1)
    ours = line_map("\n".join(old), "\n".join(new))
    theirs = _difflib_map("\n".join(old), "\n".join(new))
    assert [ours(k) for k in range(1, len(new) + 1)] == [theirs(k) for k in range(1, len(new) + 1)]


def test_inserted_line_maps_to_the_statement_it_follows_and_block_replacement_to_its_first_line():
    old = "a\nb\nc\nd\n"
    new = "a\nb\nX\nc\nd\n"
    back = line_map(old, new)
    assert [back(k) for k in range(1, 6)] == [1, 2, 3, 3, 4]
    old = "a\nb1\nb2\nb3\nc\n"
    new = "a\nB\nc\n"
    back = line_map(old, new)
    assert [back(k) for k in range(1, 4)] == [1, 2, 5]


def test_identical_blocks_with_no_unique_line_still_align():
    old = ["x = y.cuda()", "z = 1"] * 3000
    new = list(old)
    new[4000] = "x = y.to(dev)"
    new.insert(100, "torch_xla.sync()")
    back = line_map("\n".join(old), "\n".join(new))
    assert back(1) == 1
    assert back(102) == 101  # the line after the insertion
    assert back(4002) == 4001  # the changed line stays opposite its original
    assert back(len(new)) == len(old)


def test_a_dedented_block_maps_line_for_line():
    """A progress bar's `with` removed and its body dedented: each body line
    still maps to its own line, not to the `with` (issue 26: positions)."""
    old = "a = 1\nwith bar() as b:\n    for t in ts:\n        x = f(x)\n        b.update()\nprint(x)\n"
    new = "a = 1\nfor t in ts:\n    x = f(x)\nprint(x)\n"
    back = line_map(old, new)
    assert [back(n) for n in range(1, 5)] == [1, 3, 4, 6]


def test_a_dedented_line_that_equals_another_old_line_does_not_anchor_there():
    """After the dedent, a nested `else:` is, character for character, the
    loop-level `else:` of the old text (both at 12 spaces): matched with
    their indentation the two anchored the alignment and moved the body's
    findings by dozens of lines (diffusers' lumina pipeline: a tensor-valued
    `if` reported on `if do_classifier_free_guidance:`, 30 lines away)."""
    pad = [f"    v{k} = h(v{k - 1})" for k in range(1, 40)]  # a body too long for difflib's small gaps
    body = ["for i, t in enumerate(xs):", *pad, "    if flag:", "        if t > 0:", "            z = 1",
            "        else:", "            z = 2", "    else:", "        z = 3", *[p + "b" for p in pad],
            "    if z > t:", "        w = 1"]
    head = "def f(xs, flag):\n"
    old = head + "    with bar() as b:\n" + "".join(f"        {line}\n" for line in body) + "    return w\n"
    new = head + "".join(f"    {line}\n" for line in body) + "    return w\n"
    back = line_map(old, new)
    assert [back(2 + k) for k in range(len(body))] == [3 + k for k in range(len(body))]
    # and each moved line's columns move with it
    assert {back.indent_delta(2 + k) for k in range(len(body))} == {4}
    assert back.indent_delta(1) == 0


def test_a_finding_on_a_dedented_line_keeps_the_users_column():
    from codemods.rule import Finding

    old = "with bar() as b:\n    for t in ts:\n        if t.sum() > 0:\n            x = 1\n"
    new = "for t in ts:\n    if t.sum() > 0:\n        x = 1\n"
    f = Finding("XLA404", "tensor-valued condition", 2, 8, False, end_line=2, end_col=19)
    f.map_lines(line_map(old, new))
    assert (f.line, f.col, f.end_line, f.end_col) == (3, 12, 3, 23)
    assert old.splitlines()[f.line - 1][f.col - 1:f.end_col - 1] == "t.sum() > 0"


def test_a_span_ending_on_an_added_line_ends_where_the_old_text_before_it_ends():
    """A barrier appended to a loop's body is no line of the user's file: a
    span that ends on it (the loop, its `with` block) ends on the loop's own
    last line, not on the line after the loop."""
    old = "for t in ts:\n    x = f(x)  # step\n\nprint(x)\n"
    new = "for t in ts:\n    x = f(x)  # step\n    torch_xla.sync()\n\nprint(x)\n"
    back = line_map(old, new)
    assert back.end(3, 21) == (2, 21)  # the end of `    x = f(x)  # step`
    assert back.end(2, 13) == (2, 13)  # a line of the user's own: as it was
    assert back(3) == 3  # (a start on it still reads from the line after)


def test_a_lazy_line_map_is_made_on_first_use_and_maps_as_line_map_does():
    from xlaport.linemap import LazyLineMap

    old = "a = 1\nwith bar() as b:\n    x = 2\n    y = 3\nz = 4\n"
    new = "a = 1\nx = 2\ny = 3\nz = 4\n"
    lazy, eager = LazyLineMap(old, new), line_map(old, new)
    assert lazy._map is None  # nothing computed yet
    assert [lazy(n) for n in range(1, 6)] == [eager(n) for n in range(1, 6)]
    assert [lazy.indent_delta(n) for n in range(1, 6)] == [eager.indent_delta(n) for n in range(1, 6)]
    assert lazy.end(3, 6) == eager.end(3, 6)


def test_a_line_a_rewrite_moved_maps_to_where_it_was():
    """A read put after the step it came before (XLA417), a line moved
    before a barrier (XLA302): said once in each text, it maps to its old
    line, with its indentation.  A line said again elsewhere (the same
    read in a training and an evaluation loop) maps in order, where as many
    are left unpaired in each text; else it is left to the alignment."""
    old = "for x in xs:\n    out = f(x)\n    log(out.item())\n    step()\n    update()\n    done = 1\n"
    new = "for x in xs:\n    out = f(x)\n    step()\n    update()\n    sync()\n        log(out.item())\n    done = 1\n"
    back = line_map(old, new)
    assert [back(k) for k in range(1, 8)] == [1, 2, 4, 5, 6, 3, 6]
    assert back.indent_delta(6) == -4
    twice = "a\nb\nr\nc\nd\nr\n"
    assert line_map(twice, "a\nb\nc\nr\nd\nr\n")(4) == 3  # (the last `r` paired: the other moved)
    both = "a\nr\nb\nc\nd\ne\nr\nf\ng\n"  # moved in each of two loops: each maps to its own
    back = line_map(both, "a\nb\nc\nr\nd\ne\nf\ng\nr\n")
    assert [back(k) for k in range(1, 10)] == [1, 3, 4, 2, 5, 6, 8, 9, 7]
    # two unpaired in the new text, one in the old: which of them moved is not known
    assert [line_map("a\nr\nb\n", "a\nb\nr\nr\n")(k) for k in (3, 4)] != [2, 2]
