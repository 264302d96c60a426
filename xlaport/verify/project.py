"""The program as the user runs it: its project tree, its working directory,
and one private copy of that tree for each side of a verification.

* The **project root** is ``--root``, else the nearest directory above the
  script (or the file of the module ``-m`` names, found from the working
  directory as ``python -m`` finds it) that holds a ``.git`` or a ``pyproject.toml``/``setup.py``/
  ``setup.cfg``, else the script's own directory.  The user's working
  directory must lie inside it: that is where relative paths point.
* Each **side** (the CPU reference, the XLA candidate) gets a copy of the
  tree under the scratch directory: every Python module converted for that
  side (the reference retargeted to the CPU, the candidate converted to XLA
  or taken from the converted tree ``--converted`` names), every other file
  copied, or linked when it is large (data sets).  The side runs from the
  same relative working directory, with its own copy first on the import
  path, so a project installed in editable mode imports that copy too.
* What the program **writes** is what changed in its side's tree.
* The **user's tree** is never written: each side works in its copy, writes
  through a link are turned into writes of a local copy by the harness, and
  a fingerprint of the tree taken before and after proves it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from xlaport.files import SKIP_DIRS

MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
COPY_LIMIT = 16 * 1024 * 1024  # larger files are linked, not copied
Stamp = Tuple[int, int]  # (size, mtime_ns)


class ProjectError(Exception):
    """The program cannot be laid out for verification (exit 2)."""


def find_root(script: Path, explicit: Optional[Path] = None) -> Path:
    if explicit is not None:
        root = explicit.resolve()
        if not root.is_dir():
            raise ProjectError(f"--root {explicit}: not a directory")
        if not _inside(script, root):
            raise ProjectError(f"{script} is not inside --root {explicit}")
        return root
    for d in script.parents:
        if any((d / m).exists() for m in MARKERS):
            return d
    return script.parent


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _skipped(name: str) -> bool:
    """Tool, VCS and environment folders, and hidden ones: not the program's."""
    return name in SKIP_DIRS or name.endswith(".egg-info") or (name.startswith(".") and name not in (".", ".."))


