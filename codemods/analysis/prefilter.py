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
* ``output_in_loop`` -- a loop holds a call named like a print or a log
  (``print``, ``logger.info``, ``writer.add_scalar``);
* ``name:X`` -- the identifier ``X`` occurs in the code (a name, an
  attribute, an import, a keyword, a parameter, a definition): exactly the
  ``Name`` nodes LibCST would show, for codemods that only look at statements
  naming something (``tqdm``, ``init_process_group``, ``GradScaler``);
  ``name~X`` -- an identifier contains ``X``;
* ``code~W`` -- one of the CUDA rules' trigger words (``CODE_WORDS``) occurs
  in code: in an identifier or in a string with no blank in it, not only in
  comments and prose (most files that say "cuda" say it in a usage example,
  a docstring or a module-level ``EXAMPLE_DOC_STRING``): every string the
  CUDA rules read -- a device (``"cuda:0"``, ``f"cuda:{rank}"``), a backend
  (``"nccl"``), a key (``"pin_memory"``), a start method (``"spawn"``) -- is
  one word;
* ``tied_weights`` -- a statement of a class that has no re-tie method of its
  own gives one module's weight to another (``self.a.weight =
  self.b.weight``: :func:`is_tie`, the one definition);
* ``calls:transformers`` -- a model class imported from transformers is made
  (``GPT2LMHeadModel(config)``, ``AutoModel.from_pretrained(...)``:
  :func:`is_library_model`);
* ``imports:torch`` -- the file imports ``torch`` (or a submodule):
  without it no name resolves to ``torch.load`` or ``torch.compile``;
  ``torch:X`` -- ``X`` is imported from torch, or read along an attribute
  chain rooted at a name an import binds to torch (``torch.load``,
  ``dist.init_process_group``): the only ways a call resolves to
  ``torch.[...].X``;
* ``caught_index``, ``from_the_end`` -- see ``prefilter_traps``.

A codemod's ``NEEDS`` lists alternatives; ``a&b`` needs both.

