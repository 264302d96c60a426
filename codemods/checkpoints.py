"""XLA131, XLA132: checkpoints that load and save across devices.

``torch.load(path, map_location=<an XLA device>)`` fails ("don't know how to
restore data location ... tagged with xla:0"), and so does a CUDA
``map_location`` on a TPU host.  Loading to ``"cpu"`` always works, and
``load_state_dict`` (of a module or an optimizer) then moves each tensor to
where its parameter lives.  Saving device state with ``torch.save`` writes
XLA tensors that load back only onto XLA; ``xm.save`` moves them to the CPU
first and writes once, from the master process.
"""

from __future__ import annotations

from typing import List, Set

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.values import MODULE, values
from codemods.base import Rule, XlaCodemod, call_name, dotted, find_all, string_value
from codemods.syntax.edits import DropsStatements
from codemods.syntax.nodes import keyword_arg, with_arg

MAP_LOCATION = Rule(
    code="XLA131",
    name="map-location",
    summary='`torch.load(..., map_location=<device>)` -> `map_location="cpu"`',
    why=(
        "torch.load cannot restore tensors onto an XLA device, and a CUDA `map_location` (a "
        "string, a device, or a lambda calling `.cuda()`) fails on a TPU host. Loading to the CPU "
        "always works; `load_state_dict` then copies each tensor to its parameter's device. A "
        "function's `loc = \"cuda:{}\".format(gpu)` made only for that `map_location` goes with it. A "
        "`torch.load` with no `map_location` gets `map_location=\"cpu\"`: a checkpoint the original saved on its GPU "
        "holds CUDA tensors, which cannot be loaded where there is no CUDA; one saved from the CPU loads as before."
    ),
    before=(
        "import torch\n\nckpt = torch.load(path, map_location=device)\nmodel.load_state_dict(ckpt[\"model\"])\n"
        "opt_state = torch.load(path, map_location=lambda storage, loc: storage.cuda())\n\n\n"
        "def resume(path, gpu):\n    loc = \"cuda:{}\".format(gpu)\n    return torch.load(path, map_location=loc)\n"
        "\n\nstate = torch.load(\"last.pt\")\n"
    ),
    after=(
        "import torch\n\nckpt = torch.load(path, map_location=\"cpu\")\nmodel.load_state_dict(ckpt[\"model\"])\n"
        "opt_state = torch.load(path, map_location=\"cpu\")\n\n\n"
        "def resume(path, gpu):\n    return torch.load(path, map_location=\"cpu\")\n"
        "\n\nstate = torch.load(\"last.pt\", map_location=\"cpu\")\n"
    ),
    valid=("import torch\n\nckpt = torch.load(path, map_location=\"cpu\")\n",),
)

XM_SAVE = Rule(
    code="XLA132",
    name="xm-save",
    summary="`torch.save` of model/optimizer state -> `xm.save`",
    why=(
        "`torch.save` of a state dict taken on the XLA device pickles XLA tensors, which load back "
        "only where torch_xla runs, and every process writes the file. `xm.save` moves the tensors "
        "to the CPU first and writes from the master process only. Only saves of state (a "
        "`state_dict()`, directly or in a dict built in the same function) are rewritten."
    ),
    before=(
        "import torch\n\ncheckpoint = {\"model\": model.state_dict(), \"step\": step}\n"
        "torch.save(checkpoint, \"ckpt.pt\")\n"
    ),
    after=(
        "import torch\nimport torch_xla.core.xla_model as xm\n\n"
        "checkpoint = {\"model\": model.state_dict(), \"step\": step}\nxm.save(checkpoint, \"ckpt.pt\")\n"
    ),
    valid=("import torch\n\ntorch.save(stats, \"stats.pt\")\n",),
)


