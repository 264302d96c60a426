"""What Python's own ``ast`` can tell cheaply about a file, before LibCST.

A LibCST parse costs about ten ``ast`` parses, and most files of a real
package contain the trigger words of the loop rules (``step``, ``model``,
``if ``) without a single loop those rules could touch.  This module answers,
from one ``ast`` walk, which of the facts the loop codemods need can hold:

* ``step_loop``  -- a ``for``/``while`` whose body calls something named like
  a step, a model or a sampler (``backward``, ``*step*``, ``*model*``,
  ``unet``, ``*sampl*``, ``forward``, ``generate``, ``predict``, ``denois``),
  calls ``self(...)``, or calls a function of the file that calls
  ``backward``/``step``/``optimizer_step``;
* ``loader_loop`` -- a ``for`` over something named like a loader, or any
  ``for`` in a file that mentions ``DataLoader``;
* ``step_method`` -- a class method named ``step`` or ``*_step``.

Each is a superset of what ``codemods.analysis.loops.ModuleFacts`` finds on
the LibCST tree (same names, looser tests), so a codemod whose ``NEEDS`` are
all absent cannot find anything and the file is not parsed for it.  The test
suite compares findings with and without this filter on real packages.
No LibCST here.
"""

from __future__ import annotations

import ast
import re
from typing import FrozenSet, List, Optional, Set, Tuple

# looser than loops._FEEDBACK_CALL_RE / is_step_call: every name they accept matches
_STEPLIKE_RE = re.compile(r"backward|step|sampl|denois|model|unet|forward|generate|predict", re.IGNORECASE)
_TAKES_STEP = frozenset({"backward", "step", "optimizer_step"})
_LOADER_RE = re.compile(r"(loader$|dataloader|(^|_)dl$)", re.IGNORECASE)  # == loops.LOADER_NAME_RE
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)

STEP_LOOP = "step_loop"
LOADER_LOOP = "loader_loop"
STEP_METHOD = "step_method"


def _last_name(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def file_facts(source: bytes) -> Optional[FrozenSet[str]]:
    """The facts that can hold for ``source``; None when ``ast`` cannot read
    it (then nothing is filtered and LibCST reports the problem)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    facts: Set[str] = set()
    loop_calls: Set[str] = set()  # names called anywhere inside a loop
    step_functions: Set[str] = set()
    any_loader = b"DataLoader" in source
    # (node, inside a loop?, enclosing function names)
    stack: List[Tuple[ast.AST, bool, Tuple[str, ...]]] = [(tree, False, ())]
    while stack:
        node, in_loop, funcs = stack.pop()
        if isinstance(node, ast.Call):
            name = _last_name(node.func)
            if name is not None:
                if in_loop:
                    loop_calls.add(name)
                if name in _TAKES_STEP:
                    step_functions.update(funcs)
        elif isinstance(node, _LOOPS):
            if not isinstance(node, ast.While) and LOADER_LOOP not in facts:
                if any_loader or any(_LOADER_RE.search(n) for n in map(_last_name, ast.walk(node.iter)) if n):
                    facts.add(LOADER_LOOP)
            in_loop = True
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, _FUNCS) and (
                        stmt.name == "step" or (stmt.name.endswith("_step") and not stmt.name.startswith("set_"))):
                    facts.add(STEP_METHOD)
        if isinstance(node, _FUNCS):
            funcs = funcs + (node.name,)
        for child in ast.iter_child_nodes(node):
            stack.append((child, in_loop, funcs))
    if any(n == "self" or n in step_functions or _STEPLIKE_RE.search(n) for n in loop_calls):
        facts.add(STEP_LOOP)
    return frozenset(facts)
