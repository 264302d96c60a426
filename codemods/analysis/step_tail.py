"""What follows a training step's optimizer step and can join the step's graph.

The step barrier goes right after the optimizer step when the body reads the
host after it (XLA302): the reads then find the step computed.  What the body
computes on the device after the step -- an accuracy from the step's outputs,
``_, predicted = outputs.max(1)`` and the sum in ``correct +=
predicted.eq(targets).sum().item()`` -- would be a graph of its own after the
barrier, run by the next read: two executions a step (kuangliu/pytorch-cifar,
the PyTorch CIFAR tutorial).  Before the barrier it is part of the step's one
graph, and the reads only copy.

:func:`device_only` says which lines only compute tensors; :func:`step_tail`
which of the lines after the barrier move before it (whole, or the tensor a
read computes, computed into a name first), without changing what any line
computes: a line moves over the lines it skips only when none of them binds
what it uses, uses or binds what it binds, or may change a tensor it uses.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import target_names
from codemods.analysis.calls import called_functions
from codemods.analysis.loops import body_statements, last_optimizer_step, loop_step_kind
from codemods.analysis.pass_reads import has_exit
from codemods.analysis.placement import host_read
from codemods.analysis.step_updates import update_call
from codemods.analysis.store_methods import reach_no_object, store_call, store_receiver
from codemods.analysis.tensor_functions import BUILTINS, draws_random, handed_names, names_only, tensor_function_call
from codemods.analysis.tensors import is_tensor_expr
from codemods.analysis.values import values as values_of
from codemods.syntax.nodes import call_name
from codemods.syntax.tree import TreeCache, find_all

QualNames = Callable[[cst.CSTNode], Iterable[str]]
TensorsOf = Callable[[cst.FunctionDef], Set[str]]
IsCall = Callable[[cst.Call], bool]
# methods that change what they are called on (beyond `*_` in-place ops)
_CHANGES = frozenset({"backward", "step", "zero_grad", "update", "append", "extend", "pop", "clear"})


def device_only(tree: TreeCache, stmt: cst.CSTNode, tensors: Set[str], qualnames: QualNames,
                functions: IsCall = lambda call: False) -> bool:
    """``stmt`` only computes tensors (``acc = (out.argmax(1) == y).float().mean()``,
    ``_, predicted = outputs.max(1)``): a line of assignments to names, each
    of a tensor expression whose every call is a torch op or a method of a
    tensor, none of them a host read, or a call ``functions`` accepts (a
    tensor function of the program, ``accuracy(out, y)[0]``).  Moved before
    a barrier, it joins the step's graph; after it, it is a graph of its own
    that the next read runs."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Assign):
            targets = [t.target for t in small.targets]
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)) and small.value is not None:
            targets = [small.target]
        else:
            return False
        if not all(names_only(t) for t in targets) or not computes(tree, small.value, tensors, qualnames,  # type: ignore[arg-type]
                                                                     functions):
            return False
    return True


def computes(tree: TreeCache, expr: cst.BaseExpression, tensors: Set[str], qualnames: QualNames,
             functions: IsCall = lambda call: False) -> bool:
    """``expr`` is a tensor computed by torch ops and tensor methods only,
    none a host read, or what a call ``functions`` accepts gives (indexed:
    ``accuracy(out, y)[0]``) of such arguments."""
    if not is_tensor_expr(expr, tensors, qualnames) and not _function_result(expr, functions):
        return False
    for call in find_all(expr, cst.Call):
        func = call.func  # type: ignore[attr-defined]
        torch_op = any(q.startswith("torch.") for q in qualnames(func))
        method = isinstance(func, cst.Attribute) and is_tensor_expr(func.value, tensors, qualnames)
        if not (torch_op or method or functions(call)) or host_read(tree, call, tensors, qualnames):  # type: ignore[arg-type]
            return False
    return not draws_random(expr)


def _function_result(expr: cst.BaseExpression, functions: IsCall) -> bool:
    while isinstance(expr, cst.Subscript):
        expr = expr.value
    return isinstance(expr, cst.Call) and functions(expr)


class StepTail(NamedTuple):
    """The lines after the barrier that join the step's graph: ``moved``,
    moved whole before it (their indices, in order); ``split``, a line whose
    host read reads a tensor it computes, by index: (that tensor, the name it
    is computed into before the barrier, ``correct_step``)."""
    moved: Tuple[int, ...]
    split: Dict[int, Tuple[cst.BaseExpression, str]]

    def __bool__(self) -> bool:
        return bool(self.moved or self.split)


