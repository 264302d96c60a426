"""Run a ``CSTTransformer`` over a tree without rebuilding what it leaves alone.

``CSTNode.visit`` builds a new copy of every node it passes, validating each
one (a regular expression per whitespace node), whether or not the transform
changed anything below it.  A codemod here changes a few statements of a
file, so most of that work is thrown away.  ``transform`` keeps LibCST's
protocol -- ``on_visit``/``on_leave`` (hence ``visit_X``/``leave_X``) in
LibCST's order, ``RemovalSentinel`` and ``FlattenSentinel`` with LibCST's
meaning -- but:

* a node whose children all came back unchanged is passed to ``on_leave`` as
  its own ``updated_node``, and only a node with a changed child is rebuilt
  (``with_changes``, which validates it as LibCST does);
* whitespace, comments and punctuation (``codemods.syntax.nodes``' skipped fields)
  are not entered: no xlaport codemod visits them.

So the result shares every unchanged subtree with the input.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple, Union

import libcst as cst

from codemods.syntax.nodes import _LISTS, _NODE_TYPES, _child_fields

# Where LibCST's ``_visit_and_replace_children`` visits fields in another
# order than the dataclass declares them: its order (source order).  The
# child fields of every other node type are visited in declaration order.
# tests/test_traverse.py checks both against LibCST's own visitor.
SOURCE_ORDER: Dict[str, Tuple[str, ...]] = {
    "Arg": ("keyword", "value"),
    "ClassDef": ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    "CompFor": ("asynchronous", "target", "iter", "ifs", "inner_for_in"),
    "ExceptHandler": ("type", "name", "body"),
    "ExceptStarHandler": ("type", "name", "body"),
    "For": ("asynchronous", "target", "iter", "body", "orelse"),
    "FunctionDef": ("decorators", "asynchronous", "name", "type_parameters", "params", "returns", "body"),
    "IfExp": ("body", "test", "orelse"),
    "ImportFrom": ("relative", "module", "names"),
    "MatchCase": ("pattern", "guard", "body"),
    "Parameters": ("posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params", "star_kwarg"),
    "SimpleStatementSuite": ("leading_whitespace", "body"),
    "Slice": ("lower", "first_colon", "upper", "second_colon", "step"),
    "TypeAlias": ("name", "type_parameters", "value"),
    "With": ("asynchronous", "items", "body"),
}

_FIELDS: Dict[type, Tuple[str, ...]] = {}

Result = Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel]


def fields(kind: type) -> Tuple[str, ...]:
    """The fields of ``kind`` that ``transform`` enters, in visiting order."""
    names = _FIELDS.get(kind)
    if names is None:
        own = _child_fields(kind)
        order = SOURCE_ORDER.get(kind.__name__)
        if order is not None and kind.__module__.startswith("libcst."):
            names = tuple(n for n in order if n in own) + tuple(n for n in own if n not in order)
        else:
            names = own
        _FIELDS[kind] = names
    return names


def transform(node: cst.CSTNode, transformer: cst.CSTTransformer) -> Result:
    """``node.visit(transformer)``, sharing the subtrees it leaves unchanged."""
    if not transformer.on_visit(node):
        return transformer.on_leave(node, node)
    changes = None
    nodes = _NODE_TYPES
    for name in fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind in nodes:
            new = transform(value, transformer)
            if new is not value:
                if changes is None:
                    changes = {}
                changes[name] = _single(node, name, new)
        elif kind in _LISTS:
            items = _sequence(value, transformer)
            if items is not None:
                if changes is None:
                    changes = {}
                changes[name] = items
    updated = node.with_changes(**changes) if changes else node
    return transformer.on_leave(node, updated)


def transform_module(module: cst.Module, transformer: cst.CSTTransformer) -> cst.Module:
    """``module.visit(transformer)``: a module removed is a module emptied."""
    result = transform(module, transformer)
    if isinstance(result, cst.RemovalSentinel):
        return module.with_changes(body=(), header=(), footer=())
    if not isinstance(result, cst.Module):
        raise TypeError(f"a transform of a Module returned {type(result).__name__}")
    return result


def _sequence(values, transformer: cst.CSTTransformer):
    """The transformed items of a list field, or None when none changed."""
    out: List[object] = []
    changed = False
    nodes = _NODE_TYPES
    for v in values:
        if type(v) not in nodes:
            out.append(v)
            continue
        new = transform(v, transformer)
        if new is v:
            out.append(v)
            continue
        changed = True
        if isinstance(new, cst.FlattenSentinel):
            out.extend(new.nodes)
        elif not isinstance(new, cst.RemovalSentinel):
            out.append(new)
    return tuple(out) if changed else None


def _single(node: cst.CSTNode, name: str, new: Result) -> object:
    """What a one-node field becomes, as LibCST's ``visit_optional``,
    ``visit_sentinel`` and ``visit_required`` decide."""
    if isinstance(new, cst.CSTNode):
        return new
    declared = str(next(f.type for f in dataclasses.fields(node) if f.name == name))
    if isinstance(new, cst.RemovalSentinel):
        if "MaybeSentinel" in declared:
            return cst.MaybeSentinel.DEFAULT
        if "Optional" in declared or "None" in declared:
            return None
    raise TypeError(
        f"{type(new).__name__} returned for {type(node).__name__}.{name}, which needs a node"
    )
