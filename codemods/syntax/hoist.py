"""Splitting a statement around a barrier: where a loop pass's first host
read is (:class:`ReadSite`), and a read that computes what it reads
(``ims = torch.clamp(xt, -1, 1).cpu()``) computed before the barrier and
copied after it, without changing what runs or in which order."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst

from codemods.syntax.tree import find_all


class ReadSite:
    """Where a pass's first host read is: statement ``k`` of a body; the
    expression the read computes, to be computed before the barrier (None: it
    reads a name); for an ``if``/``else``, the first read of each branch; for
    a ``with`` block, the first read in its body (``inner``).  ``deferred``:
    earlier statements of the body (host copies kept in a list) moved to just
    after the barrier, in their order."""

    def __init__(self, k: int, receiver: Optional[cst.BaseExpression],
                 branches: Optional[Tuple["ReadSite", "ReadSite"]] = None, deferred: Tuple[int, ...] = (),
                 inner: Optional["ReadSite"] = None) -> None:
        self.k, self.receiver, self.branches, self.deferred, self.inner = k, receiver, branches, deferred, inner

    def words(self, stmts: Sequence[cst.BaseStatement]) -> str:
        """Where the barrier goes, for XLA302's message (``stmts``: the body)."""
        where = "right before its first host read"
        held = stmts[self.k] if not self.branches and self.inner is None else None
        if isinstance(held, (cst.If, cst.For, cst.While)):
            where = f"right before the {'`if`' if isinstance(held, cst.If) else 'loop'} that holds its first host read"
        if self.computes():
            where += ", the value it reads computed first"
        if self.branches:
            where += ", in each branch"
        if self.deferred:
            where += ", the host copies kept before it moved to just after it"
        return where + " (it finds the pass computed: one graph execution per pass)"

    def computes(self) -> bool:
        return self.receiver is not None or any(b.computes() for b in (*(self.branches or ()), self.inner) if b)

    def place(self, updated: List[cst.BaseStatement], original: Sequence[cst.BaseStatement],
              barrier: cst.SimpleStatementLine) -> List[cst.BaseStatement]:
        """``updated`` with the barrier before the read (in each branch)."""
        k, stmt = self.k, updated[self.k]
        if self.branches is not None:
            first, second = self.branches
            before = original[k]
            assert isinstance(stmt, cst.If) and isinstance(before, cst.If)
            assert isinstance(stmt.orelse, cst.Else) and isinstance(before.orelse, cst.Else)
            body = first.place(list(stmt.body.body), before.body.body, barrier)  # type: ignore[attr-defined]
            orelse = second.place(list(stmt.orelse.body.body), before.orelse.body.body, barrier)  # type: ignore[attr-defined]
            placed: List[cst.BaseStatement] = [stmt.with_changes(
                body=stmt.body.with_changes(body=body),
                orelse=stmt.orelse.with_changes(body=stmt.orelse.body.with_changes(body=orelse)))]
        elif self.inner is not None:
            before = original[k]
            assert isinstance(stmt, cst.With) and isinstance(before, cst.With)
            body = self.inner.place(list(stmt.body.body), before.body.body, barrier)  # type: ignore[attr-defined]
            placed = [stmt.with_changes(body=stmt.body.with_changes(body=body))]
        elif self.receiver is not None:
            placed = computed_then_read(original[k], self.receiver, barrier)
        else:
            placed = [barrier, stmt]
        if self.deferred:  # (after the barrier, placed here: no branches, no block)
            at = next(i for i, s in enumerate(placed) if s is barrier) + 1
            placed[at:at] = [updated[d] for d in self.deferred]
        return [s for i, s in enumerate(updated[:k]) if i not in self.deferred] + placed + updated[k + 1:]


def _receiver(call: cst.Call) -> Optional[cst.BaseExpression]:
    """What a host read reads: ``x`` of ``x.item()`` and of ``float(x)``."""
    func = call.func
    return func.value if isinstance(func, cst.Attribute) else (call.args[0].value if call.args else None)


