"""What every xlaport codemod shares: rule metadata, findings, suppressions.

A *rule* is a stable code (``XLA101``) with a name and three-part docs (what it
does, why it matters on XLA, an example before/after).  A *codemod* is one
LibCST transform for one concern (devices, progress bars, loops, host reads);
it owns the rules of that concern and checks each rule's code before it
rewrites or reports anything, so ``--select``/``--ignore`` and suppression
comments work per rule.

Findings go to ``context.scratch[FINDINGS_KEY]`` so that both xlaport's engine
and LibCST's own runner (``python -m libcst.tool codemod``) can run these
classes unchanged.  The base class speaks LibCST's ``CodemodCommand``
protocol without importing ``libcst.codemod`` (and its matchers, a fifth of a
second): that package is loaded only when imports are applied, or by LibCST's
runner itself, which then sees the codemods as its own commands.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst._metadata_dependent import LazyValue
from libcst.metadata import QualifiedNameProvider

from codemods.syntax import imports
from codemods.syntax.traverse import transform_module

from codemods.rule import (  # noqa: F401 -- re-exported
    ALL,
    FILE_SUPPRESS_RE,
    Finding,
    Rule,
    code_matches,
    file_suppressions,
    parse_suppressions,
)
from codemods.findings import (  # noqa: F401 -- re-exported
    CHOICE_CODE,
    FINDINGS_KEY,
    KEPT_SWITCH_CODE,
    KEPT_SPANS_KEY,
    KEPT_SWITCHES_KEY,
    ORIGINAL_LINE_KEY,
    SELECT_KEY,
    SILENCED_KEY,
    SWITCH_CODES,
    UNPLACED_KEY,
    USED_SUPPRESSIONS_KEY,
    Reports,
    Unplaced,
    place,
)
from codemods.target import DEFAULT_TARGET, Import, Target, get_target
from codemods.syntax.tree import (  # noqa: F401 -- re-exported: the rules import them from here
    RULE_PACKAGES,
    TreeCache,
    call_name,
    dotted,
    find_all,
    string_value,
    unique,
    walk,
)

SOURCE_KEY = "xlaport.source"
OPTIONS_KEY = "xlaport.options"
TARGET_KEY = "xlaport.target"
TREE_KEY = "xlaport.tree"


# ---------------------------------------------------------------- the base class


class Context:
    """The part of LibCST's ``CodemodContext`` a codemod reads: the engine
    makes these; LibCST's runner passes its own ``CodemodContext``."""

    def __init__(self, filename: Optional[str] = None, scratch: Optional[Dict[str, Any]] = None) -> None:
        self.filename = filename
        self.scratch: Dict[str, Any] = scratch if scratch is not None else {}
        self.warnings: List[str] = []
        self.wrapper = None
        self.full_module_name: Optional[str] = None
        self.full_package_name: Optional[str] = None


