"""What a run is asked to do: rules, target and options (no LibCST here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence

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

    def for_file(self, filename: str, source: bytes = b"") -> "Settings":
        """These settings with the file's own ignores: ``per-file-ignores``
        globs that match it, and ``# xlaport: ignore-file[...]`` in it."""
        from fnmatch import fnmatch

        extra = [c for pattern, codes in self.per_file_ignores.items()
                 if filename and (fnmatch(filename, pattern) or fnmatch(filename, f"*/{pattern}")) for c in codes]
        in_file = file_suppressions(source) if source else None
        if in_file:
            extra += ["XLA" if c == "*" else c for c in in_file]
        if not extra:
            return self
        return Settings(self.select, list(self.ignore) + extra, self.target, self.options, self.per_file_ignores,
                        self.prefilter)

    def selected_codes(self) -> List[str]:
        return registry.selected_codes(self.select, self.ignore)
