"""XLA151-XLA156: torch calls the XLA runtime does not do the way CUDA does.

None of these is CUDA-specific, yet each breaks or silently changes a
program once it runs on XLA (seen on real programs, see
``shared/reference/torch_xla.md``):

* XLA151 ``torch.inference_mode()`` -> ``torch.no_grad()`` (inference
  tensors cannot take XLA's version counter);
* XLA152 ``torch.optim.X(..., fused=True)`` -> ``fused=False`` (fused kernels
  exist for CUDA and the CPU, not for XLA tensors);
* XLA153 ``torch.set_float32_matmul_precision(level)`` -> the target's
  precision setting, level for level;
* XLA154 ``nn.DataParallel`` is reported: it does nothing on XLA;
* XLA155 ``logging.basicConfig(...)`` gets ``force=True`` where the program
  imports torch_xla, whose import configures logging first;
* XLA156 ``torch.manual_seed(s)`` is followed by the target's seed: the XLA
  generator is seeded apart.

What each becomes is the target's (``codemods/target.py``).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import libcst as cst

from codemods.syntax import imports
from codemods.base import Rule, XlaCodemod, dotted, statement, string_value
from codemods.syntax.nodes import keyword_arg, with_arg

INFERENCE_MODE = Rule(
    code="XLA151",
    name="inference-mode",
    summary="`torch.inference_mode()` -> `torch.no_grad()` (inference tensors fail on XLA)",
    why=(
        "Under `torch.inference_mode()` XLA computations raise \"Cannot set version_counter for inference "
        "tensor\". `torch.no_grad()` turns autograd off the same way for the program, and works on XLA."
    ),
    before="import torch\n\n@torch.inference_mode()\ndef sample(model, x):\n    with torch.inference_mode():\n"
           "        return model(x)\n",
    after="import torch\n\n@torch.no_grad()\ndef sample(model, x):\n    with torch.no_grad():\n"
          "        return model(x)\n",
    valid=("import torch\n\nwith torch.no_grad():\n    y = model(x)\n",),
)

FUSED = Rule(
    code="XLA152",
    name="fused-optimizer",
    summary="`torch.optim.X(..., fused=True)` -> `fused=False` (no fused kernels for XLA tensors)",
    why=(
        "Fused optimizer kernels exist for CUDA, the CPU and a few other devices; with XLA parameters "
        "`AdamW(..., fused=True)` raises. The unfused optimizer computes the same update, and XLA fuses "
        "the step's graph itself."
    ),
    before="import torch\n\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=use_fused)\n",
    after="import torch\n\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=False)\n",
    valid=("import torch\n\nopt = torch.optim.AdamW(model.parameters(), fused=False)\n",),
)

MATMUL_PRECISION = Rule(
    code="XLA153",
    name="matmul-precision",
    summary="`torch.set_float32_matmul_precision(level)` -> `torch_xla.backends.set_mat_mul_precision(level)`",
    why=(
        "On XLA the precision of float32 matrix products is torch_xla's setting: \"highest\" and \"high\" "
        "keep their meaning (full float32; about three bf16 passes), torch's \"medium\" (bf16) is XLA's "
        "\"default\". A level that is not a literal is reported."
    ),
    before="import torch\n\ntorch.set_float32_matmul_precision(\"high\")\n",
    after="import torch\nimport torch_xla.backends\n\ntorch_xla.backends.set_mat_mul_precision(\"high\")\n",
)

DATA_PARALLEL = Rule(
    code="XLA154",
    name="data-parallel",
    summary="`nn.DataParallel` does nothing on XLA (reported)",
    why=(
        "DataParallel splits a batch over the GPUs of one process. Without CUDA it passes calls through "
        "to the module, so the program runs, on one device. On XLA each device has its own process: "
        "`torch_xla.launch` with `DistributedDataParallel` (or SPMD) spreads the work."
    ),
    before="import torch\n\nmodel = torch.nn.DataParallel(model)\n",
    after=None,
)

LOGGING = Rule(
    code="XLA155",
    name="logging-basic-config",
    summary="`logging.basicConfig(...)` gets `force=True` in torch programs: importing torch_xla configures logging first",
    why=(
        "`import torch_xla` calls `logging.basicConfig()`, so the program's own call finds the root logger "
        "configured and does nothing: its level, format and log file are lost. `force=True` replaces the "
        "handlers torch_xla added, so the program logs as it did. Done in every module that imports torch "
        "(once converted, the program imports torch_xla, whichever module does it first)."
    ),
    before="import logging\nimport torch\n\nlogging.basicConfig(level=logging.INFO)\n",
    after="import logging\nimport torch\n\nlogging.basicConfig(level=logging.INFO, force=True)\n",
    valid=("import logging\n\nlogging.basicConfig(level=logging.INFO)\n",),
)

SEED = Rule(
    code="XLA156",
    name="xla-seed",
    summary="`torch.manual_seed(s)` is followed by `torch_xla.manual_seed(s)`: XLA's generator is apart",
    why=(
        "`torch.manual_seed` seeds the CPU (and CUDA) generators, not the XLA device's: after conversion "
        "`--seed` would no longer change the numbers drawn on the device (`torch.randn(..., device=...)`, "
        "dropout). The XLA generator is seeded beside it with the same value."
    ),
    before="import torch\n\ntorch.manual_seed(args.seed)\n",
    after="import torch\nimport torch_xla\n\ntorch.manual_seed(args.seed)\ntorch_xla.manual_seed(args.seed)\n",
    valid=("import torch\nimport torch_xla\n\ntorch.manual_seed(0)\ntorch_xla.manual_seed(0)\n",),
)

_OPTIMIZERS = "torch.optim."
_XLA_SEEDS = {"torch_xla.manual_seed", "torch_xla.core.xla_model.set_rng_state"}


class XlaRuntime(XlaCodemod):
    DESCRIPTION = "Adapt torch calls the XLA runtime does not do as CUDA does (inference mode, fused, seeds, logging)."
    RESPECTS_HAND_PORTS = True
    RULES = (INFERENCE_MODE, FUSED, MATMUL_PRECISION, DATA_PARALLEL, LOGGING, SEED)
    TRIGGERS = (b"inference_mode", b"fused", b"set_float32_matmul_precision", b"DataParallel", b"basicConfig",
                b"manual_seed")
    NEEDS = ("name:inference_mode", "name:fused", "name:set_float32_matmul_precision", "name:DataParallel",
             "name:basicConfig", "name:manual_seed")

    def regions(self, tree):
        names = ("inference_mode", "fused", "set_float32_matmul_precision", "DataParallel", "basicConfig",
                 "manual_seed")
        return tree.statements_where(lambda n: n.value in names, (cst.Name,))

    # ------------------------------------------------------------ calls
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        q = self.qualnames(original_node.func)
        if "torch.inference_mode" in q or "torch.autograd.grad_mode.inference_mode" in q:
            return self._no_grad(original_node, updated_node)
        if any(n.startswith(_OPTIMIZERS) for n in q) and self.target.no_fused_optimizers:
            return self._unfused(original_node, updated_node)
        if "torch.set_float32_matmul_precision" in q and self.target.matmul_precision:
            return self._precision(original_node, updated_node)
        if q & {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"}:
            self.flag(original_node, DATA_PARALLEL.code, "`DataParallel` does nothing on XLA: one process per "
                      "device (`torch_xla.launch` + `DistributedDataParallel`) spreads the work", fix=False)
        if "logging.basicConfig" in q and self.target.configures_logging and self._imports_xla():
            return self._forced(original_node, updated_node)
        return updated_node

    def _no_grad(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not self.target.no_inference_mode:
            return updated
        mode = original.args[0].value if original.args else None
        if mode is not None and not (isinstance(mode, cst.Name) and mode.value == "True"):
            self.flag(original, INFERENCE_MODE.code, "`torch.inference_mode(...)` fails on XLA: use "
                      "`torch.no_grad()` (or `torch.set_grad_enabled`) for this mode", fix=False)
            return updated
        if not self.flag(original, INFERENCE_MODE.code, "`torch.inference_mode()` -> `torch.no_grad()`", fix=True):
            return updated
        return updated.with_changes(func=self._torch("no_grad", updated.func), args=())

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator) -> cst.Decorator:
        """``@torch.inference_mode`` without a call."""
        dec = original_node.decorator
        if isinstance(dec, (cst.Name, cst.Attribute)) and self.target.no_inference_mode \
                and "torch.inference_mode" in self.qualnames(dec):
            if self.flag(original_node, INFERENCE_MODE.code, "`@torch.inference_mode` -> `@torch.no_grad()`",
                         fix=True):
                return updated_node.with_changes(decorator=cst.Call(func=self._torch("no_grad", dec)))
        return updated_node

    def _torch(self, name: str, like: cst.BaseExpression) -> cst.BaseExpression:
        """``torch.<name>`` spelled as ``like`` spells its module (``torch.x``,
        ``T.x``); ``torch.<name>`` with an import where ``like`` is a bare name."""
        if isinstance(like, cst.Attribute):
            return like.with_changes(attr=cst.Name(name))
        imports.need(self.context, "torch")
        return cst.parse_expression(f"torch.{name}")

    def _unfused(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        args = list(updated.args)
        for k, a in enumerate(original.args):
            if a.keyword is not None and a.keyword.value == "fused" and not (
                    isinstance(a.value, cst.Name) and a.value.value in ("False", "None")):
                if self.flag(a, FUSED.code, "`fused=` -> `fused=False`: no fused kernels for XLA tensors", fix=True):
                    args[k] = args[k].with_changes(value=cst.Name("False"))
                    return updated.with_changes(args=args)
        return updated

    def _precision(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        level = string_value(original.args[0].value) if original.args else None
        mapped = self.target.matmul_levels.get(level or "")
        if mapped is None:
            self.flag(original, MATMUL_PRECISION.code, "float32 matmul precision: on XLA it is "
                      f"`{self.target.matmul_precision}(\"default\"|\"high\"|\"highest\")`", fix=False)
            return updated
        if not self.flag(original, MATMUL_PRECISION.code, f"`set_float32_matmul_precision(\"{level}\")` -> "
                         f"`{self.target.matmul_precision}(\"{mapped}\")`", fix=True):
            return updated
        self.add_imports(self.target.matmul_precision_imports)
        return cst.Call(func=cst.parse_expression(self.target.matmul_precision),  # type: ignore[arg-type]
                        args=[cst.Arg(cst.SimpleString(f'"{mapped}"'))])

    def _imports_xla(self) -> bool:
        """The module is part of a torch program (which imports torch_xla once
        converted): it imports torch or torch_xla, or an earlier rule asked
        for torch_xla."""
        if any(full.split(".")[0] in ("torch", "torch_xla") for full in self.tree.imports.values()):
            return True
        needed = self.context.scratch.get(imports.NEEDED_KEY) or ()
        return any(module.split(".")[0] == "torch_xla" for module, _, _ in needed)  # type: ignore[misc]

    def _forced(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if any(a.keyword is not None and a.keyword.value == "force" for a in original.args) or any(
                a.star == "**" for a in original.args):
            return updated
        if not self.flag(original, LOGGING.code, "`logging.basicConfig(...)` gets `force=True` (importing "
                         "torch_xla configured logging already)", fix=True):
            return updated
        return with_arg(updated, keyword_arg("force", cst.Name("True")))

    # ------------------------------------------------------------ seeds
    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        body = self._seeded(original_node.body, updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._seeded(original_node.body, updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def _seeded(self, old: Sequence[cst.BaseStatement], new: Sequence[cst.BaseStatement]) -> Optional[List]:
        """``new`` with the target's seed after each ``torch.manual_seed(s)``
        statement, unless the block seeds the XLA generator already."""
        if self.target.seed is None or not any(self._seed_of(s) is not None for s in old):
            return None
        if any(self._seeds_xla(s) for s in old):
            return None
        out: List[cst.BaseStatement] = []
        changed = False
        for before, after in zip(old, new):
            out.append(after)
            value = self._seed_of(before)
            if value is not None and self.flag(before, SEED.code, f"`{self.target.seed}(...)` added: "
                                               "`torch.manual_seed` does not seed the XLA generator", fix=True):
                self.add_imports(self.target.seed_imports)
                out.append(statement(cst.Call(func=cst.parse_expression(self.target.seed),  # type: ignore[arg-type]
                                              args=[cst.Arg(value.deep_clone())])))
                changed = True
        return out if changed else None

    def _seed_of(self, stmt: cst.CSTNode) -> Optional[cst.BaseExpression]:
        """The seed of a ``torch.manual_seed(s)`` statement (also ``g = ...``)."""
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        small = stmt.body[0]
        call = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
        if isinstance(call, cst.Call) and len(call.args) == 1 and call.args[0].keyword is None \
                and "torch.manual_seed" in self.qualnames(call.func):
            return call.args[0].value
        return None

    def _seeds_xla(self, stmt: cst.CSTNode) -> bool:
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        for small in stmt.body:
            call = small.value if isinstance(small, cst.Expr) else None
            if isinstance(call, cst.Call):
                q = self.qualnames(call.func) | {dotted(call.func) or ""}  # (XLA113's seed is not imported yet)
                if q & (_XLA_SEEDS | {self.target.seed, "xm.set_rng_state"}) or any(
                        n.startswith("torch.cuda.manual_seed") for n in q):
                    return True  # (a CUDA seed becomes the XLA seed: XLA113)
        return False
