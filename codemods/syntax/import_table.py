"""The import table of a tree: which local name an import binds to which
qualified name, and which names are bound some other way too (then a name
cannot be read through the imports alone).  A part of
:class:`codemods.syntax.tree.TreeCache`."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.syntax.nodes import dotted, walk

# The packages whose names the rules look for.  A name imported from any other
# package can never match a rule, so it needs no scope analysis to be sure.
RULE_PACKAGES = ("torch", "torch_xla", "tqdm")

_BINDING_NODES = (cst.Import, cst.ImportFrom, cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor,
                  cst.NamedExpr, cst.Param, cst.FunctionDef, cst.ClassDef, cst.WithItem, cst.ExceptHandler,
                  cst.ExceptStarHandler, cst.Global, cst.Nonlocal, cst.Del)
_TARGETED = frozenset({cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr})


class ImportTable:
    """Imports and rebound names of ``self.module`` (read from the node index)."""

    pending: Tuple[Tuple[str, Optional[str], Optional[str]], ...]

    def _init_imports(self) -> None:
        self._imports: Optional[Dict[str, str]] = None
        self._rebound: Optional[Set[str]] = None

    nodes: "Callable[[Tuple[type, ...]], List[cst.CSTNode]]"  # (the node index's)

    @property
    def imports(self) -> Dict[str, str]:
        """Local name -> qualified name for every import in the module
        (``import torch as T`` gives ``{"T": "torch"}``)."""
        if self._imports is None:
            self._scan_bindings()
        return self._imports  # type: ignore[return-value]

    @property
    def rebound(self) -> Set[str]:
        """Names bound anywhere in the module other than by one import:
        assignments, parameters, loop targets, definitions, conflicting imports."""
        if self._rebound is None:
            self._scan_bindings()
        return self._rebound  # type: ignore[return-value]

    def _scan_bindings(self) -> None:
        table: Dict[str, str] = {}
        rebound: Set[str] = set()

        def bind_import(local: str, full: str) -> None:
            if table.get(local, full) != full:
                rebound.add(local)
            table[local] = full

        for module, obj, asname in self.pending:
            if obj is None:
                bind_import(asname or module.split(".")[0], module if asname else module.split(".")[0])
            else:
                bind_import(asname or obj, f"{module}.{obj}")
        for node in self.nodes(_BINDING_NODES):  # the type index: no walk of the tree
            kind = type(node)  # (exact types: none of these classes has a subclass)
            if kind is cst.Import:
                for alias in node.names:
                    full = dotted(alias.name) or ""
                    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                        bind_import(alias.asname.name.value, full)
                    else:
                        bind_import(full.split(".")[0], full.split(".")[0])
            elif kind is cst.ImportFrom and not isinstance(node.names, cst.ImportStar):
                base = "." * len(node.relative) + ((dotted(node.module) or "") if node.module else "")
                for alias in node.names:
                    name = dotted(alias.name) or ""
                    asname = alias.asname
                    local = asname.name.value if (asname is not None and isinstance(asname.name, cst.Name)) else name
                    bind_import(local, f"{base}.{name}")
            elif kind in _TARGETED:
                rebound |= _bound_names(node.target)
            elif kind is cst.Param or kind is cst.FunctionDef or kind is cst.ClassDef:
                rebound.add(node.name.value)
            elif kind is cst.WithItem or kind is cst.ExceptHandler or kind is cst.ExceptStarHandler:
                asname = node.asname if kind is cst.WithItem else node.name
                if asname is not None:
                    rebound |= _bound_names(asname.name)
            elif kind is cst.Global or kind is cst.Nonlocal or kind is cst.Del:
                rebound |= {n.value for n in walk(node) if type(n) is cst.Name}
        self._imports, self._rebound = table, rebound

    def import_qualnames(self, node: cst.CSTNode) -> Optional[Set[str]]:
        """The qualified name of a ``Name``/``Attribute`` chain read through
        the module's imports, or None when that is not certain (its root is
        also bound some other way somewhere in the module)."""
        text = dotted(node)
        if not text:
            return set()
        root, _, rest = text.partition(".")
        full = self.imports.get(root)
        if full is None:
            # Not imported: it can only be a local or builtin name, never
            # one of the library names the rules look for.
            return set()
        if root in self.rebound and full.split(".")[0] in RULE_PACKAGES:
            return None
        return {f"{full}.{rest}" if rest else full}


def _bound_names(target: object) -> Set[str]:
    """Names bound by an assignment target (not ``a.b`` or ``a[i]``)."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for e in target.elements for n in _bound_names(e.value)}
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return set()
