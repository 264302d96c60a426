"""What a run produced, and how two runs' outputs compare.

Outputs are what is deterministic: every number the script prints and every
file it writes.  A number (or tensor) that differs between two runs of the
*reference* (timings, unseeded randomness) says nothing about the
conversion: it is left out and listed as "varies between runs".  A file that
cannot be compared is listed as not compared, never dropped silently.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from xlaport.verify.comparison import Compared, Comparison, close_numbers as _close
from xlaport.verify.printed import compare_text

TENSOR_FILES = {".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".tar"}
ARRAY_FILES = {".npy", ".npz"}
IMAGE_FILES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
IMAGE_ATOL = 1.0  # one level of 255: a float a hair off rounds to the next level
TEXT_FILES = {".txt", ".json", ".csv", ".log", ".yaml", ".yml", ".md", ".tsv"}
LEFTOVERS = "xlaport-leftovers.pt"  # the tensors a run leaves in its globals (xlaport.verify.observer)
HARNESS_FILES = {".xlaport-result.json", LEFTOVERS}


def output_files(workdir: Path, script_name: str) -> Dict[str, Path]:
    """Every file a run left in its scratch directory, by relative path."""
    found: Dict[str, Path] = {}
    for p in sorted(workdir.rglob("*")):
        rel = p.relative_to(workdir).as_posix()
        if not p.is_file() or rel == script_name or "__pycache__" in p.parts:
            continue
        if rel in HARNESS_FILES and rel != LEFTOVERS:
            continue
        found[rel] = p
    return found


def load_any(path: Path):
    """A saved object with modules replaced by their state dicts.  A whole
    model saved with ``torch.save(model, f)`` pickles its class by the
    program's module name (``model.RNNModel``), which verify does not import:
    such a class loads as a bare ``nn.Module`` of that name, whose state is
    all the comparison reads."""
    import pickle
    import types

    import torch

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):  # type: ignore[no-untyped-def]
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                return type(name, (torch.nn.Module,), {"__module__": module})

    tolerant = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="pickle")
    obj = torch.load(path, map_location="cpu", weights_only=False, pickle_module=tolerant)
    return _unmodule(obj)


def _unmodule(obj):
    import torch

    if isinstance(obj, torch.nn.Module):
        return {k: v for k, v in obj.state_dict().items()}
    if isinstance(obj, dict):
        return {k: _unmodule(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_unmodule(v) for v in obj]
    return obj


def leaves(prefix: str, a, b) -> Iterator[Tuple[str, object, object]]:
    """Pairs of tensors or numbers at the same place in two saved objects."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        yield prefix, *_as_tensors(_dense(a), _dense(b))
    elif isinstance(a, dict) and isinstance(b, dict):
        a, b = _unwrapped(a, b)
        for k in sorted(set(a) | set(b), key=str):
            yield from leaves(f"{prefix}[{k}]", a.get(k), b.get(k))
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from leaves(f"{prefix}[{i}]", x, y)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        yield prefix, a, b


# what a module wrapper puts before each name of its module's state_dict:
# `nn.DataParallel` and `DistributedDataParallel` (`module.`), `torch.compile` (`_orig_mod.`)
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _bare(key: object) -> object:
    while isinstance(key, str) and key.startswith(WRAPPER_PREFIXES):
        key = key.split(".", 1)[1]
    return key


def _unwrapped(a: dict, b: dict) -> Tuple[dict, dict]:
    """Two state dicts of the same module, one taken through a wrapper the
    other run did not make (the reference on the CPU skips the
    `if device == "cuda": net = nn.DataParallel(net)` the conversion takes):
    both keyed by the module's own names.  Any other pair as it is."""
    if set(a) == set(b):
        return a, b
    bare_a, bare_b = {_bare(k): v for k, v in a.items()}, {_bare(k): v for k, v in b.items()}
    if len(bare_a) == len(a) and len(bare_b) == len(b) and set(bare_a) == set(bare_b):
        return bare_a, bare_b
    return a, b


