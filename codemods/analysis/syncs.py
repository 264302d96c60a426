"""What counts as a barrier: a call that syncs (``torch_xla.sync()``,
``xm.mark_step()``, ``xm.optimizer_step(..., barrier=True)``), a loop that
syncs on every iteration (on every path through its body, not under a
flag), and the module's functions that sync on every call."""

from __future__ import annotations

from typing import Callable, Iterable, List, Optional, Sequence, Set, Union

import libcst as cst

from codemods.analysis.calls import FunctionSet
from codemods.syntax.tree import call_name, dotted, find_all, tree_of

Loop = Union[cst.For, cst.While]
QualNames = Callable[[cst.CSTNode], Set[str]]
_NESTED = (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)


def body_statements(loop: Loop) -> List[cst.BaseStatement]:
    body = loop.body
    return list(body.body) if isinstance(body, cst.IndentedBlock) else []


def is_barrier_call(call: cst.Call, names: Iterable[str], qualnames: QualNames) -> bool:
    q = qualnames(call.func)
    if q & set(names):
        return True
    text = dotted(call.func) or ""
    if text.endswith(("mark_step", "torch_xla.sync")) or text == "xm.mark_step":
        return True
    if call_name(call) == "optimizer_step":
        for a in call.args:
            if a.keyword is not None and a.keyword.value == "barrier":
                return not (isinstance(a.value, cst.Name) and a.value.value == "False")
    return False


def has_barrier(loop: Loop, names: Iterable[str], qualnames: QualNames, syncing: Optional[FunctionSet] = None) -> bool:
    """The loop already syncs on every iteration: a barrier, or a call of one
    of the module's functions that syncs (``syncing``, see
    :func:`syncing_functions`), on every path through its body.  A sync
    under a flag (``if args.synchronize_step: torch.cuda.synchronize()``) or
    in a nested loop (that may not run) is no barrier of this loop."""
    def syncs(call: cst.Call) -> bool:
        return is_barrier_call(call, names, qualnames) or bool(syncing and syncing.called_by(call))

    return syncs_on_every_path(body_statements(loop), syncs)


def syncs_on_every_path(stmts: Sequence[cst.CSTNode], syncs: Callable[[cst.Call], bool]) -> bool:
    """Some statement of ``stmts`` runs a call ``syncs`` accepts whichever
    way the branches go: in a plain statement, a ``with`` body, both arms of
    an ``if``/``else``, or a ``try`` body whose handlers sync too (or its
    ``finally``).  Loops may not run and functions are not called here."""
    for st in stmts:
        if isinstance(st, cst.SimpleStatementLine):
            if any(syncs(c) for c in find_all(st, cst.Call, stop=_NESTED)):  # type: ignore[arg-type]
                return True
        elif isinstance(st, cst.With):
            if syncs_on_every_path(_block(st.body), syncs):
                return True
        elif isinstance(st, cst.If):
            if tests_xla(st.test) and syncs_on_every_path(_block(st.body), syncs):
                return True  # `if XLA_AVAILABLE: xm.mark_step()`: on XLA, the path taken
            if st.orelse is not None and syncs_on_every_path(_block(st.body), syncs) and syncs_on_every_path(
                    [st.orelse.body] if isinstance(st.orelse, cst.If) else _block(st.orelse.body), syncs):
                return True
        elif isinstance(st, cst.Try):
            if st.finalbody is not None and syncs_on_every_path(_block(st.finalbody.body), syncs):
                return True
            if syncs_on_every_path(_block(st.body), syncs) and all(
                    syncs_on_every_path(_block(h.body), syncs) for h in st.handlers):
                return True
    return False


def tests_xla(test: cst.BaseExpression) -> bool:
    """A test that is true on XLA: it names XLA (``XLA_AVAILABLE``,
    ``is_torch_xla_available()``, ``device.type == "xla"``) and negates nothing."""
    if any(isinstance(n.operator, cst.Not) for n in find_all(test, cst.UnaryOperation)) or any(
            isinstance(c.operator, (cst.NotEqual, cst.IsNot, cst.NotIn))
            for n in find_all(test, cst.Comparison) for c in n.comparisons):  # type: ignore[attr-defined]
        return False
    words = [n.value for n in find_all(test, cst.Name)] + [n.value for n in find_all(test, cst.SimpleString)]
    return any("xla" in w.lower() for w in words)


def false_on_xla(test: cst.BaseExpression) -> bool:
    """A test that is false on XLA: ``not`` of one that is true there
    (``not is_torch_xla_available()``), or an ``and`` with such a side."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return tests_xla(test.expression)
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return false_on_xla(test.left) or false_on_xla(test.right)
    return False


def _block(suite: cst.BaseSuite) -> List[cst.CSTNode]:
    return list(suite.body) if isinstance(suite, cst.IndentedBlock) else [suite]


def syncing_functions(module: cst.Module, names: Iterable[str], qualnames: QualNames) -> FunctionSet:
    """The module's functions and methods that run a barrier on every call
    -- on every path through their body (``if step % 10 == 0:
    xm.mark_step()`` does not sync every step), directly or through another
    such function (read through the scopes: ``analysis.calls``): a loop
    calling one already syncs."""
    tree = tree_of(module)
    functions = find_all(module, cst.FunctionDef)
    found = FunctionSet(tree)

    def syncs(call: cst.Call) -> bool:
        return is_barrier_call(call, names, qualnames) or bool(found) and found.called_by(call)

    changed = True
    while changed:
        changed = False
        for fn in functions:
            if id(fn) not in found.defs and syncs_on_every_path(_block(fn.body), syncs):  # type: ignore[attr-defined]
                found.defs.add(id(fn))
                found.add(fn.name.value)  # type: ignore[attr-defined]
                changed = True
    return found


def syncs_by_hand(tree, names: Iterable[str], qualnames: QualNames) -> bool:  # type: ignore[no-untyped-def]
    """The module's authors sync somewhere already (``xm.mark_step()``,
    ``torch_xla.sync()``, ``xm.optimizer_step(..., barrier=True)``): code
    ported by hand, whose step loops XLA302 leaves to them (``tree``: a
    TreeCache; a barrier in a module that names no ``torch_xla`` was put
    there by xlaport itself, a converted ``torch.cuda.synchronize()``)."""
    def scan() -> bool:
        src = tree.source  # the original file, before any rule ran
        if src and not any(k in src for k in (b"mark_step", b"sync", b"barrier")):
            return False
        if src and b"torch_xla" not in src:
            return False
        return any(is_barrier_call(c, names, qualnames) for c in find_all(tree.module, cst.Call))
    key = "syncs_by_hand"
    if key not in tree.memo:
        tree.memo[key] = scan()
    return bool(tree.memo[key])
