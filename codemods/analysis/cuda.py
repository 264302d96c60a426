"""The CUDA surface of a module: what is CUDA-specific in it, and what the
names that carry CUDA choices hold.

* :func:`cuda_references` lists every CUDA-specific construct (``torch.cuda.*``
  in any import spelling, ``torch.backends.cudnn/cuda.*``, ``.cuda()``,
  ``"cuda"``/``"cuda:N"`` strings, ``"nccl"``, ``device_ids=``/``output_device=``,
  pinned memory, ``map_location=``, GradScalers, ``mp.spawn``).  ``convert`` and
  ``lint`` count them in the input and in the output for the coverage line,
  and the catch-all rule (XLA199) reports those left in the output.
* :class:`CudaFacts` answers, from the module's assignments, which names hold
  a device *string* (``device = "cuda"``: the program may test it as a string,
  so it must stay one), which hold a GradScaler, and which scopes launch
  worker processes (where the runtime must not start yet).

Facts are keyed by the target's source text (``device``, ``args.device``,
``self.scaler``) over the whole module: a name is what every assignment to
it in the module says it is.  That is coarser than reaching definitions, and
each rule that rewrites on it checks the use it rewrites.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.device_calls import (  # noqa: F401 (read here too)
    LAUNCHERS,
    SPAWNS,
    QualNames,
    device_arguments,
)
from codemods.analysis.importers import ported_importer
from codemods.analysis.ordinals import ordinal_uses
from codemods.analysis.prefilter import (
    BEING_PORTED,
    CUDA_REFERENCE_WORDS,
    CUDA_RUNTIME_NAMES,
    PORTED_BY_IMPORTER,
    facts_of,
    holds,
)
from codemods.syntax.tree import TreeCache, dotted, node_types, string_value, walk

CUDA_STRING_RE = re.compile(r"^cuda(:\d+)?$")
_CUDA_TYPE_NAME = re.compile(r"^torch\.cuda\.[A-Za-z0-9]*Tensor$")  # a legacy type named by a string
HOST_DEVICES = {"cpu", "mps"}
CUDA_MODULES = ("torch.cuda", "torch.backends.cudnn", "torch.backends.cuda")
GRAD_SCALERS = {"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
                "torch.amp.grad_scaler.GradScaler"}
AUTOCASTS = {"torch.cuda.amp.autocast", "torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast",
             "torch.cuda.amp.autocast_mode.autocast"}
AVAILABILITY = {"torch.cuda.is_available", "torch.accelerator.is_available", "torch.backends.mps.is_available"}
# what starts worker processes, before conversion and after (idempotence)


def is_cuda_string(node: cst.CSTNode) -> bool:
    """A string whose value is a CUDA device, read by value: ``"cuda"``,
    ``"cuda:1"``, ``f"cuda"``, ``f"cuda:{rank}"``, ``"cuda:{}".format(gpu)``,
    ``"cuda:%d" % gpu``, ``"cuda:" + str(gpu)`` (constant parts evaluated,
    the others standing for the index)."""
    value = string_value(node)
    if value is not None:
        return bool(CUDA_STRING_RE.match(value))
    pattern = _string_pattern(node)
    return pattern is not None and bool(_CUDA_PATTERN_RE.match(pattern))


_CUDA_PATTERN_RE = re.compile(r"^cuda(:(\d+|\{\}))?$")
_FORMAT_FIELD_RE = re.compile(r"\{[^{}]*\}|%[-+ #0-9.]*[dsi]")


def _string_pattern(node: cst.CSTNode, depth: int = 0) -> Optional[str]:
    """The value of a string expression with each part not known here as
    ``{}``; None where ``node`` is not a string expression."""
    value = string_value(node)
    if value is not None:
        return value
    if depth > 8:
        return None
    if isinstance(node, cst.FormattedString):
        return "".join(p.value if isinstance(p, cst.FormattedStringText) else "{}" for p in node.parts)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        template = string_value(node.func.value)
        return None if template is None else _FORMAT_FIELD_RE.sub("{}", template)
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, cst.Modulo):
            template = string_value(node.left)
            return None if template is None else _FORMAT_FIELD_RE.sub("{}", template)
        if isinstance(node.operator, cst.Add):
            left, right = _string_pattern(node.left, depth + 1), _string_pattern(node.right, depth + 1)
            if left is None and right is None:
                return None
            return (left if left is not None else "{}") + (right if right is not None else "{}")
    return None


def is_host_string(node: cst.CSTNode) -> bool:
    return string_value(node) in HOST_DEVICES


def is_device_string_choice(node: cst.CSTNode) -> bool:
    """A CUDA string, or a conditional choosing between device strings with a
    CUDA one among them (``"cuda" if ok else "mps" if mps else "cpu"``)."""
    if isinstance(node, cst.IfExp):
        branches = [node.body, node.orelse]
        if not all(is_device_string_choice(b) or is_host_string(b) for b in branches):
            return False
        return any(is_device_string_choice(b) for b in branches)
    return is_cuda_string(node)


def in_cuda_module(names: Set[str]) -> Optional[str]:
    for q in names:
        if q == "torch.cuda" or q.startswith(tuple(m + "." for m in CUDA_MODULES)) or q in CUDA_MODULES:
            return q
    return None


_REFERENCE_NODES = (cst.Attribute, cst.Name, cst.Call, cst.SimpleString, cst.FormattedString, cst.Arg, cst.DictElement,
                    cst.BinaryOperation)


def cuda_references(tree: TreeCache, qualnames: QualNames) -> List[Tuple[cst.CSTNode, str]]:
    """Every CUDA-specific construct of the module, with a short label."""
    found: List[Tuple[cst.CSTNode, str]] = []
    parents = tree.parents
    source = tree.source
    words = not source or any(m in source for m in _WORD_BYTES)
    if not words and not any(m in source for m in REFERENCE_BYTES):
        return found
    # Names and attribute chains count as a whole chain, one that names one
    # of the words: found from the few names that hold a word, climbing to
    # the head of their chain (rather than a look at every chain)
    heads: Set[int] = set()
    for name in tree.in_walk_order((cst.Name,)):
        value = name.value  # type: ignore[attr-defined]
        if "cuda" in value or "cudnn" in value or "GradScaler" in value or "spawn" in value:
            head, up = name, parents.get(id(name))
            while type(up) is cst.Attribute and (up.value is head or up.attr is head):  # type: ignore[union-attr]
                head, up = up, parents.get(id(up))
            heads.add(id(head))
    for n in tree.in_walk_order(node_types(_REFERENCE_NODES)):  # the type index: no walk
        kind = type(n)  # (exact types: LibCST's node classes are ABCs, slow in isinstance)
        if kind is cst.Attribute or kind is cst.Name:
            if id(n) not in heads:
                continue
            parent = parents.get(id(n))
            text = dotted(n)
            if not text:
                continue
            if not (isinstance(parent, (cst.ImportAlias, cst.ImportFrom)) or _in_import(n, parents)):
                q = qualnames(n)
                hit = in_cuda_module(q)
                if hit:
                    found.append((n, hit))
                elif q & (GRAD_SCALERS | SPAWNS):
                    found.append((n, sorted(q & (GRAD_SCALERS | SPAWNS))[0]))
        elif kind is cst.Call:
            func = n.func
            if type(func) is cst.Attribute and func.attr.value in ("cuda", "pin_memory"):
                if not in_cuda_module(qualnames(func)):
                    found.append((n, f".{func.attr.value}()"))
            elif type(func) is cst.Attribute and func.attr.value == "format":
                if is_cuda_string(n):  # "cuda:{}".format(gpu)
                    found.append((n, '"cuda"'))
            elif (dotted(func) or "").rsplit(".", 1)[-1] in RUNTIME_CALLS:
                label = RUNTIME_CALLS[(dotted(func) or "").rsplit(".", 1)[-1]]
                if any(q.startswith("torch.") for q in qualnames(func)):
                    found.append((n, label))
        elif kind is cst.SimpleString or kind is cst.FormattedString:
            if is_cuda_string(n) and not _maps_to_xla(n, parents):
                found.append((n, '"cuda"'))
            elif string_value(n) == "nccl":
                found.append((n, '"nccl"'))
            elif _CUDA_TYPE_NAME.match(string_value(n) or ""):  # set_default_tensor_type("torch.cuda.X")
                found.append((n, string_value(n)))  # type: ignore[arg-type]
        elif kind is cst.Arg and n.keyword is not None:
            key = n.keyword.value
            if key in ("device_ids", "output_device"):
                found.append((n, f"{key}="))
            elif key == "pin_memory" and not is_false(n.value):
                found.append((n, "pin_memory="))
            elif key == "map_location" and string_value(n.value) != "cpu":
                found.append((n, "map_location="))
            elif key == "fused" and not is_false(n.value) and not (isinstance(n.value, cst.Name) and n.value.value == "None"):
                call = parents.get(id(n))
                if isinstance(call, cst.Call) and any(q.startswith("torch.optim.") for q in qualnames(call.func)):
                    found.append((n, "fused="))
        elif kind is cst.BinaryOperation:  # "cuda:" + str(gpu), "cuda:%d" % gpu (the whole, once)
            if type(parents.get(id(n))) is not cst.BinaryOperation and is_cuda_string(n):
                found.append((n, '"cuda"'))
        elif kind is cst.DictElement and string_value(n.key) == "pin_memory" and not is_false(n.value):
            found.append((n, "pin_memory="))
    if words:  # (an int device is counted where the code speaks of CUDA)
        found += [(n, "int device") for n in ordinal_uses(tree, qualnames).values()]
    return found


def _maps_to_xla(node: cst.CSTNode, parents: Dict[int, cst.CSTNode]) -> bool:
    """``node`` is read in the test of a choice whose CUDA side is "xla"
    (``"xla" if d.startswith("cuda") else d``, what XLA109 writes for a device
    option): a CUDA name mapped to XLA, not a use of CUDA."""
    child, up = node, parents.get(id(node))
    for _ in range(6):
        if up is None:
            return False
        if type(up) is cst.IfExp:
            return child is up.test and string_value(up.body) == "xla"  # type: ignore[attr-defined]
        child, up = up, parents.get(id(up))
    return False


# torch calls that run on CUDA and not on XLA as they are (codemods/runtime.py):
# counted with the CUDA surface, as what a port must change
RUNTIME_CALLS = {"inference_mode": "inference_mode()", "set_float32_matmul_precision": "matmul precision",
                 "DataParallel": "DataParallel"}
# a file without one of these holds no reference (the prefilter's lists: CudaCatchAll's triggers)
_WORD_BYTES = tuple(w.encode() for w in CUDA_REFERENCE_WORDS)
REFERENCE_BYTES = _WORD_BYTES + tuple(n.encode() for n in CUDA_RUNTIME_NAMES)


def ported_needs(*needs: str) -> Tuple[str, ...]:
    """``needs`` each combined with each way of being ported (``NEEDS``
    entries: one of them must hold)."""
    return tuple(f"{n}&{p}" if n else p for n in needs or ("",) for p in (*BEING_PORTED, PORTED_BY_IMPORTER))


def being_ported(tree: TreeCache) -> bool:
    """The user's file is code being ported (``BEING_PORTED``), or a module
    of the project that code being ported imports (a model or a training
    helper beside the script that names CUDA), where the rules about XLA's
    costs speak -- read in the user's source, not in the tree earlier rules
    made, where the CUDA is gone."""
    facts = facts_of(tree.source)
    return facts is None or any(holds(need, facts) for need in BEING_PORTED) \
        or ported_importer(tree.filename, tree.source)


def count_references(tree: TreeCache) -> int:
    """How many CUDA references the module holds, reading names through its
    imports only: the same count before and after conversion.  Once per tree
    (the engine counts the input; the catch-all counts what is left, often
    the same tree)."""
    count = tree.memo.get("cuda_count")
    if not isinstance(count, int):
        count = tree.memo["cuda_count"] = len(cuda_references(tree, lambda n: tree.import_qualnames(n) or set()))
    return count


# a name that says it holds a device (last resort where no assignment says so)
DEVICE_NAME_RE = re.compile(r"(^|_)(device|dev)(_|$)|device", re.IGNORECASE)


def is_false(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


def _in_import(node: cst.CSTNode, parents: Dict[int, cst.CSTNode]) -> bool:
    cur: Optional[cst.CSTNode] = node
    for _ in range(6):
        cur = parents.get(id(cur)) if cur is not None else None
        if cur is None or isinstance(cur, (cst.BaseStatement, cst.BaseSmallStatement)):
            return isinstance(cur, (cst.Import, cst.ImportFrom))
    return False


class CudaFacts:
    """What the module's assignments say about names carrying CUDA choices."""

    def __init__(self, tree: TreeCache, qualnames: QualNames) -> None:
        self.device_strings: Set[str] = set()
        self.scalers: Set[str] = set()
        self.launchers: Set[int] = set()  # id() of functions (or the module) that spawn workers
        self.availability_flags: Set[str] = set()  # use_cuda = torch.cuda.is_available() and ...
        self.chosen_flags: Set[str] = set()  # of those, the ones that read a choice too (`args.cuda and ...`)
        self._qualnames = qualnames
        self._tree = tree
        self._device_uses: Optional[Set[str]] = None
        self._assigned_object: Set[str] = set()  # names also bound to a torch.device
        tree.parents  # builds the type index
        for node in tree.in_walk_order(node_types((cst.Assign, cst.AnnAssign, cst.Call, cst.Param))):
            if isinstance(node, cst.Param):  # `def f(device="cuda")`: bound where the function is defined
                if node.default is not None:
                    self._bind(node.name, node.default, qualnames)
            elif isinstance(node, (cst.Assign, cst.AnnAssign)) and node.value is not None:
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                for target in targets:
                    self._bind(target, node.value, qualnames)
            elif isinstance(node, cst.Call) and qualnames(node.func) & (SPAWNS | LAUNCHERS):
                self.launchers.add(id(scope_of(node, tree)))
        # A name has one kind across its bindings: a name that holds a device
        # string in one branch and the user's choice (`args.device`, a
        # parameter) in another is a string; only a binding to a device
        # object makes it a device
        for attr in tree.in_walk_order(node_types((cst.Attribute,))):  # `device.type`: used as an object
            if attr.attr.value in ("type", "index"):  # type: ignore[attr-defined]
                text = dotted(attr.value)  # type: ignore[attr-defined]
                if text in self.device_strings:
                    self._assigned_object.add(text)
        self.device_strings -= self._assigned_object

    def _bind(self, target: cst.CSTNode, value: cst.CSTNode, qualnames: QualNames) -> None:
        text = dotted(target)
        if text is None:
            return
        if is_device_string_choice(value):
            self.device_strings.add(text)
        elif _is_device_object(value, qualnames, self._tree):
            self._assigned_object.add(text)
        if isinstance(value, cst.Call) and qualnames(value.func) & GRAD_SCALERS:
            self.scalers.add(text)
        if isinstance(value, (cst.Call, cst.BooleanOperation, cst.UnaryOperation, cst.Name, cst.Attribute)) \
                and self.tests_availability(value):
            self.availability_flags.add(text)  # a flag, not a device chosen by one
            if self.reads_a_choice(value):
                self.chosen_flags.add(text)

    def holds_device(self, text: str) -> bool:
        """A name (or ``self.x``) that holds a device: the module passes it
        where a device goes (``.to(x)``, ``device=x``, ``torch.device(x)``);
        failing that, as a last resort for a value used elsewhere (another
        module, a caller), a name that says so (``device``, ``dev``)."""
        if self._device_uses is None:
            self._device_uses = set()
            for call in self._tree.nodes((cst.Call,)):
                for arg in device_arguments(call, self._qualnames):  # type: ignore[arg-type]
                    used = dotted(arg)
                    if used:
                        self._device_uses.add(used)
        return text in self._device_uses or bool(DEVICE_NAME_RE.search(text.split(".")[-1]))

    def string_default(self, param: cst.Param) -> bool:
        """``def f(device="cuda")``: a parameter whose default is a device
        string (XLA109 rewrites it as any other device string)."""
        name = param.name.value
        return param.default is not None and is_device_string_choice(param.default) \
            and name in self.device_strings and self.holds_device(name)

    def tests_availability(self, test: cst.CSTNode) -> bool:
        """``test`` calls an accelerator availability predicate, or reads a
        flag that was assigned from one."""
        for n in walk(test):
            if isinstance(n, cst.Call) and self._qualnames(n.func) & AVAILABILITY:
                return True
            if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) in self.availability_flags:
                return True
        return False

    def users_choice(self, test: cst.CSTNode) -> bool:
        """A test of availability that also reads the user's choice (``args.cuda
        and torch.cuda.is_available()``): what rewrites keep, converting only
        its CUDA side."""
        return self.tests_availability(test) and self.reads_a_choice(test)

    def reads_a_choice(self, test: cst.CSTNode) -> bool:
        """``test`` reads something besides availability: an option, a
        parameter, a config field (``args.cuda and torch.cuda.is_available()``,
        ``not args.no_cuda and ...``, or a flag made so) -- the user's choice,
        which a conversion keeps (CPU stays CPU)."""
        if isinstance(test, cst.BooleanOperation):
            return self.reads_a_choice(test.left) or self.reads_a_choice(test.right)
        if isinstance(test, cst.UnaryOperation):
            return self.reads_a_choice(test.expression)
        if isinstance(test, cst.Comparison):  # torch.cuda.device_count() > 0
            return any(self.reads_a_choice(x) for x in (test.left, *(c.comparator for c in test.comparisons)))
        if isinstance(test, (cst.Integer, cst.Float)) or (isinstance(test, cst.Name)
                                                          and test.value in ("True", "False", "None")):
            return False
        if isinstance(test, cst.Call):
            names = self._qualnames(test.func)
            return not (names & AVAILABILITY or names & {"torch.cuda.device_count", "torch.accelerator.device_count"})
        text = dotted(test) if isinstance(test, (cst.Name, cst.Attribute)) else None
        if text is not None and text in self.availability_flags:
            return text in self.chosen_flags
        return True

    def is_scaler(self, node: cst.CSTNode) -> bool:
        text = dotted(node)
        if text is None:
            return False
        if text in self.scalers:
            return True
        # last resort, for a scaler handed in by a caller: a name saying so
        return text.split(".")[-1] in {"scaler", "grad_scaler", "loss_scaler", "amp_scaler"}