def step_tail(tree: TreeCache, stmts: Sequence[cst.BaseStatement], k: int, tensors: Set[str],
              qualnames: QualNames, taken: Set[str]) -> StepTail:
    """Which of ``stmts[k:]`` (a barrier goes before ``stmts[k]``) join the
    step's graph; ``taken``: the names of the scope (a split's new name is
    none of them).  Stops at the first line that is not a simple one."""
    def functions(call: cst.Call) -> bool:  # a tensor function of the program (analysis.tensor_functions)
        return tensor_function_call(tree, call, qualnames, tensors)

    moved: List[int] = []
    split: Dict[int, Tuple[cst.BaseExpression, str]] = {}
    stays: List[cst.BaseStatement] = []
    # what the body's lines of tensor computations bind holds tensors (`acc1, acc5 = accuracy(...)`)
    computed = set(tensors) | {n for s in stmts if device_only(tree, s, tensors, qualnames, functions)
                               for n in bound_names(s)}
    for j in range(k, len(stmts)):
        stmt = stmts[j]
        if not isinstance(stmt, cst.SimpleStatementLine) or any(
                isinstance(s, (cst.Return, cst.Break, cst.Continue, cst.Raise)) for s in stmt.body):
            break
        if device_only(tree, stmt, tensors, qualnames, functions) and _may_skip(
                stmt, bound_names(stmt) | handed_names(stmt, functions), stays):
            moved.append(j)
            continue
        store = _store_line(tree, stmt, computed, qualnames)
        if store is not None and _may_skip(stmt, {store_receiver(store)}, stays) \
                and reach_no_object(tree, stays, computed, qualnames):
            moved.append(j)  # (`top1.update(acc1[0], n)`: the meter's sums join the step's graph)
            continue
        read = _computed_read(tree, stmt, tensors, qualnames, functions)
        if read is not None:
            receiver, target = read
            name = fresh_name(f"{target}_step", taken)
            if _may_skip(receiver, {name} | handed_names(receiver, functions), stays + [_without(stmt, receiver)]):
                split[j] = (receiver, name)
                taken.add(name)
        stays.append(stmt)
    return StepTail(tuple(moved), split)


def _store_line(tree: TreeCache, stmt: cst.SimpleStatementLine, tensors: Set[str],
                qualnames: QualNames) -> Optional[cst.Call]:
    """The call of a line that is one store call (``analysis.store_methods``)."""
    if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Expr) or not isinstance(stmt.body[0].value, cst.Call):
        return None
    call = stmt.body[0].value
    return call if store_call(tree, call, tensors, qualnames) else None


def bound_names(stmt: cst.CSTNode) -> Set[str]:
    """The names a line binds or deletes (``a, b = ...``, ``n := ...``, ``del a``)."""
    out: Set[str] = set()
    for small in find_all(stmt, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.Del)):
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]  # type: ignore[attr-defined]
        for t in targets:
            out |= {n.value for n in (target_names(t) if not isinstance(small, cst.Del) else find_all(t, cst.Name))}  # type: ignore[attr-defined]
    return out


def _names(node: cst.CSTNode) -> Set[str]:
    return {n.value for n in find_all(node, cst.Name)}  # type: ignore[attr-defined]


def _may_skip(node: cst.CSTNode, binds: Set[str], stays: List[cst.CSTNode]) -> bool:
    """``node`` (a line, or the tensor a read computes) may be computed
    before the lines ``stays``: none binds a name it uses or uses or binds
    one it binds, or calls what may change a tensor it uses."""
    uses = _names(node)
    for other in stays:
        if bound_names(other) & uses or binds & (_names(other) | bound_names(other)):
            return False
        for call in find_all(other, cst.Call):
            func = call.func  # type: ignore[attr-defined]
            if isinstance(func, cst.Attribute) and (func.attr.value.endswith("_") or func.attr.value in _CHANGES):
                if _names(func.value) & uses:
                    return False
            elif not (isinstance(func, cst.Name) and func.value in BUILTINS) and any(
                    _names(a.value) & uses for a in call.args):  # type: ignore[attr-defined]
                return False  # a function handed a tensor it uses may change it (not `len`)
    return True


def _computed_read(tree: TreeCache, stmt: cst.SimpleStatementLine, tensors: Set[str],
                   qualnames: QualNames, functions: IsCall) -> Optional[Tuple[cst.BaseExpression, str]]:
    """(the tensor, the name it is computed into) of a line ``t = <tensor>.item()``,
    ``t += <tensor>.item()`` or ``meter.update(<tensor>.item(), n)`` (any one
    host read) whose read computes the tensor it reads: named after the
    target (``t_step``), or the object or function the line calls (``meter_step``)."""
    if len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target: cst.BaseExpression = small.targets[0].target
    elif isinstance(small, cst.AugAssign):
        target = small.target
    elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = small.value.func  # `top1.update(...)`, `self.top1.update(...)`: top1; `record(...)`: record
        target = func.value if isinstance(func, cst.Attribute) else func
        target = cst.Name(target.attr.value) if isinstance(target, cst.Attribute) else target
    else:
        return None
    reads = [c for c in find_all(small.value, cst.Call) if host_read(tree, c, tensors, qualnames)]  # type: ignore[arg-type]
    if not isinstance(target, cst.Name) or len(reads) != 1:
        return None
    func = reads[0].func  # type: ignore[attr-defined]
    receiver = func.value if isinstance(func, cst.Attribute) else reads[0].args[0].value  # type: ignore[attr-defined]
    if isinstance(receiver, (cst.Name, cst.Attribute)) or not computes(tree, receiver, tensors, qualnames, functions):
        return None
    if _only_viewed(receiver):
        return None  # (`labels = [names[int(i)] for i in pred.flatten().tolist()]`, XLA416's: nothing to compute)
    return receiver, target.value


