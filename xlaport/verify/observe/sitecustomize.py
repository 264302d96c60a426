"""Loaded at start-up by every Python process of a ``verify`` run (verify puts
this folder first on the program's ``PYTHONPATH``; ``site`` imports it).

It imports nothing into the program: it asks :mod:`xlaport.verify.observer`
to watch (seeds, what the run left behind, torch_xla's counters if the
program imported torch_xla itself), then hands over to the next
``sitecustomize`` on the path, if the user has one.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _observe():
    if os.environ.get("XLAPORT_OBSERVE"):
        from xlaport.verify import observer

        observer.start(os.environ["XLAPORT_OBSERVE"])


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.dirname(os.path.abspath(spec.origin or "")) == here:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_observe()
_chain()
