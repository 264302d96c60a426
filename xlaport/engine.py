"""Run the codemods over one source text.

The engine parses a file once, runs each applicable codemod on the tree in
turn, adds the imports they asked for once at the end, and maps every finding
back to a line of the *original* file (rules run on each other's output, so
their own positions shift when an earlier rule inserts or removes lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from codemods import registry
from codemods.analysis.cuda import count_references
from codemods.analysis.switches import Span, availability_tests, decided_spans
from codemods.base import (
    FINDINGS_KEY,
    KEPT_SPANS_KEY,
    KEPT_SWITCHES_KEY,
    OPTIONS_KEY,
    ORIGINAL_LINE_KEY,
    SELECT_KEY,
    SILENCED_KEY,
    SOURCE_KEY,
    SWITCH_CODES,
    TARGET_KEY,
    TREE_KEY,
    UNPLACED_KEY,
    Context,
    Finding,
    TreeCache,
    Unplaced,
    place,
)
from codemods.coverage import (
    CATCH_ALL,
    COVERAGE_KEY,
    LEFT_KEY,
    SWITCHED_KEY,
    CudaCatchAll,
)
from codemods.syntax import imports, pyast
from codemods.syntax.parsing import LibcstRejects, parse_module
from codemods.syntax.splice import spliced_code
from codemods.xla_limits import XLA_CANNOT, moves_sparse_to_device
from xlaport.linemap import LazyLineMap
from xlaport.settings import Settings  # noqa: F401 -- re-exported


class SourceError(Exception):
    """A source that cannot be converted; ``line``/``col`` where known."""

    def __init__(self, message: str, line: Optional[int] = None, col: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.line = line
        self.col = col


@dataclass
class Outcome:
    code: bytes  # the converted source (== input when nothing changed)
    findings: List[Finding]
    cuda: Tuple[int, int] = (0, 0)  # CUDA references (in the input, left in the output)
    # with ``imports_later``: the import requests not yet applied to ``code``
    # (needed, unused; see :func:`finish_imports`), None when none are left
    imports: Optional[Tuple[List[imports.Request], List[imports.Request]]] = None

    def changed(self, original: bytes) -> bool:
        return self.code != original


def applicable(source: bytes, settings: Settings, codes: Sequence[str],
               triggered: Optional[Sequence[registry.CodemodInfo]] = None,
               filename: Optional[str] = None) -> List[type]:
    """The codemods worth parsing the file for: enabled, and triggered."""
    return [info.load() for info in registry.applicable(source, codes, settings.options, settings.prefilter,
                                                        triggered, filename)]


def parse(source: bytes) -> cst.Module:
    try:
        return parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise python_error(source) or SourceError(
            f"cannot parse: {exc.message}", exc.raw_line, exc.raw_column + 1
        ) from None
    except UnicodeDecodeError as exc:
        raise decode_error(source, exc) from None
    except LookupError as exc:
        raise SourceError(f"cannot decode: {exc}", 1, 1) from None
    except LibcstRejects as exc:
        raise SourceError(exc.message, exc.line, 1 if exc.line else None) from None
    except (SyntaxError, RecursionError, ValueError) as exc:
        raise python_error(source) or SourceError(f"cannot parse: {exc}") from None


def python_error(source: bytes) -> Optional[SourceError]:
    """Where Python's own parser says the source is wrong (LibCST's parser
    reports an error where it gave up, often a line later, and a
    tokenizer error on line 1): None when Python reads it."""
    try:
        compile(source, "<source>", "exec", flags=0x400, dont_inherit=True)  # ast.PyCF_ONLY_AST
    except SyntaxError as exc:  # IndentationError and TabError too
        message = exc.msg
        if "(unicode error)" in message or "can't decode" in message:
            try:
                source.decode("utf-8")
            except UnicodeDecodeError as dec:
                return decode_error(source, dec)
        return SourceError(f"cannot parse: {message}", exc.lineno or 1, max(exc.offset or 1, 1))
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        return SourceError(f"cannot parse: {exc}", 1, 1)
    return None


def decode_error(source: bytes, exc: UnicodeDecodeError) -> SourceError:
    """The line and column of the first byte that does not decode."""
    start = exc.start
    line = source.count(b"\n", 0, start) + 1
    col = start - (source.rfind(b"\n", 0, start) + 1) + 1
    return SourceError(f"cannot decode as {exc.encoding}: byte 0x{source[start]:02x} ({exc.reason})", line, col)


def _text_of(source: bytes, tree: cst.Module) -> str:
    """``tree.code`` without generating it: LibCST's trees give back their
    source exactly, so it is the source decoded as LibCST decoded it (a
    byte-order mark is the one case left to the code generator)."""
    if source.startswith(b"\xef\xbb\xbf"):
        return tree.code
    try:
        return source.decode(tree.encoding)
    except (UnicodeDecodeError, LookupError):
        return tree.code


def transform(source: bytes, settings: Settings, filename: str = "",
              triggered: Optional[Sequence[registry.CodemodInfo]] = None, imports_later: bool = False) -> Outcome:
    """Convert one source text. Raises SourceError for code it cannot parse.
    ``triggered``: ``registry.applicable(source, ..., prefilter=False)`` for
    ``settings``' codes, where the caller has it.  ``imports_later``: leave
    the imports the rules asked for out of ``code`` and hand them back in
    ``Outcome.imports`` (what `lint` does: no finding depends on them, and
    the output is only shown or written after :func:`finish_imports`).

    A rewritten CUDA test owns the code it switches on: where that code
    still holds CUDA after conversion (:func:`_switches_to_keep`), the
    file is converted again with that test kept as it was (XLA118)."""
    kept: Dict[int, str] = {}
    decided: Set[Span] = set()  # the lines the kept tests decide
    while True:
        outcome, left = _convert(source, settings, filename, triggered, imports_later, kept, sorted(decided))
        more, spans = _switches_to_keep(source, outcome.findings, left, kept)
        if not more or len(kept) > 50:
            break
        kept.update(more)
        decided.update(span for line in kept for span in spans.get(line, ()))
    findings = _without_repeats(outcome.findings)
    findings.sort(key=lambda f: (f.line, f.col, f.code))
    outcome.findings = findings
    outcome.code = keep_final_newline(source, outcome.code)
    return outcome


def keep_final_newline(source: bytes, code: bytes) -> bytes:
    """LibCST drops the last line ending of a file whose lines end in CR
    alone (``\r``): the output ends as the input did."""
    if source.endswith(b"\r") and code and not code.endswith((b"\r", b"\n")):
        return code + b"\r"
    return code


# rewrites that put tensors or modules on the XLA device: `.cuda()`, a "cuda" device, a device choice,
# the accelerator's device
DEVICE_CODES = frozenset({"XLA101", "XLA102", "XLA103", "XLA114"})


def _switches_to_keep(source: bytes, findings: List[Finding], left: List[Tuple[int, str]],
                      kept: Dict[int, str]) -> Tuple[Dict[int, str], Dict[int, List[Span]]]:
    """The lines of rewritten CUDA tests whose decided code (see
    ``codemods.analysis.switches``) holds CUDA left by the conversion
    (``left``: its lines and labels), each with the reason to keep it; and
    with them the rewritten tests that ask the same question as a kept one
    that chooses a device (``torch.cuda.is_available()`` in another
    function: the program must not run half on XLA, half on the CPU).  Also the spans each test decides."""
    switched = {f.line for f in findings if f.fix and f.code in SWITCH_CODES} - set(kept)
    if not switched:
        return {}, {}
    # CUDA left over, and what fails on XLA itself (sparse tensors, share_memory), keep a test
    left = [(line, f"`{label.replace('torch.', '', 1) if label.startswith('torch.') else label}`")
            for line, label in left] + [(f.line, f.message.split(":")[0]) for f in findings
                                        if f.code == XLA_CANNOT.code]
    if not left:
        return {}, {}
    tree = parse(source)
    cache = TreeCache(tree, source, _text_of(source, tree))
    try:
        spans = decided_spans(cache, lambda n: cache.import_qualnames(n) or set())
        questions = availability_tests(cache, lambda n: cache.import_qualnames(n) or set())
    finally:
        cache.release()
    more: Dict[int, str] = {}
    moved = [f.line for f in findings if f.fix and f.code in DEVICE_CODES]
    # a sparse tensor sent to a device anywhere in the module: a test that chooses the device sends it there
    sparse_moves = [(f.line, f.message.split(":")[0]) for f in findings
                    if f.code == XLA_CANNOT.code and moves_sparse_to_device(f.message)]
    by_sparse: Dict[int, str] = {}
    for line in sorted(switched):
        blockers = sorted({(at, label) for first, last in spans.get(line, ()) for at, label in left
                           if first <= at <= last})
        chooses = any(first <= at <= last for first, last in spans.get(line, ()) for at in moved)
        if not blockers and chooses and sparse_moves:
            blockers, into = sorted(set(sparse_moves)), by_sparse
        else:
            into = more
        if blockers:
            at, what = blockers[0]
            others = f" (and {len(blockers) - 1} more)" if len(blockers) > 1 else ""
            into[line] = (f"CUDA test kept as it is: on XLA it would switch on {what} (line {at}){others}, which "
                          "xlaport does not convert or XLA cannot run; convert that by hand, then this test")
    # a kept test that chooses a device (a device rewritten in what it decides) keeps the tests that ask
    # the same question: the rest of the program must choose the same device
    asked = {}
    for line in sorted({**kept, **more, **by_sparse}):
        if any(first <= at <= last for first, last in spans.get(line, ()) for at in moved):
            asked.setdefault(questions.get(line), line)
    asked.pop(None, None)
    for line in sorted(switched - set(more)):
        first = asked.get(questions.get(line))
        if first is not None and first != line:
            more[line] = (f"CUDA test kept as it is: it asks what the test at line {first} asks, which is kept; "
                          "answered otherwise here, the program would run partly on XLA, partly on the CPU")
    for line, why in by_sparse.items():
        more.setdefault(line, why)
    return more, spans


def _convert(source: bytes, settings: Settings, filename: str, triggered: Optional[Sequence[registry.CodemodInfo]],
             imports_later: bool, kept: Dict[int, str],
             decided: Sequence[Span] = ()) -> Tuple[Outcome, List[Tuple[int, str]]]:
    """One conversion of ``source`` with the CUDA tests on the lines of
    ``kept`` left as they are, and the device choices in the lines they
    decide (``decided``); also the lines and labels of the CUDA left in it
    that fails without CUDA (only where a rule rewrote a CUDA test)."""
    settings = settings.for_file(filename, source)
    codes = settings.selected_codes()
    codemods = applicable(source, settings, codes, triggered, filename)
    if not codemods:
        return Outcome(source, []), []
    counting = CudaCatchAll in codemods  # (the coverage line: the catch-all's)
    running = codes
    if not counting and SWITCH_CODES & set(codes):
        # a rewritten CUDA test must own what it switches on, whichever rules
        # are selected: the catch-all lists what is left (and reports nothing)
        codemods = applicable(source, settings, [*codes, CATCH_ALL.code], filename=filename)
        running = [*codes, CATCH_ALL.code]
    if pyast.rejected(source):
        # Python could not read it: too deep a nesting crashes LibCST's
        # native parser (a segfault, 5,000 nested brackets) -- say so first
        problem = python_error(source)
        if problem is not None and any(w in problem.message for w in ("nested", "recursion", "too complex")):
            raise problem
    tree = parse(source)
    original_text = _text_of(source, tree)
    context = Context(
        filename=filename or None,
        scratch={
            SELECT_KEY: codes,
            TARGET_KEY: settings.target,
            OPTIONS_KEY: dict(settings.options),
            FINDINGS_KEY: [],
            KEPT_SWITCHES_KEY: kept,
            KEPT_SPANS_KEY: list(decided),
        },
    )
    if CudaCatchAll in codemods and len(codes) < len(registry.selected_codes(None, ())):
        # some rule is off: the catch-all must not speak for it, so the
        # codemods of rules that are ignored run too -- they rewrite nothing
        # (``flag`` is False for a rule that is off), they only say where
        # they would have spoken
        context.scratch[SILENCED_KEY] = set()
        codemods = applicable(source, settings, [*running, *registry.selected_codes(settings.select, ())],
                              filename=filename)
    # The analyses a TreeCache holds point back at it (and at its tree):
    # they are let go at the end, so that the trees are freed as soon as
    # the file is done rather than by the cycle collector (see
    # runner.tune_gc).
    run = _Passes(source, tree, original_text, context)
    try:
        found = count_references(run.cache) if counting else 0
        for cls in codemods:
            run.apply(cls)
        run.flush()
        text, tree = run.text, run.tree
        later = None
        if imports_later and imports.pending(context) and text != original_text:
            later = (list(context.scratch.get(imports.NEEDED_KEY) or []),
                     list(context.scratch.get(imports.UNUSED_KEY) or []))
        elif imports.pending(context):
            tree = run.checked()
            text = _with_imports(context, tree, text, run.cache)
        out = source if text == original_text else text.encode(tree.encoding)
        left = int(context.scratch.get(COVERAGE_KEY, 0)) if counting else 0  # type: ignore[call-overload]
        return Outcome(out, run.findings, (found, left), later), list(context.scratch.get(LEFT_KEY) or ())
    finally:
        run.release()
        context.scratch.clear()


class _Passes:
    """The codemods' passes over one file, in turn: each reads the tree the
    last rewrite left (one TreeCache per tree, shared by the codemods that
    read it), and its findings are placed on that tree and mapped back to
    the user's lines."""

    def __init__(self, source: bytes, tree: cst.Module, text: str, context: Context) -> None:
        self.source, self.tree, self.text, self.context = source, tree, text, context
        self.made: List[TreeCache] = []
        self.maps: List[Callable[[int], int]] = []  # maps[k]: lines after rule k -> before
        self.findings: List[Finding] = []
        self.on_tree: List[Finding] = []  # findings on the current tree, in its lines
        self.unplaced: List[Unplaced] = []  # ... of which these still need their position
        context.scratch[UNPLACED_KEY] = self.unplaced
        self._use(TreeCache(tree, source, text, filename=context.filename))
        # the prefilter's ``ast`` parse of this same source, for statement lines
        self.cache.memo["ast"] = pyast.parsed(source)
        self.unchecked = False  # the tree is a rewrite no codemod has read yet

    @property
    def cache(self) -> TreeCache:
        return self.context.scratch[TREE_KEY]  # type: ignore[no-any-return]

    def _use(self, cache: TreeCache) -> None:
        self.made.append(cache)
        self.context.scratch[TREE_KEY] = cache

    def flush(self) -> None:
        """Place the findings on the current tree (one position pass for
        all the codemods that ran on it) and map them to the user's lines."""
        place(self.cache, self.unplaced)
        for f in self.on_tree:
            for back in reversed(self.maps):
                f.map_lines(back)
        self.findings.extend(self.on_tree)
        self.on_tree.clear()

    def checked(self) -> cst.Module:
        """The rewritten tree, copied whole where a rewrite put one node in
        two places (metadata and the statement index need every node once).
        Checked only before something reads the tree: the check indexes it,
        a walk of the whole tree, and most rewrites are the last thing done
        to a file."""
        if self.unchecked:
            self.unchecked = False
            if not self.cache.nodes_unique():
                self.tree = self.tree.deep_clone()
                self._current()
        return self.tree

    def _current(self) -> None:
        """Make ``self.tree`` (rewritten) the one the next codemods read."""
        self._use(TreeCache(self.tree, self.source, self.text, self.context.scratch.get(imports.NEEDED_KEY) or (),
                            filename=self.context.filename))

    def apply(self, cls: type) -> None:
        """One codemod's pass, unless it cannot find anything in this tree."""
        context = self.context
        tree = self.checked()
        cache = self.cache
        if not cls.wanted(cache, context.scratch[OPTIONS_KEY]):  # type: ignore[attr-defined]
            return
        context.scratch[SOURCE_KEY] = self.text
        context.scratch[FINDINGS_KEY] = []
        context.scratch[ORIGINAL_LINE_KEY] = _back_through(list(self.maps))
        new_tree = cls(context).transform_module_impl(tree)
        new = context.scratch[FINDINGS_KEY]
        self.on_tree.extend(new)
        if any(f.fix and f.code in SWITCH_CODES for f in new):
            context.scratch[SWITCHED_KEY] = True
        # A codemod changes the tree only where it records a fix; without
        # one, the rebuilt tree equals the old one and the old tree (with its
        # metadata) is kept.
        if any(f.fix for f in new):
            new_text = spliced_code(tree, self.text, new_tree, cache.statement_starts())
            if new_text is None:
                new_text = new_tree.code
            if new_text != self.text:
                self.flush()
                self.maps.append(LazyLineMap(self.text, new_text))
                self.text, self.tree = new_text, new_tree
                self._current()
                self.unchecked = True

    def release(self) -> None:
        for cache in self.made:
            cache.release()


