"""XLA1xx: hard-coded CUDA devices become the XLA device.

Only *hard-coded* CUDA targets are rewritten (``.cuda()``, ``"cuda"`` used as a
device, ``torch.device("cuda")``, the ``cuda if available else cpu`` idiom).
Code that takes its device from the caller (``x.to(device)``) is device-generic
and stays as it is, so a whole library can be converted and still work.
Mentions of "cuda" that are not a device (comparisons, defaults of parameters)
are reported, not rewritten (comparisons: ``device_compare.py``).  A device kept in a string is XLA109
(``device_strings.py``); ``torch.cuda.*`` calls are ``cuda_api.py``.
"""

from __future__ import annotations

import re
from typing import Callable, Optional, Union

import libcst as cst

from codemods.analysis.cuda import cuda_facts, is_cuda_string, is_device_string_choice
from codemods.analysis.device_exprs import DeviceExprs
from codemods.analysis.ordinals import ordinal_uses
from codemods.base import CHOICE_CODE, Rule, XlaCodemod, dotted, find_all
from codemods.syntax.nodes import source_of


CUDA_METHOD = Rule(
    code="XLA101",
    name="cuda-method",
    summary="`.cuda()` moves to the CUDA device: move to the XLA device instead",
    why=(
        "A TPU host has no CUDA device, so `.cuda()` raises. `.to(torch_xla.device())` "
        "places the tensor or module on the XLA device. The device index is dropped: "
        "each XLA process sees its own device as xla:0, so `cuda:N` never maps to `xla:N`."
    ),
    before="model = Net().cuda()\nx = x.cuda(1, non_blocking=True)\n",
    after=(
        "import torch_xla\n\nmodel = Net().to(torch_xla.device())\n"
        "x = x.to(torch_xla.device(), non_blocking=True)\n"
    ),
    valid=("x = x.to(device)\n", "import torch\nok = torch.cuda.is_initialized\n"),
)

CUDA_LITERAL = Rule(
    code="XLA102",
    name="cuda-device-literal",
    summary='`"cuda"`/`"cuda:N"` used as a device: use the XLA device',
    why=(
        'A string "cuda" passed as a device (to `.to()`, a `device=` keyword, '
        "`torch.device(...)`, or a variable named like a device) pins the program to "
        "a GPU, and so does an integer (`.to(rank)`, `device=local_rank`: to torch an int device is "
        "`cuda:N`). On XLA the device is `torch_xla.device()`. Never `xla:N`: each process "
        "sees its own device as xla:0. A CUDA default of a function parameter is XLA106: it is "
        "evaluated at import time, where the XLA runtime must not start."
    ),
    before=(
        "import torch\n\ndevice = torch.device(\"cuda\", 0)\n"
        "x = torch.zeros(3, device=\"cuda:1\")\npipe.to(\"cuda\")\n"
        "rank = int(os.environ[\"LOCAL_RANK\"])\nmodel.to(rank)\ny = torch.ones(2, device=rank % 8)\n"
    ),
    after=(
        "import torch\nimport torch_xla\n\ndevice = torch_xla.device()\n"
        "x = torch.zeros(3, device=torch_xla.device())\npipe.to(torch_xla.device())\n"
        "rank = int(os.environ[\"LOCAL_RANK\"])\nmodel.to(torch_xla.device())\n"
        "y = torch.ones(2, device=torch_xla.device())\n"
    ),
    valid=(
        'print("running on cuda")\n',
        'def f():\n    """Move to cuda."""\n    return x.to(device)\n',
        "import torch\ng = torch.Generator(device=\"cpu\")\n",
        "def place(x, device, n):\n    return x.to(device), x.to(n)\n",
    ),
)

CUDA_IDIOM = Rule(
    code=CHOICE_CODE,
    name="cuda-if-available",
    summary='`"cuda" if torch.cuda.is_available() else "cpu"`: use the XLA device',
    why=(
        "On a TPU host `torch.cuda.is_available()` is False, so the idiom silently "
        "picks the CPU and the program runs without the accelerator. The whole "
        "choice (expression or if/else statement, direct or through a flag such as "
        "`use_cuda`) becomes the XLA device. A test that also reads a choice of the user's "
        "(`args.cuda and torch.cuda.is_available()`, `not args.no_cuda and ...`) keeps it: "
        "the CPU the user chose stays the CPU, and the CUDA side alone becomes the XLA device (XLA102)."
    ),
    before=(
        "import torch\n\nuse_cuda = torch.cuda.is_available()\n"
        "device = torch.device(\"cuda\" if use_cuda else \"cpu\")\n"
    ),
    after=(
        "import torch\nimport torch_xla\n\nuse_cuda = torch.cuda.is_available()\n"
        "device = torch_xla.device()\n"
    ),
    valid=("import torch\n\nmode = \"fast\" if torch.cuda.is_available() else \"slow\"\n",
           "import torch\n\nuse_cuda = args.cuda and torch.cuda.is_available()\n"
           "device = torch.device(\"cuda\" if use_cuda else \"cpu\")\n"),
)

