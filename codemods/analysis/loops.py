"""How xlaport recognises step loops, the hot region, tensors and loaders.

* a **step loop** carries state from one iteration to the next: its own body
  (not a nested loop's) calls ``.backward()``, an optimizer step, a sampling
  ``scheduler.step(x, t, ...)``, carries a model's output into the next
  iteration (a value read before it is written, rewritten from a model call
  through any number of statements), or calls a function of the same module
  that does one of these.  What is a model, an optimizer or a sampler comes
  from :mod:`codemods.analysis.values` (dataflow); name patterns decide
  only where that has no answer (a parameter no call site feeds).  Model
  calls and carried state are in :mod:`codemods.analysis.state`;
* the **hot region** is every step loop and every loop over a data loader,
  with whatever is nested inside them: code there runs once per step;
* **tensor names** are names that (as far as a syntactic look can tell) hold
  tensors: they come from torch calls, model calls, loader batches, or
  arithmetic on other tensors.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.calls import FunctionSet, called_functions
from codemods.analysis.objects import object_methods
from codemods.analysis.state import _carries_model_state, _root
from codemods.analysis.steps import LOADER_NAME_RE, SCALER_CALL_RE, callers_closure, takes_step_by_name
from codemods.analysis.syncs import (  # noqa: F401 -- part of this module's API
    _NESTED,
    Loop,
    QualNames,
    body_statements,
    has_barrier,
    is_barrier_call,
    syncing_functions,
)
from codemods.analysis.kinds import OBJECT
from codemods.analysis.values import (
    OPTIMIZER,
    SAMPLER,
    SCALER,
    UNKNOWN,
    Values,
)
from codemods.analysis.values import (
    values as values_of,
)
from codemods.syntax.tree import (
    TreeCache,
    call_name,
    children,
    dotted,
    find_all,
    node_types,
    tree_of,
)

_NESTED_TYPES = node_types(_NESTED)
_DEFS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)

_OPTIMIZER_RE = re.compile(r"(optim|^opt$|_opt$|^opt_|scaler)", re.IGNORECASE)
_SAMPLER_RE = re.compile(r"(scheduler|sampler|solver)", re.IGNORECASE)


def own_nodes(node: cst.CSTNode, kind: type) -> List[cst.CSTNode]:
    """Descendants of ``kind`` that belong to ``node``'s own level: not inside
    a nested loop, function, class or lambda."""
    return find_all(node, kind, stop=_NESTED)


def is_step_call(call: cst.Call, step_functions: Set[str], qualnames: QualNames,
                 values: Optional[Values] = None) -> bool:
    """A training or sampling step: ``.backward()``, an optimizer's or a
    scaler's ``step()``, a sampler's ``step(x, t, ...)``, or a call of a
    function of the module that takes one.  What the receiver holds is read
    from the dataflow (``values``); its name decides only when that cannot
    tell."""
    name = call_name(call)
    func = call.func
    receiver = dotted(func.value) if isinstance(func, cst.Attribute) else None
    if name == "backward":
        return True
    if name == "optimizer_step" and receiver is not None:
        return True
    if name == "step" and isinstance(func, cst.Attribute) and values is not None:
        kinds = values.of(func.value)
        if kinds & {OPTIMIZER, SCALER} or (SAMPLER in kinds and len(call.args) >= 2):
            return True
        if kinds and UNKNOWN not in kinds:
            return False  # an LR scheduler, a streamer, a helper object: no step of the model
    if name == "step" and receiver is not None:
        last = receiver.split(".")[-1]
        if _OPTIMIZER_RE.search(last):
            return True
        # another object's step(a, b) (a streamer, accelerate's scheduler
        # wrapper) is a step only when its output is carried to the next step (_carries_model_state)
        # (`*args, **kwargs` passed through is a wrapper's forwarding, not a sampling step)
        if _SAMPLER_RE.search(last) and sum(1 for a in call.args if not a.star) >= 2:
            return True
    if name is not None and scaler_step(call, values):
        return True
    if (type(func) is cst.Name or receiver == "self") and name in step_functions:
        # a function of the module of that name takes steps: this call, read
        # through the scopes, must run it (not a parameter named `train`, not
        # `self.train()` of a model whose module has a `def train`)
        return step_functions.called_by(call)  # type: ignore[attr-defined]
    return False


def scaler_step(call: cst.Call, values: Optional[Values] = None) -> bool:
    """``loss_scaler(loss, optimizer, clip_grad=...)``: a scaler object (by its
    name, :data:`steps.SCALER_CALL_RE`, where the dataflow knows no kind for
    it but a scaler's or an object's) called with the optimizer takes the
    backward and the step."""
    func = call.func
    name = dotted(func) if isinstance(func, (cst.Name, cst.Attribute)) else None
    last = (name or "").split(".")[-1]
    if not last or last[:1].isupper() or not SCALER_CALL_RE.search(last):
        return False  # (`GradScaler(...)` builds one)
    if values is not None:
        kinds = values.of(func)
        if kinds and not kinds & {SCALER, UNKNOWN, OBJECT}:
            return False  # (an object of the project's own class may be one: MAE's `NativeScalerWithGradNormCount`)
    return any(_an_optimizer(a.value, values) for a in call.args)


def _an_optimizer(node: cst.BaseExpression, values: Optional[Values]) -> bool:
    if values is not None and OPTIMIZER in values.of(node):
        return True
    last = (dotted(node) or "").split(".")[-1]
    return bool(last) and bool(_OPTIMIZER_RE.search(last)) and not SCALER_CALL_RE.search(last)


_MODEL_CODE = {"forward", "backward", "_forward", "__init__"}


def _is_model_method(name: str) -> bool:
    return name in _MODEL_CODE or name.startswith(("forward", "_forward"))


def model_functions(tree: TreeCache) -> Set[str]:
    """Code of the module that runs inside a model: module functions and
    ``Class.method``s reached, by a call or a reference, from a class's
    ``forward*``/``backward``/``__init__`` -- timm's ``forward_features``,
    xLSTM's ``mlstm_recurrent_sequence_native`` (kept as ``self.kernel_fn``).
    A name counts only where it is bound to that function (the scopes of
    :mod:`codemods.analysis.bindings`): a parameter ``train`` of some
    ``__init__`` is not the module's ``def train``."""
    module = tree.module
    # module-level functions, also those defined under an `if`/`try` (no class or def around them)
    defs = {fn.name.value: fn for fn in find_all(module, cst.FunctionDef, stop=(cst.FunctionDef, cst.ClassDef))
            if fn is not module}  # type: ignore[attr-defined]
    todo: List[tuple] = []
    methods: Dict[str, Dict[str, cst.FunctionDef]] = {}
    for cls in find_all(module, cst.ClassDef):
        body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()  # type: ignore[attr-defined]
        own = {fn.name.value: fn for fn in body if isinstance(fn, cst.FunctionDef)}
        methods[cls.name.value] = own  # type: ignore[attr-defined]
        todo += [(cls.name.value, fn) for name, fn in own.items() if _is_model_method(name)]  # type: ignore[attr-defined]
    found: Set[str] = set()
    while todo:
        cls_name, fn = todo.pop()
        attrs = {id(a.attr) for a in find_all(fn, cst.Attribute)}  # `x.train` names no function
        for node in find_all(fn, (cst.Name, cst.Attribute)):
            if (isinstance(node, cst.Name) and node.value in defs and node.value not in found
                    and id(node) not in attrs and _binds(tree, node, defs[node.value])):
                found.add(node.value)
                todo.append((None, defs[node.value]))
            elif (isinstance(node, cst.Attribute) and cls_name and isinstance(node.value, cst.Name)
                  and node.value.value == "self" and node.attr.value in methods.get(cls_name, {})):
                key = f"{cls_name}.{node.attr.value}"
                if key not in found:
                    found.add(key)
                    todo.append((cls_name, methods[cls_name][node.attr.value]))
    return found


