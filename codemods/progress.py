"""XLA2xx (progress bars): tqdm and diffusers' progress_bar off the hot path.

A progress bar updates on the host every step; with a tensor-valued postfix
it forces a host read every step, and even without one it keeps the Python
loop from running ahead of the device.  By default bars are removed (the
``with`` block is dropped and its body dedented, bar method calls deleted, the
tqdm import removed when unused).  With the ``keep_progress`` option the bars
stay and only their tensor-reading postfixes go.

Two codemods, run at different points (``codemods.registry.ORDER``):
``BarIterables`` unwraps ``for x in tqdm(loader)`` before the loader rule
reads the loop; ``BarBlocks`` drops ``with`` blocks after the loop rules, so
that they read the loops where the user wrote them and, on most files, the
dedent is the last rewrite (nothing analyses the tree again).
"""

from __future__ import annotations

from typing import Dict, Optional, Set, Tuple, Union

import libcst as cst

from codemods.analysis import reads_tensor_value, tensor_names
from codemods.base import Rule, TreeCache, XlaCodemod, call_name, dotted, find_all

TQDM = {"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.autonotebook.tqdm",
        "tqdm.rich.tqdm", "tqdm.asyncio.tqdm"}
TRANGE = {"tqdm.trange", "tqdm.auto.trange", "tqdm.notebook.trange", "tqdm.std.trange", "tqdm.autonotebook.trange"}
BAR_METHODS = {"update", "set_postfix", "set_postfix_str", "set_description", "set_description_str",
               "refresh", "close", "reset", "clear", "display", "unpause"}
POSTFIX_METHODS = {"set_postfix", "set_postfix_str", "set_description", "set_description_str"}
_PURE_CALLS = {"len", "getattr", "hasattr", "isinstance", "min", "max", "abs", "int", "bool"}

BAR_ITERABLE = Rule(
    code="XLA201",
    name="progress-bar-iterable",
    summary="`for x in tqdm(it)` / `trange(n)`: iterate the plain iterable",
    why=(
        "A progress bar refreshes on the host at every step and keeps the Python loop in "
        "lock-step with it; on XLA the loop should only trace the step and move on. The "
        "torch_xla migration guide removes bars from the hot loop. Use `keep_progress` "
        "(`--keep-progress`) to keep them."
    ),
    before=(
        "import torch\nfrom tqdm import tqdm, trange\n\nfor x in tqdm(data, desc=\"train\"):\n    step(x)\n"
        "for i in trange(10):\n    step(i)\npbar = tqdm(data)\nfor x in pbar:\n    step(x)\n    pbar.update()\n"
    ),
    after=(
        "import torch\n\nfor x in data:\n    step(x)\nfor i in range(10):\n    step(i)\n"
        "pbar = data\nfor x in pbar:\n    step(x)\n"
    ),
    options=(("keep_progress", "keep bars; drop only postfixes that read tensors"),),
)

BAR_BLOCK = Rule(
    code="XLA202",
    name="progress-bar-block",
    summary="`with tqdm(...) as bar:` / `with self.progress_bar(...)`: drop the block, keep its body",
    why=(
        "The bar's context manager only exists to draw the bar; its body is the loop. "
        "Removing the `with` and dedenting its body keeps the program's behaviour and takes "
        "the bar off the hot path (what the hand port of diffusers' pipelines did). A bar the "
        "code uses for more than being iterated and updated (stored, passed on, read) is reported "
        "where it is made and left in place: removing it would leave that use unbound."
    ),
    before=(
        "with self.progress_bar(total=n) as progress_bar:\n    for t in timesteps:\n"
        "        latents = step(latents, t)\n        progress_bar.update()\n"
    ),
    after="for t in timesteps:\n    latents = step(latents, t)\n",
)

