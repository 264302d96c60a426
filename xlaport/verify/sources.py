"""The sources each side of a verification runs: the original unchanged,
its CPU retargeting, and the conversion (made here, or the tree or script
``--converted`` names)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from xlaport.verify.core import convert_sources
from xlaport.verify.model import Options
from xlaport.verify.project import Project


class Sources:
    """What each side's copy of the project is made from, worked out once per side."""

    def __init__(self, project: Project, converted: Optional[Path], opts: Options) -> None:
        self.project, self.converted, self.opts = project, converted, opts
        self._made: Dict[str, Tuple[Dict[str, bytes], Optional[Path], List[str]]] = {}
        self.kept: List[str] = []  # the CUDA tests the conversion made here left as they were (XLA118)

    def of(self, name: str) -> Tuple[Dict[str, bytes], Optional[Path], List[str]]:
        """(converted modules, a converted tree to copy instead of the
        project, extra import paths) for side ``name``; once per side."""
        if name not in self._made:
            if name in ("cuda", "orig"):
                self._made[name] = ({}, None, [])  # the original, unchanged
            elif name == "ref":
                self._made[name] = (convert_sources(self.project, "cpu"), None, [])
            else:
                self._made[name] = self._candidate_sources()
        return self._made[name]

    def _candidate_sources(self) -> Tuple[Dict[str, bytes], Optional[Path], List[str]]:
        """The default conversion of every module; or the converted tree
        ``--converted`` points into (a directory, or the converted script at
        the same place in its tree); or, for a converted script outside such
        a tree, the default conversion with that script, and its directory
        on the import path (a converted package beside it)."""
        converted = self.converted
        if converted is None:
            return convert_sources(self.project, self.opts.target, self.opts.settings, kept=self.kept), None, []
        converted = converted.resolve()
        if converted.is_dir():
            return {}, converted, []
        rel = self.project.rel_script
        tree = converted
        for _ in rel.parts:
            tree = tree.parent
        if converted.name == rel.name and (tree / rel).resolve() == converted and tree != self.project.root:
            return {}, tree, []
        sources = dict(convert_sources(self.project, self.opts.target, self.opts.settings))
        sources[rel.as_posix()] = converted.read_bytes()
        return sources, None, [str(converted.parent)]

    def shown(self) -> Tuple[Optional[Path], Optional[Path]]:
        """(the converted tree, the converted script) the user named, for
        pointing at the candidate's files where the user can open them."""
        tree = self.of("xla")[1]
        if tree is not None:
            return tree, None
        return None, (self.converted.resolve() if self.converted is not None else None)
