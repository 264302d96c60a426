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
* ``step_method`` -- a class method named ``step`` or ``*_step``;
* ``name:X`` -- the identifier ``X`` occurs in the code (a name, an
  attribute, an import, a keyword, a parameter, a definition): exactly the
  ``Name`` nodes LibCST would show, for codemods that only look at statements
  naming something (``tqdm``, ``init_process_group``, ``GradScaler``);
  ``name~X`` -- an identifier contains ``X``.

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
    names: Set[str] = set()
    loop_calls: Set[str] = set()  # names called anywhere inside a loop
    step_functions: Set[str] = set()
    any_loader = b"DataLoader" in source
    # (node, inside a loop?, enclosing function names)
    stack: List[Tuple[ast.AST, bool, Tuple[str, ...]]] = [(tree, False, ())]
    while stack:
        node, in_loop, funcs = stack.pop()
        kind = type(node)
        if kind is ast.Name:
            names.add(node.id)  # type: ignore[attr-defined]
            continue
        if kind in _NAMED:
            _add_names(node, names)
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
    facts.update(f"name:{n}" for n in names)
    return frozenset(facts)


def holds(need: str, facts: FrozenSet[str]) -> bool:
    """Whether one ``NEEDS`` entry holds for a file's facts."""
    if need.startswith("name~"):
        part = need[5:]
        return any(f.startswith("name:") and part in f[5:] for f in facts)
    return need in facts


# nodes that carry identifiers as plain strings (ast.Name is handled inline)
_NAMED = {ast.Attribute, ast.alias, ast.keyword, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.arg,
          ast.ImportFrom, ast.Global, ast.Nonlocal, ast.ExceptHandler}


def _add_names(node: ast.AST, names: Set[str]) -> None:
    if isinstance(node, ast.Attribute):
        names.add(node.attr)
    elif isinstance(node, ast.alias):
        names.update(node.name.split("."))
        if node.asname:
            names.add(node.asname)
    elif isinstance(node, ast.ImportFrom):
        if node.module:
            names.update(node.module.split("."))
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        names.update(node.names)
    elif isinstance(node, ast.arg):
        names.add(node.arg)
    else:  # keyword, definitions, except ... as name
        name = getattr(node, "arg", None) or getattr(node, "name", None)
        if isinstance(name, str):
            names.add(name)
