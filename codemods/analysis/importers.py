"""Which project modules import a file and call its functions where they
have a step or loader loop (read, never rewritten).

A rule reads one file; the question "who calls this helper, with what?" is
asked of the modules that import it.  :func:`step_callers` names them by
the calls their text shows (a regular expression, once per file and
process) and the ``ast`` prefilter's facts; which loops hand which
arguments is then the callers' own trees' to say (``codemods.step_callers``).
:func:`consulted` lists what such an answer read: the results cache checks
it (``xlaport.cache``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from codemods.analysis.project import calls, file_stamp, imported_modules, listed

# top-level functions of a module (a helper another module calls by name)
_TOP_DEF = re.compile(rb"^def[ \t]+(\w+)[ \t]*\(", re.MULTILINE)
# (per process) a file -> the other files and directories an answer about it read
_CONSULTED: Dict[str, Set[str]] = {}


def consulted(filename: str) -> Set[str]:
    """The files and directories read for answers about ``filename``
    beyond those it imports (the results cache checks them too): where its
    own folder was listed, the file itself is among them."""
    return _CONSULTED.get(os.path.abspath(filename), set())


def step_callers(filename: Optional[str], source: bytes) -> Dict[str, List[Path]]:
    """A function of ``source`` (not a dunder) -> the project modules that
    import ``filename`` and call it by name where they have a step or loader
    loop (``codemods.analysis.prefilter``): TCN's ``word_cnn_test.py``
    calling ``get_batch`` of ``utils.py``.  Top-level functions where one
    starts a slice with a parameter (``SLICES_BY_PARAMETER``); methods too
    where one indexes a table with a parameter (``INDEXES_BY_PARAMETER``:
    ``tools/sample_ddpm.py`` calling ``scheduler.sample_prev_timestep``).
    An importer is a ``.py`` file in the file's directory, one of the two
    above it (where :func:`resolve` looks), or a few folders beside its own
    (:func:`_script_dirs`); which loops call it with what is the caller's
    own tree's to say."""
    from codemods.analysis.prefilter import INDEXER, SLICES_BY_PARAMETER, facts_of

    if not filename:
        return {}
    facts = facts_of(source) or frozenset()
    names = {m.group(1) for m in _TOP_DEF.finditer(source)} if SLICES_BY_PARAMETER in facts else set()
    names |= {f[len(INDEXER):].encode() for f in facts if f.startswith(INDEXER)}
    names = {n for n in names if not n.startswith(b"__")}
    if not names:
        return {}
    path = os.path.abspath(filename)
    found: Dict[str, List[Path]] = {}
    for other in _candidates(path):
        stamp, calls = _calls_in(other)
        if stamp is None:
            continue
        called = [n for n in names if n in calls]
        if called and path in _imports(other) and _has_hot_loop(other):
            for name in called:
                found.setdefault(name.decode(), []).append(Path(other))
    return found


def ported_importer(filename: Optional[str], source: bytes) -> bool:
    """Does a project module being ported (naming CUDA:
    ``prefilter.BEING_PORTED``) import ``filename``, or import a module
    that imports it?  ``train.py`` choosing ``"cuda"`` and importing the
    ``Seq2Seq`` of ``models.py``, whose decoder is fed by the host's random
    numbers: ``models.py`` is code being ported too, though it names no
    CUDA.  Importers are looked for where :func:`step_callers` looks."""
    return _importer_where(filename, _ported)


def importer_calls(filename: Optional[str], qualname: str) -> bool:
    """Does a project module that imports ``filename`` (or imports a module
    that imports it) call ``qualname``, read through its imports?  nerf-pytorch's
    ``run_nerf.py`` calling ``torch.set_default_tensor_type``, which decides
    what ``torch.Tensor(...)`` in ``run_nerf_helpers.py`` makes."""
    return _importer_where(filename, lambda other: calls(Path(other), qualname))


def _importer_where(filename: Optional[str], holds: Callable[[str], bool]) -> bool:
    """Does ``holds`` hold for a module that imports ``filename``, or for one
    that imports such a module?"""
    if not filename:
        return False
    path = os.path.abspath(filename)
    between: List[str] = []
    imports: Dict[str, FrozenSet[str]] = {}  # (each file's imports, its stamp checked once for this answer)

    def imported_by(other: str) -> FrozenSet[str]:
        found = imports.get(other)
        if found is None:
            found = imports[other] = _imports(other)
        return found

    for other in _candidates(path):
        if path in imported_by(other):
            if holds(other):
                return True
            between.append(other)
    for middle in between:  # one module between (``train.py`` -> ``trainer.py`` -> ``models.py``)
        if any(middle in imported_by(o) and holds(o) for o in _candidates(middle, path) if o != path):
            return True
    return False


