"""XLA409, XLA410: control flow and shapes that change with the data, so that
XLA compiles a new graph as the steps go on (reported, with the fix).

* XLA409 -- a choice drawn from the host's random numbers inside a loop
  (teacher forcing: ``inp = trg[t] if random.random() < p else pred``, or a
  flag drawn so and tested): each pattern of choices traces another graph, and
  compiles keep growing with the steps (15 -> 21 at 4 -> 8 steps on a real
  seq2seq; 4 -> 7 on fixtures/recompile_fixes).  A draw is Python's or
  numpy's (``random.random()``), or torch's read as a number
  (``torch.rand(1).item() < p``: 4 -> 7 -> 9 compiles at 4, 8 and 12 steps
  on a seq2seq, 2 -> 2 -> 2 chosen on the device).  A conditional expression
  choosing between two tensors is rewritten to choose on the device:
  ``torch.where(torch.tensor([coin], device=pred.device)[0], trg[t], pred)``
  -- the same draw, in the same place, sent as a one-element tensor (a
  zero-dimensional one would be folded into the graph as a constant): one
  graph (1 -> 1), the same values.  So is an ``if`` statement that only
  assigns one target in each branch (``if random.random() < p: inp = trg[t]``
  / ``else: inp = out.argmax(1)``), or that overrides the value the statement
  before gave it (``inp = out.argmax(1)`` / ``if random.random() < p: inp =
  trg[t]``): one assignment, its branches' comments kept above it (4 -> 8
  compiles at 4 -> 8 steps on fixtures/teacher_forcing, 1 -> 1 chosen on the
  device).  A coin drawn in a helper the loop calls (``inp =
  teacher_forcing(out, trg[t])``, its flag ``True if random.random() < p
  else False``) is chosen so there.  Both sides must be tensors read without
  side effects (names, attributes, indexing by names and ints); any other
  ``if`` stays reported.
* XLA410 -- sequences padded to the longest of each batch (``pad_sequence``,
  ``pack_padded_sequence``): every new batch length is a new shape, so a new
  graph.  Pad to a fixed length, or a few bucket lengths.

Both speak only in code being ported (a module with CUDA or XLA code).
"""

from __future__ import annotations

from typing import Optional, Sequence, Set

import libcst as cst

from codemods.analysis.calls import calls_named
from codemods.analysis.cuda import being_ported, ported_needs
from codemods.analysis.steps import HOST_DRAWS
from codemods.analysis.tensors import annotated_tensors, is_tensor_expr, tensor_names
from codemods.analysis.values import values as values_of
from codemods.base import Rule, XlaCodemod, dotted, walk
from codemods.syntax import imports

HOST_COIN = Rule(
    code="XLA409",
    name="host-random-choice",
    summary="a choice drawn from the host's random numbers in a loop (teacher forcing) recompiles as choices vary",
    why=(
        "XLA traces the Python the program runs: `inp = trg[t] if random.random() < ratio else pred` makes one "
        "graph for each pattern of choices, so compiles keep growing with the steps (15 -> 21 at 4 -> 8 steps on "
        "a seq2seq model, XLA's CPU backend); a draw of torch's read as a number (`torch.rand(1).item() < ratio`) "
        "is a host choice too. Draw the step's choices at once and send them as one device tensor "
        "(`flags = torch.tensor([random.random() < ratio for _ in range(T)]).to(device)`), then choose on the "
        "device: `inp = torch.where(flags[t], trg[t], pred)` -- the same random stream, one graph (1 -> 1). "
        "`convert` does this for a conditional expression between two tensors read without side effects, and "
        "for an `if` statement that only assigns one such tensor to the same target in each branch (or "
        "overrides the value the statement before gave it): the draw stays where it was and is sent as a "
        "one-element tensor (a zero-dimensional one is folded into the graph as a constant and still "
        "recompiles). Any other `if` statement on the draw stays reported."
    ),
    before=(
        "import random\nimport torch\n\nmodel = model.cuda()\nfor t in range(1, T):\n"
        "    out, h = model(inp, h)\n    pred = out.argmax(1)\n    inp = trg[t] if random.random() < ratio else pred\n"
    ),
    after=(
        "import random\nimport torch\n\nmodel = model.cuda()\nfor t in range(1, T):\n"
        "    out, h = model(inp, h)\n    pred = out.argmax(1)\n"
        "    inp = torch.where(torch.tensor([random.random() < ratio], device=pred.device)[0], trg[t], pred)\n"
    ),
    valid=("import random\nimport torch\n\nmodel = model.cuda()\nratio = 0.5 if random.random() < 0.5 else 1.0\n",),
)