Each is a superset of what ``codemods.analysis.loops.ModuleFacts`` finds on
the LibCST tree (same names, looser tests), so a codemod whose ``NEEDS`` are
all absent cannot find anything and the file is not parsed for it.  The test
suite compares findings with and without this filter on real packages.
No LibCST here.
"""

from __future__ import annotations

import ast
import hashlib
import re
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from codemods.analysis.steps import (
    LOADER_NAME_RE,
    STEP_CALLS,
    called_like_a_model,
    callers_closure,
    takes_step_by_name,
)
from codemods.analysis.prefilter_steps import dotted_name as _dotted
from codemods.analysis.prefilter_steps import last_name as _last_name
from codemods.analysis.prefilter_steps import may_step as _may_step
from codemods.analysis.prefilter_steps import draws_every_pass, reads_every_pass
from codemods.analysis.prefilter_steps import target_names as _target_names
from codemods.analysis.prefilter_traps import CAUGHT_INDEX, FROM_THE_END, TRIES, caught_index, from_the_end
from codemods.syntax import pyast

_LOADER_RE = LOADER_NAME_RE
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
# the walk tests exact node types (ast nodes have no subclasses)
_LOOP_KINDS = frozenset(_LOOPS)
_FUNC_KINDS = frozenset(_FUNCS)
_TABLES = (ast.Attribute, ast.Call)  # what an indexed table is named by (INDEXES_BY_PARAMETER): `self.x`, `x.to(d)`
_PLAIN_INDEX = (ast.Name, ast.BinOp)  # an index of a parameter: `t`, `t - 1`
_ASSIGNS = frozenset({ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr})
# fields that hold no node the facts read: expression contexts, operators
_LEAF_FIELDS = frozenset({"ctx", "op", "ops"})
_CHILD_FIELDS: Dict[type, Tuple[str, ...]] = {}

STEP_LOOP = "step_loop"
LOADER_LOOP = "loader_loop"
STEP_METHOD = "step_method"
OUTPUT_IN_LOOP = "output_in_loop"
# a top-level function's parameter starts a slice (``source[i:i + n]``): a
# helper another module's step loop may hand its counter to
SLICES_BY_PARAMETER = "slices_by_parameter"
# a function's parameter indexes an attribute or a moved tensor (``self.alphas[t]``,
# ``self.betas.to(x.device)[t - 1]``): a method another module's step loop may
# hand its counter to (a scheduler's ``step``)
INDEXES_BY_PARAMETER = "indexes_by_parameter"
INDEXER = "indexer:"  # + the name of each such function
# what a print or a log in a hot loop is called (codemods.prints reads these too)
LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "log", "exception"})
WRITER_METHODS = frozenset({"add_scalar", "add_scalars", "add_histogram", "add_image"})
_OUTPUT_CALLS = LOG_METHODS | WRITER_METHODS | {"print"}
IMPORTS_TORCH = "imports:torch"
# Code being ported names CUDA in its code (an identifier or a one-word string, ``code~cuda``) or
# reads ``torch.accelerator`` (the device-generic API of torch >= 2.6, CUDA on a CUDA host:
# pytorch/examples' mnist); or it is a module of the project that such a module imports
# (``PORTED_BY_IMPORTER``: no file's own facts hold it, the registry asks
# ``codemods.analysis.importers.ported_importer``)
BEING_PORTED = ("code~cuda", "torch:accelerator")
PORTED_BY_IMPORTER = "project:ported"
TIED_WEIGHTS = "tied_weights"
TIE_ATTRS = ("weight", "bias")  # what modules share
LIBRARY = "transformers"  # whose models tie weights inside the library (and re-tie with tie_weights())
CALLS_LIBRARY = f"calls:{LIBRARY}"
# a class with one of these methods re-ties its own weights when asked (transformers' convention)
RETIE_METHODS = ("_tie_weights", "tie_weights")
_MODEL_CLASS = re.compile(r"^[A-Z]\w*(Model|For[A-Z]\w*)$")


def is_library_model(chain: str) -> bool:
    """A dotted call (``GPT2LMHeadModel``, ``AutoModelForCausalLM.from_pretrained``)
    that makes a model of LIBRARY, by its naming: a class ``*Model`` or
    ``*For*``, called or asked ``from_pretrained``/``from_config``."""
    parts = chain.split(".")
    if len(parts) > 1 and parts[-1] in ("from_pretrained", "from_config", "_from_config"):
        parts = parts[:-1]
    return bool(_MODEL_CLASS.match(parts[-1]))


def is_tie(left: str, right: str) -> bool:
    """``self.<left> = self.<right>`` (dotted) gives one module's weight or
    bias to another: the same last name, both on ``self``, not the same."""
    last = left.rpartition(".")[2]
    return (last in TIE_ATTRS and right.rpartition(".")[2] == last and left != right
            and left.startswith("self.") and right.startswith("self."))


# words whose presence in code (an identifier or a string that is not a
# docstring) the prefilter reports as ``code~WORD``
# a CUDA reference (codemods.analysis.cuda) is only where the code holds one of these words ...
CUDA_REFERENCE_WORDS = ("cuda", "nccl", "pin_memory", "map_location", "device_ids", "output_device", "GradScaler",
                        "spawn")
# ... or one of these whole names (the runtime calls it counts, `fused=`)
CUDA_RUNTIME_NAMES = ("inference_mode", "fused", "set_float32_matmul_precision", "DataParallel")
CODE_WORDS = CUDA_REFERENCE_WORDS + ("cudnn", "accelerator")
_BLANK = re.compile(r"\s")


_LAST_FACTS: Tuple[bytes, Optional[FrozenSet[str]]] = (b"", None)


def facts_of(source: bytes) -> Optional[FrozenSet[str]]:
    """:func:`file_facts` of ``source``, read once for the file at hand (the
    registry asks first, the rules that speak only in code being ported ask
    again)."""
    global _LAST_FACTS
    if _LAST_FACTS[0] is not source:
        _LAST_FACTS = (source, file_facts(source))
    return _LAST_FACTS[1]


def file_facts(source: bytes) -> Optional[FrozenSet[str]]:
    """The facts that can hold for ``source``; None when ``ast`` cannot read
    it (then nothing is filtered and LibCST reports the problem).  Read once
    per process for the same bytes (by their digest): a module's facts are
    asked when it is linted and when a neighbour's importers are looked for
    (``analysis.importers``), in either order."""
    key = hashlib.blake2b(source, digest_size=16).digest()
    if key in _FACTS_BY_DIGEST:
        return _FACTS_BY_DIGEST[key]
    tree = pyast.parse(source)
    facts = None
    if tree is not None:
        seen = _Seen(source)
        _walk(tree, seen)
        facts = seen.facts_found()
    if len(_FACTS_BY_DIGEST) >= _KEEP_FACTS:
        _FACTS_BY_DIGEST.pop(next(iter(_FACTS_BY_DIGEST)))  # (the oldest)
    _FACTS_BY_DIGEST[key] = facts
    return facts


_FACTS_BY_DIGEST: Dict[bytes, Optional[FrozenSet[str]]] = {}  # (per process) digest of the bytes -> their facts
_KEEP_FACTS = 4096


class _Seen:
    """What one walk of a file's ``ast`` collects, and the facts it gives."""

    def __init__(self, source: bytes) -> None:
        self.facts: Set[str] = set()
        self.names: Set[str] = set()
        self.loop_calls: Set[str] = set()  # names called anywhere inside a loop
        self.step_functions: Set[str] = set()
        self.variables: Set[str] = set()  # names (and self.attrs) assigned or taken as parameters: may hold a model
        self.calls_of: Dict[str, Set[str]] = {}  # function name -> names its body calls
        self.loops: List[ast.AST] = []  # loops outside a model's own methods
        # something here can make a model (see kinds.library_kinds): torch.nn, an unpickled object
        self.model_source = b"torch.nn" in source or b"load(" in source or b"jit." in source
        self.any_loader = b"DataLoader" in source
        self.may_tie = any(f"{a} = self.".encode() in source for a in TIE_ATTRS)
        self.ties: List[int] = []  # lines of tying assignments (TIED_WEIGHTS)
        self.untied_classes: List[Tuple[int, int]] = []  # lines of classes without a re-tie method
        self.may_call_library = LIBRARY.encode() in source
        self.strings: List[str] = []  # string constants of one word (prose left out: see code~W above)
        self.torch_roots: Set[str] = set()  # names bound to torch or a torch module (`import torch.nn as nn`)
        self.torch_names: Set[str] = set()  # what is imported from torch (`from torch import load`)
        self.attrs_of: Dict[str, Set[str]] = {}  # name -> the attributes read along chains rooted at it
        self.library_roots: Set[str] = set()  # names an import of LIBRARY binds
        self.called_chains: Set[Tuple[str, str]] = set()  # (root name, dotted chain) of every call that may make a model
        self.slice_starts: Dict[str, Set[str]] = {}  # outermost function -> the names its slices' starts read
        self.top_params: Dict[str, Set[str]] = {}  # top-level function -> its parameters
        self.index_names: Dict[str, Set[str]] = {}  # innermost function -> the names its table indexes read
        self.params: Dict[str, Set[str]] = {}  # function (any level) -> its parameters

    def imported(self, node: ast.AST) -> None:
        self.model_source = self.model_source or _imports_models(node)  # type: ignore[arg-type]
        if (node.module or "").split(".")[0] == LIBRARY if type(node) is ast.ImportFrom and not node.level else \
                any(a.name.split(".")[0] == LIBRARY for a in node.names):  # type: ignore[attr-defined]
            self.library_roots.update(a.asname or a.name.split(".")[0] for a in node.names)  # type: ignore[attr-defined]
        if _imports_torch(node):  # type: ignore[arg-type]
            for alias in node.names:  # type: ignore[attr-defined]
                if isinstance(node, ast.ImportFrom):
                    self.torch_names.add(alias.name)
                    self.torch_roots.add(alias.asname or alias.name)
                else:
                    self.torch_roots.add(alias.asname or alias.name.split(".")[0])
            self.torch_names.update(self.torch_roots)

    def loop(self, node: ast.AST, in_model: bool) -> None:
        if not isinstance(node, ast.While) and LOADER_LOOP not in self.facts:
            if self.any_loader or any(_LOADER_RE.search(n) for n in map(_last_name, ast.walk(node.iter)) if n):  # type: ignore[attr-defined]
                self.facts.add(LOADER_LOOP)
        if not in_model:
            self.loops.append(node)

    def class_def(self, node: ast.ClassDef) -> None:
        if self.may_tie and not any(isinstance(m, _FUNCS) and m.name in RETIE_METHODS for m in node.body):
            self.untied_classes.append((node.lineno, node.end_lineno or node.lineno))
        for stmt in node.body:
            if isinstance(stmt, _FUNCS) and (
                    stmt.name == "step" or (stmt.name.endswith("_step") and not stmt.name.startswith("set_"))):
                self.facts.add(STEP_METHOD)

    def assigned(self, node: ast.Assign) -> None:
        """A tie of two modules' weights (``self.head.weight = self.embed.weight``):
        read by ``facts_found`` where a class without a re-tie method holds it."""
        if len(node.targets) == 1 and type(node.targets[0]) is ast.Attribute \
                and is_tie(_dotted(node.targets[0]), _dotted(node.value)):
            self.ties.append(node.lineno)

    def facts_found(self) -> FrozenSet[str]:
        facts = self.facts
        if any(first <= line <= last for line in self.ties for first, last in self.untied_classes):
            facts.add(TIED_WEIGHTS)  # (a tie inside a class, at any depth, that does not re-tie)
        # what the dataflow of codemods.analysis.values can find a model in: a
        # variable, or a function of the file that calls one (or a step-like name)
        called_by: Dict[str, Set[str]] = {}
        for fn, called in self.calls_of.items():
            for name in called:
                called_by.setdefault(name, set()).add(fn)
        step_functions = callers_closure(self.step_functions, lambda name: called_by.get(name, ()))  # as loops.step_functions
        models = (self.variables if self.model_source else set()) | {"self"} | step_functions
        runners: Set[str] = set()
        changed = True
        while changed:
            changed = False
            for fn, called in self.calls_of.items():
                if fn not in runners and any(c in models or c in runners or called_like_a_model(c) for c in called):
                    runners.add(fn)
                    changed = True
        # (what state's model calls accept by name: with the step calls and the
        # file's own functions, every call loops.step_kind can count; only the
        # last name of a call is known here, so a draw `x.sample()` counts too)
        if any(n in models or n in runners or takes_step_by_name(n) or called_like_a_model(n) for n in self.loop_calls):
            # some loop calls something step- or model-like; one of them must
            # also take a step or carry a model's output (see _may_step)
            def modelish(name: str) -> bool:
                return name in models or name in runners or called_like_a_model(name)

            steps = STEP_CALLS | step_functions
            if any(_may_step(loop, steps, modelish) for loop in self.loops):
                facts.add(STEP_LOOP)
        facts.update(f"name:{n}" for n in self.names)
        if any(self.slice_starts.get(fn, set()) & params for fn, params in self.top_params.items()):
            facts.add(SLICES_BY_PARAMETER)
        indexers = [fn for fn, read in self.index_names.items() if self.params.get(fn, set()) & read]
        if indexers:
            facts.add(INDEXES_BY_PARAMETER)
            facts.update(INDEXER + fn for fn in indexers)
        if any(root in self.library_roots for root, _ in self.called_chains):
            facts.add(CALLS_LIBRARY)
        if self.torch_roots:  # (every import of torch binds at least one name)
            facts.add(IMPORTS_TORCH)
            # torch:X -- X is imported from torch or read as an attribute along a
            # chain rooted at a name bound to torch: only so can a name resolve
            # to a qualified name torch.[...].X
            facts.update(f"torch:{n}" for n in self.torch_names)
            for root in self.torch_roots:
                facts.update(f"torch:{a}" for a in self.attrs_of.get(root, ()))
        # the trigger words of the CUDA rules, in code: a word that occurs only
        # in comments and prose cannot concern them
        code = "\x00".join(self.strings) + "\x00" + "\x00".join(self.names)
        facts.update(f"code~{w}" for w in CODE_WORDS if w in code)
        return frozenset(facts)


