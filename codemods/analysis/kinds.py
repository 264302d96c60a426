"""The kinds of value :mod:`codemods.analysis.values` tells apart, and what
it knows of library callables: which calls make an optimizer, an LR
scheduler, a loader, a model, a tensor...  (read through the module's
imports: ``qual`` is a qualified name such as ``torch.optim.AdamW``)."""

from __future__ import annotations

from typing import FrozenSet, List, Optional, Set

import libcst as cst

Kinds = FrozenSet[str]
TENSOR, DEVICE, DEVICE_STR, MODULE = "tensor", "device", "device-string", "module"
OPTIMIZER, SCALER, LR_SCHEDULER, SAMPLER = "optimizer", "scaler", "lr-scheduler", "sampler"
LOADER, DEVICE_LOADER, HOST, OBJECT = "loader", "device-loader", "host", "object"
# a loss, a metric or another module without state of its own (an
# activation, a pooling): calling it makes a tensor, but it is no model
STATELESS = "stateless"
LOADED = "loaded"  # torch.load/pickle.load: a model when it is called, else anything
TENSORS = "tensors"  # a tuple of tensors: what `x.split(1)`, `x.chunk(2)`, `x.unbind()` give
# the ops (methods and torch functions) that give a tuple of tensors, not a tensor
SPLITS = frozenset({"split", "chunk", "unbind", "tensor_split", "hsplit", "vsplit", "dsplit", "split_with_sizes",
                    "unsafe_split", "unsafe_chunk"})
# the methods of a tensor that give no tensor (a number, a list, a size, a flag)
NON_TENSOR_METHODS = frozenset({"item", "tolist", "size", "dim", "numel", "nelement", "ndimension", "type",
                                "data_ptr", "element_size", "is_contiguous", "stride", "get_device", "__len__",
                                "is_floating_point", "is_complex", "is_signed", "is_pinned", "is_shared"})
UNKNOWN = "?"  # some of the values that reach a name could not be told
NONE: Kinds = frozenset()


def definitely_not(kinds: Kinds, kind: str) -> bool:
    """Every value ``kinds`` describes is known, and none is a ``kind``."""
    return bool(kinds) and UNKNOWN not in kinds and kind not in kinds


def union_kinds(*parts: Kinds) -> Kinds:
    """Kinds of a value that is one of ``parts``: an unknown part is kept as
    ``UNKNOWN``."""
    out: Set[str] = set()
    for p in parts:
        out |= p or {UNKNOWN}
    return frozenset(out)


# torch's names that make no tensor (a device, a dtype, a module, a test, a
# context manager): a call of one is not a tensor whatever else it is
NON_TENSOR_TORCH = ("torch.device", "torch.Size", "torch.dtype", "torch.cuda.", "torch.no_grad",
                    "torch.manual_seed", "torch.Generator", "torch.is_tensor", "torch.is_floating_point",
                    "torch.is_complex", "torch.is_storage", "torch.set_", "torch.get_",
                    "torch.utils.", "torch.nn.", "torch.optim.", "torch.save", "torch.load", "torch.backends.",
                    "torch.autocast", "torch.enable_grad", "torch.inference_mode", "torch.distributed.",
                    "torch.compile", "torch.jit.", "torch.amp.", "torch.accelerator.", "torch.xpu.")
_HOST_CLASSES = ("Tokenizer", "Processor", "FeatureExtractor", "Config", "ImageProcessor", "Pipeline")
MODEL_LIBS = ("diffusers.", "transformers.", "timm.", "torchvision.models.", "peft.", "open_clip.")
# ``X.from_pretrained(...)`` of a model class of MODEL_LIBS
PRETRAINED_METHODS = ("from_pretrained", "from_config", "from_single_file")
# callables that give back a model: wrappers (their classes) and factories
MODEL_WRAPPERS = ("torch.nn.parallel.", "torch.distributed.fsdp.")
MODEL_FACTORIES = ("torch.nn.DataParallel", "timm.create_model", "torch.jit.load", "torch.jit.trace",
                   "torch.jit.script", "torch.hub.load", "torch.export.load", "torch.distributed.fsdp.fully_shard",
                   "torch.distributed._composable.fsdp.fully_shard")


