"""XLA116, XLA117: CUDA guards decided by what they guard.

A program switches on CUDA in many spellings (``torch.cuda.is_available()``,
``device_type == "cuda"``, a flag set from either).  Which way the switch
goes on XLA depends on the code behind it, not on its spelling
(``codemods.analysis.guards``):

* XLA116 -- a side taken only on CUDA that uses something only CUDA has (a
  fused optimizer, ``get_device_properties``, memory statistics, apex,
  flash-attn) goes: XLA takes the other side, as a CPU host would;
* XLA117 -- a requirement for CUDA on the program's path (``assert
  torch.cuda.is_available()``, ``if not ...: sys.exit(...)``) is a
  requirement for an accelerator, which XLA satisfies: it goes (unless the
  module uses a CUDA-only library, whose needs it may be guarding).

Every other CUDA test is left to the device rules, which make the CUDA side
work on XLA (availability is true, "cuda" strings become "xla").
"""

from __future__ import annotations

from typing import List, Optional, Union

import libcst as cst

from codemods.analysis.coupled_guards import coupled_guards
from codemods.analysis.cuda import is_script
from codemods.analysis.guards import CUDA_ONLY_LIBS, cuda_only, guards, uses_cuda_only_libs
from codemods.base import KEPT_SWITCH_CODE, SWITCH_CODES, Rule, XlaCodemod, call_name, dotted, find_all, string_value
from codemods.syntax.edits import DropsStatements

CUDA_ONLY_BRANCH = Rule(
    code="XLA116",
    name="cuda-only-branch",
    summary="a side of a CUDA test that needs CUDA itself (fused kernels, device properties) goes: XLA takes the other",
    why=(
        "On XLA the program runs on the accelerator, so most CUDA tests are taken as true and the code behind "
        "them is converted. Code that needs CUDA itself has no XLA form: `fused=True` optimizers raise on XLA "
        "tensors, `torch.cuda.get_device_properties()` raises without a GPU, apex or flash-attn cannot load. "
        "Such a side is removed and the other side kept, which is what the program does on a host without "
        "CUDA; the decision is made for each test, so a flag that also chooses the device still does that. A "
        "test of the same function tied to such a side -- one binds or changes in place (`log_msg.append(...)`) "
        "what the other reads -- is answered with it: mixing the two hosts' sides fails where neither did. "
        "The same holds for what runs only by `and`/`or` (`half = cuda and "
        "torch.cuda.get_device_capability()[0] >= 7` becomes `half = False`)."
    ),
    before=(
        "import torch\n\nuse_fused = fused_available and device_type == \"cuda\"\n"
        "extra_args = dict(fused=True) if use_fused else dict()\n"
        "if torch.cuda.is_available():\n    major = torch.cuda.get_device_properties(0).major\n"
        "else:\n    major = 0\n"
    ),
    after=(
        "import torch\n\nuse_fused = fused_available and device_type == \"cuda\"\n"
        "extra_args = dict()\nmajor = 0\n"
    ),
    valid=(
        "import torch\n\nif torch.cuda.is_available():\n    model = model.cuda()\n",
        "if device.type == \"cuda\":\n    torch.cuda.synchronize()\n",
    ),
)

CUDA_REQUIREMENT = Rule(
    code="XLA117",
    name="cuda-requirement",
    summary="a requirement for CUDA on the program's path (`assert torch.cuda.is_available()`) is met by XLA: removed",
    why=(
        "`assert torch.cuda.is_available(), \"needs a GPU\"` and `if not torch.cuda.is_available(): sys.exit()` "
        "say that the program needs an accelerator; on a TPU host CUDA is not available, so they would stop a "
        "program that XLA runs. They are removed. In a module that uses a CUDA-only library (apex, "
        "bitsandbytes, flash-attn), or in a library module (not a program's entry point), the check may "
        "protect what needs CUDA: it is left and reported (XLA105)."
    ),
    before=(
        "import sys\nimport torch\n\nassert torch.cuda.is_available(), \"needs a GPU\"\n"
        "if not torch.cuda.is_available():\n    sys.exit(\"no GPU\")\nargs = parser.parse_args()\n"
    ),
    after="import sys\nimport torch\n\nargs = parser.parse_args()\n",
    valid=("import torch\nimport apex\n\nassert torch.cuda.is_available(), \"apex needs CUDA\"\n",),
)

