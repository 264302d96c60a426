"""What takes a step, by name: the one definition both readers of a module
use -- :mod:`codemods.analysis.loops` on the LibCST tree, with the dataflow
to tell an optimizer's ``step`` from an LR scheduler's, and the cheap ``ast``
pre-check :mod:`codemods.analysis.prefilter`, which must find a superset of
it, and the trigger bytes of the rules that need a step loop (derived here,
so none of them can drift from the others).  No LibCST here."""

from __future__ import annotations

import re
from typing import Callable, Iterable, Set, TypeVar

T = TypeVar("T")

# calls that take a training or sampling step (``loss.backward()``,
# ``optimizer.step()``, ``xm.optimizer_step(opt)``, ``scheduler.step(x, t)``)
STEP_CALLS = frozenset({"backward", "step", "optimizer_step"})
# a scaler object called with the optimizer takes the whole step: timm's
# ``NativeScaler`` (``loss_scaler(loss, optimizer, clip_grad=...)`` runs the
# backward, a clip and the optimizer's step), and the copies of it in DeiT,
# MAE, BEiT, ConvNeXt.  By the callee's last name: the reading the dataflow
# falls back on (``loops.is_step_call`` also wants the optimizer handed in)
# and the one the pre-check accepts
SCALER_CALL_RE = re.compile(r"scaler$", re.IGNORECASE)


def takes_step_by_name(name: str, steps: Iterable[str] = STEP_CALLS) -> bool:
    """A call whose callee's last name is ``name`` may take a step: a step
    call's name (or one of ``steps``, the step functions a reader knows), or a
    scaler's (:data:`SCALER_CALL_RE`)."""
    return name in steps or bool(SCALER_CALL_RE.search(name))

# What a call that runs a model (and so carries state from one iteration to
# the next) is called: names containing one of MODEL_WORDS ("step" and
# "sampl" only as words: see MODEL_CALL_RE), names that are one of
# MODEL_NAMES, names that begin or end with "net".
MODEL_WORDS = ("step", "sampl", "denois", "model", "unet", "forward", "generate", "predict")
MODEL_NAMES = ("policy", "actor", "critic")
_REFINED = {  # the exact reading: `step` as a word, samplers but not up/down-samplers
    "step": r"(?:^|_)step(?:$|_)",
    "sampl": r"(?<!up)(?<!down)(?<!sub_)(?<!sub)(?<!re)sampl(?:ing|er|e)(?!s)",
    "policy": "policy",
}
_STEP_WORDS = sorted(STEP_CALLS - {"optimizer_step"})  # ("step" is in "optimizer_step")
_NAMES = ["^net", "net$", *(_REFINED.get(n, f"^{n}$") for n in MODEL_NAMES)]
# the one reading: the dataflow's fallback (codemods.analysis.state) and the
# ``ast`` pre-check both use it, so the pre-check accepts every name it does
MODEL_CALL_RE = re.compile("(" + "|".join([*(_REFINED.get(w, w) for w in MODEL_WORDS), *_NAMES]) + ")",
                           re.IGNORECASE)


# calls that fetch, wrap or unwrap a model rather than run it (``m = unwrap_model(m)``)
_NOT_RUN_RE = re.compile(
    r"^_*(unwrap|wrap|get|load|build|make|create|prepare|init|setup|save|copy|compile|convert|register|to)_",
    re.IGNORECASE,
)
# methods that copy a tensor to the host (``analysis.placement.host_read``
# reads them with ``.item()``, ``float(t)`` and ``.to("cpu")``)
TO_HOST = frozenset({"cpu", "numpy", "tolist"})
# what reads a tensor's value on the host by the called name alone, as the
# ``ast`` pre-check sees it (a superset: it cannot tell tensors)
SCALAR_READS = frozenset({"float", "int", "bool"})  # `float(t)`: a Python number of a tensor
READ_CALLS = TO_HOST | SCALAR_READS | {"item", "to"}
# draws of one number from the host's generators (numpy's without a size, or with one argument): a
# choice made with one (``recompiles``, XLA409) or a slice taken at one (``analysis.random_slices``,
# XLA424) is another graph for every value drawn
HOST_DRAWS = frozenset({"random.random", "random.uniform", "random.randint", "random.randrange", "random.gauss",
                        "random.betavariate", "numpy.random.random", "numpy.random.rand",
                        "numpy.random.uniform", "numpy.random.randint", "numpy.random.random_sample",
                        "numpy.random.normal"})
