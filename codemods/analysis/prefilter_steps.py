"""The prefilter's reading of a loop at ``ast`` level: may it take a step?
Loose enough to hold wherever ``loops.step_kind`` says it does (a step call
at the loop's own level, or state a model-like call carries to the next
iteration), and the small ``ast`` readers the prefilter shares."""

from __future__ import annotations

import ast
from typing import List, Optional, Set, Tuple

from codemods.analysis.steps import (
    APPEND_METHODS,
    RANDOM_DRAWS,
    RANDOM_FILLS,
    READ_CALLS,
    called_like_a_model,
    takes_step_by_name,
)

_OWN_STOP = (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def last_name(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def dotted_name(node: ast.AST) -> str:
    parts: List[str] = []
    while type(node) is ast.Attribute:
        parts.append(node.attr)  # type: ignore[attr-defined]
        node = node.value  # type: ignore[attr-defined]
    if type(node) is not ast.Name:
        return ""
    parts.append(node.id)  # type: ignore[attr-defined]
    return ".".join(reversed(parts))


def target_names(target: ast.AST, attributes: bool = True) -> List[str]:
    """Names an assignment target binds: ``x``, the names of a tuple, and
    (with ``attributes``) the attribute of ``self.x``; never ``x[i]``."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute):
        return [target.attr] if attributes else []
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in target_names(e, attributes)]
    if isinstance(target, ast.Starred):
        return target_names(target.value, attributes)
    return []


def _own(node: ast.AST):  # type: ignore[no-untyped-def]
    """``node`` and its descendants at its own level: not inside a nested
    loop, function, class or lambda (as ``loops.own_nodes``)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, _OWN_STOP):
                stack.append(child)


def may_step(loop: ast.AST, steps: Set[str], modelish) -> bool:  # type: ignore[no-untyped-def]
    """What ``loops.step_kind`` needs to call ``loop`` a step loop, read
    loosely enough to hold whenever it does: a call at the loop's own level
    of a step name (``backward``, ``step``, a function of the file that
    takes one); or an assignment from a model-like call together with a
    name read before it is written (state carried to the next iteration,
    ``state._carries_model_state``, read by whole names: a name written
    before, on every path, is not read first), the name being one written
    from the model's output."""
    body = list(loop.body)  # type: ignore[attr-defined]
    for stmt in body:
        if isinstance(stmt, _OWN_STOP):
            continue
        for n in _own(stmt):
            if isinstance(n, ast.Call) and takes_step_by_name(last_name(n.func) or "", steps):
                return True
    read_first: Set[str] = set()
    # per assignment: (names its value reads, roots of its targets, runs a model?)
    assigns: List[Tuple[Set[str], Set[str], bool]] = []

    def scan(stmts: List[ast.stmt], written: Set[str]) -> Set[str]:
        """``stmts`` in order; ``written``: what is written before them in this
        iteration, grown with what they write on every path (as state's
        scan, but by whole names only: looser)."""
        for stmt in stmts:
            if isinstance(stmt, _OWN_STOP):
                continue
            added = _added(stmt)
            if added is not None or isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                # `xs.append(v)` writes `xs` from `v` as `xs += [v]` does
                targets, value = added or ((stmt.targets if isinstance(stmt, ast.Assign)  # type: ignore[attr-defined]
                                            else [stmt.target]), stmt.value)  # type: ignore[attr-defined]
                if value is None:
                    continue
                reads = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
                if isinstance(stmt, ast.AugAssign):  # (`xs.append(v)` reads nothing of xs)
                    reads |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                read_first.update(reads - written)
                model = any(isinstance(c, ast.Call) and model_call(c) for c in ast.walk(value))
                roots = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                assigns.append((reads, roots, model))
                for t in targets:
                    written.update(target_names(t, attributes=False))
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                scan(stmt.body, written)
            elif isinstance(stmt, ast.If):  # written on both branches: written after the `if`
                written |= scan(stmt.body, set(written)) & scan(stmt.orelse, set(written))
            elif isinstance(stmt, (ast.Try, ast.Match)) or type(stmt).__name__ == "TryStar":
                blocks = _blocks(stmt)
                for block in blocks[:-1]:
                    scan(block, set(written))
                last = blocks[-1]  # a `try`'s `finally` (runs on every path)
                scan(last, written if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar" else set(written))
        return written

    layers = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} \
        if isinstance(loop, (ast.For, ast.AsyncFor)) else set()

    def model_call(call: ast.Call) -> bool:
        """What ``state._is_model_call`` can accept: ``obj.m(...)`` (not on
        ``self``) by its name alone; a name or ``self.m`` also by what the
        file binds or defines under it; never what the loop itself binds
        (``for layer in self.layers: h = layer(h)``)."""
        func = call.func
        if dotted_name(func).split(".")[0] in layers:
            return False
        if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "self"):
            return called_like_a_model(dotted_name(func))
        return modelish(last_name(func) or "")

    scan(body, set())
    # driven: written from a model's output, directly or through other
    # assignments of the body (in any order: looser than the ordered scan)
    driven: Set[str] = set()
    changed = True
    while changed:
        changed = False
        for reads, roots, model in assigns:
            if (model or reads & driven) and not roots <= driven:
                driven |= roots
                changed = True
    return bool(read_first & driven)


