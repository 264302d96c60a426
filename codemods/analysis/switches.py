"""What a CUDA test switches on: the code whose running it decides.

A rule that rewrites a CUDA test (``torch.cuda.is_available()`` -> ``True``,
``device.type == "cuda"`` -> ``"xla"``) changes which code runs: on a host
without CUDA the original took the other side, the conversion takes the CUDA
side.  That side must then hold nothing CUDA-only, or the conversion fails
where the original ran.  :func:`decided_spans` says, for each CUDA test of a
module (the atoms of :mod:`codemods.analysis.guards`), which lines its value
decides, following the value wherever the module carries it:

* the test of an ``if``/``while``/conditional expression: that statement or
  expression, both sides (``not`` and ``else`` make either side the CUDA one);
* ``and``/``or``/``not`` around it: the test that holds the whole; and
  where it is the left side of ``and``/``or``, that operation (its right
  side runs by the test's value: ``half = cuda and capability() >= 7``);
* a name assigned from it (``cuda = True if ... else False``, ``args.cuda =
  not args.no_cuda and ...``, ``Tensor = torch.cuda.FloatTensor if cuda else
  ...``): every test that reads that name in its scope, and names assigned
  from those in turn;
* a function that returns it (``def use_gpu(): return ...``): the tests that
  call the function;
* a parameter default or an ``add_argument(default=...)``: the tests that
  read the parameter or the option.

The engine checks the converted program against these spans (a rewritten test
whose span still holds CUDA code is kept as it was, XLA118).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.analysis.cuda import AVAILABILITY
from codemods.analysis.guards import guards
from codemods.syntax.tree import TreeCache, call_name, dotted, string_value, walk

Span = Tuple[int, int]  # first and last line

_STATEMENT_STOPS = (cst.BaseSmallStatement, cst.BaseCompoundStatement, cst.SimpleStatementLine)
_ASSIGNS = (cst.Assign, cst.AnnAssign, cst.AugAssign)
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Module)


class Switches:
    """The CUDA tests of one module and the nodes each one decides."""

    def __init__(self, tree: TreeCache, qualnames) -> None:  # type: ignore[no-untyped-def]
        self.tree = tree
        self.guards = guards(tree, qualnames)
        self.parents = tree.parents

    def tests(self) -> List[cst.CSTNode]:
        """The CUDA test atoms written in the module (not the flags read)."""
        kinds = (cst.Call, cst.Comparison, cst.Attribute)
        return [n for n in self.tree.in_walk_order(kinds)
                if not (isinstance(n, cst.Attribute) and n.attr.value != "is_cuda")
                and self.guards.atom(n) is not None]

    def decided(self, test: cst.CSTNode) -> List[cst.CSTNode]:
        """The ``if``/``while`` statements and conditional expressions whose
        taken side depends on ``test``'s value."""
        out: List[cst.CSTNode] = []
        seen: Set[int] = set()
        todo = [test]
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            todo.extend(self._carried(node, out))
        return out

    # -- following a value --------------------------------------------------
    def _carried(self, node: cst.CSTNode, out: List[cst.CSTNode]) -> List[cst.CSTNode]:
        """Record what ``node``'s value decides where it stands; return the
        uses it flows on to (names assigned from it, calls of a function that
        returns it, ...)."""
        child, up = node, self.parents.get(id(node))
        while up is not None:
            kind = type(up)
            if kind in (cst.If, cst.While) and child is up.test:  # type: ignore[attr-defined]
                out.append(up)
                return []
            if kind is cst.IfExp and child is up.test:  # type: ignore[attr-defined]
                out.append(up)  # ... and its value flows on
            elif kind is cst.BooleanOperation and child is up.left:  # type: ignore[attr-defined]
                out.append(up)  # `cuda and <only run on CUDA>`: the right side runs by it (its value flows on)
            elif kind is cst.Assert:
                return []
            elif kind in _ASSIGNS and child is getattr(up, "value", None):
                targets = [t.target for t in up.targets] if kind is cst.Assign else [up.target]  # type: ignore[attr-defined]
                return [u for t in targets for u in self._reads(t, up)]
            elif kind is cst.Return:
                return self._calls_of(up)
            elif kind is cst.Param and child is up.default:  # type: ignore[attr-defined]
                return self._reads(up.name, up)  # type: ignore[attr-defined]
            elif kind is cst.Arg and up.keyword is not None and up.keyword.value == "default":  # type: ignore[attr-defined]
                return self._option_reads(self.parents.get(id(up)))
            elif isinstance(up, _STATEMENT_STOPS):
                return []
            child, up = up, self.parents.get(id(up))
        return []

    def _scope(self, node: cst.CSTNode, attribute: bool) -> cst.CSTNode:
        """Where a name bound at ``node`` is read: its function (a class for
        ``self.x``), the module for a module-level name."""
        cur = self.parents.get(id(node))
        while cur is not None and not isinstance(cur, _SCOPES):
            cur = self.parents.get(id(cur))
        if attribute and isinstance(cur, cst.FunctionDef):
            outer = self.parents.get(id(cur))
            while outer is not None and not isinstance(outer, _SCOPES):
                outer = self.parents.get(id(outer))
            if isinstance(outer, cst.ClassDef):
                return outer
        return cur or self.tree.module

    def _reads(self, target: cst.CSTNode, binding: cst.CSTNode) -> List[cst.CSTNode]:
        """The places that read the name ``target`` binds (a tuple target:
        each of its names)."""
        names = [n for n in walk(target) if isinstance(n, (cst.Name, cst.Attribute))
                 and not isinstance(self.parents.get(id(n)), cst.Attribute)] if isinstance(
            target, (cst.Tuple, cst.List)) else [target]
        found: List[cst.CSTNode] = []
        for name in names:
            text = dotted(name)
            if not text:
                continue
            scope = self._scope(binding, "." in text)
            for n in walk(scope):
                if n is name or not isinstance(n, (cst.Name, cst.Attribute)) or dotted(n) != text:
                    continue
                up = self.parents.get(id(n))
                if isinstance(up, cst.Attribute) and up.value is not n and up.attr is n:
                    continue  # the `x` of `obj.x`: another name
                found.append(n)
        return found

    def _calls_of(self, ret: cst.CSTNode) -> List[cst.CSTNode]:
        """The calls of the function that returns at ``ret``."""
        cur = self.parents.get(id(ret))
        while cur is not None and not isinstance(cur, (cst.FunctionDef, cst.Module)):
            cur = self.parents.get(id(cur))
        if not isinstance(cur, cst.FunctionDef):
            return []
        name = cur.name.value
        return [c for c in self.tree.nodes((cst.Call,)) if call_name(c) == name]  # type: ignore[arg-type]

    def _option_reads(self, call: Optional[cst.CSTNode]) -> List[cst.CSTNode]:
        """``parser.add_argument("--cuda", default=<test>)``: the reads of
        ``<anything>.cuda``."""
        if not (isinstance(call, cst.Call) and call_name(call) == "add_argument"):
            return []
        dests = {(string_value(a.value) or "") for a in call.args if a.keyword is not None
                 and a.keyword.value == "dest"} - {""} or {
            (string_value(a.value) or "").lstrip("-").replace("-", "_") for a in call.args if a.keyword is None
            and (string_value(a.value) or "").startswith("--")} - {""}
        return [n for n in self.tree.nodes((cst.Attribute,))  # (`torch.cuda` is a module's, not the option)
                if n.attr.value in dests and not self.tree.import_qualnames(n)]  # type: ignore[attr-defined]


