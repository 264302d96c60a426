"""XLA157: weights that modules share stay shared on the XLA device;
XLA133: an optimizer made before its module moves keeps its parameters.

A language model often ties its output layer to its embedding
(``self.lm_head.weight = self.wte.weight``: one ``Parameter`` held by two
modules).  ``module.to(device)`` keeps a parameter's identity only where it
can convert it in place; from the CPU to an XLA device it cannot, and makes a
new ``Parameter`` for every module that holds one -- so the tie silently
becomes two weights, trained apart (pytorch/xla#2719, #7042; seen on
nanoGPT, whose checkpoint then held one more tensor than on CUDA).  The
module that ties them turns on PyTorch's swapping conversion when it is
imported -- ``torch.__future__.set_swap_module_params_on_conversion(True)``
-- so that ``.to()`` swaps each parameter in place and the tie holds.

A transformers model moved to the XLA device by the program (GPT-2's output
layer shares the token embedding) is untied the same way, inside a package
the program does not own: it is re-tied right after the move with the
library's own ``model.tie_weights()`` (measured on transformers 4.57: 17
parameters after ``.to("xla")`` instead of 16, ``lm_head`` a copy).
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from codemods.analysis.prefilter import (
    CALLS_LIBRARY, LIBRARY, RETIE_METHODS, TIE_ATTRS, TIED_WEIGHTS as TIED, is_library_model, is_tie,
)
from codemods.analysis.dataflow import dataflow
from codemods.analysis.project import calls, imported_modules
from codemods.analysis.values import DEVICE, DEVICE_STR, values as values_of
from codemods.base import Rule, XlaCodemod, call_name, dotted, find_all, statement
from codemods.syntax.imports import head_length

SWAP = "torch.__future__.set_swap_module_params_on_conversion"
_OLD_WEIGHT_NORM = "torch.nn.utils.weight_norm"  # (its computed weight holds its parameters: they cannot be swapped)
_LIBRARY = LIBRARY + "."

TIED_WEIGHTS = Rule(
    code="XLA157",
    name="tied-weights",
    summary="weights shared between modules (`self.head.weight = self.embed.weight`) stay shared on the XLA device",
    why=(
        "`module.to(device)` keeps a parameter's identity only where it can convert it in place. From the CPU to "
        "an XLA device it cannot, and it makes a new `Parameter` for each module that holds one: a weight tied "
        "between two modules (an embedding and the output layer of a language model) silently becomes two, "
        "trained apart (pytorch/xla#2719). The module that ties them turns on PyTorch's swapping conversion "
        "where it is imported (`torch.__future__.set_swap_module_params_on_conversion(True)`): `.to()` then "
        "swaps each parameter in place and the tie holds. Ties written in a class (`self.a.weight = "
        "self.b.weight`) are found. A transformers model the program moves to the device (GPT-2's output "
        "layer shares the token embedding) is re-tied right after the move with its own `tie_weights()`. Where "
        "the module, or a project module it imports, uses the old `torch.nn.utils.weight_norm` (its weights "
        "cannot be swapped: `.to()` would fail), the tie is reported instead."
    ),
    before=(
        "import torch\nimport torch.nn as nn\n\n\nclass LM(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.embed = nn.Embedding(10, 4)\n"
        "        self.head = nn.Linear(4, 10, bias=False)\n        self.head.weight = self.embed.weight\n"
    ),
    after=(
        "import torch\nimport torch.nn as nn\n\n" + SWAP + "(True)\n\n\nclass LM(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.embed = nn.Embedding(10, 4)\n"
        "        self.head = nn.Linear(4, 10, bias=False)\n        self.head.weight = self.embed.weight\n"
    ),
    valid=(
        # a transformers model moved and re-tied already
        "import torch_xla\nfrom transformers import GPT2LMHeadModel\n\n"
        "model = GPT2LMHeadModel.from_pretrained('gpt2').to(torch_xla.device())\nmodel.tie_weights()\n",
        # already swapping
        "import torch\n\n" + SWAP + "(True)\n\n\nclass LM:\n    def tie(self):\n"
        "        self.head.weight = self.embed.weight\n",
        # a parameter of its own, not another module's
        "import torch\n\n\nclass Layer:\n    def __init__(self, weight):\n        self.weight = weight\n"
        "        self.proj.weight = torch.nn.Parameter(weight)\n",
    ),
)


EARLY_OPTIMIZER = Rule(
    code="XLA133",
    name="optimizer-before-move",
    summary="an optimizer made over a module's parameters before the module moves to the XLA device keeps them",
    why=(
        "From the CPU to an XLA device `module.to()` gives the module new `Parameter`s (to CUDA it converts them "
        "in place). An optimizer built over `self.parameters()` in a module's constructor, or over "
        "`model.parameters()` before `model.to(device)`, holds the old CPU parameters: it steps them, the model "
        "on the device never changes, and training silently does nothing (pytorch/examples' "
        "mnist_forward_forward did not train on XLA). The module turns on PyTorch's swapping conversion, as for "
        "tied weights (XLA157), so that `.to()` keeps every parameter the optimizer holds. Where the module uses "
        "the old `torch.nn.utils.weight_norm` (or a project module it imports does), whose weights cannot be "
        "swapped, it is reported instead."
    ),
    before=(
        "import torch\nimport torch.nn as nn\n\n\nclass Layer(nn.Linear):\n    def __init__(self, n):\n"
        "        super().__init__(n, n)\n        self.opt = torch.optim.Adam(self.parameters())\n"
    ),
    after=(
        "import torch\nimport torch.nn as nn\n\n" + SWAP + "(True)\n\n\nclass Layer(nn.Linear):\n"
        "    def __init__(self, n):\n        super().__init__(n, n)\n        self.opt = torch.optim.Adam(self.parameters())\n"
    ),
    valid=(
        "import torch\n\nmodel = Net().to(device)\nopt = torch.optim.Adam(model.parameters())\n",

        "import torch\n\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    ),
)


class TiedWeights(XlaCodemod):
    DESCRIPTION = "Keep the parameters modules share or optimizers hold when the model moves to the XLA device."
    RESPECTS_HAND_PORTS = True  # a module that supports XLA already may re-tie by hand (transformers does)
    RULES = (TIED_WEIGHTS, EARLY_OPTIMIZER)
    TRIGGERS = (*(f"{name} = self.".encode() for name in TIE_ATTRS), LIBRARY.encode(), b"parameters()")
    NEEDS = (TIED, f"{CALLS_LIBRARY}&name:to", "name:parameters&name:optim")

    @classmethod
    def wanted(cls, tree, options):
        return bool(_ties_here(tree) or library_moves(tree) or early_optimizers(tree))

    def regions(self, tree):
        self._ties = _ties_here(tree)
        self._moves = {id(stmt): name for stmt, name in library_moves(tree)}
        self._early = early_optimizers(tree)
        return self._ties + [stmt for stmt, _ in library_moves(tree)] + self._early

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        body = self._retied(original_node.body, updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._retied(original_node.body, updated_node.body)
        if body is not None:
            updated_node = updated_node.with_changes(body=body)
        blocked = self._cannot_swap()
        done = (f"; not rewritten: {blocked}" if blocked else "; parameters are swapped in place instead")
        flagged = [self.flag(tie, TIED_WEIGHTS.code, f"`{_text(tie)}` ties a weight between modules: `.to(<XLA "
                             f"device>)` would untie it{done}", fix=not blocked)
                   for tie in self._ties]
        flagged += [self.flag(stmt, EARLY_OPTIMIZER.code, "an optimizer made before its module moves to the XLA "
                              "device: `.to()` would give the module new parameters and the optimizer would step "
                              f"the old ones{done}", fix=not blocked)
                    for stmt in self._early]
        if blocked or not any(flagged):
            return updated_node
        self.add_imports((("torch", None, None),))
        body = list(updated_node.body)
        at = _after_imports(updated_node)
        call = statement(cst.Call(func=cst.parse_expression(SWAP), args=[cst.Arg(cst.Name("True"))]))
        body.insert(at, call.with_changes(leading_lines=[cst.EmptyLine()] if at else []))
        return updated_node.with_changes(body=body)

    def _cannot_swap(self) -> str:
        """Why the swapping conversion cannot be turned on here ("" where it
        can): the old ``torch.nn.utils.weight_norm`` keeps a computed weight
        that holds its parameters, and ``.to()`` then fails ("Couldn't swap
        Linear.weight_g"; its ``parametrizations`` successor swaps)."""
        where = "here" if any(_OLD_WEIGHT_NORM in self.qualnames(c.func) for c in self.tree.nodes((cst.Call,))) \
            else next((f"in `{module}`, which this module imports" for module, path in imported_modules(
                self.tree.filename, self.tree.source).items() if calls(path, _OLD_WEIGHT_NORM)), None)
        if where is None:
            return ""
        return (f"`torch.nn.utils.weight_norm` is used {where}, and its weights cannot be swapped (`.to()` would "
                "fail); use `torch.nn.utils.parametrizations.weight_norm`, or build the optimizer (or tie the "
                "weights again) after the move")

    def _retied(self, old, new) -> Optional[list]:
        """``new`` with ``model.tie_weights()`` after each statement that
        moves a transformers model to the device (unless the next one does)."""
        if not any(id(stmt) in self._moves for stmt in old):
            return None
        out: list = []
        for k, (before, after) in enumerate(zip(old, new)):
            out.append(after)
            name = self._moves.get(id(before))
            if name is None or (k + 1 < len(old) and _retie_of(old[k + 1]) == name):
                continue
            if self.flag(before, TIED_WEIGHTS.code, f"`{name}` is a transformers model moved to the XLA device: "
                         "`.to()` unties its tied weights there (the output layer gets a copy of the embedding); "
                         f"re-tied after the move (`{name}.tie_weights()`)", fix=True):
                out.append(statement(cst.Call(func=cst.parse_expression(f"{name}.tie_weights"))))
        return out


def early_optimizers(tree) -> List[cst.CSTNode]:
    """The statements that build a ``torch.optim`` optimizer over a module's
    parameters before that module can have moved: over ``self.parameters()``
    in a class's methods (made with the module), or over ``m.parameters()``
    with a later statement of the same block moving ``m`` (``m.to(...)``)."""
    key = "tied_weights:optimizers"
    if key in tree.memo:
        return tree.memo[key]  # type: ignore[no-any-return]
    found: List[cst.CSTNode] = []
    if not any(dotted(c.func) == SWAP for c in tree.nodes((cst.Call,))):  # (not swapping already)
        for call in tree.nodes((cst.Call,)):
            owner = _optimized(call, tree)
            if owner is None:
                continue
            stmt = tree.statement_of(call)
            if (_in_class(tree, call) if owner == "self" else _moved_later(tree, stmt, owner)) and stmt not in found:
                found.append(stmt)
    tree.memo[key] = found
    return found


def _optimized(call: cst.Call, tree) -> Optional[str]:
    """``m`` for ``torch.optim.X(m.parameters(), ...)``."""
    if not any(q.startswith("torch.optim.") and ".lr_scheduler." not in q for q in tree.import_qualnames(call.func) or ()):
        return None
    params = next((a.value for a in call.args if (a.keyword is None) or a.keyword.value == "params"), None)
    if isinstance(params, cst.Call) and isinstance(params.func, cst.Attribute) and \
            params.func.attr.value in ("parameters", "named_parameters"):
        return dotted(params.func.value)
    return None


def _in_class(tree, node: cst.CSTNode) -> bool:
    return any(isinstance(a, cst.ClassDef) for a in dataflow(tree).ancestors(node))


def _moved_later(tree, stmt: cst.CSTNode, owner: str) -> bool:
    block = tree.parents.get(id(stmt))
    body = list(getattr(block, "body", ()))
    later = body[body.index(stmt) + 1:] if stmt in body else []
    return any(isinstance(c.func, cst.Attribute) and c.func.attr.value in ("to", "cuda") and dotted(c.func.value) == owner
               for s in later for c in find_all(s, cst.Call))


def _after_imports(module: cst.Module) -> int:
    """Where a statement goes that must run on import, before any model is
    made, without putting an import after it (E402): after the last
    statement before the first ``def``/``class`` that imports something
    (an import line, or a ``try``/``if`` around imports); after the
    docstring and the imports at the top when there is none."""
    last = head_length(module)
    for i, stmt in enumerate(module.body):
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            break
        if find_all(stmt, (cst.Import, cst.ImportFrom), stop=(cst.FunctionDef, cst.ClassDef)):
            last = max(last, i + 1)
    return last


def _ties_here(tree) -> List[cst.SimpleStatementLine]:
    key = "tied_weights:ties"
    if key not in tree.memo:
        tree.memo[key] = [] if any(dotted(c.func) == SWAP for c in find_all(tree.module, cst.Call)) \
            else ties(tree.module)
    return tree.memo[key]  # type: ignore[return-value]


def library_moves(tree) -> List[tuple]:
    """``(statement, name)`` for each statement that moves a transformers
    model to a device: ``model.to(device)``, ``model = model.to(device)``,
    ``model = AutoModel.from_pretrained(...).to(device)`` (``name``: the
    model, as the statement spells it)."""
    key = "tied_weights:moves"
    if key in tree.memo:
        return tree.memo[key]  # type: ignore[return-value]
    found: List[tuple] = []
    if b"transformers" in (tree.source or b"transformers"):
        flow = dataflow(tree)
        for line in find_all(tree.module, cst.SimpleStatementLine):
            moved = _moved(line, flow, tree)
            if moved is not None:
                found.append((line, moved))
    tree.memo[key] = found
    return found


def _moved(line: cst.SimpleStatementLine, flow, tree) -> Optional[str]:
    if len(line.body) != 1:
        return None
    small = line.body[0]
    call = getattr(small, "value", None)
    if not (isinstance(call, cst.Call) and call_name(call) == "to" and isinstance(call.func, cst.Attribute)
            and call.args and call.args[0].keyword is None and values_of(tree).of(call.args[0].value) & {DEVICE, DEVICE_STR}):
        return None
    if isinstance(small, cst.Assign):
        if len(small.targets) != 1 or not isinstance(small.targets[0].target, (cst.Name, cst.Attribute)):
            return None
        name = dotted(small.targets[0].target)
    elif isinstance(small, cst.Expr):
        name = dotted(call.func.value)
    else:
        return None
    return name if name and _from_library(call.func.value, flow, tree) is True else None


def _from_library(node: cst.CSTNode, flow, tree, seen: frozenset = frozenset()) -> Optional[bool]:
    """``node`` holds a model a transformers call made (through names,
    ``self.x`` stores and ``.to()``/``.eval()`` chains); None where the
    value leads back to itself (``self.m = self.m.to(d)``)."""
    if id(node) in seen:
        return None
    seen = seen | {id(node)}
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Attribute) and call_name(node) in ("to", "eval", "train", "float", "half"):
            return _from_library(node.func.value, flow, tree, seen)
        return any(q.startswith(_LIBRARY) and is_library_model(q[len(_LIBRARY):])
                   for q in tree.import_qualnames(node.func) or ())
    if isinstance(node, cst.Name):
        values = [flow.source(b)[0] for b in flow.reaching(node)]
    elif isinstance(node, cst.Attribute) and dotted(node.value) == "self":
        values = list(flow.self_stores(node))
        seen = seen | {id(v) for v in values if _reads(v, dotted(node))}  # its own update
    else:
        return False
    found = [None if v is None else _from_library(v, flow, tree, seen) for v in values]
    return any(f is True for f in found) and not any(f is False for f in found)


