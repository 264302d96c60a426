"""What a training step reads on the host before its backward, and may read after its optimizer step.

pytorch/examples' imagenet records its meters between the forward and the
backward (``losses.update(loss.item(), images.size(0))``).  On XLA that read
runs the forward as a graph of its own, and the loader's sync (or the
barrier) then runs the backward and the step as another: two executions a
step, the forward computed twice.

The step's own lines -- ``zero_grad``, ``backward``, the optimizer's (or a
scaler's) ``step``, a gradient clip, a scaler's ``unscale_`` -- change the
parameters, their gradients and the optimizer's state, and nothing else a
line can see: moved before the lines that read, they leave every value those
lines read as it was.  That holds where the lines they move over

- use none of the step's objects (its optimizer, scaler, the model whose
  parameters it clips) -- the loss only for its value, never its ``.grad``;
- call nothing that may reach the parameters: no model, nor anything the body
  called on its way to the loss, nor a function of the module that does more
  than compute tensors (``analysis.tensor_functions``), nor a method of
  ``self``;
- bind nothing the step uses, and leave the body no other way (``return``,
  ``break``, ``continue``, ``raise``);
- are simple lines, or ``if`` blocks of such decided without a host read.

:func:`step_head` finds such a move where it removes every host read before
the step; the step's barrier then goes right after it, before the reads
(XLA302): one execution a step.
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple, Optional, Sequence, Set

import libcst as cst

from codemods.analysis.bindings import binding_scope
from codemods.analysis.loops import (
    _DEFS,
    body_statements,
    is_step_call,
    last_optimizer_step,
    loop_step_kind,
    scaler_step,
)
from codemods.analysis.placement import reads_truth
from codemods.analysis.step_tail import bound_names, reads_host
from codemods.analysis.objects import imported_def
from codemods.analysis.tensor_functions import tensor_function_call, torch_op
from codemods.analysis.tensors import is_tensor_expr
from codemods.syntax.nodes import call_name
from codemods.syntax.tree import TreeCache, find_all

QualNames = Callable[[cst.CSTNode], Iterable[str]]
TensorsOf = Callable[[cst.FunctionDef], Set[str]]

# the calls of a step's own lines besides its backward and optimizer step
_STEP_WORK = frozenset({"zero_grad", "unscale_", "clip_grad_norm_", "clip_grad_value_"})
# what reaches a model's parameters, their gradients or state from a tensor or a model
_PARAMETER_ATTRS = frozenset({"grad", "parameters", "named_parameters", "state_dict", "buffers", "modules"})
# methods that only a model has, or that run it (``model.forward(x)``, ``net.eval()``)
_MODEL_METHODS = frozenset({"forward", "eval", "train", "parameters", "named_parameters", "state_dict", "modules",
                            "children", "apply", "load_state_dict", "requires_grad_", "zero_grad", "generate"})
_NO_EXIT = (cst.Return, cst.Break, cst.Continue, cst.Raise, cst.Global, cst.Nonlocal, cst.Import, cst.ImportFrom)
# builtins that reach what a line cannot name
_REACHING = frozenset({"eval", "exec", "globals", "locals", "vars", "getattr", "setattr", "delattr", "__import__"})


class StepHead(NamedTuple):
    """``stmts[start:first]`` read the host before the step; ``stmts[first:end]``
    are the step's lines, which move before ``stmts[start]``."""
    start: int
    first: int
    end: int


class _Facts(NamedTuple):
    tree: TreeCache
    tensors: Set[str]
    qualnames: QualNames
    tensors_of: TensorsOf
    values: object
    is_closure: Callable[[cst.Call], bool]


def step_head(tree: TreeCache, loop: cst.CSTNode, steps: Set[str], tensors: Set[str], qualnames: QualNames,
              tensors_of: TensorsOf, values: object, is_closure: Callable[[cst.Call], bool]) -> Optional[StepHead]:
    """Where the step's lines may move before the host reads that precede
    them (see the module doc), or None: no such reads, or a line in the way.
    ``is_closure``: a call that hands a step closure over (its function runs
    at the barrier, after the step wherever it is handed over: only what it
    is handed now, its defaults, must not see the step)."""
    if loop_step_kind(tree, loop, steps) != "step":  # type: ignore[arg-type]
        return None
    stmts = body_statements(loop)  # type: ignore[arg-type]
    k = last_optimizer_step(loop, steps, qualnames, values)  # type: ignore[arg-type]
    if k is None:
        return None
    facts = _Facts(tree, tensors, qualnames, tensors_of, values, is_closure)
    first = k
    while first > 0 and (_step_line(stmts[first - 1], steps, qualnames, values)
                         or _feeds_step(facts, stmts[first - 1], stmts[first:k + 1])):
        first -= 1
    step = stmts[first:k + 1]
    if not any(call_name(c) == "backward" or scaler_step(c, values)  # type: ignore[arg-type]
               for s in step for c in find_all(s, cst.Call)):
        return None
    kept = _step_names(step, values) | _forward_callees(facts, stmts[:first]) | set().union(*map(bound_names, step))
    start = first
    used = set().union(*map(_names, step))
    while start > 0 and _may_follow(facts, stmts[start - 1], kept, used):
        start -= 1
    while start < first and not _reads(facts, stmts[start]):
        start += 1  # (what reads nothing stays before the step)
    if start == first or any(_reads(facts, s) for s in stmts[:start]):
        return None  # nothing to move over, or a read before that stays: two graphs a step all the same
    return StepHead(start, first, k + 1)


