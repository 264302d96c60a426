"""Tests that switch on CUDA, and what the code they guard does.

A *CUDA test* is an atom that is true on a GPU host: an availability call
(``torch.cuda.is_available()``), a comparison with a CUDA device string
(``device_type == "cuda"``, ``"cuda" in device``, ``x.device.type != "cuda"``
is the negation of one), ``x.is_cuda``, or a *flag* -- a name the module
assigns from an expression holding one (``use_fused = fused_ok and
device_type == "cuda"``), through ``and``/``or``/``not``.

On XLA such a test is decided per guard, by what its CUDA side does
(:func:`cuda_only`): code that needs CUDA itself (a fused optimizer,
device properties, memory statistics, streams, apex or bitsandbytes) has no
XLA form, so the program must take the other side; choosing, placing or
wrapping for the device is what the accelerator does, so XLA takes the
CUDA side there (the other rules make that side work).  :func:`fold`
evaluates a test with its CUDA atoms fixed, keeping what else it reads.
"""

from __future__ import annotations

from typing import Dict, Optional, Set, Tuple, Union

import libcst as cst

from codemods.analysis.cuda import AVAILABILITY, in_cuda_module, is_cuda_string
from codemods.syntax.nodes import calls_nothing
from codemods.syntax.tree import TreeCache, call_name, dotted, string_value, walk
from codemods.target import XLA_CUDA_API

QualNames = object  # Callable[[cst.CSTNode], Set[str]]

# libraries that exist only for CUDA: code that imports or calls them needs a GPU
CUDA_ONLY_LIBS = frozenset({"apex", "bitsandbytes", "flash_attn", "xformers", "triton", "cupy", "pynvml", "nvidia",
                            "tensorrt", "torch_tensorrt", "transformer_engine", "liger_kernel", "mamba_ssm",
                            "causal_conv1d", "pycuda", "cuda", "nvtx"})
_NEGATED = (cst.NotEqual, cst.NotIn, cst.IsNot)
# CUDA calls that serve placement or settings, converted or dropped by their
# own rules: an index to place on (`.cuda(torch.cuda.current_device())`),
# cuDNN/TF32 flags -- not a reason to leave the CUDA side
_PLACEMENT = ("torch.backends.cudnn", "torch.backends.cuda.matmul", "torch.cuda.current_device",
              "torch.accelerator.current_device_index")


class Guards:
    """CUDA tests and flags of one module; get it with :func:`guards`."""

    def __init__(self, tree: TreeCache, qualnames) -> None:  # type: ignore[no-untyped-def]
        self.tree = tree
        self.qualnames = qualnames
        self.flags: Dict[str, bool] = {}  # dotted name -> True if it is true on CUDA, False if it is false there
        assigns = [n for n in tree.nodes((cst.Assign,)) if len(n.targets) == 1]  # type: ignore[attr-defined]
        for _ in range(3):  # flags of flags
            before = len(self.flags)
            for node in assigns:
                text = dotted(node.targets[0].target)  # type: ignore[attr-defined]
                if text and text not in self.flags:
                    sign = self.polarity(node.value)  # type: ignore[attr-defined]
                    if sign is not None:
                        self.flags[text] = sign
            if len(self.flags) == before:
                break

    # -- atoms -------------------------------------------------------------
    def atom(self, node: cst.CSTNode) -> Optional[bool]:
        """True/False when ``node`` is a CUDA test (its value on a GPU host),
        None when it is not one."""
        if isinstance(node, cst.Call):
            if self.qualnames(node.func) & AVAILABILITY:  # type: ignore[operator]
                return True
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "startswith" and node.args \
                    and (string_value(node.args[0].value) or "").startswith("cuda"):
                return True
            return None
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            target = node.comparisons[0]
            if is_cuda_string(node.left) or is_cuda_string(target.comparator) or _cuda_word(node.left) \
                    or _cuda_word(target.comparator):
                return not isinstance(target.operator, _NEGATED)
            return None
        if isinstance(node, cst.Attribute) and node.attr.value == "is_cuda":
            return True
        if isinstance(node, (cst.Name, cst.Attribute)):
            return self.flags.get(dotted(node) or "")
        return None

    def polarity(self, expr: cst.CSTNode) -> Optional[bool]:
        """Whether ``expr`` is true (True) or false (False) on CUDA when its
        other parts allow; None when it holds no CUDA test."""
        found = self.atom(expr)
        if found is not None:
            return found
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            inner = self.polarity(expr.expression)
            return None if inner is None else not inner
        if isinstance(expr, cst.BooleanOperation):
            return self.polarity(expr.left) if self.polarity(expr.left) is not None else self.polarity(expr.right)
        return None

    def fold(self, expr: cst.BaseExpression, on_cuda: bool) -> Tuple[Optional[bool], cst.BaseExpression]:
        """``expr`` with every CUDA test fixed to its value on a host where
        CUDA is there (``on_cuda``) or not: (its constant value, or None and
        what is left of it)."""
        sign = self.atom(expr)
        if sign is not None:
            return sign == on_cuda, expr
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            value, rest = self.fold(expr.expression, on_cuda)
            return (not value if value is not None else None), (expr if rest is expr.expression
                                                                else expr.with_changes(expression=rest))
        if isinstance(expr, cst.BooleanOperation):
            is_and = isinstance(expr.operator, cst.And)
            left, lrest = self.fold(expr.left, on_cuda)
            right, rrest = self.fold(expr.right, on_cuda)
            if left is not None and left != is_and:  # False and ..., True or ...
                return left, expr
            # (the left side dropped: it must change no state)
            if right is not None and right != is_and and left is None and calls_nothing(expr.left):
                return right, expr
            if left is not None:  # True and X, False or X -> X
                return right, rrest
            if right is not None:  # X and True, X or False -> X
                return None, lrest
            if lrest is expr.left and rrest is expr.right:
                return None, expr
            return None, expr.with_changes(left=lrest, right=rrest)
        return None, expr

    def tests_cuda(self, expr: cst.CSTNode) -> bool:
        return self.polarity(expr) is not None

    def cuda_side(self, node: Union[cst.If, cst.IfExp]) -> Optional[cst.CSTNode]:
        """The side of an ``if`` or a conditional expression taken on a GPU
        host (None: its test does not decide it alone)."""
        value, _ = self.fold(node.test, on_cuda=True)
        if value is None:
            return None
        if isinstance(node, cst.If):
            orelse = node.orelse
            return node.body if value else (orelse.body if isinstance(orelse, cst.Else) else orelse)
        return node.body if value else node.orelse


