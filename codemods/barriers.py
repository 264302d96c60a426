"""XLA302: the step barrier at the end of the loop that carries state.

XLA tensors are lazy: without a barrier every iteration of a loop is appended
to one growing graph.  ``torch_xla.sync()`` at the end of the *step* loop cuts
one graph per step, compiled once and reused.  Only the step loop gets it: not
the epoch loop around it, not helper loops inside it, and never a loop that
already syncs (an existing barrier, ``xm.optimizer_step(..., barrier=True)``,
or a loop over an ``MpDeviceLoader``, which syncs after every batch).  A
module that already syncs by hand somewhere (code ported by its authors, like
diffusers >= 0.31) gets no new barrier: its other step loops are reported.
"""

from __future__ import annotations

from typing import List, Tuple, Union

import libcst as cst

from codemods.analysis.prefilter import LOADER_LOOP, STEP_LOOP
from codemods.analysis import (
    Loop,
    is_barrier_call,
    module_facts,
)
from codemods.analysis.loops import (
    body_statements,
    in_model_code,
    loop_step_kind,
    model_functions,
)
from codemods.analysis.model_loops import model_loop_barrier
from codemods.analysis.pass_reads import has_exit
from codemods.analysis.state import ends_flow
from codemods.analysis.kinds import model_source_triggers
from codemods.analysis.steps import trigger_words
from codemods.base import Rule, find_all, statement
from codemods.barrier_sites import BarrierSites
from codemods.loop_codemod import LoopCodemod
from codemods.syntax.hoist import joined_then_read