class Checkpoints(DropsStatements, XlaCodemod):
    DESCRIPTION = "Load checkpoints to the CPU; save device state with xm.save."
    RESPECTS_HAND_PORTS = True
    RULES = (MAP_LOCATION, XM_SAVE)
    TRIGGERS = (b"torch.load", b"torch.save", b"map_location", b"load(", b"save(")
    NEEDS = ("torch:load", "torch:save")  # torch.load/torch.save, however imported (see regions)

    def regions(self, tree):
        found = tree.statements_where(lambda n: n.value in ("load", "save"), (cst.Name,))
        # and where a name given as a `map_location` is bound (`_drop_location`)
        locations = [a.value for a in tree.nodes((cst.Arg,)) if isinstance(a.value, cst.Name)  # type: ignore[attr-defined]
                     and a.keyword is not None and a.keyword.value == "map_location"]  # type: ignore[attr-defined]
        bound = [tree.statement_of(b) for n in locations for b in binding_nodes(tree, n)]
        return list({id(s): s for s in found + bound}.values())

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        q = self.qualnames(original_node.func)
        if "torch.load" in q or "torch.serialization.load" in q:
            return self._load(original_node, updated_node)
        if ("torch.save" in q or "torch.serialization.save" in q) and self.target.save:
            return self._save(original_node, updated_node)
        return updated_node

    def _load(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if _without_location(original):
            # a checkpoint the original saved on its GPU holds CUDA tensors: loaded
            # as it is, it fails on a host without CUDA; to the CPU it loads
            # wherever the original's did (a CPU checkpoint is loaded as before)
            if not self.flag(original, MAP_LOCATION.code, 'map_location="cpu" added (a checkpoint saved on the '
                             'GPU holds CUDA tensors)', fix=True):
                return updated
            return with_arg(updated, keyword_arg("map_location", cst.SimpleString('"cpu"')))
        for i, a in enumerate(original.args):
            is_location = (a.keyword is not None and a.keyword.value == "map_location") or (
                a.keyword is None and not a.star and i == 1)
            if not is_location or string_value(a.value) == "cpu":
                continue
            model = self._loads_a_model(original)
            # a device the program chose (`map_location=device`, `args.device`) stays its choice: the
            # model goes where it said (CPU stays CPU; a CUDA choice is the device rules' to convert)
            chosen = updated.args[i].value if isinstance(a.value, (cst.Name, cst.Attribute)) else None
            where = f"`{cst.Module([]).code_for_node(chosen)}`" if chosen is not None else "the device"
            message = (f'map_location -> "cpu", then the model to {where} (it is used as a model)' if model
                       else 'map_location -> "cpu" (load_state_dict moves the tensors)')
            if self.flag(a.value, MAP_LOCATION.code, message, fix=True):
                args = list(updated.args)
                args[i] = args[i].with_changes(value=cst.SimpleString('"cpu"'))
                loaded = updated.with_changes(args=args)
                if not model:
                    return loaded
                if chosen is None:
                    self.add_imports(self.target.device_imports)
                return cst.Call(func=cst.Attribute(value=loaded, attr=cst.Name("to")),
                                args=[cst.Arg(chosen if chosen is not None else self.target.device_node())])
        return updated

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if id(original_node) in self._locations():
            self.drop(original_node)
        return updated_node

    def _locations(self) -> Set[int]:
        """The assignments ``loc = "cuda:{}".format(gpu)`` made only for a
        ``map_location`` that becomes ``"cpu"`` (pytorch/examples' imagenet):
        they go with it -- left, each is a variable assigned and never read
        (ruff's F841).  Decided before the pass reaches them."""
        if "_location_assigns" in self.__dict__:
            return self.__dict__["_location_assigns"]
        found: Set[int] = set()
        for arg in self.tree.nodes((cst.Arg,)):
            name, call = arg.value, self.parent(arg)  # type: ignore[attr-defined]
            if not (isinstance(name, cst.Name) and arg.keyword is not None  # type: ignore[attr-defined]
                    and arg.keyword.value == "map_location" and isinstance(call, cst.Call)  # type: ignore[attr-defined]
                    and self.qualnames(call.func) & {"torch.load", "torch.serialization.load"}
                    and self.enabled(MAP_LOCATION.code) and not self.is_suppressed(name, MAP_LOCATION.code)):
                continue
            bound = binding_nodes(self.tree, name)
            assign = self.parent(self.parent(bound[0])) if len(bound) == 1 else None
            if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                    and assign.targets[0].target is bound[0] and _text_only(assign.value)):
                continue
            scope = next((a for a in self.ancestors(assign) if isinstance(a, (cst.FunctionDef, cst.Module))), None)
            reads = [n for n in find_all(scope, cst.Name, stop=(cst.ClassDef,))  # type: ignore[arg-type]
                     if n.value == name.value and n is not bound[0]]  # type: ignore[attr-defined]
            if reads == [name] and isinstance(scope, cst.FunctionDef):
                found.add(id(assign))
        self.__dict__["_location_assigns"] = found
        return found

    def _loads_a_model(self, call: cst.Call) -> bool:
        """The loaded object is used as a model: called, or asked for what
        only a module has (``.eval()``, ``.parameters()``) -- directly, or
        through the name it is assigned to."""
        parent = self.parent(call)
        if isinstance(parent, cst.Attribute) and parent.attr.value in _MODULE_METHODS:
            return True
        if not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
            return False
        target = parent.targets[0].target
        if not isinstance(target, cst.Name):
            return False
        scope = next((a for a in self.ancestors(call) if isinstance(a, (cst.FunctionDef, cst.Module))), None)
        for use in find_all(scope, cst.Name, stop=(cst.ClassDef,)):  # type: ignore[arg-type]
            if use.value != target.value or use is target:  # type: ignore[attr-defined]
                continue
            up = self.parent(use)
            if isinstance(up, cst.Call) and up.func is use:
                return True
            if isinstance(up, cst.Attribute) and up.value is use and up.attr.value in _MODULE_METHODS:
                return True
        return False

    def _save(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if original.args and MODULE in values(self.tree).of(original.args[0].value):
            self.flag(original, XM_SAVE.code, "`torch.save` of a whole module: on XLA it pickles XLA tensors, "
                      "which load back only where torch_xla runs; save `model.state_dict()` with `xm.save` "
                      "(or move the model to the CPU first)", fix=False)
            return updated
        if not original.args or not self._is_state(original.args[0].value, original):
            return updated
        if not self.flag(original, XM_SAVE.code, "`torch.save` of device state -> `xm.save`", fix=True):
            return updated
        self.add_imports(self.target.save_imports)
        return updated.with_changes(func=cst.parse_expression(self.target.save))  # type: ignore[arg-type]

    def _is_state(self, value: cst.CSTNode, call: cst.Call) -> bool:
        """The value holds a ``state_dict()``: directly, or through a name
        assigned in the same function from something that does."""
        if _has_state_dict(value):
            return True
        name = dotted(value)
        if name is None:
            return False
        scope = next((a for a in self.ancestors(call) if isinstance(a, (cst.FunctionDef, cst.Module))), None)
        if scope is None:
            return False
        for assign in find_all(scope, cst.Assign, stop=(cst.FunctionDef, cst.ClassDef)):
            targets: List[str] = [dotted(t.target) or "" for t in assign.targets]  # type: ignore[attr-defined]
            if name in targets and _has_state_dict(assign.value):  # type: ignore[attr-defined]
                return True
        return False


_MODULE_METHODS = {"eval", "train", "parameters", "named_parameters", "modules", "children", "forward",
                   "half", "float", "bfloat16", "requires_grad_", "zero_grad", "generate"}


def _text_only(node: cst.CSTNode) -> bool:
    """A string made without side effects: a literal, an f-string, ``%`` or
    ``+`` of such, ``"...".format(...)`` of names and attributes."""
    if isinstance(node, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
        return not any(isinstance(n, cst.Call) for n in find_all(node, cst.Call))
    if isinstance(node, cst.BinaryOperation):
        return _text_only(node.left) and isinstance(node.right, (cst.Name, cst.Attribute, cst.Tuple, cst.Integer)) \
            or (_text_only(node.left) and _text_only(node.right))
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        return isinstance(node.func.value, cst.SimpleString) and all(
            isinstance(a.value, (cst.Name, cst.Attribute)) for a in node.args)
    return False


def _has_state_dict(node: cst.CSTNode) -> bool:
    return any(call_name(c) == "state_dict" for c in find_all(node, cst.Call))


def _without_location(call: cst.Call) -> bool:
    """``torch.load(path)``: a file and no ``map_location`` (nor a second
    positional argument, nor ``**kwargs`` that may hold one)."""
    positional = [a for a in call.args if a.keyword is None]
    return len(positional) == 1 and not positional[0].star and not any(
        a.keyword is not None and a.keyword.value == "map_location" for a in call.args)
