"""A run converts a program, and a program with nothing to port stays as it is.

xlaport moves CUDA programs to XLA.  A program with no CUDA or accelerator
code at all (a CPU-only script, a library of pure functions) has nothing to
port: giving it torch_xla imports, step barriers and step closures would
change a program that still runs on the CPU.  So when none of the files of a
run holds such code, every file is left byte for byte as it is and the run
says so in one line.  Converting it anyway is a choice of its own:
``--port-cpu`` (or ``port-cpu = true`` in ``[tool.xlaport]``).  The XLA
rules then apply (barriers, step closures, device loaders), but no device is
chosen for the program: a tensor made on the host, or on
``torch.device("cpu")``, stays there (moving it is the user's decision).

The decision is the run's, not each file's: in a CUDA project a module with
no CUDA of its own (the training loop, handed the device) is still ported.
"""

from __future__ import annotations

import re
from typing import Sequence

from xlaport.runner import FileResult

# code (not a comment) that names CUDA, NCCL, the accelerator API or torch_xla
_ACCELERATOR = re.compile(rb"^[^#\n]*(cuda|cudnn|nccl|torch\.accelerator|torch_xla|xla_device|mark_step)", re.MULTILINE)


def has_accelerator_code(data: bytes) -> bool:
    return _ACCELERATOR.search(data) is not None


def nothing_to_port(results: Sequence[FileResult]) -> bool:
    """No file of the run holds CUDA or accelerator code (and some file was read)."""
    read = [r for r in results if r.original is not None]
    # the rules' own count of CUDA references catches what no word names: an
    # integer device (`model.to(0)` is cuda:0 to torch)
    return bool(read) and not any(has_accelerator_code(r.original) or (r.cuda and r.cuda[0])  # type: ignore[arg-type]
                                  for r in read)


def leave_alone(results: Sequence[FileResult]) -> str:
    """Every file as it was, no findings; the one line that says why."""
    for r in results:
        if r.original is not None:
            r.output = r.original
            r.findings = []
            r.cuda = (0, 0)  # (a file that could not be read or parsed keeps its error)
    n = sum(1 for r in results if r.original is not None)
    return (f"nothing to port: no CUDA or accelerator code in the {n} file(s) seen; left as they are "
            "(`--port-cpu` converts it anyway; its tensors stay on the device it names)")