BAR_POSTFIX = Rule(
    code="XLA203",
    name="progress-bar-tensor-postfix",
    summary="kept bars: `set_postfix(loss=loss.item())` and the like are dropped",
    why=(
        "With `keep_progress`, bars stay, but a postfix or description built from a tensor "
        "(`loss.item()`, an f-string of a tensor) still reads it on the host every step and "
        "splits the step's graph, so only those calls go. (Without `keep_progress` the whole "
        "bar goes, its method calls with it, under XLA201/XLA202.)"
    ),
    before=(
        "import torch\nfrom tqdm import tqdm\n\npbar = tqdm(data)\nfor x in pbar:\n    loss = torch.relu(x)\n"
        "    pbar.set_postfix(loss=loss.item())\n    pbar.update()\n"
    ),
    after=(
        "import torch\nfrom tqdm import tqdm\n\npbar = tqdm(data)\nfor x in pbar:\n    loss = torch.relu(x)\n"
        "    pbar.update()\n"
    ),
    example_options=(("keep_progress", True),),
    options=(("keep_progress", "keep bars; drop only postfixes that read tensors"),),
)


class _Bars(XlaCodemod):
    """What both codemods know of bars: which calls make one, which bars the
    code uses beyond iterating and updating them, and how a bar's method
    calls and its import go.  Each codemod removes the bars it ``owns``."""

    TRIGGERS = (b"tqdm", b"trange", b"progress_bar")
    NEEDS = ("name:tqdm", "name:trange", "name:progress_bar")  # (see regions)

    def regions(self, tree):
        """Statements that mention a bar: ``tqdm``/``trange``/``progress_bar``
        or a name bound to one (``with tqdm(...) as pbar``, ``pbar = tqdm(x)``)."""
        names = {"tqdm", "trange", "progress_bar"}
        tree.parents  # builds the type index
        for n in tree.in_walk_order((cst.WithItem, cst.Assign)):
            if isinstance(n, cst.WithItem) and n.asname is not None:
                bound, value = n.asname.name, n.item
            elif isinstance(n, cst.Assign) and len(n.targets) == 1:
                bound, value = n.targets[0].target, n.value
            else:
                continue
            if isinstance(bound, cst.Name) and any(x.value in names for x in find_all(value, cst.Name)):  # (the index)
                names.add(bound.value)
        return tree.statements_where(lambda n: n.value in names, (cst.Name,))

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # an eager target (TorchTPU) runs ahead of no graph: its bars stay, as with `keep_progress`
        self.keep = bool(self.option("keep_progress", False)) or self.target.sync is None
        self.bar_names: Set[str] = set()
        self.block_bars: Set[str] = set()
        self.tensors: Set[str] = set()
        self.escaped: Dict[int, Tuple[str, int]] = {}  # id(binding) -> (bar, line of a use that keeps it)
        self.kept_bars: Set[str] = set()

    # ---------------------------------------------------------------- helpers
    def _bar_kind(self, node: cst.CSTNode) -> Optional[str]:
        """'tqdm', 'trange', 'progress_bar' for a call that makes a bar."""
        if not isinstance(node, cst.Call):
            return None
        if call_name(node) == "progress_bar" and isinstance(node.func, cst.Attribute):
            return "progress_bar"
        if not self._tqdm_imported():
            return None  # no need for the (costly) scope analysis
        q = self.qualnames(node.func)
        if q & TQDM:
            return "tqdm"
        if q & TRANGE:
            return "trange"
        if not q and isinstance(node.func, cst.Name) and node.func.value in {"tqdm", "trange"}:
            return node.func.value  # imported in a way we cannot resolve
        return None

    def visit_Module(self, node: cst.Module) -> None:
        if self.keep:  # only postfixes that read tensors go then
            self.tensors = tensor_names(node, self.qualnames)
            for fn in find_all(node, cst.FunctionDef):
                self.tensors |= tensor_names(fn.body, self.qualnames)  # type: ignore[attr-defined]
        for with_ in find_all(node, cst.With):
            for item in with_.items:  # type: ignore[attr-defined]
                if self._bar_kind(item.item) and item.asname is not None and isinstance(item.asname.name, cst.Name):
                    self.bar_names.add(item.asname.name.value)
                    self.block_bars.add(item.asname.name.value)
                    self._check_escape(with_, item.asname.name.value)
        for assign in find_all(node, cst.Assign):
            if self._bar_kind(assign.value) in {"tqdm", "trange"}:  # type: ignore[attr-defined]
                for t in assign.targets:  # type: ignore[attr-defined]
                    if isinstance(t.target, cst.Name):
                        self.bar_names.add(t.target.value)
                        self._check_escape(assign, t.target.value)

    def _check_escape(self, binding: cst.CSTNode, name: str) -> None:
        """A bar used for more than being iterated and updated -- stored
        (``state.bar = bar``), passed on, read (``bar.n``) -- cannot go: the
        code that holds it would fail.  Its binding is reported instead."""
        scope = next((a for a in self.ancestors(binding) if isinstance(a, (cst.FunctionDef, cst.Module))),
                     self.tree.module)
        use = _escaping_use(self.tree, scope, name)
        if use is not None:
            self.escaped[id(binding)] = (name, self.user_line(self.position(use)[0]))  # type: ignore[index]
            self.kept_bars.add(name)

    # ------------------------------- a bar's method calls: with their bar, or (keep_progress) XLA203
    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine):
        if len(original_node.body) != 1 or not isinstance(original_node.body[0], cst.Expr):
            return updated_node
        call = original_node.body[0].value
        if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
            return updated_node
        receiver = dotted(call.func.value)
        method = call.func.attr.value
        if receiver not in self.bar_names or method not in BAR_METHODS:
            return updated_node
        if not self.keep and receiver in self.kept_bars:
            return updated_node  # its bar stays (reported where it is made)
        if self.keep:
            rule = BAR_POSTFIX
            if method not in POSTFIX_METHODS or reads_tensor_value(call, self.tensors, self.qualnames) is None:
                return updated_node
            message = f"`{receiver}.{method}(...)` reads a tensor every step; dropped"
        else:
            # goes with its bar, under the rule that removed the bar
            rule = BAR_BLOCK if receiver in self.block_bars else BAR_ITERABLE
            message = f"`{receiver}.{method}(...)` dropped with the progress bar"
        if rule not in self.RULES:
            return updated_node  # the other codemod's
        if not self.flag(original_node, rule.code, message, fix=True):
            return updated_node
        return cst.RemoveFromParent()

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if not updated_node.body and original_node.body:
            return updated_node.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        """An ``if`` left holding only the ``pass`` of a removed call goes too."""
        body = updated_node.body
        if (
            updated_node.orelse is None
            and isinstance(body, cst.IndentedBlock)
            and len(body.body) == 1
            and _is_pass(body.body[0])
            and not (isinstance(original_node.body, cst.IndentedBlock) and _is_pass(original_node.body.body[0]))
            and all(call_name(c) in _PURE_CALLS for c in find_all(original_node.test, cst.Call))
        ):
            return cst.RemoveFromParent()
        return updated_node

    def _report_escape(self, node: cst.CSTNode, code: str, escaped: Tuple[str, int]) -> None:
        name, line = escaped
        self.flag(node, code, f"progress bar `{name}` kept: line {line} uses it beyond iterating and updating "
                              "it; take it off the hot path by hand", fix=False)

    def _tqdm_imported(self) -> bool:
        found = self.tree.memo.get("tqdm_imported")  # (asked for every call: read once per tree)
        if found is None:
            imports = self.tree.imports
            found = self.tree.memo["tqdm_imported"] = (
                "tqdm" in imports or "trange" in imports or any(v.startswith("tqdm") for v in imports.values()))
        return bool(found)

    def _drop_import(self) -> None:
        if not self._tqdm_imported():
            return
        for name in ("tqdm", "trange"):
            for module in ("tqdm", "tqdm.auto", "tqdm.notebook", "tqdm.autonotebook"):
                self.remove_unused_import(module, name)
        self.remove_unused_import("tqdm")


