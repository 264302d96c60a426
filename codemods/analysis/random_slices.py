"""Slices taken at offsets drawn from the host's random numbers: a random
crop, on whatever tensor the caller hands in.

Lornatang/SRGAN-PyTorch's ``random_crop_torch`` (in ``imgproc.py``, called
from the step loop of ``train_net.py`` on the batch already on the device)
draws ``top = random.randint(0, h - size)`` and takes ``x[:, :, top:top +
size, ...]``.  XLA bakes a slice's bounds into the graph: every offset drawn
is another graph to compile (16 -> 20 compiles at 4 -> 8 steps there, before
anything else grows).  :func:`slicing_functions` names the module-level
functions of a file that take such a slice, read with Python's ``ast`` (the
file may be another module of the project: no LibCST tree is built for it),
and the line of the first one:

* a *draw* is a call of one of ``steps.HOST_DRAWS`` (``random.randint``,
  ``np.random.randint``...), read through the module's imports;
* a name is *drawn* when an assignment in the function binds it from an
  expression that reads a draw or a drawn name (``top = random.randint(...)``,
  ``gt_top = int(top * scale)``), in the order the lines come;
* a *random slice* is a subscript with a slice whose bound reads one, of a
  value made from one of the function's parameters.

Which tensor is handed in is not read here: the rule that asks (XLA424)
speaks where the function is called every step with a device tensor in
the place of a parameter it slices so.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, NamedTuple, Optional, Set, Tuple, Union

from codemods.analysis.project import import_aliases, read_cached
from codemods.analysis.steps import HOST_DRAWS

# (per process) path -> (its stamp, its functions' first random slice lines)
_KNOWN: Dict[str, Tuple[Optional[Tuple[int, int]], Dict[str, "RandomSlice"]]] = {}


class RandomSlice(NamedTuple):
    """A function's slices at host-random offsets: the first one's ``line``,
    the function's positional ``params`` in order, and the parameters whose
    values (or what is made of them: ``lr_images = [lr_images]``, then
    ``for lr_image in lr_images``) the slices cut (``sliced``)."""

    line: int
    params: Tuple[str, ...]
    sliced: FrozenSet[str]

    def cuts(self, position: Optional[int], keyword: Optional[str]) -> bool:
        """The argument at ``position`` (or passed as ``keyword``) is one the slice cuts."""
        if keyword is not None:
            return keyword in self.sliced
        return position is not None and position < len(self.params) and self.params[position] in self.sliced


def slicing_functions(source: bytes) -> Dict[str, RandomSlice]:
    """The module-level functions of the code ``source`` that slice one of
    their parameters at a host-random offset (see :class:`RandomSlice`)."""
    if b"random" not in source:
        return {}
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return {}
    aliases = import_aliases(module)
    found: Dict[str, RandomSlice] = {}
    for fn in module.body:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            piece = _random_slices(fn, aliases)
            if piece is not None:
                found[fn.name] = piece
    return found


def slicing_functions_of(path: Path) -> Dict[str, RandomSlice]:
    """:func:`slicing_functions` of the file at ``path``, read again only once it changed."""
    stamp, data = read_cached(path)
    known = _KNOWN.get(str(path))
    if known is not None and known[0] == stamp:
        return known[1]
    found = slicing_functions(data) if stamp is not None else {}
    _KNOWN[str(path)] = (stamp, found)
    return found


def _random_slices(fn: Union[ast.FunctionDef, ast.AsyncFunctionDef],
                        aliases: Dict[str, str]) -> Optional[RandomSlice]:
    params = tuple(a.arg for a in fn.args.posonlyargs + fn.args.args)
    origins = _origins(fn, params + tuple(a.arg for a in fn.args.kwonlyargs))
    drawn = _drawn(fn, aliases)
    subscripts = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Subscript)),
                        key=lambda n: (n.lineno, n.col_offset))
    line, sliced = None, set()
    for sub in subscripts:
        pieces = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
        random_pieces = [p for p in pieces if isinstance(p, ast.Slice) and any(
            b is not None and _reads_draw(b, drawn, aliases) for b in (p.lower, p.upper))]
        root = _root(sub.value)
        if random_pieces and root is not None and origins.get(root):
            line = random_pieces[0].lineno if line is None else line
            sliced |= origins[root]
    return RandomSlice(line, params, frozenset(sliced)) if line is not None else None


def _drawn(fn: ast.AST, aliases: Dict[str, str]) -> Set[str]:
    """The names bound from a draw or from a drawn name, in the order the lines come."""
    drawn: Set[str] = set()
    assigns = sorted((n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))),
                     key=lambda n: (n.lineno, n.col_offset))
    for assign in assigns:
        if assign.value is not None and _reads_draw(assign.value, drawn, aliases):
            targets = assign.targets if isinstance(assign, ast.Assign) else [assign.target]
            drawn |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return drawn


def _origins(fn: ast.AST, params: Tuple[str, ...]) -> Dict[str, Set[str]]:
    """name -> the parameters its value is made from: a parameter itself, a
    name an assignment binds from an expression reading one, a
    comprehension's or loop's target over one (to a fixpoint)."""
    origins: Dict[str, Set[str]] = {p: {p} for p in params}
    links = []  # (the names bound, the expression they are bound from)
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            links += [(t, node.value) for t in node.targets]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            links.append((node.target, node.value))
        elif isinstance(node, (ast.For, ast.comprehension)):
            links.append((node.target, node.iter))
    changed = True
    while changed:
        changed = False
        for target, value in links:
            came = set().union(*(origins.get(n, set()) for n in _value_names(value)))
            for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                if not came <= origins.setdefault(name, set()):
                    origins[name] |= came
                    changed = True
    return origins


def _value_names(expr: ast.AST) -> Iterator[str]:
    """The names whose values ``expr`` is made of, but for those only read in
    an index (``x[top:top + k]`` is made of ``x``)."""
    if isinstance(expr, ast.Name):
        yield expr.id
    elif isinstance(expr, ast.Subscript):
        yield from _value_names(expr.value)
    else:
        for child in ast.iter_child_nodes(expr):
            yield from _value_names(child)


def _root(node: ast.AST) -> Optional[str]:
    """The name a subscripted value is read from (``x`` of ``x.data``, ``x[0]``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _reads_draw(expr: ast.AST, drawn: Set[str], aliases: Dict[str, str]) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id in drawn:
            return True
        if isinstance(node, ast.Call) and _qualname(node.func, aliases) in HOST_DRAWS:
            return True
    return False


def _qualname(func: ast.AST, aliases: Dict[str, str]) -> Optional[str]:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    root = aliases.get(func.id)
    return ".".join([root, *reversed(parts)]) if root is not None else None


__all__ = ["RandomSlice", "slicing_functions", "slicing_functions_of"]
