"""What the program's other modules hold, where a rule needs it.

A rule reads one file; a program is many.  ``adj, features = load_data()``
with ``load_data`` in ``utils.py`` binds a sparse tensor that nothing in
this file shows: moving it to XLA raises, and a CUDA test that would switch
that move on must be kept (XLA158, XLA118).  This module answers such
questions about the modules a file imports names from:

* :func:`resolve` finds the project file an import names (``from .utils
  import f``, ``from utils import f``, ``from pkg.utils import f`` run from
  the repository's root); an installed library is not looked into;
* :func:`sparse_returns` says which functions of such a file return a sparse
  tensor (or which elements of the tuple they return), read with Python's
  ``ast``, not LibCST (no tree is built for another file); :func:`tensor_returns`
  the same for a tensor torch makes, asked where a callee's name alone would
  say "a model's output" (``analysis.tensors``); :func:`returned` asks either
  of a call in this file;
* :func:`sibling_fact` lets a codemod run on a file whose own bytes lack its
  trigger words when a module it imports from holds such a fact for a name
  the file mentions (``SIBLING_FACTS``).

An answer about a file depends on the files :func:`imported_modules` names
too: the results cache stores their sizes and times (:func:`stamps`) and
checks them before it answers again (``xlaport.cache``).
"""

from __future__ import annotations

import ast
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Set, Tuple

if TYPE_CHECKING:
    from codemods.syntax.tree import TreeCache

# what makes or uses a sparse tensor (XLA has none): torch's constructors and
# sparse products, the ``torch.sparse`` namespace, the methods that turn a
# tensor sparse; of these, the constructors and methods give a sparse value
SPARSE_MAKERS = frozenset({"torch.sparse_coo_tensor", "torch.sparse_csr_tensor", "torch.sparse_csc_tensor",
                           "torch.sparse_bsr_tensor", "torch.sparse_bsc_tensor"})
SPARSE_CALLS = SPARSE_MAKERS | {"torch.spmm", "torch.smm", "torch.hspmm", "torch.sspaddmm"}
SPARSE_METHODS = frozenset({"to_sparse", "to_sparse_coo", "to_sparse_csr", "to_sparse_csc", "to_sparse_bsr"})
# the identifiers every one of those is spelled with in code (the ``ast``
# prefilter's ``name:`` facts): ``torch.sparse.mm``, ``from torch import
# sparse`` and ``import torch.sparse as ts`` all name ``sparse``
SPARSE_NAMES = frozenset({"sparse", *(q.rpartition(".")[2] for q in SPARSE_CALLS), *SPARSE_METHODS})


def makes_sparse(qualname: str) -> bool:
    """Is a call of ``qualname`` (read through the imports) a sparse tensor
    (``torch.sparse_coo_tensor(...)``, ``torch.sparse.FloatTensor(...)``)?"""
    return qualname in SPARSE_MAKERS or (qualname.startswith("torch.sparse.") and qualname.endswith("Tensor"))


# -- other files' bytes and facts, read once per process ---------------------

_BYTES: Dict[str, Tuple[Tuple[int, int], bytes]] = {}  # (per process) path -> (stat, bytes)
# (per process) (kind, path) -> (stat, what its functions return: _returns)
_FACTS: Dict[Tuple[str, str], Tuple[Tuple[int, int], Dict[str, FrozenSet[Optional[int]]]]] = {}


