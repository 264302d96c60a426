"""XLA413: a DataLoader that keeps its last, partial batch (reported, with the
fix; the fix made on a shuffled loader with ``--unsafe-fixes``).

A loader of ``batch_size=B`` hands the loop ``len(dataset) % B`` rows in its
last batch of every epoch, unless that is 0.  XLA traces that step again at
the smaller shape and compiles a graph for it: one more compile of the whole
training step (forward, backward and optimizer) for a training loader, of the
forward for an evaluation loader.  It is a fixed cost, not growth -- the same
sizes recur every epoch, and verify reports them as ``new_graph`` events --
but on a TPU a training step's compile can take minutes.

``drop_last=True`` leaves rows out of every epoch, and padding needs the
metric to leave the padded rows out; either changes what the program
computes, so the choice is the user's.  A shuffled loader is told
``drop_last=True`` (it leaves out different rows each epoch), and
``--unsafe-fixes`` (Ruff's name for a fix that may change what the code
does) adds it; an unshuffled one, or one walked only with autograd off (an
evaluation loader: ``analysis.data_loaders.evaluation_only``), is told to
pad its dataset to a multiple of the batch size, and left.

Speaks only in code being ported (``analysis.cuda.being_ported``), where the
loader is made.
"""

from __future__ import annotations

import libcst as cst

from codemods.analysis.cuda import being_ported, ported_needs
from codemods.analysis.data_loaders import DATALOADER_NAMES, batching, evaluation_only, first_batch_only
from codemods.base import Rule, XlaCodemod
from codemods.syntax.nodes import keyword_arg, with_arg

PARTIAL_BATCH = Rule(
    code="XLA413",
    name="partial-last-batch",
    summary="a DataLoader keeps its last, smaller batch: XLA compiles the step once more for it (reported; "
            "`drop_last=True` on a shuffled one with --unsafe-fixes)",
    why=(
        "XLA compiles a graph for every shape it meets. A DataLoader with `batch_size=B` and no `drop_last` "
        "ends each epoch with a batch of `len(dataset) % B` rows (unless that is 0), so the step is traced and "
        "compiled again at that size: one more compile of the whole training step for a training loader, of the "
        "forward for an evaluation loader. The sizes recur every epoch, so it is a fixed cost, not growth (verify "
        "reports it as a `new_graph` event), but a training step's compile on a TPU can take minutes. A shuffled "
        "training loader usually takes `drop_last=True` (it leaves out different rows every epoch); an evaluation "
        "loader whose metric needs every row can pad its dataset to a multiple of the batch size and leave the "
        "padded rows out of the metric. Either changes what the program computes, so `convert` reports it, and "
        "adds `drop_last=True` to a shuffled loader only when asked to make such fixes (`--unsafe-fixes`, or "
        "`unsafe-fixes = true` in `[tool.xlaport]`); a dataset of fewer rows than a batch then gives no batch "
        "at all. A shuffled loader walked only with autograd off (its loops under `torch.no_grad()` or "
        "`inference_mode`, where the loader is used or in a function of the module it is handed to: pytorch/examples' "
        "mnist `test(model, device, test_loader)`) is an evaluation loader and never gets it; one that may be walked "
        "anywhere else is taken for a training loader."
    ),
    before=(
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = model.cuda()\n"
        "loader = DataLoader(ds, batch_size=64, shuffle=True)\n"
    ),
    after=(
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = model.cuda()\n"
        "loader = DataLoader(ds, batch_size=64, shuffle=True, drop_last=True)\n"
    ),
    example_options=(("unsafe_fixes", True),),
    unsafe=True,
    options=(("unsafe_fixes", "add `drop_last=True` to a shuffled loader (its epochs leave out up to B - 1 rows)"),),
    valid=(
        # the default batch size is 1: no batch is partial
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = model.cuda()\nloader = DataLoader(ds)\n",
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = model.cuda()\n"
        "loader = DataLoader(ds, batch_size=64, shuffle=True, drop_last=True)\n",
        # the user's own batches, or a drop_last chosen at run time
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = model.cuda()\n"
        "loader = DataLoader(ds, batch_sampler=buckets)\n",
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = model.cuda()\n"
        "loader = DataLoader(ds, batch_size=64, drop_last=args.drop_last)\n",
        # only its first batch is read
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = model.cuda()\n"
        "loader = DataLoader(ds, batch_size=64, shuffle=True)\nx, y = next(iter(loader))\n",
        # keywords from a dict that cannot be read here
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = model.cuda()\n"
        "loader = DataLoader(ds, **make_kwargs())\n",
        # host code: no CUDA here
        "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=64)\n",
    ),
)


class PartialBatches(XlaCodemod):
    DESCRIPTION = "Report DataLoaders whose last, partial batch XLA compiles a graph of its own for (with unsafe fixes: drop it)."
    RULES = (PARTIAL_BATCH,)
    TRIGGERS = (b"DataLoader",)
    NEEDS = ported_needs("name:DataLoader")

    @classmethod
    def wanted(cls, tree, options):
        return being_ported(tree)

    def regions(self, tree):
        return tree.statements_where(lambda n: n.value == "DataLoader", (cst.Name,))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.qualnames(original_node.func) & DATALOADER_NAMES:
            return updated_node
        found = batching(self.tree, original_node)
        if found is None or found.batch_size is None or found.drops_last or first_batch_only(self.tree, original_node):
            return updated_node
        size = cst.Module([]).code_for_node(found.batch_size)
        evaluation = found.shuffled and evaluation_only(self.tree, original_node)  # (walked with autograd off)
        droppable = found.shuffled and not evaluation and not _names_drop_last(original_node)
        if droppable and self.option("unsafe_fixes", False):
            if self.flag(original_node, PARTIAL_BATCH.code, f"`drop_last=True` added (an unsafe fix: every epoch "
                         f"leaves out its last `len(dataset) % {size}` rows, other ones each epoch as it shuffles, and a "
                         f"dataset of fewer than `{size}` rows gives no batch at all): no smaller last batch for XLA "
                         "to compile the step once more for", fix=True):
                return with_arg(updated_node, keyword_arg("drop_last", cst.Name("True")))
            return updated_node
        pad = f"pad its dataset to a multiple of `{size}` and leave the padding out of the metric"
        if found.shuffled and not evaluation:
            fix = (f"`drop_last=True` suits a shuffled training loader (`--unsafe-fixes` adds it); an evaluation "
                   f"loader can {pad}")
        elif evaluation:
            fix = (f"it is an evaluation loader (its loops run under `torch.no_grad()`): {pad}, or accept the one "
                   "graph more")
        else:
            fix = f"{pad}, or accept the one graph more"
        self.flag(original_node, PARTIAL_BATCH.code, f"DataLoader keeps a smaller last batch (unless the dataset's "
                  f"length is a multiple of `{size}`): XLA compiles the step once more for it; {fix}", fix=False,
                  unsafe_fix=droppable)
        return updated_node


def _names_drop_last(call: cst.Call) -> bool:
    """A ``drop_last`` written in the call itself (``drop_last=False``: the
    user's choice, said and left)."""
    return any(a.keyword is not None and a.keyword.value == "drop_last" for a in call.args)


__all__ = ["PartialBatches", "PARTIAL_BATCH"]
