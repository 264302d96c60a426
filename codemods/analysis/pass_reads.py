"""Where a loop pass first reads on the host a value it computed: the place
for its barrier (XLA302), so that the read finds the pass computed and the
pass runs one graph.  A read of a name, or an assignment whose read computes
what it reads, at the loop's own level or in each branch of an ``if``/``else``
decided on the host (before the ``if`` where only some branches read, and
before a loop inside the pass that reads it), or in a ``with`` block there
(``with torch.no_grad():``); host
copies kept in a list before a later read move to it.  The answer is a :class:`~codemods.syntax.hoist.ReadSite`; the split it
asks for is made by :mod:`codemods.syntax.hoist`."""

from __future__ import annotations

from typing import Callable, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst

from codemods.analysis.placement import host_read, reads_truth
from codemods.analysis.state import assigned_keys
from codemods.syntax.hoist import ReadSite, read_receiver
from codemods.syntax.nodes import call_name, dotted
from codemods.syntax.tree import TreeCache, find_all


class PassReads:
    """The reads of a loop's pass, as the tensors analysis sees them."""

    def __init__(self, tree: TreeCache, tensors: Set[str],
                 qualnames: Callable[[cst.CSTNode], Iterable[str]]) -> None:
        self.tree, self.tensors, self.qualnames = tree, tensors, qualnames

    def first(self, stmts: List[cst.BaseStatement], computed_before: bool = False,
              assigned: FrozenSet[str] = frozenset()) -> Optional[ReadSite]:
        """The first statement of ``stmts`` that reads on the host a value
        the pass assigned before it (``assigned``: what the statements
        before ``stmts`` assign); a read of anything else (the loop's own
        timestep, ``t.item()``) finds nothing pending and is passed over."""
        for k, stmt in enumerate(stmts):
            if isinstance(stmt, cst.If):
                branches = self._branch_reads(stmt, computed_before or k > 0, assigned)
                if branches is not None:
                    return ReadSite(k, None, branches)
                if (computed_before or k > 0) and self._read_within(stmt, True, assigned):
                    return ReadSite(k, None)  # (before the `if`, after what the pass computed first)
            elif isinstance(stmt, (cst.For, cst.While)):
                if (computed_before or k > 0) and self._read_in_loop(stmt, assigned):
                    return ReadSite(k, None)  # (before the loop, after what the pass computed first)
            elif isinstance(stmt, cst.With) and isinstance(stmt.body, cst.IndentedBlock):
                inner = self.first(list(stmt.body.body), computed_before or k > 0, assigned)
                if inner is not None:  # (`with torch.no_grad():` around the pass)
                    return ReadSite(k, None, inner=inner)
            elif isinstance(stmt, cst.SimpleStatementLine):
                reads = self._reads(stmt)
                computed = read_receiver(stmt, reads) if reads else None
                if reads and (computed is None or k == 0 and not computed_before):
                    return None
                if computed is not None and assigned & _mentioned(computed):
                    if not isinstance(computed, (cst.Name, cst.Attribute)):
                        return ReadSite(k, computed)
                    return self._deferred(stmts, k, assigned | assigned_keys(stmt)) or ReadSite(k, None)
            assigned = assigned | assigned_keys(stmt)
        return None

    def _deferred(self, stmts: List[cst.BaseStatement], k: int, assigned: FrozenSet[str]) -> Optional[ReadSite]:
        """A host copy kept in a list (``x0_preds.append(x0_t.to('cpu'))``)
        before another read later in the pass (``xs.append(xt_next.to('cpu'))``,
        ermongroup/ddim's samplers): each read runs a graph of its own.
        Moved to just after the barrier before the later read, it copies the
        same value (nothing between assigns, changes in place, or mentions
        the list), and the pass runs one graph.  None where it cannot move."""
        kept = _kept_copy(stmts[k])
        rest = self.first(list(stmts[k + 1:]), True, assigned) if kept is not None else None
        if kept is None or rest is None or rest.branches is not None or rest.inner is not None:
            return None
        m = k + 1 + rest.k
        if not _untouched(stmts[k + 1:m + 1], *kept):
            return None
        return ReadSite(m, rest.receiver, deferred=(k,) + tuple(k + 1 + d for d in rest.deferred))

    def _branch_reads(self, stmt: cst.If, computed_before: bool,
                      assigned: FrozenSet[str]) -> Optional[Tuple[ReadSite, ReadSite]]:
        """The first read of each branch of an ``if``/``else`` whose test
        reads nothing on the device; None unless both have one."""
        orelse = stmt.orelse
        if not isinstance(orelse, cst.Else) or not isinstance(orelse.body, cst.IndentedBlock) \
                or self._host_test(stmt) is None:
            return None
        first = self.first(list(stmt.body.body), computed_before, assigned)
        second = self.first(list(orelse.body.body), computed_before, assigned)
        return None if first is None or second is None else (first, second)

    def _read_within(self, stmt: cst.If, computed_before: bool, assigned: FrozenSet[str]) -> bool:
        """Does a branch of an ``if`` decided on the host read a value the
        pass computed (``if i % 10 == 0: frames.append(x.cpu())``), where not
        every branch does?  The barrier goes before the ``if``: a pass that
        reads runs one graph, as one that does not."""
        if self._host_test(stmt) is None:
            return False
        orelse = stmt.orelse
        branches = [stmt.body.body] + ([orelse.body.body] if isinstance(orelse, cst.Else) else
                                       [[orelse]] if isinstance(orelse, cst.If) else [])
        return any(self.first(list(b), computed_before, assigned) is not None for b in branches)

    def _read_in_loop(self, stmt, assigned: FrozenSet[str]) -> bool:  # type: ignore[no-untyped-def]
        """Does a loop inside the pass read on the host a value the pass
        computed before it and the loop never assigns (``for k in
        range(n): log.append(loss.item())``)?  The barrier goes before the
        loop: the read finds the pass computed (with the barrier at the end,
        the read runs a graph and the barrier another).  A read of what the
        loop computes itself is the loop's own: passed over."""
        inner = assigned_keys(stmt)
        before = assigned - inner
        if not before or not isinstance(stmt.body, cst.IndentedBlock):
            return False
        for line in find_all(stmt.body, cst.SimpleStatementLine, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            reads = self._reads(line)
            computed = read_receiver(line, reads) if reads else None  # type: ignore[arg-type]
            if computed is not None and before & _mentioned(computed) and not inner & _mentioned(computed):
                return True
        return False

    def _host_test(self, stmt: cst.If) -> Optional[cst.If]:
        """``stmt`` where its test reads nothing on the device (and its
        branches are blocks), else None."""
        if not isinstance(stmt.body, cst.IndentedBlock) or self._reads(stmt.test) \
                or reads_truth(stmt.test, self.tensors, self.qualnames):
            return None
        return stmt

    def _reads(self, node: cst.CSTNode) -> List[cst.Call]:
        calls = find_all(node, cst.Call, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda))
        return [c for c in calls if host_read(self.tree, c, self.tensors, self.qualnames)]  # type: ignore[arg-type]


