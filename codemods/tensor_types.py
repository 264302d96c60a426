"""XLA119: legacy CUDA tensor types become dtype-and-device forms.

Older programs make and cast tensors through the legacy type objects:
``torch.cuda.FloatTensor(n, 1)``, ``x.type(torch.cuda.LongTensor)``, and most
often through an alias chosen once (``Tensor = torch.cuda.FloatTensor if cuda
else torch.FloatTensor``).  Every one of them needs a CUDA driver, and XLA has
no legacy type objects.  What each use means is a dtype and a device:

* ``T(sizes...)`` -> ``torch.empty(sizes..., dtype=D, device=DEV)`` (the
  legacy constructor leaves the values unset, as ``torch.empty`` does);
* ``T(data)`` (a list, a tuple, an array made by a call) ->
  ``torch.tensor(data, dtype=D, device=DEV)``;
* ``x.type(T)`` -> ``x.to(device=DEV, dtype=D)``;
* ``torch.set_default_tensor_type("torch.cuda.FloatTensor")`` ->
  ``torch.set_default_device(DEV)`` (float32 being the default dtype).

``DEV`` is the XLA device for a CUDA type, and for an alias chosen by a
condition it follows that condition (``DEV if cuda else "cpu"``), so a user's
CPU choice stays CPU.  An alias is converted only when every use of it is one
of these: its binding then goes.  Anything else (``isinstance(x, T)``, an
argument that may be a size or data, an alias handed on) is left, and the
catch-all reports it -- and a CUDA test that would switch it on is kept
(XLA118).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.cuda import AVAILABILITY
from codemods.base import Rule, XlaCodemod, dotted, string_value
from codemods.syntax import imports
from codemods.syntax.edits import DropsStatements
from codemods.syntax.nodes import comma_separated, keyword_arg

LEGACY_TYPES = {"FloatTensor": "float32", "DoubleTensor": "float64", "HalfTensor": "float16",
                "BFloat16Tensor": "bfloat16", "ByteTensor": "uint8", "CharTensor": "int8", "ShortTensor": "int16",
                "IntTensor": "int32", "LongTensor": "int64", "BoolTensor": "bool"}

TENSOR_TYPE = Rule(
    code="XLA119",
    name="cuda-tensor-type",
    summary="legacy CUDA tensor types (`torch.cuda.FloatTensor`, aliases of them) -> dtype and device",
    why=(
        "`torch.cuda.FloatTensor(n, 1)`, `x.type(torch.cuda.LongTensor)` and an alias such as `Tensor = "
        "torch.cuda.FloatTensor if cuda else torch.FloatTensor` need a CUDA driver (\"Found no NVIDIA driver\" "
        "on a TPU host), and XLA has no legacy type objects. Each use is a dtype and a device: a constructor "
        "with sizes becomes `torch.empty(..., dtype=, device=)`, one with data `torch.tensor(...)`, and "
        "`x.type(T)` becomes `x.to(device=, dtype=)`. An alias's device follows the condition that chose it, "
        "so a CPU choice stays CPU; the alias goes once all its uses are converted. Uses xlaport cannot read "
        "(`isinstance`, an argument that may be a size or data) are left and reported. "
        "`torch.set_default_tensor_type(\"torch.cuda.FloatTensor\")` becomes `torch.set_default_device(<device>)` "
        "(float32 is the default dtype); another CUDA default type is left, and reported."
    ),
    before=(
        "import torch\n\ncuda = torch.cuda.is_available()\n"
        "Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor\n"
        "valid = Tensor(imgs.size(0), 1).fill_(1.0)\nz = Tensor(np.random.normal(0, 1, (4, 8)))\n"
        "real = imgs.type(Tensor)\nlabels = torch.cuda.LongTensor([1, 2])\n"
    ),
    after=(
        "import torch\nimport torch_xla\n\ncuda = torch.cuda.is_available()\n"
        "valid = torch.empty(imgs.size(0), 1, dtype=torch.float32, device=torch_xla.device() if cuda else "
        "\"cpu\").fill_(1.0)\n"
        "z = torch.tensor(np.random.normal(0, 1, (4, 8)), dtype=torch.float32, device=torch_xla.device() if cuda "
        "else \"cpu\")\n"
        "real = imgs.to(device=torch_xla.device() if cuda else \"cpu\", dtype=torch.float32)\n"
        "labels = torch.tensor([1, 2], dtype=torch.int64, device=torch_xla.device())\n"
    ),
    valid=("import torch\n\nx = torch.FloatTensor(2, 3)\n",),
)


@dataclass
class _Alias:
    """A name bound once to a legacy CUDA type, or to a choice between it and
    the host type of the same dtype."""

    binding: cst.Assign
    dtype: str
    test: Optional[cst.BaseExpression]  # the choice's condition (None: always CUDA)
    cuda_when: bool  # the CUDA type is taken when ``test`` is true
    others: Tuple[cst.Assign, ...] = ()  # the host type's binding, where an if/else statement chooses

    def bindings(self) -> Tuple[cst.Assign, ...]:
        return (self.binding, *self.others)


class TensorTypes(DropsStatements, XlaCodemod):
    DESCRIPTION = "Convert legacy CUDA tensor types (torch.cuda.FloatTensor and aliases) to dtype and device."
    RESPECTS_HAND_PORTS = True
    RULES = (TENSOR_TYPE,)
    TRIGGERS = (b"Tensor",)
    NEEDS = ("code~cuda",)

    def regions(self, tree):
        self._types: Dict[int, Tuple[str, bool]] = {}  # id of a legacy type reference -> (dtype, CUDA?)
        for n in tree.nodes((cst.Attribute, cst.Name)):
            found = self._legacy(n)
            if found is not None:
                self._types[id(n)] = found
        self._alias_of: Dict[int, _Alias] = {}
        self._aliases = self._find_aliases(tree) if self._types else {}
        return tree.statements_where(lambda n: n.value in LEGACY_TYPES or n.value in self._aliases
                                     or n.value == "set_default_tensor_type", (cst.Name,))

    def _legacy(self, node: cst.CSTNode) -> Optional[Tuple[str, bool]]:
        if isinstance(node, cst.Name) and node.value not in LEGACY_TYPES and node.value != "Tensor":
            return None
        if isinstance(node, cst.Attribute) and node.attr.value not in LEGACY_TYPES and node.attr.value != "Tensor":
            return None
        for q in self.tree.import_qualnames(node) or ():
            module, _, last = q.rpartition(".")
            if last in LEGACY_TYPES and module in ("torch.cuda", "torch"):
                return LEGACY_TYPES[last], module == "torch.cuda"
            if q == "torch.Tensor":  # the host type of the default dtype
                return "float32", False
        return None

    # -- aliases --------------------------------------------------------------
    def _find_aliases(self, tree) -> Dict[str, List[_Alias]]:  # type: ignore[no-untyped-def]
        """The aliases whose every use this rule converts, by name; each use
        of them (``self._alias_of``: id of the use -> its alias)."""
        from codemods.analysis.bindings import binding_nodes

        found: Dict[int, _Alias] = {}  # id of the alias's target Name -> alias
        for node in tree.nodes((cst.Assign,)):
            if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):  # type: ignore[attr-defined]
                alias = self._alias(node)  # type: ignore[arg-type]
                if alias is not None:
                    found[id(node.targets[0].target)] = alias  # type: ignore[attr-defined]
        for node in tree.nodes((cst.If,)):
            for alias in self._chosen(node):  # type: ignore[arg-type]
                found.update((id(b.targets[0].target), alias) for b in alias.bindings())
        names = {a.binding.targets[0].target.value for a in found.values()}  # type: ignore[attr-defined]
        found_aliases = list({id(a): a for a in found.values()}.values())
        uses: Dict[int, List[cst.Name]] = {id(a): [] for a in found_aliases}
        spoiled: Set[int] = set()
        for n in tree.nodes((cst.Name,)):
            if n.value not in names or _binds(n, tree.parents):  # type: ignore[attr-defined]
                continue
            reaching = binding_nodes(tree, n)  # type: ignore[arg-type]
            ours = [found[id(b)] for b in reaching if id(b) in found]
            if len({id(a) for a in ours}) == 1 and len(ours) == len(reaching) and self._use(n):
                uses[id(ours[0])].append(n)  # type: ignore[arg-type]
            else:  # another binding may reach it, or a use this rule cannot convert
                spoiled.update(id(a) for a in ours)
        self._alias_of = {id(u): a for a in found_aliases if id(a) not in spoiled for u in uses[id(a)]}
        kept: Dict[str, List[_Alias]] = {}
        for alias in found_aliases:
            if id(alias) not in spoiled:
                kept.setdefault(alias.binding.targets[0].target.value, []).append(alias)  # type: ignore[attr-defined]
        return kept

    def _alias(self, node: cst.Assign) -> Optional[_Alias]:
        value = node.value
        direct = self._types.get(id(value))
        if direct is not None:
            return _Alias(node, direct[0], None, True) if direct[1] else None
        if not isinstance(value, cst.IfExp) or not self._pure(value.test):
            return None  # (the condition is repeated at each use)
        body, orelse = self._types.get(id(value.body)), self._types.get(id(value.orelse))
        if body is None or orelse is None or body[0] != orelse[0] or body[1] == orelse[1]:
            return None
        return _Alias(node, body[0], value.test, body[1])

    def _chosen(self, node: cst.If) -> List[_Alias]:
        """``if cuda: T = torch.cuda.FloatTensor`` / ``else: T =
        torch.FloatTensor`` (each at its branch's own level; either way
        round): one alias, chosen by the test as an ``IfExp`` would."""
        if not isinstance(node.orelse, cst.Else) or not self._pure(node.test):
            return []

        def types(block: cst.BaseSuite) -> Dict[str, Tuple[cst.Assign, Tuple[str, bool]]]:
            out: Dict[str, Tuple[cst.Assign, Tuple[str, bool]]] = {}
            for stmt in block.body if isinstance(block, cst.IndentedBlock) else ():
                assign = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
                if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and \
                        isinstance(assign.targets[0].target, cst.Name) and id(assign.value) in self._types:
                    out[assign.targets[0].target.value] = (assign, self._types[id(assign.value)])
            return out

        then, other = types(node.body), types(node.orelse.body)
        chosen = []
        for name in then.keys() & other.keys():
            (a, (dtype_a, cuda_a)), (b, (dtype_b, cuda_b)) = then[name], other[name]
            if dtype_a == dtype_b and cuda_a != cuda_b:
                cuda, host = (a, b) if cuda_a else (b, a)
                chosen.append(_Alias(cuda, dtype_a, node.test, cuda_a, (host,)))
        return chosen

    def _pure(self, test: cst.CSTNode) -> bool:
        """A condition that may be evaluated again at each use: a name, an
        attribute, an accelerator availability test, ``not``/``and``/``or`` of them."""
        if isinstance(test, (cst.Name, cst.Attribute)):
            return True
        if isinstance(test, cst.Call):
            return not test.args and bool((self.tree.import_qualnames(test.func) or set()) & AVAILABILITY)
        if isinstance(test, cst.UnaryOperation):
            return self._pure(test.expression)
        if isinstance(test, cst.BooleanOperation):
            return self._pure(test.left) and self._pure(test.right)
        return False

    def _use(self, name: cst.CSTNode) -> Optional[str]:
        """How ``name`` (a legacy type or an alias) is used, where this rule
        converts it: "new" (constructed), "cast" (``x.type(T)``); else None."""
        up = self.tree.parents.get(id(name))
        if isinstance(up, cst.Call) and up.func is name and _arguments(up, self.tree) is not None:
            return "new"
        if isinstance(up, cst.Arg) and up.keyword is None:
            call = self.tree.parents.get(id(up))
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "type" \
                    and len(call.args) == 1:
                return "cast"
        return None

    # -- rewriting ------------------------------------------------------------
    def _kind(self, node: cst.CSTNode) -> Optional[Tuple[str, Optional[cst.BaseExpression]]]:
        """(dtype, device) of a CUDA legacy type or an alias; None otherwise."""
        found = self._types.get(id(node))
        if found is not None:
            return (found[0], self._device()) if found[1] else None
        alias = self._alias_of.get(id(node))
        if alias is not None:
            if alias.test is None:
                return alias.dtype, self._device()
            host = cst.SimpleString('"cpu"')
            on, off = (self._device(), host) if alias.cuda_when else (host, self._device())
            return alias.dtype, cst.IfExp(test=alias.test.deep_clone(), body=on, orelse=off)
        return None

    def _device(self) -> cst.BaseExpression:
        self.add_imports(self.target.device_imports)
        return self.target.device_node()

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if "torch.set_default_tensor_type" in (self.tree.import_qualnames(func) or ()):
            return self._default_type(original_node, updated_node)
        if self._use(func) == "new":
            kind = self._kind(func)
            if kind is None or not self.flag(original_node, TENSOR_TYPE.code, f"`{dotted(func)}(...)` -> a "
                                             f"tensor of torch.{kind[0]} on the device", fix=True):
                return updated_node
            args, data = _arguments(original_node, self.tree)  # type: ignore[misc]
            maker = "torch.tensor" if data else "torch.empty"
            extra = [keyword_arg("dtype", cst.parse_expression(f"torch.{kind[0]}")), keyword_arg("device", kind[1])]  # type: ignore[arg-type]
            return cst.Call(func=cst.parse_expression(maker), args=comma_separated([*updated_node.args, *extra]))
        if isinstance(func, cst.Attribute) and func.attr.value == "type" and len(original_node.args) == 1:
            target = original_node.args[0].value
            kind = self._kind(target) if self._use(target) == "cast" else None
            if kind is None or not self.flag(original_node, TENSOR_TYPE.code, f"`.type({dotted(target)})` -> "
                                             f"`.to(device=..., dtype=torch.{kind[0]})`", fix=True):
                return updated_node
            extra = [keyword_arg("device", kind[1]), keyword_arg("dtype", cst.parse_expression(f"torch.{kind[0]}"))]  # type: ignore[arg-type]
            return updated_node.with_changes(func=updated_node.func.with_changes(attr=cst.Name("to")),  # type: ignore[attr-defined]
                                             args=comma_separated(extra))
        return updated_node

    def _default_type(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``torch.set_default_tensor_type("torch.cuda.FloatTensor")`` (or the
        type itself) -> ``torch.set_default_device(DEV)``: float32 is the
        default dtype already; other CUDA types are left (the catch-all
        reports them, and a CUDA test that switches them on is kept)."""
        arg = original.args[0].value if len(original.args) == 1 and original.args[0].keyword is None else None
        named = string_value(arg) if arg is not None else None
        kind = self._types.get(id(arg)) if arg is not None else None
        if named != "torch.cuda.FloatTensor" and kind != ("float32", True):
            return updated
        if not self.flag(original, TENSOR_TYPE.code, "`set_default_tensor_type(torch.cuda.FloatTensor)` -> "
                         "`set_default_device(<device>)` (float32 is the default dtype)", fix=True):
            return updated
        return cst.Call(func=cst.parse_expression("torch.set_default_device"), args=[cst.Arg(self._device())])

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        """An alias whose every use was converted goes."""
        target = original_node.targets[0].target if len(original_node.targets) == 1 else None
        if isinstance(target, cst.Name) and any(original_node in a.bindings() for a in self._aliases.get(target.value, ())) \
                and self.flag(original_node, TENSOR_TYPE.code, f"`{target.value}` (a legacy tensor type) removed: "
                              "its uses take a dtype and a device", fix=True):
            self.drop(original_node)
        return updated_node


    def leave_If(self, original_node: cst.If, updated_node: cst.If):  # type: ignore[no-untyped-def]
        """An ``if``/``else`` that only chose an alias, both of whose
        bindings went, goes too (its test is a name or an availability test:
        nothing is lost)."""
        if not isinstance(original_node.orelse, cst.Else):
            return updated_node
        stmts = [s for block in (original_node.body, original_node.orelse.body)
                 for s in (block.body if isinstance(block, cst.IndentedBlock) else ())]
        dropped = self.__dict__.get("_dropped") or set()
        if stmts and all(isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1 and id(st.body[0]) in dropped
                         for st in stmts):
            return self.emptied(updated_node)
        return updated_node


