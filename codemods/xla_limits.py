"""XLA158-XLA160: what XLA cannot do, said on its line before it runs.

* XLA158 -- sparse tensors (``to_sparse()``, ``torch.sparse_coo_tensor``,
  ``torch.sparse.*``, ``torch.spmm``) have no XLA kernels: moving one to the
  device raises ``NotImplementedError`` (SparseXLA); ``share_memory()`` of an
  XLA model raises "_share_fd_: only available on CPU" (Hogwild does not
  port).  These fail on XLA, so a CUDA test that would switch them on is
  kept (XLA118).
* XLA159 -- an op torch_xla has no lowering for runs on the CPU: its tensors
  go to the host and back at every call.  Which ops: ``xla_ops_data.py``,
  generated from torch_xla's own kernel table by ``benchmarks/gen_xla_ops.py``.

* XLA160 -- a slice bound counted from the end past the size raises on XLA
  (eager PyTorch clamps it): where a loop grows the tensor, the bound is
  clamped to the size (``-min(n, x.size(axis))``), the same slice wherever
  ``n`` is within it.

XLA159 and XLA160 speak only in code being ported (``cuda.being_ported``);
XLA158 wherever it is (a sparse tensor made in a helper module fails when the
program sends it to the device).
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from codemods.analysis.cuda import being_ported, ported_needs
from codemods.analysis.dataflow import dataflow
from codemods.analysis.growth import grown_in
from codemods.analysis.placement import DEVICE, FACTORIES, placement
from codemods.analysis.prefilter_traps import FROM_THE_END
from codemods.analysis.project import SPARSE_CALLS, SPARSE_METHODS, SPARSE_NAMES, sparse_from_siblings
from codemods.analysis.values import TENSOR, values
from codemods.base import Rule, XlaCodemod, dotted, find_all
from codemods.syntax.nodes import source_of
from codemods.xla_ops_data import CPU_FALLBACK, FALLBACK_CALLS, TORCH_XLA

MOVING_SPARSE = "moving sparse"  # how XLA158 begins where a sparse tensor goes to the device


def moves_sparse_to_device(message: str) -> bool:
    """Is this XLA158 message said where a sparse tensor goes to the device
    (so the device chosen there cannot be XLA's)?"""
    return message.startswith(MOVING_SPARSE)


XLA_CANNOT = Rule(
    code="XLA158",
    name="xla-cannot",
    summary="sparse tensors and `share_memory()` fail on XLA (reported, with the fix)",
    why=(
        "XLA has no sparse tensors: `x.to_sparse().to(xla_device)` raises NotImplementedError (SparseXLA), and "
        "so do `torch.spmm`/`torch.sparse.mm` with a sparse operand on the device. An XLA tensor cannot be "
        "shared between processes either: `model.share_memory()` raises \"_share_fd_: only available on CPU\", "
        "so Hogwild-style training does not port. Keep sparse data on the CPU or make it dense (`.to_dense()`) "
        "before it goes to the device; train across processes with `torch_xla.launch` and "
        "DistributedDataParallel. A CUDA test that would switch such code on is kept (XLA118), and so is a test "
        "that chooses the device while the module moves a sparse tensor to a device anywhere (pytorch/examples' "
        "gcn: `load_cora(device)` sends its sparse matrices to the device `main` chose). A sparse tensor "
        "another module of the project returns (`adj, features = load_data()`, `load_data` in `utils.py`) is "
        "said where this module moves it: the rule reads what that module's functions return."
    ),
    before="import torch\n\nadj = adj.to_sparse().cuda()\nout = torch.spmm(adj, x)\n",
    after=None,
    valid=("import torch\n\nadj = adj.to_dense().cuda()\n",),
)

CPU_FALLBACK_OP = Rule(
    code="XLA159",
    name="xla-cpu-fallback",
    summary=f"an op torch_xla {TORCH_XLA} has no lowering for runs on the CPU (reported)",
    why=(
        f"torch_xla {TORCH_XLA} lowers most ATen ops to XLA; the rest (`Tensor.unfold`, `histc`, `searchsorted`, "
        "`nansum`, `torch.equal`, `linalg.eig` ...) fall back to the CPU: the pending graph runs, the tensors go "
        "to the host, the op runs there, and the result comes back -- at every call, and the graph is cut in "
        "two. The list is read from torch_xla's own kernel table (`benchmarks/gen_xla_ops.py`). Use an op XLA "
        "lowers (`as_strided`/`F.unfold` on 4-D input, `torch.bucketize` -> a comparison and `sum`), or move the "
        "call out of the step. Some torch utilities make modules that call such ops at every step: "
        "`nn.utils.weight_norm` (and its parametrization) runs `_weight_norm_interface` on the CPU in every "
        "forward and backward (measured on XLA's CPU backend by the same script)."
    ),
    before="import torch\n\nx = torch.randn(8, 8).cuda()\nh = torch.histc(x, bins=4)\n",
    after=None,
    valid=("import torch\n\nx = torch.randn(8, 8).cuda()\ny = torch.sum(x)\n",),
)

NEGATIVE_BOUND = Rule(
    code="XLA160",
    name="xla-negative-slice-bound",
    summary="a slice of the last `n` of a tensor a loop grows (torch_xla raises while it is shorter) is clamped to "
            "its size",
    why=(
        "Eager PyTorch clamps a slice bound to the tensor: `x[:, -8:]` of a 5-wide `x` is all of it. torch_xla 2.9 "
        "raises instead (\"Value out of range (expected to be in range of [-5, 4], but got -8)\"), so code that "
        "keeps the last `block_size` tokens of a sequence it grows, still shorter than that, crashes on XLA. Where a "
        "loop grows the tensor (`torch.cat`) and no test reads the bound first, the bound is clamped as eager "
        "PyTorch clamps it: `x[:, -min(n, x.size(1)):]`, the same slice wherever `n` is within the size. A slice "
        "whose axis cannot be told (after an ellipsis or a tensor index) is reported, with the fix."
    ),
    before=(
        "import torch\n\nidx = torch.zeros((1, 1), dtype=torch.long).cuda()\n"
        "for _ in range(8):\n    ctx = idx[:, -block_size:]\n    idx = torch.cat((idx, model(ctx)), dim=1)\n"
    ),
    after=(
        "import torch\n\nidx = torch.zeros((1, 1), dtype=torch.long).cuda()\n"
        "for _ in range(8):\n    ctx = idx[:, -min(block_size, idx.size(1)):]\n"
        "    idx = torch.cat((idx, model(ctx)), dim=1)\n"
    ),
    valid=(
        "import torch\n\nx = torch.zeros(4, 9).cuda()\ny = x[:, -2:]\n",
        "import torch\n\nx = torch.zeros(4, 9).cuda()\nctx = x[:, -min(n, x.size(1)):]\n",
        "import torch\n\nidx = torch.zeros((1, 1)).cuda()\nfor _ in range(8):\n"
        "    ctx = idx if idx.size(1) <= n else idx[:, -n:]\n    idx = torch.cat((idx, model(ctx)), dim=1)\n",
        "import torch\n\nnames = ['a', 'b'][-n:]\ny = torch.zeros(3).cuda()\n",
    ),
)


# how a user spells the aten op names of the table: torch.linalg.eig is aten::linalg_eig
_NAMESPACES = {"torch.linalg.": "linalg_", "torch.special.": "special_", "torch.nn.functional.": "",
               "torch.": ""}
_FUNCTIONAL = {"torch.nn.functional.unfold": "im2col", "torch.nn.functional.fold": "col2im",
               "torch.nn.Unfold": "im2col", "torch.nn.Fold": "col2im"}


def _spelled(op: str) -> str:
    for prefix in ("linalg_", "special_"):
        if op.startswith(prefix):
            return op[len(prefix):]
    return op


_FALLBACK_NAMES = frozenset({"fold", "Fold", "unfold", "Unfold", *(_spelled(op) for op in CPU_FALLBACK),
                            *(call.rpartition(".")[2] for call in FALLBACK_CALLS)})
_NAMES = frozenset({"spmm", "smm", "hspmm", "sspaddmm", "share_memory", *_FALLBACK_NAMES})


class XlaLimits(XlaCodemod):
    DESCRIPTION = ("Report what XLA cannot do: sparse tensors, share_memory(), ops with no XLA lowering, "
                   "slice bounds past the size.")
    RULES = (XLA_CANNOT, CPU_FALLBACK_OP, NEGATIVE_BOUND)
    TRIGGERS = (*sorted(n.encode() for n in SPARSE_NAMES), b"share_memory", b"fold", b"Fold", b"[-", b", -", b":-",
                b": -",
                *sorted({_spelled(op).encode() for op in CPU_FALLBACK}),
                *sorted({call.rpartition(".")[2].encode() for call in FALLBACK_CALLS}))
    SIBLING_FACTS = ("sparse_returns",)  # a sparse tensor another module's function returns, moved here
    NEEDS = (*(f"name:{n}" for n in sorted(SPARSE_NAMES)), "name:share_memory",  # XLA158: anywhere
             *ported_needs(*(f"name:{n}" for n in sorted(_FALLBACK_NAMES))),  # XLA159: in code being ported
             *ported_needs(FROM_THE_END))  # XLA160: likewise (a slice bound `-n`)

    def regions(self, tree):
        # names the module binds to a sparse tensor (coarsely: by their text, module-wide): moving one fails
        self._sparse = {dotted(t.target) for a in tree.nodes((cst.Assign,)) for t in a.targets  # type: ignore[attr-defined]
                        if isinstance(a.value, cst.Call) and self._sparse_or_shared(a.value)  # type: ignore[attr-defined]
                        and "share_memory" not in (dotted(a.value.func) or "")} - {None}  # type: ignore[attr-defined]
        self._sparse |= sparse_from_siblings(tree, getattr(self.context, "filename", None))  # (`adj = load_data()`)
        roots = {name.split(".")[0] for name in self._sparse}
        self._moved: set = set()  # id() of sparse-making calls said on the move around them
        self._clamps: set = set()  # id() of subscripts whose bounds from the end are clamped (XLA160)
        self._ported = being_ported(tree)  # (XLA159 speaks only there: a cost, not a failure)
        named = tree.statements_where(lambda n: n.value in _NAMES or n.value in roots or "sparse" in n.value,
                                      (cst.Name,))
        if not self._ported:
            return named
        bounds = tree.statements_where(lambda n: _from_the_end(n) is not None, (cst.Slice,))
        return list({id(st): st for st in named + bounds}.values())

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if not self._ported:
            return
        bounds = [b for e in node.slice if isinstance(e.slice, cst.Slice) for b in [_from_the_end(e.slice)] if b]
        if bounds and self._grown(node) and not self._guarded(node, bounds[0]):
            x = dotted(node.value) or "<tensor>"
            what = f"`-{bounds[0]}` as a slice bound of `{x}`: torch_xla {TORCH_XLA} raises \"Value out of range\" " \
                   f"where `{bounds[0]}` exceeds the size, eager PyTorch clamps"
            axes = _axes(node)
            if axes is None:
                self.flag(node, NEGATIVE_BOUND.code, f"{what}; where it can, clamp it (`-min({bounds[0]}, "
                          f"{x}.size(dim))`)", fix=False)
            elif self.flag(node, NEGATIVE_BOUND.code, f"{what}: clamped to the size (`-min({bounds[0]}, "
                           f"{x}.size({axes[0]}))`), as eager PyTorch does", fix=True):
                self._clamps.add(id(node))

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        if id(original_node) not in self._clamps:
            return updated_node
        elements = list(updated_node.slice)
        for k, element in enumerate(elements):
            part = element.slice
            if isinstance(part, cst.Slice) and _from_the_end(part):
                elements[k] = element.with_changes(slice=part.with_changes(
                    lower=_clamp(part.lower, updated_node.value, k), upper=_clamp(part.upper, updated_node.value, k)))
        return updated_node.with_changes(slice=elements)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if id(node) in self._moved:
            return  # (said on the move)
        if isinstance(func, cst.Attribute) and func.attr.value in ("to", "cuda") and (
                (dotted(func.value) in self._sparse and not self._made_dense(func.value))
                or (isinstance(func.value, cst.Call) and self._sparse_or_shared(func.value) is not None)):
            what = dotted(func.value) or source_of(func.value)
            self._moved.add(id(func.value))
            self.flag(node, XLA_CANNOT.code, f"{MOVING_SPARSE} `{what}`: XLA has no sparse tensors, moving "
                      "one to the device raises; make it dense first (`.to_dense()`) or keep it on the CPU",
                      fix=False)
            return
        found = self._sparse_or_shared(node)
        if found is not None:
            self.flag(node, XLA_CANNOT.code, found, fix=False)
            return
        if not self._ported:
            return
        wraps = next((q for q in self.qualnames(func) if q in FALLBACK_CALLS), None)
        if wraps is not None:
            ops = "`, `".join(FALLBACK_CALLS[wraps])
            shown = wraps.replace("torch.", "", 1)
            if wraps.startswith("torch.nn.utils."):  # (it wraps a module: its forward and backward fall back)
                self.flag(node, CPU_FALLBACK_OP.code, f"`{shown}` makes a module whose forward and backward call "
                          f"`{ops}`, which torch_xla {TORCH_XLA} has no lowering for: they run on the CPU at every "
                          "step, the graph cut at each; compute the normalised weight with ops XLA lowers", fix=False)
            else:  # a function that is an op of another name (`F.grid_sample`: `grid_sampler_2d`)
                self.flag(node, CPU_FALLBACK_OP.code, f"`{shown}` runs `{ops}`, which torch_xla {TORCH_XLA} has no "
                          "lowering for: it runs on the CPU, its tensors copied to the host and back at every call",
                          fix=False)
            return
        op = self._fallback_op(node)
        if op is not None:
            self.flag(node, CPU_FALLBACK_OP.code, f"`{op}` has no XLA lowering in torch_xla {TORCH_XLA}: it runs on "
                      "the CPU, its tensors copied to the host and back at every call", fix=False)

    def _made_dense(self, node: cst.BaseExpression) -> bool:
        """Is every binding of the name ``node`` that reaches here dense,
        though the name once held a sparse tensor (``adj = torch.eye(n) +
        adj``: a dense tensor plus a sparse one is dense; ``adj.to_dense()``)?"""
        if not isinstance(node, cst.Name):
            return False
        flow = dataflow(self.tree)
        values = [flow.source(b)[0] for b in flow.reaching(node)]
        return bool(values) and all(_dense(v, self.qualnames) for v in values)

    def _grown(self, node: cst.Subscript) -> bool:
        """``node`` slices a tensor that a loop around it grows (it starts
        shorter than the last ``n`` the slice keeps)."""
        return isinstance(node.value, cst.Name) and any(
            isinstance(a, (cst.For, cst.While)) and node.value.value in grown_in(a, self.qualnames)
            for a in self._in_scope(node))

    def _guarded(self, node: cst.CSTNode, bound: str) -> bool:
        """Taken only after a test that reads the bound (``idx if idx.size(1)
        <= block_size else idx[:, -block_size:]``): the code knows the size."""
        return any(isinstance(a, (cst.IfExp, cst.If, cst.While))
                   and any(dotted(n) == bound for n in find_all(a.test, (cst.Name, cst.Attribute)))
                   for a in self._in_scope(node))

    def _in_scope(self, node: cst.CSTNode):  # type: ignore[no-untyped-def]
        """The nodes around ``node`` up to its function, class or module."""
        for a in self.ancestors(node):
            if isinstance(a, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                return
            yield a

    def _sparse_or_shared(self, node: cst.Call) -> Optional[str]:
        func = node.func
        names = self.qualnames(func)
        if names & SPARSE_CALLS or any(q.startswith("torch.sparse.") for q in names):
            name = sorted(names)[0].replace("torch.", "", 1)
            return (f"`{name}` makes or uses a sparse tensor: XLA has no sparse tensors (moving one to the device "
                    "raises); keep it on the CPU or make it dense (`.to_dense()`) before it goes to the device")
        if isinstance(func, cst.Attribute) and not node.args and func.attr.value in SPARSE_METHODS | {"share_memory"} \
                and not names:
            if func.attr.value == "share_memory":
                return ("`share_memory()`: an XLA tensor cannot be shared between processes (Hogwild does not port); "
                        "train across processes with `torch_xla.launch` and DistributedDataParallel")
            return (f"`.{func.attr.value}()`: XLA has no sparse tensors (moving one to the device raises); keep it on "
                    "the CPU or use the dense tensor")
        return None

    def _fallback_op(self, node: cst.Call) -> Optional[str]:
        """The op ``node`` calls when torch_xla has no lowering for it and one
        of its tensors is on the device (a tokenizer's CPU tensors compared
        with ``torch.equal`` cost nothing on XLA)."""
        func = node.func
        operands = [a.value for a in node.args if a.keyword is None][:2]
        if isinstance(func, cst.Attribute):
            operands.append(func.value)
        if not any(placement(self.tree, o) == DEVICE for o in operands):
            return None
        for q in self.qualnames(func):
            if q in _FUNCTIONAL:
                return q.replace("torch.", "", 1)
            for prefix, aten in _NAMESPACES.items():
                if q.startswith(prefix) and "." not in q[len(prefix):] and aten + q[len(prefix):] in CPU_FALLBACK:
                    return q.replace("torch.", "", 1)
        if isinstance(func, cst.Attribute) and func.attr.value in CPU_FALLBACK and not self.qualnames(func) \
                and TENSOR in values(self.tree).of(func.value):
            return f"{dotted(func.value) or '<tensor>'}.{func.attr.value}()"
        return None


def _from_the_end(part: cst.Slice) -> Optional[str]:
    """The ``n`` of a bound ``-n`` of ``part`` that is not a number (``-block_size``,
    ``-self.n``): a count from the end that may be larger than the size (a
    literal ``-1``, ``-2`` is left alone: it reads a size the code knows; so
    is ``-min(n, ...)``, a bound already clamped)."""
    for bound in (part.lower, part.upper):
        if isinstance(bound, cst.UnaryOperation) and isinstance(bound.operator, cst.Minus) and \
                not isinstance(bound.expression, (cst.Integer, cst.Float)) and \
                not (isinstance(bound.expression, cst.Call) and dotted(bound.expression.func) == "min"):  # (clamped)
            return dotted(bound.expression) or "n"
    return None


def _counted(bound: Optional[cst.BaseExpression]) -> bool:
    """Is ``bound`` a count from the end that :func:`_from_the_end` names?"""
    part = cst.Slice(lower=bound, upper=None) if bound is not None else None
    return part is not None and _from_the_end(part) is not None


def _axes(node: cst.Subscript) -> Optional[List[int]]:
    """The axis of ``node``'s receiver that each slice with a bound from
    the end cuts: its place in the subscript, where only slices and int
    literals stand before it (an ellipsis, ``None`` or an index that may be
    a tensor shifts the axes); None where one cannot be told."""
    axes: List[int] = []
    regular = True
    for k, element in enumerate(node.slice):
        part = element.slice
        if isinstance(part, cst.Slice):
            if _counted(part.lower) or _counted(part.upper):
                if not regular:
                    return None
                axes.append(k)
            continue
        value = part.value
        if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
            value = value.expression
        regular = regular and isinstance(value, cst.Integer) and part.star is None
    return axes or None


def _clamp(bound: Optional[cst.BaseExpression], x: cst.BaseExpression, axis: int) -> Optional[cst.BaseExpression]:
    """``-n`` -> ``-min(n, x.size(axis))``: the same slice wherever ``n`` is
    within the size (and ``-0``, all of it, stays ``-0``), all of ``x``
    where it is larger, as eager PyTorch clamps."""
    if not _counted(bound):
        return bound
    size = cst.Call(cst.Attribute(x, cst.Name("size")), [cst.Arg(cst.Integer(str(axis)))])
    return bound.with_changes(expression=cst.Call(  # type: ignore[union-attr]
        cst.Name("min"), [cst.Arg(bound.expression, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),  # type: ignore[union-attr]
                          cst.Arg(size)]))


__all__ = ["XlaLimits", "XLA_CANNOT", "CPU_FALLBACK_OP", "NEGATIVE_BOUND"]


_DENSE_FACTORIES = frozenset(f"torch.{n}" for n in FACTORIES)


def _dense(value: Optional[cst.CSTNode], qualnames) -> bool:  # type: ignore[no-untyped-def]
    """A value that is dense whatever sparse tensor it reads: ``.to_dense()``,
    or a sum or difference with a tensor a torch factory makes."""
    if isinstance(value, cst.Call):
        return isinstance(value.func, cst.Attribute) and value.func.attr.value == "to_dense"
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract)):
        return any(isinstance(side, cst.Call) and qualnames(side.func) & _DENSE_FACTORIES
                   for side in (value.left, value.right))
    return False