RAGGED = Rule(
    code="XLA410",
    name="ragged-batches",
    summary="sequences padded to each batch's longest (`pad_sequence`): a new graph for every batch length",
    why=(
        "`pad_sequence` and `pack_padded_sequence` pad to the longest sequence of the batch, so the batch's "
        "shape changes with the data and XLA compiles a new graph for each length it meets (and "
        "`pack_padded_sequence` sorts and splits on the host). Pad every batch to one fixed length, or to a few "
        "bucket lengths (`math.ceil(n / 64) * 64`), and pass a mask or the lengths as a tensor."
    ),
    before=(
        "import torch\nfrom torch.nn.utils.rnn import pad_sequence\n\n"
        "def collate(batch):\n    return pad_sequence(batch).cuda()\n"
    ),
    after=None,
)

# torch's functions that draw from its generator; `torch.rand(1).item()` is a host coin as
# `random.random()` is (the CPU generator, or the device's read back: the choice is made on the host)
_TORCH_DRAWS = ("rand", "randn", "randint")
_PADDING = {"torch.nn.utils.rnn.pad_sequence", "torch.nn.utils.rnn.pack_padded_sequence"}
_LOOPS = (cst.For, cst.While)


class Recompiles(XlaCodemod):
    DESCRIPTION = "Report data-dependent control flow and shapes that recompile: host-random choices, ragged batches."
    RULES = (HOST_COIN, RAGGED)
    TRIGGERS = (b"random", b"rand", b"pad_sequence", b"pack_padded_sequence")
    NEEDS = ported_needs("name~random", *(f"name:{d}" for d in _TORCH_DRAWS), "name:pad_sequence",
                         "name:pack_padded_sequence")

    @classmethod
    def wanted(cls, tree, options):
        return being_ported(tree)

    def regions(self, tree):
        # names bound from a host draw (`teacher_force = random.random() < ratio`), module-wide by their text
        self._coins: Set[str] = set()  # teacher_force = random.random() < ratio
        self._bools: Set[str] = set()  # those of them that hold a bool (not `use_tf and random.random() < p`)
        self._draws_bound: Set[str] = set()  # layerdrop_prob = np.random.random()
        for assign in tree.nodes((cst.Assign,)):
            value = assign.value  # type: ignore[attr-defined]
            if self._draws(value):
                kind = self._coins if isinstance(value, (cst.Comparison, cst.BooleanOperation, cst.UnaryOperation)) \
                    or _truth(value) else self._draws_bound
                kind.update(dotted(t.target) or "" for t in assign.targets)  # type: ignore[attr-defined]
                if _is_bool(value, set()):
                    self._bools.update(dotted(t.target) or "" for t in assign.targets)  # type: ignore[attr-defined]
        self._coins.discard("")
        self._draws_bound.discard("")
        return tree.statements_where(lambda n: "random" in n.value or n.value in _TORCH_DRAWS or n.value in self._coins
                                     or n.value in self._draws_bound
                                     or n.value in ("pad_sequence", "pack_padded_sequence"), (cst.Name,))

    def _draws(self, expr: cst.CSTNode) -> bool:
        """``expr`` draws one number from the host's random number generators
        (``random.random()``, ``np.random.rand()``; not an array of them --
        ``np.random.choice(n, k)`` or a permutation is data, not a choice),
        or torch's, read as a number (``torch.rand(1).item()``)."""
        for n in walk(expr):
            if _torch_draw_read(n, self.qualnames):
                return True
            if isinstance(n, cst.Call) and any(q in HOST_DRAWS for q in self.qualnames(n.func)):
                if not any(a.keyword is not None and a.keyword.value == "size" for a in n.args) \
                        and not (any(q.startswith("numpy.") for q in self.qualnames(n.func)) and len(n.args) > 1):
                    return True
        return False

    def _coin(self, test: cst.CSTNode) -> bool:
        """``test`` compares a host draw (or a name bound to one) or reads a
        flag bound to such a comparison."""
        for n in walk(test):
            if isinstance(n, cst.Comparison) and (self._draws(n) or any(
                    isinstance(m, (cst.Name, cst.Attribute)) and dotted(m) in self._draws_bound for m in walk(n))):
                return True
            if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) in self._coins:
                return True
        return False

    def _loop(self, node: cst.CSTNode, calls: bool = True) -> Optional[cst.CSTNode]:
        """The loop ``node`` runs in: around it in its function, or around a
        call of its function in the module (a helper the decoder loop calls
        every time step: ``decoder_input = teacher_forcing(out, trg[t])``)."""
        for anc in self.ancestors(node):
            if isinstance(anc, _LOOPS):
                return anc
            if isinstance(anc, cst.FunctionDef) and calls:
                method = isinstance(self.parent(self.parent(anc)), cst.ClassDef)  # (def in a class's block)
                return next((loop for _, call in calls_named(self.tree, anc.name.value, on_self=method)
                             for loop in [self._loop(call, calls=False)] if loop is not None), None)
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
        return None

    def _chooses(self, node: cst.CSTNode, test: cst.CSTNode) -> None:
        loop = self._loop(node)
        if loop is not None and self._coin(test):
            self.flag(test, HOST_COIN.code, "a choice drawn from the host's random numbers in a loop: each pattern "
                      "of choices is another XLA graph; draw the choices as one device tensor and choose with "
                      "`torch.where`", fix=False, related=(loop,))

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        loop = self._loop(original_node)
        if loop is None or not self._coin(original_node.test) or _truth(original_node):
            return updated_node  # (`True if coin else False` is the coin, chosen on where it is tested)
        device = self._tensor_side(original_node, (original_node.body, original_node.orelse))
        if device is None:
            self._chooses(original_node, original_node.test)
            return updated_node
        if not self.flag(original_node.test, HOST_COIN.code, "a choice drawn from the host's random numbers in a "
                         "loop: chosen on the device with `torch.where` (the same draw, one graph for every pattern "
                         "of choices)", fix=True, related=(loop,)):
            return updated_node
        return self._on_device(updated_node.test, device, updated_node.body, updated_node.orelse)

    def _on_device(self, test: cst.BaseExpression, device: cst.BaseExpression, then: cst.BaseExpression,
                   other: cst.BaseExpression) -> cst.Call:
        """``torch.where(torch.tensor([test], device=device.device)[0], then,
        other)``: the same draw, sent as a bool, what ``torch.where`` chooses
        by -- as written where it is one (a comparison, ``not``, a flag bound
        to one), else in ``bool(...)`` (``ratio and random.random() < ratio``
        is ``0.0`` where ``ratio`` is: a float tensor ``torch.where``
        refuses)."""
        imports.need(self.context, "torch")
        code = cst.Module([]).code_for_node
        truth = code(test) if _is_bool(test, self._bools) else f"bool({code(test)})"
        coin = cst.parse_expression(f"torch.tensor([{truth}], device={code(device)}.device)[0]")
        return cst.Call(func=cst.parse_expression("torch.where"), args=[cst.Arg(coin), cst.Arg(then), cst.Arg(other)])

    def _tensor_side(self, node: cst.CSTNode, sides) -> Optional[cst.BaseExpression]:  # type: ignore[no-untyped-def]
        """The side of the choice at ``node`` whose device it is sent to,
        when both ``sides`` are tensors read without side effects
        (``trg[t]``, ``pred``); None when the choice cannot move to the device."""
        if not all(_pure(s) for s in sides):
            return None
        fn = next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)
        scope = fn.body if fn is not None else self.tree.module
        tensors = tensor_names(scope, self.qualnames, [], values_of(self.tree),
                               annotated_tensors(fn, self.qualnames) if fn is not None else ())
        known = [s for s in sides if is_tensor_expr(s.value if isinstance(s, cst.Subscript) else s, tensors,
                                                    self.qualnames)]
        # one side a tensor, the other one too or read from an element of a sequence the tensor is chosen
        # against (`trg[t]`, `trg[:, t].unsqueeze(1)`: a batch the function was passed)
        if not known or not all(s in known or any(isinstance(n, cst.Subscript) for n in walk(s)) for s in sides):
            return None
        roots = [_root(s) for s in known]
        return next((r for r in roots if isinstance(r, (cst.Name, cst.Attribute))
                     and (not isinstance(r, cst.Name) or r.value in tensors)), None)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement:
        """``if coin: x = a`` / ``else: x = b`` (or no ``else`` where the
        statement before binds ``x``): one assignment of the choice made on
        the device, as for a conditional expression; any other ``if`` on a
        coin stays reported."""
        loop = self._loop(original_node)
        if loop is None or not self._coin(original_node.test):
            return updated_node
        chosen = self._assigned_choice(original_node)
        device = self._tensor_side(original_node, chosen[1:]) if chosen is not None else None
        if device is None or not self.flag(
                original_node.test, HOST_COIN.code, "a choice drawn from the host's random numbers in a loop: "
                "chosen on the device with `torch.where` in one assignment (the same draw, one graph for every "
                "pattern of choices)", fix=True, related=(loop,)):
            if device is None:
                self._chooses(original_node, original_node.test)
            return updated_node
        target, then, other = chosen  # type: ignore[misc]
        value = self._on_device(updated_node.test, device, then, other)
        return cst.SimpleStatementLine(
            body=[cst.Assign(targets=[cst.AssignTarget(target)], value=value)],
            leading_lines=[*updated_node.leading_lines, *_comments(original_node)])

    def _assigned_choice(self, node: cst.If):  # type: ignore[no-untyped-def]
        """(target, value if the coin holds, value if not) of an ``if`` that
        only assigns one target in each branch (the ``else`` may be left
        out where the statement just before assigns that target: its value
        is the one kept), or None."""
        then = _only_assign(node.body.body)
        if then is None or isinstance(node.orelse, cst.If):
            return None
        code = cst.Module([]).code_for_node
        if node.orelse is not None:
            other = _only_assign(node.orelse.body.body)
            if other is None or code(other[0]) != code(then[0]):
                return None
            return then[0], then[1], other[1]
        parent = self.parent(node)
        body = list(getattr(parent, "body", ()))
        at = next((i for i, s in enumerate(body) if s is node), 0)
        before = _only_assign(body[at - 1:at]) if at > 0 else None
        if before is None or code(before[0]) != code(then[0]) or not isinstance(then[0], cst.Name):
            return None
        return then[0], then[1], then[0]

    def visit_Call(self, node: cst.Call) -> None:
        found = self.qualnames(node.func) & _PADDING
        if found:
            name = sorted(found)[0].rsplit(".", 1)[1]
            self.flag(node, RAGGED.code, f"`{name}` pads to the longest sequence of each batch: a new XLA graph for "
                      "every batch length; pad to a fixed length (or a few bucket lengths)", fix=False)


