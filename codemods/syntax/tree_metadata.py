"""Where a tree's nodes are in its text: one node's position (light
passes for the first few questions, LibCST's position metadata past that),
statement positions from Python's ``ast``, and LibCST metadata resolved once
per tree.  A part of :class:`codemods.syntax.tree.TreeCache`."""

from __future__ import annotations

import ast
from typing import Any, Dict, List, Mapping, Optional, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider


class TreeMetadata:
    """Positions and metadata of ``self.module`` (``self.text``: its code)."""

    module: cst.Module
    text: Optional[str]
    memo: Dict[str, object]

    def _init_metadata(self) -> None:
        self._light_calls = 0
        self._positions: Dict[int, Tuple[int, int, int, int]] = {}
        self._metadata: Dict[type, Mapping[cst.CSTNode, object]] = {}
        self._wrapper: Optional[MetadataWrapper] = None

    def position(self, context: Any, node: cst.CSTNode) -> Tuple[int, int, int, int]:
        """One node's (line, col, end line, end col).  The first few questions
        on a tree are answered by light passes for just those nodes; past
        that, LibCST's full position metadata is computed once and used."""
        if id(node) in self._positions:
            return self._positions[id(node)]
        if PositionProvider not in self._metadata and self._light_calls < 3:
            self._light_calls += 1
            found = self.start_positions([node]).get(id(node))
            if found is not None:
                self._positions[id(node)] = found
                return found
        pos = self.metadata(context, PositionProvider)[node]
        return pos.start.line, pos.start.column + 1, pos.end.line, pos.end.column + 1  # type: ignore[attr-defined]

    def start_positions(self, nodes: List[cst.CSTNode]) -> Dict[int, Tuple[int, int, int, int]]:
        """``id(node) -> (line, col)``: from the full position metadata when
        it was computed anyway, else from one pass for just these nodes."""
        full = self._metadata.get(PositionProvider)
        if full is not None:
            return {id(n): (full[n].start.line, full[n].start.column + 1, full[n].end.line,  # type: ignore[attr-defined]
                            full[n].end.column + 1) for n in nodes if n in full}  # type: ignore[attr-defined]
        from codemods.syntax.positions import tree_positions

        return tree_positions(self, nodes)

    def statement_starts(self) -> Optional[Dict[int, int]]:
        """``positions.statement_starts`` of this tree's text (computed once),
        or None where the text is unknown or does not line up."""
        if "statement_starts" not in self.memo:
            from codemods.syntax.positions import statement_starts

            parsed = self._ast()
            self.memo["statement_starts"] = None if parsed is None else statement_starts(
                self.module, self.text, parsed)  # type: ignore[arg-type]
        return self.memo["statement_starts"]  # type: ignore[return-value]

    def statement_positions(self) -> Dict[int, Tuple[int, int, int, int]]:
        """``positions.statement_positions`` of this tree (computed once;
        empty where the text is unknown or ast cannot read it)."""
        if "statement_positions" not in self.memo:
            from codemods.syntax.positions import statement_positions

            parsed = self._ast()
            self.memo["statement_positions"] = {} if parsed is None else statement_positions(
                self.module, self.text, parsed)  # type: ignore[arg-type]
        return self.memo["statement_positions"]  # type: ignore[return-value]

    def _ast(self) -> Optional[ast.Module]:
        """Python's ``ast`` parse of this tree's text (the prefilter's, where
        the engine hands it over), once; None where there is no text or ast
        refuses it."""
        if self.memo.get("ast") is None and self.text is not None and "ast_failed" not in self.memo:
            try:
                self.memo["ast"] = ast.parse(self.text)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                self.memo["ast_failed"] = True
        return self.memo.get("ast")  # type: ignore[return-value]

    def metadata(self, context: Any, provider: type) -> Mapping[cst.CSTNode, object]:
        found = self._metadata.get(provider)
        if found is None:
            wrapper = context.wrapper
            if wrapper is None or wrapper.module is not self.module:
                # Our own engine: the tree is never copied (see ``unique``),
                # so a wrapper can be made for it at any time.
                if self._wrapper is None:
                    self._wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
                wrapper = self._wrapper
            found = self._metadata[provider] = wrapper.resolve(provider)
        return found