def _arguments(call: cst.Call, tree) -> Optional[Tuple[List[cst.Arg], bool]]:  # type: ignore[no-untyped-def]
    """A legacy constructor's arguments and whether they are data (True) or
    sizes (False); None where that cannot be told from the code."""
    args = list(call.args)
    if any(a.keyword is not None for a in args):
        return None
    if not args or len(args) > 1 or args[0].star:
        return args, False
    data = _is_data(args[0].value, tree, 0)
    return None if data is None else (args, data)


def _is_data(node: cst.CSTNode, tree, depth: int) -> Optional[bool]:  # type: ignore[no-untyped-def]
    """One constructor argument: data (a list, a tuple, an array made by
    numpy), a size (an int, ``x.size(0)``, ``len(x)``), or None; a name is
    what every binding that reaches it assigns."""
    if isinstance(node, (cst.List, cst.Tuple, cst.ListComp)):
        return True
    if isinstance(node, cst.Integer) or _is_size(node):
        return False
    if isinstance(node, cst.Call) and (dotted(node.func) or "").split(".")[0] in ("np", "numpy"):
        return True
    if isinstance(node, cst.BinaryOperation) and depth < 3:  # 0.75 * np.random.normal(...)
        sides = {_is_data(node.left, tree, depth + 1), _is_data(node.right, tree, depth + 1)}
        return True if True in sides else None
    if isinstance(node, cst.Name) and depth < 3:
        from codemods.analysis.bindings import binding_nodes

        found = set()
        around = tree.ancestor_ids([node])
        for bound in binding_nodes(tree, node):
            assign = tree.parents.get(id(tree.parents.get(id(bound))))
            if id(assign) in around:  # `labels = T(labels)`: the binding the use makes
                continue
            if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                    and assign.targets[0].target is bound):
                return None
            found.add(_is_data(assign.value, tree, depth + 1))
        return found.pop() if len(found) == 1 else None
    return None


