"""What xlaport knows about a program, computed once per tree and shared by
every codemod (no rules here).

* :mod:`codemods.analysis.loops` -- how a **step loop** is recognised, the hot
  region (code that runs once per step), which names hold tensors, loaders;
* :mod:`codemods.analysis.cuda` -- the **CUDA surface**: every CUDA-specific
  reference in a module, which names hold device *strings*, which hold
  GradScalers, which scopes launch worker processes.
"""

from codemods.analysis.cuda import CudaFacts, cuda_facts, cuda_references, scope_of
from codemods.analysis.loops import (
    DATALOADER_NAMES,
    LOADER_NAME_RE,
    Loop,
    LoopCodemod,
    ModuleFacts,
    body_statements,
    has_barrier,
    hot_methods,
    is_barrier_call,
    is_device_loader_expr,
    is_step_call,
    is_step_loop,
    is_tensor_expr,
    loop_iterable,
    module_facts,
    own_nodes,
    reads_tensor_value,
    step_functions,
    tensor_names,
)

__all__ = [
    "CudaFacts", "cuda_facts", "cuda_references", "scope_of", "DATALOADER_NAMES", "LOADER_NAME_RE", "Loop", "LoopCodemod",
    "ModuleFacts", "body_statements", "has_barrier", "hot_methods", "is_barrier_call", "is_device_loader_expr",
    "is_step_call", "is_step_loop", "is_tensor_expr", "loop_iterable", "module_facts", "own_nodes",
    "reads_tensor_value", "step_functions", "tensor_names",
]