STEP_BARRIER = Rule(
    code="XLA302",
    name="step-barrier",
    summary="insert the step barrier (`torch_xla.sync()`) at the end of the step loop",
    why=(
        "Without a barrier every iteration is recorded into one ever-growing lazy graph: "
        "a 50-step denoising loop becomes one enormous graph that takes very long to "
        "compile, and a training loop never executes until it ends. A barrier as the last "
        "statement of the loop that carries state (the training step, the denoising step) "
        "compiles one small graph once and reuses it every step. It is also placed before "
        "`continue` at that level, so skipped iterations are cut too. In a module that already "
        "syncs by hand (code its authors ported, such as diffusers >= 0.31) nothing is added: "
        "a step loop there without a barrier is reported for review. Steps are followed through the "
        "module's own calls (functions, `self` methods, closures) to any depth; only a sync on every path "
        "through the body counts as a barrier (not one under a flag); the micro-steps of gradient "
        "accumulation share the barrier after the optimizer step. When the body reads a tensor on the host after "
        "its optimizer step (`total += loss.item()`, or a call of the module's own that reads, `record(loss)`), the "
        "barrier goes right after that step, as experts place it (and after what follows it that only updates "
        "tensors on the device: an average of the weights kept by a function or a plain helper object of the program, "
        "`ema(model, ema_model, decay)`, `ema_helper.update(model)`, which so joins the step's graph): "
        "the read then finds the step computed instead of running the pending step as a graph of its own; so too "
        "in a loop over `MpDeviceLoader`, which syncs only when the next batch is asked for (each read would run the "
        "forward pass again), and in an evaluation loop over one that reads every batch, right before its first read. "
        "What the body computes on the device after that point (an accuracy: `_, predicted = outputs.max(1)`, or a "
        "call of a function of the program that only computes tensors, `prec1 = accuracy(output, target)[0]`, also "
        "one imported from a module of the project; a meter of the program whose `update` only sums what it is "
        "handed, `top1.update(acc1[0], n)`; and the sum a read computes, `correct += "
        "predicted.eq(targets).sum().item()`, into `correct_step` first) moves before the barrier and joins the step's "
        "graph, where nothing it skips over binds, uses or may change what it touches. A print deferred to a step "
        "closure after that barrier runs at the device loader's next sync; over no device loader, a second barrier "
        "ends the body, which runs the closures and no graph. A function the loop runs every step that takes "
        "the optimizer step itself and then reads the host (pyGAT's `train(epoch)`: the step, a validation forward, "
        "five `.item()` reads) gets the barrier inside, right before its first such read (codemods/"
        "step_function_barriers.py); the loop then syncs through it. "
        "Likewise in a loop that is not a training step (a sampler, a decoder fed its own output) and reads a "
        "value it computed on every pass (`out.append(tok.item())`): the barrier goes right before that read, "
        "one graph execution per pass instead of the read's and then the barrier's. A read that computes what it "
        "reads (`ims = torch.clamp(x, -1, 1).cpu()`) is split: the value is computed into its target before the "
        "barrier and copied after it (`ims = torch.clamp(x, -1, 1)`, the barrier, `ims = ims.cpu()`); a read in "
        "each branch of an `if`/`else` decided on the host gets the barrier in each branch, a read in some of its "
        "branches (`if i % 20 == 0: frames.append(x.cpu())`) the barrier before the `if`, a read in a loop inside "
        "the pass of a value computed before it (`for k in range(n): log.append(loss.item())`) the barrier before "
        "that loop; a host copy kept in a "
        "list before a later read (`x0_preds.append(x0_t.to('cpu'))`, then `xs.append(xt_next.to('cpu'))`) moves to "
        "just after the barrier before that read, when nothing between changes it or touches the list. A loop inside a model's "
        "`forward` (a layer loop, an RNN unrolled in the step) gets no barrier, except one that feeds its state "
        "back to a model and reads it on the host every pass (a sampler written as a module, asserting on its "
        "state): the read already runs a graph every pass, of every pass so far, so the barrier goes right before it; "
        "and one that feeds its state back to a model and draws random numbers every pass (a diffusion sampler "
        "written as a module, `x = mean + sigma * torch.randn_like(x)`), which reads nothing: without a barrier its "
        "passes all join one graph, as large as the sampling is long, so the barrier ends each pass."
    ),
    before=(
        "for x, y in batches:\n    loss = loss_fn(model(x), y)\n    loss.backward()\n"
        "    optimizer.step()\n    optimizer.zero_grad()\n"
    ),
    after=(
        "import torch_xla\n\nfor x, y in batches:\n    loss = loss_fn(model(x), y)\n    loss.backward()\n"
        "    optimizer.step()\n    optimizer.zero_grad()\n    torch_xla.sync()\n"
    ),
    valid=(
        # already synced: left alone
        "import torch_xla.core.xla_model as xm\nfor x in batches:\n    model(x).sum().backward()\n"
        "    optimizer.step()\n    xm.mark_step()\n",
        # the epoch loop around a step loop gets nothing
        "for x in batches:\n    total = total + x\n",
        # a model's layer loops are not step loops (no barrier inside forward)
        "class Down:\n    def forward(self, hidden_states):\n"
        "        for downsampler in self.downsamplers:\n            hidden_states = downsampler(hidden_states)\n"
        "        for block in self.blocks:\n            sample, res = block(hidden_states=sample)\n"
        "        return hidden_states\n",
        # fetching or unwrapping a model is not running it
        "for name in components:  # before each step\n    sub_model = _unwrap_model(getattr(self, name))\n    sub_model = _unwrap_model(sub_model)\n    save(sub_model)\n",
        # the loop's state lives on the host (an ONNX/NumPy pipeline)
        "for t in timesteps:\n    noise = unet(sample=latents, timestep=t)\n"
        "    latents = scheduler.step(torch.from_numpy(noise), t, torch.from_numpy(latents)).prev_sample\n"
        "    latents = latents.numpy()\n",
        # moving entries between dicts is not feeding a model's output back
        "for field_name in list(denoiser_fields):\n    if field_name in args:\n"
        "        kwargs[field_name] = denoiser_fields.pop(field_name)\n",
        # a Flax module: its loops are JAX's
        "import jax\nfor i in range(n):\n    latents, state = loop_body(i, (latents, state))\n"
        "    latents = scheduler.step(state, noise, t, latents)\n",
        # a shape loop in a scheduler's step(): `step_size` is no step (diffusers' sde_ve)
        "def step(self, model_output, sample):\n    while len(step_size.shape) < len(sample.shape):\n"
        "        step_size = step_size.unsqueeze(-1)\n",
        # a down-sampling layer and a streamer are not samplers or steps
        "for t in range(3):\n    h = self.sub_sample(h)\nfor token in tokens:\n    streamer.step(token, ids)\n",
        # building layers in __init__ (SAM) and a recurrence a layer's forward calls (xLSTM)
        "class Decoder(nn.Module):\n    def __init__(self, n):\n        for _ in range(n):\n"
        "            mlps += [SamFeedForward(8, 8)]\n    def forward(self, x):\n        return recurrent(x)\n\n"
        "def recurrent(x):\n    for t in range(x.shape[2]):\n        h = step_fn(h, x[:, :, t])\n    return h\n",
        # a method forward calls (timm hrnet's forward_features); a row-by-row update
        # (a logits processor); `timesteps` is no step (piflow)
        "class Net(nn.Module):\n    def forward(self, x):\n        return self.head(self.features(x))\n"
        "    def features(self, x):\n        for i, m in enumerate(self.incre):\n            y = m(x[i]) + down.forward(y)\n"
        "        return y\n",
        "for b, seq in enumerate(input_ids):\n    ids = self._score_rejection_sampling(seq, scores[b])\n"
        "    out[b, ids] = out[b, ids] + self.bias\n",
        "for k in range(n):\n    sigma_t = shift_timesteps(raw_t - k, shift)\n    x = x + v * sigma_t\n",
        # data named "samples" is not a sampler (qwen2-vl's _repeat_interleave_samples)
        "for key in inputs:\n    inputs[key] = _repeat_interleave_samples(inputs[key], lengths)\n",
        # ring attention inside an autograd Function's forward (diffusers' attention_dispatch)
        "class Ring(torch.autograd.Function):\n    def forward(ctx, q, k):\n        for i in range(world):\n"
        "            out, lse = forward_op(ctx, q, k, prev_out=out, prev_lse=lse)\n        return out\n",
        # a wrapper forwarding its arguments to another scheduler's step (accelerate's AcceleratedScheduler)
        "class Wrapped:\n    def step(self, *args, **kwargs):\n        for _ in range(self.n):\n"
        "            self.scheduler.step(*args, **kwargs)\n",
        # a loop whose step function syncs on every call syncs already
        "import torch_xla.core.xla_model as xm\n\ndef train_step(x):\n    model(x).sum().backward()\n"
        "    opt.step()\n    xm.mark_step()\n\nfor x in batches:\n    train_step(x)\n",
        # an LR scheduler's step with arguments steps no model (known from what built it)
        "import torch\nsched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)\nfor epoch in range(9):\n"
        "    sched.step(val_loss, epoch)\n",
        # a loop over a device loader handed in by the caller syncs already (torch_xla's examples)
        "import torch_xla.distributed.parallel_loader as pl\n\ndef loop_fn(loader):\n    for x in loader:\n"
        "        model(x).sum().backward()\n        opt.step()\n\nloop_fn(pl.MpDeviceLoader(train_loader, device))\n",
        # a sync under an XLA-availability test (diffusers' `if XLA_AVAILABLE: xm.mark_step()`) is taken on XLA
        "import torch_xla.core.xla_model as xm\nfor t in timesteps:\n    latents = unet(latents, t)\n"
        "    if XLA_AVAILABLE:\n        xm.mark_step()\n",
        # a loop that sums a loss module over targets is no step loop (a loss is no model)
        "import torch.nn as nn\nmse = nn.MSELoss()\nfor t in targets:\n    loss = loss + mse(y, t)\n",
        # gradient accumulation: the micro-steps need no barrier of their own when the
        # loop that takes the optimizer step syncs (one graph per optimizer step)
        "import torch_xla\nfor it in range(n):\n    for micro in range(k):\n        model(x[micro]).sum().backward()\n"
        "    opt.step()\n    opt.zero_grad()\n    torch_xla.sync()\n",
    ),
)