def _binds(tree: TreeCache, name: cst.Name, fn: cst.FunctionDef) -> bool:
    """``name``, where it is read, is bound to ``fn`` (among others)."""
    return any(b is fn for b in binding_nodes(tree, name))


def _outside_classes(fn: cst.FunctionDef, parents: Dict[int, cst.CSTNode]) -> bool:
    cur = parents.get(id(fn))
    while cur is not None:
        if isinstance(cur, (cst.ClassDef, cst.FunctionDef)):
            return False
        cur = parents.get(id(cur))
    return True


def in_model_code(node: cst.CSTNode, parents: Dict[int, cst.CSTNode], called_by_models: Set[str] = frozenset()) -> bool:  # type: ignore[assignment]
    """``node`` is inside a class's ``forward``/``backward``/``__init__`` (an
    ``nn.Module`` or a ``torch.autograd.Function``), or in a module function
    they call: code that runs inside a step (or builds the model), never
    around one, so no loop there is a step loop."""
    cur = parents.get(id(node))
    while cur is not None:
        if isinstance(cur, cst.FunctionDef):
            parent = parents.get(id(cur))
            if cur.name.value in called_by_models and _outside_classes(cur, parents):
                return True
            cls = parents.get(id(parent)) if isinstance(parent, cst.IndentedBlock) else parent
            if isinstance(cls, cst.ClassDef) and (
                    _is_model_method(cur.name.value) or f"{cls.name.value}.{cur.name.value}" in called_by_models):
                return True
        cur = parents.get(id(cur))
    return False


