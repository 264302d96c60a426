"""Run the engine over many files: cheap pre-filter, worker processes, results.

One bad file never stops a run: every problem becomes a result with a path
and a reason, and the other files go on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from codemods import registry
from codemods.rule import Finding
from xlaport.cache import (FINDINGS_ONLY, UNREAD, Cache, decode, depends_on, encode, encode_style, nothing,
                           pending_imports)
from xlaport.files import Entry, FileProblem, read_bytes
from xlaport.settings import Settings

# The pseudo-rule for files that could not be processed (like ruff's E902).
ERROR_CODE = "XLA001"
# (code, name, summary, why): what `xlaport rules`, `explain` and the docs say of it
FILE_ERROR = (ERROR_CODE, "file-error", "a file could not be read, decoded, parsed or written",
              "Reported for the file, with the line and column when the parser gives them; the other files of the "
              "run go on, and the file is left as it was. Fix the file (or exclude it) and run again.")


@dataclass
class FileResult:
    entry: Entry
    original: Optional[bytes] = None
    output: Optional[bytes] = None
    findings: List[Finding] = field(default_factory=list)
    error: Optional[str] = None
    error_line: Optional[int] = None
    error_col: Optional[int] = None
    notice: Optional[str] = None
    parsed: bool = False
    partial: bool = False  # notebooks: some cells failed, the others converted
    cuda: Tuple[int, int] = (0, 0)  # CUDA references: in the input, left in the output
    unread_change: bool = False  # changed, its output not read (a warm `lint`: xlaport.cache.UNREAD)

    @property
    def writable(self) -> bool:
        return self.changed and (not self.error or self.partial)

    @property
    def path(self) -> Path:
        return self.entry.path

    @property
    def changed(self) -> bool:
        return self.unread_change or (
            self.output is not None and self.original is not None and self.output != self.original)

    def error_finding(self) -> Finding:
        return Finding(
            ERROR_CODE,
            self.error or "",
            self.error_line or 1,
            self.error_col or 1,
            False,
            path=str(self.path),
        )


def _convert_bytes(path: str, data: bytes, settings: Settings, triggered: List[registry.CodemodInfo]
                   ) -> Tuple[bytes, List[Finding], List[str], Tuple[int, int], Optional[Pending]]:
    if path.endswith(".ipynb"):
        from xlaport.notebook import transform_notebook

        return (*transform_notebook(data, settings, path), None)
    from xlaport.engine import transform  # LibCST: only for files that need it

    # `lint` without --diff shows and writes no output: the imports pass is
    # left for whoever needs the output (a later `convert` reading the cache)
    outcome = transform(data, settings, path, triggered, imports_later=bool(settings.options.get(FINDINGS_ONLY)))
    return outcome.code, outcome.findings, [], outcome.cuda, outcome.imports


Problem = Optional[Tuple[str, Optional[int], Optional[int]]]


# import requests an output still lacks (needed, unused): see engine.finish_imports
Pending = Tuple[list, list]

# (output, findings, problem, CUDA counts, the output as `convert` writes it when
# that differs: see xlaport.style, the imports the output still lacks)
Outcome = Tuple[Optional[bytes], List[Finding], Problem, Tuple[int, int], Optional[bytes], Optional[Pending]]


def _work(args: Tuple[str, bytes, Settings]) -> Optional[Outcome]:
    """One file's outcome; None when no enabled codemod can concern it (a
    test of its bytes, before LibCST is even imported)."""
    path, data, settings = args
    triggered = _triggered(data, settings, path)
    if not triggered:
        return _unreadable(path, data)
    from xlaport.engine import SourceError

    try:
        out, findings, problems, cuda, pending = _convert_bytes(path, data, settings, triggered)
    except SourceError as exc:
        return None, [], (exc.message, exc.line, exc.col), (0, 0), None, None
    except RecursionError:
        return None, [], ("too deeply nested for the parser", None, None), (0, 0), None, None
    except Exception as exc:  # an xlaport bug must not abort the run
        return None, [], (f"internal error in xlaport: {type(exc).__name__}: {exc}", None, None), (0, 0), None, None
    for f in findings:
        f.path = path
    styled = _styled(path, data, out) if settings.options.get("restyle") and not problems else None
    if problems:
        return out, findings, ("; ".join(problems), None, None), cuda, styled, pending
    return out, findings, None, cuda, styled, pending


def _unreadable(path: str, data: bytes) -> Optional[Outcome]:
    """A file no rule concerns is still one Python must read: where it does
    not (a syntax error, bytes that do not decode), that is said on its line
    (XLA001), as for every other file.  Python's own parser only: LibCST is
    imported only to word the error."""
    if path.endswith(".ipynb"):
        return None  # (a notebook's cells are read by xlaport.notebook)
    try:
        compile(data, path, "exec", flags=0x400, dont_inherit=True)  # ast.PyCF_ONLY_AST
        return None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        from xlaport.engine import python_error

        error = python_error(data)
        if error is None:
            return None
        return None, [], (error.message, error.line, error.col), (0, 0), None, None


def _styled(path: str, data: bytes, out: Optional[bytes]) -> Optional[bytes]:
    """The output as `convert` writes it (``xlaport.style``): None when it
    is the engine's output as it is."""
    if out is None or out == data:
        return None
    from xlaport.style import restyle

    styled = restyle(path, data, out)
    return styled if styled != out else None


