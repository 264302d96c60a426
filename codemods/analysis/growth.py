"""Tensors a loop grows: ``x = torch.cat((x, new), ...)`` in a loop's body,
with no other assignment there that makes ``x`` afresh, lengthens ``x`` by
one piece an iteration -- a new shape (and graph) at every step (XLA408),
a length that starts short (XLA160: a slice of its last ``n`` is out of
range on XLA until it has grown to ``n``), and a sequence a generation loop
lengthens by one token every step (:func:`token_growth`, XLA414)."""

from __future__ import annotations

from typing import Callable, FrozenSet, Iterable, List, NamedTuple, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import target_names
from codemods.analysis.syncs import is_barrier_call
from codemods.syntax.tree import call_name, find_all

_CATS = ("cat", "concat", "concatenate")


def grown_by(node: cst.Assign, loop: cst.CSTNode, qualnames: Callable[[cst.CSTNode], Set[str]]) -> Set[str]:
    """The names the assignment ``node`` (in ``loop``'s body) grows."""
    value = node.value
    if not (isinstance(value, cst.Call) and call_name(value) in _CATS and value.args
            and any(q.startswith("torch.") for q in qualnames(value.func))):
        return set()
    parts = value.args[0].value
    if not isinstance(parts, (cst.Tuple, cst.List)):
        return set()
    grown = {t.target.value for t in node.targets if isinstance(t.target, cst.Name)}
    names = {e.value.value for e in parts.elements if isinstance(e.value, cst.Name)}
    # grown only when carried from the last iteration: no other assignment
    # in the loop makes it afresh (`x = torch.cat([zeros_like(x), x])`
    # after `x = controlnet(...)` doubles this step's value once)
    for other in find_all(loop.body, (cst.Assign, cst.AnnAssign), stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda)):  # type: ignore[attr-defined]
        if other is not node:
            targets = other.targets if isinstance(other, cst.Assign) else [other]  # type: ignore[attr-defined]
            grown -= {n.value for t in targets for n in find_all(t.target, cst.Name)}
    return grown & names


def grown_in(loop: cst.CSTNode, qualnames: Callable[[cst.CSTNode], Set[str]]) -> Set[str]:
    """Every name ``loop`` grows."""
    return {name for a in find_all(loop.body, cst.Assign, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda))  # type: ignore[attr-defined]
            for name in grown_by(a, loop, qualnames)}  # type: ignore[arg-type]


# -- a sequence grown one token a step (generation) ----------------------------

_SOFTMAX = ("softmax", "log_softmax")
# arithmetic that keeps the shape of its left side's row (``logits / temperature``)
_ROW_OPERATORS = (cst.Divide, cst.Multiply, cst.Add, cst.Subtract)
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


class TokenGrowth(NamedTuple):
    """``for _ in range(n): ... seq = torch.cat((seq, token), dim=1)``: the
    sequence, the token, the statement that grows it (last in the body, but
    for barriers after it) and ``n``."""

    sequence: str
    token: str
    grows: cst.SimpleStatementLine
    steps: cst.BaseExpression


def token_growth(loop: cst.CSTNode, qualnames: Callable[[cst.CSTNode], Set[str]],
                 barrier: Callable[[cst.BaseStatement], bool]) -> Optional[TokenGrowth]:
    """The sequence ``loop`` lengthens by one token an iteration of ``for _
    in range(n)`` at most (a ``break``/``continue`` may skip the growth; no
    ``yield`` hands it out midway): grown by the last statement of the body (barriers,
    ``barrier``, may follow it), along dimension 1, by a token drawn as one
    column -- ``torch.multinomial(p, num_samples=1)``, or ``argmax(...,
    keepdim=True)`` / the indices of ``topk(..., k=1)`` of the last
    position's row (``logits[:, -1, :]``, through softmax and arithmetic).
    None for anything else."""
    if not (isinstance(loop, cst.For) and loop.orelse is None and isinstance(loop.iter, cst.Call)
            and call_name(loop.iter) == "range" and len(loop.iter.args) == 1 and loop.iter.args[0].keyword is None
            and isinstance(loop.iter.args[0].value, (cst.Name, cst.Attribute, cst.Integer))):
        return None
    body = list(loop.body.body)  # type: ignore[attr-defined]
    while body and barrier(body[-1]):
        body.pop()
    if not body or not isinstance(body[-1], cst.SimpleStatementLine) or len(body[-1].body) != 1:
        return None
    grows, assign = body[-1], body[-1].body[0]
    if not isinstance(assign, cst.Assign) or not grown_by(assign, loop, qualnames):
        return None
    parts = assign.value.args[0].value  # type: ignore[attr-defined]
    dim = [a.value for a in assign.value.args[1:]]  # type: ignore[attr-defined]
    if len(parts.elements) != 2 or len(dim) != 1 or not (isinstance(dim[0], cst.Integer) and dim[0].value == "1"):
        return None
    seq, token = (e.value for e in parts.elements)
    if not (isinstance(seq, cst.Name) and isinstance(token, cst.Name) and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name) and assign.targets[0].target.value == seq.value):
        return None
    if find_all(loop.body, cst.Yield, stop=_SCOPES) or not _one_token(body, token.value, qualnames):
        return None
    return TokenGrowth(seq.value, token.value, grows, loop.iter.args[0].value)