# what draws fresh random numbers on the device: torch's functions (``torch.randn_like(x)``) and the
# in-place fills (``x.normal_()``) -- a loop of a model's forward that draws every pass and feeds its
# state back is a sampler (``analysis.prefilter_steps.draws_every_pass``, ``barriers.StepBarrier``)
RANDOM_DRAWS = frozenset({"randn", "randn_like", "rand", "rand_like", "randint", "randint_like", "normal",
                          "multinomial", "bernoulli", "poisson"})
RANDOM_FILLS = frozenset({"normal_", "uniform_", "bernoulli_", "exponential_", "random_", "geometric_",
                          "log_normal_", "cauchy_"})
# methods that add to the container they are called on (``xs.append(x)``):
# a write of the container by the value handed in, as ``xs += [x]`` is --
# state a loop carries when it reads ``xs[-1]`` before (ddim's samplers)
APPEND_METHODS = frozenset({"append", "extend", "insert", "appendleft"})
# methods of containers and strings, whatever the receiver is called
_CONTAINER_METHODS = frozenset({"pop", "get", "setdefault", "items", "keys", "values", "copy", "update", "append",
                                "extend", "index", "count", "join", "format", "split", "strip", "replace"})


def called_like_a_model(callee: str) -> bool:
    """Whether a call of the dotted ``callee`` (``self.unet``, ``p_sample``;
    ``""`` where the callee is no plain chain of names) runs a model or a
    sampler step by its name alone -- the reading where the dataflow has no
    answer (``state._is_model_call``), and so the one the ``ast``
    pre-check accepts: the last name matches :data:`MODEL_CALL_RE` and does
    not fetch or build a model (``get_model_file``, ``load_model``), a class
    (``UNet2DModel(...)``), a container's method, nor draw from a
    distribution (``posterior.latent_dist.sample()``)."""
    last = callee.rpartition(".")[2]
    if last[:1].isupper():
        return False  # building a module (`SamFeedForward(...)`) is not running one
    if last == "sample" and "." in callee and not callee.startswith("self."):
        return False  # `posterior.latent_dist.sample(generator)`: a draw from a distribution
    return bool(MODEL_CALL_RE.search(last)) and not (_NOT_RUN_RE.search(last) or last in _CONTAINER_METHODS)


# what a data loader is called, where the dataflow cannot tell
LOADER_NAME_RE = re.compile(r"(loader$|dataloader|(^|_)dl$)", re.IGNORECASE)


def trigger_words() -> tuple:
    """Bytes one of which a file must hold to have a step loop by name: the
    step calls, a scaler's name and every model-call word (matched case-sensitively, so each
    in the spellings code uses)."""
    words = [*_STEP_WORDS, "scaler", *MODEL_WORDS, "net", *MODEL_NAMES]
    return tuple(dict.fromkeys(v.encode() for w in words for v in (w, w.capitalize(), w.upper())))


def callers_closure(direct: Iterable[T], callers: Callable[[T], Iterable[T]]) -> Set[T]:
    """``direct`` and every function that calls one of them, to any depth
    (``run_step`` -> ``self.forward_backward()`` -> ``loss.backward()``).
    ``callers(f)``: the functions whose own body calls ``f`` (how a reader
    knows: by name in the ``ast`` pre-check, through the scopes on the
    LibCST tree).  Each function is asked once, so recursion and call cycles
    end."""
    found = set(direct)
    todo = list(found)
    while todo:
        for caller in callers(todo.pop()):
            if caller not in found:
                found.add(caller)
                todo.append(caller)
    return found