def _added(stmt: ast.stmt) -> Optional[Tuple[List[ast.expr], ast.expr]]:
    """``xs.append(v)`` as a statement: ([xs], v) -- the container and what
    it takes (``steps.APPEND_METHODS``); None for anything else."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.args
            and call.func.attr in APPEND_METHODS and not isinstance(call.args[-1], ast.Starred)):
        return None
    return [call.func.value], call.args[-1]


def _blocks(stmt: ast.stmt) -> List[List[ast.stmt]]:
    """The blocks of a ``match`` or ``try`` statement (a ``try``'s
    ``finally`` last)."""
    if isinstance(stmt, ast.Match):
        return [case.body for case in stmt.cases]
    return [stmt.body, stmt.orelse] + [h.body for h in stmt.handlers] + [stmt.finalbody]  # type: ignore[attr-defined]


def reads_every_pass(loop: ast.AST) -> bool:
    """A loop whose own level may read a tensor on the host on every pass
    (an ``assert``, or a call ``steps.READ_CALLS`` names): the loose side of
    what the barrier asks of a loop inside a model's forward."""
    for stmt in loop.body:  # type: ignore[attr-defined]
        if isinstance(stmt, ast.Assert):
            return True
        if isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.If)) and any(
                isinstance(n, ast.Call) and last_name(n.func) in READ_CALLS
                for n in ast.walk(stmt.test if isinstance(stmt, ast.If) else stmt)):
            return True
    return False



def draws_every_pass(loop: ast.AST) -> bool:
    """A loop whose own level may draw random numbers for the device on
    every pass (``torch.randn_like(x)``, ``torch.randn(s, device=d)``,
    ``x.normal_()``) and walks no modules (a layer loop calls what it
    walks): the loose side of the sampler written as a module's ``forward``
    that the barrier takes (``barriers.StepBarrier._draws``)."""
    calls = [n for stmt in loop.body if not isinstance(stmt, _OWN_STOP)  # type: ignore[attr-defined]
             for n in _own(stmt) if isinstance(n, ast.Call)]
    walked = set(target_names(loop.target, attributes=False)) \
        if isinstance(loop, (ast.For, ast.AsyncFor)) else set()  # type: ignore[attr-defined]
    if any(isinstance(c.func, ast.Name) and c.func.id in walked for c in calls):
        return False
    return any(_device_draw(c) for c in calls)


def _device_draw(call: ast.Call) -> bool:
    name = last_name(call.func)
    if isinstance(call.func, ast.Attribute) and name in RANDOM_FILLS:
        return True
    return name in RANDOM_DRAWS and (name.endswith("_like") or any(k.arg == "device" for k in call.keywords))
