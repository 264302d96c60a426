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

from codemods.analysis.cuda import CudaFacts, cuda_facts, cuda_references, scope_of
from codemods.analysis.data_loaders import DATALOADER_NAMES
from codemods.analysis.loops import (
    LOADER_NAME_RE,
    Loop,
    ModuleFacts,
    body_statements,
    has_barrier,
    hot_methods,
    is_barrier_call,
    is_device_loader_expr,
    is_step_call,
    is_step_loop,
    loop_iterable,
    module_facts,
    own_nodes,
    step_functions,
)
from codemods.analysis.tensors import is_tensor_expr, reads_tensor_value, tensor_names

__all__ = [
    "CudaFacts", "cuda_facts", "cuda_references", "scope_of", "DATALOADER_NAMES", "LOADER_NAME_RE", "Loop",
    "ModuleFacts", "body_statements", "has_barrier", "hot_methods", "is_barrier_call", "is_device_loader_expr",
    "is_step_call", "is_step_loop", "is_tensor_expr", "loop_iterable", "module_facts", "own_nodes",
    "reads_tensor_value", "step_functions", "tensor_names",
]