def read_receiver(stmt: cst.SimpleStatementLine, reads: List[cst.Call]) -> Optional[cst.BaseExpression]:
    """What the statement's host reads read: a name or attribute the code
    computed before (``x.item()``, ``self.x.cpu().numpy()``), or an
    expression the one assignment of the statement computes in the read
    (``ims = torch.clamp(xt, -1, 1).detach().cpu()``), which can be computed
    right before the read as the target itself without changing what runs
    or in which order: nothing else of the statement is called before it,
    and the target is not read elsewhere in the value.  None otherwise."""
    inner = [r for r in reads if not any(o is not r and _within(o, r) for o in reads)]
    if len(inner) != 1 or any(r is not inner[0] and not _within(inner[0], r) for r in reads):
        return None  # two reads of their own (``a.item(), b.item()``)
    receiver = _receiver(inner[0])
    if receiver is None or isinstance(receiver, (cst.Name, cst.Attribute)):
        return receiver
    small = stmt.body[0] if len(stmt.body) == 1 else None
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 \
            or not isinstance(small.targets[0].target, cst.Name) \
            or isinstance(receiver, (cst.Tuple, cst.GeneratorExp, cst.Yield, cst.NamedExpr, cst.Await)):
        return None
    name = small.targets[0].target.value
    outside = [n for n in find_all(small.value, (cst.Name, cst.Call), stop=(cst.Lambda,)) if not _within(n, receiver)]
    for node in outside:
        if isinstance(node, cst.Name) and node.value == name and node is not small.targets[0].target:
            return None  # the target's old value is read after the receiver
        if isinstance(node, cst.Call) and not _within(inner[0], node):
            return None  # a call the statement makes before the receiver is computed
    return receiver


def _within(node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    return node is outer or any(n is node for n in find_all(outer, type(node)))


def computed_then_read(stmt: cst.BaseStatement, receiver: cst.BaseExpression,
                       barrier: cst.SimpleStatementLine) -> List[cst.BaseStatement]:
    """``ims = torch.clamp(xt, -1, 1).cpu()`` around the barrier:
    ``ims = torch.clamp(xt, -1, 1)``, the barrier, ``ims = ims.cpu()`` -- the
    barrier's one graph computes the value, the read copies it."""
    assert isinstance(stmt, cst.SimpleStatementLine)
    assign = stmt.body[0]
    assert isinstance(assign, cst.Assign) and isinstance(assign.targets[0].target, cst.Name)
    target = assign.targets[0].target
    value = receiver.with_changes(lpar=[], rpar=[]) if receiver.lpar else receiver
    computed = cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(target=cst.Name(target.value))],
                                                        value=value)], leading_lines=stmt.leading_lines)
    copied = stmt.deep_replace(receiver, cst.Name(target.value)).with_changes(leading_lines=())
    return [computed, barrier, copied]  # type: ignore[list-item]


def joined_then_read(stmts: Sequence[cst.BaseStatement], k: int, moved: Sequence[int],
                     split: Dict[int, Tuple[cst.BaseExpression, str]],
                     barrier: cst.SimpleStatementLine) -> List[cst.BaseStatement]:
    """``stmts`` with the barrier before ``stmts[k]``, the lines ``moved``
    before it in their order, and each ``split`` line's tensor computed into
    its name before it (``correct_step = predicted.eq(targets).sum()``), the
    line reading the name after it (``correct += correct_step.item()``)."""
    before: List[cst.BaseStatement] = []
    after: List[cst.BaseStatement] = []
    for j in range(k, len(stmts)):
        stmt = stmts[j]
        if j in moved:
            before.append(stmt)
        elif j in split:
            receiver, name = split[j]
            value = receiver.with_changes(lpar=[], rpar=[]) if receiver.lpar else receiver
            before.append(cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(target=cst.Name(name))], value=value)]))
            after.append(stmt.deep_replace(receiver, cst.Name(name)))  # type: ignore[arg-type]
        else:
            after.append(stmt)
    return [*stmts[:k], *before, barrier, *after]