CUDA_DEFAULT = Rule(
    code="XLA106",
    name="cuda-parameter-default",
    summary='a parameter defaulting to a CUDA device defaults to the target\'s device (`torch.device("xla")`)',
    why=(
        "A default is the device the function works on when its caller names none: "
        "`UNet(device=\"cuda\")` built as `UNet()` puts its own tensors on the GPU while the model is on "
        "the TPU, and the step fails. Defaults are evaluated when the function is defined, usually at import, "
        "so the default becomes a device that starts nothing there: `torch.device(\"xla\")` (a string "
        "default is a device string, XLA109). A CUDA default of a parameter that is not a device "
        "(`backend=\"cuda\"`) is reported."
    ),
    before='import torch\n\n\ndef run(x, device=torch.device("cuda")):\n    return x.to(device)\n',
    after='import torch\nimport torch_xla  # noqa: F401\n\n\ndef run(x, device=torch.device("xla")):\n'
          '    return x.to(device)\n',
    valid=("def run(x, device=None):\n    return x.to(device)\n",),
)

# device types `torch.device()` parses with nothing but torch imported ("tpu" needs TorchTPU's backend)
_CORE_DEVICE_TYPES = frozenset({"xla", "cpu"})

is_cuda_literal = is_cuda_string  # "cuda", "cuda:1", f"cuda:{rank}", "cuda:{}".format(gpu)


