"""In a diagnostic run: random numbers drawn for an accelerator (XLA's
device on the candidate side, CUDA where the reference ran on a GPU) come
from the CPU generator, in program order, and move to the device.

The reference runs on the CPU and draws every random number from the CPU
generator; a correct port run on XLA draws the ones made on the device from
XLA's own generator, so the two disagree value for value on every program
with dropout, ``randn_like`` or noise made on the device.  Routed here, the
candidate draws the same numbers in the same order, so a correct port
agrees exactly.  What cannot be routed (random ops inside compiled code or
inside torch's C++ kernels) still runs on XLA's generator: the parent finds
those ops in the dumped graphs and lists them as "random, not compared".

A reference that ran on CUDA drew its device numbers from CUDA's generator:
it is compared, where the conversion drew on its device, through a run of
its own with its CUDA draws routed the same way (recorded beside the
reference by ``--record``), so the two sides draw the same numbers.

``--device-rng`` turns this off, to see the real program.
"""

from __future__ import annotations

from typing import Callable, Dict, List

_FACTORIES = ("randn", "rand", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson")
_LIKES = ("randn_like", "rand_like", "randint_like")
_METHODS = ("normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_", "log_normal_",
            "cauchy_")
_ACCELERATORS = ("xla", "cuda")
_DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d")  # multiplicative masks (not alpha dropout)


def install(counts: Dict[str, int]) -> None:
    """Route the random ops of torch; ``counts`` tallies the routed calls by op."""
    import torch
    import torch.nn.functional as F

    def on_device(value) -> bool:  # type: ignore[no-untyped-def]
        """On an accelerator: XLA's device, or CUDA's (an int device is a CUDA ordinal)."""
        if isinstance(value, torch.Tensor):
            return value.device.type in _ACCELERATORS
        if isinstance(value, (str, torch.device, int)) and not isinstance(value, bool):
            try:
                return torch.device(value).type in _ACCELERATORS
            except (RuntimeError, TypeError):
                return False
        return False

    def count(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    def factory(name: str, real: Callable) -> Callable:
        def routed(*args, **kwargs):  # type: ignore[no-untyped-def]
            device = kwargs.get("device")
            sources = [a for a in args if isinstance(a, torch.Tensor)]
            if (device is not None and on_device(device)) or (device is None and any(on_device(a) for a in sources)):
                count(name)
                target = device if device is not None else sources[0].device
                cpu_args = [a.to("cpu") if isinstance(a, torch.Tensor) else a for a in args]  # (not .cpu(): no user read)
                return real(*cpu_args, **{**kwargs, "device": "cpu"} if "device" in kwargs else kwargs).to(target)
            return real(*args, **kwargs)

        return routed

    def like(name: str, real: Callable) -> Callable:
        def routed(x, *args, **kwargs):  # type: ignore[no-untyped-def]
            device = kwargs.get("device", getattr(x, "device", None))
            if device is not None and on_device(device):
                count(name)
                shaped = torch.empty(x.shape, dtype=kwargs.pop("dtype", x.dtype), device="cpu")
                kwargs.pop("device", None)
                return real(shaped, *args, **kwargs).to(device)
            return real(x, *args, **kwargs)

        return routed

    def method(name: str, real: Callable) -> Callable:
        def routed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if on_device(self):
                count(name)
                drawn = real(torch.empty(self.shape, dtype=self.dtype, device="cpu"), *args, **kwargs)
                with torch.no_grad():
                    self.copy_(drawn.to(self.device))
                return self
            return real(self, *args, **kwargs)

        return routed

    def dropout(name: str, real: Callable) -> Callable:
        def routed(x, p=0.5, training=True, inplace=False, *args, **kwargs):  # type: ignore[no-untyped-def]
            if training and p > 0 and on_device(x):
                count(name)
                # the CPU's own mask for this shape: drawn exactly as the reference draws it
                scale = real(torch.ones(x.shape, dtype=x.dtype, device="cpu"), p, True, False, *args, **kwargs)
                out = x * scale.to(x.device)
                return x.copy_(out) if inplace else out
            return real(x, p, training, inplace, *args, **kwargs)

        return routed

    for name in _FACTORIES:
        if hasattr(torch, name):
            setattr(torch, name, factory(name, getattr(torch, name)))
    for name in _LIKES:
        if hasattr(torch, name):
            setattr(torch, name, like(name, getattr(torch, name)))
    for name in _METHODS:
        if hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, method(name, getattr(torch.Tensor, name)))
    for name in _DROPOUTS:
        if hasattr(F, name):
            setattr(F, name, dropout(name, getattr(F, name)))


RANDOM_OPS = ("uniform", "normal", "bernoulli", "rng_uniform", "rng_normal", "rng_bit_generator", "random",
              "exponential", "multinomial", "randperm", "dropout")


def unrouted(ir_lines: List[str]) -> List[str]:
    """Random ops that ran on XLA's own generator, from dumped graph IR."""
    return [line for line in ir_lines if any(f" aten::{op}" in line or f" xla::{op}" in line for op in RANDOM_OPS)]