def _one_token(body: List[cst.BaseStatement], token: str, qualnames: Callable[[cst.CSTNode], Set[str]]) -> bool:
    """Is every binding of ``token`` in ``body`` one column of token ids?"""
    bound = False
    for k, statement in enumerate(body):
        for assign in find_all(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.WithItem),
                               stop=_SCOPES):
            if token not in _bound(assign):
                continue
            if not isinstance(assign, cst.Assign) or not _drawn_column(assign, token, body[:k], qualnames):
                return False
            bound = True
    return bound


def _bound(node: cst.CSTNode) -> Set[str]:
    """The names a binding statement binds (not those of a subscript or an
    attribute it writes: ``logits[mask] = 0`` binds nothing)."""
    return {n.value for t in _targets(node) for n in target_names(t)}


def _targets(node: cst.CSTNode) -> List[cst.CSTNode]:
    if isinstance(node, cst.Assign):
        return [t.target for t in node.targets]
    if isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
        return [node.target]
    return [node.asname.name] if isinstance(node, cst.WithItem) and node.asname is not None else []


def _drawn_column(assign: cst.Assign, token: str, before: List[cst.BaseStatement],
                  qualnames: Callable[[cst.CSTNode], Set[str]]) -> bool:
    value, target = assign.value, assign.targets[0].target if len(assign.targets) == 1 else None
    if not isinstance(value, cst.Call):
        return False
    name = call_name(value)
    args = {a.keyword.value if a.keyword else k: a.value for k, a in enumerate(value.args)}
    method = isinstance(value.func, cst.Attribute) and not qualnames(value.func)
    first = (value.func.value if method else args.get(0, args.get("input"))) if isinstance(value.func, cst.Attribute) \
        else args.get(0, args.get("input"))
    shift = 0 if method else 1  # (a method's own tensor is not among its arguments)
    if name == "multinomial" and isinstance(target, cst.Name):
        n = args.get("num_samples", args.get(shift))
        return isinstance(n, cst.Integer) and n.value == "1"
    if name == "argmax" and isinstance(target, cst.Name):
        keep = args.get("keepdim")
        return isinstance(keep, cst.Name) and keep.value == "True" and _last_row(first, before, qualnames)
    if name == "topk" and isinstance(target, cst.Tuple) and len(target.elements) == 2 \
            and isinstance(target.elements[1].value, cst.Name) and target.elements[1].value.value == token:
        k = args.get("k", args.get(shift))
        return isinstance(k, cst.Integer) and k.value == "1" and _last_row(first, before, qualnames)
    return False