def step_functions(module: cst.Module) -> FunctionSet:
    """The functions, methods and closures of this module that take a step
    -- their own body calls backward or an optimizer step, or calls another
    such function (``f()`` through the scopes, ``self.m()`` in the class;
    ``analysis.calls``), to any depth -- so that a loop calling one is a
    step loop too.  Computed once per tree (what a call's receiver holds
    comes from the dataflow, never from qualified names: the pre-check and
    every loop codemod get the same answer)."""
    tree = tree_of(module)
    found = tree.memo.get("step_functions")
    if not isinstance(found, FunctionSet):
        found = tree.memo["step_functions"] = _step_functions(tree)
    return found


def _step_functions(tree: TreeCache) -> FunctionSet:
    module = tree.module
    parents = tree.parents

    def owner(call: cst.Call) -> Optional[cst.FunctionDef]:
        """The function whose own body holds the call: its nearest enclosing
        function, loop, class or lambda must be that function, via its body
        (a function whose loop takes steps is a training run, not a step)."""
        child, cur = call, parents.get(id(call))
        while cur is not None and type(cur) not in _NESTED_TYPES:
            child, cur = cur, parents.get(id(cur))
        if type(cur) is not cst.FunctionDef or child is not cur.body:  # type: ignore[union-attr]
            return None
        return cur  # type: ignore[return-value]

    defs: Dict[int, cst.FunctionDef] = {}
    direct: Set[int] = set()
    by_name: Dict[str, List[cst.Call]] = {}  # the calls that may run a function of that name
    for call in find_all(module, cst.Call):
        # what the receiver of `x.step()` holds is read from the dataflow, as
        # for a loop's own calls (an optimizer however it is named; an LR
        # scheduler's step is none)
        if takes_step_by_name(call_name(call) or "") and is_step_call(
                call, set(), lambda n: set(), values_of(tree)):  # type: ignore[arg-type]
            fn = owner(call)  # type: ignore[arg-type]
            if fn is not None:
                defs[id(fn)] = fn
                direct.add(id(fn))
            continue
        func = call.func  # type: ignore[attr-defined]
        if type(func) is cst.Name:
            by_name.setdefault(func.value, []).append(call)  # type: ignore[arg-type]
        elif type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value == "self":
            by_name.setdefault(func.attr.value, []).append(call)  # type: ignore[arg-type]

    def callers(fid: int) -> List[int]:
        """The functions whose own body calls this one: only a call spelled
        with its name can run it (``analysis.calls``), so only those calls
        are resolved."""
        found = []
        for call in by_name.get(defs[fid].name.value, ()):
            fn = owner(call)
            if fn is not None and fn is not defs[fid] and any(c is defs[fid] for c in called_functions(tree, call) or ()):
                defs[id(fn)] = fn
                found.append(id(fn))
        return found

    return FunctionSet(tree, (defs[i] for i in callers_closure(direct, callers)))


