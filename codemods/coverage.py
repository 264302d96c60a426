"""XLA199: the CUDA catch-all -- nothing CUDA-specific is left unreported.

This codemod runs last, on the converted program.  Every CUDA-specific
construct still in it (:func:`codemods.analysis.cuda.cuda_references`) that
no other rule reported on its line is reported here, with a hint, so that a
conversion never "succeeds" while CUDA code silently remains.  The engine
also counts the references before and after conversion for the coverage line
(found / rewritten / left for review).
"""

from __future__ import annotations

import libcst as cst

from codemods.analysis.cuda import AVAILABILITY, REFERENCE_BYTES, count_references, cuda_references
from codemods.analysis.prefilter import CUDA_REFERENCE_WORDS, CUDA_RUNTIME_NAMES
from codemods.base import SELECT_KEY, SILENCED_KEY, USED_SUPPRESSIONS_KEY, Rule, XlaCodemod
from codemods.analysis.streams import CONTEXT, MAKERS
from codemods.cuda_api import CudaApi

COVERAGE_KEY = "xlaport.cuda_left"
# set by the engine once a rule has rewritten a CUDA test (SWITCH_CODES);
# the catch-all then lists in LEFT_KEY what is left that fails without CUDA:
# [(line of the user's file, label)] -- suppressed or not, reported or not
SWITCHED_KEY = "xlaport.switched"
LEFT_KEY = "xlaport.cuda_left_lines"
# left-over references that run on a host without CUDA: tests that answer False, and DataParallel,
# which there holds no device ids and calls its module as it is (its state keeps the `module.` prefix)
_HARMLESS = AVAILABILITY | {"torch.cuda.is_initialized", "DataParallel"}

# The rule that converts each kind of reference: with that rule turned off
# (--ignore, --select), what it would have converted is not reported here.
_OWNERS = {'"cuda"': ("XLA102", "XLA109"), '"nccl"': ("XLA141",), ".cuda()": ("XLA101",),
           ".pin_memory()": ("XLA108",), "pin_memory=": ("XLA108",), "device_ids=": ("XLA142",),
           "output_device=": ("XLA142",), "map_location=": ("XLA131",), "int device": ("XLA102",),
           "inference_mode()": ("XLA151",), "fused=": ("XLA152",), "matmul precision": ("XLA153",),
           "DataParallel": ("XLA154",)}


def _owners(label: str) -> tuple:
    if label in _OWNERS:
        return _OWNERS[label]
    if "GradScaler" in label:
        return ("XLA122",)
    if "autocast" in label:
        return ("XLA121",)
    if "spawn" in label or "start_processes" in label:
        return ("XLA143",)
    if label in MAKERS or label in CONTEXT:
        return ("XLA110", "XLA115")
    if label.startswith(("torch.backends.cudnn", "torch.backends.cuda")):
        return ("XLA112", "XLA115")
    return (CudaApi._rule_for(label), "XLA115")


_HINTS = {
    '"cuda"': 'a CUDA device string outside any device argument or device variable xlaport can see: '
              'if it names the device, use "xla" (or torch_xla.device())',
    '"nccl"': 'the NCCL backend needs CUDA: collectives on XLA use the "xla" process group',
    ".cuda()": "`.cuda()` xlaport did not convert: move with `.to(torch_xla.device())`",
    ".pin_memory()": "pinned memory needs CUDA: drop it",
    "device_ids=": "CUDA device ids: XLA processes each own one device, drop them",
    "output_device=": "a CUDA output device: drop it",
    "pin_memory=": "pinned memory needs CUDA: set it False",
    "map_location=": 'load checkpoints with map_location="cpu", then move them with load_state_dict',
    "int device": "an integer device is a CUDA ordinal (cuda:N): use torch_xla.device()",
    "inference_mode()": "inference tensors fail on XLA: use torch.no_grad()",
    "fused=": "no fused optimizer kernels for XLA tensors: fused=False",
    "matmul precision": "on XLA: torch_xla.backends.set_mat_mul_precision(...)",
    "DataParallel": "DataParallel does nothing on XLA: torch_xla.launch + DistributedDataParallel",
}

CATCH_ALL = Rule(
    code="XLA199",
    name="cuda-left-over",
    summary="a CUDA-specific construct no rule converted (reported, with a hint)",
    why=(
        "xlaport rewrites the CUDA idioms it understands and reports the ones it cannot convert "
        "with their own rule. Anything CUDA-specific left after that (a `torch.cuda` API it has no "
        "table entry for, a \"cuda\" string it cannot place, `.cuda()` it could not rewrite) is "
        "reported here, so that every remaining CUDA reference has a line in the report and the "
        "coverage line (found / rewritten / left) is exact."
    ),
    before="import torch\n\ntorch.cuda.jiterator._create_jit_fn(code)\n",
    after=None,
    valid=("import torch_xla\n\ndevice = torch_xla.device()\n",),
)


class CudaCatchAll(XlaCodemod):
    DESCRIPTION = "Report every CUDA-specific construct left in the converted program."
    RULES = (CATCH_ALL,)
    TRIGGERS = REFERENCE_BYTES  # (cuda_references' own test: the words it counts by)
    # what cuda_references reads is code: the words in it, the runtime names as names
    NEEDS = tuple(f"code~{w}" for w in CUDA_REFERENCE_WORDS) + tuple(f"name:{n}" for n in CUDA_RUNTIME_NAMES)

    def regions(self, tree):
        return []  # reads only: nothing is rewritten

    def visit_Module(self, node: cst.Module) -> None:
        refs = cuda_references(self.tree, self.qualnames)
        self.context.scratch[COVERAGE_KEY] = count_references(self.tree)
        if self.context.scratch.get(SWITCHED_KEY):
            failing = [(ref, label) for ref, label in refs if label not in _HARMLESS]
            where = self.tree.start_positions([ref for ref, _ in failing])
            self.context.scratch[LEFT_KEY] = [(self.user_line(where[id(ref)][0]), label)
                                              for ref, label in failing if id(ref) in where]
        selected = set(self.context.scratch.get(SELECT_KEY) or ())  # type: ignore[arg-type]
        # lines where a rule the user turned off or suppressed would have
        # spoken (whichever rule: XLA104 on a comparison holds a "cuda"
        # string, whose own rules are XLA102/XLA109): silent here too
        quiet = set(self.context.scratch.get(SILENCED_KEY) or ()) | {
            line for line, _ in self.context.scratch.get(USED_SUPPRESSIONS_KEY) or ()}  # type: ignore[union-attr]
        for ref, label in refs:
            owners = _owners(label)
            if selected - {CATCH_ALL.code} and not selected & set(owners):
                continue  # its own rule is turned off: the user chose not to hear about it
            if any(self.is_suppressed(ref, code) for code in owners):
                continue  # so is a suppression of its own rule on that line
            if quiet and self.user_line(self.position(ref)[0]) in quiet:
                continue
            if label.startswith("torch."):
                hint = f"`{label.replace('torch.', '', 1)}` has no XLA conversion in xlaport: remove or replace it"
            else:
                hint = _HINTS.get(label, "CUDA-specific: review it")
            self.flag(ref, CATCH_ALL.code, hint, fix=False)
