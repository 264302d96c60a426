"""Which attributes of a model class are its buffers (on the device once
the model is).

* A buffer registered by name (``self.register_buffer("alphas", ...)``,
  or through a helper of that name) in a model class: :meth:`ModelBuffers.named`.
* A buffer registered under a computed name (``for k, v in schedules.items():
  self.register_buffer(k, v)``, minDiffusion's and TeaPearce's DDPM): an
  attribute ``self.alphas`` that nothing stores can only be such a buffer,
  in a class whose bases down to ``nn.Module`` are all known (classes of this
  module, or of a project module it imports them from: minDiffusion's
  ``class DDIM(DDPM)`` with ``from .ddpm import DDPM``), none with a
  ``__getattr__`` or ``setattr`` of its own, one of which registers such a
  buffer: :meth:`ModelBuffers.computed`.

A base in another project module is read from that module's own tree, by
this same definition: parsed with LibCST once per process and file (while
its size and time stay the same), and only where that module registers a
buffer under a computed name itself.  The results cache checks the files a
module imports from (``codemods.analysis.project.stamps``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, FrozenSet, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.dataflow import dataflow
from codemods.analysis.project import resolve
from codemods.analysis.values import MODULE, class_kinds
from codemods.syntax.tree import TreeCache, call_name, find_all, string_value

# (registers a buffer under a computed name, the attribute names the chain
# defines or its modules store); None: not a chain of known model classes
Chain = Optional[Tuple[bool, FrozenSet[str]]]


class ModelBuffers:
    """The buffers of the model classes of one tree."""

    def __init__(self, tree: TreeCache) -> None:
        self.tree = tree
        self._named: Dict[int, Set[str]] = {}
        self._chains: Dict[int, Chain] = {}

    def named(self, node: cst.CSTNode) -> Set[str]:
        """The buffers a model class around ``node`` registers by name."""
        cls = self._class_of(node)
        if cls is None:
            return set()
        if id(cls) not in self._named:
            names = {string_value(c.args[0].value) for c in find_all(cls, cst.Call, stop=(cst.ClassDef,))
                     if call_name(c) == "register_buffer" and c.args}  # type: ignore[attr-defined]
            model = class_kinds(self.tree, cls) == {MODULE}
            self._named[id(cls)] = {n for n in names if n} if model else set()
        return self._named[id(cls)]

    def computed(self, node: cst.Attribute) -> bool:
        """Is ``self.<name>`` (``node``) a buffer registered under a computed name?"""
        cls = self._class_of(node)
        chain = self.chain(cls) if cls is not None else None
        if chain is None or not chain[0]:
            return False
        name = node.attr.value
        return name not in chain[1] and name not in stored_attributes(self.tree)

    def chain(self, cls: cst.ClassDef) -> Chain:
        """``cls``'s :data:`Chain`, through its one base down to ``nn.Module``."""
        if id(cls) in self._chains:
            return self._chains[id(cls)]
        self._chains[id(cls)] = None  # (a class that is its own base)
        registers = any(call_name(c) == "register_buffer" and c.args  # type: ignore[attr-defined]
                        and string_value(c.args[0].value) is None  # type: ignore[attr-defined]
                        for c in find_all(cls, cst.Call, stop=(cst.ClassDef,)))
        own = frozenset({n.name.value for n in cls.body.body if isinstance(n, (cst.FunctionDef, cst.ClassDef))} | {
            t.value for n in find_all(cls.body, (cst.Assign, cst.AnnAssign), stop=(cst.FunctionDef,))
            for t in find_all(n, cst.Name) if _stored_name(n, t)})
        blocked = "__getattr__" in own or any(call_name(c) == "setattr"  # type: ignore[arg-type]
                                              for c in find_all(cls, cst.Call, stop=(cst.ClassDef,)))
        found: Chain = None
        base = cls.bases[0].value if len(cls.bases) == 1 and not blocked else None
        quals = self.tree.import_qualnames(base) or set() if base is not None else set()
        if "torch.nn.Module" in quals:
            found = (registers, own)
        elif isinstance(base, cst.Name):
            parent = next((c for c in self.tree.module.body if isinstance(c, cst.ClassDef)
                           and c.name.value == base.value), None)
            inherited = self.chain(parent) if parent is not None else _imported_chain(self.tree, quals)
            if inherited is not None:
                found = (registers or inherited[0], own | inherited[1])
        self._chains[id(cls)] = found
        return found

    def _class_of(self, node: cst.CSTNode) -> Optional[cst.ClassDef]:
        return next((a for a in dataflow(self.tree).ancestors(node) if isinstance(a, cst.ClassDef)), None)


