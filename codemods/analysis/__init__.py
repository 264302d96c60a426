"""What xlaport knows about a program, computed once per tree and shared by
every codemod (no rules here).

* :mod:`codemods.analysis.values` -- what each name **holds**, by dataflow
  (reaching definitions, the module's own classes, functions, call sites and
  attributes): a tensor, a device, a model, an optimizer, an LR scheduler, a
  sampler, a loader, a device loader, a host value;
* :mod:`codemods.analysis.loops` -- how a **step loop** is recognised (state
  carried through a model or sampler call, a training step -- asking
  ``values`` first, names only when it cannot tell), layer loops, which loops
  already sync (also through a function that syncs), what runs every step;
* :mod:`codemods.analysis.state` -- which calls run a model and which loops
  carry (or feed back) a model's output from one iteration to the next;
* :mod:`codemods.analysis.tensors` -- which names hold tensors;
* :mod:`codemods.analysis.dataflow` -- which bindings reach a use, what each
  binds, what call sites pass (what ``values``, ``placement`` and ``ordinals``
  read);
* :mod:`codemods.analysis.data_loaders` -- data loaders and device loaders
  by every binding and call site, and the loops that walk them;
* :mod:`codemods.analysis.cuda` -- the **CUDA surface**: every CUDA-specific
  reference in a module, which names hold device *strings*, which hold
  GradScalers, which scopes launch worker processes.
"""

# Imported when first asked for (PEP 562): a module of this package that needs
# no LibCST (``project``, ``prefilter``) is imported without it
_WHERE = {
    "CudaFacts": "codemods.analysis.cuda",
    "cuda_facts": "codemods.analysis.cuda",
    "cuda_references": "codemods.analysis.cuda",
    "scope_of": "codemods.analysis.cuda",
    "DATALOADER_NAMES": "codemods.analysis.data_loaders",
    "LOADER_NAME_RE": "codemods.analysis.loops",
    "Loop": "codemods.analysis.loops",
    "ModuleFacts": "codemods.analysis.loops",
    "body_statements": "codemods.analysis.loops",
    "has_barrier": "codemods.analysis.loops",
    "hot_methods": "codemods.analysis.loops",
    "is_barrier_call": "codemods.analysis.loops",
    "is_device_loader_expr": "codemods.analysis.loops",
    "is_step_call": "codemods.analysis.loops",
    "is_step_loop": "codemods.analysis.loops",
    "loop_iterable": "codemods.analysis.loops",
    "module_facts": "codemods.analysis.loops",
    "own_nodes": "codemods.analysis.loops",
    "step_functions": "codemods.analysis.loops",
    "is_tensor_expr": "codemods.analysis.tensors",
    "reads_tensor_value": "codemods.analysis.tensors",
    "tensor_names": "codemods.analysis.tensors",
}


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "CudaFacts", "cuda_facts", "cuda_references", "scope_of", "DATALOADER_NAMES", "LOADER_NAME_RE", "Loop",
    "ModuleFacts", "body_statements", "has_barrier", "hot_methods", "is_barrier_call", "is_device_loader_expr",
    "is_step_call", "is_step_loop", "is_tensor_expr", "loop_iterable", "module_facts", "own_nodes",
    "reads_tensor_value", "step_functions", "tensor_names",
]
