"""LibCST's parse of a module, without validating what the parser built.

Every LibCST node checks itself when it is made (``CSTNode.__post_init__``
calls ``_validate``: that a name is a name, that whitespace is whitespace,
that parentheses pair up).  A node the parser makes from source text is
valid by construction, so on a parse the checks only cost time -- about a
sixth of a large module's parse (LibCST's own comment there says as much).
And one of them is wrong: ``() if 0 else(lambda:())`` is valid Python that
LibCST's parser builds and then rejects with a ``TypeError``
(Instagram/LibCST#1061); such a file now converts, unless a rewrite
rebuilds that very expression.

The nodes are frozen dataclasses with slots: the constructor dataclasses
writes for them sets each field through ``object.__setattr__`` (what a
frozen class must do) and then calls the check.  During a parse each node
class gets a constructor that stores its fields straight into their slots
and checks nothing (``_fast_inits``): the same fields, defaults and default
factories, built from the dataclass's own field list.  Together that is
about a tenth of the parse.

A third of the nodes a parse makes are plain whitespace: ``" "`` around
an operator, a bare newline, the end of a line without a comment.  LibCST's
native parser makes each node by calling the class of its name in the
``libcst`` package, so during the parse those three names stand for makers
that give back one node for equal whitespace (``_shared_whitespace``).
The nodes are immutable, and they sit only in the fields that no walker
here enters (``nodes._SKIP_FIELDS``): nothing tells two of them apart.

``parse_module`` switches all this off again after the parse alone; every node a rule
builds afterwards is made and checked as usual.  Where the installed LibCST
checks nodes some other way than this one call, or a class is not the
plain frozen, slotted dataclass this expects, that class (or everything)
is left as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple, Union

import libcst as cst
from libcst._nodes.base import CSTNode
from libcst._nodes.whitespace import Newline, SimpleWhitespace, TrailingWhitespace

from codemods.syntax.nodes import _NODE_TYPES

_CHECK = CSTNode.__dict__.get("__post_init__")


def _checks_only() -> bool:
    """Whether making a node does nothing after its fields are set but call
    ``_validate``: the one ``__post_init__`` is CSTNode's, and it only
    calls that."""
    if _CHECK is None or getattr(_CHECK, "__code__", None) is None or _CHECK.__code__.co_names != ("_validate",):
        return False
    return not any("__post_init__" in vars(base) for kind in _NODE_TYPES for base in kind.__mro__
                   if base is not CSTNode and issubclass(base, CSTNode))


SKIPS_CHECKS = _checks_only()


def _made(self: CSTNode) -> None:
    """A node the parser made: nothing to check."""


def _slot(kind: type, name: str) -> Optional[Callable[[object, object], None]]:
    """The setter of the slot that holds field ``name`` of ``kind``."""
    for base in kind.__mro__:
        held = base.__dict__.get(name)
        if held is not None:
            return held.__set__ if type(held).__name__ == "member_descriptor" else None
    return None


def _fast_init(kind: type, tag: str, namespace: Dict[str, object]) -> Optional[str]:
    """The source of a constructor for ``kind`` that sets its fields as the
    dataclass's own does, minus the check; None for a class that is not a
    frozen, slotted dataclass with plain positional-or-keyword fields
    whose own constructor dataclasses wrote."""
    own = kind.__dict__.get("__init__")
    params = getattr(kind, "__dataclass_params__", None)
    if (own is None or params is None or not params.frozen or getattr(own, "__code__", None) is None
            or own.__code__.co_filename != "<string>"):
        return None
    args, body = [], []
    for i, f in enumerate(dataclasses.fields(kind)):
        setter = _slot(kind, f.name)
        if not f.init or f.kw_only or setter is None:
            return None
        namespace[f"_set{tag}_{i}"] = setter
        if f.default is not dataclasses.MISSING:
            namespace[f"_default{tag}_{i}"] = f.default
            args.append(f"{f.name}=_default{tag}_{i}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory{tag}_{i}"] = f.default_factory
            args.append(f"{f.name}=_MISSING")
            body.append(f"    if {f.name} is _MISSING:\n        {f.name} = _factory{tag}_{i}()")
        else:
            args.append(f.name)
        body.append(f"    _set{tag}_{i}(self, {f.name})")
    return f"def _init{tag}(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"]) + "\n"


# node class -> (its unchecked constructor, its own), made on the first parse
_INITS: Optional[Dict[type, Tuple[Callable[..., None], Callable[..., None]]]] = None


def _fast_inits() -> Dict[type, Tuple[Callable[..., None], Callable[..., None]]]:
    """Every node class's unchecked constructor and its own (one ``exec``
    makes them all)."""
    global _INITS
    if _INITS is None:
        namespace: Dict[str, object] = {"_MISSING": dataclasses.MISSING}
        sources = {kind: _fast_init(kind, str(k), namespace) for k, kind in enumerate(sorted(_NODE_TYPES, key=repr))}
        exec("\n".join(s for s in sources.values() if s), namespace)  # noqa: S102 -- made above from field names
        _INITS = {kind: (namespace[f"_init{k}"], kind.__dict__["__init__"])  # type: ignore[misc]
                  for k, (kind, s) in enumerate(sources.items()) if s}
    return _INITS


def _shared_whitespace() -> Dict[str, Callable[..., CSTNode]]:
    """Makers of the commonest whitespace nodes that give back one node for
    equal whitespace (``" "``, a bare newline, the end of a line without a
    comment) instead of a new one each time: a third of a parse's nodes.
    The nodes are immutable and no reader of the tree tells them apart (they
    sit only in the fields the walkers skip, ``nodes._SKIP_FIELDS``)."""
    simple: Dict[str, CSTNode] = {}
    ends: Dict[str, CSTNode] = {}
    bare = Newline()

    def simple_whitespace(value: str) -> CSTNode:
        node = simple.get(value)
        if node is None:
            node = simple[value] = SimpleWhitespace(value)
        return node

    def newline(value: Optional[str] = None) -> CSTNode:
        return bare if value is None else Newline(value)

    def trailing_whitespace(whitespace: Optional[SimpleWhitespace] = None, comment: Optional[CSTNode] = None,
                            newline: Newline = bare) -> CSTNode:
        if whitespace is None:
            whitespace = simple_whitespace("")  # type: ignore[assignment]
        if comment is not None or newline is not bare or simple.get(whitespace.value) is not whitespace:  # type: ignore[union-attr]
            return TrailingWhitespace(whitespace, comment, newline)  # type: ignore[arg-type]
        node = ends.get(whitespace.value)  # type: ignore[union-attr]
        if node is None:
            node = ends[whitespace.value] = TrailingWhitespace(whitespace, None, bare)  # type: ignore[union-attr, arg-type]
        return node

    return {"SimpleWhitespace": simple_whitespace, "Newline": newline, "TrailingWhitespace": trailing_whitespace}


def parse_module(source: Union[str, bytes]) -> cst.Module:
    """``libcst.parse_module(source)``, its nodes unchecked and its plain
    whitespace shared (see above)."""
    if not SKIPS_CHECKS:
        return cst.parse_module(source)
    inits = _fast_inits()
    CSTNode.__post_init__ = _made  # type: ignore[method-assign]
    for kind, (fast, _) in inits.items():
        type.__setattr__(kind, "__init__", fast)
    # LibCST's native parser makes each node by calling the class of that
    # name in the ``libcst`` package: the whitespace makers stand in for
    # those classes during the parse (the classes themselves make them)
    makers = _shared_whitespace()
    classes = {name: getattr(cst, name) for name in makers}
    for name, maker in makers.items():
        setattr(cst, name, maker)
    try:
        return cst.parse_module(source)
    finally:
        for name, kind in classes.items():
            setattr(cst, name, kind)
        for kind, (_, own) in inits.items():
            type.__setattr__(kind, "__init__", own)
        CSTNode.__post_init__ = _CHECK  # type: ignore[method-assign]
