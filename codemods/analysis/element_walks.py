"""Walks over a tensor whose elements are only read as Python numbers.

``[itos[int(i)] for i in y]``, ``for t in ts: total += float(t)``: each
element of ``y`` is a tensor of its own (``Tensor.__iter__`` unbinds it), and
each ``int(i)`` reads one on the host.  Where every use of the element is such
a read -- ``int(i)``, ``float(i)``, ``bool(i)``, ``i.item()`` -- the walk over
``y.flatten().tolist()`` gives the same numbers (a one-element row reads as
its one number either way), read at once.

A walk is one only where that holds for certain: the element named by a plain
name; the tensor a plain name the walk never mentions again (its elements are
views: a write to it while walking would show in the ones still to come); for
a ``for`` loop, the element's name read nowhere else in its scope but in other
loops that bind it first (after the loop it holds a number, not a tensor).
Whether the tensor lives on the device, and whether the walk runs every step,
the rule asks (``codemods.element_reads``).

A *host walk* goes further: ``for t, p in zip(labels.view(-1), preds.view(-1)):
confusion[t.long(), p.long()] += 1`` (the forums' confusion matrix), the
CIFAR-10 tutorial's ``if label == prediction: correct[classes[label]] += 1``,
``[int(s * 10) for s in scores]``.  Each element is used only on the host:
read as a number or a truth, or as an index of a host tensor or container,
through nothing but arithmetic with numbers and the other elements and a
cast (``t.long()``).  Walking each tensor's host copy (``labels.view(-1).cpu()``)
gives the same elements -- tensors still, of the same values and dtypes, so
``t * 10`` computes as it did -- from one read.  A walk over ``zip(...)`` or
``enumerate(...)`` of such tensors counts (the others it walks are left as
they are); for a ``for`` loop, the elements' names are read nowhere else
in its scope, as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, FrozenSet, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from codemods.analysis.steps import SCALAR_READS
from codemods.syntax.nodes import number_literal
from codemods.syntax.tree import find_all

Comprehension = Union[cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp]


@dataclass(frozen=True)
class NumberWalk:
    """A walk whose elements are only read as numbers: its tensor, and the
    ``i.item()`` calls that read them (a number's own value once walked)."""

    tensor: cst.Name
    items: Tuple[cst.Call, ...]


def for_walk(loop: cst.For, scope: cst.CSTNode) -> Optional[NumberWalk]:
    """``for i in y:`` whose body reads ``i`` only as a number, ``i`` read in
    ``scope`` (its function, or the module) only where another loop binds
    it first; no ``else`` (it would run with ``i`` as the walk left it)."""
    if loop.asynchronous is not None or loop.orelse is not None:
        return None
    if not (isinstance(loop.target, cst.Name) and isinstance(loop.iter, cst.Name)):
        return None
    items = _reads_as_numbers([loop.body], loop.target.value, loop.iter.value)
    if items is None or read_elsewhere(scope, loop.target.value, loop):
        return None
    return NumberWalk(loop.iter, tuple(items))


def comprehension_walk(comp: Comprehension) -> Optional[NumberWalk]:
    """``[f(int(i)) for i in y if ...]`` (its first ``for``) reading ``i``
    only as a number; its name is the comprehension's own."""
    first = comp.for_in
    if first.asynchronous is not None or not (isinstance(first.target, cst.Name) and isinstance(first.iter, cst.Name)):
        return None
    parts: List[cst.CSTNode] = [*first.ifs, *([first.inner_for_in] if first.inner_for_in else [])]
    parts += [comp.key, comp.value] if isinstance(comp, cst.DictComp) else [comp.elt]
    items = _reads_as_numbers(parts, first.target.value, first.iter.value)
    return None if items is None else NumberWalk(first.iter, tuple(items))


def _reads_as_numbers(parts: Sequence[cst.CSTNode], element: str, tensor: str) -> Optional[List[cst.Call]]:
    """The ``element.item()`` calls in ``parts``, where every use of
    ``element`` there is a number read and ``tensor`` is not named; else None."""
    items: List[cst.Call] = []
    stack: List[cst.CSTNode] = list(parts)
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call):
            read = _number_read(node, element)
            if read == "item":
                items.append(node)
                continue
            if read == "scalar":
                continue
        if isinstance(node, cst.Name) and node.value in (element, tensor):
            return None
        stack.extend(node.children)
    return items