class DeviceSwap(XlaCodemod):
    DESCRIPTION = "Rewrite hard-coded CUDA devices to the target (XLA) device."
    RESPECTS_HAND_PORTS = True
    RULES = (
        CUDA_METHOD,
        CUDA_LITERAL,
        CUDA_IDIOM,
        CUDA_DEFAULT,
    )
    # a name or a string saying "cuda" (see regions); or an integer ordinal,
    # which comes with DDP code (device_ids, a rank, a GPU index)
    TRIGGERS = (b"cuda", b"device_ids", b"rank", b"gpu")
    NEEDS = ("code~cuda", "code~device_ids", "name~rank", "name~gpu")

    def regions(self, tree):
        """Statements that mention CUDA: a "cuda..." string, or a name such as
        ``cuda``, ``is_available``'s module or a ``use_cuda`` flag; and those
        that pass an integer ordinal as a device (``model.to(rank)``)."""
        found = tree.statements_where(lambda n: "cuda" in n.value,
                                      (cst.Name, cst.SimpleString, cst.FormattedStringText))
        return found + [tree.statement_of(use) for use in ordinal_uses(tree, self.qualnames).values()]

    def _is_ordinal_use(self, node: cst.CSTNode) -> bool:
        return id(node) in ordinal_uses(self.tree, self.qualnames)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._param_depth = 0
        self._handled: set = set()  # original nodes an outer rewrite consumed
        self._if_idioms: set = set()
        self._devices: Optional[DeviceExprs] = None

    @property
    def devices(self) -> DeviceExprs:
        """What an expression says about a device, in this tree."""
        if self._devices is None or self._devices.tree is not self.tree:
            self._devices = DeviceExprs(self.tree, self.qualnames)
        return self._devices


    # ------------------------------------------------------------ params
    def visit_Param(self, node: cst.Param) -> None:
        self._param_depth += 1

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        """``def f(device=torch.device("cuda"))`` -> ``torch.device("xla")``:
        a device made at import without starting the runtime; a string
        default is XLA109's; a default of what is no device is reported."""
        self._param_depth -= 1
        default = original_node.default
        if default is None or not (self.devices.cuda_device(default) or self.devices.is_idiom(default)):
            return updated_node
        facts = cuda_facts(self.tree, self.qualnames)
        if facts.string_default(original_node):
            return updated_node
        name = original_node.name.value
        if not facts.holds_device(name):
            self.flag(default, CUDA_DEFAULT.code, f"parameter `{name}` defaults to a CUDA device but is no device "
                      "this module uses; pass the device from the caller", fix=False)
            return updated_node
        device = self.target.device_string
        if not is_device_string_choice(default) and device not in _CORE_DEVICE_TYPES:
            self.flag(default, CUDA_DEFAULT.code, f"parameter `{name}` defaults to a CUDA device: "
                      f"`torch.device(\"{device}\")` there would raise at import where the {device} backend is "
                      "not loaded; pass the device from the caller", fix=False)
            return updated_node
        if is_device_string_choice(default):  # a string that is a device object elsewhere in the module
            quote = "'" if isinstance(default, cst.SimpleString) and default.value.startswith("'") else '"'
            new: cst.BaseExpression = cst.SimpleString(f"{quote}{device}{quote}")
            if self.target.keeps_device_index and isinstance(default, cst.SimpleString):
                new = default.with_changes(value=default.value.replace("cuda", device))
        else:
            new = cst.parse_expression(f'torch.device("{device}")')
        if not self.flag(default, CUDA_DEFAULT.code, f"parameter `{name}`'s CUDA default -> "
                         f"`{source_of(new)}`, made at import without starting the runtime", fix=True):
            return updated_node
        self.add_imports(self.target.device_imports)
        if isinstance(new, cst.Call):
            self.add_imports((("torch", None, None),))
        return updated_node.with_changes(default=new)

    # ------------------------------------------------------------ XLA101 .cuda()
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self._param_depth:
            return updated_node
        func = original_node.func
        if original_node in self._handled:
            return updated_node
        # .cuda(...) on any object but the torch module itself
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "cuda"
            and "torch.cuda" not in self.qualnames(func)
        ):
            if self.flag(original_node, CUDA_METHOD.code, "`.cuda()` -> `.to(<XLA device>)`", fix=True):
                return cuda_to(updated_node, self._device)
            return updated_node

        # torch.device("cuda"...) / torch.device(<idiom>) / torch.device(<int>) -> device
        if self.devices.is_torch_device(original_node) and original_node.args:
            first = original_node.args[0].value
            if self._is_ordinal_use(first):
                if self.flag(original_node, CUDA_LITERAL.code, f"`torch.device({source_of(first)})`: an integer "
                             "device is a CUDA ordinal -> XLA device", fix=True):
                    return self._device()
                return updated_node
            if is_cuda_literal(first):
                if self.flag(original_node, CUDA_LITERAL.code, "`torch.device(\"cuda\")` -> XLA device", fix=True):
                    return self._device()
                return updated_node
            if self.devices.is_idiom(first):
                if self.flag(original_node, CUDA_IDIOM.code, "CUDA-if-available device choice -> XLA device", fix=True):
                    self._handled.add(first)
                    return self._device()
                return updated_node

        # .to("cuda", ...) / torch.set_default_device("cuda"): the first positional
        if (
            ((isinstance(func, cst.Attribute) and func.attr.value == "to")
             or self.is_qualname(func, "torch.set_default_device"))
            and original_node.args
            and original_node.args[0].keyword is None
            and is_cuda_literal(original_node.args[0].value)
        ):
            said = "`.to(\"cuda\")` -> `.to(<XLA device>)`" if isinstance(func, cst.Attribute) and func.attr.value == "to" \
                else "`set_default_device(\"cuda\")` -> `set_default_device(<XLA device>)`"
            if self.flag(original_node.args[0].value, CUDA_LITERAL.code, said, fix=True):
                args = list(updated_node.args)
                args[0] = args[0].with_changes(value=self._device())
                return updated_node.with_changes(args=args)
        # .to(rank): an integer device is a CUDA ordinal
        if (isinstance(func, cst.Attribute) and func.attr.value == "to" and original_node.args
                and original_node.args[0].keyword is None and self._is_ordinal_use(original_node.args[0].value)):
            first = original_node.args[0].value
            if self.flag(first, CUDA_LITERAL.code, f"`.to({source_of(first)})`: an integer device is a CUDA ordinal "
                         "-> `.to(<XLA device>)`", fix=True):
                args = list(updated_node.args)
                args[0] = args[0].with_changes(value=self._device())
                return updated_node.with_changes(args=args)
        return updated_node

    # ------------------------------------------------------------ keywords
    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if self._param_depth or original_node.keyword is None:
            return updated_node
        if original_node.keyword.value != "device":
            return updated_node
        value = original_node.value
        parent = self.parent(original_node)
        if isinstance(parent, cst.Call) and self.is_qualname(parent.func, "torch.Generator", "torch._C.Generator"):
            return updated_node  # a generator's device (XLA107: ``generators.py``)
        if is_cuda_literal(value):
            if self.flag(value, CUDA_LITERAL.code, '`device="cuda"` -> XLA device', fix=True):
                return updated_node.with_changes(value=self._device())
        elif self._is_ordinal_use(value):
            if self.flag(value, CUDA_LITERAL.code, f"`device={source_of(value)}`: an integer device is a CUDA ordinal "
                         "-> XLA device", fix=True):
                return updated_node.with_changes(value=self._device())
        elif self.devices.is_idiom(value) and value not in self._handled:
            if self.flag(value, CUDA_IDIOM.code, "CUDA-if-available device choice -> XLA device", fix=True):
                self._handled.add(value)
                return updated_node.with_changes(value=self._device())
        return updated_node

    # ------------------------------------------------------------ idiom anywhere
    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        if self._param_depth or original_node in self._handled:
            return updated_node
        if self.devices.is_idiom(original_node):
            parent = self.parent(original_node)
            if isinstance(parent, cst.Arg) and isinstance(self.parent(parent), cst.Call) and (
                    self.devices.is_torch_device(self.parent(parent))
                    or (parent.keyword is not None and parent.keyword.value == "device")):
                return updated_node  # the whole torch.device(...) (leave_Call), a device= argument (leave_Arg)
            if self.flag(original_node, CUDA_IDIOM.code, "CUDA-if-available device choice -> XLA device", fix=True):
                self._handled.add(original_node)
                return self._device()
            return updated_node
        side = self.devices.chosen_cuda_side(original_node)
        if side is not None and self.flag(getattr(original_node, side), CUDA_LITERAL.code, "the CUDA side of a "
                                          "device choice the user makes -> XLA device (the choice is kept)", fix=True):
            return updated_node.with_changes(**{side: self._device()})
        return updated_node

    # ------------------------------------------------------------ assignments
    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if len(original_node.targets) != 1 or not is_cuda_literal(original_node.value):
            return updated_node
        if original_node.value in self._handled:
            return updated_node
        target = original_node.targets[0].target
        name = target.value if isinstance(target, cst.Name) else (
            target.attr.value if isinstance(target, cst.Attribute) else None
        )
        if name and cuda_facts(self.tree, self.qualnames).holds_device(dotted(target) or name):
            if self.flag(original_node.value, CUDA_LITERAL.code, f'`{name} = "cuda"` -> XLA device', fix=True):
                return updated_node.with_changes(value=self._device())
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> Union[cst.If, cst.SimpleStatementLine]:
        """``if cuda_available: dev = CUDA [else: dev = CPU]`` -> ``dev = XLA``."""
        if original_node not in self._if_idioms:
            return updated_node
        body_target = self.devices.if_idiom_target(original_node)
        assert body_target is not None
        if not self.flag(original_node, CUDA_IDIOM.code, "CUDA-if-available device choice -> XLA device", fix=True):
            return updated_node
        return cst.SimpleStatementLine(
            body=[cst.Assign(targets=[cst.AssignTarget(body_target)], value=self._device())],
            leading_lines=updated_node.leading_lines,
        )

    def visit_If(self, node: cst.If) -> None:
        if self.devices.if_idiom_target(node) is not None:
            # The whole statement is replaced in leave_If: its parts are not
            # rewritten (or reported) on their own.
            for stmt in find_all(node, cst.Assign):
                self._handled.add(stmt.value)  # type: ignore[attr-defined]
            self._if_idioms.add(node)

    # ------------------------------------------------------------ helpers
    def _device(self) -> cst.BaseExpression:
        self.add_imports(self.target.device_imports)
        return self.target.device_node()