def model_buffers(tree: TreeCache) -> ModelBuffers:
    return tree.analysis(ModelBuffers, "buffers")


def _stored_name(statement: cst.CSTNode, name: cst.Name) -> bool:
    """Is ``name`` a name the class-level ``statement`` binds?"""
    targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]  # type: ignore[attr-defined]
    return any(m is name for t in targets if not isinstance(t, cst.Attribute) for m in find_all(t, cst.Name))


def stored_attributes(tree: TreeCache) -> Set[str]:
    """Every attribute name the module stores into anywhere (``x.a = ...``,
    ``x.a, y = ...``, ``x.a += ...``, ``x.a: T = ...``)."""
    found = tree.memo.get("placement:stored_attributes")
    if found is None:
        found = set()
        for stmt in find_all(tree.module, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in stmt.targets] if isinstance(stmt, cst.Assign) else [stmt.target]  # type: ignore[attr-defined]
            for t in targets:
                found.update(a.attr.value for a in find_all(t, cst.Attribute))  # type: ignore[attr-defined]
        for loop in find_all(tree.module, (cst.For, cst.CompFor)):
            found.update(a.attr.value for a in find_all(loop.target, cst.Attribute))  # type: ignore[attr-defined]
        tree.memo["placement:stored_attributes"] = found
    return found  # type: ignore[return-value]


# -- a base class of another project module -----------------------------------

# a registration under a computed name, in another module's bytes: only a
# module with one is parsed (a chain that reaches one through a module that
# registers nothing itself is not followed)
_COMPUTED_REGISTER = re.compile(rb"register_buffer\(\s*[^\s'\"]")

# (per process) path -> ((size, mtime_ns), class name -> its chain with the
# attributes its module stores); a module that imports back is met as None
_OTHER: Dict[str, Tuple[Optional[Tuple[int, int]], Dict[str, Chain]]] = {}


def _imported_chain(tree: TreeCache, quals: Set[str]) -> Chain:
    """The chain of a base imported from a project module (``from .ddpm
    import DDPM``): read from that module's tree, with the attributes that
    module stores anywhere counted as defined."""
    if len(quals) != 1 or not tree.filename:
        return None
    module, _, name = next(iter(quals)).rpartition(".")
    if not module or module.split(".")[0] in ("torch", "torch_xla"):
        return None
    path = resolve(tree.filename, module)
    return _chains_of(path).get(name) if path is not None else None


def _chains_of(path: Path) -> Dict[str, Chain]:
    key = str(path)
    try:
        st = os.stat(path)
        stamp: Optional[Tuple[int, int]] = (st.st_size, st.st_mtime_ns)
    except OSError:
        return {}
    known = _OTHER.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    _OTHER[key] = (stamp, {})  # (while it is read: a circle of imports finds nothing)
    found: Dict[str, Chain] = {}
    try:
        data = path.read_bytes()
        if _COMPUTED_REGISTER.search(data):
            other = TreeCache(cst.parse_module(data), data, filename=key)
            try:
                buffers = model_buffers(other)
                stored = frozenset(stored_attributes(other))
                for cls in other.module.body:
                    if isinstance(cls, cst.ClassDef):
                        chain = buffers.chain(cls)
                        found[cls.name.value] = (chain[0], chain[1] | stored) if chain is not None else None
            finally:
                other.release()
    except (OSError, cst.ParserSyntaxError, RecursionError, TypeError, ValueError):
        found = {}
    _OTHER[key] = (stamp, found)
    return found
