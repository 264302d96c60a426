"""XLA413: a DataLoader that keeps its last, partial batch (reported, with the fix).

A loader of ``batch_size=B`` hands the loop ``len(dataset) % B`` rows in its
last batch of every epoch, unless that is 0.  XLA traces that step again at
the smaller shape and compiles a graph for it: one more compile of the whole
training step (forward, backward and optimizer) for a training loader, of the
forward for an evaluation loader.  It is a fixed cost, not growth -- the same
sizes recur every epoch, and verify reports them as ``new_graph`` events --
but on a TPU a training step's compile can take minutes.

Not rewritten: ``drop_last=True`` leaves rows out of every epoch, and padding
needs the metric to leave the padded rows out; either changes what the
program computes, so the choice is the user's.  A shuffled loader is told
``drop_last=True`` (it leaves out different rows each epoch); an unshuffled
one, to pad its dataset to a multiple of the batch size.

Speaks only in code being ported (``analysis.cuda.being_ported``), where the
loader is made.
"""

from __future__ import annotations

import libcst as cst

from codemods.analysis.cuda import being_ported, ported_needs
from codemods.analysis.data_loaders import DATALOADER_NAMES, batching, first_batch_only
from codemods.base import Rule, XlaCodemod

PARTIAL_BATCH = Rule(
    code="XLA413",
    name="partial-last-batch",
    summary="a DataLoader keeps its last, smaller batch: XLA compiles the step once more for it (reported)",
    why=(
        "XLA compiles a graph for every shape it meets. A DataLoader with `batch_size=B` and no `drop_last` "
        "ends each epoch with a batch of `len(dataset) % B` rows (unless that is 0), so the step is traced and "
        "compiled again at that size: one more compile of the whole training step for a training loader, of the "
        "forward for an evaluation loader. The sizes recur every epoch, so it is a fixed cost, not growth (verify "
        "reports it as a `new_graph` event), but a training step's compile on a TPU can take minutes. A shuffled "
        "training loader usually takes `drop_last=True` (it leaves out different rows every epoch); an evaluation "
        "loader whose metric needs every row can pad its dataset to a multiple of the batch size and leave the "
        "padded rows out of the metric. Either changes what the program computes, so `convert` only reports it."
    ),
    before=(
        "import torch\nfrom torch.utils.data import DataLoader\n\nmodel = model.cuda()\n"
        "loader = DataLoader(ds, batch_size=64, shuffle=True)\n"
    ),
    after=None,
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
    DESCRIPTION = "Report DataLoaders whose last, partial batch XLA compiles a graph of its own for."
    RULES = (PARTIAL_BATCH,)
    TRIGGERS = (b"DataLoader",)
    NEEDS = ported_needs("name:DataLoader")

    @classmethod
    def wanted(cls, tree, options):
        return being_ported(tree)

    def regions(self, tree):
        return tree.statements_where(lambda n: n.value == "DataLoader", (cst.Name,))

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualnames(node.func) & DATALOADER_NAMES:
            return
        found = batching(self.tree, node)
        if found is None or found.batch_size is None or found.drops_last or first_batch_only(self.tree, node):
            return
        size = cst.Module([]).code_for_node(found.batch_size)
        pad = f"pad its dataset to a multiple of `{size}` and leave the padding out of the metric"
        fix = (f"`drop_last=True` suits a shuffled training loader; an evaluation loader can {pad}" if found.shuffled
               else f"{pad}, or accept the one graph more")
        self.flag(node, PARTIAL_BATCH.code, f"DataLoader keeps a smaller last batch (unless the dataset's length is a "
                  f"multiple of `{size}`): XLA compiles the step once more for it; {fix}", fix=False)


__all__ = ["PartialBatches", "PARTIAL_BATCH"]