def _is_size(node: cst.CSTNode) -> bool:
    """``len(x)``, ``x.size(0)``, ``x.shape[0]``, ``x.numel()``, and arithmetic on them."""
    if isinstance(node, cst.BinaryOperation):
        return _is_size(node.left) and (_is_size(node.right) or isinstance(node.right, cst.Integer))
    if isinstance(node, cst.Call):
        name = dotted(node.func) or ""
        return name == "len" or name.endswith((".size", ".numel", ".dim"))
    if isinstance(node, cst.Subscript):
        return (dotted(node.value) or "").endswith(".shape")
    return False


def _binds(name: cst.Name, parents: Dict[int, cst.CSTNode]) -> bool:
    """``name`` is not a read of the variable: a target being assigned, or
    the attribute of ``obj.name``."""
    up = parents.get(id(name))
    return (isinstance(up, cst.AssignTarget) and up.target is name) or (isinstance(up, cst.Attribute)
                                                                        and up.attr is name)


DEFAULT_CONSTRUCTOR = Rule(
    code="XLA120",
    name="default-type-constructor",
    summary="`torch.Tensor(...)` in a program that sets a default tensor type is made on the default device",
    why=(
        "`torch.set_default_tensor_type('torch.cuda.FloatTensor')` makes the legacy constructor `torch.Tensor(...)` "
        "give CUDA tensors, wherever in the program it runs (yenchenlin/nerf-pytorch's `torch.Tensor([1e10])` "
        "beside its rays). XLA119 makes that call `torch.set_default_device(<XLA device>)`, which the factories "
        "follow but `torch.Tensor(...)` does not: it stays on the CPU, and the first op that mixes it with an XLA "
        "tensor fails (`Expected all tensors ... to be XLA tensors`). `.to(torch.get_default_device())` puts it "
        "where the factories put theirs: the XLA device once the default is set, the CPU before (as the original "
        "made it before its default was set). Done in every module of a program that sets a default tensor type: "
        "the module itself, or one that imports it (or imports a module that does)."
    ),
    before=(
        "import torch\n\ntorch.set_default_tensor_type('torch.cuda.FloatTensor')\n"
        "far = torch.Tensor([1e10])\n"
    ),
    after=(
        "import torch\n\ntorch.set_default_tensor_type('torch.cuda.FloatTensor')\n"
        "far = torch.Tensor([1e10]).to(torch.get_default_device())\n"
    ),
    valid=(
        "import torch\n\nfar = torch.Tensor([1e10])\n",  # no default type set: the CPU, as before
        "import torch\n\ntorch.set_default_tensor_type('torch.cuda.FloatTensor')\n"
        "far = torch.Tensor([1e10]).to(torch.get_default_device())\n",
    ),
)