SWITCH_KEPT = Rule(
    code=KEPT_SWITCH_CODE,
    name="cuda-test-kept",
    summary="a CUDA test whose CUDA side holds code no rule converts is kept as it is (reported)",
    why=(
        "Making a CUDA test true on XLA (`torch.cuda.is_available()` -> `True`, `device.type == \"cuda\"` -> "
        "`\"xla\"`) switches on the code behind it: everything the test decides -- its `if` and conditional "
        "expressions, and the tests that read a flag, an alias or a function result made from it. On a host "
        "without CUDA the original took the other side and ran; if the side switched on still holds CUDA code "
        "that xlaport could not convert (a legacy `torch.cuda.FloatTensor` type test, a CUDA event, a sparse tensor), "
        "the conversion would fail where the original ran. So such a test is left as it was, and reported on its "
        "line with the construct that keeps it: convert that construct by hand, then the test. Where the kept "
        "test chooses the device, the same question asked elsewhere in the module is kept as well: answered "
        "otherwise there, the program would run partly on XLA, partly on the CPU."
    ),
    before=(
        "import torch\n\nuse_gpu = torch.cuda.is_available()\n"
        "Tensor = torch.cuda.FloatTensor if use_gpu else torch.FloatTensor\nok = isinstance(x, Tensor)\n"
    ),
    after=None,
    valid=("import torch\n\nif torch.cuda.is_available():\n    model.cuda()\n",
           # DataParallel runs without CUDA (it calls its module): the test is rewritten
           "import torch\n\nif torch.cuda.is_available():\n    model = torch.nn.DataParallel(model)\n"),
    requires=tuple(sorted(SWITCH_CODES)) + ("XLA101", "XLA119"),
)

_STOPS = {"exit", "quit", "abort", "_exit"}