def _is_bool(node: cst.BaseExpression, flags: Set[str]) -> bool:
    """``node`` is a bool: a comparison, a ``not``, ``True if ... else
    False``, a ``bool(...)``, a name in ``flags``, or ``and``/``or`` of such."""
    if isinstance(node, cst.Comparison) or _truth(node):
        return True
    if isinstance(node, cst.UnaryOperation):
        return isinstance(node.operator, cst.Not)
    if isinstance(node, cst.BooleanOperation):
        return _is_bool(node.left, flags) and _is_bool(node.right, flags)
    if isinstance(node, cst.Call):
        return isinstance(node.func, cst.Name) and node.func.value == "bool"
    return isinstance(node, (cst.Name, cst.Attribute)) and dotted(node) in flags


def _truth(node: cst.BaseExpression) -> bool:
    """``True if coin else False`` (or the other way round): the coin's truth,
    a flag for a later test, not a choice between values."""
    return isinstance(node, cst.IfExp) and all(
        isinstance(side, cst.Name) and side.value in ("True", "False") for side in (node.body, node.orelse))


def _only_assign(body: Sequence[cst.CSTNode]):  # type: ignore[no-untyped-def]
    """(target, value) of statements that are one assignment to one target
    read without side effects (``inp = trg[t]``, ``dec_in[:, t] = out[:, t]``),
    or None."""
    if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1:
        return None
    stmt = body[0].body[0]
    if not isinstance(stmt, cst.Assign) or len(stmt.targets) != 1:
        return None
    target = stmt.targets[0].target
    if not isinstance(target, (cst.Name, cst.Attribute, cst.Subscript)) or not _pure(target):
        return None
    return target, stmt.value


