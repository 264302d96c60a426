"""Where a loop inside a model's ``forward`` needs a barrier, if anywhere.

No loop there is a step loop: a layer loop or an RNN unrolled in a training
step must stay one graph.  Two kinds of loop that feed their state back to
a model every pass are samplers all the same (a diffusion sampler written
as a module), and without a barrier every pass joins the pending graph:

* one that reads a value on the host every pass (zoubohao's DDPM asserts
  ``torch.isnan(x_t).int().sum() == 0``): the read runs a graph of every
  pass so far, compiled again each pass -- the barrier goes right before
  the read;
* one that draws random numbers for the device every pass and reads
  nothing (w86763777/pytorch-ddpm's ``GaussianDiffusionSampler``): all
  passes make one graph as large as the sampling is long -- the barrier
  ends the pass.

``barriers.StepBarrier`` asks :func:`model_loop_barrier`; the ``ast``
prefilter's loose side of it is ``prefilter_steps.draws_every_pass`` /
``reads_every_pass`` (the names of the draws: ``steps.RANDOM_DRAWS``)."""

from __future__ import annotations

from typing import Optional, Set, Tuple

import libcst as cst

from codemods.analysis import Loop
from codemods.analysis.bindings import target_names
from codemods.analysis.loops import body_statements, own_nodes
from codemods.analysis.pass_reads import has_exit
from codemods.analysis.placement import host_read, reads_truth
from codemods.analysis.state import ends_flow
from codemods.analysis.steps import RANDOM_DRAWS, RANDOM_FILLS, called_like_a_model
from codemods.syntax.nodes import call_name, dotted
from codemods.syntax.tree import find_all

TORCH_DRAWS = frozenset(f"torch.{name}" for name in RANDOM_DRAWS)
READ = ("loop in a model's forward that reads a value every pass: `torch_xla.sync()` added right before the read "
        "(it runs this pass, not every pass so far)")
DRAWS = ("sampler loop in a model's forward (it draws random numbers every pass and feeds its state back): "
         "`torch_xla.sync()` added at the end of each pass (one graph a pass, compiled once, instead of every pass "
         "joined into one graph as large as the sampling is long)")


def model_loop_barrier(tree, loop: Loop, tensors: Set[str], qualnames) -> Optional[Tuple[int, str]]:  # type: ignore[no-untyped-def]
    """(the index in the loop's body where the barrier goes, why) for a
    loop of a model's forward that feeds its state back to a model (the
    caller has found that); None where it needs none."""
    k = pass_read(tree, loop, tensors, qualnames)
    if k is not None:
        return k, READ
    if not draws_every_pass(loop, qualnames):
        return None
    stmts = list(loop.body.body)  # type: ignore[attr-defined]
    return (len(stmts) - 1 if ends_flow(stmts[-1]) else len(stmts)), DRAWS


def pass_read(tree, loop: Loop, tensors: Set[str], qualnames) -> Optional[int]:  # type: ignore[no-untyped-def]
    """The first statement of the loop's own level that reads a tensor on
    the host (a read call, or an ``assert``/``if`` on a tensor) and runs
    no model itself, after something computed in the pass; None where
    there is none or the body can end or skip early."""
    stmts = body_statements(loop)
    if has_exit(stmts, (cst.Break, cst.Return, cst.Continue)):
        return None
    stop = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
    for k, stmt in enumerate(stmts):
        if isinstance(stmt, cst.If):
            tests, calls = [stmt.test], find_all(stmt.test, cst.Call, stop=stop)
        elif isinstance(stmt, cst.SimpleStatementLine):
            tests = [s.test for s in stmt.body if isinstance(s, cst.Assert)]
            calls = find_all(stmt, cst.Call, stop=stop)
        else:
            continue
        if not (any(reads_truth(t, tensors, qualnames) for t in tests)
                or any(host_read(tree, c, tensors, qualnames) for c in calls)):  # type: ignore[arg-type]
            continue
        if k == 0 or any(called_like_a_model(dotted(c.func) or "") for c in calls):  # type: ignore[attr-defined]
            return None
        return k
    return None


def draws_every_pass(loop: Loop, qualnames) -> bool:  # type: ignore[no-untyped-def]
    """A sampling loop: its own level draws random numbers for the device
    every pass (``torch.randn_like(x)``, ``torch.randn(s, device=d)``,
    ``noise.normal_()``), and it walks no modules (a layer loop calls what
    it walks; LayerDrop's coin, ``torch.rand([]) < p``, is drawn on the host)."""
    body = loop.body
    if not isinstance(body, cst.IndentedBlock):
        return False
    calls = [c for s in body.body if not isinstance(s, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef))
             for c in own_nodes(s, cst.Call)]
    walked = {n.value for n in target_names(loop.target)} if isinstance(loop, cst.For) else set()
    if any(type(c.func) is cst.Name and c.func.value in walked for c in calls):  # type: ignore[attr-defined]
        return False
    return any(device_draw(c, qualnames(c.func)) for c in calls)  # type: ignore[attr-defined]


def device_draw(call: cst.Call, names: Set[str]) -> bool:
    """``torch.randn_like(x)``, a draw given a ``device=``, or an in-place
    fill (``x.normal_()``): random numbers drawn where a tensor lives."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in RANDOM_FILLS:
        return True
    return bool(names & TORCH_DRAWS) and ((call_name(call) or "").endswith("_like") or any(
        a.keyword is not None and a.keyword.value == "device" for a in call.args))