def model_source_triggers() -> tuple:
    """Bytes one of which a file must hold to make a model the dataflow
    knows: ``torch.nn`` (``nn.``, ``Module``, ``from torch import``), a model
    library, a ``from_pretrained``, a wrapper or a factory (derived from the
    lists above)."""
    words = ["Module", "nn.", "from torch import", *PRETRAINED_METHODS]
    words += [lib.split(".")[0] for lib in MODEL_LIBS]
    words += [w.rstrip(".").split(".")[-1] for w in MODEL_WRAPPERS] + [q.split(".")[-1] for q in MODEL_FACTORIES]
    return tuple(dict.fromkeys(w.encode() for w in words))


def library_kinds(qual: str, args: List[cst.Arg]) -> Optional[Kinds]:
    """Kinds of a call to the library callable ``qual`` (None: not known)."""
    last = qual.split(".")[-1]
    if qual in ("torch.device", "torch_xla.device", "torch_xla.core.xla_model.xla_device",
                "torch_xla.runtime.xla_device"):
        return frozenset({DEVICE})
    if qual == "torch.optim.swa_utils.AveragedModel":
        return frozenset({MODULE})  # (an nn.Module: calling it runs the average)
    if qual.startswith("torch.optim.lr_scheduler.") or qual in ("transformers.get_scheduler",
                                                                 "diffusers.optimization.get_scheduler",
                                                                 "torch.optim.swa_utils.SWALR"):
        return frozenset({LR_SCHEDULER})
    if qual.startswith("torch.optim.") and last[:1].isupper():
        return frozenset({OPTIMIZER})
    if last == "GradScaler" and qual.startswith("torch."):
        return frozenset({SCALER})
    if qual in ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"):
        return frozenset({LOADER})
    if last in ("MpDeviceLoader", "ParallelLoader") and qual.startswith("torch_xla."):
        return frozenset({DEVICE_LOADER})
    if qual in ("torch.load", "pickle.load", "dill.load", "joblib.load"):
        return frozenset({LOADED})
    if (qual.startswith(MODEL_WRAPPERS) and last[:1].isupper()) or qual in MODEL_FACTORIES:
        return frozenset({MODULE})
    if qual.startswith("torch.nn.") and not qual.startswith(("torch.nn.functional.", "torch.nn.utils.", "torch.nn.init.")):
        if is_stateless_class(last):
            return frozenset({STATELESS})
        return frozenset({MODULE}) if last[:1].isupper() and last != "Parameter" else None
    if qual.startswith(("torchmetrics.", "lpips.", "piq.")) and last[:1].isupper():
        return frozenset({STATELESS})
    if qual.startswith("torchvision.models.") and last[:1].islower():
        return frozenset({MODULE})
    if qual.startswith("diffusers.") and last.endswith("Scheduler"):
        return frozenset({SAMPLER})
    if qual.startswith("torch.") and not qual.startswith(NON_TENSOR_TORCH):
        return frozenset({TENSORS if last in SPLITS else TENSOR})
    return None


_STATELESS_LAYERS = frozenset({
    "ReLU", "ReLU6", "GELU", "SiLU", "Mish", "ELU", "SELU", "CELU", "LeakyReLU", "Sigmoid", "Tanh", "Softmax",
    "LogSoftmax", "Softplus", "Softsign", "Hardtanh", "Hardswish", "Hardsigmoid", "Tanhshrink", "Identity",
    "Flatten", "Unflatten", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Upsample",
    "PixelShuffle", "PixelUnshuffle", "CosineSimilarity", "PairwiseDistance"})


def is_stateless_class(name: str) -> bool:
    """A class named as a loss, a metric or a layer without weights
    (``MSELoss``, ``CrossEntropyLoss``, ``PerceptualLoss``, ``Accuracy``...
    ``MaxPool2d``, ``Dropout``)."""
    return (name.endswith(("Loss", "Criterion", "Metric")) or name in _STATELESS_LAYERS
            or name.startswith(("MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "LPPool")))


def pretrained_kinds(qual: str) -> Optional[Kinds]:
    """``X.from_pretrained(...)`` / ``X.from_config(...)`` of a library class."""
    last = qual.split(".")[-1]
    if not qual.startswith(MODEL_LIBS):
        return None
    if last.endswith("Scheduler"):
        return frozenset({SAMPLER})
    if any(k in last for k in _HOST_CLASSES):
        return frozenset({OBJECT})
    return frozenset({MODULE})
