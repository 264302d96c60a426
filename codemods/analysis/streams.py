"""CUDA streams a program only uses to order its own work, and the
statements that make and use them.

A stream prefetcher (apex's ``data_prefetcher``, ``CUDAPrefetcher`` in many
super-resolution and detection trainers) copies the next batch on a side
stream while the current one computes::

    self.stream = torch.cuda.Stream()                        # a binding
    with torch.cuda.stream(self.stream):                     # a context
        self.batch = self.batch.to(device, non_blocking=True)
    torch.cuda.current_stream().wait_stream(self.stream)     # an ordering
    batch.record_stream(torch.cuda.current_stream())         # an ordering
    self.stream.synchronize()                                # a wait

Every one of these statements only orders work between CUDA streams.  Where
the work runs on one stream, in program order -- XLA, the host CPU -- they
change no value, and none of them runs there (``torch.cuda.Stream()``
raises without CUDA).  A stream *expression* is a call that makes or gets a
stream (``MAKERS``) or a name bound only to one.  The name is *owned* when
every place it is read is one of the forms above (its only bindings are
such calls, it never escapes into a call, a test or a return, and an
attribute of ``self`` is never read through another object in the module);
a form is rewritten only when every stream in it is owned.  Everything else
is left, and reported as it was (XLA115).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from codemods.syntax.tree import TreeCache, dotted

QualNames = object  # Callable[[cst.CSTNode], Set[str]]

MAKERS = frozenset({"torch.cuda.Stream", "torch.cuda.streams.Stream", "torch.cuda.current_stream",
                    "torch.cuda.default_stream"})
CONTEXT = frozenset({"torch.cuda.stream"})
_ORDERING = ("wait_stream",)  # S.wait_stream(S2)
_RECORD = "record_stream"  # t.record_stream(S)
_WAIT = "synchronize"  # S.synchronize()

# (the enclosing class for `self.x`, the function or module for a name; the dotted name)
Key = Tuple[int, str]


@dataclass
class StreamPlan:
    """What to rewrite: ``contexts`` -- ids of ``torch.cuda.stream(S)``
    calls that are a ``with`` item; ``drops`` -- ids of the small statements
    that go (bindings, orderings); ``waits`` -- ids of the ``S.synchronize()``
    calls that wait for the device instead."""

    contexts: Set[int] = field(default_factory=set)
    drops: Set[int] = field(default_factory=set)
    waits: Set[int] = field(default_factory=set)
    statements: List[cst.CSTNode] = field(default_factory=list)  # the lines they are on


@dataclass
class _Form:
    kind: str  # "context", "drop" or "wait"
    node: cst.CSTNode  # the call (context, wait) or the small statement (drop)
    keys: Set[Key]  # the named streams in it


class _Streams:
    def __init__(self, tree: TreeCache, qualnames) -> None:  # type: ignore[no-untyped-def]
        self.tree = tree
        self.qualnames = qualnames
        self.parents = tree.parents
        self.bindings: Dict[Key, List[cst.CSTNode]] = {}  # key -> its binding statements
        self.bad: Set[Key] = set()
        self.forms: List[_Form] = []
        self.seen: Set[int] = set()  # ids of the stream expressions a form took

    # ------------------------------------------------------------ what an expression is
    def is_maker(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Call) and bool(self.qualnames(node.func) & MAKERS)  # type: ignore[operator]

    def key_of(self, node: cst.CSTNode, binding: bool = False) -> Optional[Key]:
        """The key of a name or ``self.x`` at ``node``: for a name read, the
        innermost enclosing function that binds it, else the module's."""
        text = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
        if not text or text.count(".") > 1:
            return None
        if "." in text:
            if not text.startswith("self."):
                return None
            owner: Optional[cst.CSTNode] = self._enclosing(node, (cst.ClassDef,))
            return (id(owner), text) if owner is not None else None
        scope = self._enclosing(node, (cst.FunctionDef,))
        if binding:
            return id(scope or self.tree.module), text
        while scope is not None:
            if (id(scope), text) in self.bindings or (id(scope), text) in self.bad:
                return id(scope), text
            scope = self._enclosing(scope, (cst.FunctionDef,))
        return id(self.tree.module), text

    def _enclosing(self, node: cst.CSTNode, kinds: tuple) -> Optional[cst.CSTNode]:
        cur = self.parents.get(id(node))
        while cur is not None and not isinstance(cur, kinds):
            cur = self.parents.get(id(cur))
        return cur

    def stream(self, node: Optional[cst.CSTNode]) -> Optional[Set[Key]]:
        """The keys of a stream expression (empty for a maker call), or None
        when ``node`` is not one."""
        if node is None:
            return None
        if self.is_maker(node):
            return set()
        key = self.key_of(node)
        return {key} if key is not None and key in self.bindings else None

    # ------------------------------------------------------------ the pass
    def find(self) -> StreamPlan:
        for node in self.tree.nodes((cst.Assign, cst.AnnAssign)):
            self._binding(node)
        for node in self.tree.nodes((cst.Call,)):
            self._form(node)  # type: ignore[arg-type]
        self._check_reads()
        changed = True
        while changed:  # a form that stays keeps every stream in it
            changed = False
            for form in self.forms:
                if form.keys & self.bad and not form.keys <= self.bad:
                    self.bad |= form.keys
                    changed = True
        return self._plan()

    def _binding(self, node: cst.CSTNode) -> None:
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]  # type: ignore[attr-defined]
        value = node.value  # type: ignore[attr-defined]
        for target in targets:
            key = self.key_of(target, binding=True)
            if key is None:
                continue
            if len(targets) == 1 and self.is_maker(value) and isinstance(self.parents.get(id(node)),
                                                                           cst.SimpleStatementLine):
                self.bindings.setdefault(key, []).append(node)
            else:
                self.bad.add(key)  # bound to something else too

    def _form(self, call: cst.Call) -> None:
        func = call.func
        if self.qualnames(func) & CONTEXT:  # type: ignore[operator]
            args = call.args
            named = len(args) == 1 and (args[0].keyword is None or args[0].keyword.value == "stream")
            keys = self.stream(args[0].value) if named else None
            item = self.parents.get(id(call))
            if keys is not None and isinstance(item, cst.WithItem) and item.item is call and item.asname is None:
                self._take("context", call, keys, [args[0].value])
            return
        if not isinstance(func, cst.Attribute):
            return
        statement = self._statement(call)
        if statement is None:
            return
        method = func.attr.value
        if method in _ORDERING and len(call.args) == 1:
            receiver, arg = self.stream(func.value), self.stream(call.args[0].value)
            if receiver is not None and arg is not None:
                self._take("drop", statement, receiver | arg, [func.value, call.args[0].value])
        elif method == _RECORD and len(call.args) == 1:
            arg = self.stream(call.args[0].value)
            if arg is not None:
                self._take("drop", statement, arg, [call.args[0].value])
        elif method == _WAIT and not call.args:
            receiver = self.stream(func.value)
            if receiver is not None:
                self._take("wait", call, receiver, [func.value])

    def _statement(self, call: cst.Call) -> Optional[cst.CSTNode]:
        """The ``Expr`` that is ``call`` alone, as a statement."""
        expr = self.parents.get(id(call))
        if isinstance(expr, cst.Expr) and isinstance(self.parents.get(id(expr)), cst.SimpleStatementLine):
            return expr
        return None

    def _take(self, kind: str, node: cst.CSTNode, keys: Set[Key], exprs: List[cst.CSTNode]) -> None:
        self.forms.append(_Form(kind, node, keys))
        self.seen.update(id(e) for e in exprs)

    def _check_reads(self) -> None:
        """A stream name read anywhere but in a form is not owned; nor is any
        other that a read of the same text may be (a nested function's, or
        ``self.x`` of another class)."""
        bound = {id(t) for stmts in self.bindings.values() for s in stmts
                 for t in ([x.target for x in s.targets] if isinstance(s, cst.Assign) else [s.target])}  # type: ignore[attr-defined]
        texts = {text for _, text in self.bindings}
        attrs = {text.split(".", 1)[1] for text in texts if "." in text}
        for node in self.tree.nodes((cst.Name, cst.Attribute)):
            if id(node) in bound or id(node) in self.seen or _not_a_read(node, self.parents.get(id(node))):
                continue
            text = dotted(node)
            if isinstance(node, cst.Attribute) and node.attr.value in attrs and text not in texts:
                if self.qualnames(node) & (MAKERS | CONTEXT):  # type: ignore[operator]
                    continue  # (`torch.cuda.stream` itself)
                text = f"self.{node.attr.value}"  # (`prefetcher.stream`: maybe that attribute)
            elif text not in texts:
                continue
            key = self.key_of(node)
            if key is not None and key in self.bindings and text == key[1]:
                self.bad.add(key)
            else:
                self.bad |= {k for k in self.bindings if k[1] == text}

    def _plan(self) -> StreamPlan:
        plan = StreamPlan()
        for form in self.forms:
            if form.keys & self.bad:
                continue
            {"context": plan.contexts, "drop": plan.drops, "wait": plan.waits}[form.kind].add(id(form.node))
            plan.statements.append(self.tree.statement_of(form.node))
        for key, stmts in self.bindings.items():
            if key not in self.bad:
                plan.drops.update(id(s) for s in stmts)
                plan.statements.extend(self.tree.statement_of(s) for s in stmts)
        return plan


def _not_a_read(node: cst.CSTNode, parent: Optional[cst.CSTNode]) -> bool:
    """``node`` names something without reading a stream: the attribute
    part of ``a.b``, a keyword, a parameter, a definition, an import."""
    if isinstance(parent, cst.Attribute) and parent.attr is node:
        return True
    if isinstance(parent, cst.Arg) and parent.keyword is node:
        return True
    if isinstance(parent, (cst.Param, cst.FunctionDef, cst.ClassDef)) and getattr(parent, "name", None) is node:
        return True
    return isinstance(parent, (cst.ImportAlias, cst.AsName, cst.ImportFrom, cst.Import))


def stream_plan(tree: TreeCache, qualnames) -> StreamPlan:  # type: ignore[no-untyped-def]
    """The streams of ``tree`` that only order its own work, and what of
    them to rewrite (see the module docstring)."""
    found = tree.memo.get("streams")
    if not isinstance(found, StreamPlan):
        found = tree.memo["streams"] = _Streams(tree, qualnames).find()
    return found


__all__ = ["CONTEXT", "MAKERS", "StreamPlan", "stream_plan"]
