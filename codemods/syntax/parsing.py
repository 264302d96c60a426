"""LibCST's parse of a module, without validating what the parser built.

Every LibCST node checks itself when it is made (``CSTNode.__post_init__``
calls ``_validate``: that a name is a name, that whitespace is whitespace,
that parentheses pair up).  A node the parser makes from source text is
valid by construction, so on a parse the checks only cost time -- about a
sixth of a large module's parse (LibCST's own comment there says as much).
And one of them is wrong: ``() if 0 else(lambda:())`` is valid Python that
LibCST's parser builds and then rejects with a ``TypeError``
(Instagram/LibCST#1061); such a file now converts, unless a rewrite
rebuilds that very expression.

``parse_module`` switches the check off for the parse alone; every node a
rule builds afterwards is checked as usual.  Where the installed LibCST
checks nodes some other way than this one call, nothing is switched off.
"""

from __future__ import annotations

from typing import Union

import libcst as cst
from libcst._nodes.base import CSTNode

from codemods.syntax.nodes import _NODE_TYPES

_CHECK = CSTNode.__dict__.get("__post_init__")


def _checks_only() -> bool:
    """Whether making a node does nothing after its fields are set but call
    ``_validate``: the one ``__post_init__`` is CSTNode's, and it only
    calls that."""
    if _CHECK is None or getattr(_CHECK, "__code__", None) is None or _CHECK.__code__.co_names != ("_validate",):
        return False
    return not any("__post_init__" in vars(base) for kind in _NODE_TYPES for base in kind.__mro__
                   if base is not CSTNode and issubclass(base, CSTNode))


SKIPS_CHECKS = _checks_only()


def _made(self: CSTNode) -> None:
    """A node the parser made: nothing to check."""


def parse_module(source: Union[str, bytes]) -> cst.Module:
    """``libcst.parse_module(source)``, its nodes unchecked (see above)."""
    if not SKIPS_CHECKS:
        return cst.parse_module(source)
    CSTNode.__post_init__ = _made  # type: ignore[method-assign]
    try:
        return cst.parse_module(source)
    finally:
        CSTNode.__post_init__ = _CHECK  # type: ignore[method-assign]