def _kept_copy(stmt: cst.BaseStatement) -> Optional[Tuple[str, FrozenSet[str]]]:
    """``L.append(<host read of N>)`` alone on its line: the list, and the name read."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    if not isinstance(call, cst.Call) or call_name(call) != "append" or len(call.args) != 1 \
            or not isinstance(call.func, cst.Attribute):
        return None
    target, read = dotted(call.func.value), call.args[0].value
    while isinstance(read, cst.Call) and isinstance(read.func, cst.Attribute):
        read = read.func.value  # `x0_t` of `x0_t.to("cpu")`
    # a plain name: an attribute (`self.x`) can change in any call between
    return None if target is None or not isinstance(read, cst.Name) else (target, frozenset({read.value}))


def _untouched(stmts: Sequence[cst.BaseStatement], kept: str, read: FrozenSet[str]) -> bool:
    """No statement mentions the list ``kept``, assigns what was read, or
    changes it in place (``x.add_(...)``, ``torch.clamp_(x)``, ``out=x``)."""
    for stmt in stmts:
        if kept in _mentioned(stmt) or assigned_keys(stmt) & read:
            return False
        for call in find_all(stmt, cst.Call):
            func = call.func  # type: ignore[attr-defined]
            if isinstance(func, cst.Attribute) and func.attr.value.endswith("_") and dotted(func.value) in read:
                return False
            if any(dotted(a.value) in read and ((call_name(call) or "").endswith("_") or
                                                (a.keyword is not None and a.keyword.value == "out"))
                   for a in call.args):  # type: ignore[attr-defined]
                return False
    return True


def _mentioned(node: cst.CSTNode) -> FrozenSet[str]:
    """The names and attribute chains an expression mentions (``x`` and
    ``x.to`` of ``x.to(d)``, not the attribute's own name ``to``)."""
    found = find_all(node, (cst.Name, cst.Attribute))
    attrs = {id(n.attr) for n in found if isinstance(n, cst.Attribute)}
    return frozenset(d for d in (dotted(n) for n in found if id(n) not in attrs) if d)


def has_exit(stmts, kinds: Tuple[type, ...]) -> bool:
    """A ``break``/``return`` of this loop's own level (not a nested loop's or function's)."""
    return any(find_all(s, kinds, stop=(cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda))
               for s in stmts)