def module_file(module: str, cwd: Path) -> Path:
    """The file ``python -m MODULE`` runs from ``cwd`` when it is the
    project's own (``tools.sample_ddpm`` -> ``tools/sample_ddpm.py``; a
    package's ``__main__.py``)."""
    parts = module.split(".")
    if not module or not all(p.isidentifier() for p in parts):
        raise ProjectError(f"-m {module}: not a module name")
    base = cwd.joinpath(*parts)
    for candidate in (base.with_name(base.name + ".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    raise ProjectError(f"-m {module}: no {'/'.join(parts)}.py or {'/'.join(parts)}/__main__.py under the working "
                       f"directory {cwd} (verify runs the project's own modules as `python -m`)")


@dataclass
class Project:
    root: Path
    script: Path
    cwd: Path
    module: Optional[str] = None  # run as `python -m MODULE` from ``cwd`` (``script`` is its file)

    @classmethod
    def of(cls, script: Optional[Path], root: Optional[Path] = None, cwd: Optional[Path] = None,
           module: Optional[str] = None) -> "Project":
        here = (cwd or Path.cwd()).resolve()
        if module is not None:
            script = module_file(module, here)
        assert script is not None
        script = script.resolve()
        found = find_root(script, root)
        if not _inside(here, found):
            if module is not None:
                raise ProjectError(f"-m {module}: the working directory {here} is outside the project's root "
                                   f"{found}")
            here = script.parent  # run from elsewhere: the script's own directory, inside the tree
        return cls(found, script, here, module)

    def command(self, script: Path) -> List[str]:
        """How a side's copy of the program is started, after the
        interpreter: ``SCRIPT`` (that side's copy), or ``-m MODULE`` from the
        side's working directory."""
        return ["-m", self.module] if self.module else [str(script)]

    @property
    def rel_script(self) -> Path:
        return self.script.relative_to(self.root)

    @property
    def rel_cwd(self) -> Path:
        return self.cwd.relative_to(self.root)

    def python_files(self) -> List[Path]:
        return [p for p in self.walk() if p.suffix == ".py"]

    def walk(self) -> List[Path]:
        """Every file of the tree a side needs (tool and VCS folders left out)."""
        found: List[Path] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
            found += [Path(dirpath) / f for f in sorted(filenames)]
        return found

    def fingerprint(self) -> Dict[str, Stamp]:
        """(size, mtime) of every file of the tree: the same before and after
        a verification, or verify wrote the user's tree."""
        stamps: Dict[str, Stamp] = {}
        for path in self.walk():
            try:
                st = path.lstat()
            except OSError:
                continue
            stamps[path.relative_to(self.root).as_posix()] = (st.st_size, st.st_mtime_ns)
        return stamps

    def map_arg(self, arg: str, tree: Path) -> str:
        """An absolute path into the user's tree, as the same path in a side's tree."""
        if not os.path.isabs(arg):
            return arg
        try:
            rel = Path(arg).relative_to(self.root)
        except ValueError:
            return arg
        return str(tree / rel)


@dataclass
class Side:
    """One side's copy of the project, and what the program wrote into it."""

    name: str
    tree: Path
    project: Project
    before: Dict[str, Stamp] = field(default_factory=dict)
    linked: Dict[str, Path] = field(default_factory=dict)  # rel -> the user's file it links to

    @property
    def script(self) -> Path:
        return self.tree / self.project.rel_script

    @property
    def cwd(self) -> Path:
        return self.tree / self.project.rel_cwd

    def import_path(self) -> List[str]:
        paths = [str(self.tree)]
        if (self.tree / "src").is_dir():
            paths.append(str(self.tree / "src"))
        return paths

    def outputs(self) -> Dict[str, Path]:
        """The files the program created or changed in the tree, by path
        relative to the tree's root (its modules' bytecode left out)."""
        found: Dict[str, Path] = {}
        for dirpath, dirnames, filenames in os.walk(self.tree, followlinks=False):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                path = Path(dirpath) / f
                rel = path.relative_to(self.tree).as_posix()
                if path.is_symlink() and rel in self.linked:
                    continue  # a data set as it was
                st = path.lstat()
                if self.before.get(rel) != (st.st_size, st.st_mtime_ns):
                    found[rel] = path
        return found


def build_side(project: Project, name: str, dest: Path, sources: Dict[str, bytes],
               files_from: Optional[Path] = None) -> Side:
    """A copy of the project under ``dest``: ``sources`` (relative path ->
    text) for its Python modules -- or the modules of ``files_from``, a
    converted tree -- and every other file copied from the project, links
    for large ones.  Data always comes from the project: what a converted
    tree holds besides its modules (a checkpoint an earlier run of the
    conversion wrote there) is not what the reference sees."""
    origin = project.root
    if files_from is not None:
        converted = {p.relative_to(files_from).as_posix(): p.read_bytes()
                     for p in Project(files_from, files_from, files_from).walk()
                     if p.suffix == ".py" and p.is_file() and not p.is_symlink()}
        sources = {**converted, **sources}
    side = Side(name, dest, project)
    for dirpath, dirnames, _ in os.walk(origin, followlinks=False):  # every folder, empty ones too
        dirnames[:] = [d for d in dirnames if not _skipped(d)]
        here = dest / Path(dirpath).relative_to(origin)
        here.mkdir(parents=True, exist_ok=True)
        for d in dirnames:  # a linked folder (`data -> ../datasets/mnist`): not walked, linked
            if os.path.islink(os.path.join(dirpath, d)):
                _link(Path(dirpath) / d, here / d, origin)
    for path in Project(origin, origin, origin).walk():
        rel = path.relative_to(origin).as_posix()
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel in sources:
            target.write_bytes(sources[rel])
        elif path.is_symlink():
            _link(path, target, origin)
        elif path.is_file():
            if path.stat().st_size > COPY_LIMIT:
                os.symlink(path.resolve(), target)
                side.linked[rel] = path.resolve()
            else:
                shutil.copy2(path, target)
    for rel, text in sources.items():  # (a module the converted tree lacks)
        if not (dest / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(text)
    (dest / project.rel_cwd).mkdir(parents=True, exist_ok=True)
    for path in (p for p in dest.rglob("*") if not p.is_symlink()):
        st = path.lstat()
        side.before[path.relative_to(dest).as_posix()] = (st.st_size, st.st_mtime_ns)
    for rel in side.linked:
        side.before[rel] = (0, 0)
    return side


def _link(path: Path, target: Path, origin: Path) -> None:
    """A link of the project as the same link in a side's copy: as it is
    where it points into what the copy holds (the copy's own file or
    folder is read), to the absolute place where a relative link leaves
    the project or points into a folder the copy leaves out (from the copy
    it would point at nothing)."""
    held = os.readlink(path)
    if not os.path.isabs(held):
        place = Path(os.path.normpath(path.parent / held))  # (as written: a link to a link stays one)
        try:
            inside = place.relative_to(origin)
        except ValueError:
            inside = None
        if inside is None or any(_skipped(part) for part in inside.parts):  # (a folder the copy leaves out)
            held = str(place)
    os.symlink(held, target)


def changed_files(before: Dict[str, Stamp], after: Dict[str, Stamp]) -> List[str]:
    """Files of the user's tree that a verification changed, added or removed."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def own_files(names: List[str], side: Side) -> List[Path]:
    """The script and the side's own modules ``names``, as paths in its tree."""
    found: List[Path] = [side.project.rel_script]
    for name in names:
        rel = Path(*name.split("."))
        for candidate in (rel.with_suffix(".py"), rel / "__init__.py"):
            for base in (side.tree, side.tree / "src"):
                if (base / candidate).exists():
                    found.append((base / candidate).relative_to(side.tree))
    return list(dict.fromkeys(found))
