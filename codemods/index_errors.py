"""XLA161: an int index whose IndexError the program catches never kills the process.

PyTorch raises IndexError for an int index out of a tensor's range, and for
any int index of a 0-dimensional tensor; code may rely on it
(``try: idx = torch.squeeze((c == k).nonzero())[j]`` / ``except: idx = 0``,
TeaPearce's conditional-diffusion sampler, where a class met once leaves a
0-dimensional tensor).  torch_xla 2.9 kills the process instead (SIGSEGV)
for a 0-dimensional device tensor indexed by an int other than 0, so the
conversion died where the original went on.  (An index out of the range of
a tensor with dimensions raises on XLA as on the CPU.)

``name = <tensor op>[i]`` directly in the body of a ``try`` whose handler
catches IndexError (bare, ``IndexError``, ``LookupError``, ``Exception``,
``BaseException``) becomes::

    indexed = <tensor op>
    name = (indexed if indexed.dim() else indexed.cpu())[i]

A 0-dimensional tensor is indexed on the host, where any int index raises
IndexError as PyTorch does (so nothing of the host escapes); any other stays
on the device, indexed as before.  ``.dim()`` reads the shape, not the data.
Such an index on a line with other statements is reported.
"""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from codemods.analysis.counters import int_arithmetic
from codemods.analysis.cuda import ported_needs
from codemods.analysis.placement import HOST, placement
from codemods.analysis.prefilter_traps import CATCHING_INDEX_ERROR, CAUGHT_INDEX
from codemods.analysis.tensors import is_tensor_expr
from codemods.analysis.values import TENSOR, values
from codemods.base import Rule, XlaCodemod, find_all

INDEX_ERROR = Rule(
    code="XLA161",
    name="caught-index-error",
    summary="an int index whose IndexError the program catches takes a 0-dim tensor on the host (torch_xla aborts)",
    why=(
        "PyTorch raises IndexError for an int index out of a tensor's range and for any int index of a "
        "0-dimensional tensor, and programs catch it (`try: idx = torch.squeeze((c == k).nonzero())[j]` / "
        "`except: idx = 0`). torch_xla 2.9 kills the process (SIGSEGV) when a 0-dimensional device tensor is "
        "indexed by an int other than 0: the conversion dies where the original went on. The tensor is bound "
        "first and indexed as `(indexed if indexed.dim() else indexed.cpu())[j]`: a 0-dimensional one on the "
        "host, where the index raises IndexError as PyTorch does, any other on the device as before (an index "
        "out of its range raises there too)."
    ),
    before=(
        "import torch\n\nc = torch.tensor([3, 1, 3]).cuda()\ntry:\n"
        "    idx = torch.squeeze((c == 1).nonzero())[1]\nexcept IndexError:\n    idx = 0\n"
    ),
    after=(
        "import torch\n\nc = torch.tensor([3, 1, 3]).cuda()\ntry:\n    indexed = torch.squeeze((c == 1).nonzero())\n"
        "    idx = (indexed if indexed.dim() else indexed.cpu())[1]\nexcept IndexError:\n    idx = 0\n"
    ),
    valid=(
        # the handler catches something else; the index is of a list
        "import torch\n\nc = torch.tensor([3, 1, 3]).cuda()\ntry:\n"
        "    idx = torch.squeeze((c == 1).nonzero())[1]\nexcept KeyError:\n    idx = 0\n",
        "import torch\n\nitems = [1, 2]\ntry:\n    x = items[3]\nexcept IndexError:\n    x = 0\n",
    ),
)



class CaughtIndexErrors(XlaCodemod):
    DESCRIPTION = "Index a 0-dim tensor on the host where the program catches the IndexError the index raises."
    RULES = (INDEX_ERROR,)
    TRIGGERS = (b"except",)
    NEEDS = ported_needs(CAUGHT_INDEX)

    def regions(self, tree):
        return [t for t in tree.nodes((cst.Try,)) if _catching(t)]  # type: ignore[attr-defined]

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine):
        for k, small in enumerate(original_node.body):
            if isinstance(small, cst.Assign) and self._caught_index(small):
                return self._indexed_safely(original_node, updated_node, k)
        return updated_node

    def _indexed_safely(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine, k: int):
        """``name = expr[i]`` -> ``indexed = expr`` / ``name = (indexed if
        indexed.dim() else indexed.cpu())[i]``: a 0-dim tensor is indexed on
        the host, where any int index raises IndexError as PyTorch does; any
        other stays on the device, where an index out of range raises too."""
        assign = original.body[k]
        code = cst.Module([]).code_for_node
        what = f"`{code(assign.value)}` in a `try` that catches IndexError: torch_xla 2.9 kills the process " \
               "(SIGSEGV) for an int index of a 0-dimensional device tensor, where PyTorch raises"  # type: ignore[attr-defined]
        if len(original.body) != 1:  # (another statement on its line)
            self.flag(assign.value, INDEX_ERROR.code, f"{what}; index a 0-dim tensor on the host "  # type: ignore[attr-defined]
                      "(`(t if t.dim() else t.cpu())[i]`)", fix=False)
            return updated
        if not self.flag(assign.value, INDEX_ERROR.code, f"{what}: a 0-dim tensor is indexed on the host "  # type: ignore[attr-defined]
                         "instead, where it raises", fix=True):
            return updated
        value = updated.body[0].value  # type: ignore[attr-defined]
        temp = self.tree.unused_name("indexed")
        made = updated.with_changes(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(temp))], value=value.value)])
        chosen = cst.parse_expression(f"({temp} if {temp}.dim() else {temp}.cpu())")
        indexed = updated.with_changes(body=[updated.body[0].with_changes(value=value.with_changes(value=chosen))],
                                       leading_lines=[])
        return cst.FlattenSentinel([made, indexed])

    def _caught_index(self, node: cst.Assign) -> bool:
        """Is ``node`` ``name = <tensor op>[int]`` directly in the body of a
        ``try`` that catches IndexError, the tensor not known to be on the host?"""
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
            return False
        value = node.value
        if not (isinstance(value, cst.Subscript) and isinstance(value.value, cst.Call) and len(value.slice) == 1
                and isinstance(value.slice[0].slice, cst.Index) and value.slice[0].slice.star is None):
            return False
        index = value.slice[0].slice.value
        if not int_arithmetic(index, attributes=True) or any(
                TENSOR in values(self.tree).of(n) for n in find_all(index, cst.Name)):
            return False
        # (a tensor not known to be on the host: `.cpu()`, `.numpy()` are; `.item()` is no tensor)
        return self._enclosing_try(node) is not None and is_tensor_expr(value.value, set(), self.qualnames) \
            and placement(self.tree, value.value) != HOST

    def _enclosing_try(self, node: cst.CSTNode) -> Optional[cst.Try]:
        """The ``try`` that catches IndexError whose body holds the statement
        of ``node`` (not in a handler, ``else`` or ``finally``; no function between)."""
        child: cst.CSTNode = node
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(anc, cst.Try):
                return anc if child is anc.body and _catching(anc) else None
            child = anc
        return None


def _catches_index_error(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    names: Set[str] = set()
    for kind in kinds:
        expr = kind.value if isinstance(kind, cst.Element) else kind
        if isinstance(expr, cst.Name):
            names.add(expr.value)
        elif isinstance(expr, cst.Attribute):
            names.add(expr.attr.value)
    return bool(names & CATCHING_INDEX_ERROR)


def _catching(node: cst.Try) -> bool:
    return any(_catches_index_error(h) for h in node.handlers)
