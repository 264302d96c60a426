"""What a run is asked to do: rules, target and options (no LibCST here)."""

from __future__ import annotations

from dataclasses import dataclass, field
import os
from typing import FrozenSet, List, Mapping, Optional, Sequence

from codemods import registry
from codemods.rule import file_suppressions
from codemods.target import DEFAULT_TARGET


@dataclass
class Settings:
    select: Optional[Sequence[str]] = None  # codes or prefixes; None = all
    ignore: Sequence[str] = ()
    target: str = DEFAULT_TARGET
    options: Mapping[str, object] = field(default_factory=dict)
    per_file_ignores: Mapping[str, Sequence[str]] = field(default_factory=dict)  # glob -> codes
    prefilter: bool = True  # skip codemods the ast prefilter rules out (same results, faster)
    # --diff-base: absolute path -> the lines changed; None: every line counts
    changed_lines: Optional[Mapping[str, FrozenSet[int]]] = None
    _codes: Optional[tuple] = field(default=None, repr=False, compare=False)  # selected_codes, memoised

    def lines_for(self, filename: str) -> Optional[FrozenSet[int]]:
        if self.changed_lines is None:
            return None
        return self.changed_lines.get(os.path.abspath(filename), frozenset())

    def for_file(self, filename: str, source: bytes = b"") -> "Settings":
        """These settings with the file's own ignores: ``per-file-ignores``
        globs that match it, and ``# xlaport: ignore-file[...]`` in it."""
        from fnmatch import fnmatch

        extra = [c for pattern, codes in self.per_file_ignores.items()
                 if filename and (fnmatch(filename, pattern) or fnmatch(filename, f"*/{pattern}")) for c in codes]
        in_file = file_suppressions(source) if source else None
        if in_file:
            extra += ["XLA" if c == "*" else c for c in in_file]
        options = self.options
        only = self.lines_for(filename)
        if only is not None:
            options = {**options, "only_lines": only}
        if not extra and only is None:
            return self
        return Settings(self.select, list(self.ignore) + extra, self.target, options, self.per_file_ignores,
                        self.prefilter)

    def selected_codes(self) -> List[str]:
        key = (tuple(self.select) if self.select is not None else None, tuple(self.ignore))
        if self._codes is None or self._codes[0] != key:
            self._codes = (key, registry.selected_codes(self.select, self.ignore))
        return self._codes[1]