def _named_table(node: ast.AST) -> bool:
    """``self.alphas`` or ``<...>.to(...)``: what a table indexed with a
    parameter is named by (``INDEXES_BY_PARAMETER``)."""
    return type(node) is ast.Attribute or _last_name(node.func) == "to"  # type: ignore[attr-defined]


def _walk(tree: ast.AST, seen: _Seen) -> None:
    """One pass over every node (the hot loop of the prefilter: the common
    kinds are handled inline, the rare ones by ``seen``'s methods)."""
    facts, names, loop_calls, step_functions = seen.facts, seen.names, seen.loop_calls, seen.step_functions
    calls_of, attrs_of, strings = seen.calls_of, seen.attrs_of, seen.strings
    may_call_library, called_chains, may_tie = seen.may_call_library, seen.called_chains, seen.may_tie
    # (node, inside a loop?, enclosing function names, inside a model's own
    # forward/backward/__init__ -- where no loop is a step loop)
    stack: List[Tuple[ast.AST, bool, Tuple[str, ...], bool]] = [(tree, False, (), False)]
    pop, push, AST, Name, Constant = stack.pop, stack.append, ast.AST, ast.Name, ast.Constant
    add_name, blank = names.add, _BLANK.search
    while stack:
        node, in_loop, funcs, in_model = pop()
        kind = type(node)
        if kind is Name:
            add_name(node.id)  # type: ignore[attr-defined]
            continue
        if kind is Constant:
            value = node.value  # type: ignore[attr-defined]
            if type(value) is bytes:
                value = value.decode("latin-1")
            if type(value) is str and blank(value) is None:  # one word: a device, a backend, a key; not prose
                strings.append(value)
            continue
        if kind in _NAMED:
            _add_names(node, names)
            if kind is ast.Attribute:
                root = node.value  # type: ignore[attr-defined]
                while type(root) is ast.Attribute:
                    root = root.value  # type: ignore[attr-defined]
                if type(root) is ast.Name:
                    attrs_of.setdefault(root.id, set()).add(node.attr)  # type: ignore[attr-defined]
        if kind is ast.Call:
            root = node.func  # type: ignore[attr-defined]
            while type(root) is ast.Attribute:
                root = root.value  # type: ignore[attr-defined]
            if may_call_library and type(root) is ast.Name:
                chain = _dotted(node.func)  # type: ignore[attr-defined]
                if chain and is_library_model(chain):
                    called_chains.add((root.id, chain))  # type: ignore[attr-defined]
            name = _last_name(node.func)  # type: ignore[attr-defined]
            if name is not None:
                if in_loop and not in_model:
                    loop_calls.add(name)
                if in_loop and name in _OUTPUT_CALLS:
                    facts.add(OUTPUT_IN_LOOP)
                if takes_step_by_name(name):
                    step_functions.update(funcs)
                if funcs:
                    calls_of.setdefault(funcs[-1], set()).add(name)
        elif kind in _ASSIGNS:
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):  # type: ignore[attr-defined]
                seen.variables.update(_target_names(target))
            if may_tie and kind is ast.Assign:
                seen.assigned(node)  # type: ignore[arg-type]
        elif kind is ast.arg:
            seen.variables.add(node.arg)  # type: ignore[attr-defined]
            ann = node.annotation  # type: ignore[attr-defined]
            if not seen.model_source and ann is not None and any(_last_name(n) == "Module" for n in ast.walk(ann)):
                seen.model_source = True
        elif kind is ast.Import or kind is ast.ImportFrom:
            seen.imported(node)
        elif kind in _LOOP_KINDS:
            if in_model and (reads_every_pass(node) or draws_every_pass(node)):
                # a loop in a forward that reads or draws every pass (barriers.StepBarrier): read as others
                in_model = False
            seen.loop(node, in_model)
            in_loop = True
        elif kind is ast.ClassDef:
            seen.class_def(node)  # type: ignore[arg-type]
        elif kind is ast.Slice:
            if FROM_THE_END not in facts and from_the_end(node):  # type: ignore[arg-type]
                facts.add(FROM_THE_END)
            if node.lower is not None and funcs:  # type: ignore[attr-defined]
                seen.slice_starts.setdefault(funcs[0], set()).update(
                    n.id for n in ast.walk(node.lower) if type(n) is Name)  # type: ignore[attr-defined]
        elif kind in TRIES:
            if CAUGHT_INDEX not in facts and caught_index(node):
                facts.add(CAUGHT_INDEX)
        elif kind is ast.Subscript and funcs and type(node.value) in _TABLES \
                and type(node.slice) in _PLAIN_INDEX and _named_table(node.value):  # type: ignore[attr-defined]
            seen.index_names.setdefault(funcs[-1], set()).update(
                n.id for n in ast.walk(node.slice) if type(n) is Name)  # type: ignore[attr-defined]
        if kind in _FUNC_KINDS:
            args = node.args  # type: ignore[attr-defined]
            seen.params.setdefault(node.name, set()).update(  # type: ignore[attr-defined]
                a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
            funcs = funcs + (node.name,)  # type: ignore[attr-defined]
            if not node.col_offset:  # type: ignore[attr-defined]
                seen.top_params[node.name] = {a.arg for a in ast.walk(node.args) if type(a) is ast.arg}  # type: ignore[attr-defined]
        if kind is ast.ClassDef:
            for child in ast.iter_child_nodes(node):
                stack.append((child, in_loop, funcs, in_model or (
                    isinstance(child, _FUNCS) and _is_model_method(child.name))))  # type: ignore[attr-defined]
            continue
        fields = _CHILD_FIELDS.get(kind)
        if fields is None:
            fields = _CHILD_FIELDS[kind] = tuple(f for f in kind._fields if f not in _LEAF_FIELDS)
        for field in fields:  # ast.iter_child_nodes, inlined: this loop sees every node
            value = getattr(node, field, None)
            if type(value) is list:
                for child in value:
                    if isinstance(child, AST):
                        push((child, in_loop, funcs, in_model))
            elif isinstance(value, AST):
                push((value, in_loop, funcs, in_model))


def _imports_torch(node: ast.AST) -> bool:
    """An absolute import of ``torch`` or a submodule: only then can a
    name resolve to a ``torch.*`` qualified name."""
    if isinstance(node, ast.ImportFrom):
        return not node.level and (node.module or "").split(".")[0] == "torch"
    return any(a.name.split(".")[0] == "torch" for a in node.names)  # type: ignore[attr-defined]


_MODEL_PACKAGES = ("timm", "torchvision", "diffusers", "transformers", "peft", "open_clip")


def _imports_models(node: ast.AST) -> bool:
    """An import through which ``codemods.analysis.values`` can see a model
    made: ``torch.nn`` (and FSDP), or a model library (absolutely)."""
    if isinstance(node, ast.ImportFrom):
        if node.level or not node.module:
            return False
        mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    else:
        mods = [a.name for a in node.names]  # type: ignore[attr-defined]
    return any(m.startswith(("torch.nn", "torch.distributed.fsdp")) or m.split(".")[0] in _MODEL_PACKAGES
               for m in mods)


def _is_model_method(name: str) -> bool:  # == loops._is_model_method
    return name in ("forward", "backward", "_forward", "__init__") or name.startswith(("forward", "_forward"))


def holds(need: str, facts: FrozenSet[str]) -> bool:
    """Whether one ``NEEDS`` entry holds for a file's facts (``a&b``: both)."""
    if "&" in need:
        return all(holds(part, facts) for part in need.split("&"))
    if need.startswith("name~"):
        part = need[5:]
        return any(f.startswith("name:") and part in f[5:] for f in facts)
    return need in facts


def may_hold(need: str, source: bytes) -> bool:
    """False where ``need`` cannot hold for ``source`` whatever its facts:
    a fact that names a word (``code~cuda``, ``torch:accelerator``,
    ``name:tqdm``, ``name~Scaler``) holds only where the bytes hold the word,
    so a file without it need not be parsed to say no."""
    if "&" in need:
        return all(may_hold(part, source) for part in need.split("&"))
    kind, sep, word = need.partition(":") if not need.startswith(("code~", "name~")) else need.partition("~")
    if not sep or kind not in ("code", "name", "torch") or not word:
        return True
    return word.encode() in source


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