def _triggered(data: bytes, settings: Settings, path: Optional[str] = None) -> List[registry.CodemodInfo]:
    """Cheap: the enabled codemods whose trigger words the file contains (or
    a project module it imports from, for those that look there).  (The
    exact ``ast`` prefilter runs next, with the parse.)"""
    return registry.applicable(data, settings.selected_codes(), settings.options, prefilter=False, filename=path)


def process(entries: Sequence[Entry], settings: Settings, jobs: int = 0, cache: Optional[Cache] = None,
            progress: Optional[Callable[[int], None]] = None) -> List[FileResult]:
    """Results for ``entries``, in order.  ``cache`` answers unchanged files;
    ``progress(n)`` is called as n more files are done."""
    results: List[FileResult] = []
    work: List[Tuple[FileResult, Tuple[str, bytes, Settings], str]] = []
    for entry in entries:
        result = FileResult(entry, notice=entry.notice, error=entry.error)
        results.append(result)
        if entry.notice or entry.error:
            continue
        try:
            data = entry.data if entry.data is not None else read_bytes(entry.path)
        except FileProblem as exc:
            result.error = str(exc)
            continue
        result.original = data
        result.output = data
        key = ""
        if cache is not None:  # first: a warm run answers before any other look at the file
            key = cache.key(str(entry.path), data)
            hit = cache.get(key)
            if hit is not None:
                try:
                    findings_only = settings.options.get(FINDINGS_ONLY)  # (no output shown: none read)
                    outcome = decode(hit, data, str(entry.path), None if findings_only else cache.output)
                    if outcome is not None:
                        outcome = (*outcome, None, pending_imports(hit))
                    if outcome is not None and outcome[5] is not None and not findings_only:
                        hit, outcome = _with_imports(cache, key, hit, outcome, data)
                    if outcome is not None and settings.options.get("restyle"):
                        outcome = _with_style(cache, key, hit, outcome, str(entry.path), data)
                    if outcome is not None:
                        _fill(result, outcome)
                    continue
                except (KeyError, TypeError, ValueError):
                    pass  # an entry of another shape: a miss
        if not data.strip() or settings.lines_for(str(entry.path)) == frozenset():
            continue  # (nothing to look at, or --diff-base and the file did not change)
        # (whether any codemod can concern it is decided with the work, in
        # the workers: a scan of every file's bytes for every trigger word
        # would keep them waiting)
        work.append((result, (str(entry.path), data, settings), key))
    if progress is not None:
        progress(len(results) - len(work))
    outcomes = _run([job for _, job, _ in work], jobs, progress, with_deps=cache is not None)
    for (result, job, key), (outcome, deps) in zip(work, outcomes):
        if outcome is not None:
            _fill(result, outcome)
        if cache is not None and not (outcome is not None and outcome[2] is not None and outcome[2][0] == DIED):
            cache.put(key, nothing(job[1], deps) if outcome is None else encode(
                outcome[0], job[1], *outcome[1:4], styled=outcome[4], restyled=bool(job[2].options.get("restyle")),
                imports=outcome[5], path=job[0], deps=deps), *(outcome[0], outcome[4]) if outcome else ())
    return results


