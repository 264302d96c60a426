"""How a run ended, in the user's terms: the exception and its first line
(not the last line of a kernel listing), the innermost frame in the user's
files, a fatal error with its cause, and whether the error says the program
needs CUDA."""

from __future__ import annotations

import re
from typing import Callable, Optional, Tuple

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


# a log line of XLA's runtime (glog): "E0000 00:00:1795647580.49 8957 file.cc:54] ..."
LOG_LINE = re.compile(r"^[EWIF]\d{4} \d\d:\d\d:\d\d")
_LOG_SOURCE = re.compile(r"^.*?\.(cc|cpp|h):\d+\]\s*")  # "...execution_engine.cc:54] " before a log message


def _innermost(error: str, own: Callable[[str], bool]) -> Optional[Tuple[str, int]]:
    """The innermost frame in the user's files: the last of a traceback
    (most recent call last), the first of a thread in a fault handler's
    dump (most recent call first: a fatal error, an abort in XLA)."""
    if "(most recent call first)" in error:
        for block in error.split("(most recent call first)")[1:]:
            found = [(p, int(n)) for p, n in _FRAME.findall(block) if own(p)]
            if found:
                return found[0]
        return None
    found = [(p, int(n)) for p, n in _FRAME.findall(error) if own(p)]
    return found[-1] if found else None


def _what_killed(error: str) -> str:
    """The line that says why the run ended: a fatal error with the line
    before it that gave its cause (``LLVM ERROR: Unable to allocate section
    memory!``), else the last line that is not a runtime log line."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return "it crashed"
    fatal = next((k for k, line in enumerate(lines) if line.startswith("Fatal Python error:")), None)
    if fatal is not None:
        cause = next((line for line in reversed(lines[:fatal]) if not LOG_LINE.match(line)
                      and not line.startswith(("WARNING: All log messages", "Current thread", "Thread 0x"))), None)
        if cause:  # (a runtime log line cut in two by another thread's output keeps its message only)
            cause = _LOG_SOURCE.sub("", cause)
        return f"{cause} ({lines[fatal]})" if cause else lines[fatal]
    raised = _raised(error)
    if raised:
        return raised
    told = [line for line in lines if not LOG_LINE.match(line)]
    return told[-1] if told else lines[-1]


def _raised(error: str) -> Optional[str]:
    """``ExceptionType: message`` of the last Python traceback in ``error``
    (its first line: a message may go on for pages, as a dispatcher's list
    of kernels does), or None."""
    if "Traceback (most recent call last):" not in error:
        return None
    block = error.rsplit("Traceback (most recent call last):", 1)[1].splitlines()
    for line in block[1:]:
        if line.strip() and not line[:1].isspace() and not line.startswith("^"):
            return line.strip()[:300]
    return None


# what a program that cannot run without CUDA says when it is run without it
_NEEDS_CUDA = re.compile(r"Found no NVIDIA driver|Torch not compiled with CUDA enabled|no CUDA GPUs are available|"
                         r"CUDA driver initialization failed|ProcessGroupNCCL is only supported with GPUs|"
                         r"Attempting to deserialize object on a CUDA device|NCCL is not available|"
                         r"CUDA is not available|cuda runtime error|requires? (a )?(CUDA|GPU)|"
                         r"(accelerator|GPU) is not available", re.IGNORECASE)


def needs_cuda(error: str) -> Optional[str]:
    """The line of a failed run's error saying it needs CUDA, or None."""
    for line in reversed(error.splitlines()):
        if _NEEDS_CUDA.search(line):
            return line.strip()[:200]
    return None
