"""XLA105, XLA108, XLA111-XLA115: the ``torch.cuda.*`` API and pinned memory.

What each call becomes is the target's table (``codemods/target.py``,
``Move``): a counterpart call, an expression, nothing (``empty_cache``,
``set_device``, cuDNN/TF32 flags), or a report when XLA has no counterpart
(memory statistics, streams, events, CUDA graphs, NVTX).

Availability tests (``torch.cuda.is_available()``,
``torch.accelerator.is_available()``) become ``True``: the converted program
runs on the accelerator, so it must take the branches the original took on
its GPU -- otherwise it silently runs on the CPU, or with other settings
(no shuffling, no workers) than the GPU run.  The exception is a test that
guards a CUDA API with no XLA counterpart: that test is left and reported.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from codemods.analysis.cuda import cuda_facts, in_cuda_module, is_false, is_script, scope_of
from codemods.syntax.edits import DropsStatements
from codemods.base import Rule, XlaCodemod, dotted, find_all, string_value
from codemods.target import Move

AVAILABLE = Rule(
    code="XLA105",
    name="cuda-is-available",
    summary="`torch.cuda.is_available()` and other accelerator tests: true on XLA",
    why=(
        "On a TPU host `torch.cuda.is_available()` is False, so every branch it guards (the "
        "device, `pin_memory`, workers, shuffling, bf16 choices) silently takes its CPU side. "
        "The converted program runs on the accelerator, so the test becomes `True` and the "
        "program takes the branches the GPU run took; the CUDA calls inside are converted by "
        "their own rules. A test that guards a CUDA API with no XLA counterpart (memory "
        "statistics, streams) is left as it is and reported."
    ),
    before=(
        "import torch\n\nuse_cuda = not args.no_cuda and torch.cuda.is_available()\n"
        "kwargs = {\"shuffle\": True} if use_cuda else {}\n"
    ),
    after=(
        "import torch\n\nuse_cuda = not args.no_cuda and True\n"
        "kwargs = {\"shuffle\": True} if use_cuda else {}\n"
    ),
    valid=("import torch\n\nok = torch.cuda.is_initialized\n",),
)

PIN_MEMORY = Rule(
    code="XLA108",
    name="pin-memory",
    summary="pinned host memory (`.pin_memory()`, `pin_memory=True`) is dropped",
    why=(
        "Pinned memory is a CUDA host-to-device optimisation. An XLA tensor cannot be pinned "
        "(`.pin_memory()` raises \"cannot pin 'XLAFloatType'\") and a TPU host has no CUDA to "
        "pin for; `MpDeviceLoader` overlaps the copies instead. `.pin_memory()` is removed and "
        "`pin_memory=` becomes False."
    ),
    before="loader = DataLoader(ds, batch_size=8, pin_memory=True)\nx = x.pin_memory().to(device)\n",
    after="loader = DataLoader(ds, batch_size=8, pin_memory=False)\nx = x.to(device)\n",
    valid=("loader = DataLoader(ds, pin_memory=False)\n",),
)

SYNCHRONIZE = Rule(
    code="XLA111",
    name="cuda-synchronize",
    summary="`torch.cuda.synchronize()`: cut the graph and wait for the device",
    why=(
        "XLA tensors are lazy: nothing runs until a barrier. The counterpart of waiting for "
        "the GPU is `torch_xla.sync(wait=True)`, which runs what is pending and waits for it, "
        "so timings around it mean what they meant on the GPU."
    ),
    before="import torch\n\ntorch.cuda.synchronize()\n",
    after="import torch\nimport torch_xla\n\ntorch_xla.sync(wait=True)\n",
)

NO_OP = Rule(
    code="XLA112",
    name="cuda-no-op",
    summary="CUDA memory, device-index and cuDNN/TF32 settings mean nothing on XLA: dropped",
    why=(
        "`torch.cuda.empty_cache()`, `set_device()`, `reset_peak_memory_stats()` and the "
        "`torch.backends.cudnn.*` / `torch.backends.cuda.*` flags (benchmark, deterministic, "
        "allow_tf32) act on CUDA's allocator and libraries, which an XLA program does not use: "
        "the XLA runtime manages memory and picks its own kernels. TF32 has no TPU meaning either "
        "(f32 matmuls there use bf16 passes by default; `torch_xla.backends.set_mat_mul_precision` "
        "changes that). The statements are removed (a block left empty gets `pass`). `with "
        "torch.cuda.device(i):` (a no-op for a negative `i`, as programs pass it without CUDA) becomes "
        "`with contextlib.nullcontext():` -- a process has one XLA device."
    ),
    before=(
        "import torch\n\ntorch.backends.cudnn.benchmark = True\n"
        "torch.backends.cuda.matmul.allow_tf32 = True\ntorch.cuda.set_device(rank)\n"
        "if step % 100 == 0:\n    torch.cuda.empty_cache()\n"
    ),
    after="import torch\n\nif step % 100 == 0:\n    pass\n",
)

SEED = Rule(
    code="XLA113",
    name="cuda-manual-seed",
    summary="`torch.cuda.manual_seed[_all]`: seed the XLA generator",
    why=(
        "`torch.manual_seed` does not seed the XLA device's generator, and the CUDA one does not "
        "exist there: `torch_xla.manual_seed(seed)` does."
    ),
    before="import torch\n\ntorch.cuda.manual_seed_all(seed)\n",
    after="import torch\nimport torch_xla\n\ntorch_xla.manual_seed(seed)\n",
)

DEVICE_QUERY = Rule(
    code="XLA114",
    name="cuda-device-query",
    summary="device counts and indices come from `torch_xla.runtime`",
    why=(
        "`torch.cuda.device_count()` is 0 on a TPU host, so code sized by it (world size, "
        "sampler shards, learning-rate scaling) silently breaks. `xr.world_size()` is the number "
        "of XLA processes; `torch.accelerator.current_accelerator()` is the XLA device. The runtime "
        "must not start on import or in a function that launches worker processes (torch_xla refuses "
        "to launch then), so there the count is reported instead: `torch_xla.launch` picks the "
        "number of processes. `current_device()` is reported: an int index means a CUDA device to torch. "
        "`torch.cuda.memory_summary()`, a report the program prints about its device (it raises where CUDA "
        "never ran), becomes XLA's report, `torch_xla.debug.metrics.short_metrics_report()`."
    ),
    before="import torch\n\ndef main(args):\n    n_gpus = torch.cuda.device_count()\n",
    after="import torch\nimport torch_xla.runtime as xr\n\ndef main(args):\n    n_gpus = xr.world_size()\n",
)

UNSUPPORTED = Rule(
    code="XLA115",
    name="cuda-unsupported-api",
    summary="CUDA memory statistics, streams, events, graphs, NVTX: no XLA counterpart (reported)",
    why=(
        "These APIs describe or drive CUDA's own machinery. XLA orders and fuses work itself and "
        "has no user streams, events or graphs; `xm.get_memory_info()` reports TPU memory. "
        "xlaport cannot choose a replacement: remove or rewrite the code by hand."
    ),
    before="import torch\n\nprint(torch.cuda.max_memory_allocated() / 2**20)\n",
    after=None,
)

_SETTINGS = ("torch.backends.cudnn.", "torch.backends.cuda.")


class CudaApi(DropsStatements, XlaCodemod):
    DESCRIPTION = "Convert torch.cuda.* calls, accelerator tests, cuDNN/TF32 flags and pinned memory."
    RESPECTS_HAND_PORTS = True
    RULES = (AVAILABLE, PIN_MEMORY, SYNCHRONIZE, NO_OP, SEED, DEVICE_QUERY, UNSUPPORTED)
    TRIGGERS = (b"cuda", b"accelerator", b"pin_memory", b"cudnn")
    NEEDS = tuple(f"code~{t.decode()}" for t in TRIGGERS)  # (see regions)

    def regions(self, tree):
        return tree.statements_where(lambda n: (
            (isinstance(n, cst.Name) and (n.value in ("accelerator", "cudnn", "pin_memory")
                                          or n.value.startswith("cuda")))
            or (isinstance(n, cst.SimpleString) and "pin_memory" in n.value)
        ), (cst.Name, cst.SimpleString))

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    # ------------------------------------------------------------ lookups
    def _move(self, node: cst.CSTNode) -> Optional[tuple]:
        name = in_cuda_module(self.qualnames(node)) or next(
            (q for q in self.qualnames(node) if q.startswith("torch.accelerator.")), None)
        if name is None:
            return None
        table = self.target.cuda_api
        cur = name
        while cur:
            if cur in table:
                return name, table[cur]
            cur = cur.rpartition(".")[0]
        return name, None

    # ------------------------------------------------------------ calls
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "pin_memory" and not original_node.args:
            if not in_cuda_module(self.qualnames(func)) and self.flag(
                    original_node, PIN_MEMORY.code, "`.pin_memory()` removed", fix=True):
                return updated_node.func.value  # type: ignore[attr-defined]
            return updated_node
        found = self._move(func)
        if found is None:
            return updated_node
        name, move = found
        if name.startswith(_SETTINGS):
            return self._setting_call(original_node, updated_node, name)
        if move is None:
            return updated_node  # not in the table: the catch-all (XLA199) reports it
        return self._apply(original_node, updated_node, name, move)

    def _apply(self, original: cst.Call, updated: cst.Call, name: str, move: Move) -> cst.BaseExpression:
        short = name.replace("torch.", "", 1)
        if move.kind == "report":
            self.flag(original, UNSUPPORTED.code, f"`{short}`: {move.why}", fix=False)
            return updated
        code = self._rule_for(name)
        if code == AVAILABLE.code and self._requires_cuda(original):
            self.flag(original, AVAILABLE.code, f"`{short}()` asserts that CUDA exists (for CUDA-only code such "
                      "as apex or bitsandbytes): left as it is; check what it protects", fix=False)
            return updated
        if code == AVAILABLE.code and self._guards_unsupported(original):
            self.flag(original, AVAILABLE.code, f"`{short}()` guards a CUDA API with no XLA counterpart: "
                      "left as it is (False on XLA); convert the guarded code by hand", fix=False)
            return updated
        scope = scope_of(original, self.tree)
        # (the launcher first: a module that spawns its processes at its top
        # level, `world_size = torch.cuda.device_count()` then `mp.spawn(...)`
        # under `if __name__ == "__main__":`, counts them before the launch,
        # not at import time)
        if code == DEVICE_QUERY.code and "xr." in move.code and id(scope) in \
                cuda_facts(self.tree, self.qualnames).launchers:
            self.flag(original, DEVICE_QUERY.code, f"`{short}()` before the processes are launched: the XLA "
                      "runtime must not start here; `torch_xla.launch` picks the process count "
                      "(use `xr.world_size()` inside the launched function)", fix=False)
            return updated
        if code == DEVICE_QUERY.code and "xr." in move.code and isinstance(scope, cst.Module) \
                and not is_script(self.tree, self.qualnames):
            self.flag(original, DEVICE_QUERY.code, f"`{short}()` at import time (a module-level value or a "
                      "decorator): the XLA runtime must not start on import; count devices inside a function "
                      "(`xr.world_size()`)", fix=False)
            return updated
        if move.kind == "drop":
            if not self.flag(original, code, f"`{short}()` removed: {move.why}", fix=True):
                return updated
            return self.drop_call(updated, self.parent(original))
        if not self.flag(original, code, f"`{short}()` -> `{move.code}`", fix=True):
            return updated
        self.add_imports(move.imports)
        if move.kind == "call":
            return updated.with_changes(func=cst.parse_expression(move.code))
        return cst.parse_expression(move.code)

    @staticmethod
    def _rule_for(name: str) -> str:
        last = name.rsplit(".", 1)[-1]
        if last in ("is_available", "is_bf16_supported"):
            return AVAILABLE.code
        if last == "synchronize":
            return SYNCHRONIZE.code
        if last.startswith("manual_seed"):
            return SEED.code
        if last in ("device_count", "current_device", "current_accelerator", "current_device_index", "memory_summary"):
            return DEVICE_QUERY.code
        return NO_OP.code

    def _setting_call(self, original: cst.Call, updated: cst.Call, name: str) -> cst.BaseExpression:
        """``torch.backends.cuda.enable_flash_sdp(True)`` and the like."""
        last = name.rsplit(".", 1)[-1]
        parent = self.parent(original)
        if last.startswith(("enable_", "set_", "allow_")) and isinstance(parent, cst.Expr):
            if self.flag(original, NO_OP.code, f"`{name.replace('torch.', '', 1)}()` removed: "
                         "a CUDA library setting", fix=True):
                self.drop(parent)
            return updated
        self.flag(original, UNSUPPORTED.code, f"`{name.replace('torch.', '', 1)}`: a CUDA library setting with "
                  "no XLA counterpart", fix=False)
        return updated

    def _requires_cuda(self, call: cst.Call) -> bool:
        """``assert torch.cuda.is_available()`` or ``if not ...: raise``: a
        check that CUDA exists for CUDA-only code (apex, bitsandbytes)."""
        for anc in self.ancestors(call):
            if isinstance(anc, cst.Assert):
                return True
            if isinstance(anc, cst.If):
                return bool(find_all(anc.body, cst.Raise, stop=(cst.FunctionDef, cst.ClassDef)))
            if isinstance(anc, (cst.BaseStatement, cst.BaseSmallStatement)):
                return False
        return False

    def _guards_unsupported(self, call: cst.Call) -> bool:
        """The availability test (directly, or through the flag it is
        assigned to) guards a CUDA API that XLA has no counterpart for."""
        guarded: list = []
        flag_name = None
        for anc in self.ancestors(call):
            if isinstance(anc, (cst.If, cst.While)):
                guarded = [anc.body] + ([anc.orelse] if getattr(anc, "orelse", None) is not None else [])
                break
            if isinstance(anc, cst.IfExp):
                guarded = [anc.body, anc.orelse]
                break
            if isinstance(anc, cst.Assign) and len(anc.targets) == 1:
                flag_name = dotted(anc.targets[0].target)
                break
            if isinstance(anc, cst.BaseStatement):
                break
        if flag_name:
            for node in find_all(self.tree.module, (cst.If, cst.IfExp)):
                test = node.test  # type: ignore[attr-defined]
                if any(dotted(n) == flag_name for n in find_all(test, (cst.Name, cst.Attribute))):
                    guarded += [node.body] + ([node.orelse] if node.orelse is not None else [])  # type: ignore[attr-defined]
        for part in guarded:
            for inner in find_all(part, cst.Call):
                found = self._move(inner.func)  # type: ignore[attr-defined]
                if found is not None and (found[1] is None or found[1].kind == "report"):
                    return True
        return False

    # ------------------------------------------------------------ settings assignments
    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if len(original_node.targets) != 1:
            return updated_node
        target = original_node.targets[0].target
        if not isinstance(target, cst.Attribute):
            return updated_node
        q = in_cuda_module(self.qualnames(target))
        if q and q.startswith(_SETTINGS):
            if self.flag(original_node, NO_OP.code, f"`{q.replace('torch.', '', 1)} = ...` removed: "
                         "cuDNN/TF32 settings mean nothing on XLA", fix=True):
                self.drop(original_node)
        return updated_node

    # ------------------------------------------------------------ pin_memory=
    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node.keyword is not None and original_node.keyword.value == "pin_memory":
            if not is_false(original_node.value) and self.flag(
                    original_node, PIN_MEMORY.code, "`pin_memory=` -> False", fix=True):
                return updated_node.with_changes(value=cst.Name("False"))
        return updated_node

    def leave_DictElement(self, original_node: cst.DictElement, updated_node: cst.DictElement) -> cst.DictElement:
        if string_value(original_node.key) == "pin_memory" and not is_false(original_node.value):
            if self.flag(original_node, PIN_MEMORY.code, "`\"pin_memory\": ...` -> False", fix=True):
                return updated_node.with_changes(value=cst.Name("False"))
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        """``if True: pass`` left by the rules above goes entirely."""
        if isinstance(self.parent(original_node), cst.If):
            return updated_node  # an elif: its chain stays as it is
        if (isinstance(updated_node.test, cst.Name) and updated_node.test.value == "True"
                and updated_node.orelse is None and _only_pass(updated_node.body)):
            return self.emptied(updated_node)
        return updated_node


def _only_pass(body: cst.BaseSuite) -> bool:
    stmts = body.body if isinstance(body, cst.IndentedBlock) else [body]
    return all(isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, cst.Pass) for x in s.body)
               for s in stmts)