def _comments(node: cst.If) -> list:
    """The comments of an ``if``/``else`` made one assignment, in the order
    of the source, as lines of their own above it (none is lost)."""
    def comments(n: cst.CSTNode):  # type: ignore[no-untyped-def]
        if isinstance(n, (cst.EmptyLine, cst.TrailingWhitespace)) and n.comment is not None:
            yield n.comment
        for child in n.children:
            yield from comments(child)

    branches = [node.body] + ([node.orelse] if node.orelse is not None else [])
    return [cst.EmptyLine(indent=True, comment=c) for b in branches for c in comments(b)]


def _torch_draw_read(node: cst.CSTNode, qualnames) -> bool:  # type: ignore[no-untyped-def]
    """``node`` is ``torch.rand(...).item()``: one number drawn by torch,
    read on the host."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "item"
            and not node.args and isinstance(node.func.value, cst.Call)):
        return False
    return bool(qualnames(node.func.value.func) & {f"torch.{d}" for d in _TORCH_DRAWS})


def _root(node: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor a pure expression reads (``out`` of ``out.max(1)[1]`` and
    of ``torch.argmax(out, dim=1)``)."""
    while True:
        if isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            receiver = node.func.value
            node = node.args[0].value if isinstance(receiver, cst.Name) and receiver.value == "torch" and node.args \
                else receiver
        else:
            return node