def _state_moves_to_host(loop: Loop) -> bool:
    """``x = x.numpy()`` (or ``x.cpu().numpy()``) in the loop's own body: the
    state the loop carries lives on the host (an ONNX or NumPy pipeline)."""
    for assign in find_all(loop.body, cst.Assign, stop=_NESTED):
        value = assign.value  # type: ignore[attr-defined]
        if not (isinstance(value, cst.Call) and call_name(value) == "numpy"):
            continue
        node = _root(value)
        targets = {t.target.value for t in assign.targets if isinstance(t.target, cst.Name)}  # type: ignore[attr-defined]
        if isinstance(node, cst.Name) and node.value in targets:
            return True
    return False


def is_step_loop(loop: Loop, steps: Set[str], qualnames: QualNames, values: Optional[Values] = None) -> bool:
    return step_kind(loop, steps, qualnames, values) is not None


def step_kind(loop: Loop, steps: Set[str], qualnames: QualNames, values: Optional[Values] = None) -> Optional[str]:
    """Why ``loop`` is a step loop: ``"step"`` (it takes a training or
    sampling step), ``"feedback"`` (a model's output is carried to the next
    iteration and fed to the model again), ``"sample"`` (a sampler steps
    something this loop does not rewrite: panorama's per-view step),
    ``"carried"`` (a model's output is carried, accumulated, but not fed
    back); None when it is none."""
    layers = {n.value for n in find_all(loop.target, cst.Name)} if isinstance(loop, cst.For) else set()
    if _state_moves_to_host(loop):
        return None
    sampling = False
    for stmt in body_statements(loop):
        if isinstance(stmt, _NESTED):
            continue  # a nested loop's steps are its own (the epoch loop is not a step loop)
        for call in own_nodes(stmt, cst.Call):
            if is_step_call(call, steps, qualnames, values):  # type: ignore[arg-type]
                if not _is_sampler_step(call, values):  # type: ignore[arg-type]
                    return "step"
                sampling = True
    carried = _carries_model_state(loop, layers, values)
    if sampling:
        return "feedback" if carried == "feedback" else "sample"
    return carried


def accumulates_gradients(loop: Loop, steps: Set[str]) -> bool:
    """The loop's own steps are all ``.backward()``: it accumulates
    gradients for an optimizer step taken elsewhere (no optimizer step, no
    call of a function of the module that takes steps)."""
    calls = [c for st in body_statements(loop) if not isinstance(st, _NESTED)
             for c in own_nodes(st, cst.Call)]
    names = [call_name(c) for c in calls]  # type: ignore[arg-type]
    return "backward" in names and not any(
        n in ("step", "optimizer_step") or (n in steps and n != "backward") for n in names)