class BarIterables(_Bars):
    DESCRIPTION = "Iterate the plain iterable where a loop walks a tqdm/trange bar."
    RULES = (BAR_ITERABLE,)
    # (before the loader rule: `for x in tqdm(loader)` must read as a loop over the loader)
    TRIGGERS = (b"tqdm", b"trange")
    NEEDS = ("name:tqdm", "name:trange")

    # ---------------------------------------------------------------- XLA201
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.keep:
            return updated_node
        kind = self._bar_kind(original_node)
        if kind not in {"tqdm", "trange"}:
            return updated_node
        parent = self.parent(original_node)
        used_as_iterable = (
            isinstance(parent, cst.For)
            or isinstance(parent, cst.Assign)
            or (isinstance(parent, cst.Arg) and isinstance(self.parent(parent), cst.Call)
                and call_name(self.parent(parent)) in {"enumerate", "zip", "iter"})
        )
        if not used_as_iterable:
            return updated_node
        plain = self._unwrap(updated_node, kind)  # type: ignore[arg-type]
        if plain is None:
            return updated_node
        if id(parent) in self.escaped:
            self._report_escape(original_node, BAR_ITERABLE.code, self.escaped[id(parent)])
            return updated_node
        if not self.flag(original_node, BAR_ITERABLE.code, f"progress bar `{kind}(...)` -> the plain iterable", fix=True):
            return updated_node
        self._drop_import()
        return plain

    def _unwrap(self, call: cst.Call, kind: str) -> Optional[cst.BaseExpression]:
        if kind == "trange":
            positional = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in call.args if a.keyword is None]
            if not positional:
                return None
            positional = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for a in positional[:-1]] + positional[-1:]
            return cst.Call(func=cst.Name("range"), args=positional)
        for a in call.args:
            if a.keyword is None and a.star == "":
                return a.value
            if a.keyword is not None and a.keyword.value == "iterable":
                return a.value
        return None


