"""Findings: how a codemod records one (``flag``), on which line, under
which suppression comments, ``--select``/``--ignore`` and ``--diff-base``
lines, and where the engine keeps a CUDA test as it is (XLA118).  Findings go
to ``context.scratch[FINDINGS_KEY]``, so xlaport's engine and LibCST's own
runner read them alike; their positions are given all at once (``place``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import libcst as cst

from codemods.rule import Finding, code_matches
from codemods.syntax.tree import TreeCache, call_name

FINDINGS_KEY = "xlaport.findings"
SELECT_KEY = "xlaport.select"
# line in the text a codemod sees -> line of the user's file (set by the engine)
ORIGINAL_LINE_KEY = "xlaport.original_line"
# a list there: the engine places the findings of passes over one tree in one
# position pass (see XlaCodemod._place_findings), not one per codemod
UNPLACED_KEY = "xlaport.unplaced"
# a finding waiting for its position: (finding, its node, its related nodes)
Unplaced = Tuple[Finding, cst.CSTNode, Tuple[cst.CSTNode, ...]]
# {(line of the user's file, code)} that a suppression comment silenced
USED_SUPPRESSIONS_KEY = "xlaport.used_suppressions"
# {line of the user's file} where a rule turned off (--ignore, --select,
# per-file ignores) would have spoken: a set there when the CUDA catch-all
# (which must not speak for them) runs
SILENCED_KEY = "xlaport.silenced"
# {line of the user's file: why} -- CUDA tests the engine keeps as they are,
# because the code they would switch on holds CUDA that no rule converted
# (codemods/analysis/switches.py; reported as KEPT_SWITCH_CODE)
KEPT_SWITCHES_KEY = "xlaport.kept_switches"
# the spans of lines the kept tests decide: a device chosen there by a test
# (CHOICE_CODE) stays as the user wrote it, so the program takes one side
KEPT_SPANS_KEY = "xlaport.kept_spans"
CHOICE_CODE = "XLA103"
# ... and so does the device a kept test asks the accelerator for (`torch.accelerator.current_accelerator()`)
KEPT_SPAN_CODES = frozenset({CHOICE_CODE, "XLA114"})
KEPT_SWITCH_CODE = "XLA118"
# the rules whose rewrites of a CUDA test change which code runs
SWITCH_CODES = frozenset({"XLA104", "XLA105", "XLA109"})
_STRING_TESTS = frozenset({"startswith", "endswith", "find", "index"})


class Reports:
    """The finding side of :class:`codemods.base.XlaCodemod` (it holds the
    context, the tree, the selection and the suppressions this reads)."""

    context: Any
    options: Dict[str, object]
    RESPECTS_HAND_PORTS: bool
    _suppressed: Dict[int, FrozenSet[str]]
    _unplaced: List[Unplaced]
    tree: TreeCache

    enabled: "Callable[[str], bool]"  # (the codemod's selection)

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.tree.parents.get(id(node))

    def position(self, node: cst.CSTNode) -> Tuple[int, int, int]:
        """(line, column, end line) of ``node`` in the tree this pass reads."""
        line, col, end, _ = self.tree.position(self.context, node)
        return line, col, end

    def user_line(self, line: int) -> int:
        """A line of the tree this pass reads, as a line of the user's file:
        what a message shows (earlier rules may have added or removed lines)."""
        back = self.context.scratch.get(ORIGINAL_LINE_KEY) or (lambda n: n)
        return back(line)  # type: ignore[no-any-return]

    def is_suppressed(self, node: cst.CSTNode, code: str) -> bool:
        if not self._suppressed:
            return False
        start, _, end = self.position(node)
        for line in {start, end}:
            codes = self._suppressed.get(line)
            if codes and code_matches(code, codes):
                # remembered for XLA002 (unused suppressions), by the user's line
                used = self.context.scratch.setdefault(USED_SUPPRESSIONS_KEY, set())
                used.add((self.user_line(line), code))  # type: ignore[union-attr, operator]
                return True
        return False

    def flag(
        self,
        node: cst.CSTNode,
        code: str,
        message: str,
        fix: bool,
        hot: Optional[bool] = None,
        related: Sequence[cst.CSTNode] = (),
        unsafe_fix: bool = False,
    ) -> bool:
        """Record a finding on ``node`` (an *original* node); ``related``:
        other nodes of the tree it is about (their lines become the
        finding's ``related`` spans); ``unsafe_fix``: a report that
        ``--unsafe-fixes`` would make a rewrite.

        Returns True when the rule is enabled and not suppressed on that line,
        i.e. when the caller may go on and rewrite.
        """
        if fix and code in SWITCH_CODES and self._kept_switch(node, code):
            return False
        if fix and (code in KEPT_SPAN_CODES or (code in SWITCH_CODES and isinstance(node, cst.IfExp))) \
                and self._in_kept_span(node):
            return False  # a device chosen by a kept test (`"cuda" if cuda else "cpu"`) stays as written
        if not self.enabled(code):
            if self.context.scratch.get(SILENCED_KEY) is not None:
                self.context.scratch[SILENCED_KEY].add(self.user_line(self.position(node)[0]))
            return False
        if self.is_suppressed(node, code) or not self._in_changed_lines(node):
            return False
        if fix and self.RESPECTS_HAND_PORTS and self.tree.knows_xla:
            # code its authors already made work on XLA: their CUDA branches are
            # deliberate alternatives, so say what would change and leave it
            fix, message = False, f"{message} (not rewritten: this module already supports XLA)"
            ok = False
        else:
            ok = True
        finding = Finding(code, message, 0, 0, fix, hot, unsafe_fix=unsafe_fix and not fix)
        self._unplaced.append((finding, node, tuple(related)))
        findings: List[Finding] = self.context.scratch.setdefault(FINDINGS_KEY, [])  # type: ignore[assignment]
        findings.append(finding)
        return ok

    def _kept_switch(self, node: cst.CSTNode, code: str) -> bool:
        """``node`` is a CUDA test the engine keeps as it is (it would switch
        on CUDA code left unconverted): reported once on its line instead."""
        kept = self.context.scratch.get(KEPT_SWITCHES_KEY)
        if not kept:
            return False
        line = self.user_line(self.position(node)[0])
        if line not in kept:
            return False
        if code == "XLA109":  # a device string is a test only where it is compared
            up = self.parent(node)
            call = self.parent(up) if isinstance(up, cst.Arg) else None
            if not (isinstance(up, (cst.Comparison, cst.ComparisonTarget))
                    or (isinstance(call, cst.Call) and call_name(call) in _STRING_TESTS)):
                return False
        said: Set[int] = self.context.scratch.setdefault(KEPT_SWITCHES_KEY + ".said", set())  # type: ignore[assignment]
        sel = self.context.scratch.get(SELECT_KEY)
        if line not in said and (sel is None or KEPT_SWITCH_CODE in sel) \
                and not self.is_suppressed(node, KEPT_SWITCH_CODE):  # (a rule of CudaGuards', said here)
            said.add(line)
            finding = Finding(KEPT_SWITCH_CODE, kept[line], 0, 0, False)
            self._unplaced.append((finding, node, ()))
            self.context.scratch.setdefault(FINDINGS_KEY, []).append(finding)
        return True

    def _in_kept_span(self, node: cst.CSTNode) -> bool:
        """``node`` starts on a line a kept CUDA test decides, and is not
        that test's own choice (``device = "cuda" if torch.cuda.is_available()
        else "cpu"`` is the device itself: it goes to XLA whatever else the
        test decides)."""
        spans = self.context.scratch.get(KEPT_SPANS_KEY)
        if not spans:
            return False
        line = self.user_line(self.position(node)[0])
        if line in (self.context.scratch.get(KEPT_SWITCHES_KEY) or {}):
            return False
        return any(first <= line <= last for first, last in spans)  # type: ignore[union-attr]

    def _in_changed_lines(self, node: cst.CSTNode) -> bool:
        """``--diff-base``: is the line a finding would point at (where the
        node starts) one the change made?  As Ruff judges a diagnostic by its
        line: a loop edited inside keeps its old findings out of the review."""
        only = self.options.get("only_lines")
        if only is None:
            return True
        start, _, _ = self.position(node)
        return self.user_line(start) in only  # type: ignore[operator]

    def _place_findings(self) -> None:
        """Give the findings recorded in this pass their lines, all at once."""
        place(self.tree, self._unplaced)


def place(tree: TreeCache, unplaced: List[Unplaced]) -> None:
    """Give findings recorded on nodes of ``tree`` their positions, in one
    position pass, and empty ``unplaced``."""
    if not unplaced:
        return
    starts = tree.start_positions([n for _, node, related in unplaced for n in (node, *related)])
    for finding, node, related in unplaced:
        finding.line, finding.col, finding.end_line, finding.end_col = starts.get(id(node), (1, 1, 0, 0))
        spans = [starts[id(n)] for n in related if id(n) in starts]
        finding.related = tuple((s[0], max(s[0], s[2])) for s in spans)
    unplaced.clear()