def _cuda_word(node: cst.CSTNode) -> bool:
    """``device.type`` compared with a string holding "cuda" (``"cuda:0"``)."""
    return (string_value(node) or "").startswith("cuda:")


def cuda_only(node: cst.CSTNode, qualnames, api=None) -> Optional[str]:  # type: ignore[no-untyped-def]
    """What in ``node`` needs CUDA itself and has no form on the target (a
    short description), or None: a ``torch.cuda`` API the target's table
    (``api``; torch_xla's by default) reports or does not know (device
    properties, memory statistics, streams), a fused optimizer, a library
    that exists only for CUDA."""
    for n in walk(node):
        if isinstance(n, cst.Call):
            name = in_cuda_module(qualnames(n.func))  # type: ignore[operator]
            if name and not name.startswith(_PLACEMENT):
                move = _move(name, XLA_CUDA_API if api is None else api)
                if move is None or move.kind == "report":
                    return f"`{name.replace('torch.', '', 1)}()`"
            roots = {q.split(".")[0] for q in qualnames(n.func)}  # type: ignore[operator]
            if roots & CUDA_ONLY_LIBS:
                return f"`{call_name(n) or 'a call'}` of {sorted(roots & CUDA_ONLY_LIBS)[0]}"
        elif isinstance(n, cst.Arg) and n.keyword is not None and n.keyword.value == "fused" \
                and not (isinstance(n.value, cst.Name) and n.value.value in ("False", "None")):
            return "a fused optimizer (`fused=`)"
        elif isinstance(n, cst.DictElement) and string_value(n.key) == "fused" \
                and not (isinstance(n.value, cst.Name) and n.value.value in ("False", "None")):
            return "a fused optimizer (`\"fused\"`)"
        elif isinstance(n, (cst.Import, cst.ImportFrom)):
            mods: Set[str] = set()
            if isinstance(n, cst.Import):
                mods = {(dotted(a.name) or "").split(".")[0] for a in n.names}
            elif n.module is not None and not n.relative:
                mods = {(dotted(n.module) or "").split(".")[0]}
            if mods & CUDA_ONLY_LIBS:
                return f"`import {sorted(mods & CUDA_ONLY_LIBS)[0]}`"
    return None


def uses_cuda_only_libs(tree: TreeCache) -> bool:
    """The module imports a library that exists only for CUDA (apex,
    bitsandbytes, flash_attn ...): its CUDA checks protect that code."""
    return any(full.lstrip(".").split(".")[0] in CUDA_ONLY_LIBS and not full.startswith(".")
               for full in tree.imports.values())


def _move(name: str, api):  # type: ignore[no-untyped-def]
    cur = name
    while cur:
        if cur in api:
            return api[cur]
        cur = cur.rpartition(".")[0]
    return None


def guards(tree: TreeCache, qualnames) -> Guards:  # type: ignore[no-untyped-def]
    found = tree.memo.get("guards")
    if not isinstance(found, Guards):
        found = tree.memo["guards"] = Guards(tree, qualnames)
    return found