class BarBlocks(_Bars):
    DESCRIPTION = "Drop progress-bar `with` blocks, dedenting their body, or only their tensor-reading postfixes."
    RULES = (BAR_BLOCK, BAR_POSTFIX)

    # ---------------------------------------------------------------- XLA202
    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> Union[cst.BaseStatement, cst.FlattenSentinel]:
        if self.keep or len(original_node.items) != 1:
            return updated_node
        if not self._bar_kind(original_node.items[0].item):
            return updated_node
        body = updated_node.body
        if not isinstance(body, cst.IndentedBlock):
            return updated_node
        if id(original_node) in self.escaped:
            self._report_escape(original_node, BAR_BLOCK.code, self.escaped[id(original_node)])
            return updated_node
        if not self.flag(original_node, BAR_BLOCK.code, "progress-bar `with` block removed; body dedented", fix=True):
            return updated_node
        self._drop_import()
        stmts = list(body.body)
        if not stmts:
            return cst.RemoveFromParent()  # type: ignore[return-value]
        first = stmts[0]
        stmts[0] = first.with_changes(leading_lines=[*updated_node.leading_lines, *first.leading_lines])
        return cst.FlattenSentinel(stmts)


def _escaping_use(tree: TreeCache, scope: cst.CSTNode, name: str) -> Optional[cst.CSTNode]:
    """The first load of ``name`` in ``scope`` other than ``for x in name``
    and a statement ``name.<bar method>(...)`` (those go with the bar).
    Only the ``Name`` nodes spelled ``name`` are looked at, each by where
    it stands (the tree's index: no walk of the scope)."""
    parents = tree.parents
    for node in find_all(scope, cst.Name):
        if node.value == name and not _harmless(node, parents):  # type: ignore[attr-defined]
            return node
    return None


def _harmless(name: cst.CSTNode, parents: Dict[int, cst.CSTNode]) -> bool:
    """``name`` binds, is an attribute or keyword, is iterated, or is the bar
    of a statement ``name.<bar method>(...)``."""
    up = parents.get(id(name))
    kind = type(up)
    if kind is cst.For:
        return up.iter is name  # type: ignore[union-attr]
    if kind is cst.Attribute:
        if up.attr is name:  # type: ignore[union-attr]
            return True
        call = parents.get(id(up))
        return (type(call) is cst.Call and call.func is up and up.attr.value in BAR_METHODS  # type: ignore[union-attr]
                and type(parents.get(id(call))) is cst.Expr)
    if kind is cst.Arg:
        return up.keyword is name  # type: ignore[union-attr]
    if kind is cst.AssignTarget:
        return up.target is name  # type: ignore[union-attr]
    if kind in (cst.AsName, cst.FunctionDef, cst.ClassDef, cst.Param):
        return up.name is name  # type: ignore[union-attr]
    return False


def _is_pass(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Pass)