_OTHER_FRAMEWORKS = ("jax", "flax", "tensorflow")


def _other_framework(tree) -> bool:
    """A JAX/Flax or TensorFlow module that never imports torch: its loops are
    not PyTorch steps (diffusers ships Flax pipelines beside the torch ones)."""
    roots = {full.lstrip(".").split(".")[0] for full in tree.imports.values()}
    return bool(roots & set(_OTHER_FRAMEWORKS)) and "torch" not in roots


# how a barrier after the step says that what follows joins the step's graph (analysis.step_tail)
_JOINED = " and the lines after it that only compute tensors"
_UPDATED = " and the update of tensors after it (an average of the weights)"


class StepBarrier(BarrierSites, LoopCodemod):
    DESCRIPTION = "Insert the XLA step barrier at the end of each step loop."
    RULES = (STEP_BARRIER,)
    # every word a step loop can be recognised by: step and model names (analysis.steps), and every
    # source of a model the dataflow knows (analysis.kinds), derived from their definitions
    TRIGGERS = trigger_words() + model_source_triggers()
    NEEDS = (STEP_LOOP, LOADER_LOOP)  # (a module of evaluation passes alone: an `evaluate.py`)

    @classmethod
    def wanted(cls, tree, options):
        return bool(module_facts(tree).hot_loops) and not _other_framework(tree)

    def regions(self, tree):
        return module_facts(tree).hot_loops  # (a loader loop that is no step loop: an evaluation pass)

    def rewrite_loop(self, original: Loop, updated: Loop) -> Union[Loop, cst.CSTNode]:
        if self.target.sync is None or not self.enabled(STEP_BARRIER.code):
            return updated
        if not self.is_step_loop(original):
            if isinstance(original, cst.For) and self.loaders.iterates_device_loader(original) and \
                    isinstance(updated.body, cst.IndentedBlock):
                # an evaluation pass that keeps its metrics in objects (`losses.update(loss.item())`): no
                # state carried by name, no step; what it reads every batch still runs the forward again
                return self._device_loader_loop(original, updated, (cst.Continue,))
            return self._model_loop_read(original, updated)
        body = updated.body
        if not isinstance(body, cst.IndentedBlock) or not body.body or self._one_graph_generation(original):
            return updated
        # prints deferred to step closures run at the next barrier: a loop
        # left by break/return before its barrier would lose them
        exits: Tuple[type, ...] = (cst.Continue,) + ((cst.Break, cst.Return) if self._defers(original) else ())
        if self._synced(original):
            # synced on every path (by hand, or a converted `torch.cuda.synchronize()`), but a closure
            # handed over after that sync would wait for the next pass's, which a break never reaches
            return self._flushed_before_exits(original, updated, exits)
        if isinstance(original, cst.For) and self.loaders.iterates_device_loader(original):
            return self._device_loader_loop(original, updated, exits)
        if self._syncs_by_hand():
            # ported by hand already (diffusers >= 0.31): its authors chose where
            # to sync; point at the loop, change nothing
            self.flag(original, STEP_BARRIER.code,
                      "step loop without a barrier in a module that already syncs by hand: "
                      "add one here if this loop runs on the device", fix=False)
            return updated
        after = self._after_optimizer_step(original, exits)
        where = f"right after its optimizer step{_UPDATED * self._updated(original, after)}" \
                f"{_JOINED * self._joins(original, after)} (the host reads after it " \
                "find the step computed)"
        read = None
        if after is None:
            read = self._before_first_read(original, exits)
            after = None if read is None else read.k
            where = "" if read is None else read.words(body_statements(original))
        flush = self._flushed_at_end(original, after)
        if after is None:
            where = "as its last statement"
        elif flush:
            where += ", and another as its last statement (the step closures handed over after the first run there)"
        if not self.flag(original, STEP_BARRIER.code, f"step loop: `torch_xla.sync()` added {where}", fix=True):
            return updated
        self.add_imports(self.target.sync_imports)
        stmts = list(body.body)
        if read is not None and read.receiver is None and not (read.branches or read.deferred or read.inner):
            stmts = self._after_step_joined(original, stmts, read.k)  # (a read of a name: what follows may join)
        elif read is not None:
            stmts = read.place(stmts, body_statements(original), self._barrier())
        elif after is not None:
            stmts = self._after_step_joined(original, stmts, after)
        new_body = _before_exits(stmts, exits, self._barrier())
        last = new_body[-1]
        if after is not None and not flush or _is_exit(last, exits):
            pass  # the barrier follows the optimizer step, or the one before the exit is there
        elif ends_flow(last):
            new_body.insert(len(new_body) - 1, self._barrier())
        else:
            new_body.append(self._barrier())
        return updated.with_changes(body=body.with_changes(body=new_body))

    def _device_loader_loop(self, original: Loop, updated: Loop, exits: Tuple[type, ...]) -> Loop:
        """A loop over a device loader: it syncs at the next batch, not after a break."""
        if any(is_barrier_call(c, self.target.barrier_names, self.qualnames)  # type: ignore[arg-type]
               for c in find_all(original.body, cst.Call)):
            return updated  # synced by hand (before its break, say)
        return self._flushed_before_exits(original, self._synced_after_step(original, updated, exits), exits)

    def _synced_after_step(self, original: Loop, updated: Loop, exits: Tuple[type, ...]) -> Loop:
        """A loop over a device loader that reads the host after its
        optimizer step every pass (kuangliu/pytorch-cifar's `train_loss +=
        loss.item()` for its progress bar): the loader syncs only when the
        next batch is asked for, so each read runs the part of the step it
        needs as a graph of its own -- the forward again for each -- and the
        loader's sync the whole step.  The barrier right after the step runs
        it once; the reads find it computed (the same values).  A step
        closure handed over after the barrier runs at the loader's sync, as
        it did with no barrier (a print deferred after the step: XLA210)."""
        after = self._after_optimizer_step(original, exits)
        where = f"step loop over a device loader that reads the host after its optimizer step: `torch_xla.sync()` " \
                f"added right after that step{_UPDATED * self._updated(original, after)}" \
                f"{_JOINED * self._joins(original, after)}"
        if after is None:
            after = self._evaluation_read(original, exits)
            where = "loop over a device loader that reads the host every batch (an evaluation pass): " \
                    f"`torch_xla.sync()` added right before its first read" \
                    f"{', the tensors its reads need computed first' * self._joins(original, after)}"
        body = updated.body
        if after is None or not isinstance(body, cst.IndentedBlock) or self._syncs_by_hand():
            return updated
        if not self.flag(original, STEP_BARRIER.code, f"{where} (the loader syncs at the next batch only: each read "
                         "would run the forward again)", fix=True):
            return updated
        self.add_imports(self.target.sync_imports)
        return updated.with_changes(body=body.with_changes(body=self._after_step_joined(original, list(body.body), after)))

    def _after_step_joined(self, original: Loop, stmts: List[cst.BaseStatement],
                           k: int) -> List[cst.BaseStatement]:
        """``stmts`` with the barrier before statement ``k`` and what joins the step's graph
        (``analysis.step_tail``) moved before it, where the lines are the loop's own."""
        before = body_statements(original)
        tail = self._step_tail(original, k)
        if not tail or len(before) != len(stmts) or not all(a.deep_equals(b) for a, b in zip(before, stmts)):
            return [*stmts[:k], self._barrier(), *stmts[k:]]
        return joined_then_read(list(before), k, tail.moved, tail.split, self._barrier())

    def _flushed_before_exits(self, original: Loop, updated: Loop, exits: Tuple[type, ...]) -> Loop:
        """``updated`` with a barrier before each break/return of its own
        (``exits`` beyond ``continue``, where the loop defers prints): the
        step closures handed over in the last pass run."""
        body = updated.body
        if len(exits) < 2 or not has_exit(body.body, exits[1:]):  # type: ignore[attr-defined]
            return updated
        flushed = _before_exits(list(body.body), exits[1:], self._barrier())  # type: ignore[attr-defined]
        if len(flushed) == len(body.body) and all(a.deep_equals(b) for a, b in zip(flushed, body.body)) or \
                not self.flag(original, STEP_BARRIER.code, "`torch_xla.sync()` before break/return: the step's "
                              "deferred prints run", fix=True):  # type: ignore[attr-defined]
            return updated  # (each has its barrier already: a second run)
        self.add_imports(self.target.sync_imports)
        return updated.with_changes(body=body.with_changes(body=flushed))

    def _model_loop_read(self, original: Loop, updated: Loop) -> Loop:
        """A loop inside a model's ``forward`` that feeds its state back to a
        model and reads a value on the host, or draws random numbers, every
        pass (``analysis.model_loops``): the barrier goes where that module
        says (a layer loop or an RNN unrolled in a step gets none)."""
        called = self._memo("model_functions", self.tree.module, lambda: model_functions(self.tree))
        if not in_model_code(original, self.tree.parents, called) or \
                loop_step_kind(self.tree, original, self.steps) != "feedback":
            return updated
        body = updated.body
        if not isinstance(body, cst.IndentedBlock) or self._synced(original) or self._syncs_by_hand():
            return updated
        site = model_loop_barrier(self.tree, original, self.tensors, self.qualnames)
        if site is None or not self.flag(original, STEP_BARRIER.code, site[1], fix=True):
            return updated
        return self._with_barrier_at(updated, site[0])

    def _with_barrier_at(self, updated: Loop, k: int) -> Loop:
        """``updated`` with the barrier as statement ``k`` of its body."""
        self.add_imports(self.target.sync_imports)
        body = updated.body
        stmts = list(body.body)  # type: ignore[attr-defined]
        stmts.insert(k, self._barrier())
        return updated.with_changes(body=body.with_changes(body=stmts))

    def _barrier(self) -> cst.SimpleStatementLine:
        return statement(self.target.sync_node())


