"""Start positions of a few nodes, for a fraction of a full position pass.

LibCST's ``PositionProvider`` generates the module's code once and records a
range for every node -- about 0.2 s per thousand lines, paid again for every
tree a rewrite produces.  A finding needs the start of one node, so the
codemods record their findings first and place them all in one pass over the
tree that records only the nodes asked for (``start_positions``).  The
positions are the same as ``PositionProvider``'s: the same code generation,
with the same syntactic rules (an indented block starts at its first
statement and ends with its last); ``tests/test_positions.py``
compares the two on real files.

This leans on LibCST's code generation state (``PositionProvidingCodegenState``,
a public class in a private module), as LibCST's own providers do.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import ContextManager, Dict, Iterable, Iterator, Optional, Set, Tuple

import libcst as cst
from libcst._position import CodePosition, CodeRange
from libcst.metadata import PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState


_NOTHING = nullcontext()


class _StartsOnly(PositionProvidingCodegenState):
    wanted: Set[int]

    def _update_position(self, value: str) -> None:
        if "\n" in value or "\r" in value:
            super()._update_position(value)
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted:
            super().before_codegen(node)

    def after_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted:
            super().after_codegen(node)

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None,
                                  end_node: Optional[cst.CSTNode] = None) -> ContextManager[None]:
        # called for most nodes: a shared no-op context for those not asked
        # for is several times cheaper than entering a generator each time
        if id(node) not in self.wanted:
            return _NOTHING
        return self._record(node, start_node, end_node)

    @contextmanager
    def _record(self, node: cst.CSTNode, start_node: Optional[cst.CSTNode],
                end_node: Optional[cst.CSTNode]) -> Iterator[None]:
        start = CodePosition(self.line, self.column)
        try:
            yield
        finally:
            end = CodePosition(self.line, self.column)
            computed = self.provider._computed
            if start_node is not None and start_node in computed:
                start = computed[start_node].start
            if end_node is not None and end_node in computed:
                end = computed[end_node].end
            computed[node] = CodeRange(start, end)


def start_positions(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> Dict[int, Tuple[int, int, int, int]]:
    """``id(node) -> (line, column, end line, end column)`` (lines 1-based,
    columns 1-based, the end exclusive) for each of ``nodes`` in ``module``."""
    from codemods.tree import walk

    nodes = list(nodes)
    # a node's range can come from its children's (an indented block starts at
    # its first statement and ends with its last): record those too
    wanted = {id(d) for n in nodes for d in walk(n)}
    provider = PositionProvider()
    state = _StartsOnly(default_indent=module.default_indent, default_newline=module.default_newline,
                        provider=provider)
    state.wanted = wanted
    module._codegen(state)
    out: Dict[int, Tuple[int, int]] = {}
    for n in nodes:
        rng = provider._computed.get(n)
        if rng is not None:
            out[id(n)] = (rng.start.line, rng.start.column + 1, rng.end.line, rng.end.column + 1)
    return out
