"""XLA109: a device held as a *string* stays a string.

Programs keep their device in a string (``device = "cuda"``, an argparse
``--device`` default, ``device_type = "cuda" if "cuda" in device else "cpu"``)
and then test it as one: ``"cuda" in device``, ``device.startswith("cuda")``,
``torch.autocast(device_type=device_type)``.  Putting a ``torch.device`` there
crashes at start-up (``argument of type 'torch.device' is not iterable``,
``Expected device_type of type str``).  So such a string becomes the target's
device string (``"xla"``, which ``.to()``, ``device=`` and ``torch.device()``
accept as well), and the string tests on it are rewritten to match, so the
program takes the branches it took on the GPU.

Which names hold a device string is :class:`codemods.analysis.cuda.CudaFacts`.
"""

from __future__ import annotations

from typing import Dict, Optional, Set

import libcst as cst

from codemods.analysis.cuda import (
    DEVICE_NAME_RE,
    HOST_DEVICES,
    cuda_facts,
    device_arguments,
    is_cuda_string,
    is_device_string_choice,
)
from codemods.base import Rule, XlaCodemod, call_name, dotted, find_all, string_value
from codemods.syntax.nodes import keyword_arg, with_arg


DEVICE_STRING = Rule(
    code="XLA109",
    name="cuda-device-string",
    summary='a device kept in a string (`device = "cuda"`) becomes `"xla"`, and tests on it follow',
    why=(
        "A program that keeps its device in a string also tests it as a string (`'cuda' in device`, "
        "`device_type = ...` for autocast). Replacing the string with a `torch.device` crashes those "
        "tests; leaving \"cuda\" crashes on a TPU host. The string becomes \"xla\" (valid wherever a "
        "device is expected once torch_xla is imported), comparisons of that name with \"cuda\" compare "
        "with \"xla\", a configuration dict's device entry (`{\"device\": \"cuda:0\"}`, `cfg[\"device\"]`) is such a "
        "string too, and a `--device` option's CUDA default and choices become \"xla\"; a CUDA device the user "
        "types for such an option (`--device cuda:1`) is read as \"xla\", and a CPU choice stays the CPU."
    ),
    before=(
        "device = \"cuda\"\ndevice_type = \"cuda\" if \"cuda\" in device else \"cpu\"\n"
        "parser.add_argument(\"--device\", default=\"cuda\", choices=[\"cpu\", \"cuda\"])\n"
    ),
    after=(
        "import torch_xla  # noqa: F401\n\ndevice = \"xla\"\ndevice_type = \"xla\" if \"xla\" in device else \"cpu\"\n"
        "parser.add_argument(\"--device\", default=\"xla\", choices=[\"cpu\", \"xla\"], "
        "type=lambda d: \"xla\" if d.startswith(\"cuda\") else d)\n"
    ),
    valid=(
        'print("running on cuda")\n',
        'backend_name = "cuda"\n',
        'if x.device.type == "xla":\n    pass\n',
    ),
)


