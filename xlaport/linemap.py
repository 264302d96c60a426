"""Map the lines of a rewritten text back to the lines of the text it came from.

Rules run on each other's output, so a finding's line is in the text the rule
saw; the engine maps it back to the user's file.  ``difflib`` does this in
time that grows with (lines x edits) -- minutes for a generated file with
thousands of rewrites -- so the alignment here is the patience method: lines
that occur once in both texts anchor the alignment (their longest increasing
run), the gaps between anchors are aligned the same way, and only gaps that
are small are handed to ``difflib``.  Large gaps with no anchor at all (a file
of identical blocks) fall back to a windowed walk.  Every step is linear or
n log n in the lines of its gap.
"""

from __future__ import annotations

import bisect
import difflib
import re
from typing import Dict, List, Optional, Sequence, Tuple

Pair = Tuple[int, int]  # (index in new, index in old), 0-based
SMALL = 4096  # gaps with (new x old) lines up to this go to difflib
WINDOW = 16  # how far the fallback walk looks ahead to resynchronise


class LineMap:
    """1-based lines of a rewritten text -> the matching lines of the text it
    came from (called as a function), and for a line that is an old one moved
    in or out by a rewrite, how far its columns moved (``indent_delta``)."""

    def __init__(self, table: Dict[int, int], shifts: Dict[int, int], last: int,
                 inserted: Dict[int, Tuple[int, int]]) -> None:
        self._table, self._shifts, self._last, self._inserted = table, shifts, last, inserted

    def __call__(self, line: int) -> int:
        return self._table.get(line, min(line, self._last))

    def indent_delta(self, line: int) -> int:
        """What to add to a column of new ``line`` to find it in the old text."""
        return self._shifts.get(line, 0)

    def end(self, line: int, col: int) -> Tuple[int, int]:
        """Where a span that ends at (``line``, ``col``) of the new text ends
        in the old one.  A span that ends on lines the rewrite only added (a
        barrier put at the end of a loop) ends where the old text before
        them ends, not on the line after them."""
        if line in self._inserted:
            return self._inserted[line]
        return self(line), max(1, col + self.indent_delta(line))


def line_map(old: str, new: str) -> LineMap:
    """Map 1-based line numbers of ``new`` to the matching line of ``old``.

    Lines inside a rewritten block map to the first line of the block they
    replaced, which is where a reader of the original should look.
    """
    old_lines, new_lines = old.splitlines(), new.splitlines()
    # lines are matched by what they say, not by their indentation: a block
    # dedented out of its ``with`` (or indented under a new ``if``) keeps
    # its lines, and an ``else:`` or a ``)`` that a dedent happens to line up
    # with another one of the old text must not anchor the alignment there
    pairs = match_lines([line.strip() for line in new_lines], [line.strip() for line in old_lines])
    table: Dict[int, int] = {}
    shifts: Dict[int, int] = {}
    inserted: Dict[int, Tuple[int, int]] = {}  # a line only added -> the end of the old line before it
    prev_i, prev_j = -1, -1
    for i, j in pairs + [(len(new_lines), len(old_lines))]:
        i1, j1, j2 = prev_i + 1, prev_j + 1, j
        for k in range(i1, i):  # new lines with no partner: the block they replaced
            table[k + 1] = min(j1 + (k - i1), max(j2 - 1, j1)) + 1
            if j1 == j2 and prev_j >= 0:  # (nothing replaced: added lines)
                inserted[k + 1] = (prev_j + 1, len(old_lines[prev_j].rstrip()) + 1)
        if i < len(new_lines):
            table[i + 1] = j + 1
            shift = _indent(old_lines[j]) - _indent(new_lines[i])
            if shift:
                shifts[i + 1] = shift
        prev_i, prev_j = i, j
    _moved(new_lines, old_lines, pairs, table, shifts, inserted)
    _split_reads(new_lines, old_lines, pairs, table, shifts, inserted)
    return LineMap(table, shifts, max(len(old_lines), 1), inserted)


