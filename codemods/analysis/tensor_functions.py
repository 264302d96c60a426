"""Which functions of the program only compute tensors from what they are given.

akamaster's ``prec1 = accuracy(output.data, target)[0]`` follows the
optimizer step; ``accuracy`` takes ``topk``, compares, sums and scales --
torch ops and tensor methods on its parameters and its own names, nothing
else.  Such a call, like a line of torch ops, may join the step's graph
before the barrier (``analysis.step_tail``): moved over other lines, it
computes the same values, and nothing it does could be seen by the lines it
moves over, except through what it is handed (the caller treats those names
as changed).

A *tensor function* is a ``def`` of the module (no method, no generator, no
decorator but torch's) whose statements are assignments to names, ``for``
and ``if`` (their conditions no host read), ``with torch.no_grad():``,
``return``, ``pass``, its
docstring and ``.append``/``.extend`` of a list it made; whose every call is
a torch op (not one that draws random numbers, saves, loads or seeds), a
method of a tensor, one of a few builtins, ``math``, or a tensor function
itself (two calls down); and that reads no tensor on the host.
"""

from __future__ import annotations

from typing import Callable, FrozenSet, Iterable, Optional, Set

import libcst as cst

from codemods.analysis.bindings import binding_scope
from codemods.analysis.calls import called_functions
from codemods.analysis.placement import host_read, reads_truth
from codemods.analysis.objects import QualNames, imported_def, quick_qualnames
from codemods.analysis.steps import APPEND_METHODS, RANDOM_DRAWS, RANDOM_FILLS
from codemods.analysis.tensors import is_tensor_expr, tensor_names, used_as_tensor
from codemods.syntax.tree import TreeCache, find_all


# the torch namespaces whose functions compute tensors, and what in them does more
_OP_SPACES = frozenset({"torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special"})
_RANDOM = RANDOM_DRAWS | RANDOM_FILLS | {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                                         "feature_alpha_dropout", "rrelu", "gumbel_softmax"}
_NOT_OPS = _RANDOM | {"save", "load", "manual_seed", "seed", "compile", "set_printoptions", "set_default_dtype",
                      "set_default_device", "set_grad_enabled", "use_deterministic_algorithms"}
BUILTINS = frozenset({"abs", "bool", "enumerate", "float", "int", "isinstance", "len", "list", "max", "min",
                       "range", "reversed", "round", "sum", "tuple", "zip"})
# tensor methods that do more than compute (beyond the host reads)
_NOT_METHODS = frozenset({"backward", "register_hook", "retain_grad", "requires_grad_", "share_memory_",
                          "record_stream", "pin_memory", "tolist"}) | RANDOM_FILLS
_SELF = frozenset({"self", "cls"})
# attributes of a tensor that are the same tensor's values (``output.data``)
_SAME_TENSOR = frozenset({"data", "T", "mT", "real", "imag"})


def draws_random(node: cst.CSTNode) -> bool:
    """``node`` calls what draws from torch's random stream (``torch.randn``,
    ``x.normal_()``, ``F.dropout``): moved over another draw, it would take
    other numbers."""
    for call in find_all(node, cst.Call):
        func = call.func  # type: ignore[attr-defined]
        last = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if last in _RANDOM:
            return True
    return False


def torch_op(qualnames: Iterable[str]) -> bool:
    """One of ``qualnames`` is a torch function that only computes a tensor."""
    for q in qualnames:
        space, _, last = q.rpartition(".")
        if space in _OP_SPACES and last not in _NOT_OPS and not last.startswith("_"):
            return True
    return False


def tensor_function_call(tree: TreeCache, call: cst.Call, qualnames: QualNames, tensors: Set[str],
                         depth: int = 2) -> bool:
    """``call`` runs a function of the module, and every function it may run
    is a tensor function, given the tensors the call hands it (``tensors``:
    the caller's tensor names)."""
    if any(a.star for a in call.args):
        return False
    fns = called_functions(tree, call)
    if fns == [] and isinstance(call.func, cst.Name):  # (`from util import accuracy`: read there)
        found = imported_def(tree, call.func, cst.FunctionDef)
        if found is None:
            return False
        tree, fns = found[0], [found[1]]  # type: ignore[list-item]
        qualnames = quick_qualnames(tree)
    if not fns:
        return False
    for fn in fns:
        params = handed_tensors(fn, call, tensors, qualnames)
        if params is None or not tensor_function(tree, fn, qualnames, params, depth):
            return False
    return True


def tensor_function(tree: TreeCache, fn: cst.FunctionDef, qualnames: QualNames, params: FrozenSet[str],
                    depth: int = 2) -> bool:
    """``fn`` only computes tensors from its arguments (see the module doc),
    its parameters ``params`` tensors."""
    key = ("tensor_function", id(fn), params, depth)
    if key not in tree.memo:
        tree.memo[key] = FunctionCheck(tree, fn, qualnames, params, depth).function()
    return tree.memo[key]  # type: ignore[no-any-return]


