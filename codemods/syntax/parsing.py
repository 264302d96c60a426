"""LibCST's parse of a module, through its public API alone.

xlaport parses with ``libcst.parse_module`` as any LibCST user does: no
constructor, check or class of LibCST is replaced, even for the length of a
parse (a thread making or type-checking LibCST nodes meanwhile -- an editor
integration, a user's own codemod beside ours -- sees LibCST as it is).  The
time is won where it is xlaport's: fewer files reach LibCST at all (the
prefilter), and less work is done per tree.

One kind of valid Python cannot be parsed this way: LibCST's parser builds
``() if 0 else(lambda:())`` and its own check on the node then rejects it
with a ``TypeError`` (Instagram/LibCST#1061).  Such a file is reported on its
line (:class:`LibcstRejects`) and left as it is.
"""

from __future__ import annotations

import ast
from typing import Optional, Union

import libcst as cst


class LibcstRejects(Exception):
    """Valid Python that LibCST builds and then rejects (Instagram/LibCST#1061):
    ``line`` where Python's own ``ast`` places the expression, where known."""

    def __init__(self, message: str, line: Optional[int] = None) -> None:
        super().__init__(message)
        self.message, self.line = message, line


def parse_module(source: Union[str, bytes]) -> cst.Module:
    """``libcst.parse_module(source)``; :class:`LibcstRejects` for valid
    Python that LibCST's own node checks refuse."""
    try:
        return cst.parse_module(source)
    except TypeError as exc:
        raise LibcstRejects(f"LibCST cannot build this valid Python ({exc}; Instagram/LibCST#1061): left as it is",
                            _conditional_without_space(source)) from None


def _conditional_without_space(source: Union[str, bytes]) -> Optional[int]:
    """The line of the first conditional expression whose ``else`` touches a
    parenthesis (``else(``: what LibCST's check refuses), by Python's ast."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    lines = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp) and node.lineno <= len(lines):
            span = "\n".join(lines[node.lineno - 1:(node.end_lineno or node.lineno)])
            if "else(" in span:
                return node.lineno
    return None