def last_optimizer_step(loop: Loop, steps: Set[str], qualnames: QualNames,
                        values: Optional[Values] = None) -> Optional[int]:
    """The index, in the loop's body, of the statement that takes its
    optimizer step: the last statement of the body's own level (not nested
    in an ``if``/``with``/loop) whose own calls take a training step other
    than ``.backward()`` (``optimizer.step()``, ``xm.optimizer_step(opt)``,
    ``loss = train_step(batch)``), with no step of any kind after it.  None
    when there is none (a sampling loop, a step taken under a condition)."""
    stmts = list(body_statements(loop))
    found: Optional[int] = None
    for i, stmt in enumerate(stmts):
        calls = [c for c in own_nodes(stmt, cst.Call)
                 if is_step_call(c, steps, qualnames, values)]  # type: ignore[arg-type]
        if not calls:
            continue
        if not isinstance(stmt, cst.SimpleStatementLine) or any(
                call_name(c) == "backward" or _is_sampler_step(c, values) for c in calls):  # type: ignore[arg-type]
            found = None  # a step after the candidate, or one nested or sampling
            continue
        found = i
    return found


def _is_sampler_step(call: cst.Call, values: Optional[Values]) -> bool:
    """``scheduler.step(x, t, ...)``: a sampler's step, not an optimizer's."""
    func = call.func
    if call_name(call) != "step" or not isinstance(func, cst.Attribute):
        return False
    kinds = values.of(func.value) if values is not None else frozenset()
    if kinds & {OPTIMIZER, SCALER}:
        return False
    return SAMPLER in kinds or bool(_SAMPLER_RE.search((dotted(func.value) or "").split(".")[-1]))


def loop_step_kind(tree: TreeCache, loop: Loop, steps: Set[str]) -> Optional[str]:
    """:func:`step_kind` of a loop of ``tree``, computed once per tree: the
    pre-check (``ModuleFacts``) and the loop codemods ask the same question
    (``step_kind`` reads no qualified names)."""
    key = f"step_kind:{id(loop)}"
    if key not in tree.memo:
        tree.memo[key] = step_kind(loop, steps, lambda n: set(), values_of(tree))
    return tree.memo[key]  # type: ignore[return-value]


def is_device_loader_expr(node: cst.CSTNode, names: Iterable[str], qualnames: QualNames) -> bool:
    """An MpDeviceLoader/ParallelLoader (or enumerate of one)."""
    if isinstance(node, cst.Call) and call_name(node) == "enumerate" and node.args:
        return is_device_loader_expr(node.args[0].value, names, qualnames)
    if isinstance(node, cst.Call):
        if qualnames(node.func) & set(names):
            return True
        return call_name(node) in {"MpDeviceLoader", "ParallelLoader", "per_device_loader"}
    return False


def loop_iterable(loop: cst.For) -> cst.BaseExpression:
    """The iterable a loop really walks: unwraps ``enumerate(x)``."""
    it = loop.iter
    if isinstance(it, cst.Call) and call_name(it) == "enumerate" and it.args:
        return it.args[0].value
    return it


# ------------------------------------------------------------------ pre-check


class ModuleFacts:
    """What a cheap read-only walk of a module can tell about its loops,
    computed once per tree and shared by every loop codemod's pre-check.

    It over-approximates: a loop counted here may still turn out not to be a
    step or loader loop once names are resolved, never the other way round.
    """

    def __init__(self, tree: TreeCache) -> None:
        module, source = tree.module, tree.source
        steps = step_functions(module)
        loops = find_all(module, (cst.For, cst.While))
        self.step_loops: List[cst.CSTNode] = [
            lp for lp in loops if loop_step_kind(tree, lp, steps) is not None  # type: ignore[arg-type]
        ]
        any_loader = b"DataLoader" in source
        self.loader_loops: List[cst.CSTNode] = [
            lp for lp in loops if isinstance(lp, cst.For) and (any_loader or _mentions_loader(lp.iter))
        ]
        self.step_methods: List[cst.CSTNode] = [
            fn for cls in find_all(module, cst.ClassDef) for fn in hot_methods(cls).values()  # type: ignore[arg-type]
        ]

    @property
    def hot_loops(self) -> List[cst.CSTNode]:
        return self.step_loops + self.loader_loops


