"""XLA141-XLA144: distributed training and ``torch.compile`` on XLA.

* the process group: ``init_process_group("nccl", rank=..., world_size=...)``
  -> ``init_process_group("xla", init_method="xla://")`` (with the import that
  registers the backend); the XLA rendezvous knows rank and world size;
* ``DistributedDataParallel(m, device_ids=[r], output_device=r)`` ->
  ``DistributedDataParallel(m, gradient_as_bucket_view=True)``;
* ``mp.spawn(fn, args=a, nprocs=n)`` -> ``torch_xla.launch(fn, args=a)``: one
  process per XLA device, ``fn(index, *a)`` as before; a ``DistributedSampler``
  in such a program takes its shard from ``torch_xla.runtime``, since
  ``MpDeviceLoader`` does not shard;
* ``torch.compile(m)`` -> ``torch.compile(m, backend="openxla")``: torch_xla's
  dynamo backend (inference and training); inductor modes do not apply.

The reference run of ``verify`` (the CPU target) gets gloo, no device ids,
one process (``fn(0, *a)``) and eager code instead.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import libcst as cst


from codemods.base import Rule, XlaCodemod, dotted, find_all, string_value
from codemods.syntax.nodes import comma_separated, keyword_arg, source_of, tight_equal

PROCESS_GROUP = Rule(
    code="XLA141",
    name="xla-process-group",
    summary='`init_process_group("nccl", ...)` -> `init_process_group("xla", init_method="xla://")`',
    why=(
        "NCCL needs CUDA. On XLA the collectives go through the `xla` backend, registered by "
        "`import torch_xla.distributed.xla_backend`, with the `xla://` rendezvous, which takes rank "
        "and world size from the XLA runtime (passing them as well is an error there). A `gloo` "
        "group (CPU collectives) is left alone."
    ),
    before=(
        "import torch.distributed as dist\n\n"
        "dist.init_process_group(\"nccl\", rank=rank, world_size=world_size)\n"
    ),
    after=(
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend  # noqa: F401\n\n"
        "dist.init_process_group(\"xla\", init_method=\"xla://\")\n"
    ),
    valid=(
        "import torch.distributed as dist\n\ndist.init_process_group(\"gloo\")\n",
    ),
)

DDP = Rule(
    code="XLA142",
    name="ddp-device-ids",
    summary="`DistributedDataParallel(m, device_ids=...)`: no device ids; `gradient_as_bucket_view=True`",
    why=(
        "`device_ids`/`output_device` name CUDA devices. On XLA DDP wraps the module on its own "
        "device, and torch_xla's guide adds `gradient_as_bucket_view=True` so gradients are not "
        "copied into the all-reduce buckets."
    ),
    before=(
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "model = DDP(model, device_ids=[rank], output_device=rank)\n"
    ),
    after=(
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "model = DDP(model, gradient_as_bucket_view=True)\n"
    ),
)

LAUNCH = Rule(
    code="XLA143",
    name="xla-launch",
    summary="`mp.spawn(fn, args, nprocs=n)` -> `torch_xla.launch(fn, args=args)`; samplers shard by the runtime",
    why=(
        "torch_xla starts one process per XLA device itself and calls `fn(index, *args)`, like "
        "`mp.spawn`; `nprocs` is not yours to choose (the runtime refuses other counts). "
        "`MpDeviceLoader` does not shard data, so a `DistributedSampler`'s `num_replicas`/`rank` "
        "come from `xr.world_size()`/`xr.global_ordinal()`."
    ),
    before=(
        "import torch.multiprocessing as mp\nfrom torch.utils.data import DistributedSampler\n\n"
        "def main(rank, world_size):\n"
        "    sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank)\n\n"
        "mp.spawn(main, args=(world_size,), nprocs=world_size, join=True)\n"
    ),
    after=(
        "from torch.utils.data import DistributedSampler\n"
        "import torch_xla\nimport torch_xla.runtime as xr\n\n"
        "def main(rank, world_size):\n"
        "    sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal())\n\n"
        "torch_xla.launch(main, args=(world_size,))\n"
    ),
)

COMPILE = Rule(
    code="XLA144",
    name="compile-openxla",
    summary='`torch.compile(m)` -> `torch.compile(m, backend="openxla")`',
    why=(
        "Inductor generates CUDA/CPU kernels and cannot take XLA tensors. torch_xla 2.9's dynamo "
        "backend is `openxla` (training and inference); inductor's `mode=`/`options=` do not apply "
        "to it and are dropped."
    ),
    before="import torch\n\nmodel = torch.compile(model, mode=\"max-autotune\")\n",
    after="import torch\n\nmodel = torch.compile(model, backend=\"openxla\")\n",
)

_PG = {"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"}
_DDP = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel",
        "torch.nn.DistributedDataParallel"}
_SPAWN = {"torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn"}
_SAMPLER = {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
_COMPILE = {"torch.compile"}


def _arg(name: str, value: str) -> cst.Arg:
    return keyword_arg(name, cst.parse_expression(value))


def _find(call: cst.Call, keyword: str, position: Optional[int]) -> Optional[int]:
    for i, a in enumerate(call.args):
        if a.keyword is not None and a.keyword.value == keyword:
            return i
        if a.keyword is None and position is not None and i == position:
            return i
    return None


class Distributed(XlaCodemod):
    DESCRIPTION = "Move process groups, DDP, process launch and torch.compile to their XLA forms."
    RESPECTS_HAND_PORTS = True
    RULES = (PROCESS_GROUP, DDP, LAUNCH, COMPILE)
    TRIGGERS = (b"init_process_group", b"DistributedDataParallel", b"DDP", b"spawn", b"compile",
                b"DistributedSampler")
    NEEDS = tuple(f"torch:{n}" for n in (
        "init_process_group", "DistributedDataParallel", "DDP", "spawn", "compile", "DistributedSampler"))

    def regions(self, tree):
        found = tree.statements_where(lambda n: n.value in (
            "init_process_group", "DistributedDataParallel", "DDP", "spawn", "compile", "DistributedSampler"),
            (cst.Name,))
        return found + [tree.statement_of(s) for s in _backend_choices(tree, self.qualnames).values()]

    def visit_Module(self, node: cst.Module) -> None:
        source = self.tree.source
        self._spawns = b"spawn" in source
        self._choices = _backend_choices(self.tree, self.qualnames)  # id -> "nccl" string of an accelerator choice

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString):
        if id(original_node) not in self._choices:
            return updated_node
        backend = self.target.process_group_backend
        if not self.flag(original_node, PROCESS_GROUP.code, f'backend chosen for the accelerator: "nccl" -> '
                         f'"{backend}"', fix=True):
            return updated_node
        self.add_imports(self.target.process_group_imports)
        quote = "'" if original_node.value.startswith("'") else '"'
        return cst.SimpleString(f"{quote}{backend}{quote}")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        q = self.qualnames(original_node.func)
        if q & _PG:
            return self._process_group(original_node, updated_node)
        if q & _DDP:
            return self._ddp(original_node, updated_node)
        if q & _SPAWN:
            return self._spawn(original_node, updated_node)
        if q & _SAMPLER and self._spawns and self.target.launch:
            return self._sampler(original_node, updated_node)
        if q & _COMPILE:
            return self._compile(original_node, updated_node)
        return updated_node

    def _process_group(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        i = _find(original, "backend", 0)
        if i is not None and string_value(original.args[i].value) in ("gloo", "mpi", self.target.process_group_backend):
            return updated
        if i is not None and _choice_name(original.args[i].value) in _chosen_names(self._choices, self.tree):
            return self._keep_choice(original, updated, i)
        if i is not None and string_value(original.args[i].value) is None and not self._holds_nccl(original.args[i].value):
            # chosen at run time (timm picks gloo on the CPU): not ours to force
            self.flag(original, PROCESS_GROUP.code, "process group backend chosen at run time: on XLA it must be "
                      '"xla" with init_method="xla://" (and import torch_xla.distributed.xla_backend)', fix=False)
            return updated
        if not self.flag(original, PROCESS_GROUP.code, f'process group -> "{self.target.process_group_backend}"',
                         fix=True):
            return updated
        self.add_imports(self.target.process_group_imports)
        backend = cst.Arg(cst.SimpleString(f'"{self.target.process_group_backend}"'))
        if self.target.process_group_init is None:  # keep the caller's rendezvous, change the backend
            rest = [a for k, a in enumerate(updated.args) if k != i]
            return updated.with_changes(args=comma_separated([backend] + rest))
        kept = [a for k, a in enumerate(updated.args)
                if k != i and a.keyword is not None and a.keyword.value in ("timeout", "pg_options")]
        init_key, _, init_value = self.target.process_group_init.partition("=")
        return updated.with_changes(args=comma_separated([backend, _arg(init_key, init_value)] + kept))

    def _keep_choice(self, original: cst.Call, updated: cst.Call, i: int) -> cst.Call:
        """``init_process_group(backend=choice)`` where ``choice`` is now the
        target's backend for the accelerator: the target's rendezvous, the
        choice kept."""
        if self.target.process_group_init is None:
            return updated
        if not self.flag(original, PROCESS_GROUP.code, f'process group: init_method for the '
                         f'"{self.target.process_group_backend}" backend', fix=True):
            return updated
        self.add_imports(self.target.process_group_imports)
        init_key, _, init_value = self.target.process_group_init.partition("=")
        backend = updated.args[i].with_changes(keyword=cst.Name("backend"), equal=tight_equal())
        kept = [a for k, a in enumerate(updated.args)
                if k != i and a.keyword is not None and a.keyword.value in ("timeout", "pg_options")]
        return updated.with_changes(args=comma_separated([backend, _arg(init_key, init_value)] + kept))

    def _holds_nccl(self, value: cst.CSTNode) -> bool:
        """A name (``args.dist_backend``) whose only value in the module is
        "nccl": an assignment or an argparse default for that name."""
        name = (dotted(value) or "").rsplit(".", 1)[-1]
        if not name:
            return False
        values = []
        for node in find_all(self.tree.module, (cst.Assign, cst.Call)):
            if isinstance(node, cst.Assign) and any((dotted(t.target) or "").rsplit(".", 1)[-1] == name
                                                    for t in node.targets):
                values.append(string_value(node.value))
            elif isinstance(node, cst.Call) and (dotted(node.func) or "").endswith("add_argument") and any(
                    (string_value(a.value) or "").lstrip("-").replace("-", "_") == name
                    for a in node.args if a.keyword is None):
                values += [string_value(a.value) for a in node.args if a.keyword and a.keyword.value == "default"]
        return bool(values) and all(v == "nccl" for v in values)

    def _ddp(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        drop = {k for k, a in enumerate(original.args)
                if (a.keyword is not None and a.keyword.value in ("device_ids", "output_device"))
                or (a.keyword is None and k in (1, 2))}
        has_extra = self.target.ddp_extra is not None and any(
            a.keyword is not None and a.keyword.value == self.target.ddp_extra.split("=")[0] for a in original.args)
        if not drop and (self.target.ddp_extra is None or has_extra):
            return updated
        if not self.flag(original, DDP.code, "DDP: device_ids/output_device dropped", fix=True):
            return updated
        args = [a for k, a in enumerate(updated.args) if k not in drop]
        if self.target.ddp_extra and not has_extra:
            key, _, value = self.target.ddp_extra.partition("=")
            args.append(_arg(key, value))
        return updated.with_changes(args=comma_separated(args))

    def _spawn(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not original.args or self.target.keeps_spawn:
            return updated
        fn = updated.args[0].value
        root = (dotted(original.func) or "").split(".")[0]
        if self.tree.imports.get(root) == "torch.multiprocessing":  # import torch.multiprocessing as mp
            self.remove_unused_import("torch.multiprocessing", asname=root)
        i = _find(original, "args", 1)
        spawn_args = updated.args[i].value if i is not None else None
        if self.target.launch is None:  # one process, here: fn(0, *args)
            if not self.flag(original, LAUNCH.code, "spawn -> one process", fix=True):
                return updated
            args = [cst.Arg(cst.Integer("0"))]
            if spawn_args is not None:
                args.append(cst.Arg(spawn_args, star="*"))
            return cst.Call(func=fn, args=comma_separated(args))
        if not self.flag(original, LAUNCH.code, f"spawn -> `{self.target.launch}` (one process per XLA device)",
                         fix=True):
            return updated
        self.add_imports(self.target.launch_imports)
        args = [cst.Arg(fn)]
        if spawn_args is not None:
            args.append(keyword_arg("args", spawn_args))
        return cst.Call(func=cst.parse_expression(self.target.launch), args=comma_separated(args))

    def _sampler(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        values = {"num_replicas": "xr.world_size()", "rank": "xr.global_ordinal()"}
        args = list(updated.args)
        changed = False
        for k, a in enumerate(original.args):
            if a.keyword is not None and a.keyword.value in values:
                new = values[a.keyword.value]
                if source_of(a.value) != new:
                    args[k] = args[k].with_changes(value=cst.parse_expression(new))
                    changed = True
        if changed and self.flag(original, LAUNCH.code, "DistributedSampler shards by the XLA runtime", fix=True):
            self.add_imports((("torch_xla.runtime", None, "xr"),))
            return updated.with_changes(args=args)
        return updated

    def _compile(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not original.args or original.args[0].keyword is not None:
            return updated
        backend = self.target.compile_backend
        i = _find(original, "backend", None)
        if backend is None:  # the eager reference: torch.compile(m) -> m
            if self.flag(original, COMPILE.code, "torch.compile dropped (eager reference)", fix=True):
                return updated.args[0].value
            return updated
        if i is not None and string_value(original.args[i].value) == backend:
            return updated
        if not self.flag(original, COMPILE.code, f'torch.compile -> backend="{backend}"', fix=True):
            return updated
        args = [a for k, a in enumerate(updated.args)
                if k != i and not (a.keyword is not None and a.keyword.value in ("mode", "options"))]
        args.insert(1, _arg("backend", f'"{backend}"'))
        return updated.with_changes(args=comma_separated(args))


def _choice_name(value: cst.CSTNode) -> str:
    return dotted(value) or ""


def _backend_choices(tree, qualnames) -> Dict[int, cst.SimpleString]:  # type: ignore[no-untyped-def]
    """The "nccl" strings of backend choices made for the accelerator --
    ``backend = "nccl" if torch.cuda.is_available() else "gloo"`` -- for a
    name the module passes to ``init_process_group``: every value the name is
    given is "nccl" or "gloo", one of them "nccl"."""
    memo = tree.memo.get("backend_choices")
    if isinstance(memo, dict):
        return memo
    used = set()
    for call in tree.nodes((cst.Call,)):
        if qualnames(call.func) & _PG:  # type: ignore[attr-defined]
            i = _find(call, "backend", 0)  # type: ignore[arg-type]
            if i is not None and dotted(call.args[i].value):  # type: ignore[attr-defined]
                used.add(dotted(call.args[i].value))  # type: ignore[attr-defined]
    found: Dict[int, cst.SimpleString] = {}
    for name in used:
        values = [a.value for a in tree.nodes((cst.Assign,))  # type: ignore[attr-defined]
                  if any(dotted(t.target) == name for t in a.targets)]  # type: ignore[attr-defined]
        strings = [s for v in values for s in _choice_strings(v)]
        if values and strings and len(strings) == sum(len(_leaves(v)) for v in values) \
                and {string_value(s) for s in strings} <= {"nccl", "gloo"} \
                and "nccl" in {string_value(s) for s in strings}:
            found.update({id(s): s for s in strings if string_value(s) == "nccl"})  # type: ignore[misc]
    tree.memo["backend_choices"] = found
    return found


def _leaves(value: cst.CSTNode) -> List[cst.CSTNode]:
    if isinstance(value, cst.IfExp):
        return _leaves(value.body) + _leaves(value.orelse)
    return [value]


def _choice_strings(value: cst.CSTNode) -> List[cst.SimpleString]:
    return [v for v in _leaves(value) if isinstance(v, cst.SimpleString) and string_value(v) is not None]


def _chosen_names(choices: Dict[int, cst.SimpleString], tree) -> set:  # type: ignore[no-untyped-def]
    """The names whose values hold one of ``choices``."""
    names = set()
    if not choices:
        return names
    for a in tree.nodes((cst.Assign,)):
        if any(id(s) in choices for s in _choice_strings(a.value)):  # type: ignore[attr-defined]
            names |= {dotted(t.target) for t in a.targets}  # type: ignore[attr-defined]
    return names
