"""XLA161: an int index whose IndexError the program catches is taken on the host.

PyTorch raises IndexError for an int index out of a tensor's range, and for
any int index of a 0-dimensional tensor; code may rely on it
(``try: idx = torch.squeeze((c == k).nonzero())[j]`` / ``except: idx = 0``,
TeaPearce's conditional-diffusion sampler, where a class met once leaves a
0-dimensional tensor).  torch_xla 2.9 kills the process instead (SIGSEGV)
for a 0-dimensional device tensor indexed by an int other than 0, so the
conversion dies where the original went on.

``name = <tensor op>[i]`` inside a ``try`` whose handler catches
IndexError (bare, ``IndexError``, ``LookupError``, ``Exception``,
``BaseException``) and binds the same name a number instead becomes
``name = <tensor op>.cpu()[i]``: the index runs on the host, where it raises
as PyTorch does, and the value is the same.  The result is a scalar by the
handler's own account (a number stands for it), and a 0-dimensional CPU
tensor works with device tensors as a scalar or an index.  The indexed value
is a temporary (a call's result): nothing else sees that the element is a
copy, not a view.  Any other such index of a tensor not known to be on the
host is reported, with the fix.
"""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from codemods.analysis.cuda import ported_needs
from codemods.analysis.placement import HOST, placement
from codemods.analysis.tensors import is_tensor_expr
from codemods.analysis.values import TENSOR, values
from codemods.base import Rule, XlaCodemod, find_all

INDEX_ERROR = Rule(
    code="XLA161",
    name="caught-index-error",
    summary="an int index whose IndexError the program catches is taken on the host (torch_xla aborts instead)",
    why=(
        "PyTorch raises IndexError for an int index out of a tensor's range and for any int index of a "
        "0-dimensional tensor, and programs catch it (`try: idx = torch.squeeze((c == k).nonzero())[j]` / "
        "`except: idx = 0`). torch_xla 2.9 kills the process (SIGSEGV) when a 0-dimensional device tensor is "
        "indexed by an int other than 0: the conversion dies where the original went on. Where the handler "
        "binds the same name a number, the index is taken on the host, `.cpu()[j]`, which raises as PyTorch does; "
        "the value is the same scalar, and a 0-dimensional CPU tensor works with device tensors as a scalar or "
        "an index. Other indexes in such a `try` are reported."
    ),
    before=(
        "import torch\n\nc = torch.tensor([3, 1, 3]).cuda()\ntry:\n"
        "    idx = torch.squeeze((c == 1).nonzero())[1]\nexcept IndexError:\n    idx = 0\n"
    ),
    after=(
        "import torch\n\nc = torch.tensor([3, 1, 3]).cuda()\ntry:\n"
        "    idx = torch.squeeze((c == 1).nonzero()).cpu()[1]\nexcept IndexError:\n    idx = 0\n"
    ),
    valid=(
        # the handler catches something else; the index is of a list
        "import torch\n\nc = torch.tensor([3, 1, 3]).cuda()\ntry:\n"
        "    idx = torch.squeeze((c == 1).nonzero())[1]\nexcept KeyError:\n    idx = 0\n",
        "import torch\n\nitems = [1, 2]\ntry:\n    x = items[3]\nexcept IndexError:\n    x = 0\n",
    ),
)

_CATCHING = frozenset({"IndexError", "LookupError", "Exception", "BaseException"})


class CaughtIndexErrors(XlaCodemod):
    DESCRIPTION = "Take an int index on the host where the program catches the IndexError it raises."
    RULES = (INDEX_ERROR,)
    TRIGGERS = (b"except",)
    NEEDS = ported_needs()

    def regions(self, tree):
        return [t for t in tree.nodes((cst.Try,)) if _catching(t)]  # type: ignore[attr-defined]

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        found = self._caught_index(original_node)
        if found is None:
            return updated_node
        name, fallback = found
        value = updated_node.value
        assert isinstance(value, cst.Subscript)
        code = cst.Module([]).code_for_node
        if not fallback:
            self.flag(original_node.value, INDEX_ERROR.code, f"`{code(original_node.value)}` in a `try` that catches "
                      "IndexError: torch_xla 2.9 kills the process (SIGSEGV) for an int index of a 0-dimensional "
                      "device tensor instead of raising; take the index on the host (`.cpu()[...]`)", fix=False)
            return updated_node
        if not self.flag(original_node.value, INDEX_ERROR.code, f"`{code(original_node.value)}` in a `try` that "
                         f"catches IndexError, `{name}` a number otherwise: indexed on the host (`.cpu()`), where it "
                         "raises as PyTorch does (torch_xla 2.9 kills the process for an int index of a "
                         "0-dimensional device tensor)", fix=True):
            return updated_node
        on_host = cst.Call(func=cst.Attribute(value.value, cst.Name("cpu")))
        return updated_node.with_changes(value=value.with_changes(value=on_host))

    def _caught_index(self, node: cst.Assign) -> Optional[tuple]:
        """(the name, does every handler that catches IndexError bind it a
        number) for ``name = <tensor op>[int]`` directly in the body of a
        ``try`` that catches IndexError; None for anything else."""
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
            return None
        value = node.value
        if not (isinstance(value, cst.Subscript) and isinstance(value.value, cst.Call) and len(value.slice) == 1
                and isinstance(value.slice[0].slice, cst.Index) and value.slice[0].slice.star is None):
            return None
        index = value.slice[0].slice.value
        if not _int_like(index) or _is_cpu_call(value.value) or any(
                TENSOR in values(self.tree).of(n) for n in find_all(index, cst.Name)):
            return None
        try_node = self._enclosing_try(node)
        if try_node is None:
            return None
        if not is_tensor_expr(value.value, set(), self.qualnames) or placement(self.tree, value.value) == HOST:
            return None
        name = node.targets[0].target.value
        handlers = [h for h in try_node.handlers if _catches_index_error(h)]
        return name, all(_binds_a_number(h, name) for h in handlers)

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
    return bool(names & _CATCHING)


def _catching(node: cst.Try) -> bool:
    return any(_catches_index_error(h) for h in node.handlers)


def _binds_a_number(handler: cst.ExceptHandler, name: str) -> bool:
    """Does the handler bind ``name`` to a number literal (``idx = 0``, ``x = -1.0``)?"""
    for assign in find_all(handler.body, cst.Assign, stop=(cst.FunctionDef, cst.ClassDef, cst.Lambda)):
        if [t.target.value for t in assign.targets if isinstance(t.target, cst.Name)] == [name]:  # type: ignore[attr-defined]
            value = assign.value  # type: ignore[attr-defined]
            if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
                value = value.expression
            return isinstance(value, (cst.Integer, cst.Float))
    return False


def _int_like(index: cst.BaseExpression) -> bool:
    """An index made of names, ints and arithmetic (no slice, tensor or call)."""
    if isinstance(index, (cst.Name, cst.Integer, cst.Attribute)):
        return True
    if isinstance(index, cst.UnaryOperation):
        return _int_like(index.expression)
    if isinstance(index, cst.BinaryOperation):
        return _int_like(index.left) and _int_like(index.right)
    return False


def _is_cpu_call(node: cst.Call) -> bool:
    return isinstance(node.func, cst.Attribute) and node.func.attr.value in ("cpu", "numpy", "tolist", "item")
