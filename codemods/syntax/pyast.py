"""Python's own ``ast`` of the file at hand, parsed once: the prefilter
parses it (``analysis.prefilter.file_facts``) and keeps it here; the engine
and the tree index read statement lines and imports from it rather than
parse the same file again."""

from __future__ import annotations

import ast
from typing import Optional, Tuple

# the last source parsed and its tree (None: Python's parser refused it)
_LAST: Tuple[bytes, Optional[ast.Module]] = (b"", None)


def parse(source: bytes) -> Optional[ast.Module]:
    """``ast.parse(source)``, kept as the file at hand; None where Python
    cannot read it."""
    global _LAST
    try:
        tree: Optional[ast.Module] = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    _LAST = (source, tree)
    return tree


def parsed(source: bytes) -> Optional[ast.Module]:
    """The ``ast`` tree of ``source`` if it was the last file parsed here."""
    last, tree = _LAST
    return tree if last is source else None


def rejected(source: bytes) -> bool:
    """Python's own parser refused ``source``, the last file parsed here."""
    last, tree = _LAST
    return last is source and tree is None
