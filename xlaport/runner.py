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
from xlaport.cache import NOTHING, Cache, decode, encode
from xlaport.files import Entry, FileProblem, read_bytes
from xlaport.settings import Settings

# The pseudo-rule for files that could not be processed (like ruff's E902).
ERROR_CODE = "XLA001"


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

    @property
    def writable(self) -> bool:
        return self.changed and (not self.error or self.partial)

    @property
    def path(self) -> Path:
        return self.entry.path

    @property
    def changed(self) -> bool:
        return self.output is not None and self.original is not None and self.output != self.original

    def error_finding(self) -> Finding:
        return Finding(
            ERROR_CODE,
            self.error or "",
            self.error_line or 1,
            self.error_col or 1,
            False,
            path=str(self.path),
        )


def _convert_bytes(path: str, data: bytes, settings: Settings,
                   triggered: List[registry.CodemodInfo]) -> Tuple[bytes, List[Finding], List[str], Tuple[int, int]]:
    if path.endswith(".ipynb"):
        from xlaport.notebook import transform_notebook

        return transform_notebook(data, settings, path)
    from xlaport.engine import transform  # LibCST: only for files that need it

    outcome = transform(data, settings, path, triggered)
    return outcome.code, outcome.findings, [], outcome.cuda


Problem = Optional[Tuple[str, Optional[int], Optional[int]]]


Outcome = Tuple[Optional[bytes], List[Finding], Problem, Tuple[int, int]]


def _work(args: Tuple[str, bytes, Settings]) -> Optional[Outcome]:
    """One file's outcome; None when no enabled codemod can concern it (a
    test of its bytes, before LibCST is even imported)."""
    path, data, settings = args
    triggered = _triggered(data, settings)
    if not triggered:
        return None
    from xlaport.engine import SourceError

    try:
        out, findings, problems, cuda = _convert_bytes(path, data, settings, triggered)
    except SourceError as exc:
        return None, [], (exc.message, exc.line, exc.col), (0, 0)
    except RecursionError:
        return None, [], ("too deeply nested for the parser", None, None), (0, 0)
    except Exception as exc:  # an xlaport bug must not abort the run
        return None, [], (f"internal error in xlaport: {type(exc).__name__}: {exc}", None, None), (0, 0)
    for f in findings:
        f.path = path
    if problems:
        return out, findings, ("; ".join(problems), None, None), cuda
    return out, findings, None, cuda


def _triggered(data: bytes, settings: Settings) -> List[registry.CodemodInfo]:
    """Cheap: the enabled codemods whose trigger words the file contains.
    (The exact ``ast`` prefilter runs next, with the parse.)"""
    return registry.applicable(data, settings.selected_codes(), settings.options, prefilter=False)


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
                    outcome = decode(hit, data, str(entry.path))
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
    outcomes = _run([job for _, job, _ in work], jobs, progress)
    for (result, job, key), outcome in zip(work, outcomes):
        if outcome is not None:
            _fill(result, outcome)
        if cache is not None:
            cache.put(key, NOTHING if outcome is None else encode(outcome[0], job[1], *outcome[1:]))
    return results


def _fill(result: FileResult, outcome) -> None:
    out, findings, error, cuda = outcome
    result.parsed = True
    result.cuda = tuple(cuda)  # type: ignore[assignment]
    if out is not None:
        result.output = out
    result.findings = findings
    if error is not None:
        result.error, result.error_line, result.error_col = error
        result.partial = out is not None


def _run(jobs_in: List[Tuple[str, bytes, Settings]], jobs: int, progress) -> Iterator[Optional[Outcome]]:
    """``_work`` over every job, its outcomes in order: in this process, or
    in worker processes that ignore Ctrl-C (the parent handles it: it stops
    them at once) and exit by themselves if the parent dies."""
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 1 or len(jobs_in) <= 4:
        for job in jobs_in:
            yield _work(job)
            if progress is not None:
                progress(1)
        return
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(max_workers=min(jobs, len(jobs_in)), initializer=_worker_init,
                               initargs=(os.getpid(),))
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
            pending[pool.submit(_work_chunk, [jobs_in[i] for i in chunk])] = chunk
        done: Dict[int, Optional[Outcome]] = {}
        next_out = 0
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                for i, outcome in zip(pending.pop(future), future.result()):
                    done[i] = outcome
                    if progress is not None:
                        progress(1)
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
    except BaseException:
        _kill_workers(pool)
        pool.shutdown(wait=False, cancel_futures=True)  # waiting on killed workers can hang
        raise
    pool.shutdown(wait=True)


def _work_chunk(chunk: List[Tuple[str, bytes, Settings]]) -> List[Optional[Outcome]]:
    return [_work(job) for job in chunk]


def _kill_workers(pool) -> None:
    for proc in list(getattr(pool, "_processes", {}).values()):
        try:
            proc.kill()
        except (OSError, AttributeError):
            pass


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
    importlib.import_module("xlaport.engine")  # now, while the parent is still submitting the work

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="xlaport-parent-watch", daemon=True).start()