_DEVICE_MAKERS = {"torch.device", "torch_xla.device", "torch_xla.core.xla_model.xla_device",
                  "torch_xla.runtime.xla_device", "torch.accelerator.current_accelerator"}


def _is_device_object(value: cst.CSTNode, qualnames: QualNames, tree: TreeCache) -> bool:
    """A ``torch.device``: made, or read off a tensor or an accelerator
    (``args.device``, an option, is the user's string)."""
    if isinstance(value, cst.Call):
        return bool(qualnames(value.func) & _DEVICE_MAKERS)
    if not (isinstance(value, cst.Attribute) and value.attr.value == "device"):
        return False
    from codemods.analysis.values import (  # (values reads this module's neighbours)
        TENSOR,
        values,
    )

    base = value.value
    return "accelerator" in (dotted(base) or "").split(".")[-1] or TENSOR in values(tree).of(base)


def scope_of(node: cst.CSTNode, tree: TreeCache) -> cst.CSTNode:
    """The function (or module) whose body holds ``node``."""
    cur: Optional[cst.CSTNode] = tree.parents.get(id(node))
    while cur is not None and not isinstance(cur, (cst.FunctionDef, cst.Module)):
        cur = tree.parents.get(id(cur))
    return cur or tree.module


def is_script(tree: TreeCache, qualnames: QualNames) -> bool:
    """The module is a program's entry point: it runs at its top level
    (parses its arguments, loops, or has an ``if __name__ == "__main__":``
    block) and launches no processes.  Its top level is the program's path,
    not an import: the XLA runtime may start there, and a requirement it
    states is the program's."""
    if "is_script" in tree.memo:
        return bool(tree.memo["is_script"])
    found = False
    if id(tree.module) not in cuda_facts(tree, qualnames).launchers:
        for stmt in tree.module.body:
            if isinstance(stmt, (cst.For, cst.While)):
                found = True
            elif isinstance(stmt, cst.If) and "__main__" in {string_value(s) for s in walk(stmt.test)}:
                found = True
            elif isinstance(stmt, cst.SimpleStatementLine) and any(
                    isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                    and n.func.attr.value in ("parse_args", "parse_known_args") for n in walk(stmt)):
                found = True
            if found:
                break
    tree.memo["is_script"] = found
    return found


def cuda_facts(tree: TreeCache, qualnames: QualNames) -> CudaFacts:
    facts = tree.memo.get("cuda_facts")
    if not isinstance(facts, CudaFacts):
        facts = tree.memo["cuda_facts"] = CudaFacts(tree, qualnames)
    return facts