def _number_read(call: cst.Call, element: str) -> Optional[str]:
    """``int(element)``/``float``/``bool``: "scalar"; ``element.item()``: "item"."""
    func = call.func
    if (isinstance(func, cst.Name) and func.value in SCALAR_READS and len(call.args) == 1
            and not call.args[0].keyword and not call.args[0].star
            and isinstance(call.args[0].value, cst.Name) and call.args[0].value.value == element):
        return "scalar"
    if (isinstance(func, cst.Attribute) and func.attr.value == "item" and not call.args
            and isinstance(func.value, cst.Name) and func.value.value == element):
        return "item"
    return None


def read_elsewhere(scope: cst.CSTNode, name: str, loop: cst.For) -> bool:
    """Is ``name`` used in ``scope`` outside ``loop``, other than in a loop
    or comprehension that binds it before its body reads it?"""
    stack: List[cst.CSTNode] = [scope]
    while stack:
        node = stack.pop()
        if node is loop:
            continue
        if isinstance(node, cst.For) and isinstance(node.target, cst.Name) and node.target.value == name:
            stack.append(node.iter)  # (its body reads what it bound; its `else` may not)
            if node.orelse is not None:
                stack.append(node.orelse)
            continue
        if isinstance(node, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)) \
                and isinstance(node.for_in.target, cst.Name) and node.for_in.target.value == name:
            stack.append(node.for_in.iter)  # (a comprehension's name is its own)
            continue
        if isinstance(node, cst.Name) and node.value == name:
            return True
        stack.extend(node.children)
    return False


@dataclass(frozen=True)
class HostWalk:
    """A walk whose elements are only used on the host: the tensors it
    walks (the arguments of its ``zip``/``enumerate``, or its iterable),
    each to be walked as its host copy."""

    tensors: Tuple[cst.BaseExpression, ...]
    places: Tuple[int, ...]  # their places among the arguments of the zip/enumerate; () for the iterable itself


Predicate = Callable[[cst.BaseExpression], bool]


def host_walk(target: cst.BaseAssignTargetExpression, iterable: cst.BaseExpression, parts: Sequence[cst.CSTNode],
              is_tensor: Predicate, on_host: Predicate) -> Optional[HostWalk]:
    """The host walk (see the module doc) of ``target`` over ``iterable``
    whose body is ``parts``, or None.  ``is_tensor``: an expression is a
    tensor; ``on_host``: a subscripted value lives on the host (a host
    tensor, a tuple of class names)."""
    pairs = element_pairs(target, iterable)
    walked = [(name, tensor) for name, tensor in pairs or () if is_tensor(tensor)]
    wrapped = isinstance(iterable, cst.Call)
    places = tuple(i for i, a in enumerate(iterable.args) if any(a.value is t for _, t in walked)) if wrapped else ()
    if not walked or not all(pure_walked(t) and not pair_of_tensors(t) for _, t in walked):
        return None
    elements = {name for name, _ in walked}
    roots = {root(t).value for _, t in walked}  # type: ignore[union-attr]  # (pure: each has one)
    if len(elements) < len(walked) or roots & elements:
        return None
    if any(isinstance(n, cst.Name) and n.value in roots for p in parts for n in find_all(p, cst.Name)):
        return None  # (the tensor named while it is walked: a write would show in the elements to come)
    if not all(host_only(p, Elements(elements), on_host) for p in parts):
        return None
    return HostWalk(tuple(t for _, t in walked), places)


def walked_by(iterable: cst.BaseExpression) -> Tuple[Optional[str], List[cst.BaseExpression]]:
    """What a walk takes elements of: ``("zip", its arguments)``,
    ``("enumerate", [its first])``, or ``(None, [the iterable])``."""
    if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name) and iterable.func.value in (
            "zip", "enumerate") and not any(a.star or a.keyword is not None for a in iterable.args):
        args = [a.value for a in iterable.args]
        return iterable.func.value, args if iterable.func.value == "zip" else args[:1]
    return None, [iterable]


def element_pairs(target: cst.CSTNode, iterable: cst.BaseExpression) -> Optional[List[Tuple[str, cst.BaseExpression]]]:
    """(element name, what it is an element of): ``for t, p in zip(a, b)``
    -> t of a, p of b; ``for i, x in enumerate(a)`` -> x of a (``i`` is a
    number); ``for x in a`` -> x of a."""
    kind, walked = walked_by(iterable)
    if kind is None:
        return [(target.value, iterable)] if isinstance(target, cst.Name) else None
    names = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else None
    if names is None or not all(isinstance(e, cst.Name) for e in names):
        return None
    values = [e.value for e in names]  # type: ignore[attr-defined]
    if kind == "zip":
        return list(zip(values, walked)) if len(values) == len(walked) else None
    return [(values[1], walked[0])] if len(iterable.args) == 1 and len(values) == 2 else None  # type: ignore[attr-defined]