def decided_spans(tree: TreeCache, qualnames) -> Dict[int, List[Span]]:  # type: ignore[no-untyped-def]
    """Line of each CUDA test -> the spans of lines its value decides."""
    switches = Switches(tree, qualnames)
    tests = switches.tests()
    decided = {id(t): switches.decided(t) for t in tests}
    wanted = tests + [d for ds in decided.values() for d in ds]
    positions = tree.start_positions(wanted)
    spans: Dict[int, List[Span]] = {}
    for test in tests:
        pos = positions.get(id(test))
        if pos is None:
            continue
        for node in decided[id(test)]:
            where = positions.get(id(node))
            if where is not None:
                spans.setdefault(pos[0], []).append((where[0], where[2]))
    return spans


def availability_tests(tree: TreeCache, qualnames) -> Dict[int, str]:  # type: ignore[no-untyped-def]
    """Line of each CUDA test that asks whether an accelerator is there ->
    the question (``torch.cuda.is_available()`` and
    ``torch.accelerator.is_available()`` ask the same one on a CUDA host):
    the same answer wherever the program asks it."""
    calls = [t for t in Switches(tree, qualnames).tests() if isinstance(t, cst.Call)]
    positions = tree.start_positions(calls)
    found: Dict[int, str] = {}
    for call in calls:
        names = qualnames(call.func) & AVAILABILITY  # type: ignore[attr-defined]
        if names and id(call) in positions:
            name = min(names)
            found[positions[id(call)][0]] = "accelerator" if name in _SAME_AS_CUDA else name
    return found


_SAME_AS_CUDA = {"torch.cuda.is_available", "torch.accelerator.is_available"}

__all__ = ["Switches", "availability_tests", "decided_spans"]