def handed_tensors(fn: cst.FunctionDef, call: cst.Call, tensors: Set[str],
                   qualnames: QualNames) -> Optional[FrozenSet[str]]:
    """The parameters of ``fn`` that ``call`` hands a tensor (``output.data``
    is one), or None where its arguments do not match them."""
    positional = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
    named = set(positional) | {p.name.value for p in fn.params.kwonly_params}
    out: Set[str] = set()
    for i, arg in enumerate(call.args):
        if arg.keyword is None:
            if i >= len(positional):
                return None
            name = positional[i]
        elif arg.keyword.value in named:
            name = arg.keyword.value
        else:
            return None
        value = arg.value
        while isinstance(value, cst.Attribute) and value.attr.value in _SAME_TENSOR:
            value = value.value
        if is_tensor_expr(value, tensors, qualnames):
            out.add(name)
    return frozenset(out)


class FunctionCheck:
    """One function's statements and calls, against the module doc's list."""

    method = False  # (a method: its first parameter is the object)

    def __init__(self, tree: TreeCache, fn: cst.FunctionDef, qualnames: QualNames, params: FrozenSet[str],
                 depth: int) -> None:
        self.tree, self.fn, self.qualnames, self.depth = tree, fn, qualnames, depth
        own = {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)
               if used_as_tensor(fn, p.name.value)}  # (`labels.size(0)`: only a tensor has that method)
        self.tensors = tensor_names(fn.body, qualnames, known=params | own)
        self.lists: Set[str] = set()  # the names it binds to a list it makes

    def function(self) -> bool:
        fn = self.fn
        params = [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]
        if fn.asynchronous is not None or (params and params[0].name.value in _SELF and not self.method):
            return False
        if any(not torch_op(self.qualnames(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator))
               and not self._grad_mode(d.decorator) for d in fn.decorators):
            return False
        if find_all(fn.body, (cst.Yield, cst.Await, cst.Lambda, cst.NamedExpr, cst.Global, cst.Nonlocal)):
            return False
        for small in find_all(fn.body, cst.Assign):
            if isinstance(small.value, cst.List) and len(small.targets) == 1 and isinstance(  # type: ignore[attr-defined]
                    small.targets[0].target, cst.Name):  # type: ignore[attr-defined]
                self.lists.add(small.targets[0].target.value)  # type: ignore[attr-defined]
        return self._block(fn.body)

    def _grad_mode(self, node: cst.BaseExpression) -> bool:
        func = node.func if isinstance(node, cst.Call) else node
        return any(q in ("torch.no_grad", "torch.inference_mode", "torch.enable_grad") for q in self.qualnames(func))

    def _block(self, block: cst.BaseSuite) -> bool:
        if isinstance(block, cst.SimpleStatementSuite):
            return all(self._small(s) for s in block.body)
        return all(self._statement(s) for s in block.body)  # type: ignore[attr-defined]

    def _statement(self, stmt: cst.CSTNode) -> bool:
        if isinstance(stmt, cst.SimpleStatementLine):
            return all(self._small(s) for s in stmt.body)
        if isinstance(stmt, cst.If):
            orelse = stmt.orelse
            return (not reads_truth(stmt.test, self.tensors, self.qualnames) and self._expr(stmt.test)
                    and self._block(stmt.body)
                    and (orelse is None or (self._statement(orelse) if isinstance(orelse, cst.If)
                                            else self._block(orelse.body))))
        if isinstance(stmt, cst.With):  # `with torch.no_grad():` (pytorch/examples' imagenet `accuracy`)
            return (stmt.asynchronous is None and all(i.asname is None and self._grad_mode(i.item) for i in stmt.items)
                    and self._block(stmt.body))
        if isinstance(stmt, cst.For):
            return (stmt.asynchronous is None and names_only(stmt.target) and self._expr(stmt.iter)
                    and self._block(stmt.body) and (stmt.orelse is None or self._block(stmt.orelse.body)))
        return False

    def _small(self, small: cst.CSTNode) -> bool:
        if isinstance(small, cst.Pass):
            return True
        if isinstance(small, cst.Expr):
            value = small.value
            if isinstance(value, (cst.SimpleString, cst.ConcatenatedString)):
                return True
            return isinstance(value, cst.Call) and self._expr(value)
        if isinstance(small, cst.Return):
            return small.value is None or self._expr(small.value)
        if isinstance(small, cst.Assign):
            return all(names_only(t.target) for t in small.targets) and self._expr(small.value)
        if isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            return isinstance(small.target, cst.Name) and (small.value is None or self._expr(small.value))
        return False

    def _expr(self, expr: cst.BaseExpression) -> bool:
        return all(self._call(c) for c in find_all(expr, cst.Call))  # type: ignore[arg-type]

    def _call(self, call: cst.Call) -> bool:
        tree, qualnames = self.tree, self.qualnames
        if host_read(tree, call, self.tensors, qualnames):
            return False
        names = set(qualnames(call.func))
        if torch_op(names) or any(q.startswith("math.") for q in names):
            return True
        if any(q.startswith("torch.") for q in names):
            return False
        func = call.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if isinstance(func.value, cst.Name) and func.value.value in self.lists and method in APPEND_METHODS:
                return self._local(func.value)
            return (method not in _NOT_METHODS and is_tensor_expr(func.value, self.tensors, qualnames)
                    and self._rooted_here(func.value))
        if isinstance(func, cst.Name):
            if func.value in BUILTINS and binding_scope(tree, func) is None:
                return True
            return self.depth > 0 and tensor_function_call(tree, call, qualnames, self.tensors, self.depth - 1)
        return False

    def _local(self, name: cst.Name) -> bool:
        return binding_scope(self.tree, name) is self.fn

    def _rooted_here(self, node: cst.BaseExpression) -> bool:
        """What a method is called on starts at a name of the function (not
        a global tensor it could change) or at a torch op."""
        while True:
            if isinstance(node, (cst.Attribute, cst.Subscript)):
                node = node.value
            elif isinstance(node, cst.Call):
                if torch_op(self.qualnames(node.func)):
                    return True
                node = node.func
            else:
                return isinstance(node, cst.Name) and self._local(node) or not isinstance(node, cst.Name)