def _is_exit(stmt: cst.CSTNode, kinds: Tuple[type, ...]) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(s, kinds) for s in stmt.body)


def _before_exits(stmts: List[cst.BaseStatement], exits: Tuple[type, ...],
                  barrier: cst.SimpleStatementLine) -> List[cst.BaseStatement]:
    """Put a barrier before every ``continue`` (and, given, ``break`` and
    ``return``) of this loop's own level."""

    class _Continue(cst.CSTTransformer):
        def visit_For(self, node: cst.For) -> bool:
            return False

        def visit_While(self, node: cst.While) -> bool:
            return False

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def leave_IndentedBlock(self, original_node, updated_node):
            out: List[cst.BaseStatement] = []
            for s in updated_node.body:
                if _is_exit(s, exits) and not (out and out[-1].deep_equals(barrier)):
                    out.append(barrier)
                out.append(s)
            return updated_node.with_changes(body=out)

    fixed: List[cst.BaseStatement] = []
    for s in stmts:
        if _is_exit(s, exits):
            if not (fixed and fixed[-1].deep_equals(barrier)):
                fixed.append(barrier)
            fixed.append(s)
        elif isinstance(s, cst.SimpleStatementLine):
            fixed.append(s)
        else:
            fixed.append(s.visit(_Continue()))  # type: ignore[arg-type]
    return fixed
