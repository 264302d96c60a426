"""Integer device ordinals: an ``int`` that reaches a device argument.

To torch an integer device *is* a CUDA device: ``model.to(0)``, ``x.to(rank)``,
``torch.randn(2, device=local_rank)`` and ``torch.device(gpu)`` all mean
``cuda:N`` and fail on a host without a GPU ("Found no NVIDIA driver").
:func:`is_ordinal` tells, from the dataflow, whether an expression is such an
integer -- whatever it is called:

* an integer literal, ``int(...)``, arithmetic on an ordinal (``rank %
  torch.cuda.device_count()``), a process index from the distributed APIs
  (``dist.get_rank()``, ``torch.cuda.current_device()``, ``xr.local_ordinal()``);
* a name whose every binding that reaches the use is one of those;
* a parameter annotated ``int``, defaulting to an integer, fed integers by the
  module's call sites, or the first parameter of a function the module starts
  with ``mp.spawn``/``torch_xla.launch`` (the process index);
* ``args.gpu`` where the module's argparse declares ``--gpu`` with ``type=int``;
* an element of a list of ordinals (``gpu_ids[0]``: a literal or comprehension
  of them, or a list named for the GPUs' indices);
* ``self.gpu_id`` where every value the class stores in it is an ordinal.

Where an expression is used as a device is ``device_calls.device_arguments``.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Set

import libcst as cst

from codemods.analysis.bindings import binding_nodes
from codemods.analysis.device_calls import LAUNCHERS, SPAWNS, device_arguments
from codemods.analysis.dataflow import dataflow
from codemods.analysis.values import Values
from codemods.analysis.values import values as values_of
from codemods.syntax.tree import TreeCache, call_name, dotted, string_value

_INDEX_CALLS = {"torch.distributed.get_rank", "torch.distributed.get_local_rank", "torch.cuda.current_device",
                "torch.accelerator.current_device_index", "torch_xla.runtime.local_ordinal",
                "torch_xla.runtime.global_ordinal", "torch_xla.core.xla_model.get_local_ordinal",
                "torch_xla.core.xla_model.get_ordinal", "torch.distributed.distributed_c10d.get_rank"}
_ORDINAL_NAME = re.compile(r"^(local_rank|local_gpu|gpu|gpu_id|gpu_index|device_id|device_index|cuda_id)$")
_ORDINALS_NAME = re.compile(r"^(gpu_ids|gpus|gpu_list|device_ids|cuda_ids|local_gpus)$")
_ARITHMETIC = (cst.Modulo, cst.FloorDivide, cst.Add, cst.Subtract, cst.Multiply)


class Ordinals:
    """The per-tree answers; get them with :func:`ordinals`."""

    def __init__(self, tree: TreeCache) -> None:
        self.tree = tree
        self.values: Values = values_of(tree)
        self.flow = dataflow(tree)
        self._busy: Set[int] = set()
        self._int_options: Optional[Set[str]] = None
        self._spawned: Optional[Set[int]] = None

    def is_ordinal(self, node: cst.CSTNode) -> bool:
        if id(node) in self._busy:
            return False  # a cycle (`rank = rank + 1` in a loop): no more than what is known
        self._busy.add(id(node))
        try:
            return self._ordinal(node)
        finally:
            self._busy.discard(id(node))

    def _ordinal(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Integer):
            return True
        if isinstance(node, cst.Name):
            if node.value in ("True", "False", "None"):
                return False
            reaching = self.flow.reaching(node) if binding_nodes(self.tree, node) else []
            if reaching and all(self._binding(b) for b in reaching):
                return True
            # last resort, where the dataflow cannot see the value (a function
            # of another module returns it): a name that says it is a process's
            # device index, bound only from calls this module cannot read
            return bool(reaching) and bool(_ORDINAL_NAME.match(node.value)) and all(
                self._opaque(b) for b in reaching)
        if isinstance(node, cst.Call):
            if isinstance(node.func, cst.Name) and node.func.value == "int" and not binding_nodes(self.tree, node.func):
                return True
            return bool((self.tree.import_qualnames(node.func) or set()) & _INDEX_CALLS)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, _ARITHMETIC):
            return self.is_ordinal(node.left) and not isinstance(
                node.right, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString, cst.Float))
        if isinstance(node, cst.IfExp):
            return self.is_ordinal(node.body) and self.is_ordinal(node.orelse)
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            return self._ordinals(node.value)  # `gpu_ids[0]`
        if isinstance(node, cst.Attribute):
            if isinstance(node.value, cst.Name) and node.value.value != "self":
                return node.attr.value in self.int_options()  # args.gpu
            if isinstance(node.value, cst.Name):  # self.gpu_id: every value the class stores in it
                stores = self.flow.self_stores(node)
                return bool(stores) and all(self.is_ordinal(v) for v in stores)
            return False
        return False

    def _ordinals(self, node: cst.CSTNode) -> bool:
        """A list of device ordinals: a literal or comprehension of them, or a
        name or attribute that says it holds the GPUs' indices
        (``opt.gpu_ids``, which pix2pix parses from ``--gpu_ids 0,1`` and
        hands to ``net.to(gpu_ids[0])``)."""
        if isinstance(node, (cst.List, cst.Tuple)):
            return bool(node.elements) and all(self.is_ordinal(e.value) for e in node.elements)
        if isinstance(node, cst.ListComp):
            return self.is_ordinal(node.elt)
        last = node.attr.value if isinstance(node, cst.Attribute) else node.value if isinstance(node, cst.Name) else ""
        return bool(_ORDINALS_NAME.match(last))

    def _binding(self, binding: cst.CSTNode) -> bool:
        if isinstance(binding, cst.Param):
            return self._param(binding)
        value, path = self.flow.source(binding)
        if value is None or isinstance(value, cst.For) or path:
            if isinstance(value, cst.For) and not path and isinstance(value.iter, cst.Call) \
                    and call_name(value.iter) == "range":
                return True  # `for gpu in range(n)`
            return False
        return self.is_ordinal(value)

    def _opaque(self, binding: cst.CSTNode) -> bool:
        """A binding from a call of something imported (its value unknown here)."""
        value, path = self.flow.source(binding)
        return isinstance(value, cst.Call) and not path and bool(self.tree.import_qualnames(value.func)) \
            and self.flow.local_function(value) is None

    def _param(self, param: cst.Param) -> bool:
        if param.annotation is not None:
            return (dotted(param.annotation.annotation) or "") == "int"
        fn = next((a for a in self.flow.ancestors(param) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
        if isinstance(fn, cst.FunctionDef):
            params = list(fn.params.posonly_params) + list(fn.params.params)
            if params and params[0] is param and id(fn) in self.spawned():
                return True
            fed = self.flow.arguments(fn, param)
            if fed:
                return all(self.is_ordinal(a) for a in fed)
        return param.default is not None and self.is_ordinal(param.default)

    def spawned(self) -> Set[int]:
        """Functions the module starts as processes, each called with its
        process index first: ``mp.spawn(fn, ...)``, ``torch_xla.launch(fn, ...)``."""
        if self._spawned is None:
            self._spawned = set()
            defs = self.flow.functions()
            for call in self.tree.nodes((cst.Call,)):
                quals = self.tree.import_qualnames(call.func) or set()  # type: ignore[attr-defined]
                if quals & (SPAWNS | LAUNCHERS) and call.args:  # type: ignore[attr-defined]
                    target = defs.get(dotted(call.args[0].value) or "")  # type: ignore[attr-defined]
                    if isinstance(target, cst.FunctionDef):
                        self._spawned.add(id(target))
        return self._spawned

    def int_options(self) -> Set[str]:
        """Destinations of the module's argparse options declared ``type=int``."""
        if self._int_options is None:
            self._int_options = set()
            for call in self.tree.nodes((cst.Call,)):
                if call_name(call) != "add_argument":  # type: ignore[arg-type]
                    continue
                args = call.args  # type: ignore[attr-defined]
                if not any(a.keyword is not None and a.keyword.value == "type" and dotted(a.value) == "int"
                           for a in args):
                    continue
                dest = next((string_value(a.value) for a in args
                             if a.keyword is not None and a.keyword.value == "dest"), None)
                names = [string_value(a.value) or "" for a in args if a.keyword is None]
                longs = [n for n in names if n.startswith("--")] or names
                if dest or longs:
                    self._int_options.add(dest or longs[0].lstrip("-").replace("-", "_"))
        return self._int_options



def ordinals(tree: TreeCache) -> Ordinals:
    found = tree.memo.get("ordinals")
    if not isinstance(found, Ordinals):
        found = tree.memo["ordinals"] = Ordinals(tree)
    return found


def ordinal_uses(tree: TreeCache, qualnames) -> Dict[int, cst.CSTNode]:  # type: ignore[no-untyped-def]
    """Every integer ordinal the module passes as a device, by ``id`` (once per tree)."""
    found = tree.memo.get("ordinal_uses")
    if isinstance(found, dict):
        return found
    out: Dict[int, cst.CSTNode] = {}
    facts = ordinals(tree)
    for call in tree.nodes((cst.Call,)):
        for arg in device_arguments(call, qualnames):  # type: ignore[arg-type]
            if isinstance(arg, (cst.Integer, cst.Name, cst.Attribute, cst.Call, cst.BinaryOperation, cst.Subscript)) \
                    and facts.is_ordinal(arg):
                out[id(arg)] = arg
    tree.memo["ordinal_uses"] = out
    return out


__all__ = ["Ordinals", "ordinals", "ordinal_uses"]