# tensor ops without side effects a side of a choice may apply (both sides are computed once chosen on the device)
_PURE_OPS = {"unsqueeze", "squeeze", "reshape", "view", "detach", "long", "float", "int", "argmax", "max", "min",
             "clone", "contiguous", "flatten", "t", "transpose", "permute"}


def _pure(node: cst.BaseExpression) -> bool:
    """Read without side effects: a name, an attribute, one of them indexed
    by names and ints (``trg[t]``, ``trg[:, t + 1]``), or a pure tensor op of
    such (``trg[:, t].unsqueeze(1)``, ``torch.argmax(out, dim=1)``,
    ``out.max(1)[1]``)."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        return True
    if isinstance(node, cst.Subscript):
        return _pure(node.value) and not any(
            isinstance(n, (cst.Call, cst.Subscript, cst.Lambda, cst.NamedExpr, cst.Await, cst.Yield))
            for e in node.slice for n in walk(e))
    if isinstance(node, cst.Call) and not any(a.star for a in node.args):
        func = node.func
        simple = all(isinstance(a.value, (cst.Integer, cst.Name, cst.UnaryOperation)) or _pure(a.value)
                     for a in node.args)
        if isinstance(func, cst.Attribute) and func.attr.value in _PURE_OPS and simple:
            receiver = func.value
            return (isinstance(receiver, cst.Name) and receiver.value == "torch") or _pure(receiver)
    return False


__all__ = ["Recompiles", "HOST_COIN", "RAGGED"]