class XlaCodemod(Reports, cst.CSTTransformer):
    """Base class for xlaport codemods.

    A command in LibCST's ``CodemodCommand`` protocol (so ``python -m
    libcst.tool codemod`` runs it: ``DESCRIPTION``, ``add_args``,
    ``transform_module``) that transforms with a plain ``CSTTransformer``: no
    rule uses matcher decorators, and LibCST's matcher dispatch costs a check
    on every node.

    Subclasses set ``DESCRIPTION`` (one line), ``RULES`` and ``TRIGGERS``
    (byte strings; a file that contains none of them cannot need this codemod
    and is skipped before it is parsed), and ``NEEDS`` when the ``ast``
    prefilter can rule the codemod out more tightly.
    """

    DESCRIPTION: str = ""
    RULES: Tuple[Rule, ...] = ()
    TRIGGERS: Tuple[bytes, ...] = ()
    # Facts of ``codemods.analysis.prefilter`` (or ``option:NAME`` for a run
    # option that is set) of which one must hold for this codemod to find
    # anything; empty: the trigger bytes decide alone.
    NEEDS: Tuple[str, ...] = ()
    # Facts of ``codemods.analysis.project`` (``sparse_returns``) that, held by
    # a project module this file imports from for a name the file mentions,
    # trigger this codemod as its own trigger bytes do (``adj = load_data()``,
    # a sparse tensor made there).
    SIBLING_FACTS: Tuple[str, ...] = ()
    # Report instead of rewriting in a module that already supports XLA
    # (``TreeCache.knows_xla``): for rules whose CUDA branches may be deliberate.
    RESPECTS_HAND_PORTS: bool = False

    @classmethod
    def wanted(cls, tree: "TreeCache", options: Dict[str, object]) -> bool:
        """Cheap second filter, on the parsed tree: False when this codemod
        cannot find anything in it, so the engine skips its transform pass."""
        return True

    def regions(self, tree: "TreeCache") -> Optional[List[cst.CSTNode]]:
        """The subtrees that can hold anything for this codemod, or None for
        the whole module.  Everything else is skipped while transforming: a
        LibCST pass rebuilds every node it enters, so not entering code that
        cannot change is most of the speed of a run over a large package."""
        return None

    # Metadata is resolved on first use (see ``_metadata``), not up front: a
    # pass that never asks for qualified names or positions does not pay for
    # them, and passes over the same tree share what was computed.
    METADATA_DEPENDENCIES = ()

    def __init__(
        self,
        context: Any,
        target: Optional[str] = None,
        select: Optional[Sequence[str]] = None,
        **options: object,
    ) -> None:
        cst.CSTTransformer.__init__(self)
        self.context = context
        scratch = context.scratch
        self.target: Target = get_target(
            target or scratch.get(TARGET_KEY) or DEFAULT_TARGET  # type: ignore[arg-type]
        )
        sel = select if select is not None else scratch.get(SELECT_KEY)
        self._selected: Set[str] = {
            r.code for r in self.RULES if sel is None or code_matches(r.code, sel)  # type: ignore[arg-type]
        }
        self.options: Dict[str, object] = dict(scratch.get(OPTIONS_KEY, {}))  # type: ignore[arg-type]
        self.options.update({k: v for k, v in options.items() if v is not None})
        self._suppressed: Dict[int, FrozenSet[str]] = {}
        self._tree: Optional[TreeCache] = None
        self._region_ids: Optional[Set[int]] = None
        self._keep_ids: Set[int] = set()
        self._in_region: Optional[cst.CSTNode] = None
        self._pruned: Optional[cst.CSTNode] = None
        self._unplaced: List[Unplaced] = []  # placed by _place_findings

    # -- LibCST's command protocol -----------------------------------------
    @staticmethod
    def add_args(arg_parser: object) -> None:
        """No command-line arguments of its own under LibCST's runner."""

    def should_allow_multiple_passes(self) -> bool:
        return False

    def warn(self, warning: str) -> None:
        self.context.warnings.append(warning)

    def transform_module(self, tree: cst.Module) -> cst.Module:
        """LibCST's entry point: the transform, then the imports it asked for
        (what ``CodemodCommand.transform_module`` does)."""
        tree = self.transform_module_impl(unique(tree))
        return imports.apply(self.context, tree)[0]

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        source = self.context.scratch.get(SOURCE_KEY)
        if not isinstance(source, str):
            source = tree.code
        self._suppressed = parse_suppressions(source)
        self._tree = tree_cache(self.context, tree)
        self._unplaced = []
        regions = self.regions(self._tree)
        if regions is None:
            self._region_ids = None
        else:
            self._region_ids = {id(n) for n in regions}
            self._keep_ids = self._tree.ancestor_ids(regions)
        try:
            return transform_module(tree, self)
        finally:
            pending = self.context.scratch.get(UNPLACED_KEY)
            if isinstance(pending, list):  # the engine places them, with the next passes' on this tree
                pending.extend(self._unplaced)
                self._unplaced = []
            else:
                self._place_findings()


    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._region_ids is not None and self._in_region is None:
            if id(node) in self._region_ids:
                self._in_region = node
            elif id(node) not in self._keep_ids:
                self._pruned = node
                return False
        # (LibCST's on_visit/on_leave, with the visit_X/leave_X of each
        # class found once, not by name at every node)
        visit = _handler(type(self), "visit_", type(node))
        return visit is None or visit(self, node) is not False

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[override]
        if self._pruned is original_node:
            self._pruned = None
            return updated_node
        leave = _handler(type(self), "leave_", type(original_node))
        result = updated_node if leave is None else leave(self, original_node, updated_node)
        if self._in_region is original_node:
            self._in_region = None
        return result

    @property
    def tree(self) -> "TreeCache":
        assert self._tree is not None, "only inside transform_module()"
        return self._tree

    def meta(self, provider: type, node: cst.CSTNode, default: object = None) -> object:
        """``get_metadata`` for metadata resolved on first use."""
        value = self.tree.metadata(self.context, provider).get(node, default)
        return value() if isinstance(value, LazyValue) else value

    # -- helpers for subclasses --------------------------------------------
    def enabled(self, code: str) -> bool:
        return code in self._selected

    def selected(self, code: str) -> bool:
        """Is ``code`` (any rule's) selected for this run?"""
        sel = self.context.scratch.get(SELECT_KEY)
        return sel is None or code_matches(code, sel)

    def option(self, name: str, default: object) -> object:
        return self.options.get(name, default)


    def add_imports(self, needed: Iterable[Import]) -> None:
        for module, obj, asname in needed:
            imports.need(self.context, module, obj, asname)

    def remove_unused_import(self, module: str, obj: Optional[str] = None, asname: Optional[str] = None) -> None:
        """Remove that import at the end if nothing uses its name any more."""
        imports.drop(self.context, module, obj, asname)

    def qualnames(self, node: cst.CSTNode) -> Set[str]:
        """Qualified names of ``node`` (a callee, usually).

        Read from the module's imports when that is exact -- the name's root
        is imported and bound no other way anywhere in the module, which is
        nearly always --, else from the bindings where it is read
        (``bindings.import_qualnames``: the provider's answer), and from
        LibCST's ``QualifiedNameProvider`` (full scope analysis, about a
        second per thousand lines) where neither is sure."""
        quick = self.tree.import_qualnames(node)
        if quick is None:  # the root is also bound some other way: by scope
            from codemods.analysis.bindings import import_qualnames  # (the analysis imports this module)

            quick = import_qualnames(self.tree, node)
        if quick is not None:
            return quick
        return {q.name for q in self.meta(QualifiedNameProvider, node, ())}  # type: ignore[attr-defined, union-attr]

    def is_qualname(self, node: cst.CSTNode, *names: str) -> bool:
        return bool(self.qualnames(node) & set(names))


    def ancestors(self, node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        cur = self.parent(node)
        while cur is not None:
            yield cur
            cur = self.parent(cur)


# LibCST's runner imports its codemod package before it imports a command:
# there, let ``libcst.tool list`` count the codemods among its commands.
if "libcst.codemod" in sys.modules:
    sys.modules["libcst.codemod"].CodemodCommand.register(XlaCodemod)


_HANDLERS: Dict[Tuple[type, str, type], Any] = {}


def _handler(codemod: type, prefix: str, kind: type) -> Any:
    """The ``visit_X``/``leave_X`` function of ``codemod`` for nodes of
    ``kind``, or None (found by name once per class and kind)."""
    key = (codemod, prefix, kind)
    try:
        return _HANDLERS[key]
    except KeyError:
        found = _HANDLERS[key] = getattr(codemod, prefix + kind.__name__, None)
        return found


def tree_cache(context: Any, module: cst.Module) -> TreeCache:
    """The cache for ``module`` kept in the context, made if missing or stale."""
    cache = context.scratch.get(TREE_KEY)
    if not isinstance(cache, TreeCache) or cache.module is not module:
        source = context.scratch.get(SOURCE_KEY)
        cache = TreeCache(module, source.encode("utf-8", "surrogateescape") if isinstance(source, str) else b"",
                          filename=getattr(context, "filename", None))
        context.scratch[TREE_KEY] = cache
    return cache


def statement(expr: cst.BaseExpression) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(body=[cst.Expr(expr)])


__all__ = [
    "ALL", "Context", "FILE_SUPPRESS_RE", "FINDINGS_KEY", "ORIGINAL_LINE_KEY", "SILENCED_KEY", "OPTIONS_KEY", "USED_SUPPRESSIONS_KEY", "SELECT_KEY", "SOURCE_KEY", "TARGET_KEY", "TREE_KEY", "UNPLACED_KEY", "Unplaced", "RULE_PACKAGES", "Finding",
    "Rule", "TreeCache", "XlaCodemod", "call_name", "code_matches", "dotted", "file_suppressions", "find_all",
    "parse_suppressions", "place",
    "statement", "string_value", "tree_cache", "unique", "walk",
]
