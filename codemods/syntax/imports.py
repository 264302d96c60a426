"""The imports that codemods ask for, added and removed once at the end.

A rule only records a request (``need`` / ``drop``, as LibCST's
``add_needed_import`` / ``remove_unused_import`` take them); ``apply`` hands
the requests to LibCST's own ``AddImportsVisitor`` and
``RemoveImportsVisitor``.  LibCST's codemod package (with its matchers, about
a fifth of a second to import) is loaded only when there is a request to
apply, so a run that rewrites nothing never pays for it.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from codemods.syntax.edits import stand_in, without_stand_ins
from codemods.syntax.tree import dotted, find_all, walk

NEEDED_KEY = "xlaport.needed_imports"
UNUSED_KEY = "xlaport.unused_imports"

Request = Tuple[str, Optional[str], Optional[str]]  # (module, obj, asname)


def need(context: object, module: str, obj: Optional[str] = None, asname: Optional[str] = None) -> None:
    """Ask for ``import module`` / ``from module import obj [as asname]``."""
    context.scratch.setdefault(NEEDED_KEY, []).append((module, obj, asname))  # type: ignore[attr-defined]


def drop(context: object, module: str, obj: Optional[str] = None, asname: Optional[str] = None) -> None:
    """Ask to remove that import if nothing uses the name it binds any more."""
    context.scratch.setdefault(UNUSED_KEY, []).append((module, obj, asname))  # type: ignore[attr-defined]


def pending(context: object) -> bool:
    scratch = context.scratch  # type: ignore[attr-defined]
    return bool(scratch.get(NEEDED_KEY) or scratch.get(UNUSED_KEY))


def apply(context: object, tree: cst.Module) -> Tuple[cst.Module, bool]:
    """``tree`` with the requested imports added and removed, and whether
    anything was done to it (the tree is new then, even if equal)."""
    scratch = context.scratch  # type: ignore[attr-defined]
    needed: List[Request] = scratch.get(NEEDED_KEY) or []
    unused: List[Request] = scratch.get(UNUSED_KEY) or []
    changed = False
    if needed:
        tree, changed = _for_its_effect(needed, _add(needed, tree)), True
    if unused:
        where = _removable(unused, tree)
        if where is not None:
            removed = _remove(unused, tree, where)
            if removed.body and not removed.header and (not tree.body or removed.body[0] is not tree.body[0]):
                # the imports that began the file are gone: it does not begin with blank lines now
                first = removed.body[0]
                lines = list(first.leading_lines)
                while lines and lines[0].comment is None:
                    lines.pop(0)
                removed = removed.with_changes(body=[first.with_changes(leading_lines=lines), *removed.body[1:]])
            tree, changed = removed, True
    return tree, changed


# imported for what importing it does, even where its name goes unread: torch_xla
# registers the XLA device, so that `device="xla"` strings work
# (and the distributed backend registers the "xla" process group backend)
_FOR_ITS_EFFECT = ("torch_xla", "torch_xla.distributed.xla_backend")


def _for_its_effect(needed: List[Request], tree: cst.Module) -> cst.Module:
    """``import torch_xla`` added where no code reads the name and no import of
    one of its modules imports it anyway (a module that uses "xla" strings
    as devices): marked ``# noqa: F401``, so that a linter's
    fix for unused imports -- Ruff's, which ``convert`` applies where the input
    passed Ruff -- does not take the device away with it."""
    wanted = {m for m, obj, asname in needed if obj is None and asname is None and m in _FOR_ITS_EFFECT}
    if not wanted:
        return tree
    read, through = _names_read(tree), _imported_through_submodules(tree)
    body = []
    for stmt in tree.body:
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Import) \
                and stmt.trailing_whitespace.comment is None and len(stmt.body[0].names) == 1:
            alias = stmt.body[0].names[0]
            name = dotted(alias.name)
            root = name.split(".")[0]  # type: ignore[union-attr]
            # (a package that an import of one of its modules imports anyway needs no mark of its own)
            if name in wanted and alias.asname is None and root not in read and ("." in name or root not in through):  # type: ignore[operator]
                stmt = stmt.with_changes(trailing_whitespace=stmt.trailing_whitespace.with_changes(
                    whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment("# noqa: F401")))
        body.append(stmt)
    return tree.with_changes(body=body)


def _imported_through_submodules(tree: cst.Module) -> Set[str]:
    """Packages an import of one of their modules imports anyway
    (``import torch_xla.runtime as xr``, ``from torch_xla.core import ...``)."""
    found: Set[str] = set()
    for stmt in tree.body:
        for imp in (stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()):
            if isinstance(imp, cst.Import):
                found |= {dotted(a.name).split(".")[0] for a in imp.names if "." in (dotted(a.name) or "")}  # type: ignore[union-attr]
            elif isinstance(imp, cst.ImportFrom) and imp.module is not None and not imp.relative:
                found.add((dotted(imp.module) or "").split(".")[0])
    return found


def _names_read(tree: cst.Module) -> Set[str]:
    """The names the module's code holds outside its top-level imports."""
    return {n.value for stmt in tree.body
            if not (isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(b, (cst.Import, cst.ImportFrom))
                                                                     for b in stmt.body))
            for n in find_all(stmt, cst.Name)}