def imported_elsewhere(filename: Optional[str]) -> bool:
    """Does another project module import ``filename`` (looked for where
    :func:`step_callers` looks)?  Without a file name (text handed in),
    nothing can."""
    if not filename:
        return False
    path = os.path.abspath(filename)
    return any(path in _imports(other) for other in _candidates(path))


def _candidates(path: str, asked: Optional[str] = None) -> List[str]:
    """The ``.py`` files that may import ``path``: in its directory, the two
    above it and a few folders beside its own (:func:`_script_dirs`), where
    :func:`project.resolve` finds a module.  What is listed is consulted
    for the file asked about (``asked``, else ``path``: the results cache
    checks it)."""
    here = os.path.dirname(path)
    dirs = [here]
    while len(dirs) < 3 and os.path.dirname(dirs[-1]) != dirs[-1]:
        dirs.append(os.path.dirname(dirs[-1]))
    dirs += [d for d in _script_dirs(dirs[1]) if d != here] if len(dirs) > 1 else []
    seen = _CONSULTED.setdefault(asked or path, set())
    seen.update(dirs)
    found = [os.path.join(d, e) for d in dirs for e in sorted(listed(d)) if e.endswith(".py")]
    seen.update(found)  # (the file itself too: every module of a folder consults the same files, one cache group)
    return [f for f in found if f != path]


def _script_dirs(root: str) -> List[str]:
    """The other folders beside a module's own, where a project keeps its
    scripts (``tools/sample_ddpm.py`` importing ``scheduler/...``): only in
    a project's root (no package: a library's ``models/`` is one), and only
    where they are few."""
    names = listed(root)
    if "__init__.py" in names:
        return []
    found = [os.path.join(root, n) for n in sorted(names) if "." not in n and not n.startswith("_")]
    found = [d for d in found if os.path.isdir(d)]
    return found if len(found) <= _FEW_DIRS else []


_FEW_DIRS = 16
_CALL_NAME = re.compile(rb"(\w+)\(")
# (per process) path -> (stamp, the names it calls): a directory's files are
# many, so what is kept of each is the names, not its bytes
_CALLS: Dict[str, Tuple[Optional[Tuple[int, int]], FrozenSet[bytes]]] = {}


def _calls_in(path: str) -> Tuple[Optional[Tuple[int, int]], FrozenSet[bytes]]:
    stamp = file_stamp(Path(path))
    known = _CALLS.get(path)
    if known is None or known[0] != stamp:
        try:
            names = frozenset(_CALL_NAME.findall(Path(path).read_bytes())) if stamp is not None else frozenset()
        except OSError:
            names = frozenset()
        known = _CALLS[path] = (stamp, names)
    return known


@dataclass
class _File:
    """What is asked of a file beside one (per process, while its stamp holds)."""

    stamp: Optional[Tuple[int, int]]
    imports: FrozenSet[str]  # the project files it imports (absolute paths)
    facts: Optional[FrozenSet[str]] = None  # its ``ast`` prefilter facts, read when first asked
    read: bool = False


_FILES: Dict[str, _File] = {}


def _file(path: str) -> _File:
    stamp = file_stamp(Path(path))
    known = _FILES.get(path)
    if known is None or known.stamp != stamp:
        imported: FrozenSet[str] = frozenset()
        if stamp is not None:
            try:
                data = Path(path).read_bytes()
                imported = frozenset(os.path.abspath(p) for p in imported_modules(path, data).values())
            except OSError:
                pass
        known = _FILES[path] = _File(stamp, imported)
    return known


def _imports(path: str) -> FrozenSet[str]:
    return _file(path).imports


def _holds(path: str, needs: Tuple[str, ...]) -> bool:
    """Does one of ``needs`` hold for the file's ``ast`` prefilter facts?
    (Parsed only where the bytes leave one possible: ``prefilter.may_hold``.)"""
    from codemods.analysis.prefilter import file_facts, holds, may_hold

    known = _file(path)
    if not known.read:
        try:
            data = Path(path).read_bytes() if known.stamp is not None else None
        except OSError:
            data = None
        if data is not None and not any(may_hold(need, data) for need in needs):
            return False  # (asked again with other needs, it reads the file again)
        known.facts = file_facts(data) if data is not None else None
        known.read = True
    return known.facts is not None and any(holds(need, known.facts) for need in needs)


def _has_hot_loop(path: str) -> bool:
    """Does the file hold a step or loader loop?"""
    from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP

    return _holds(path, (STEP_LOOP, LOADER_LOOP))


def _ported(path: str) -> bool:
    """Is the file code being ported (``prefilter.BEING_PORTED``)?"""
    from codemods.analysis.prefilter import BEING_PORTED

    return _holds(path, BEING_PORTED)


__all__ = ["consulted", "imported_elsewhere", "importer_calls", "ported_importer", "step_callers"]