def _reads(value: cst.CSTNode, name: Optional[str]) -> bool:
    """``value`` is a chain on ``name`` (``self.m.to(d)``)."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        value = value.func.value
    return dotted(value) == name


def _retie_of(stmt: cst.CSTNode) -> Optional[str]:
    body = getattr(stmt, "body", ())
    call = getattr(body[0], "value", None) if isinstance(stmt, cst.SimpleStatementLine) and len(body) == 1 else None
    if isinstance(call, cst.Call) and call_name(call) == "tie_weights" and isinstance(call.func, cst.Attribute):
        return dotted(call.func.value)
    return None


def ties(module: cst.Module) -> List[cst.SimpleStatementLine]:
    """The statements of the module's classes that give one module's weight
    (or bias) to another: ``self.a.weight = self.b.weight`` -- in classes
    without a re-tie method of their own (``RETIE_METHODS``)."""
    found: List[cst.SimpleStatementLine] = []
    seen = set()
    for cls in find_all(module, cst.ClassDef):
        body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()  # type: ignore[attr-defined]
        if any(isinstance(m, cst.FunctionDef) and m.name.value in RETIE_METHODS for m in body):
            continue  # it re-ties them itself when asked (transformers' `_tie_weights`, called by tie_weights())
        for line in find_all(cls, cst.SimpleStatementLine):
            if id(line) not in seen and _tie(line) is not None:
                seen.add(id(line))
                found.append(line)  # type: ignore[arg-type]
    return found


def _tie(line: cst.CSTNode) -> Optional[cst.Assign]:
    body = getattr(line, "body", ())
    if len(body) != 1 or not isinstance(body[0], cst.Assign) or len(body[0].targets) != 1:
        return None
    target, value = body[0].targets[0].target, body[0].value
    if isinstance(target, cst.Attribute) and is_tie(dotted(target) or "", dotted(value) or ""):
        return body[0]
    return None


def _text(line: cst.CSTNode) -> str:
    assign = _tie(line)
    return f"{dotted(assign.targets[0].target)} = {dotted(assign.value)}" if assign is not None else ""
