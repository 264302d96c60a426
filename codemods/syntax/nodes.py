"""CST helpers that hold no state: literal values, dotted names, node
types, child fields, and a walk that reads the dataclass fields directly
(reading a LibCST tree with its own visitors rebuilds every node).
:mod:`codemods.syntax.tree` builds the per-tree index on these.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, FrozenSet, Iterator, List, Optional, Set, Tuple, Union

import libcst as cst

def string_value(node: cst.CSTNode) -> Optional[str]:
    """The value of a plain string literal, else None."""
    if type(node) is cst.SimpleString:
        text = node.value  # type: ignore[attr-defined]
        quote = text[-1]
        if text[0] == quote and "\\" not in text and "\r" not in text:  # no prefix, no escapes: as written
            return text[3:-3] if len(text) >= 6 and text.startswith(quote * 3) else text[1:-1]
        try:
            value = node.evaluated_value
        except Exception:  # pragma: no cover - malformed literal
            return None
        return value if isinstance(value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        left, right = string_value(node.left), string_value(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def number_literal(node: cst.CSTNode) -> bool:
    """A number written out: ``4``, ``1e-4``, ``-1`` (a unary operator over one)."""
    if isinstance(node, cst.UnaryOperation):
        return number_literal(node.expression)
    return isinstance(node, (cst.Integer, cst.Float))


def call_name(node: cst.CSTNode) -> Optional[str]:
    """The last name of a call's callee: ``a.b.c(...)`` -> ``c``."""
    if not isinstance(node, cst.Call):
        return None
    func = node.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def dotted(node: cst.CSTNode) -> Optional[str]:
    """``a.b.c`` as a string for Name/Attribute chains, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


# Fields that only ever hold whitespace, comments or punctuation: the fast
# walker below never needs to look inside them.
_SKIP_FIELDS = re.compile(
    r"^(whitespace.*|leading_whitespace|lpar|rpar|leading_lines|lines_after_decorators|header|footer|comma|semicolon|"
    r"newline|trailing_whitespace|equal|colon|dot|star|lbracket|rbracket|lbrace|rbrace|"
    r"first_line_comment|empty_lines|indent|operator)$"
)
_CHILD_FIELDS: Dict[type, Tuple[str, ...]] = {}


def source_of(node: cst.CSTNode) -> str:
    """The code of one node, as LibCST writes it."""
    return cst.Module(body=[]).code_for_node(node)


def _child_fields(kind: type) -> Tuple[str, ...]:
    names = _CHILD_FIELDS.get(kind)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(kind) if not _SKIP_FIELDS.match(f.name))
        _CHILD_FIELDS[kind] = names
    return names


def children(node: cst.CSTNode) -> List[cst.CSTNode]:
    """``node.children`` without LibCST's visitor machinery (and without
    whitespace): an order of magnitude cheaper; source order."""
    out: List[cst.CSTNode] = []
    add = out.append
    nodes = _NODE_TYPES
    kind = type(node)
    for name in _CHILD_FIELDS.get(kind) or _child_fields(kind):
        value = getattr(node, name)
        vkind = type(value)
        if vkind in nodes:
            add(value)
        elif vkind is tuple or vkind is list:
            for v in value:
                if type(v) in nodes:
                    add(v)
    return out


def _all_node_types() -> FrozenSet[type]:
    seen: Set[type] = set()
    todo = [cst.CSTNode]
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            todo.extend(t.__subclasses__())
    return frozenset(seen)


# ``isinstance`` against LibCST's node classes goes through ``ABCMeta`` and
# is several times slower than a set lookup of the exact type; the walkers
# below run it millions of times on a large package.
_NODE_TYPES = _all_node_types()
_LISTS = (list, tuple)
_EXPANDED: Dict[object, FrozenSet[type]] = {}


def node_types(kinds: Union[type, Tuple[type, ...]]) -> FrozenSet[type]:
    """The node types ``isinstance(n, kinds)`` accepts, as a set of exact
    types (``type(n) in node_types(kinds)`` is the same test, faster)."""
    found = _EXPANDED.get(kinds)
    if found is None:
        if isinstance(kinds, tuple):
            found = frozenset().union(*(node_types(k) for k in kinds))
        else:
            if not _BELOW:  # every node class under each class of its MRO, in one pass over the node classes
                for t in _NODE_TYPES:
                    for base in t.__mro__:
                        _BELOW.setdefault(base, set()).add(t)
            found = frozenset(_BELOW.get(kinds, ()))
        _EXPANDED[kinds] = found
    return found


_BELOW: Dict[type, Set[type]] = {}  # a class -> the node classes that are it or derive from it


def calls_nothing(node: cst.CSTNode) -> bool:
    """Reading ``node`` again gives the same and changes nothing: no call,
    assignment expression, ``await`` or ``yield`` in it (names, attributes,
    subscripts and operators of them)."""
    return not any(isinstance(n, (cst.Call, cst.NamedExpr, cst.Await, cst.Yield)) for n in walk(node))


def walk(node: cst.CSTNode, stop: Tuple[type, ...] = ()) -> Iterator[cst.CSTNode]:
    """Every descendant of ``node`` (itself first), without building new nodes.

    ``CSTNode.visit`` rebuilds each node it passes; reading the dataclass
    fields directly is an order of magnitude cheaper for read-only searches.
    Does not descend into nodes of the ``stop`` types (other than ``node``).
    The order is not guaranteed to be source order.
    """
    stops = node_types(stop) if stop else frozenset()
    stack = [node]
    pop, extend = stack.pop, stack.extend
    while stack:
        n = pop()
        yield n
        if type(n) in stops and n is not node:
            continue
        extend(children(n))


# what starts a scope of its own: a name bound inside one is not the name of the code around it
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)

_TARGET_OF = (cst.AugAssign, cst.AnnAssign, cst.WithItem, cst.For, cst.CompFor)


def param_names(fn: cst.FunctionDef) -> Set[str]:
    """The names of ``fn``'s named parameters (positional-only, plain and
    keyword-only; not ``*args``/``**kwargs``)."""
    return {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)}


def is_stored(node: cst.CSTNode, ancestors: Iterator[cst.CSTNode]) -> bool:
    """``node`` is (part of) a target something is assigned to, or deleted
    (``x[i] = v``, ``a, x[i] = ...``, ``for x[i] in``, ``del x[i]``);
    ``ancestors``: ``node``'s, innermost first."""
    child = node
    for anc in ancestors:
        if isinstance(anc, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            child = anc
            continue
        return isinstance(anc, (cst.AssignTarget, cst.Del)) or (
            isinstance(anc, _TARGET_OF) and getattr(anc, "target", None) is child)
    return False


def tight_equal() -> cst.AssignEqual:
    """The ``=`` of a keyword argument or a default, as Black and Ruff write
    it (no spaces); a new node each time: a node may appear once in a tree."""
    return cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))


def keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """``name=value``."""
    return cst.Arg(value, keyword=cst.Name(name), equal=tight_equal())


def comma_separated(args: List[cst.Arg]) -> List[cst.Arg]:
    """Arguments separated by ", " with no trailing comma."""
    if not args:
        return args
    sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [a.with_changes(comma=sep) for a in args[:-1]] + [args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]


def with_arg(call: cst.Call, new: cst.Arg) -> cst.Call:
    """``call`` with ``new`` as its last argument, laid out as the call is:
    on the line of its own that each argument has (``f(\\n    a,\\n    b\\n)``),
    after ``, `` on one line; a trailing comma stays trailing, and what stood
    between the last argument and ``)`` (the newline of a closing bracket on
    its own line) now follows the new one."""
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    space: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace(" ")
    if len(args) > 1 and isinstance(args[-2].comma, cst.Comma):
        space = args[-2].comma.whitespace_after
    elif isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        space = call.whitespace_before_args
    if isinstance(space, cst.ParenthesizedWhitespace):  # the line break and indent, not a comment on that line
        space = space.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=())
    between = cst.Comma(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=space.deep_clone())
    args[-1] = last.with_changes(comma=between, whitespace_after_arg=cst.SimpleWhitespace(""))
    return call.with_changes(args=[*args, new.with_changes(comma=last.comma,
                                                           whitespace_after_arg=last.whitespace_after_arg)])
