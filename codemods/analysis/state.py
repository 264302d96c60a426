"""Which loops carry a model's output from one iteration to the next, and
which calls run a model (a part of :mod:`codemods.analysis.loops`).

* a **model call** is decided by the dataflow first
  (:mod:`codemods.analysis.values`): the callee holds a model, is a function
  of the module that returns a model's output, or is known to be something
  else; only when that has no answer does the called name decide
  (``steps.called_like_a_model``: ``model``, ``unet``, ``*sampler*``, ``denois``...);
* **carried state** is a dotted key (``x``, ``block.latents``, the ``d`` of
  ``d[k]``) read in the body before it is written on every path, and
  written from a value that depends on a model call; it is **fed back** when
  a model call's input comes from such state.
"""

from __future__ import annotations

from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple, Union

import libcst as cst

from codemods.analysis.steps import APPEND_METHODS, called_like_a_model
from codemods.analysis.dataflow import dataflow
from codemods.analysis.values import (
    LOADED,
    LR_SCHEDULER,
    MODULE,
    OPTIMIZER,
    SAMPLER,
    SCALER,
    Values,
    definitely_not,
)
from codemods.syntax.tree import call_name, children, dotted, find_all, node_types, walk

Loop = Union[cst.For, cst.While]
_NESTED = (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)
_DEFS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)

def _root(node: cst.CSTNode, through_calls: bool = True) -> cst.CSTNode:
    """The leftmost part of ``a.b[c].d(e).f``: ``a`` (``d(e)`` itself when not
    ``through_calls``)."""
    kinds = (cst.Call, cst.Attribute, cst.Subscript) if through_calls else (cst.Attribute, cst.Subscript)
    while isinstance(node, kinds):
        node = node.func if isinstance(node, cst.Call) else node.value
    return node


def _is_model_call(call: cst.Call, layers: Set[str], values: Optional[Values] = None) -> bool:
    """A call that runs a model or a sampler step.  The dataflow decides
    first: the callee holds a model (``policy = Policy().to(dev)``), is a
    function of the module that runs one, or is known to be something else.
    When it cannot tell, the called name itself (``self.unet(...)``,
    ``scheduler.step(...)``, ``p_sample(...)``) does, never its receiver
    (``step_size.unsqueeze(-1)`` is no step)."""
    callee = dotted(call.func) or ""
    if callee == "self":
        return True  # a module running itself (nanoGPT's generate: `logits, _ = self(idx_cond)`)
    if callee.split(".")[0] in layers:
        return False
    if values is not None:
        known = _model_call_by_dataflow(call, values)
        if known is not None:
            return known
    return called_like_a_model(callee)


