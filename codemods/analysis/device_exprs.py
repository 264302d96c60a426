"""What an expression says about a device, for the rules that rewrite
hard-coded CUDA devices (``codemods.devices``): a CUDA device (``"cuda"``,
``torch.device("cuda:1")``, ``torch.accelerator.current_accelerator()``), a
host device (``"cpu"``, ``"mps" if use_mps else "cpu"``), the choice between
the two (``"cuda" if torch.cuda.is_available() else "cpu"``, written as an
expression or as an ``if`` statement that assigns one name), and whether a
test asks for CUDA's availability."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import libcst as cst

from codemods.analysis.cuda import cuda_facts, is_cuda_string
from codemods.syntax.tree import TreeCache, find_all, string_value

HOST_DEVICES = {"cpu", "mps"}
# what returns the XLA device (torch_xla >= 2.5, the older spelling, the module path)
XLA_DEVICE_CALLS = frozenset({"torch_xla.device", "torch_xla.core.xla_model.xla_device", "torch_xla.torch_xla.device"})
# flags named for CUDA: the last resort for a test set by a caller or a config file
_CUDA_FLAGS = {"use_cuda", "cuda", "has_cuda", "cuda_available", "on_gpu", "use_gpu", "use_accel"}


def is_host_literal(node: cst.CSTNode) -> bool:
    return string_value(node) in HOST_DEVICES


class DeviceExprs:
    """The device questions of one tree, with a codemod's ``qualnames``."""

    def __init__(self, tree: TreeCache, qualnames: Callable[[cst.CSTNode], Iterable[str]]) -> None:
        self.tree = tree
        self.qualnames = qualnames

    def _is(self, node: cst.CSTNode, *names: str) -> bool:
        return bool(set(self.qualnames(node)) & set(names))

    def is_torch_device(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Call) and self._is(node.func, "torch.device")

    def xla_device(self, node: cst.CSTNode) -> bool:
        """``torch_xla.device()`` (what a CUDA device string became), ``xm.xla_device()``."""
        return isinstance(node, cst.Call) and not node.args and self._is(node.func, *XLA_DEVICE_CALLS)

    def cuda_device(self, node: cst.CSTNode) -> bool:
        """A hard-coded CUDA device: "cuda", torch.device("cuda"...), or the
        device expression the target already uses (after an inner rewrite)."""
        if is_cuda_string(node):
            return True
        if isinstance(node, cst.Call) and self._is(node.func, "torch.accelerator.current_accelerator"):
            return True
        if self.is_torch_device(node):
            args = node.args  # type: ignore[attr-defined]
            return bool(args) and is_cuda_string(args[0].value)
        return False

    def host_device(self, node: cst.CSTNode) -> bool:
        if is_host_literal(node):
            return True
        if isinstance(node, cst.IfExp):  # "mps" if use_mps else "cpu"
            return self.host_device(node.body) and self.host_device(node.orelse)
        if self.is_torch_device(node):
            args = node.args  # type: ignore[attr-defined]
            return bool(args) and is_host_literal(args[0].value)
        return False

    def is_idiom(self, node: cst.CSTNode) -> bool:
        """``CUDA if <anything> else CPU`` (or the reverse under ``not``),
        unless the test reads the user's choice besides availability."""
        if not isinstance(node, cst.IfExp) or self.keeps_a_choice(node.test):
            return False
        return (self.cuda_device(node.body) and self.host_device(node.orelse)) or (
            self.host_device(node.body) and self.cuda_device(node.orelse)
        )

    def chosen_cuda_side(self, node: cst.CSTNode) -> Optional[str]:
        """In ``CUDA if <test> else CPU`` whose test reads the user's choice
        besides availability: the CUDA side (``"body"``/``"orelse"``)."""
        if not isinstance(node, cst.IfExp) or not self.keeps_a_choice(node.test):
            return None
        if self.cuda_device(node.body) and self.host_device(node.orelse):
            return "body"
        if self.host_device(node.body) and self.cuda_device(node.orelse):
            return "orelse"
        return None

    def keeps_a_choice(self, test: cst.BaseExpression) -> bool:
        """The user's choice (``CudaFacts.users_choice``): not collapsed to the
        XLA device; its CUDA side becomes XLA on its own."""
        return cuda_facts(self.tree, self.qualnames).users_choice(test)  # type: ignore[arg-type]

    def mentions_availability(self, test: cst.BaseExpression) -> bool:
        """The test calls an availability predicate, directly or through a
        flag assigned from one (dataflow); a flag named for CUDA as a last
        resort (one set by a caller or a config file)."""
        if cuda_facts(self.tree, self.qualnames).tests_availability(test):  # type: ignore[arg-type]
            return True
        return any(name.value in _CUDA_FLAGS for name in find_all(test, cst.Name))  # type: ignore[attr-defined]

    def if_idiom_target(self, node: cst.If) -> Optional[cst.BaseAssignTargetExpression]:
        """``if cuda_available: dev = CUDA [elif ...: dev = HOST] [else: dev = HOST]``:
        the one name every branch assigns a device to, or None."""
        if not self.mentions_availability(node.test) or self.keeps_a_choice(node.test):
            return None
        body_target = _single_assign(node.body, self.cuda_device)
        if body_target is None:
            return None
        orelse = node.orelse
        while isinstance(orelse, cst.If):  # elif use_mps: device = "mps"
            elif_target = _single_assign(orelse.body, self.host_device)
            if elif_target is None or not elif_target.deep_equals(body_target):
                return None
            orelse = orelse.orelse
        if orelse is not None:
            else_target = _single_assign(orelse.body, self.host_device)
            if else_target is None or not else_target.deep_equals(body_target):
                return None
        return body_target


def _single_assign(body: cst.BaseSuite, pred) -> Optional[cst.BaseAssignTargetExpression]:  # type: ignore[no-untyped-def]
    """The target of a suite that is exactly one ``X = <pred>`` statement."""
    if not isinstance(body, cst.IndentedBlock) or len(body.body) != 1:
        return None
    line = body.body[0]
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    stmt = line.body[0]
    if isinstance(stmt, cst.Assign) and len(stmt.targets) == 1 and pred(stmt.value):
        return stmt.targets[0].target
    return None