def per_step_functions(module: cst.Module, loops: List[cst.CSTNode]) -> Dict[int, Tuple[List[str], cst.CSTNode]]:
    """``id(FunctionDef) -> (the chain of callers, the loop)`` for the
    module's functions that run once per step: called from one of ``loops``
    (a step or loader loop), directly or through other functions of the
    module (``["run_step", "forward_backward"]``: the loop calls
    ``run_step``, which calls ``forward_backward``, which calls this one).
    Calls are read through the scopes (``analysis.calls``): a module-level
    function, a closure, a method as ``self.name(...)`` in its class."""
    if not loops:
        return {}
    tree = tree_of(module)
    found: Dict[int, Tuple[List[str], cst.CSTNode]] = {}
    todo: List[tuple] = [(loop, [], loop) for loop in loops]
    while todo:
        node, chain, loop = todo.pop(0)  # breadth first: the shortest chain
        for call in find_all(node, cst.Call, stop=(cst.ClassDef, cst.Lambda)):
            for target in called_functions(tree, call) or object_methods(tree, call):  # type: ignore[arg-type]
                if id(target) not in found and target is not node:
                    found[id(target)] = (chain, loop)
                    todo.append((target, chain + [target.name.value], loop))
    return found


def module_facts(tree: TreeCache) -> ModuleFacts:
    return tree.analysis(ModuleFacts, "facts")


def _is_lazy_init(node: cst.If) -> bool:
    """``if self.step_index is None:`` -- a body that runs on the first step
    only (diffusers' schedulers find their index this way since 0.2x)."""
    test = node.test
    return (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Is)
            and isinstance(test.comparisons[0].comparator, cst.Name)
            and test.comparisons[0].comparator.value == "None"
            and isinstance(test.left, cst.Attribute))


def _calls_outside_lazy_init(fn: cst.FunctionDef) -> List[cst.Call]:
    calls: List[cst.Call] = []
    stack: List[cst.CSTNode] = [fn.body]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.If) and _is_lazy_init(node):
            stack.extend([node.test] + ([node.orelse] if node.orelse is not None else []))
            continue
        if isinstance(node, cst.Call):
            calls.append(node)
        stack.extend(children(node))
    return calls


def hot_methods(cls: cst.ClassDef) -> Dict[str, cst.FunctionDef]:
    """Methods of a class that run once per step: ``step`` (a scheduler's or
    an optimizer's), ``*_step``, and every method they call through ``self``
    (except under a first-step-only ``if self.x is None:`` guard)."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    methods: Dict[str, cst.FunctionDef] = {s.name.value: s for s in body if isinstance(s, cst.FunctionDef)}
    todo = [m for m in methods if m == "step" or (m.endswith("_step") and not m.startswith("set_"))]
    if not todo:
        return {}
    hot: Dict[str, cst.FunctionDef] = {}
    while todo:  # only the methods reached are read
        m = todo.pop()
        if m not in hot:
            hot[m] = methods[m]
            todo.extend({
                c.func.attr.value  # type: ignore[attr-defined]
                for c in _calls_outside_lazy_init(methods[m])
                if isinstance(c.func, cst.Attribute)  # type: ignore[attr-defined]
                and isinstance(c.func.value, cst.Name)  # type: ignore[attr-defined]
                and c.func.value.value == "self"  # type: ignore[attr-defined]
            } & set(methods))
    return hot


def _names_one_loader(name: str) -> bool:
    """``train_loader``, ``dl``: a loader; ``dataloaders``, ``loaders``: a
    container of them (iterating it walks loaders, not batches)."""
    return bool(LOADER_NAME_RE.search(name)) and not re.search(r"(loaders|dls)$", name, re.IGNORECASE)


def _mentions_loader(node: cst.CSTNode) -> bool:
    return any(
        (isinstance(n, cst.Name) and LOADER_NAME_RE.search(n.value))
        or (isinstance(n, cst.Attribute) and LOADER_NAME_RE.search(n.attr.value))
        for n in find_all(node, (cst.Name, cst.Attribute))
    )