def _remove(unused: List[Request], tree: cst.Module, head: int) -> cst.Module:
    """Run LibCST's RemoveImportsVisitor: on the first ``head`` statements
    alone when that gives the same result (see ``_removable``), else on the
    whole module (a scope analysis of all of it: seconds on a large one)."""
    from libcst.codemod import Codemod, CodemodContext
    from libcst.codemod.visitors import RemoveImportsVisitor

    ctx = CodemodContext()
    for module, obj, asname in unused:
        RemoveImportsVisitor.remove_unused_import(ctx, module, obj, asname)
    visitor = _keeping_comments(RemoveImportsVisitor)
    if not head:
        return Codemod.transform_module(visitor(ctx), tree)
    body = list(tree.body)
    new_head = Codemod.transform_module(visitor(ctx), tree.with_changes(body=body[:head], footer=()))
    rest, footer = body[head:], tree.footer
    if new_head.footer:  # comments above the last import of the head, which went: above what follows it
        if rest:
            rest[0] = rest[0].with_changes(leading_lines=[*new_head.footer, *rest[0].leading_lines])
        else:
            footer = [*new_head.footer, *footer]
    return tree.with_changes(header=_kept(tree.header, new_head.header), body=[*new_head.body, *rest], footer=footer)


def _keeping_comments(base: type) -> type:
    """``base`` (LibCST's RemoveImportsVisitor), keeping the comment lines
    above an import statement it removes: they go above the statement that
    follows it in its block, or to the block's end (``without_stand_ins``, as
    Ruff's fix of an unused import keeps them).  LibCST drops them with the
    statement: a comment the user wrote, or the cell marker of a notebook
    (xlaport.notebook)."""

    class KeepingComments(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            self._gone: Dict[int, cst.SimpleStatementLine] = {}  # id -> a stand-in holding the lines

        def leave_SimpleStatementLine(self, original_node, updated_node):  # type: ignore[no-untyped-def]
            if updated_node.body or all(line.comment is None for line in updated_node.leading_lines):
                return updated_node
            new = stand_in(updated_node)
            self._gone[id(new)] = new
            return new

        def leave_IndentedBlock(self, original_node, updated_node):  # type: ignore[no-untyped-def]
            return without_stand_ins(updated_node, self._gone) if self._gone else updated_node

        def leave_Module(self, original_node, updated_node):  # type: ignore[no-untyped-def]
            updated_node = super().leave_Module(original_node, updated_node)
            return without_stand_ins(updated_node, self._gone) if self._gone else updated_node

    return KeepingComments


def _add(needed: List[Request], tree: cst.Module) -> cst.Module:
    """Run LibCST's AddImportsVisitor on the only part of the module it reads
    and writes -- the docstring and the block of imports at the top, plus one
    statement -- and put the rest of the body back untouched.  Running it on a
    4,000-line module would rebuild every node of it to change two lines.

    Within that part, what the visitor cannot act on is shown to it as a
    stand-in of the same shape (see ``_stand_in``) and put back afterwards:
    most of a large module's head is long lists of names imported from
    other modules."""
    from libcst.codemod import Codemod, CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor

    ctx = CodemodContext()
    for module, obj, asname in needed:
        AddImportsVisitor.add_needed_import(ctx, module, obj, asname)
    roots = {module.split(".")[0] for module, _, _ in needed}
    body = list(tree.body)
    k = head_length(tree)
    originals: Dict[str, cst.CSTNode] = {}
    for i, stmt in enumerate(body[: k + 1]):
        stand_in = _stand_in(stmt, roots, len(originals), i == k)
        if stand_in is not None:
            originals[stand_in[0]] = stmt
            body[i] = stand_in[1]
    head = tree.with_changes(body=body[: k + 1], footer=())
    new_head = Codemod.transform_module(AddImportsVisitor(ctx), head)
    new_body = [_original(stmt, originals) for stmt in new_head.body]
    return tree.with_changes(header=_kept(tree.header, new_head.header), body=[*new_body, *body[k + 1 :]])


def _kept(old: Sequence[cst.CSTNode], new: Sequence[cst.CSTNode]) -> Sequence[cst.CSTNode]:
    """``old`` where the visitor gave back an equal copy of it (LibCST's
    visitors rebuild every node they pass): the module's comment header
    stays the same objects, so its code need not be generated again
    (``splice.spliced_code``)."""
    same = len(old) == len(new) and all(a is b or a.deep_equals(b) for a, b in zip(old, new))
    return old if same else new


_STAND_IN = "__xlaport_stand_in_"


def _stand_in(stmt: cst.CSTNode, roots: Set[str], n: int, last: bool) -> Optional[Tuple[str, cst.CSTNode]]:
    """A small statement that the visitor treats as it would ``stmt``, or
    None to show it ``stmt`` itself.  The visitor reads the import lines at
    the top (one import per line continues the block), acts only on imports
    of the modules asked for (relative ones it cannot resolve without a
    package name, which it is not given), and may add a blank line before
    the first statement after them.  So an import of another module stands
    in as another plain import, and a compound statement after the imports
    (a 3,000-line class) as ``pass`` -- each with the same leading lines."""
    name = f"{_STAND_IN}{n}"
    if isinstance(stmt, cst.SimpleStatementLine):
        if last or len(stmt.body) != 1 or _mentions(stmt.body[0], roots):
            return None
        small: cst.BaseSmallStatement = cst.Import(names=[cst.ImportAlias(name=cst.Name(name))])
    elif last and isinstance(stmt, cst.BaseCompoundStatement) and not find_all(stmt, (cst.Import, cst.ImportFrom)):
        small = cst.Expr(cst.Name(name))
    else:
        return None
    return name, cst.SimpleStatementLine(body=[small], leading_lines=stmt.leading_lines)  # type: ignore[attr-defined]


def _mentions(small: cst.CSTNode, roots: Set[str]) -> bool:
    """An import the visitor may act on: of (a module of) a package asked
    for; anything but an absolute import counts, to be safe."""
    if isinstance(small, cst.Import):
        return any((dotted(a.name) or "").split(".")[0] in roots for a in small.names)
    if isinstance(small, cst.ImportFrom):
        if small.relative or small.module is None:
            return False
        root = (dotted(small.module) or "").split(".")[0]
        return root in roots or root in ("", "__future__")
    return True


def _original(stmt: cst.CSTNode, originals: Dict[str, cst.CSTNode]) -> cst.CSTNode:
    """The statement a stand-in stood for, with a blank line the visitor added."""
    if not originals or not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return stmt
    small = stmt.body[0]
    name = small.value if isinstance(small, cst.Expr) else (
        small.names[0].name if isinstance(small, cst.Import) and len(small.names) == 1 else None)
    original = originals.get(name.value) if isinstance(name, cst.Name) else None
    if original is None:
        return stmt
    lines = stmt.leading_lines
    return original if len(lines) == len(original.leading_lines) else original.with_changes(leading_lines=lines)  # type: ignore[attr-defined]


def _removable(unused: List[Request], tree: cst.Module) -> Optional[int]:
    """None when LibCST's RemoveImportsVisitor cannot remove anything asked
    of it: no import of what was asked for binds a name that goes unused --
    no code outside the imports names it.  The visitor runs a whole scope
    analysis to find that out, and most requests are moot: the rule that
    asked left other uses of the name.  In doubt, it runs.

    Otherwise the number of statements of the import block at the top when
    the visitor can run on that block alone with the same result (every
    import of what was asked for is in it, and none of their names is used
    anywhere, not even in a string: ``__all__``, string annotations), and 0
    when it must see the whole module."""
    bound: List[Tuple[str, str, bool]] = []  # (what an import names, the local name it binds, in the head?)
    used: Set[str] = set()
    head = head_length(tree)
    in_head = {id(n) for stmt in tree.body[:head] for n in walk(stmt, stop=(cst.Import, cst.ImportFrom))}
    for node in walk(tree, stop=(cst.Import, cst.ImportFrom)):
        if isinstance(node, cst.Name):
            used.add(node.value)
        elif isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                name = dotted(alias.name) or ""
                local = dotted(alias.asname.name) if alias.asname is not None else name.split(".")[0]
                bound.append((name, local or "", id(node) in in_head))
    removable = False
    whole = False
    asked: Set[str] = set()  # the names bound by imports of what was asked for
    for module, obj, asname in unused:
        for name, local, at_top in bound:
            if name not in (obj or module, module):
                continue
            asked.add(local)
            if (asname is None or local == asname) and local not in used:
                removable = True
            if not at_top or local in used:
                whole = True  # LibCST decides from the whole module's scopes
    if not removable:
        return None
    if whole or _in_strings(tree, asked):
        return 0
    return head


def _in_strings(tree: cst.Module, names: Set[str]) -> bool:
    """Whether a string of the module mentions one of ``names``."""
    for node in find_all(tree, (cst.SimpleString, cst.FormattedStringText)):
        text = node.value  # type: ignore[attr-defined]
        if any(n in text for n in names):
            return True
    return False


def head_length(tree: cst.Module) -> int:
    """The docstring and the import lines at the top of the module."""
    body = tree.body
    k = 0
    while k < len(body) and (_is_import_line(body[k]) or (k == 0 and _is_docstring(body[k]))):
        k += 1
    return k


def _is_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