def _as_tensors(a, b):  # type: ignore[no-untyped-def]
    """A one-element tensor and a number (a walk's element read once as a
    number by the conversion, a sum kept on the device): both as tensors of
    the tensor's shape and dtype, so that their values are compared."""
    import torch

    for x, y, flip in ((a, b, False), (b, a, True)):
        if isinstance(x, torch.Tensor) and x.numel() == 1 and isinstance(y, (bool, int, float)):
            made = torch.tensor(y, dtype=x.dtype if x.dtype.is_floating_point or not isinstance(y, float)
                                else torch.float64).reshape(x.shape)
            return (made, x) if flip else (x, made)
    return a, b


def _dense(x):  # type: ignore[no-untyped-def]
    """A sparse tensor (a graph's adjacency) as the dense one it stands for."""
    import torch

    return x.to_dense() if isinstance(x, torch.Tensor) and x.layout != torch.strided else x


def _errors(x, y) -> Tuple[float, float, bool]:
    import torch

    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return abs(x - y), abs(x - y) / max(abs(x), 1e-12), True
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.shape != y.shape:
        return math.inf, math.inf, False
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        x, y = x.long(), y.long()
    x, y = x.double(), y.double()
    diff = (x - y).abs()
    if not diff.numel():
        return 0.0, 0.0, True
    return float(diff.max()), float((diff / x.abs().clamp_min(1e-12)).max()), True


_DIGITS = re.compile(r"\d+")


def _renamed(refs: Sequence[Dict[str, Path]], cand: Dict[str, Path]) -> Set[str]:
    """Files written under another name by each run (a TensorBoard event
    file is named by the time and the process id): the names of the first
    reference run that another did not write, and the conversion's names
    that differ from one of those only in their numbers."""
    unstable = {n for n in refs[0] if any(n not in other for other in refs[1:])}
    shapes = {_DIGITS.sub("#", n) for n in unstable}
    return unstable | {n for n in cand if n not in refs[0] and _DIGITS.sub("#", n) in shapes}


def compare_files(refs: Sequence[Dict[str, Path]], cand: Dict[str, Path], rtol: float, atol: float,
                  out: Comparison, follow: bool = False) -> None:
    renamed = _renamed(refs, cand)
    out.varies += [f"{n} (written under another name by each run)" for n in sorted(renamed) if n in refs[0]]
    names = sorted((set(refs[0]) | set(cand)) - renamed)
    for name in names:
        if name not in refs[0] or name not in cand:
            side = "the reference" if name not in refs[0] else "the conversion"
            out.outputs.append(Compared(f"{name} (not written by {side})", False, math.inf, math.inf))
            continue
        suffix = Path(name).suffix.lower()
        if suffix in TENSOR_FILES | ARRAY_FILES | IMAGE_FILES:
            load = load_image if suffix in IMAGE_FILES else load_arrays if suffix in ARRAY_FILES else load_any
            _compare_saved(name, [r[name] for r in refs if name in r], cand[name], rtol,
                           max(atol, IMAGE_ATOL) if suffix in IMAGE_FILES else atol, out, follow, load)
        elif suffix in TEXT_FILES:
            try:
                texts = [r[name].read_text(errors="replace") for r in refs if name in r]
                compare_text(name, texts, cand[name].read_text(errors="replace"), rtol, atol, out)
            except OSError as exc:
                out.not_compared.append(f"{name}: cannot read ({exc})")
        elif refs[0][name].read_bytes() == cand[name].read_bytes():
            out.outputs.append(Compared(f"{name} (same bytes)", True, 0.0, 0.0))
        else:
            out.not_compared.append(f"{name}: a {suffix or 'binary'} file xlaport cannot read; its bytes differ")