def _last_row(expr: Optional[cst.CSTNode], before: List[cst.BaseStatement],
              qualnames: Callable[[cst.CSTNode], Set[str]], depth: int = 0,
              shadowed: FrozenSet[str] = frozenset()) -> bool:
    """Is ``expr`` the last position's row of a sequence's output
    (``logits[:, -1, :]``, ``logits[:, -1]``), through softmax, arithmetic
    with it on the left, ``torch.where`` choosing from it, and the names the
    statements ``before`` bind last -- a plain assignment, or an ``if``
    whose every assignment of the name keeps it such a row (top-k
    filtering: ``logits = torch.where(logits < v, -inf, logits)``)?
    ``shadowed``: names an ``if`` being read binds, which ``before`` cannot
    resolve."""
    if expr is None or depth > 8:
        return False
    deeper = depth + 1
    if isinstance(expr, cst.Subscript):
        parts = expr.slice
        return len(parts) in (2, 3) and isinstance(parts[1].slice, cst.Index) and _minus_one(parts[1].slice.value) \
            and all(isinstance(p.slice, cst.Slice) and p.slice.lower is None and p.slice.upper is None
                    for k, p in enumerate(parts) if k != 1)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _ROW_OPERATORS):
        return _last_row(expr.left, before, qualnames, deeper, shadowed)
    if isinstance(expr, cst.Call) and call_name(expr) in _SOFTMAX:
        inner = expr.func.value if isinstance(expr.func, cst.Attribute) and not qualnames(expr.func) else \
            (expr.args[0].value if expr.args else None)
        return _last_row(inner, before, qualnames, deeper, shadowed)
    if isinstance(expr, cst.Call) and "torch.where" in qualnames(expr.func) and len(expr.args) == 3 \
            and all(a.keyword is None for a in expr.args):
        return any(_last_row(a.value, before, qualnames, deeper, shadowed) for a in expr.args[1:])
    if isinstance(expr, cst.Name) and expr.value not in shadowed:
        for k in range(len(before) - 1, -1, -1):
            statement = before[k]
            binds = [a for a in find_all(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.WithItem),
                                         stop=_SCOPES) if expr.value in _bound(a)]
            if not binds:
                continue
            if isinstance(statement, cst.If):
                return _kept_in_branches(statement, expr.value, binds, before[:k], qualnames, deeper)
            assign = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and \
                len(statement.body) == 1 else None
            if not (isinstance(assign, cst.Assign) and binds == [assign] and len(assign.targets) == 1
                    and isinstance(assign.targets[0].target, cst.Name)):
                return False  # (bound by unpacking, in a loop or a with: cannot tell)
            return _last_row(assign.value, before[:k], qualnames, deeper, shadowed)
    return False


def _kept_in_branches(statement: cst.If, name: str, binds: List[cst.CSTNode], before: List[cst.BaseStatement],
                      qualnames: Callable[[cst.CSTNode], Set[str]], depth: int) -> bool:
    """Is ``name`` the last position's row after the ``if`` ``statement``,
    which binds it (``binds``)?  It was before, and each branch's every
    binding of it is a plain assignment whose value is such a row of
    ``name`` itself (a name the ``if`` binds otherwise cannot be told)."""
    if find_all(statement, (cst.For, cst.While, cst.With), stop=_SCOPES) or \
            not _last_row(cst.Name(name), before, qualnames, depth):
        return False
    others = frozenset(n for a in find_all(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.NamedExpr),
                                           stop=_SCOPES) for n in _bound(a)) - {name}
    return all(isinstance(a, cst.Assign) and len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name)
               and _last_row(a.value, before, qualnames, depth, others) for a in binds)


