"""Python ints that change every iteration ("counters"), and the host
sequences of ints they are drawn from.

A device tensor indexed by a Python int bakes the int into its graph
(``alphas[i]`` is a ``select`` whose index is an attribute of the op), so an
index that changes every iteration compiles a new graph every iteration
(XLA407).  A ``for`` loop's target is such an int when the loop runs over

* ``range(...)``: the target;
* ``enumerate(xs)``: the index, and the items too when ``xs`` is a host int
  sequence;
* ``zip(a, b, ...)``: each element drawn from a host int sequence
  (``for t, t_next in zip(times[:-1], times[1:])``), also through a name
  bound to the zip (``pairs = list(zip(...))``) and a progress bar around it;
* a host int sequence.

A *host int sequence* is ``range(...)``, ``reversed``/``list``/``sorted``/
``tuple`` of one, a slice of one, ``t.tolist()`` (a host copy), a list or
tuple of int literals, a comprehension of ``int(...)`` or over one,
``numpy.arange(...)``, or a name every binding that reaches it binds one.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.dataflow import dataflow
from codemods.analysis.objects import object_methods
from codemods.syntax.nodes import dotted
from codemods.syntax.tree import TreeCache, call_name, find_all

_WRAPPERS = {"reversed", "list", "sorted", "tuple"}
# progress bars hand on the items of what they wrap; so does list() of an iterator
_PASS_THROUGH = {"tqdm", "track", "progress_bar", "list"}


def loop_counters(tree: TreeCache, loop: cst.For) -> Set[str]:
    """The names ``loop``'s target binds to a host int that changes every
    iteration (read once per loop and tree: every call in the loop asks)."""
    key = f"counters:{id(loop)}"
    found = tree.memo.get(key)
    if found is None:
        found = tree.memo[key] = frozenset(_derived(loop, _bound(tree, loop.target, loop.iter, set())))
    return found  # type: ignore[return-value]


_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide, cst.Modulo)


def _derived(loop: cst.For, counters: Set[str]) -> Set[str]:
    """``counters`` and the names the loop's body binds to int arithmetic of
    them and nothing else (``start = batch * size``, ``end = start + size``):
    they change every iteration too."""
    if not counters:
        return counters
    stores: Dict[str, List[Optional[cst.BaseExpression]]] = {}
    for node in find_all(loop.body, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.WithItem, cst.NamedExpr),
                         stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda)):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            stores.setdefault(node.targets[0].target.value, []).append(node.value)
            continue
        target = node.asname.name if isinstance(node, cst.WithItem) and node.asname else getattr(node, "target", None)
        for name in find_all(target, cst.Name) if target is not None else ():
            stores.setdefault(name.value, []).append(None)  # (bound some other way)
    found = set(counters)
    while True:
        more = {name for name, values in stores.items() if name not in found and all(
            v is not None and int_arithmetic(v) and {n.value for n in find_all(v, cst.Name)} & found for v in values)}
        if not more:
            return found
        found |= more


def int_arithmetic(node: cst.BaseExpression, attributes: bool = False) -> bool:
    """Names (and ``a.b`` where ``attributes``), ints and ``+ - * // %`` of
    them (``/`` makes a float): no call, slice or subscript."""
    if isinstance(node, (cst.Name, cst.Integer)) or (attributes and isinstance(node, cst.Attribute)):
        return True
    if isinstance(node, cst.BinaryOperation):
        return isinstance(node.operator, _ARITHMETIC) and int_arithmetic(node.left, attributes) \
            and int_arithmetic(node.right, attributes)
    if isinstance(node, cst.UnaryOperation):
        return isinstance(node.operator, cst.Minus) and int_arithmetic(node.expression, attributes)
    return False


def _bound(tree: TreeCache, target: cst.BaseExpression, it: cst.BaseExpression, busy: Set[int]) -> Set[str]:
    it = _passed_through(it)
    if isinstance(target, cst.Name):
        return {target.value} if is_host_int_sequence(tree, it, busy) else set()
    if isinstance(it, cst.Name) and id(it) not in busy:  # `time_pairs = list(zip(...))`, then iterated
        flow = dataflow(tree)
        sources = [flow.source(b) for b in flow.reaching(it)]
        if len(sources) == 1 and isinstance(sources[0][0], cst.BaseExpression) and not sources[0][1]:
            return _bound(tree, target, sources[0][0], busy | {id(it)})
        return set()
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(it, cst.Call):
        return set()
    parts = [e.value for e in target.elements]
    args = [a.value for a in it.args if a.keyword is None and not a.star]
    name = call_name(it)
    if name == "enumerate" and len(parts) == 2 and args:
        index = {parts[0].value} if isinstance(parts[0], cst.Name) else set()
        return index | _bound(tree, parts[1], args[0], busy)
    if name == "zip" and len(parts) == len(args) and not any(a.star for a in it.args):
        return set().union(*(_bound(tree, p, a, busy) for p, a in zip(parts, args)))
    return set()


def _passed_through(it: cst.BaseExpression) -> cst.BaseExpression:
    """What a loop really iterates: ``tqdm(pairs, desc=...)`` and
    ``list(zip(...))`` give the items of their first argument."""
    while isinstance(it, cst.Call) and call_name(it) in _PASS_THROUGH and it.args and it.args[0].keyword is None \
            and not it.args[0].star and (call_name(it) != "list" or len(it.args) == 1):
        it = it.args[0].value
    return it


def is_host_int_sequence(tree: TreeCache, node: Optional[cst.CSTNode], busy: Optional[Set[int]] = None) -> bool:
    """``node`` is a sequence of Python ints that lives on the host."""
    busy = set() if busy is None else busy
    if node is None or id(node) in busy:
        return False
    busy = busy | {id(node)}  # the nodes on this path (a cycle guard), not every node seen
    if isinstance(node, cst.Call):
        name, args = call_name(node), [a.value for a in node.args if a.keyword is None and not a.star]
        quals = tree.import_qualnames(node.func) or set()
        if isinstance(node.func, cst.Name) and name == "range" and not quals:
            return True
        if isinstance(node.func, cst.Name) and name in _WRAPPERS and len(args) == 1 and not quals:
            return is_host_int_sequence(tree, args[0], busy)
        if isinstance(node.func, cst.Attribute) and name == "tolist" and not node.args:
            return True
        return "numpy.arange" in quals
    if isinstance(node, cst.Subscript):
        slices = node.slice
        return (len(slices) == 1 and isinstance(slices[0].slice, cst.Slice)
                and is_host_int_sequence(tree, node.value, busy))
    if isinstance(node, (cst.List, cst.Tuple)):
        return bool(node.elements) and all(isinstance(e.value, cst.Integer) for e in node.elements)
    if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
        elt = node.elt
        if isinstance(elt, cst.Call) and call_name(elt) == "int" and isinstance(elt.func, cst.Name):
            return True
        return (isinstance(elt, cst.Name) and node.for_in.inner_for_in is None
                and elt.value in _bound(tree, node.for_in.target, node.for_in.iter, busy))
    if isinstance(node, cst.Name):
        return _name_holds_ints(tree, node, busy)
    return False


def _name_holds_ints(tree: TreeCache, name: cst.Name, busy: Set[int]) -> bool:
    flow = dataflow(tree)
    reaching = flow.reaching(name)
    if not reaching:
        return False
    for binding in reaching:
        value, path = flow.source(binding)
        if path or value is None or isinstance(value, cst.For) or not is_host_int_sequence(tree, value, busy):
            return False
    return True



# -- a counter passed to a helper that indexes a device tensor with it ---------


class ThroughCall(NamedTuple):
    """``get_batch(source, i)`` in a loop whose counter is ``i``, where the
    module's ``get_batch`` indexes or slices ``source`` with its parameter:
    the callee, and each such subscript of it with the tensor it reads (the
    caller's argument, or a device tensor the callee reaches itself) and the
    counter that reaches it."""

    function: cst.FunctionDef
    hits: List[Tuple[cst.Subscript, cst.BaseExpression, str]]  # (subscript, tensor, parameter)
    passed: Dict[str, cst.BaseExpression]  # parameter -> the caller's argument
    tests: List[Tuple[cst.Comparison, str]] = []  # (a test the callee reads as a bool, parameter): host_tests


def counter_through_call(tree: TreeCache, call: cst.Call, counters: Set[str], tensors: Set[str],
                         callee: Optional[Tuple[TreeCache, cst.FunctionDef]] = None) -> Optional[ThroughCall]:
    """What ``call`` hands a loop counter to, to index a device tensor with
    (XLA407 reports it on the call; XLA411 rewrites the callee's slice).  A
    subscript whose index is a tensor already (a rewritten one) is data, not
    a counter.

    ``callee``: the function called and its tree, where it is another
    module's (``from utils import get_batch``); None: the module's own
    function that ``call`` names.  An argument this tree cannot tell is a
    tensor (a name bound by another module's function) counts as one there
    where the callee uses its parameter as only a tensor is used
    (``source.size(1)``: :func:`codemods.analysis.tensors.used_as_tensor`)."""
    from codemods.analysis.placement import DEVICE, HOST, placement
    from codemods.analysis.tensors import used_as_tensor

    if not counters:
        return None
    fn_tree, fn = callee if callee is not None else (
        tree, dataflow(tree).local_function(call) or next(iter(object_methods(tree, call)), None))
    if not isinstance(fn, cst.FunctionDef):
        return None
    params = [p for p in list(fn.params.posonly_params) + list(fn.params.params)
              if not (p.name.value == "self" and isinstance(call.func, cst.Attribute))]
    passed = {p.name.value: a.value for p, a in zip(params, [a for a in call.args if a.keyword is None and not a.star])}
    passed.update({a.keyword.value: a.value for a in call.args if a.keyword is not None})
    by_counter = {p for p, arg in passed.items() if _names(arg) & counters}
    if not by_counter:
        return None
    hits = []
    for sub in _subscripts(fn.body):
        if any(isinstance(e.slice, cst.Index) and _calls(e.slice.value) for e in sub.slice):
            continue  # indexed with a tensor made from the int: data
        used = set().union(*(_names(e.slice) for e in sub.slice))
        if not used & by_counter:
            continue
        base = sub.value
        if isinstance(base, cst.Name) and base.value in passed:  # a tensor the caller passes
            tensor = passed[base.value]
            if base.value in by_counter or placement(tree, tensor) == HOST or (
                    isinstance(tensor, cst.Name) and tensor.value not in tensors and placement(tree, tensor) is None
                    and (callee is None or not used_as_tensor(fn, base.value))):
                continue
        elif placement(fn_tree, base) == DEVICE:  # one the callee reaches itself (`self.alphas`)
            tensor = base
        else:
            continue
        hits.append((sub, tensor, sorted(used & by_counter)[0]))
    tests = host_tests(fn, by_counter)
    return ThroughCall(fn, hits, passed, tests) if hits or tests else None


def _tensor_chain(node: cst.BaseExpression) -> Tuple[cst.BaseExpression, List[str]]:
    """``torch.as_tensor(i).long().to(d)`` -> (the call it starts from,
    the methods after it: ``["to", "long"]``, last first)."""
    methods: List[str] = []
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
            node.func.attr.value in _TENSOR_METHODS:
        methods.append(node.func.attr.value)
        node = node.func.value
    return node, methods


def made_tensor(node: cst.BaseExpression) -> bool:
    """``torch.as_tensor(i)``, ``torch.full((n,), i)``, and those moved,
    cast or reshaped (``.to(device)``, ``.long()``, ``.unsqueeze(0)``)."""
    start, _ = _tensor_chain(node)
    return isinstance(start, cst.Call) and (dotted(start.func) or "") in _TENSOR_MAKERS


_TENSOR_METHODS = frozenset({"to", "cuda", "long", "int", "unsqueeze", "reshape", "view", "expand", "repeat"})
_TENSOR_MAKERS = frozenset({"torch.as_tensor", "torch.tensor", "torch.full", "torch.LongTensor", "torch.IntTensor"})


def sent_to_device(node: cst.BaseExpression) -> bool:
    """A tensor :func:`made_tensor` makes and moves to a device
    (``torch.as_tensor(i).to(device)``, ``torch.tensor([i], device=d)``)."""
    if not made_tensor(node):
        return False
    start, methods = _tensor_chain(node)
    return bool({"to", "cuda"} & set(methods)) or \
        any(a.keyword is not None and a.keyword.value == "device" for a in start.args)  # type: ignore[attr-defined]


_COMPARE = (cst.Equal, cst.NotEqual, cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)


def host_tests(fn: cst.FunctionDef, params: Set[str]) -> List[Tuple[cst.Comparison, str]]:
    """The comparisons of one of ``params`` with a Python number that ``fn``
    reads as a bool: the test of an ``if``, ``while``, conditional expression
    or ``assert``, or a part of one joined by ``and``/``or``/``not``
    (``if t == 0:`` in a scheduler's step).  Where the parameter holds a
    device tensor, each is a read on the host, a graph execution of its own.
    None in a nested function or class, nor of a parameter ``fn`` binds
    again."""
    found: List[Tuple[cst.Comparison, str]] = []

    def tests_in(node: cst.BaseExpression) -> None:
        if isinstance(node, cst.BooleanOperation):
            tests_in(node.left)
            tests_in(node.right)
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            tests_in(node.expression)
        elif isinstance(node, cst.Comparison) and len(node.comparisons) == 1 \
                and isinstance(node.comparisons[0].operator, _COMPARE):
            left, right = node.left, node.comparisons[0].comparator
            for name, other in ((left, right), (right, left)):
                if isinstance(name, cst.Name) and name.value in params and not name.lpar and _number(other):
                    found.append((node, name.value))

    for test in find_all(fn.body, (cst.If, cst.While, cst.IfExp, cst.Assert), stop=_NESTED):
        tests_in(test.test)  # type: ignore[attr-defined]
    if found:
        bindings = find_all(fn.body, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr,
                                      cst.AsName))
        rebound = {n.value for b in bindings for n in find_all(getattr(b, "target", None) or b.name, cst.Name)}  # type: ignore[attr-defined]
        found = [(c, p) for c, p in found if p not in rebound]
    return found


_NESTED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _number(node: cst.BaseExpression) -> bool:
    """An int or float literal, signed or not (``0``, ``-1``, ``0.5``)."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float)) and not node.lpar


def _names(node: cst.CSTNode) -> Set[str]:
    return {n.value for n in find_all(node, cst.Name)}  # type: ignore[attr-defined]


def _calls(node: cst.CSTNode) -> bool:
    return bool(find_all(node, cst.Call))


def _subscripts(node: cst.CSTNode) -> List[cst.Subscript]:
    return find_all(node, cst.Subscript)  # type: ignore[return-value]