def _with_imports(cache: Cache, key: str, entry, outcome, data: bytes):  # type: ignore[no-untyped-def]
    """(the entry, the outcome) with the imports an entry `lint` made left
    out added to its output now, as `convert` needs it; the entry is kept
    so completed.  An output that no longer parses is a miss (ValueError)."""
    from xlaport.engine import SourceError, finish_imports

    try:
        out = finish_imports(outcome[0], outcome[5])
    except SourceError as exc:
        raise ValueError(exc.message) from None
    entry = encode(out, data, *outcome[1:4], deps=entry.get("deps"))
    cache.put(key, entry, out)
    return entry, (out, *outcome[1:5], None)


def _with_style(cache: Cache, key: str, entry, outcome, path: str, data: bytes):  # type: ignore[no-untyped-def]
    """A cached outcome with its output as `convert` writes it: the styled
    output the entry holds, or (an entry `lint` made) styled now and kept."""
    from xlaport.cache import styled_output

    known, styled = styled_output(entry, path, cache.output)
    if not known and outcome[2] is None:
        styled = _styled(path, data, outcome[0])
        cache.put(key, {**entry, **encode_style(styled, path)}, styled)
    return (*outcome[:4], styled, outcome[5])


def _fill(result: FileResult, outcome) -> None:
    out, findings, error, cuda, styled, _ = outcome
    if styled is not None:
        out = styled
    result.parsed = True
    result.cuda = tuple(cuda)  # type: ignore[assignment]
    result.unread_change = out is UNREAD
    if out is not None and out is not UNREAD:
        result.output = out
    result.findings = findings
    if error is not None:
        result.error, result.error_line, result.error_col = error
        result.partial = out is not None


Deps = Optional[Dict[str, List[int]]]