def _minus_one(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and _is_int(node.expression, 1)


class SequenceReads(NamedTuple):
    """How a generation loop reads the sequence it grows (all but the
    growth): ``length`` (``seq.size(1)``, ``seq.shape[1]``), ``windows``
    (``seq[:, -n:]`` -> ``n``) and ``whole`` (``seq`` itself)."""

    length: List[cst.CSTNode]
    windows: List[Tuple[cst.Subscript, cst.BaseExpression]]
    whole: List[cst.Name]


def sequence_reads(loop: cst.For, growth: TokenGrowth) -> Optional[SequenceReads]:
    """Every read of ``growth.sequence`` in ``loop``'s body but the growth,
    sorted by what it reads; None where one is none of those (or stands in
    a function or lambda, or a name binds it)."""
    seq = growth.sequence
    found = SequenceReads([], [], [])
    placed: Set[int] = set()
    for node in find_all(loop.body, (cst.Call, cst.Subscript)):
        if isinstance(node, cst.Call) and _method_of(node.func, seq, "size") and len(node.args) == 1 \
                and _is_int(node.args[0].value, 1):
            found.length.append(node)
        elif isinstance(node, cst.Subscript) and _method_of(node.value, seq, "shape") and len(node.slice) == 1 \
                and isinstance(node.slice[0].slice, cst.Index) and _is_int(node.slice[0].slice.value, 1):
            found.length.append(node)
        elif isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value == seq \
                and _last_columns(node) is not None:
            found.windows.append((node, _last_columns(node)))  # type: ignore[arg-type]
        else:
            continue
        placed.add(id(node.func.value if isinstance(node, cst.Call) else  # type: ignore[attr-defined]
                       node.value.value if isinstance(node.value, cst.Attribute) else node.value))
    skip = {id(n) for n in find_all(growth.grows, cst.Name)}
    for node in find_all(loop.body, (cst.Attribute, cst.Arg, cst.Param, cst.FunctionDef, cst.Lambda)):
        if isinstance(node, cst.Attribute):
            skip.add(id(node.attr))
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            skip.add(id(node.keyword))
        elif any(isinstance(n, cst.Name) and n.value == seq for n in find_all(node, cst.Name)) \
                and isinstance(node, (cst.Param, cst.FunctionDef, cst.Lambda)):
            return None
    stores = {id(n) for n in _stores(loop)}
    for name in find_all(loop.body, cst.Name):
        if name.value == seq and id(name) not in skip and id(name) not in placed:  # type: ignore[attr-defined]
            if id(name) in stores:
                return None
            found.whole.append(name)  # type: ignore[arg-type]
    return found if found.windows else None


def windowed_growth(loop: cst.CSTNode, qualnames: Callable[[cst.CSTNode], Set[str]],
                    barriers: Iterable[str]) -> Optional[TokenGrowth]:
    """The growth XLA414 rewrites in ``loop`` (XLA408 leaves it to it): one
    token a step, the sequence read through a window."""
    growth = token_growth(loop, qualnames, _barrier_statement(barriers, qualnames))
    return growth if growth is not None and sequence_reads(loop, growth) is not None else None  # type: ignore[arg-type]


def whole_growth(loop: cst.CSTNode, qualnames: Callable[[cst.CSTNode], Set[str]],
                 barriers: Iterable[str]) -> Optional[TokenGrowth]:
    """One token a step, as :func:`windowed_growth`, but the sequence read
    whole (``logits = model(idx)``): no buffer can take it (XLA408 reports
    it), and every step's graph has a new shape."""
    growth = token_growth(loop, qualnames, _barrier_statement(barriers, qualnames))
    if growth is None or windowed_growth(loop, qualnames, barriers) is not None:
        return None
    grows = {id(n) for n in find_all(growth.grows, cst.Name)}
    read = any(n.value == growth.sequence and id(n) not in grows for n in find_all(loop.body, cst.Name))  # type: ignore[attr-defined]
    return growth if read else None  # (a loop that feeds the model its last token and a cache: not this)


def _barrier_statement(barriers: Iterable[str], qualnames: Callable[[cst.CSTNode], Set[str]]) \
        -> Callable[[cst.BaseStatement], bool]:
    def barrier(statement: cst.BaseStatement) -> bool:
        return isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
            and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.Call) \
            and is_barrier_call(statement.body[0].value, barriers, qualnames)
    return barrier


def _stores(loop: cst.For) -> List[cst.CSTNode]:
    """The names the loop binds (targets of its body's bindings)."""
    out: List[cst.CSTNode] = []
    for node in find_all(loop.body, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.WithItem,
                                     cst.CompFor, cst.NamedExpr)):
        targets = _targets(node) if not isinstance(node, (cst.CompFor, cst.NamedExpr)) else [node.target]
        out.extend(n for t in targets for n in find_all(t, cst.Name))
    return out


def _method_of(node: cst.BaseExpression, seq: str, attr: str) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == seq \
        and node.attr.value == attr


def _is_int(node: cst.BaseExpression, value: int) -> bool:
    return isinstance(node, cst.Integer) and node.value == str(value)


def _last_columns(node: cst.Subscript) -> Optional[cst.BaseExpression]:
    """``n`` of ``seq[:, -n:]`` (``n`` a plain int expression), else None."""
    if len(node.slice) != 2:
        return None
    first, second = (e.slice for e in node.slice)
    if not (isinstance(first, cst.Slice) and first.lower is None and first.upper is None and first.step is None):
        return None
    if not (isinstance(second, cst.Slice) and second.upper is None and second.step is None
            and isinstance(second.lower, cst.UnaryOperation) and isinstance(second.lower.operator, cst.Minus)):
        return None
    n = second.lower.expression
    if find_all(n, (cst.Call, cst.Subscript)) or not isinstance(n, (cst.Name, cst.Attribute, cst.Integer,
                                                                      cst.BinaryOperation)):
        return None
    return n
