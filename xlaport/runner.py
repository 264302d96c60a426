"""Run the engine over many files: cheap pre-filter, worker processes, results.

One bad file never stops a run: every problem becomes a result with a path
and a reason, and the other files go on.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from codemods.base import Finding
from xlaport.engine import Settings, SourceError, applicable, transform
from xlaport.files import Entry, FileProblem, read_bytes

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


def _convert_bytes(path: str, data: bytes, settings: Settings) -> Tuple[bytes, List[Finding], List[str], Tuple[int, int]]:
    if path.endswith(".ipynb"):
        from xlaport.notebook import transform_notebook

        return transform_notebook(data, settings, path)
    outcome = transform(data, settings, path)
    return outcome.code, outcome.findings, [], outcome.cuda


Problem = Optional[Tuple[str, Optional[int], Optional[int]]]


def _work(args: Tuple[str, bytes, Settings]) -> Tuple[Optional[bytes], List[Finding], Problem, Tuple[int, int]]:
    path, data, settings = args
    try:
        out, findings, problems, cuda = _convert_bytes(path, data, settings)
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


def _needs_parse(data: bytes, settings: Settings) -> bool:
    """Cheap: does the file mention anything an enabled codemod looks for?"""
    return bool(applicable(data, settings.selected_codes()))


def process(entries: Sequence[Entry], settings: Settings, jobs: int = 0) -> List[FileResult]:
    results: List[FileResult] = []
    work: List[Tuple[FileResult, Tuple[str, bytes, Settings]]] = []
    for entry in entries:
        result = FileResult(entry, notice=entry.notice, error=entry.error)
        results.append(result)
        if entry.notice or entry.error:
            continue
        try:
            data = read_bytes(entry.path)
        except FileProblem as exc:
            result.error = str(exc)
            continue
        result.original = data
        result.output = data
        if data.strip() and _needs_parse(data, settings):
            work.append((result, (str(entry.path), data, settings)))
    jobs = jobs or os.cpu_count() or 1
    if jobs > 1 and len(work) > 4:
        with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
            chunk = max(1, len(work) // (jobs * 8))
            outcomes: Iterable = pool.map(_work, [w for _, w in work], chunksize=chunk)
            _collect(work, outcomes)
    else:
        _collect(work, map(_work, [w for _, w in work]))
    return results


def _collect(work, outcomes) -> None:
    for (result, _), (out, findings, error, cuda) in zip(work, outcomes):
        result.parsed = True
        result.cuda = cuda
        if out is not None:
            result.output = out
        result.findings = findings
        if error is not None:
            result.error, result.error_line, result.error_col = error
            result.partial = out is not None