class CudaGuards(DropsStatements, XlaCodemod):
    DESCRIPTION = "Decide CUDA tests by what they guard: drop CUDA-only sides and CUDA requirements."
    RESPECTS_HAND_PORTS = True
    RULES = (CUDA_ONLY_BRANCH, CUDA_REQUIREMENT, SWITCH_KEPT)
    TRIGGERS = (b"cuda", b"accelerator")
    NEEDS = ("code~cuda", "code~accelerator")

    def regions(self, tree):
        facts = guards(tree, self.qualnames)
        tested = [n for n in tree.nodes((cst.If, cst.IfExp, cst.Assert)) if facts.tests_cuda(n.test)]  # type: ignore[attr-defined]
        tested += [n for n in tree.nodes((cst.BooleanOperation,)) if facts.tests_cuda(n.left)]  # type: ignore[attr-defined]
        return list({id(s): s for s in (tree.statement_of(n) for n in tested)}.values())

    def _facts(self):  # type: ignore[no-untyped-def]
        return guards(self.tree, self.qualnames)

    # ------------------------------------------------------------ XLA116
    def _off_reason(self, node: Union[cst.If, cst.IfExp]) -> Optional[str]:
        """Why XLA takes the side of ``node`` a host without CUDA takes (the
        finding's message), or None: its CUDA side needs CUDA itself, or it
        shares state with a test whose CUDA side does
        (``analysis.coupled_guards``)."""
        side = self._facts().cuda_side(node)
        why = cuda_only(side, self.qualnames, self.target.cuda_api) if side is not None else None
        if why is not None:
            return f"the CUDA side uses {why}, which XLA does not have: the other side is kept"
        tied = coupled_guards(self.tree, self.qualnames, self.target.cuda_api).get(id(node))
        if tied is None:
            return None
        root, name = tied
        line = self.tree.statement_positions().get(id(self.tree.statement_of(root)), (0,))[0]
        where = f"the CUDA test on line {line}" if line else "a CUDA test of this function"
        return (f"answered as {where} (its CUDA side needs what XLA does not have): both use `{name}`, so the "
                "other side is kept here too")

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        if not self._facts().tests_cuda(original_node.test):
            return updated_node
        why = self._off_reason(original_node)
        if why is None:
            return updated_node
        value, rest = self._facts().fold(updated_node.test, on_cuda=False)
        if not self.flag(original_node, CUDA_ONLY_BRANCH.code, why, fix=True):
            return updated_node
        if value is None:
            return updated_node.with_changes(test=rest)
        kept = updated_node.body if value else updated_node.orelse
        return kept.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar) if updated_node.lpar else kept

    def leave_BooleanOperation(self, original_node: cst.BooleanOperation,
                               updated_node: cst.BooleanOperation) -> cst.BaseExpression:
        """``cuda and <only CUDA has it>`` (``half = use_gpu and
        torch.cuda.get_device_capability()[0] >= 7``): its right side runs
        only on CUDA; XLA takes what a host without CUDA gets, the left
        side's value there."""
        facts = self._facts()
        if not facts.tests_cuda(original_node.left):
            return updated_node
        conjunction = isinstance(original_node.operator, cst.And)
        on_cuda, _ = facts.fold(original_node.left, on_cuda=True)
        off, _ = facts.fold(updated_node.left, on_cuda=False)
        # the right side never runs without CUDA (`and` after a false left side, `or` after a true one), and
        # may run with it (the left side may hold more than the test: `flag and cuda and <CUDA's>`)
        if off is None or bool(off) == conjunction or (on_cuda is not None and bool(on_cuda) != conjunction):
            return updated_node
        why = cuda_only(original_node.right, self.qualnames, self.target.cuda_api)
        if why is None or not self.flag(original_node, CUDA_ONLY_BRANCH.code, f"the CUDA side uses {why}, which "
                                        "XLA does not have: the other side is kept", fix=True):
            return updated_node
        return cst.Name("True" if off else "False", lpar=updated_node.lpar, rpar=updated_node.rpar)

    def leave_If(self, original_node: cst.If, updated_node: cst.If):  # type: ignore[no-untyped-def]
        facts = self._facts()
        if isinstance(self.parent(original_node), cst.If) or not facts.tests_cuda(original_node.test):
            return updated_node  # (an elif is decided with the chain it belongs to)
        if self._requirement(original_node):
            if not self.flag(original_node, CUDA_REQUIREMENT.code, "a requirement for CUDA: XLA is the "
                             "accelerator here, so it is met (removed)", fix=True):
                return updated_node
            return self._keep(updated_node, facts.fold(updated_node.test, on_cuda=True))
        why = self._off_reason(original_node)
        if why is None or not self.flag(original_node, CUDA_ONLY_BRANCH.code, why, fix=True):
            return updated_node
        return self._keep(updated_node, facts.fold(updated_node.test, on_cuda=False))

    def _keep(self, node: cst.If, folded) -> Union[cst.BaseStatement, cst.FlattenSentinel]:  # type: ignore[no-untyped-def]
        """``node`` with its test decided: the side it takes, in its place."""
        value, rest = folded
        if value is None:
            return node.with_changes(test=rest)
        if value:
            return self._statements(node, node.body)
        orelse = node.orelse
        if orelse is None:
            return self.emptied(node)
        if isinstance(orelse, cst.If):  # elif ...: becomes if ...:
            return orelse.with_changes(leading_lines=node.leading_lines)
        return self._statements(node, orelse.body)

    def _statements(self, node: cst.If, suite: cst.BaseSuite):  # type: ignore[no-untyped-def]
        if isinstance(suite, cst.IndentedBlock):
            stmts: List[cst.BaseStatement] = list(suite.body)
        else:
            stmts = [cst.SimpleStatementLine(body=list(suite.body))]  # type: ignore[attr-defined]
        if not stmts:
            return self.emptied(node)
        stmts[0] = stmts[0].with_changes(leading_lines=[*node.leading_lines, *stmts[0].leading_lines])
        return cst.FlattenSentinel(stmts)

    # ------------------------------------------------------------ XLA117
    def _requirement(self, node: cst.If) -> bool:
        """``if <no CUDA>: stop`` with nothing else: a requirement."""
        value, _ = self._facts().fold(node.test, on_cuda=True)
        return (value is False and node.orelse is None and _stops(node.body) and self._programs_own()
                and not _names_cuda_only_lib(node.body))

    def _programs_own(self) -> bool:
        """A requirement of the program, not of a library: stated by an
        entry-point module that uses no CUDA-only library."""
        return is_script(self.tree, self.qualnames) and not uses_cuda_only_libs(self.tree)

    def leave_Assert(self, original_node: cst.Assert, updated_node: cst.Assert) -> cst.Assert:
        facts = self._facts()
        if not facts.tests_cuda(original_node.test) or not self._programs_own():
            return updated_node
        value, _ = facts.fold(original_node.test, on_cuda=True)
        if value is True and not _names_cuda_only_lib(original_node) and self.flag(original_node, CUDA_REQUIREMENT.code, "a requirement for CUDA: XLA is the "
                                       "accelerator here, so it is met (removed)", fix=True):
            self.drop(original_node)
        return updated_node


def _names_cuda_only_lib(node: cst.CSTNode) -> bool:
    """The check's own message names what needs CUDA (``"bitsandbytes
    requires CUDA"``): a requirement of that library, not of an accelerator."""
    words = " ".join((string_value(s) or "").lower() for s in find_all(node, cst.SimpleString))
    return any(lib in words for lib in CUDA_ONLY_LIBS if lib not in ("cuda", "nvidia")) or any(
        w in words for w in ("flash", "kernel", "fused", "apex"))


def _stops(body: cst.BaseSuite) -> bool:
    """A block that ends the program: it raises or calls ``sys.exit()``."""
    stmts = body.body if isinstance(body, cst.IndentedBlock) else [body]
    last = stmts[-1] if stmts else None
    if not isinstance(last, cst.SimpleStatementLine):
        return False
    for small in last.body:
        if isinstance(small, cst.Raise):
            return True
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            if call_name(small.value) in _STOPS or (dotted(small.value.func) or "") in ("sys.exit", "os._exit"):
                return True
    return False


__all__ = ["CudaGuards", "CUDA_ONLY_BRANCH", "CUDA_REQUIREMENT", "SWITCH_KEPT"]
