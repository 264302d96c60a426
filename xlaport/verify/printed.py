"""What a run prints, compared with what another printed: the numbers of
each line in order (timings, device names and library log lines left out),
and the lines without numbers word for word."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Set, Tuple

from xlaport.verify.comparison import Compared, Comparison, close_numbers as _close
from xlaport.verify.crashes import LOG_LINE

_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


# A device printed as text (`Using xla:0 device`, `device(type='cuda', index=0)`):
# the two runs name their own devices, so names (and their indices) are not compared
_DEVICE_TEXT = re.compile(r"device\(type='\w+'(?:, index=\d+)?\)|\b(?:cuda|xla|mps|cpu)(?::\d+)?\b")


def normalise_devices(text: str) -> str:
    return _DEVICE_TEXT.sub("<device>", text)


# A line a native library writes to the process's stdout (Gloo's "[Gloo] Rank
# 0 is connected to 0 peer ranks", glog's "W1126 19:38:53.87 ..."): it says
# which backend ran, not what the program computed
_LIBRARY_LINE = re.compile(r"^\s*(?:\[(?:Gloo|NCCL|rank\d+|c10d)\b[^\]]*\]|" + LOG_LINE.pattern.lstrip("^") + ")")


def library_lines(text: str) -> List[str]:
    return [line for line in text.splitlines() if _LIBRARY_LINE.match(line)]


def _numbered_lines(text: str) -> List[str]:
    return [line for line in normalise_devices(text).splitlines()
            if _NUMBER.search(line) and not _LIBRARY_LINE.match(line)]


# A number with a time, throughput or memory unit, after a word that announces
# a duration, or inside a clock time, a date or a compound duration (1m2s,
# 0:01:23), is not a result: it varies between runs and machines even when
# two runs happen to print the same rounded value.
_UNIT_AFTER = re.compile(r"\s*(ms|us|µs|ns|s|sec|secs|seconds|min|mins|minutes|h|hr|hrs|hours|it/s|s/it|ms/batch|"
                         r"ms/step|samples/s|img/s|imgs/s|tok/s|tokens/s|steps/s|batches/s|"
                         r"[KMGT]i?B|bytes|[KMGT]B/s)(?![A-Za-z])", re.IGNORECASE)
_WORD_BEFORE = re.compile(r"\b(time|elapsed|took|duration|dt|eta|speed|throughput|memory|mem|allocated|reserved|"
                          r"date)\s*[:=]?\s*$", re.IGNORECASE)
_TIME_LIKE = re.compile(r"\d+h\s*\d+m(?:\s*\d+(?:\.\d+)?s)?|\d+m\s*\d+(?:\.\d+)?s|"  # 1h2m, 1m2s
                        r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\.\d+)?\b|"  # 0:01:23, 12:30
                        r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?(?:\.\d+)?)?")  # dates


def _timings(line: str) -> Set[int]:
    """Indices of the numbers in ``line`` that are timings, dates or sizes."""
    return set(_timed(line)[0])


def _timed(line: str) -> Tuple[List[int], List[str]]:
    """The indices of ``line``'s numbers that are timings, dates or sizes,
    and those as written (``0:01:23`` whole, ``781ms`` with its unit)."""
    spans = [m.span() for m in _TIME_LIKE.finditer(line)]
    found: List[int] = []
    pieces = [line[a:b] for a, b in spans]
    for j, m in enumerate(_NUMBER.finditer(line)):
        within = any(a <= m.start() < b for a, b in spans)
        unit = _UNIT_AFTER.match(line, m.end())
        if unit or _WORD_BEFORE.search(line[: m.start()]) or within:
            found.append(j)
            if not within:
                pieces.append(m.group() + (unit.group().rstrip() if unit else ""))
    return found, pieces


def _values(line: str) -> List[str]:
    """The numbers of ``line`` that are results: not timings, dates or sizes
    (each side's own by its own form: `781ms` and `1m2s` are both left out)."""
    timing = _timings(line)
    return [m.group() for j, m in enumerate(_NUMBER.finditer(line)) if j not in timing]


def _by_form(label: str, text: str) -> List[str]:
    """The lines of ``text`` whose timings, dates or sizes are left out
    (what is left out, as written, then the line)."""
    found = []
    for i, line in enumerate(_numbered_lines(text)):
        timing, pieces = _timed(line)
        if not timing:
            continue
        shown = ", ".join(pieces[:4]) + (", ..." if len(pieces) > 4 else "")
        found.append(f"{label} line {i + 1}: {shown} (of `{line.strip()[:60]}`)")
    return found


def _stable_positions(refs: Sequence[str]) -> Tuple[Optional[Set[Tuple[int, int]]], List[str]]:
    """(line, number) positions of the results (:func:`_values`) that vary
    between the reference texts, and a description of each; None when the
    texts do not even line up."""
    lines = [_numbered_lines(t) for t in refs]
    if any(len(l) != len(lines[0]) for l in lines):
        return None, []
    varying: Set[Tuple[int, int]] = set()
    described: List[str] = []
    for i, group in enumerate(zip(*lines)):
        numbers = [_values(l) for l in group]
        if any(len(n) != len(numbers[0]) for n in numbers):
            varying |= {(i, j) for j in range(max(len(n) for n in numbers))}
            described.append(f"line {i + 1}: {group[0].strip()[:60]}")
            continue
        for j in range(len(numbers[0])):
            if len({n[j] for n in numbers}) > 1 and (i, j) not in varying:
                varying.add((i, j))
                described.append(f"line {i + 1}, number {j + 1}: {group[0].strip()[:60]}")
    return varying, described


def compare_text(label: str, refs: Sequence[str], cand: str, rtol: float, atol: float, out: Comparison) -> None:
    """Numbers in text (stdout, a log file), line by line, leaving out the
    ones that vary between the reference runs."""
    varying, described = _stable_positions(refs)
    out.varies += [f"{label} {d}" for d in described]
    out.by_form += _by_form(label, refs[0])
    for side, text in (("reference", refs[0]), ("conversion", cand)):
        out.not_compared += [f"{label}: written by a library on the {side}'s side: {line.strip()[:80]}"
                             for line in dict.fromkeys(library_lines(text))]
    _compare_words(label, refs, cand, out)
    ref_lines, cand_lines = _numbered_lines(refs[0]), _numbered_lines(cand)
    if varying is None or len(ref_lines) != len(cand_lines):
        out.outputs.append(Compared(label, False, math.inf, math.inf))
        return
    for i, (r, c) in enumerate(zip(ref_lines, cand_lines)):
        rn, cn = _values(r), _values(c)
        if len(rn) != len(cn):
            out.outputs.append(Compared(f"{label} line {i + 1}", False, math.inf, math.inf))
            continue
        pairs = [(float(a), float(b)) for j, (a, b) in enumerate(zip(rn, cn)) if (i, j) not in varying]
        if not pairs:
            continue
        abs_err = max(abs(a - b) for a, b in pairs)
        rel_err = max(abs(a - b) / max(abs(a), 1e-12) for a, b in pairs)
        ok = all(_close(a, b, rtol, atol) for a, b in pairs)
        out.outputs.append(Compared(f"{label} line {i + 1}: {r.strip()[:60]}", ok, abs_err, rel_err))


def _worded_lines(text: str) -> List[str]:
    """The lines that hold no number: words the program printed (a sampled
    text, a label, a verdict), devices named alike."""
    return [line.rstrip() for line in normalise_devices(text).splitlines()
            if line.strip() and not _NUMBER.search(line) and not _LIBRARY_LINE.match(line)]


_WORDS = "lines without numbers"
WORDED = f"stdout {_WORDS}"  # (the name of stdout's)


def messages_only(ref_stdout: str, sources: Iterable[Path]) -> bool:
    """Are the lines without numbers the program printed its own string
    constants (``print("done")``)?  Those are messages, compared but not
    values: a run that compared nothing else compared no value."""
    import ast

    lines = {line.strip() for line in _worded_lines(ref_stdout)}
    if not lines:
        return False
    constants: Set[str] = set()
    for path in sources:
        try:
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        constants |= {n.value.strip() for n in ast.walk(tree)
                      if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return lines <= constants


def _compare_words(label: str, refs: Sequence[str], cand: str, out: Comparison) -> None:
    """Lines without numbers, word for word, where the reference runs print
    them alike (a text sampled from a seeded model is an output as much as
    a loss is); a line that differs between the reference runs is left out."""
    ref_lines = [_worded_lines(r) for r in refs]
    first, mine = ref_lines[0], _worded_lines(cand)
    if any(len(r) != len(first) for r in ref_lines[1:]):
        out.varies.append(f"{label}: the {_WORDS} (how many the reference prints varies)")
        return
    stable = [i for i in range(len(first)) if all(r[i] == first[i] for r in ref_lines[1:])]
    if len(stable) < len(first):
        out.varies.append(f"{label}: {len(first) - len(stable)} line(s) without numbers")
    if not stable:
        return
    if len(mine) != len(first):
        out.outputs.append(Compared(f"{label} {_WORDS} ({len(first)} in the reference, {len(mine)} in "
                                    f"the conversion)", False, math.inf, math.inf))
        return
    wrong = [i for i in stable if mine[i] != first[i]]
    for i in wrong[:5]:
        out.outputs.append(Compared(f"{label} text line {i + 1}: {first[i].strip()[:60]!r}, the conversion printed "
                                    f"{mine[i].strip()[:60]!r}", False, math.inf, math.inf))
    if len(wrong) > 5:
        out.outputs.append(Compared(f"{label}: {len(wrong) - 5} more line(s) without numbers differ", False,
                                    math.inf, math.inf))
    if len(wrong) < len(stable):
        out.outputs.append(Compared(f"{label} {_WORDS} ({len(stable) - len(wrong)} alike, word for word)",
                                    True, 0.0, 0.0))