def _run(jobs_in: List[Tuple[str, bytes, Settings]], jobs: int, progress,
         with_deps: bool = False) -> Iterator[Tuple[Optional[Outcome], Deps]]:
    """``_work`` over every job, its outcomes in order, each with the other
    files it depends on where ``with_deps`` (for the cache: worked out where
    the work is, which has just read the same imports): in this process, or
    in worker processes that ignore Ctrl-C (the parent handles it: it stops
    them at once) and exit by themselves if the parent dies."""
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 1 or len(jobs_in) <= 4:
        for job in jobs_in:
            yield _job(job, with_deps)
            if progress is not None:
                progress(1)
        return
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    pool = _pool(min(jobs, len(jobs_in)))
    try:
        # Largest files first, in small chunks: the run does not end waiting
        # on one worker's large file, an interrupted run stops within one
        # chunk, and progress moves steadily.  Outcomes are given back in
        # the order of the jobs.
        order = sorted(range(len(jobs_in)), key=lambda i: -len(jobs_in[i][1]))
        size = max(1, min(8, len(jobs_in) // (jobs * 16)))
        pending = {}
        for k in range(0, len(order), size):
            chunk = order[k:k + size]
            pending[pool.submit(_work_chunk, [jobs_in[i] for i in chunk], with_deps)] = chunk
        done: Dict[int, Optional[Outcome]] = {}
        lost: List[int] = []  # jobs of a worker that died (and of every chunk the broken pool gave up)
        next_out = 0

        def finish(outcomes) -> None:  # type: ignore[no-untyped-def]
            for i, outcome in outcomes:
                done[i] = outcome
                if progress is not None:
                    progress(1)

        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                chunk = pending.pop(future)
                try:
                    outcomes = future.result()
                except BrokenProcessPool:
                    lost += chunk
                    continue
                finish(zip(chunk, outcomes))
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
        if lost:
            _release(pool)
            pool = None  # type: ignore[assignment]
            finish(_recover(sorted(lost), jobs_in, jobs, with_deps))
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
    except BaseException:
        if pool is not None:
            _release(pool, kill=True)
        raise
    if pool is not None:
        pool.shutdown(wait=True)


# The outcome of a file whose worker process died while converting it, even
# alone: a crash in LibCST's native parser (very deep nesting), or the
# system's out-of-memory killer.  Not cached: memory may be free next time.
DIED = ("the process converting this file died (a crash in the native parser, or killed by the system, "
        "e.g. out of memory); left as it is")


def _pool(workers: int):  # type: ignore[no-untyped-def]
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, initializer=_worker_init, initargs=(os.getpid(),))


def _recover(lost: List[int], jobs_in: List[Tuple[str, bytes, Settings]], jobs: int,
             with_deps: bool) -> Iterator[Tuple[int, Tuple[Optional[Outcome], Deps]]]:
    """Jobs a dead worker took with it, again: one file per task, ``jobs``
    at a time in a fresh pool; when that pool breaks too, each file of the
    batch runs alone, so that the one that kills its worker is found and
    reported (:data:`DIED`) and every other file is converted."""
    from concurrent.futures.process import BrokenProcessPool

    queue = list(lost)
    pool = None
    try:
        while queue:
            batch, queue = queue[:jobs], queue[jobs:]
            pool = pool or _pool(jobs)
            futures = [(i, pool.submit(_work_chunk, [jobs_in[i]], with_deps)) for i in batch]
            broken: List[int] = []
            for i, future in futures:
                try:
                    yield i, future.result()[0]
                except BrokenProcessPool:
                    broken.append(i)
            if not broken:
                continue
            _release(pool)
            pool = None
            for i in broken:
                solo = _pool(1)
                try:
                    yield i, solo.submit(_work_chunk, [jobs_in[i]], with_deps).result()[0]
                except BrokenProcessPool:
                    yield i, ((None, [], (DIED, None, None), (0, 0), None, None), None)
                finally:
                    _release(solo)
    finally:
        if pool is not None:
            _release(pool)


def _work_chunk(chunk: List[Tuple[str, bytes, Settings]], with_deps: bool) -> List[Tuple[Optional[Outcome], Deps]]:
    return [_job(job, with_deps) for job in chunk]


def _job(job: Tuple[str, bytes, Settings], with_deps: bool) -> Tuple[Optional[Outcome], Deps]:
    outcome = _work(job)
    return outcome, (depends_on(job[0], job[1]) if with_deps else None)


def _release(pool, kill: bool = False) -> None:  # type: ignore[no-untyped-def]
    """Give up a pool that broke (or is being interrupted, ``kill``: its
    workers are killed first) without waiting on its workers, which can hang
    on a dead one, but waiting (a bounded time) for its manager thread to
    end.  Python 3.11's exit hook writes to the wake-up pipe of every pool
    whose manager thread is alive, and a broken pool's manager closes that
    pipe as it ends: left running, the two race and the exit prints
    "OSError: Bad file descriptor"."""
    manager = getattr(pool, "_executor_manager_thread", None)
    if kill:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            try:
                proc.kill()
            except (OSError, AttributeError):
                pass
    pool.shutdown(wait=False, cancel_futures=True)
    if manager is not None:
        manager.join(timeout=10)


def tune_gc() -> None:
    """Collect cycles less often than Python's default (every 700
    allocations): a run builds large syntax trees, which hold no cycles, and
    the default makes the collector rescan them over and over (15-20% of the
    time of a large file).  For the command line and its workers, as mypy
    does; a library caller's interpreter is left alone."""
    import gc

    gc.set_threshold(50_000, 10, 10)


def _worker_init(parent: int) -> None:
    """In each worker: leave Ctrl-C to the parent, and exit when the parent
    is gone whatever killed it (a SIGKILLed parent runs no clean-up)."""
    import importlib
    import signal
    import threading
    import time

    tune_gc()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (a forked worker inherits the parent's handler)
    importlib.import_module("xlaport.engine")  # now, while the parent is still submitting the work

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="xlaport-parent-watch", daemon=True).start()