def store_method(tree: TreeCache, fn: cst.FunctionDef, qualnames: QualNames, params: FrozenSet[str]) -> bool:
    """``fn``, a method, only computes from its arguments and its object's
    attributes and stores into those (``AverageMeter.update``: ``self.val =
    val; self.sum += val * n``): simple lines alone, each of the module
    doc's, but that an assignment may store into ``self.<name>`` and no
    tensor changes in place; its parameters ``params`` (``self`` left out)
    tensors."""
    key = ("store_method", id(fn), params)
    if key not in tree.memo:
        tree.memo[key] = _StoreCheck(tree, fn, qualnames, params, 0).function()
    return tree.memo[key]  # type: ignore[no-any-return]


class _StoreCheck(FunctionCheck):
    """A method's statements: :class:`FunctionCheck`'s, simple lines only, whose
    assignments may store into the object's attributes."""

    method = True

    def function(self) -> bool:
        fn = self.fn
        params = [*fn.params.posonly_params, *fn.params.params]
        if fn.asynchronous is not None or fn.decorators or not params or params[0].name.value != "self":
            return False
        if isinstance(fn.params.star_arg, cst.Param) or fn.params.star_kwarg is not None:
            return False
        body = fn.body.body if isinstance(fn.body, cst.IndentedBlock) else (fn.body,)
        return all(isinstance(s, cst.SimpleStatementLine) for s in body) and super().function()

    def _small(self, small: cst.CSTNode) -> bool:
        if isinstance(small, cst.Assign) and all(_own_attribute(t.target) for t in small.targets):
            return self._expr(small.value)
        if isinstance(small, cst.AugAssign) and _own_attribute(small.target):
            return self._expr(small.value)
        if isinstance(small, cst.Return):
            return small.value is None
        return super()._small(small)

    def _call(self, call: cst.Call) -> bool:
        # (nothing in place: what it is handed stays as it was, whatever it stores)
        return not (isinstance(call.func, cst.Attribute) and call.func.attr.value.endswith("_")) and super()._call(call)


def _own_attribute(target: cst.CSTNode) -> bool:
    """``self.<name>``."""
    return isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"


def names_only(target: cst.CSTNode) -> bool:
    """An assignment target of names alone (``a``, ``_, b``): nothing but names is written."""
    if isinstance(target, cst.Name):
        return True
    return isinstance(target, (cst.Tuple, cst.List)) and all(names_only(e.value) for e in target.elements)


def handed_names(stmt: cst.CSTNode, is_function_call: Callable[[cst.Call], bool]) -> Set[str]:
    """The names a line hands to the tensor functions it calls: they may
    change what is handed to them (``x.mul_``), so what it moves over must
    not use them."""
    return {n.value for c in find_all(stmt, cst.Call) if is_function_call(c)  # type: ignore[arg-type]
            for a in c.args for n in find_all(a.value, cst.Name)}  # type: ignore[attr-defined]


__all__ = ["BUILTINS", "FunctionCheck", "draws_random", "handed_names", "names_only", "store_method", "tensor_function",
           "tensor_function_call", "torch_op"]