# methods that give another view of a tensor's values, computing none
VIEWS = frozenset({"flatten", "view", "reshape", "squeeze", "unsqueeze", "t", "contiguous", "detach", "ravel",
                   "view_as", "expand", "expand_as", "permute", "transpose", "narrow", "select", "data"})


def _only_viewed(expr: cst.BaseExpression) -> bool:
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in VIEWS:
        expr = expr.func.value
    return isinstance(expr, (cst.Name, cst.Attribute))


def _without(stmt: cst.SimpleStatementLine, receiver: cst.BaseExpression) -> cst.CSTNode:
    """The line with the tensor its read computes taken out (what stays)."""
    return stmt.deep_replace(receiver, cst.Name("_"))


def fresh_name(name: str, taken: Set[str]) -> str:
    """``name``, or ``name2``, ``name3``... the first not in ``taken``."""
    k, out = 2, name
    while out in taken:
        out, k = f"{name}{k}", k + 1
    return out


def step_end(tree: TreeCache, loop: cst.CSTNode, steps: Set[str], qualnames: QualNames) -> Optional[int]:
    """The index in a training step loop's body right after its optimizer
    step (``analysis.loops.last_optimizer_step``), the bookkeeping on the
    host that belongs with it (:func:`host_step`) and the updates of tensors
    on the device that follow it (an average of the weights:
    ``analysis.step_updates``): where the step's barrier goes when reads
    follow.  None for a loop that takes no such step."""
    k = last_optimizer_step(loop, steps, qualnames, values_of(tree))  # type: ignore[arg-type]
    if k is None or loop_step_kind(tree, loop, steps) != "step":  # type: ignore[arg-type]
        return None
    stmts = body_statements(loop)  # type: ignore[arg-type]
    k += 1
    while k < len(stmts) and (host_step(stmts[k]) or update_call(tree, stmts[k], qualnames)):
        k += 1
    return k


def host_step(stmt: cst.CSTNode) -> bool:
    """``lr_scheduler.step()`` / ``optimizer.zero_grad(set_to_none=True)``:
    bookkeeping on the host that belongs with the optimizer step (a ``step``
    with no argument: ``ReduceLROnPlateau.step(loss)`` reads a value)."""
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)
        and (call_name(s.value) == "zero_grad" or call_name(s.value) == "step" and not s.value.args)
        for s in stmt.body)


def evaluation_read(tree: TreeCache, loop: cst.CSTNode, steps: Set[str], tensors: Set[str], qualnames: QualNames,
                    tensors_of: TensorsOf, exits: Tuple[type, ...]) -> Optional[int]:
    """Where the barrier goes in a loop over a device loader with no
    optimizer step that reads the host every batch (kuangliu's `test`:
    `test_loss += loss.item()` for its progress line): right before the
    first read, at the loop's own level -- None where the body can end
    (``exits``, ``break``, ``return``) before it."""
    if loop_step_kind(tree, loop, steps) == "step":  # type: ignore[arg-type]
        return None
    stmts = body_statements(loop)  # type: ignore[arg-type]
    k = first_read(tree, stmts, tensors, qualnames, tensors_of)
    return None if k is None or has_exit(stmts, exits + (cst.Break, cst.Return)) else k


def first_read(tree: TreeCache, stmts: Sequence[cst.BaseStatement], tensors: Set[str],
               qualnames: QualNames, tensors_of: TensorsOf) -> Optional[int]:
    """The index of the first of ``stmts`` that reads a tensor on the host
    (:func:`reads_host`), where that is a simple line of the body's own
    level (None: none, or the first is inside a block)."""
    for j, stmt in enumerate(stmts):
        calls = find_all(stmt, cst.Call, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda))
        if any(reads_host(tree, c, tensors, qualnames, tensors_of) for c in calls):  # type: ignore[arg-type]
            return j if isinstance(stmt, cst.SimpleStatementLine) else None
    return None


def reads_host(tree: TreeCache, call: cst.Call, tensors: Set[str], qualnames: QualNames, tensors_of: TensorsOf,
               depth: int = 3) -> bool:
    """``call`` reads a tensor on the host: itself (``loss.item()``), or a
    function of the module it runs, on every path or not, up to ``depth``
    calls down (``record(step, loss, out)`` whose body reads ``loss.item()``:
    the read runs the pending step as a graph of its own, unless a barrier
    comes before the call).  ``tensors_of``: a function's tensor names."""
    if host_read(tree, call, tensors, qualnames):
        return True
    if depth == 0:
        return False
    for fn in called_functions(tree, call) or ():
        inner = tensors_of(fn)
        if any(reads_host(tree, c, inner, qualnames, tensors_of, depth - 1)  # type: ignore[arg-type]
               for c in find_all(fn.body, cst.Call, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda))):
            return True
    return False