def _model_call_by_dataflow(call: cst.Call, values: Values) -> Optional[bool]:
    """True/False when the dataflow knows whether ``call`` runs a model (or
    takes a sampler step); None when it cannot tell."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "step":
        kinds = values.of(func.value)
        if SAMPLER in kinds:
            return True
        if kinds & {OPTIMIZER, SCALER, LR_SCHEDULER}:
            return False
    # only a plain name or `self.x` can be bound to a model or to a function
    # of the module; `torch.cat`, `x.view`, `self.vae.decode` are answered by name
    if isinstance(func, cst.Attribute) and not (isinstance(func.value, cst.Name) and func.value.value == "self"):
        return None
    if not isinstance(func, (cst.Name, cst.Attribute)) or values.tree.import_qualnames(func):
        return None
    local = dataflow(values.tree).local_function(call)
    if isinstance(local, cst.FunctionDef):
        # its body is known: whatever it is called (helios' `sample_block_noise`
        # draws noise), it runs a model only if a model runs in it
        return runs_model(local, values)
    if isinstance(local, cst.ClassDef):
        return False  # building an object
    kinds = values.of(func)
    if kinds & {MODULE, LOADED}:
        return True  # a model, or something unpickled that is called: a model
    return False if definitely_not(kinds, MODULE) else None


def runs_model(fn: cst.FunctionDef, values: Values) -> bool:
    """A function of the module that returns a model's output: a return value
    computed (through the function's own assignments) from a model or
    sampler call -- ``p_sample(x, t)`` returns the denoised ``x``; a loader
    that calls a model once to build its weights and returns the model does
    not count."""
    memo = values.tree.memo
    key = f"runs_model:{id(fn)}"
    if key not in memo:
        memo[key] = False  # recursion: no more than what is known
        driven: Set[str] = set()

        def from_model(value: cst.CSTNode) -> bool:
            if {n.value for n in find_all(value, cst.Name)} & driven:
                return True
            return any(_is_model_call(c, set(), values) for c in find_all(value, cst.Call, stop=_DEFS))  # type: ignore[arg-type]

        assigns = [n for n in walk(fn.body, _DEFS) if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign))]
        for _ in range(3):  # (the walk is not in source order: a few rounds reach the fixed point)
            before = len(driven)
            for node in assigns:
                value = node.value  # type: ignore[attr-defined]
                if value is not None and from_model(value):
                    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]  # type: ignore[attr-defined]
                    for t in targets:
                        driven |= {n.value for n in find_all(t, cst.Name)}
            if len(driven) == before:
                break
        memo[key] = any(r.value is not None and from_model(r.value)  # type: ignore[attr-defined]
                        for r in find_all(fn.body, cst.Return, stop=_DEFS))
    return bool(memo[key])


def _carries_model_state(loop: Loop, layers: Set[str], values: Optional[Values] = None) -> Optional[str]:
    """State carried from one iteration to the next through a model call, over
    any number of statements: a name read in the body before it is written
    on every path, and written from a value that depends (through earlier
    assignments of this iteration) on a model/sampler call -- ``outs =
    p_sample(img, t); img, x0 = outs`` or ``eps = model(x, t); x = a * x - b *
    eps``.  A write under an ``if`` without an ``else`` that writes it too
    may not happen: what is read after it may still come from the last step."""
    flow = _IterationFlow(loop, layers, values)
    flow.scan(_block(loop.body), set())
    return flow.carried()


class _IterationFlow:
    """One iteration of a loop's body, statement by statement: what it reads
    before writing, what its model calls drive, what each write comes from."""

    def __init__(self, loop: Loop, layers: Set[str], values: Optional[Values]) -> None:
        self.layers, self.values = layers, values
        self.read_first: Set[str] = set()
        self.driven: Set[str] = set()
        self.driven_below: Set[str] = set()  # what the keys of driven are below (`x` for `x.grad`)
        self.every_write: Set[str] = set()
        # per assigned value: what its inputs read (directly or through keys), and whether it calls a model
        self.model_reads: List[Tuple[Set[str], "_Lazy"]] = []
        self.derived: Dict[str, Set[str]] = {}  # key -> read-first keys its value came from
        self.below: Dict[str, Set[str]] = {}  # key -> the keys of derived it covers, itself left out
        self.counters = {n.value for n in find_all(loop.target, cst.Name)} if isinstance(loop, cst.For) else set()
        self.guarded: Dict[str, Set[str]] = {}  # condition -> what its `if` body wrote

    def assign(self, node: cst.CSTNode, written: Set[str]) -> None:
        value = node.value  # type: ignore[attr-defined]
        if value is None:
            return
        reads = _chains(value)
        if isinstance(node, cst.AugAssign):
            reads |= state_keys(node.target)
        fresh = {r for r in reads if not _covered(r, written)}  # read before this iteration writes them
        self.read_first.update(fresh)
        targets: Set[str] = set()
        for t in ([t.target for t in node.targets] if isinstance(node, cst.Assign)  # type: ignore[attr-defined]
                  else [node.target]):  # type: ignore[attr-defined]
            if isinstance(t, cst.Subscript) and {n.value for e in t.slice for n in find_all(e, cst.Name)} & self.counters:
                continue  # `out[b] = ...`: this iteration's own slot, not state for the next one
            targets |= state_keys(t)
        targets = {k for k in targets if k.split(".")[0] not in self.layers}
        # what this value comes from, in terms of keys read before they are written
        sources = set(fresh)
        for r in reads:
            for k in _prefixes(r):  # the keys that cover r ...
                if k in self.derived:
                    sources |= self.derived[k]
            for k in self.below.get(r, ()):  # ... and those r covers
                sources |= self.derived[k]
        calls = find_all(value, cst.Call, stop=_DEFS)
        # (whether a call runs a model is the costly question: asked only
        # where the answer changes something, and once per value)
        layers, values = self.layers, self.values
        model = _Lazy(lambda: any(_is_model_call(c, layers, values) for c in calls))  # type: ignore[arg-type]
        self.model_reads.append((sources, model))
        if any(_covered(r, self.driven) or r in self.driven_below for r in reads) or model():  # (r overlaps a driven key)
            self.driven.update(targets)
            self.driven_below.update(p for k in targets for p in _prefixes(k)[:-1])
        for k in targets:
            self.derived[k] = sources
            for p in _prefixes(k)[:-1]:
                self.below.setdefault(p, set()).add(k)
        written.update(targets)
        self.every_write.update(targets)

    def scan(self, stmts: Iterable[cst.CSTNode], written: Set[str]) -> Set[str]:
        """Walk statements in order; the names written on every path after them."""
        for stmt in stmts:
            if isinstance(stmt, _NESTED):
                continue  # a nested loop's or function's assignments are its own
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                        self.assign(small, written)
                    elif isinstance(small, cst.Expr) and (added := _added(small.value)) is not None:
                        self.assign(added, written)
            elif isinstance(stmt, cst.If):
                written = self.branches(stmt, written)
            elif isinstance(stmt, cst.With):
                written = self.scan(_block(stmt.body), written)
            elif isinstance(stmt, (cst.Try, cst.TryStar)):
                self.scan(_block(stmt.body), set(written))
                for handler in stmt.handlers:
                    self.scan(_block(handler.body), set(written))
                if stmt.orelse is not None:
                    self.scan(_block(stmt.orelse.body), set(written))
                if stmt.finalbody is not None:
                    written = self.scan(_block(stmt.finalbody.body), written)
            elif isinstance(stmt, cst.Match):
                for case in stmt.cases:
                    self.scan(_block(case.body), set(written))
        return written

    def branches(self, node: cst.If, written: Set[str]) -> Set[str]:
        # `if cfg: a, b = x.chunk(2)` ... `if cfg and scale > 0: use(b)`: under
        # the same condition, what the first wrote is this iteration's
        conditions = _conjuncts(node.test)
        inside = set(written).union(*(self.guarded.get(c, set()) for c in conditions))
        then = self.scan(_block(node.body), inside)
        for c in conditions:
            self.guarded.setdefault(c, set()).update(then - written)
        if isinstance(node.orelse, cst.If):
            other = self.branches(node.orelse, set(written))
        elif isinstance(node.orelse, cst.Else):
            other = self.scan(_block(node.orelse.body), set(written))
            if _leaves(node.orelse.body):
                return then  # `else: raise ...`: what runs on comes from the other branches
        else:
            other = set(written)
        return other if _leaves(node.body) else then & other

    def carried(self) -> Optional[str]:
        """"feedback" (a model call's input comes from state this loop itself
        rewrites), "carried" (state a model call drives), or None."""
        carried = {r for r in self.read_first if any(_overlap(d, r) for d in self.driven)}
        if not carried:
            return None
        state = {r for r in self.read_first if any(_overlap(w, r) for w in self.every_write)}
        if any(any(_overlap(a, b) for a in reads for b in state) and model() for reads, model in self.model_reads):
            return "feedback"
        return "carried"


class _Lazy:
    """A yes/no answer computed on first use."""

    __slots__ = ("compute", "answer")

    def __init__(self, compute: Callable[[], bool]) -> None:
        self.compute: Optional[Callable[[], bool]] = compute
        self.answer = False

    def __call__(self) -> bool:
        if self.compute is not None:
            self.answer, self.compute = self.compute(), None
        return self.answer


def _added(value: cst.BaseExpression) -> Optional[cst.Assign]:
    """``xs.append(v)`` read as the write of ``xs`` from ``v`` it is (the
    container and what it takes, ``steps.APPEND_METHODS``) -- a write that
    reads nothing of ``xs``: collecting outputs carries no state, reading
    ``xs[-1]`` before it does; None for anything else."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.args
            and value.func.attr.value in APPEND_METHODS and not value.args[-1].star):
        return None
    target = value.func.value
    if not isinstance(target, (cst.Name, cst.Attribute, cst.Subscript)):
        return None
    return cst.Assign(targets=[cst.AssignTarget(target=target)], value=value.args[-1].value)


