"""Edits several codemods make: removing statements without breaking blocks."""

from __future__ import annotations

from typing import Container, Dict, List, Set, TypeVar

import libcst as cst

Block = TypeVar("Block", cst.IndentedBlock, cst.Module)


def stand_in(line: cst.BaseStatement) -> cst.SimpleStatementLine:
    """A statement to put where ``line`` goes: it holds the blank and comment
    lines above ``line`` until its block takes it out (``without_stand_ins``)."""
    return cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=line.leading_lines)


def without_stand_ins(block: Block, stand_ins: Container[int]) -> Block:
    """``block`` without the statements whose ids are in ``stand_ins``.  The
    lines above one go above the statement that follows it; after the last
    statement, to the block's footer, up to the last comment (the comments a
    user wrote are kept, as Ruff's fix of an unused import keeps them); a
    block left empty gets ``pass``, under them."""
    body: List[cst.BaseStatement] = []
    carried: List[cst.EmptyLine] = []
    for stmt in block.body:
        if id(stmt) in stand_ins:
            carried += list(stmt.leading_lines)  # type: ignore[union-attr]
            continue
        if carried:
            stmt = stmt.with_changes(leading_lines=[*carried, *stmt.leading_lines])  # type: ignore[union-attr]
            carried = []
        body.append(stmt)
    if isinstance(block, cst.IndentedBlock) and not body:
        return block.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried)])
    while carried and carried[-1].comment is None:
        carried.pop()  # (blank lines at the end of a block are none of its own: Ruff's format takes them)
    if not carried:
        return block.with_changes(body=body)
    return block.with_changes(body=body, footer=[*carried, *block.footer])


class DropsStatements:
    """Mixin for an :class:`~codemods.base.XlaCodemod` that removes small
    statements (``torch.cuda.empty_cache()``, ``scaler.update()``).

    ``drop(node)`` marks an original small statement (or the ``Expr`` around a
    call); it disappears from its line, the line goes when nothing is left
    (its blank lines and comments stay: on the next statement, or at the end
    of the block), and a block left empty gets ``pass``.
    """

    def drop(self, node: cst.CSTNode) -> None:
        self._drops().add(id(node))

    def _drops(self) -> Set[int]:
        if "_dropped" not in self.__dict__:
            self.__dict__["_dropped"] = set()
            self.__dict__["_emptied"] = {}  # id -> node: kept alive so that no id is reused
        return self.__dict__["_dropped"]

    def drop_call(self, call: cst.Call, parent: object) -> cst.BaseExpression:
        """Drop the statement that is ``call``; elsewhere the call becomes ``None``."""
        if isinstance(parent, cst.Expr):
            self.drop(parent)
            return call
        return cst.Name("None")

    def emptied(self, line: cst.BaseStatement) -> cst.SimpleStatementLine:
        """A statement that goes: its block removes it (see ``without_stand_ins``)."""
        self._drops()
        new = stand_in(line)
        self.__dict__["_emptied"][id(new)] = new
        return new

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine):
        dropped = self.__dict__.get("_dropped")
        if not dropped:
            return updated_node
        keep = [new for old, new in zip(original_node.body, updated_node.body) if id(old) not in dropped]
        if len(keep) == len(updated_node.body):
            return updated_node
        if not keep:
            return self.emptied(updated_node)
        keep[-1] = keep[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(body=keep)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        emptied: Dict[int, cst.CSTNode] = self.__dict__.get("_emptied") or {}
        return without_stand_ins(updated_node, emptied) if emptied else updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        emptied: Dict[int, cst.CSTNode] = self.__dict__.get("_emptied") or {}
        return without_stand_ins(updated_node, emptied) if emptied else updated_node