_SETS_DEFAULT = "torch.set_default_tensor_type"


class DefaultTypeConstructors(XlaCodemod):
    DESCRIPTION = "Make `torch.Tensor(...)` on the default device where the program sets a default tensor type."
    RULES = (DEFAULT_CONSTRUCTOR,)
    TRIGGERS = (b"Tensor(",)

    @classmethod
    def wanted(cls, tree, options):  # type: ignore[no-untyped-def]
        from codemods.analysis.importers import importer_calls

        # (the user's source: XLA119 has rewritten the call in the tree by now)
        return b"set_default_tensor_type" in (tree.source or b"") or importer_calls(tree.filename, _SETS_DEFAULT)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if "torch.Tensor" not in (self.tree.import_qualnames(original_node.func) or ()):
            return updated_node
        up = self.tree.parents.get(id(original_node))
        if isinstance(up, cst.Attribute) and up.attr.value == "to":
            return updated_node  # moved already (or by the user)
        if not self.flag(original_node, DEFAULT_CONSTRUCTOR.code, "`torch.Tensor(...)` follows the default tensor "
                         "type the program sets, which `set_default_device` does not give it: "
                         "`.to(torch.get_default_device())` added", fix=True):
            return updated_node
        imports.need(self.context, "torch")
        return cst.Call(func=cst.Attribute(updated_node, cst.Name("to")),
                        args=[cst.Arg(cst.parse_expression("torch.get_default_device()"))])


__all__ = ["TensorTypes", "TENSOR_TYPE", "LEGACY_TYPES", "DefaultTypeConstructors", "DEFAULT_CONSTRUCTOR"]