def assigned_keys(stmt: cst.CSTNode) -> FrozenSet[str]:
    """What a statement assigns (:func:`state_keys` of each of its targets:
    ``x``, ``self.h``, the ``y`` of ``y[i] = ...``), not in functions it defines."""
    out: Set[str] = set()
    for node in find_all(stmt, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.For),
                         stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda)):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]  # type: ignore[attr-defined]
        for target in targets:
            out |= state_keys(target)
    return frozenset(out)


def state_keys(target: cst.CSTNode) -> Set[str]:
    """What an assignment target writes, as dotted keys: ``x``, ``a`` and
    ``b`` of ``a, b``, ``block_state.latents`` (one attribute, not the whole
    object), the ``d`` of ``d[k]``."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return {k for e in target.elements for k in state_keys(e.value)}
    if isinstance(target, cst.StarredElement):
        return state_keys(target.value)
    if isinstance(target, cst.Subscript):
        target = target.value
        while isinstance(target, cst.Subscript):
            target = target.value
    key = dotted(target)
    if key:
        return {key}
    root = _root(target, through_calls=False)
    return {root.value} if isinstance(root, cst.Name) else set()


def _chains(node: cst.CSTNode) -> Set[str]:
    """The dotted names a value reads: ``block_state.guess_mode``, ``x`` (of
    ``x.view(...)``: ``x.view``)."""
    found: Set[str] = set()
    stack = [node]
    while stack:  # (exact types: these node classes have no subclasses)
        n = stack.pop()
        kind = type(n)
        if (kind is cst.Call and call_name(n) in _METADATA_CALLS) or (
                kind is cst.Attribute and n.attr.value in _METADATA_ATTRS):  # type: ignore[attr-defined]
            continue  # `torch.zeros_like(x)`, `x.shape`: x's shape, not its value
        if (kind in _ELEMENT_COMPS and type(n.elt) is cst.Call  # type: ignore[attr-defined]
                and call_name(n.elt) in _METADATA_CALLS):  # type: ignore[attr-defined]
            continue  # `[torch.zeros_like(d) for d in xs]`: shapes only
        if kind is cst.Name or kind is cst.Attribute:
            key = dotted(n)
            if key:
                found.add(key)
                continue
        if kind in _DEF_TYPES:
            continue
        stack.extend(children(n))
    return found


_ELEMENT_COMPS = node_types((cst.ListComp, cst.SetComp, cst.GeneratorExp))
_DEF_TYPES = node_types(_DEFS)


_METADATA_CALLS = {"zeros_like", "ones_like", "empty_like", "full_like", "len", "isinstance", "size", "dim", "numel"}
_METADATA_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad"}


def _covers(written: str, read: str) -> bool:
    """A read of ``read`` is of what ``written`` wrote (``x`` covers ``x.grad``)."""
    return read == written or read.startswith(written + ".")


def _prefixes(key: str) -> List[str]:
    """``a``, ``a.b``, ``a.b.c`` for ``a.b.c``: the keys that cover it."""
    out = []
    at = key.find(".")
    while at > 0:
        out.append(key[:at])
        at = key.find(".", at + 1)
    out.append(key)
    return out


def _covered(read: str, written: Set[str]) -> bool:
    """Some key of ``written`` covers ``read`` (:func:`_covers`): found by
    the read's own dotted prefixes, not a pass over ``written``."""
    return any(p in written for p in _prefixes(read))


def _overlap(a: str, b: str) -> bool:
    return _covers(a, b) or _covers(b, a)


def _conjuncts(test: cst.BaseExpression) -> Set[str]:
    """The ``and``-ed parts of a condition, as code (``self.x`` read as ``x``:
    diffusers tests a local ``do_classifier_free_guidance`` and then the
    property of the same name)."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _conjuncts(test.left) | _conjuncts(test.right)
    text = cst.Module(body=[]).code_for_node(test).strip()
    return {text[5:] if text.startswith("self.") else text}


def _block(suite: cst.BaseSuite) -> List[cst.CSTNode]:
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    return [cst.SimpleStatementLine(body=suite.body)] if isinstance(suite, cst.SimpleStatementSuite) else []


def _leaves(suite: cst.BaseSuite) -> bool:
    """A block that ends in ``raise``/``return``/``break``/``continue``: the
    iteration does not go on from it to the statements after."""
    stmts = _block(suite)
    return bool(stmts) and ends_flow(stmts[-1])


def ends_flow(stmt: cst.CSTNode) -> bool:
    """A statement line that holds ``continue``/``break``/``return``/``raise``."""
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, (cst.Continue, cst.Break, cst.Return, cst.Raise)) for s in stmt.body)