def _step_line(stmt: cst.CSTNode, steps: Set[str], qualnames: QualNames, values: object) -> bool:
    """A line of the step's own work: ``loss.backward()``, ``opt.zero_grad()``,
    ``clip_grad_norm_(model.parameters(), 1.0)``, ``scaler.step(opt)``."""
    return isinstance(stmt, cst.SimpleStatementLine) and not find_all(stmt, cst.NamedExpr) and all(
        isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)
        and (is_step_call(s.value, steps, qualnames, values) or call_name(s.value) in _STEP_WORK)  # type: ignore[arg-type]
        for s in stmt.body)


def _feeds_step(facts: _Facts, stmt: cst.CSTNode, step: Sequence[cst.BaseStatement]) -> bool:
    """A line that computes on the host what the step's lines after it take
    and nothing else reads first -- DeiT's ``is_second_order =
    hasattr(optimizer, "is_second_order") and optimizer.is_second_order``
    before ``loss_scaler(..., create_graph=is_second_order)``: a plain
    assignment of names, calling only what reaches no parameter, reading no
    tensor.  It moves with them."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return False
    assign = stmt.body[0]
    if not all(isinstance(t.target, cst.Name) for t in assign.targets) or find_all(stmt, (cst.NamedExpr, cst.Lambda)):
        return False
    bound = bound_names(stmt)
    return (bool(bound & set().union(*map(_names, step))) and not _reads(facts, stmt)
            and all(_known_call(facts, c, kept=set()) for c in find_all(stmt, cst.Call))  # type: ignore[arg-type]
            and not is_tensor_expr(assign.value, facts.tensors, facts.qualnames))


def _step_names(step: Sequence[cst.BaseStatement], values: object) -> Set[str]:
    """The names the step's lines use, but the loss they take back (used for
    its value it is read as it was: ``backward`` changes no value, nor does a
    scaler handed it first)."""
    out: Set[str] = set()
    for stmt in step:
        for call in find_all(stmt, cst.Call):
            func = call.func  # type: ignore[attr-defined]
            if call_name(call) == "backward" and isinstance(func, cst.Attribute):  # type: ignore[arg-type]
                receiver = func.value
                if isinstance(receiver, cst.Call) and receiver.args:  # `scaler.scale(loss).backward()`
                    out |= _names(receiver.func)
                continue
            args = list(call.args)  # type: ignore[attr-defined]
            if scaler_step(call, values) and args and isinstance(args[0].value, cst.Name) and args[0].keyword is None:
                args = args[1:]  # `loss_scaler(loss, optimizer, ...)`: the loss, as `loss.backward()`'s
            out |= _names(func) | {n for a in args for n in _names(a.value)}
    return out


def _forward_callees(facts: _Facts, stmts: Sequence[cst.BaseStatement]) -> Set[str]:
    """The names the body calls before the step as what may hold parameters:
    ``model`` of ``output = model(images)`` or ``model.forward(x)``,
    ``criterion``, ``self``."""
    out: Set[str] = set()
    for stmt in stmts:
        for call in find_all(stmt, cst.Call, stop=_DEFS):
            root = _root(call.func)  # type: ignore[attr-defined]
            if root is not None and (call_name(call) in _MODEL_METHODS  # type: ignore[arg-type]
                                     or not _known_call(facts, call, kept=set())):  # type: ignore[arg-type]
                out.add(root)
    return out


def _may_follow(facts: _Facts, stmt: cst.CSTNode, kept: Set[str], used: Set[str]) -> bool:
    """``stmt`` may run after the step (see the module doc): ``kept``, the
    names it must not use; ``used``, those the step's lines use (it must
    not bind them: ``loss = loss / accumulation``)."""
    if isinstance(stmt, cst.If):
        orelse = stmt.orelse
        return (not reads_truth(stmt.test, facts.tensors, facts.qualnames) and _uses_allowed(facts, stmt.test, kept)
                and _suite_may_follow(facts, stmt.body, kept, used)
                and (orelse is None or (_may_follow(facts, orelse, kept, used) if isinstance(orelse, cst.If)
                                        else _suite_may_follow(facts, orelse.body, kept, used))))
    if not isinstance(stmt, cst.SimpleStatementLine) or find_all(stmt, _NO_EXIT + (cst.FunctionDef, cst.ClassDef),
                                                                      stop=(cst.Lambda,)):
        return False
    if not all(_closure_function(facts, f) for f in find_all(stmt, cst.Lambda, stop=(cst.Lambda,))):
        return False
    if bound_names(stmt) & (kept | used):
        return False
    return _uses_allowed(facts, stmt, kept)


def _suite_may_follow(facts: _Facts, suite: cst.BaseSuite, kept: Set[str], used: Set[str]) -> bool:
    if isinstance(suite, cst.SimpleStatementSuite):  # `if i % 10 == 0: print(loss.item())`
        return _may_follow(facts, cst.SimpleStatementLine(body=suite.body), kept, used)
    return all(_may_follow(facts, s, kept, used) for s in suite.body)  # type: ignore[attr-defined]


def _closure_function(facts: _Facts, fn: cst.CSTNode) -> bool:
    """``fn`` (a lambda) is what a step closure is handed: ``xm.add_step_closure(lambda loss=loss: ...)``."""
    arg = facts.tree.parents.get(id(fn))
    call = facts.tree.parents.get(id(arg)) if isinstance(arg, cst.Arg) else None
    return isinstance(call, cst.Call) and facts.is_closure(call)


def _uses_allowed(facts: _Facts, node: cst.CSTNode, kept: Set[str]) -> bool:
    """What ``node`` does now (a step closure's function: its defaults) uses none of ``kept``,
    no parameter, and calls nothing that may reach one."""
    if _names(node) & kept:
        return False
    if any(a.attr.value in _PARAMETER_ATTRS for a in find_all(node, cst.Attribute, stop=(cst.Lambda,))):  # type: ignore[attr-defined]
        return False
    if not all(_known_call(facts, c, kept) for c in find_all(node, cst.Call, stop=(cst.Lambda,))):  # type: ignore[arg-type]
        return False
    return all(_uses_allowed(facts, p.default, kept) for f in find_all(node, cst.Lambda, stop=(cst.Lambda,))
               for p in f.params.params if p.default is not None)  # type: ignore[attr-defined]


def _known_call(facts: _Facts, call: cst.Call, kept: Set[str]) -> bool:
    """A call that reaches no parameter: a builtin, an imported function, a
    torch op, a tensor's method, a tensor function of the module, a method
    of an object of the body that is no model (a meter's ``update``)."""
    func = call.func
    names = set(facts.qualnames(func))
    if torch_op(names):
        return True
    if isinstance(func, cst.Name):
        if binding_scope(facts.tree, func) is None:
            return func.value not in _REACHING
        if names:
            return _imported_known(facts, call)  # (`from time import time`; `from util import log_stats`)
        return tensor_function_call(facts.tree, call, facts.qualnames, facts.tensors)
    if isinstance(func, cst.Attribute):
        if names and not any(q.startswith("torch.") for q in names):
            return True  # `time.time()`, `wandb.log(...)`
        if is_tensor_expr(func.value, facts.tensors, facts.qualnames):
            return True
        if isinstance(func.value, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
            return True  # `"loss {}".format(v)`: a string's method
        root = _root(func)
        kinds = facts.values.of(func.value) if facts.values is not None else frozenset()  # type: ignore[attr-defined]
        return root is not None and root != "self" and root not in kept and not (kinds & {"module", "loaded"})
    return False


def _imported_known(facts: _Facts, call: cst.Call) -> bool:
    """An imported function reaches no parameter: a library's (it sees only
    what it is handed), or a project module's whose own lines -- read there
    -- take no step, call no model's method and declare no global
    (``progress_bar(...)``, ``log_stats(...)``), or that only computes tensors."""
    found = imported_def(facts.tree, call.func, cst.FunctionDef)  # type: ignore[arg-type]
    if found is None:
        return True
    fn = found[1]
    if find_all(fn, (cst.Global, cst.Nonlocal)):
        return tensor_function_call(facts.tree, call, facts.qualnames, facts.tensors)
    reaching = _MODEL_METHODS | {"backward", "step", "optimizer_step", "clip_grad_norm_", "clip_grad_value_"}
    return not any(call_name(c) in reaching for c in find_all(fn, cst.Call))  # type: ignore[arg-type]


def _reads(facts: _Facts, stmt: cst.CSTNode) -> bool:
    return any(reads_host(facts.tree, c, facts.tensors, facts.qualnames, facts.tensors_of)  # type: ignore[arg-type]
               for c in find_all(stmt, cst.Call, stop=_DEFS))


def _root(node: cst.BaseExpression) -> Optional[str]:
    while isinstance(node, (cst.Attribute, cst.Subscript, cst.Call)):
        node = node.value if not isinstance(node, cst.Call) else node.func
    return node.value if isinstance(node, cst.Name) else None


def _names(node: cst.CSTNode) -> Set[str]:
    """The names ``node`` reads or binds now (not in a lambda: a step closure's
    runs at the barrier): not an attribute's (``opt.step``: ``opt``) or a keyword's."""
    parts = {id(a.attr) for a in find_all(node, cst.Attribute, stop=(cst.Lambda,))}  # type: ignore[attr-defined]
    parts |= {id(a.keyword) for a in find_all(node, cst.Arg, stop=(cst.Lambda,)) if a.keyword is not None}  # type: ignore[attr-defined]
    return {n.value for n in find_all(node, cst.Name, stop=(cst.Lambda,)) if id(n) not in parts}  # type: ignore[attr-defined]