def file_stamp(path: Path) -> Optional[Tuple[int, int]]:
    """(size, mtime_ns) of a regular file; None for anything else."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def read_cached(path: Path) -> Tuple[Optional[Tuple[int, int]], bytes]:
    """(its stamp, its bytes) of a file, read again only once it changed."""
    key = str(path)
    stamp = file_stamp(path)
    if stamp is None:
        return None, b""
    known = _BYTES.get(key)
    if known is None or known[0] != stamp:
        try:
            known = (stamp, path.read_bytes())
        except OSError:
            known = (stamp, b"")
        _BYTES[key] = known
    return known


# -- which file an import names -----------------------------------------------


def resolve(filename: Optional[str], module: str) -> Optional[Path]:
    """The project file that ``module`` (as imported by ``filename``: dots
    for a relative import) names: relative to the importing package; an
    absolute name from the file's directory or one of the two above it (a
    program run from its repository's root or its package).  None for
    anything else (an installed library, a module not on disk)."""
    if not filename:
        return None
    return _resolved(os.path.dirname(os.path.abspath(filename)), module)


def _resolved(here: str, module: str) -> Optional[Path]:
    key = (here, module)
    if key not in _RESOLVED:
        found = _resolve(here, module)
        _RESOLVED[key] = Path(found) if found is not None else None
    return _RESOLVED[key]


_RESOLVED: Dict[Tuple[str, str], Optional[Path]] = {}  # (per process) (directory, module) -> file
_LISTED: Dict[str, Tuple[int, FrozenSet[str]]] = {}  # (per process) directory -> (its time, the names in it)


def _resolve(here: str, module: str) -> Optional[str]:
    dots = len(module) - len(module.lstrip("."))
    parts = [p for p in module[dots:].split(".") if p]
    if dots:
        base = here
        for _ in range(dots - 1):
            if os.path.dirname(base) == base:
                return None  # above the root
            base = os.path.dirname(base)
        bases = [base]
    else:
        if not parts:
            return None
        bases = [here]
        while len(bases) < 3 and os.path.dirname(bases[-1]) != bases[-1]:
            bases.append(os.path.dirname(bases[-1]))
    for base in bases:
        found = _module_file(base, parts)
        if found is not None:
            return found
    return None


def _module_file(base: str, parts: List[str]) -> Optional[str]:
    """``base/a/b.py`` or ``base/a/b/__init__.py`` for ``parts`` a, b (only
    the package's ``__init__.py`` for none); each directory is listed once
    per process, and a file is looked at only where its name is listed."""
    directory = os.path.join(base, *parts[:-1])
    names = listed(directory)
    candidates = []
    if parts:
        if parts[-1] + ".py" in names:
            candidates.append(os.path.join(directory, parts[-1] + ".py"))
        if parts[-1] in names and "__init__.py" in listed(os.path.join(directory, parts[-1])):
            candidates.append(os.path.join(directory, parts[-1], "__init__.py"))
    elif "__init__.py" in names:
        candidates.append(os.path.join(directory, "__init__.py"))
    return next((c for c in candidates if file_stamp(c) is not None), None)  # type: ignore[arg-type]


def listed(directory: str) -> FrozenSet[str]:
    """The names in ``directory``, listed again only once its time changed."""
    try:
        mtime = os.stat(directory).st_mtime_ns
    except OSError:
        return frozenset()
    known = _LISTED.get(directory)
    if known is None or known[0] != mtime:
        try:
            known = (mtime, frozenset(os.listdir(directory)))
        except OSError:
            known = (mtime, frozenset())
        _LISTED[directory] = known
    return known[1]


# ``from M import`` and ``import M`` at a line's start (after its indent): each
# pattern starts with its keyword, which the regex engine finds by a fast
# literal search, and a match is kept where only blanks precede it on its line
# (one ``^``-anchored pattern is tried at every byte: three times slower)
_FROM = re.compile(rb"from[ \t]+(\.*[\w.]*)[ \t]+import\b")
_IMPORT = re.compile(rb"import[ \t]+([\w.]+)")


def _imported_names(source: bytes) -> List[str]:
    """The modules ``source`` imports from, in order (as written)."""
    found = []
    for pattern in (_FROM, _IMPORT):
        for match in pattern.finditer(source):
            start = match.start()
            if not source[source.rfind(b"\n", 0, start) + 1:start].strip(b" \t"):
                found.append((start, match.group(1).decode("ascii", "replace")))
    found.sort()
    return [name for _, name in found]


def imported_modules(filename: Optional[str], source: bytes) -> Dict[str, Path]:
    """The project modules ``source`` imports (``from M import ...``,
    ``import M``): the module as written (``.utils``, ``pygcn.utils``) -> its file.
    What this module may read for a file is these files: the results cache
    checks them (``xlaport.cache``)."""
    global _LAST_IMPORTS
    if _LAST_IMPORTS[0] == filename and _LAST_IMPORTS[1] is source:
        return _LAST_IMPORTS[2]  # (a file's trigger asks, then its cache entry does)
    found: Dict[str, Path] = {}
    if not filename:
        return found
    here = os.path.dirname(os.path.abspath(filename))
    for module in _imported_names(source):
        if module not in found:
            path = _resolved(here, module)
            if path is not None:
                found[module] = path
    _LAST_IMPORTS = (filename, source, found)
    return found


_LAST_IMPORTS: Tuple[Optional[str], object, Dict[str, Path]] = (None, None, {})


def sibling_fact(filename: Optional[str], source: bytes, fact: str) -> bool:
    """Does a project module that ``source`` imports from hold ``fact``
    (``sparse_returns``: a function that returns a sparse tensor) for a name
    that ``source`` mentions?  (What the modules that import ``source`` do
    with it: ``codemods.analysis.importers``.)"""
    read = {"sparse_returns": sparse_returns}[fact]
    return any(name.encode() in source for path in imported_modules(filename, source).values()
               for name in read(path))


def stamps(paths) -> Dict[str, List[int]]:  # type: ignore[no-untyped-def]
    """path -> [size, mtime_ns] of each file, and [-1, mtime_ns] of each
    directory (a file added or removed there changes it): what a cached
    answer is checked by."""
    out: Dict[str, List[int]] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[str(path)] = [st.st_size, st.st_mtime_ns]
        elif stat.S_ISDIR(st.st_mode):
            out[str(path)] = [-1, st.st_mtime_ns]
    return out


# -- what another module's functions return -----------------------------------


def sparse_returns(path: Path) -> Dict[str, FrozenSet[Optional[int]]]:
    """The module-level functions of the file at ``path`` that return a sparse
    tensor: name -> the positions it is at (None: the value returned; ``i``:
    element ``i`` of the tuple returned)."""
    return _returns(path, SPARSE)


def tensor_returns(path: Path) -> Dict[str, FrozenSet[Optional[int]]]:
    """Like :func:`sparse_returns`, for a tensor a torch call makes (TCN's
    ``data_generator`` of ``copy_memory/utils.py``: ``x = torch.cat(...)``,
    ``return x, y``)."""
    return _returns(path, TENSOR)


SPARSE, TENSOR = "sparse", "tensor"  # what a function of another module may return
_WORDS = {SPARSE: b"sparse", TENSOR: b"torch"}  # (a file without the word returns none)


def _returns(path: Path, kind: str) -> Dict[str, FrozenSet[Optional[int]]]:
    stamp, data = read_cached(path)
    known = _FACTS.get((kind, str(path)))
    if known is not None and known[0] == stamp:
        return known[1]
    facts: Dict[str, FrozenSet[Optional[int]]] = {}
    if _WORDS[kind] in data:
        try:
            facts = _Returns(ast.parse(data), kind).facts()
        except (SyntaxError, ValueError, RecursionError):
            facts = {}
    _FACTS[(kind, str(path))] = (stamp or (0, 0), facts)
    return facts


def import_aliases(module: ast.Module) -> Dict[str, str]:
    """Local name -> what the module's top-level imports bind it to."""
    aliases: Dict[str, str] = {}
    for node in module.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


_CALLED: Dict[Tuple[str, str], Tuple[Tuple[int, int], bool]] = {}  # (per process) (path, qualname) -> answer


def calls(path: Path, qualname: str) -> bool:
    """Does the module at ``path`` call ``qualname`` (``torch.nn.utils.weight_norm``),
    read through its top-level imports?"""
    stamp, data = read_cached(path)
    key = (str(path), qualname)
    known = _CALLED.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    found = False
    if qualname.rpartition(".")[2].encode() in data:
        try:
            module = ast.parse(data)
        except (SyntaxError, ValueError, RecursionError):
            module = None
        if module is not None:
            aliases = import_aliases(module)
            for node in ast.walk(module):
                text = _dotted(node.func) if isinstance(node, ast.Call) else None
                root, _, rest = (text or "").partition(".")
                full = aliases.get(root)
                if full is not None and (f"{full}.{rest}" if rest else full) == qualname:
                    found = True
                    break
    _CALLED[key] = (stamp or (0, 0), found)
    return found


class _Returns:
    """:func:`sparse_returns` or :func:`tensor_returns` (``kind``) for one
    parsed module (flow-insensitive but for the last assignment of a name
    before each ``return``)."""

    def __init__(self, module: ast.Module, kind: str) -> None:
        self.kind = kind
        self.aliases = import_aliases(module)  # local name -> what it imports
        self.functions = [n for n in module.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.known: Dict[str, FrozenSet[Optional[int]]] = {}

    def facts(self) -> Dict[str, FrozenSet[Optional[int]]]:
        for _ in range(3):  # a function that returns what another one returns
            before = dict(self.known)
            for fn in self.functions:
                found = self._returns(fn)
                if found:
                    self.known[fn.name] = found
            if self.known == before:
                break
        return self.known

    def _returns(self, fn: ast.AST) -> FrozenSet[Optional[int]]:
        assigns: Dict[str, List[Tuple[int, ast.expr]]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigns.setdefault(node.targets[0].id, []).append((node.lineno, node.value))
        out: Set[Optional[int]] = set()
        for ret in (n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None):
            value = ret.value
            if isinstance(value, ast.Tuple):
                out |= {i for i, e in enumerate(value.elts) if self._made(e, ret.lineno, assigns, 0)}
            elif self._made(value, ret.lineno, assigns, 0):  # type: ignore[arg-type]
                out.add(None)
        return frozenset(out)

    def _made(self, e: ast.expr, line: int, assigns: Dict[str, List[Tuple[int, ast.expr]]], depth: int) -> bool:
        if depth > 8:
            return False
        if isinstance(e, ast.Name):
            before = [v for at, v in assigns.get(e.id, ()) if at < line]
            return bool(before) and self._made(before[-1], line, assigns, depth + 1)
        if not isinstance(e, ast.Call):
            return False
        func = e.func
        if isinstance(func, ast.Attribute):
            if self.kind == SPARSE and func.attr in SPARSE_METHODS and not e.args:
                return True
            if self.kind == TENSOR and self._keeps_tensor(func.attr) and self._made(func.value, line, assigns,
                                                                                    depth + 1):
                return True  # `torch.cat(...).long()`
        text = _dotted(func)
        if text is None:
            return False
        root, _, rest = text.partition(".")
        full = self.aliases.get(root)
        if full is not None and self._makes(f"{full}.{rest}" if rest else full):
            return True
        return None in self.known.get(text, frozenset())  # a function of this module that returns one

    def _makes(self, qualname: str) -> bool:
        if self.kind == SPARSE:
            return makes_sparse(qualname)
        from codemods.analysis.kinds import TENSOR as TENSOR_KIND, library_kinds  # (LibCST: not on the CLI's path)

        return library_kinds(qualname, []) == frozenset({TENSOR_KIND})

    @staticmethod
    def _keeps_tensor(method: str) -> bool:
        from codemods.analysis.kinds import NON_TENSOR_METHODS  # (LibCST: not on the CLI's path)

        return method not in NON_TENSOR_METHODS


def _dotted(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def sparse_from_siblings(tree: "TreeCache", filename: Optional[str]) -> Set[str]:
    """Names this module binds to a sparse tensor that a function of another
    project module returns (``adj, features = load_data()``): the value, or
    the elements of the tuple it returns that are sparse."""
    import libcst as cst

    from codemods.syntax.tree import dotted as cst_dotted

    out: Set[str] = set()
    if not _modules_of(tree, filename):
        return out
    for assign in tree.nodes((cst.Assign,)):
        call = assign.value  # type: ignore[attr-defined]
        if not isinstance(call, cst.Call):
            continue
        found = returned(tree, filename, call, SPARSE)
        if found:
            for target in (t.target for t in assign.targets):  # type: ignore[attr-defined]
                if None in found:
                    out.add(cst_dotted(target) or "")
                elif isinstance(target, (cst.Tuple, cst.List)):
                    out |= {cst_dotted(e.value) or "" for i, e in enumerate(target.elements) if i in found}
    return out - {""}


def returned(tree: "TreeCache", filename: Optional[str], call: object, kind: str) -> FrozenSet[Optional[int]]:
    """Where ``call`` (a LibCST ``Call`` of a name imported from a project
    module) returns a ``kind`` value (:func:`sparse_returns`,
    :func:`tensor_returns`): None, the value; ``i``, element ``i``."""
    modules = _modules_of(tree, filename)
    for qualname in tree.import_qualnames(call.func) or () if modules else ():  # type: ignore[attr-defined]
        module, _, name = qualname.rpartition(".")
        path = modules.get(module)
        found = _returns(path, kind).get(name) if path is not None else None
        if found:
            return found
    return frozenset()


def imported_from(tree: "TreeCache", callee: object) -> Optional[Tuple[Path, str]]:
    """(the project file, the name there) of a callee this file imports
    from a project module (``accuracy`` of ``from util import accuracy``),
    or None: defined here, from a library, or not found."""
    modules = _modules_of(tree, tree.filename)
    for qualname in tree.import_qualnames(callee) or () if modules else ():  # type: ignore[arg-type]
        module, _, name = qualname.rpartition(".")
        path = modules.get(module)
        if path is not None:
            return path, name
    return None


def _modules_of(tree: "TreeCache", filename: Optional[str]) -> Dict[str, Path]:
    if not filename:
        return {}
    source = tree.source or (tree.text if tree.text is not None else tree.module.code).encode("utf-8")
    return imported_modules(filename, source)
