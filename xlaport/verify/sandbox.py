"""In the program's processes (started by the observer): keep a side inside its own tree, and say what it imported.

Large files of the project reach a side's tree as links to the user's files.
Writing through such a link would write the user's file, so a write opened
on one (``open``, ``io.open``, ``os.open``, ``torch.save``) first replaces
the link with a copy of its own -- a copy on write, for Python code.
At the end, :func:`imported` lists the project modules the program imported
and from which tree each came.
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import sys
from typing import Dict, List


def _materialize(path, tree: str) -> None:  # type: ignore[no-untyped-def]
    """A link in ``tree`` that points outside it becomes a copy of its own."""
    try:
        p = os.fspath(path)
    except TypeError:
        return
    if not isinstance(p, str) or not os.path.islink(p):
        return
    full = os.path.abspath(p)
    if not full.startswith(tree + os.sep) or os.path.realpath(full).startswith(tree + os.sep):
        return
    target = os.path.realpath(full)
    tmp = full + ".xlaport-copy"
    shutil.copy2(target, tmp) if os.path.isfile(target) else open(tmp, "wb").close()
    os.replace(tmp, full)


def _writes(mode) -> bool:  # type: ignore[no-untyped-def]
    return isinstance(mode, str) and any(c in mode for c in "wax+")


def protect(tree: str) -> None:
    """Copy on write for links of ``tree`` into the user's tree."""
    tree = os.path.abspath(tree)
    real_open, real_os_open = builtins.open, os.open

    def guarded_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if _writes(mode):
            _materialize(file, tree)
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC):
            _materialize(path, tree)
        return real_os_open(path, flags, *args, **kwargs)

    builtins.open = guarded_open
    io.open = guarded_open
    os.open = guarded_os_open


def protect_save(tree: str, torch) -> None:  # type: ignore[no-untyped-def]
    """The same for ``torch.save``, which opens its file in C++."""
    tree = os.path.abspath(tree)
    real_save = torch.save

    def save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        _materialize(f, tree)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save


def imported(trees: Dict[str, str]) -> Dict[str, List[str]]:
    """``{label: [module, ...]}``: the modules loaded from each named tree."""
    found: Dict[str, List[str]] = {label: [] for label in trees}
    roots = {label: os.path.realpath(t) + os.sep for label, t in trees.items() if t}
    ours = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # xlaport's own (its observer)
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not os.path.isabs(path):
            continue  # built in, or a lazy stand-in (torch.ops)
        real = os.path.realpath(path)
        if f"{os.sep}site-packages{os.sep}" in real or f"{os.sep}dist-packages{os.sep}" in real \
                or real.startswith(ours) or name == "xlaport" or name.startswith("xlaport.") \
                or real.endswith(os.path.join("xlaport", "verify", "observe", "sitecustomize.py")):
            continue  # (xlaport itself, also where the project is a checkout of xlaport)  # installed packages (a virtual environment inside the project too)
        for label, root in roots.items():
            if real.startswith(root):
                found[label].append(name)
                break
    return {label: sorted(names) for label, names in found.items()}
