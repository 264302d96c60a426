"""Edits several codemods make: removing statements without breaking blocks."""

from __future__ import annotations

from typing import Sequence, Set

import libcst as cst


class DropsStatements:
    """Mixin for an :class:`~codemods.base.XlaCodemod` that removes small
    statements (``torch.cuda.empty_cache()``, ``scaler.update()``).

    ``drop(node)`` marks an original small statement (or the ``Expr`` around a
    call); it disappears from its line, the line goes when nothing is left
    (its blank lines and comments stay, on the next statement), and a block
    left empty gets ``pass``.
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
        """A statement that goes: its block removes it (see ``_without_emptied``)."""
        self._drops()
        new = cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=line.leading_lines)
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

    def _without_emptied(self, body: Sequence[cst.BaseStatement]) -> list:
        emptied = self.__dict__.get("_emptied") or {}
        out: list = []
        carried: list = []
        for stmt in body:
            if id(stmt) in emptied:
                carried += list(stmt.leading_lines)
                continue
            if carried:
                stmt = stmt.with_changes(leading_lines=[*carried, *stmt.leading_lines])
                carried = []
            out.append(stmt)
        return out

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        if not self.__dict__.get("_emptied"):
            return updated_node
        body = self._without_emptied(updated_node.body)
        if not body:
            body = [cst.SimpleStatementLine(body=[cst.Pass()])]
        return updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.__dict__.get("_emptied"):
            return updated_node
        return updated_node.with_changes(body=self._without_emptied(updated_node.body))