def _with_imports(context: Context, tree: cst.Module, text: str, cache: TreeCache) -> str:
    """``text`` (the code of ``tree``) with the imports the rules asked for
    in ``context`` added and removed: only the statements that change are
    generated again."""
    new_tree, changed = imports.apply(context, tree)
    if not changed:
        return text
    spliced = spliced_code(tree, text, new_tree, cache.statement_starts())
    return spliced if spliced is not None else new_tree.code


def finish_imports(code: bytes, pending: Tuple[List[imports.Request], List[imports.Request]]) -> bytes:
    """``code`` from ``transform(..., imports_later=True)`` with the imports
    it left out (``Outcome.imports``): the bytes ``transform`` gives."""
    tree = parse(code)
    text = _text_of(code, tree)
    context = Context(scratch={imports.NEEDED_KEY: list(pending[0]), imports.UNUSED_KEY: list(pending[1])})
    cache = TreeCache(tree, code, text)
    try:
        return _with_imports(context, tree, text, cache).encode(tree.encoding)
    finally:
        cache.release()


def _back_through(maps: List[Callable[[int], int]]) -> Callable[[int], int]:
    def back(line: int) -> int:
        for m in reversed(maps):
            line = m(line)
        return line

    return back


def _without_repeats(findings: List[Finding]) -> List[Finding]:
    """The catch-all (XLA199) speaks only where no CUDA rule reported the line."""
    reported = {f.line for f in findings if not f.fix and f.code.startswith("XLA1") and f.code != CATCH_ALL.code}
    return [f for f in findings if f.code != CATCH_ALL.code or f.line not in reported]