class DeviceStrings(XlaCodemod):
    DESCRIPTION = 'Keep devices held in strings as strings: "cuda" -> "xla", with the tests on them.'
    RESPECTS_HAND_PORTS = True
    RULES = (DEVICE_STRING,)
    TRIGGERS = (b"cuda",)
    NEEDS = ("code~cuda",)  # (see regions)

    def regions(self, tree):
        return tree.statements_where(lambda n: "cuda" in n.value, (cst.SimpleString, cst.FormattedStringText))

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._rewrite: Set[int] = set()  # id() of CUDA string nodes to replace
        self._argparse_dests: Set[str] = set()
        self._typed: Dict[int, Optional[cst.Arg]] = {}  # id of a device option's add_argument -> its type=

    def visit_Module(self, node: cst.Module) -> None:
        facts = cuda_facts(self.tree, self.qualnames)
        self._facts = facts
        names = {t for t in facts.device_strings if facts.holds_device(t)}
        for call in find_all(node, cst.Call):
            if call_name(call) == "add_argument":
                self._argparse_device(call)  # type: ignore[arg-type]
        self._names = names | {f"*.{d}" for d in self._argparse_dests}
        self._names |= self._aliases()
        self._device_functions = self._functions_returning_devices()

    def _aliases(self) -> Set[str]:
        """Names a device name is copied to as it is (``device = args.device``):
        they hold what it holds, "xla" where the user typed "cuda"."""
        found: Set[str] = set()
        for _ in range(3):  # (an alias of an alias)
            more = {dotted(t.target) for a in self.tree.nodes((cst.Assign,)) for t in a.targets  # type: ignore[attr-defined]
                    if isinstance(a.value, (cst.Name, cst.Attribute)) and self._is_device_name(a.value)  # type: ignore[attr-defined]
                    and isinstance(t.target, (cst.Name, cst.Attribute))} - {None} - self._names
            if not more:
                break
            found |= more  # type: ignore[arg-type]
            self._names |= more  # type: ignore[arg-type]
        return found

    def _functions_returning_devices(self) -> Set[str]:
        """Names of the module's functions whose result is used as a device
        (called inside a device argument: ``.to(gpu_name(i))``), or that say
        they make one (``get_device``)."""
        used: Set[str] = set()
        for call in self.tree.nodes((cst.Call,)):
            for arg in device_arguments(call, self.qualnames):  # type: ignore[arg-type]
                used.update(call_name(c) or "" for c in find_all(arg, cst.Call))
        return {f.name.value for f in self.tree.nodes((cst.FunctionDef,))  # type: ignore[attr-defined]
                if f.name.value in used or DEVICE_NAME_RE.search(f.name.value)}  # type: ignore[attr-defined]

    def _is_device_name(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Subscript):  # `config["device"]`: the entry a config keeps its device in
            return _device_key(node) is not None
        text = dotted(node)
        if text is None:
            return False
        return text in self._names or (
            "." in text and f"*.{text.rsplit('.', 1)[1]}" in self._names)

    # ------------------------------------------------------------ argparse
    def _argparse_device(self, call: cst.Call) -> None:
        options = [string_value(a.value) for a in call.args if a.keyword is None]
        dests = [o.lstrip("-").replace("-", "_") for o in options if o and o.startswith("--")]
        if not any(DEVICE_NAME_RE.search(d) for d in dests):
            return
        keywords = {a.keyword.value: a for a in call.args if a.keyword is not None}
        kind, default = keywords.get("type"), keywords.get("default")
        if "action" not in keywords and (kind is None or dotted(kind.value) == "str") and (kind or default) and (
                default is None or is_cuda_string(default.value) or string_value(default.value) in HOST_DEVICES):
            # a device the user types: "cuda" (or "cuda:1") typed by an existing user becomes "xla"
            self._argparse_dests.update(dests)
            self._typed[id(call)] = kind
        for a in call.args:
            if a.keyword is not None and a.keyword.value == "default" and is_cuda_string(a.value):
                self._argparse_dests.update(dests)
                self._rewrite.add(id(a.value))
                for b in call.args:
                    if b.keyword is not None and b.keyword.value == "choices":
                        self._rewrite.update(id(s) for s in find_all(b.value, cst.SimpleString) if is_cuda_string(s))

    # ------------------------------------------------------------ what to rewrite
    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1:
            self._bound(node.targets[0].target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bound(node.target, node.value)

    def visit_DictElement(self, node: cst.DictElement) -> None:
        """``{"device": "cuda:0", ...}``: a configuration dict's device entry
        (zoubohao's DDPM hands ``modelConfig["device"]`` to ``torch.device``
        in another module)."""
        key = string_value(node.key)
        if key is not None and _names_a_device(key) and is_device_string_choice(node.value):
            self._device_value(node.value)

    def visit_Param(self, node: cst.Param) -> None:
        """``def __init__(self, device="cuda")``: the default is the device
        the function works on when its caller names none."""
        if self._facts.string_default(node):
            self._bound(node.name, node.default)  # type: ignore[arg-type]

    def _bound(self, target: cst.CSTNode, value: cst.CSTNode) -> None:
        if self._is_device_name(target) and is_device_string_choice(value):
            self._device_value(value)

    def _device_value(self, value: cst.CSTNode) -> None:
        """Rewrite the device string(s) ``value`` holds (a CUDA string, or a
        choice between device strings)."""
        if isinstance(value, cst.IfExp) and self._by_availability(value.test):
            self._rewrite.add(id(value))  # the whole availability choice is the accelerator
        else:
            self._rewrite.update(id(s) for s in _cuda_parts(value))

    def _by_availability(self, test: cst.BaseExpression) -> bool:
        """A choice made by availability alone (not the user's: ``args.cuda
        and ...`` keeps its CPU side, only its CUDA string is rewritten)."""
        return self._facts.tests_availability(test) and not self._facts.users_choice(test)

    def visit_Return(self, node: cst.Return) -> None:
        """``return "cuda:" + str(i)`` in a function whose result is a device."""
        function = next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)
        if function is not None and node.value is not None and function.name.value in self._device_functions \
                and is_device_string_choice(node.value):
            self._rewrite.update(id(s) for s in _cuda_parts(node.value))

    def visit_Arg(self, node: cst.Arg) -> None:
        """``torch.autocast(device_type="cuda" if ... else "cpu")``: a place
        that takes a device *type*, a string."""
        if node.keyword is not None and node.keyword.value == "device_type" and isinstance(node.value, cst.IfExp) \
                and is_device_string_choice(node.value):  # (a plain "cuda" there is an autocast's: XLA121)
            if self._by_availability(node.value.test):
                self._rewrite.add(id(node.value))
            else:
                self._rewrite.update(id(s) for s in find_all(node.value, (cst.SimpleString, cst.FormattedString))
                                     if is_cuda_string(s))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left] + [c.comparator for c in node.comparisons]
        if any(self._is_device_name(o) for o in operands):
            self._rewrite.update(id(o) for o in operands if is_cuda_string(o))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (isinstance(func, cst.Attribute) and func.attr.value in ("startswith", "endswith", "find", "index")
                and self._is_device_name(func.value)):
            self._rewrite.update(id(a.value) for a in node.args if is_cuda_string(a.value))

    # ------------------------------------------------------------ rewriting
    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString):
        return self._replace(original_node, updated_node)

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp):
        return self._replace(original_node, updated_node)

    def leave_FormattedString(self, original_node: cst.FormattedString, updated_node: cst.FormattedString):
        return self._replace(original_node, updated_node)

    def leave_BinaryOperation(self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation):
        return self._replace(original_node, updated_node)  # "cuda:" + str(i), "cuda:%d" % i

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call):
        if id(original_node) in self._typed:
            return self._typed_option(original_node, updated_node)
        return self._replace(original_node, updated_node)  # "cuda:{}".format(i)

    def _typed_option(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``add_argument("--device", ...)``: a CUDA device typed on the command
        line is read as the target's device string."""
        device = self.target.device_string
        if not self.flag(original, DEVICE_STRING.code, f'device option: "cuda" typed on the command line becomes '
                         f'"{device}"', fix=True):
            return updated
        self.add_imports(self.target.device_imports)
        mapping = cst.parse_expression(f'lambda d: "{device}" if d.startswith("cuda") else d')
        if self._typed[id(original)] is None:
            return with_arg(updated, keyword_arg("type", mapping))
        return updated.with_changes(args=[a.with_changes(value=mapping) if a.keyword is not None and
                                          a.keyword.value == "type" else a for a in updated.args])

    def _replace(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.BaseExpression:
        if id(original) not in self._rewrite:
            return updated
        device = self.target.device_string
        what = "device choice" if isinstance(original, cst.IfExp) else 'device string "cuda"'
        if not self.flag(original, DEVICE_STRING.code, f'{what} -> "{device}"', fix=True):
            return updated
        self.add_imports(self.target.device_imports)
        if self.target.keeps_device_index:  # "cuda:1", f"cuda:{rank}", "cuda" if ... else "cpu": each CUDA word
            return updated.visit(_Renamed(device))  # type: ignore[return-value]
        quote = '"'
        if isinstance(original, cst.SimpleString) and original.value.startswith("'"):
            quote = "'"
        return cst.SimpleString(f"{quote}{device}{quote}")


class _Renamed(cst.CSTTransformer):
    """The word "cuda" in every piece of literal text of an expression
    becomes the target's device (a target that keeps device indexes)."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = device

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        return updated_node.with_changes(value=updated_node.value.replace("cuda", self.device))

    def leave_FormattedStringText(self, original_node: cst.FormattedStringText,
                                  updated_node: cst.FormattedStringText) -> cst.FormattedStringText:
        return updated_node.with_changes(value=updated_node.value.replace("cuda", self.device))


def _names_a_device(key: str) -> bool:
    """A dict key or config entry that names a device (``"device"``,
    ``"train_device"``), as a variable's name does."""
    return DEVICE_NAME_RE.search(key) is not None and key.isidentifier()


def _device_key(node: cst.Subscript) -> Optional[str]:
    """The string key of ``config["device"]`` when it names a device."""
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    key = string_value(node.slice[0].slice.value)
    return key if key is not None and _names_a_device(key) else None


def _cuda_parts(value: cst.BaseExpression) -> list:
    """The CUDA device strings a string choice is made of (each whole:
    ``"cuda:" + str(i)`` is one)."""
    if is_cuda_string(value):
        return [value]
    if isinstance(value, cst.IfExp):
        return _cuda_parts(value.body) + _cuda_parts(value.orelse)
    return []