def close(x, y, rtol: float, atol: float) -> bool:  # type: ignore[no-untyped-def]
    """Two tensors agree when their difference is small against the
    reference's own scale, norm-wise: ``||y - x|| <= atol * sqrt(n) + rtol *
    ||x||``.  One element near zero (a zero-initialised bias after a few
    AdamW steps in bf16) may be off by more than ``rtol`` of itself while
    the tensor is right; a dropped step or a sign error in one element of a
    bias moves the whole norm and fails.  NaNs must be NaN on both sides."""
    import torch

    if not x.numel():
        return True
    x, y = x.double(), y.double()
    nan = torch.isnan(x)
    if not torch.equal(nan, torch.isnan(y)):
        return False
    x, y = x[~nan], y[~nan]
    if not torch.equal(torch.isinf(x), torch.isinf(y)) or not torch.equal(x[torch.isinf(x)], y[torch.isinf(y)]):
        return False
    finite = ~torch.isinf(x)
    x, y = x[finite], y[finite]
    bound = atol * x.numel() ** 0.5 + rtol * float(torch.linalg.vector_norm(x))
    return float(torch.linalg.vector_norm(y - x)) <= bound


def load_image(path: Path):  # type: ignore[no-untyped-def]
    """An image file as a float tensor of its pixels (Pillow reads it)."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(path) as img:
        return torch.from_numpy(np.asarray(img).astype("float64"))


def load_arrays(path: Path):  # type: ignore[no-untyped-def]
    """A ``.npy`` array or the arrays of a ``.npz``, as tensors (no pickles)."""
    import numpy as np
    import torch

    data = np.load(path, allow_pickle=False)
    if isinstance(data, np.ndarray):
        return torch.from_numpy(np.asarray(data, dtype="float64") if data.dtype.kind in "biuf" else data)
    with data:
        return {k: torch.from_numpy(np.asarray(data[k], dtype="float64")) for k in data.files
                if data[k].dtype.kind in "biuf"}


def _compare_saved(name: str, refs: List[Path], cand: Path, rtol: float, atol: float, out: Comparison,
                   follow: bool = False, load=None) -> None:  # type: ignore[no-untyped-def]
    import torch

    load = load or load_any
    try:
        loaded = [load(p) for p in refs]
        mine = load(cand)
    except Exception as exc:  # noqa: BLE001 -- anything torch.load raises
        out.not_compared.append(f"{name}: cannot load ({type(exc).__name__}: {str(exc)[:80]})")
        return
    def pairs(a, b):  # type: ignore[no-untyped-def]
        found = leaves(name, a, b)
        if name == LEFTOVERS:  # (a run's global numbers: compared only with a tensor of the other run; a
            # global only the conversion has is a name it added, `d_x_step`: none of the program's outputs)
            found = ((k, x, y) for k, x, y in found if x is not None
                     and (isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor)))
        return found

    varying = set()
    for other in loaded[1:]:
        for key, x, y in pairs(loaded[0], other):
            abs_err, _, same_shape = _errors(x, y)
            if not same_shape or abs_err > 0:
                varying.add(key)
    out.varies += sorted(varying)
    count = 0
    for key, x, y in pairs(loaded[0], mine):
        count += 1
        if key in varying:
            continue
        abs_err, rel_err, same_shape = _errors(x, y)
        if not same_shape:
            out.outputs.append(Compared(key, False, math.inf, math.inf))
            continue
        if isinstance(x, torch.Tensor) and not (x.is_floating_point() or x.is_complex()):
            # tokens, labels, counts: element for element; as many may differ as
            # rtol allows of their number (an argmax flipped by a near tie among
            # thousands), none of a few
            ok = int((x != y.to(x.dtype)).sum()) <= rtol * x.numel()
        elif isinstance(x, torch.Tensor):
            r_tol, a_tol = tensor_tolerance(x, y, rtol, atol, follow)
            ok = close(x, y, r_tol, a_tol)
        else:
            ok = _close(float(x), float(y), rtol, atol)  # type: ignore[arg-type]
        out.outputs.append(Compared(key, ok, abs_err, rel_err))
    if not count and name != LEFTOVERS:
        out.not_compared.append(f"{name}: holds no tensors or numbers to compare")


# torch.testing.assert_close's tolerances by dtype, for a run whose
# tolerance follows the dtypes (no --rtol/--atol given); float32 and wider
# keep verify's defaults, which leave room for XLA's other order of operations
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-5
_BY_DTYPE = {"torch.bfloat16": (1.6e-2, 1e-5), "torch.float16": (1e-3, 1e-5)}


def tensor_tolerance(x, y, rtol: float, atol: float, follow: bool):  # type: ignore[no-untyped-def]
    """(rtol, atol) for one pair of tensors: ``rtol``/``atol`` as given, but
    at least what a low-precision dtype of either needs when the comparison
    follows the dtypes (``follow``: no tolerance was given)."""
    if not follow:
        return rtol, atol
    best = (rtol, atol)
    for t in (x, y):
        r, a = _BY_DTYPE.get(str(getattr(t, "dtype", "")), (0.0, 0.0))
        best = (max(best[0], r), max(best[1], a))
    return best


def tolerance(rtol: Optional[float], atol: Optional[float], autocast: Sequence[str]) -> Tuple[float, float, str]:
    """The tolerance a comparison uses, and why: ``--rtol``/``--atol`` when
    given; else verify's defaults, raised to bf16's (as
    ``torch.testing.assert_close`` picks them) when a side computed under
    bf16 autocast, and per tensor for tensors of a low-precision dtype."""
    if rtol is not None or atol is not None:
        return (rtol if rtol is not None else DEFAULT_RTOL, atol if atol is not None else DEFAULT_ATOL,
                "as given (--rtol/--atol)")
    if any("bfloat16" in a for a in autocast):
        r, a = _BY_DTYPE["torch.bfloat16"]
        return r, a, "bf16 autocast ran: bf16 tolerances (as torch.testing.assert_close chooses them)"
    if any("float16" in a for a in autocast):
        r, a = _BY_DTYPE["torch.float16"]
        return max(r, DEFAULT_RTOL), a, "fp16 autocast ran: fp16 tolerances"
    return DEFAULT_RTOL, DEFAULT_ATOL, "float32 defaults (bf16/fp16 tensors: their dtype's tolerance)"


def compare(ref_stdouts: Sequence[str], ref_files: Sequence[Dict[str, Path]], cand_stdout: str,
            cand_files: Dict[str, Path], rtol: float, atol: float, follow: bool = False) -> Comparison:
    """Stdout and every file, at ``rtol``/``atol``; ``follow``: tensors of a
    low-precision dtype at (at least) their dtype's tolerance."""
    out = Comparison()
    compare_text("stdout", ref_stdouts, cand_stdout, rtol, atol, out)
    compare_files(ref_files, cand_files, rtol, atol, out, follow)
    return out


# How far beyond the original's own float-order noise a conversion may be: a
# run on another backend sums in another order, and training (Adam, a GAN)
# amplifies that; a wrong port (an untied weight, a missed step) is off by far
# more than ten times what another thread count moves the original.
FLOAT_ORDER_FACTOR = 10.0


def within_float_order(compared: Comparison, spread: Dict[str, float], how: str,
                       factor: float = FLOAT_ORDER_FACTOR) -> None:
    """Accept the outputs that failed by no more than ``factor`` times what
    they moved between two runs of the original that differ only in the
    order of float operations (``spread``: output name -> max abs change;
    ``how``: what differed), and say so in ``compared.float_order``."""
    for i, o in enumerate(compared.outputs):
        moved = spread.get(o.name, 0.0)
        if o.ok or not moved or not math.isfinite(o.max_abs_err) or o.max_abs_err > factor * moved:
            continue
        compared.outputs[i] = Compared(o.name, True, o.max_abs_err, o.max_rel_err)
        compared.float_order.append(f"{o.name}: off by {o.max_abs_err:.3g}; the original moved by {moved:.3g} "
                                    f"{how}")
