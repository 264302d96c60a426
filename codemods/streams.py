"""XLA110: CUDA streams that only order the program's own work go.

A stream prefetcher copies the next batch on a side stream and makes the
current stream wait for it (``codemods.analysis.streams`` says which
streams a program only uses so).  XLA runs a process's work in program
order, on one stream of its own, so the streams change no value there --
and ``torch.cuda.Stream()`` raises on a host without CUDA, so a conversion
that keeps them fails at its first batch.  The stream's binding and its
orderings (``wait_stream``, ``record_stream``) go, ``with
torch.cuda.stream(s):`` becomes ``with contextlib.nullcontext():``, and
``s.synchronize()`` waits for the device as ``torch.cuda.synchronize()``
does on the target.  A stream used any other way is left, and reported
(XLA115).
"""

from __future__ import annotations

import libcst as cst

from codemods.analysis.streams import CONTEXT, MAKERS, stream_plan
from codemods.base import Rule, XlaCodemod, find_all
from codemods.syntax.edits import DropsStatements

STREAMS = Rule(
    code="XLA110",
    name="cuda-stream",
    summary="CUDA streams that only order the program's own work (stream prefetchers) are removed",
    why=(
        "A stream prefetcher (apex's `data_prefetcher`, `CUDAPrefetcher`) copies the next batch on a side "
        "stream while the current one computes, and makes the current stream wait for it. XLA runs a "
        "process's work in program order and overlaps host-to-device copies itself (`MpDeviceLoader`), so "
        "the streams change no value; `torch.cuda.Stream()` raises on a TPU host, so a port that keeps them "
        "fails at its first batch. Where a stream is only made, entered (`with torch.cuda.stream(s):`), "
        "waited for (`wait_stream`, `record_stream`, `synchronize`), its statements go and the `with` keeps "
        "its body under `contextlib.nullcontext()`. A stream used any other way (passed on, tested, "
        "returned) is left and reported (XLA115)."
    ),
    before=(
        "import torch\n\nstream = torch.cuda.Stream()\nfor x in loader:\n"
        "    with torch.cuda.stream(stream):\n        x = x.cuda(non_blocking=True)\n"
        "    torch.cuda.current_stream().wait_stream(stream)\n    x.record_stream(torch.cuda.current_stream())\n"
        "    loss = model(x)\n"
    ),
    after=(
        "import torch\nimport contextlib\n\nfor x in loader:\n"
        "    with contextlib.nullcontext():\n        x = x.cuda(non_blocking=True)\n"
        "    loss = model(x)\n"
    ),
    valid=(
        # the stream is handed to code xlaport does not see: left (and reported)
        "import torch\n\nstream = torch.cuda.Stream()\nrun(stream)\nwith torch.cuda.stream(stream):\n"
        "    y = f(x)\n",
        # timm's PrefetchLoader: the stream is tested (`is not None`)
        "import torch\n\nstream = torch.cuda.Stream() if cuda else None\nif stream is not None:\n"
        "    torch.cuda.current_stream().wait_stream(stream)\n",
    ),
)


class CudaStreams(DropsStatements, XlaCodemod):
    DESCRIPTION = "Remove CUDA streams that only order the program's own work (stream prefetchers)."
    RULES = (STREAMS,)
    TRIGGERS = (b"stream", b"Stream")

    def regions(self, tree):
        self._plan = stream_plan(tree, self.qualnames)
        return self._plan.statements

    def _rewrites(self, node: cst.CSTNode, message: str) -> bool:
        """Report the rewrite of ``node``; False: it is suppressed, leave it."""
        done = self.flag(node, STREAMS.code, message, fix=True)
        if done:  # (a name imported for the streams alone, `from torch import cuda`, goes with them)
            for full in (*MAKERS, *CONTEXT):
                module, _, name = full.rpartition(".")
                self.remove_unused_import(module, name)
            self.remove_unused_import("torch", "cuda")
        return done

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        plan = self._plan
        if id(original_node) in plan.contexts:
            if not self._rewrites(original_node, "`torch.cuda.stream(...)` -> `contextlib.nullcontext()`: "
                                  "XLA runs the body in program order"):
                return updated_node
            self.add_imports((("contextlib", None, None),))
            return cst.parse_expression("contextlib.nullcontext()")
        if id(original_node) in plan.waits:
            return self._wait(original_node, updated_node)
        return updated_node

    def _wait(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        move = self.target.cuda_api.get("torch.cuda.synchronize")
        if move is None or move.kind not in ("expr", "call", "drop"):
            return updated
        if not self._rewrites(original, "a stream's `synchronize()`: waits for the device as "
                              "`torch.cuda.synchronize()` does"):
            return updated
        if move.kind == "drop":
            return self.drop_call(updated, self.parent(original))
        self.add_imports(move.imports)
        if move.kind == "call":
            return cst.Call(func=cst.parse_expression(move.code))
        return cst.parse_expression(move.code)

    def leave_Expr(self, original_node: cst.Expr, updated_node: cst.Expr) -> cst.Expr:
        if id(original_node) in self._plan.drops and self._rewrites(
                original_node, "a wait between CUDA streams removed: XLA orders the work itself"):
            self.drop(original_node)
        return updated_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        return self._binding(original_node, updated_node)

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign) -> cst.AnnAssign:
        return self._binding(original_node, updated_node)

    def _binding(self, original, updated):  # type: ignore[no-untyped-def]
        if id(original) in self._plan.drops and self._rewrites(
                original, "a CUDA stream removed: nothing uses it but waits XLA does not need"):
            self.drop(original)
        return updated

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        if isinstance(self.parent(original_node), cst.If):
            return updated_node  # an elif: its chain stays as it is
        return self._goes_whole(original_node, original_node.test, updated_node)

    def leave_For(self, original_node: cst.For, updated_node: cst.For):
        return self._goes_whole(original_node, original_node.iter, updated_node)

    def _goes_whole(self, original, head: cst.CSTNode, updated):  # type: ignore[no-untyped-def]
        """``if x is not None: x.record_stream(...)`` (or a ``for`` over the
        batch) goes whole when nothing is left in it and its head calls
        nothing."""
        body = original.body
        if original.orelse is not None or not isinstance(body, cst.IndentedBlock) or find_all(head, cst.Call):
            return updated
        dropped = self.__dict__.get("_dropped") or set()
        gone = self.__dict__.setdefault("_gone", set())
        if all(id(s) in gone or isinstance(s, cst.SimpleStatementLine) and all(id(x) in dropped for x in s.body)
               for s in body.body):
            gone.add(id(original))
            return self.emptied(updated)
        return updated


__all__ = ["CudaStreams", "STREAMS"]