# tensor methods that make a new tensor of the one they read, the walked expression may apply
_WALKED_OPS = frozenset({"view", "reshape", "flatten", "squeeze", "detach", "long", "int", "float", "argmax",
                         "max", "min", "sigmoid", "softmax", "round", "t", "contiguous", "clone"})
# what an element may be turned into before it is read (its value the same kind of number)
_CASTS = frozenset({"long", "int", "float", "double", "bool", "abs", "round", "squeeze", "flatten"})
_TERMINAL = frozenset({"item", "tolist"})


def pure_walked(node: cst.BaseExpression) -> bool:
    """A name, an attribute, or those through tensor ops with numbers
    (``labels.view(-1)``, ``outputs.max(1)[0].sigmoid()``)."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        return True
    if isinstance(node, cst.Subscript):
        return pure_walked(node.value) and all(isinstance(e.slice, cst.Index) and number_literal(e.slice.value)
                                         for e in node.slice)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _WALKED_OPS:
        return all(a.keyword is None and not a.star and number_literal(a.value) for a in node.args) and pure_walked(node.func.value)
    return False


def pair_of_tensors(node: cst.BaseExpression) -> bool:
    """``x.max(1)``: the values and the indices, a tuple (not a tensor) to walk."""
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in (
        "max", "min") and bool(node.args)


def root(node: cst.BaseExpression) -> Optional[cst.Name]:
    """The name a walked expression starts from (``labels`` of ``labels.view(-1)``); None for anything else
    (a list, a call of a function)."""
    while not isinstance(node, cst.Name):
        if isinstance(node, (cst.Subscript, cst.Attribute)):
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        else:
            return None
    return node


@dataclass(frozen=True)
class IndexWalk:
    """``for i in range(n)`` whose body takes elements of device tensors by
    the counter (``labels[i]``, the old CIFAR-10 tutorial's count per class)
    and uses them only on the host: the tensors, by name, each to be indexed
    as a host copy made right before the loop."""

    tensors: Tuple[str, ...]  # (those whose elements every pass takes: a copy of one taken only sometimes
    aliases: Tuple[str, ...]  # the names bound to their elements (``label``)       would read more than it saves)


def index_walk(loop: cst.For, is_tensor: Predicate, on_host: Predicate) -> Optional[IndexWalk]:
    """The index walk of ``loop`` (see :class:`IndexWalk`), or None.  Each
    ``X[i]`` is a use on the host, as a host walk's element is, or the value
    of a name bound once in the body (``label = labels[i]``) whose uses are;
    ``X`` is named nowhere else in the loop (not written, not resized), and
    such a name is read nowhere after it (the caller asks)."""
    if loop.asynchronous is not None or loop.orelse is not None or not isinstance(loop.target, cst.Name):
        return None
    counter = loop.target.value
    subs = [n for n in find_all(loop.body, cst.Subscript) if isinstance(n.value, cst.Name) and len(n.slice) == 1
            and isinstance(n.slice[0].slice, cst.Index) and isinstance(n.slice[0].slice.value, cst.Name)
            and n.slice[0].slice.value.value == counter]
    tensors = sorted({n.value.value for n in subs if is_tensor(n.value)})
    if not tensors or counter in tensors:
        return None
    taken = frozenset(id(n) for n in subs if n.value.value in tensors)
    aliases: Set[str] = set()
    binds: List[cst.Assign] = []
    for assign in find_all(loop.body, cst.Assign):
        if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name) and id(assign.value) in taken:
            aliases.add(assign.targets[0].target.value)
            binds.append(assign)
    bound = [n.target.value for n in find_all(loop.body, cst.AssignTarget) if isinstance(n.target, cst.Name)]
    if any(bound.count(a) > 1 for a in aliases) or aliases & set(tensors):
        return None
    elements = Elements(aliases, taken, frozenset(tensors))
    stmts = [st for st in _statements(loop.body)]
    for st in stmts:
        small = st.body[0] if isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1 else None
        if small is not None and any(small is b for b in binds):
            continue  # (`label = labels[i]`: an alias, its uses checked where they are)
        if not host_only(st, elements, on_host):
            return None
    every = _every_pass(loop.body)
    tensors = [t for t in tensors if any(id(n) in taken and n.value.value == t for n in every)]
    return IndexWalk(tuple(tensors), tuple(sorted(aliases))) if tensors else None


def _every_pass(body: cst.BaseSuite) -> List[cst.Subscript]:
    """The subscripts every pass of a loop with this body evaluates: in its
    simple statements and in the tests of its ``if`` and ``while`` statements
    (the ``minGPT`` demo's ``inp[i].tolist()`` printed for a mistake is
    taken only sometimes)."""
    found: List[cst.Subscript] = []
    for st in _statements(body):
        if isinstance(st, (cst.If, cst.While)):
            found += find_all(st.test, cst.Subscript)
        elif isinstance(st, cst.SimpleStatementLine):
            found += find_all(st, cst.Subscript)
    return found


def _statements(body: cst.BaseSuite) -> List[cst.BaseStatement]:
    return list(body.body) if isinstance(body, cst.IndentedBlock) else [cst.SimpleStatementLine(list(body.body))]


class Elements:
    """What a walk's elements are: names (``label`` of ``for label in labels``,
    or bound to ``labels[i]``) and subscripts (``labels[i]``, by id); and the
    names that may appear only inside them (``labels`` of an index walk)."""

    def __init__(self, names: Set[str], subscripts: FrozenSet[int] = frozenset(),
                 inside: FrozenSet[str] = frozenset()) -> None:
        self.names, self.subscripts, self.forbidden = names, subscripts, names | inside

    def __call__(self, node: cst.CSTNode) -> bool:
        return (isinstance(node, cst.Name) and node.value in self.names) or id(node) in self.subscripts

    def named(self, expr: cst.CSTNode) -> bool:
        """``expr`` holds an element."""
        stack = [expr]
        while stack:
            n = stack.pop()
            if self(n):
                return True
            stack.extend(n.children)
        return False


def _element_expr(node: cst.CSTNode, elements: Elements) -> bool:
    """An element, or what arithmetic, comparisons and casts make of the
    elements and numbers: the value a host read would read."""
    if elements(node):
        return True
    if isinstance(node, cst.Name):
        return False
    if number_literal(node):
        return True
    if isinstance(node, cst.BinaryOperation):
        return _element_expr(node.left, elements) and _element_expr(node.right, elements)
    if isinstance(node, cst.UnaryOperation):
        return _element_expr(node.expression, elements)
    if isinstance(node, cst.Comparison):
        return _element_expr(node.left, elements) and all(
            _element_expr(c.comparator, elements) and not isinstance(c.operator, (cst.In, cst.NotIn, cst.Is, cst.IsNot))
            for c in node.comparisons)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _CASTS:
        return all(number_literal(a.value) and a.keyword is None for a in node.args) and _element_expr(node.func.value,
                                                                                               elements)
    return False


def host_only(node: cst.CSTNode, elements: Elements, on_host: Predicate) -> bool:
    """Every use of ``elements`` in ``node`` is on the host: read as a
    number (``int(E)``, ``E.item()``), a truth (the test of an ``if``,
    ``while`` or conditional expression, an ``and``/``or``/``not`` there),
    or an index of a value ``on_host`` (``confusion[E, E2]``,
    ``classes[E]``), ``E`` an element expression."""
    def reads(expr: cst.CSTNode) -> bool:
        return _element_expr(expr, elements) and elements.named(expr)

    def truth(test: cst.CSTNode) -> bool:
        if isinstance(test, cst.BooleanOperation):
            return truth(test.left) and truth(test.right)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return truth(test.expression)
        return reads(test) or host_only(test, elements, on_host)

    if elements(node):
        return False  # (an element where no host use takes it)
    if isinstance(node, cst.Name):
        return node.value not in elements.forbidden
    if isinstance(node, cst.Call):
        func, args = node.func, node.args
        if isinstance(func, cst.Name) and func.value in SCALAR_READS and len(args) == 1 and not args[0].keyword \
                and not args[0].star and reads(args[0].value):
            return True
        if isinstance(func, cst.Attribute) and func.attr.value in _TERMINAL and not args and reads(func.value):
            return True
    if isinstance(node, (cst.If, cst.While)):
        rest = [node.body] + ([node.orelse] if node.orelse is not None else [])
        return truth(node.test) and all(host_only(r, elements, on_host) for r in rest)
    if isinstance(node, cst.IfExp):
        return truth(node.test) and host_only(node.body, elements, on_host) and host_only(node.orelse, elements,
                                                                                          on_host)
    if isinstance(node, cst.Subscript):
        indexes = [e.slice.value if isinstance(e.slice, cst.Index) else e.slice for e in node.slice]
        direct = [i for i in indexes if reads(i)]  # (an element itself the index: the value must be the host's)
        return (not direct or on_host(node.value)) and host_only(node.value, elements, on_host) and all(
            host_only(i, elements, on_host) for i in indexes if not any(i is d for d in direct))
    return all(host_only(c, elements, on_host) for c in node.children)


__all__ = ["Elements", "HostWalk", "IndexWalk", "NumberWalk", "comprehension_walk", "element_pairs", "for_walk", "host_only",
           "host_walk", "index_walk", "pair_of_tensors", "pure_walked", "root", "walked_by"]