def _moved(new_lines: Sequence[str], old_lines: Sequence[str], pairs: Sequence[Pair], table: Dict[int, int],
           shifts: Dict[int, int], inserted: Dict[int, Tuple[int, int]]) -> None:
    """Lines the alignment left unpaired in both texts that say the same, as
    many in each, are lines moved by a rewrite (a read put after the step it
    came before), the first of the new text's the first of the old's and so
    on: each maps to where it was, not to the block it landed in."""
    paired_new, paired_old = {i for i, _ in pairs}, {j for _, j in pairs}
    loose: Dict[str, List[int]] = {}
    for k, line in enumerate(new_lines):
        if k not in paired_new and line.strip():
            loose.setdefault(line.strip(), []).append(k)
    if not loose:
        return
    was: Dict[str, List[int]] = {}
    for j, line in enumerate(old_lines):
        if j not in paired_old and line.strip() in loose:
            was.setdefault(line.strip(), []).append(j)
    for text, ks in loose.items():
        if len(was.get(text, ())) != len(ks):
            continue
        for k, j in zip(ks, was[text]):
            table[k + 1] = j + 1
            inserted.pop(k + 1, None)
            shift = _indent(old_lines[j]) - _indent(new_lines[k])
            if shift:
                shifts[k + 1] = shift


# the second half of a read a rewrite split (``d_x = d_x_step.item()`` after the step, XLA418;
# ``ims = ims.cpu()`` after the barrier, XLA302), and what the user's line said (``d_x = out.mean().item()``)
_SPLIT_READ = re.compile(r"(\w+) = \w+\.(\w+)\(\)")
_READ = re.compile(r"(\w+) = .+\.(\w+)\(\)")


def _split_reads(new_lines: Sequence[str], old_lines: Sequence[str], pairs: Sequence[Pair], table: Dict[int, int],
                 shifts: Dict[int, int], inserted: Dict[int, Tuple[int, int]]) -> None:
    """A line a rewrite added that reads what a line of the user's computed
    (``d_x = d_x_step.item()``) maps to the user's line that read it (``d_x =
    out.mean().item()``), where that line is the only one of its target and
    method that the alignment left unpaired, and the added line the only one
    of them too."""
    paired_new, paired_old = {i for i, _ in pairs}, {j for _, j in pairs}
    added: Dict[Tuple[str, str], List[int]] = {}
    for k, line in enumerate(new_lines):
        found = _SPLIT_READ.fullmatch(line.strip()) if k not in paired_new else None
        if found:
            added.setdefault((found.group(1), found.group(2)), []).append(k)
    if not added:
        return
    was: Dict[Tuple[str, str], List[int]] = {}
    for j, line in enumerate(old_lines):
        found = _READ.fullmatch(line.strip()) if j not in paired_old else None
        if found and (found.group(1), found.group(2)) in added:
            was.setdefault((found.group(1), found.group(2)), []).append(j)
    for key, ks in added.items():
        if len(ks) == 1 and len(was.get(key, ())) == 1:
            k, j = ks[0], was[key][0]
            table[k + 1] = j + 1
            inserted.pop(k + 1, None)
            shift = _indent(old_lines[j]) - _indent(new_lines[k])
            if shift:
                shifts[k + 1] = shift


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def match_lines(a: Sequence[str], b: Sequence[str]) -> List[Pair]:
    """Pairs (i, j) with ``a[i] == b[j]``, increasing in both."""
    out: List[Pair] = []
    stack = [(0, len(a), 0, len(b))]
    while stack:
        a_lo, a_hi, b_lo, b_hi = stack.pop()
        head: List[Pair] = []
        while a_lo < a_hi and b_lo < b_hi and a[a_lo] == b[b_lo]:
            head.append((a_lo, b_lo))
            a_lo, b_lo = a_lo + 1, b_lo + 1
        tail: List[Pair] = []
        while a_lo < a_hi and b_lo < b_hi and a[a_hi - 1] == b[b_hi - 1]:
            a_hi, b_hi = a_hi - 1, b_hi - 1
            tail.append((a_hi, b_hi))
        out.extend(head)
        out.extend(tail)
        if a_lo == a_hi or b_lo == b_hi:
            continue
        if (a_hi - a_lo) * (b_hi - b_lo) <= SMALL:
            sm = difflib.SequenceMatcher(None, a[a_lo:a_hi], b[b_lo:b_hi], autojunk=False)
            for x, y, n in sm.get_matching_blocks():
                out.extend((a_lo + x + k, b_lo + y + k) for k in range(n))
            continue
        anchors = _anchors(a, a_lo, a_hi, b, b_lo, b_hi)
        if not anchors:
            out.extend(_walk(a, a_lo, a_hi, b, b_lo, b_hi))
            continue
        out.extend(anchors)
        prev = (a_lo - 1, b_lo - 1)
        for i, j in anchors + [(a_hi, b_hi)]:
            if i - prev[0] > 1 and j - prev[1] > 1:
                stack.append((prev[0] + 1, i, prev[1] + 1, j))
            prev = (i, j)
    out.sort()
    return out