def cuda_to(call: cst.Call, device: Callable[[], cst.BaseExpression]) -> cst.Call:
    """``.cuda()`` -> ``.to(<XLA device>)``; ``.cuda(device)`` with a
    device from the caller -> ``.to(device)``: the caller decides."""
    func = call.func
    assert isinstance(func, cst.Attribute)
    first = call.args[0].value if call.args and call.args[0].keyword is None else None
    for a in call.args:
        if a.keyword is not None and a.keyword.value == "device":
            first = a.value
    if first is not None and _names_a_device(first):
        args = [a.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT) if a.value is first else a
                for a in call.args]
        args = [args[[a.value for a in call.args].index(first)]] + [a for a in args if a.value is not first]
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return call.with_changes(func=func.with_changes(attr=cst.Name("to")), args=args)
    kept = [
        a
        for i, a in enumerate(call.args)
        if a.keyword is not None and a.keyword.value != "device"
    ]
    args = [cst.Arg(device())]
    if kept:
        args[0] = args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        args += kept
    return call.with_changes(func=func.with_changes(attr=cst.Name("to")), args=args)


_DEVICE_ARG_RE = re.compile(r"(^|_)device$|^dev$")


def _names_a_device(node: cst.CSTNode) -> bool:
    """A name that holds a device handed in (``device``, ``self.device``,
    ``target_device``), not a GPU index (``args.gpu``, ``local_rank``, ``0``)."""
    text = dotted(node)
    return bool(text) and bool(_DEVICE_ARG_RE.search(text.rsplit(".", 1)[-1]))  # type: ignore[union-attr]