def _anchors(a, a_lo, a_hi, b, b_lo, b_hi) -> List[Pair]:
    """Lines unique in both ranges, reduced to their longest increasing run."""
    count_a: Dict[str, int] = {}
    for i in range(a_lo, a_hi):
        count_a[a[i]] = count_a.get(a[i], 0) + 1
    where_b: Dict[str, int] = {}
    count_b: Dict[str, int] = {}
    for j in range(b_lo, b_hi):
        count_b[b[j]] = count_b.get(b[j], 0) + 1
        where_b[b[j]] = j
    cands = [(i, where_b[a[i]]) for i in range(a_lo, a_hi)
             if count_a[a[i]] == 1 and count_b.get(a[i]) == 1]
    return _longest_increasing(cands)


def _longest_increasing(pairs: List[Pair]) -> List[Pair]:
    """Longest subsequence of ``pairs`` (sorted by i) increasing in j."""
    tails: List[int] = []  # j of the last pair of the best run of each length
    tail_idx: List[int] = []
    back: List[int] = []
    for k, (_, j) in enumerate(pairs):
        n = bisect.bisect_left(tails, j)
        if n == len(tails):
            tails.append(j)
            tail_idx.append(k)
        else:
            tails[n] = j
            tail_idx[n] = k
        back.append(tail_idx[n - 1] if n else -1)
    run: List[Pair] = []
    k = tail_idx[-1] if tail_idx else -1
    while k >= 0:
        run.append(pairs[k])
        k = back[k]
    return run[::-1]


def _walk(a, a_lo, a_hi, b, b_lo, b_hi) -> List[Pair]:
    """Align by walking both ranges, resynchronising within WINDOW lines."""
    out: List[Pair] = []
    i, j = a_lo, b_lo
    while i < a_hi and j < b_hi:
        if a[i] == b[j]:
            out.append((i, j))
            i, j = i + 1, j + 1
            continue
        best = None
        for d in range(1, WINDOW + 1):
            if j + d < b_hi and a[i] == b[j + d]:
                best = (0, d)
                break
            if i + d < a_hi and a[i + d] == b[j]:
                best = (d, 0)
                break
        if best is None:
            i, j = i + 1, j + 1
        else:
            i, j = i + best[0], j + best[1]
    return out


class LazyLineMap:
    """``line_map(old, new)``, made when a line is first mapped: after the
    last rewrite of a file (on most files, the only one) nothing asks."""

    def __init__(self, old: str, new: str) -> None:
        self._texts: Optional[Tuple[str, str]] = (old, new)
        self._map: Optional[LineMap] = None

    def _made(self) -> LineMap:
        if self._map is None:
            assert self._texts is not None
            self._map, self._texts = line_map(*self._texts), None
        return self._map

    def __call__(self, line: int) -> int:
        return self._made()(line)

    def indent_delta(self, line: int) -> int:
        return self._made().indent_delta(line)

    def end(self, line: int, col: int) -> Tuple[int, int]:
        return self._made().end(line, col)
