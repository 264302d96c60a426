"""The ``xlaport`` command line.

``convert`` and ``lint`` never import torch (nor LibCST for files no rule
concerns): they must start fast enough for a pre-commit hook.  ``verify``
imports its runtime only when it runs.  Printing lives in ``xlaport.output``.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import click

from codemods import registry
from codemods.target import DEFAULT_TARGET, TARGETS
from xlaport import output
from xlaport.config import load_config, settings_for
from xlaport.files import Entry, discover, remove_stale_temps, same_file, undo_interrupted, write_report
from xlaport.runner import ERROR_CODE, FILE_ERROR, FINDINGS_ONLY, FileResult, process
from xlaport.program import leave_alone, nothing_to_port
from xlaport.settings import Settings
from xlaport.writes import PlanError, check_output_root, destinations, to_written_lines, write_in_place, write_tree


def common_options(fn):
    options = [
        click.option("--select", help="Comma-separated rule codes or prefixes to run (default: all)."),
        click.option("--ignore", help="Comma-separated rule codes or prefixes to skip."),
        click.option("--format", "fmt", type=click.Choice(output.FORMATS), default="text", show_default=True,
                     help="How to print findings."),
        click.option("--output-file", type=click.Path(dir_okay=False), default=None,
                     help="Write the findings to this file instead of standard output."),
        click.option("--statistics", is_flag=True, help="Print counts per rule instead of each finding."),
        click.option("-q", "--quiet", is_flag=True,
                     help="Leave out the rewrites; print the items needing review and the summary."),
        click.option("-v", "--verbose", is_flag=True, help="Also say what happened to every file."),
        click.option("-j", "--jobs", type=int, default=0, help="Worker processes (default: one per core)."),
        click.option("--target", type=click.Choice(sorted(TARGETS)), default=None,
                     help=f"API to emit (default: {DEFAULT_TARGET})."),
        click.option("--exclude", multiple=True, help="Glob of paths to skip (repeatable)."),
        click.option("--force-exclude", is_flag=True, default=None,
                     help="Apply excludes to files named on the command line too (for pre-commit)."),
        click.option("--no-respect-gitignore", "no_gitignore", is_flag=True,
                     help="Also look at files that .gitignore excludes."),
        click.option("--diff-base", metavar="REF", default=None,
                     help="Only lines changed since this git ref (findings; and rewrites in convert)."),
        click.option("--stdin-filename", default=None,
                     help="The path to report (and match config against) for source read from `-`."),
        click.option("--port-cpu", is_flag=True, default=None,
                     help="Also convert a program with no CUDA or accelerator code (the XLA rules apply; the program's tensors stay on the device it names)."),
        click.option("--keep-progress", is_flag=True, default=None,
                     help="Keep progress bars; only drop their tensor-reading postfixes."),
        click.option("--prints", type=click.Choice(["defer", "delete", "keep"]), default=None,
                     help="Hot-loop prints that read tensors: defer to a step closure (default), delete, or keep."),
        click.option("--unsafe-fixes/--no-unsafe-fixes", "unsafe_fixes", default=None,
                     help="Also make the rewrites that change what the program computes (`drop_last=True` on a "
                          "shuffled loader: XLA413); each is said."),
        click.option("--config", "config_args", multiple=True, metavar="PATH | KEY=VALUE",
                     help="A pyproject.toml to read [tool.xlaport] from (default: the nearest), or a "
                          "`KEY = VALUE` TOML setting that overrides it (repeatable)."),
        click.option("--no-cache", is_flag=True, help="Neither read nor write the results cache (.xlaport_cache)."),
        click.option("--no-prefilter", is_flag=True, hidden=True,
                     help="Parse every triggered file with LibCST (benchmarks: results must not change)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@dataclass
class Run:
    """What a `convert`/`lint` invocation was asked to do."""

    settings: Settings
    entries: List[Entry]
    fmt: str
    quiet: bool
    verbose: bool
    statistics: bool
    output_file: Optional[str]
    jobs: int
    no_cache: bool
    port_cpu: bool = False
    notice: Optional[str] = None  # a line about the whole run (xlaport.program)

    def process(self) -> List[FileResult]:
        for path in undo_interrupted({e.path.parent for e in self.entries if e.path is not None}):
            _echo(f"{path}: an interrupted run was rewriting it in place: its old content is back", err=True)
        results = _process(self.entries, self.settings, self.jobs, self.no_cache,
                           show_progress=self.fmt == "text" and not self.quiet and not self.output_file)
        if not self.port_cpu and nothing_to_port(results):
            self.notice = leave_alone(results)
        return results

    def report(self, results: List[FileResult]) -> None:
        """The findings, in the chosen format, to stdout or --output-file."""
        show_fixes = not self.quiet
        if self.output_file:
            text = io.StringIO()
            output.write(results, self.fmt, text, show_fixes, self.statistics)
            try:
                write_report(Path(self.output_file), text.getvalue().encode("utf-8"))
            except OSError as exc:
                _echo(f"xlaport: cannot write --output-file {self.output_file}: {exc.strerror or exc}", err=True)
                sys.exit(2)
        else:
            output.write(results, self.fmt, sys.stdout, show_fixes, self.statistics)
        if self.verbose:
            for r in results:
                state = ("error" if r.error else "changed" if r.changed else
                         "analysed" if r.parsed else "skipped" if r.notice else "nothing to look at")
                _echo(f"{r.path}: {state}", err=True)

    @property
    def text(self) -> bool:
        return self.fmt in ("text", "concise")


def _nothing_to_do(run: Run) -> None:
    """No paths: exit 0, with an empty report in the machine formats."""
    if run.fmt != "text":
        output.write([], run.fmt, sys.stdout)
    sys.exit(0)


def _echo(message: str, err: bool = False) -> None:
    click.echo(message, err=err, color=output.color())


def _prepare(paths, select, ignore, target, exclude, force_exclude, no_gitignore, diff_base, stdin_filename,
             port_cpu, keep_progress, prints, unsafe_fixes, config_args, no_prefilter, fmt, output_file, statistics, quiet, verbose, jobs,
             no_cache) -> Run:
    config_path = [c for c in config_args if "=" not in c or Path(c).is_file()]
    overrides = [c for c in config_args if c not in config_path]
    if len(config_path) > 1:
        raise click.UsageError("--config names more than one file")
    config = load_config(paths if paths != ("-",) else ([stdin_filename] if stdin_filename else ()),
                         config_path[0] if config_path else None, overrides)
    settings = settings_for(config, select, ignore, target, keep_progress, prints, unsafe_fixes)
    settings.prefilter = not no_prefilter
    excludes = list(exclude) + list(config.get("exclude", []))  # type: ignore[call-overload]
    force = force_exclude if force_exclude is not None else bool(config.get("force_exclude", False))
    if diff_base is not None:
        from xlaport.vcs import GitError, changed_lines

        try:
            settings.changed_lines = changed_lines(diff_base, Path(paths[0] if paths and paths[0] != "-" else "."))
        except GitError as exc:
            raise click.UsageError(f"--diff-base {diff_base}: {exc}") from None
        no_cache = True  # the answer depends on the diff too
    if "-" in paths:
        if len(paths) > 1:
            raise click.UsageError("`-` (standard input) cannot be mixed with other paths")
        name = Path(stdin_filename or "-")
        entries = [Entry(name, None, data=sys.stdin.buffer.read())]
        if force and stdin_filename and discover([stdin_filename], excludes, force_exclude=True,
                                                 missing_ok=True) == [] and Path(stdin_filename).exists():
            entries = []
    else:
        entries = discover(paths, excludes, force_exclude=force,
                           respect_gitignore=not no_gitignore and config.get("respect_gitignore", True) is not False,
                           missing_ok=diff_base is not None)
    if output_file:
        for e in entries:
            if e.data is None and same_file(e.path, Path(output_file)):  # also a hard link of an input
                raise click.UsageError(f"--output-file {output_file} is an input file: the report would replace it")
    port_all = port_cpu if port_cpu is not None else bool(config.get("port_cpu", False))
    return Run(settings, entries, fmt, quiet, verbose, statistics, output_file, jobs, no_cache, port_all)


def _process(entries, settings: Settings, jobs: int, no_cache: bool, show_progress: bool) -> List[FileResult]:
    """``process`` with the cache, a progress bar on a terminal, and a clean
    stop on Ctrl-C or SIGTERM (workers are killed, nothing is written)."""
    from xlaport.cache import Cache

    no_cache = no_cache or os.environ.get("XLAPORT_NO_CACHE", "") not in ("", "0")
    cache = None if no_cache else Cache.default(settings)
    try:
        with _stopped_by_signals():
            if show_progress and len(entries) > 20 and sys.stderr.isatty():
                from rich.console import Console
                from rich.progress import Progress

                with Progress(transient=True, console=Console(stderr=True)) as bar:
                    task = bar.add_task("xlaport", total=len(entries))
                    return process(entries, settings, jobs, cache, lambda n: bar.advance(task, n))
            return process(entries, settings, jobs, cache)
    except KeyboardInterrupt as stop:
        click.echo("xlaport: interrupted; nothing was written.", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # not sys.exit: the pool's exit hook would join its manager thread,
        # which can wait forever on the workers just killed
        os._exit(_exit_status(stop))


# ------------------------------------------------------------------ output helpers


def _closing(results: List[FileResult], run: Run, first_line: str, after: str, fixes_done: bool) -> None:
    """The summary on stderr (text formats): totals, then counts per rule with
    rewrites and items needing review apart, then CUDA coverage."""
    if not run.text:
        return
    for r in results:
        if r.notice:
            _echo(f"{r.path}: {r.notice}", err=True)
    if run.notice:
        _echo(run.notice, err=True)
    _echo(first_line, err=True)
    if any(r.findings or r.error for r in results) and not run.statistics:
        for line in output.summary_by_rule(results, fixes_done):
            _echo(line, err=True)
    c = output.cuda_counts(results)
    if c["found"]:
        pct = 100.0 * c["rewritten"] / c["found"]
        _echo(f"CUDA references: {c['found']} found, {c['rewritten']} {after} ({pct:.0f}%), "
              f"{c['left_for_review']} left for review (each reported above, unless its rule is turned off "
              "or suppressed).", err=True)


# ------------------------------------------------------------------ commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="xlaport")
def main() -> None:
    """Migrate CUDA PyTorch code to PyTorch/XLA, and prove the result."""
    from xlaport.runner import tune_gc

    tune_gc()


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("-o", "--output", "output_dir", type=click.Path(file_okay=False), default=None,
              help="Write a converted copy of the tree here (other files are copied) instead of in place.")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff; write nothing; exit 1 if it is not empty.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if anything would change.")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="Exit 1 when any file was rewritten.")
@common_options
def convert(paths, output_dir, show_diff, check, exit_non_zero_on_fix, **kw):
    """Rewrite CUDA code for XLA, in place or into an output tree (-o).

    `-` reads the program from standard input and prints the converted
    program to standard output (the findings go to standard error)."""
    run = _prepare(paths, **kw)
    _FAST_EXIT["ok"] = True
    if not paths:
        _nothing_to_do(run)
    stdin = paths == ("-",)
    if stdin and output_dir:
        raise click.UsageError("`-` (standard input) prints the converted program; it does not go with -o")
    out_root = Path(output_dir) if output_dir else None
    write = not (show_diff or check)
    run.settings.options = {**run.settings.options, "restyle": True}  # see xlaport.style
    if out_root is not None and write:
        try:
            check_output_root(paths, out_root)
            destinations([FileResult(e, original=b"") for e in run.entries if not e.error], paths, out_root)
        except PlanError as exc:
            raise click.UsageError(str(exc)) from None
    with _stopped_by_signals():
        results = run.process()
        if write and stdin:
            for r in results:
                sys.stdout.buffer.write(r.output if r.output is not None else (r.entry.data or b""))
            sys.stdout.flush()
        elif write:
            try:
                if out_root is None:
                    for stale in remove_stale_temps({r.path.parent for r in results}):
                        _echo(f"{stale}: removed a temporary file left by an interrupted run", err=True)
                    write_in_place(results)
                    to_written_lines(results)
                else:
                    write_tree(results, paths, out_root, lambda line: _echo(line, err=True))
            except KeyboardInterrupt as stop:  # every file is replaced whole or not at all
                _echo("xlaport: interrupted while writing; each file is either converted or unchanged.", err=True)
                sys.exit(_exit_status(stop))
    if show_diff:
        for r in results:
            if r.changed:
                click.echo(output.unified_diff(r), nl=False)
        # the diff is the output: what it cannot show (files that failed,
        # items needing review) goes to standard error
        output.write(results, run.fmt, sys.stderr, False, run.statistics)
    elif stdin and write:
        output.write(results, run.fmt, sys.stderr, not run.quiet, run.statistics)
    else:
        run.report(results)
    changed = [r for r in results if r.writable]
    errors = [r for r in results if r.error]
    fixes = sum(1 for r in changed for f in r.findings if f.fix)
    left = sum(1 for r in results for f in r.findings if not f.fix)
    verb = "would change" if not write else "changed"
    where = ""
    if write and out_root is None and not stdin and any(r.findings and not str(r.path).endswith(".ipynb") for r in changed):
        where = " Lines are those of the files as written."
    _closing(results, run,
             f"{len(changed)} file(s) {verb} ({fixes} rewrite(s)), {left} finding(s) left for review, "
             f"{len(errors)} file(s) could not be processed, {len(results)} file(s) seen.{where}",
             "would be rewritten" if not write else "rewritten", fixes_done=write)
    if errors:
        sys.exit(2)
    if changed and (check or show_diff or exit_non_zero_on_fix):
        sys.exit(1)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be, so that one clean-up serves both."""


def _exit_status(stop: BaseException) -> int:
    return 143 if isinstance(stop, Terminated) else 130


@contextlib.contextmanager
def _stopped_by_signals():
    """SIGTERM stops the run like Ctrl-C, in every phase (workers killed,
    temporary files removed, a message, exit 143)."""
    import signal

    def on_term(signum, frame):
        raise Terminated

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--diff", "show_diff", is_flag=True, help="Also print the diff `convert` would apply.")
@click.option("--include-cold", is_flag=True,
              help="Also report host reads (XLA4xx) that run once per call, not every step.")
@common_options
def lint(paths, show_diff, include_cold, **kw):
    """Report what `convert` would change and which host reads remain. Writes nothing.

    `-` reads the program from standard input (see --stdin-filename)."""
    run = _prepare(paths, **kw)
    _FAST_EXIT["ok"] = True
    if include_cold:
        run.settings.options = {**run.settings.options, "include_cold": True}
    if show_diff:  # the diff `convert` would apply
        run.settings.options = {**run.settings.options, "restyle": True}
    else:  # no output is shown: the imports pass is left to a run that needs it (xlaport.runner)
        run.settings.options = {**run.settings.options, FINDINGS_ONLY: True}
    if not paths:
        _nothing_to_do(run)
    results = run.process()
    for r in results:  # lint proposes; convert reports what it did
        for f in r.findings:
            if f.fix:
                f.message = output.as_proposal(f.message)
    run.report(results)
    if show_diff:
        for r in results:
            if r.changed:
                click.echo(output.unified_diff(r), nl=False)
    findings = sum(len(r.findings) for r in results)
    errors = [r for r in results if r.error]
    fixable = sum(1 for r in results for f in r.findings if f.fix)
    if findings or errors:
        first = (f"Found {findings} finding(s) ({fixable} fixable with `xlaport convert`) in "
                 f"{sum(1 for r in results if r.findings)} file(s); {len(errors)} file(s) could not be processed.")
    else:
        first = f"All checks passed ({len(results)} file(s))."
    _closing(results, run, first, "would be rewritten by `xlaport convert`", fixes_done=False)
    if errors:
        sys.exit(2)
    if findings:
        sys.exit(1)


@main.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def rules(fmt):
    """List every rule code with its one-line summary."""
    code, name, summary, _ = FILE_ERROR
    items = [(code, name, summary, False)] + [(r.code, r.name, r.summary, r.fix) for r in registry.rules()]
    if fmt == "json":
        click.echo(json.dumps([{"code": c, "name": n, "summary": s, "fix": f, "docs": output.DOCS_PATH.format(code=c)}
                               for c, n, s, f in items], indent=2))
        return
    for c, n, s, f in items:
        click.echo(f"{c}  {'[*]' if f else '   '}  {n:32s} {s}")
    click.echo("\n[*] = rewritten by `xlaport convert`; the others are reported for review.")


@main.command()
@click.argument("code")
def explain(code):
    """Explain a rule: what it does, why it matters on XLA, an example."""
    from codemods import rule_index
    from xlaport.docs import render_rule

    index = rule_index()
    code = code.upper()
    if code == ERROR_CODE:
        click.echo(f"{ERROR_CODE} ({FILE_ERROR[1]})\n\nWhat it does: {FILE_ERROR[2]}.\n\n{FILE_ERROR[3]}")
        return
    if code not in index:
        raise click.UsageError(f"unknown rule {code!r}; `xlaport rules` lists them")
    click.echo(render_rule(index[code][0], index[code][1]))


def _register_verify() -> None:
    from xlaport.verify.command import verify

    main.add_command(verify)


try:  # verify's command is light to import; its runtime is imported when it runs
    _register_verify()
except ImportError:  # pragma: no cover
    pass


# (set by the commands whose run leaves nothing to clean up at exit: see ``entry``)
_FAST_EXIT = {"ok": False}


def entry() -> None:  # pragma: no cover (it ends the process: tested through the console script)
    """The console script: :func:`main`, then, after ``lint`` and ``convert``,
    an exit without the interpreter's teardown, as mypy's fast exit does:
    freeing the trees and modules of a run costs 40-50 ms, a tenth of a
    one-file lint (the pre-commit hook).  Output is flushed and the exit
    hooks run first (a pool's, a temporary directory's); the files a run
    writes are closed when written.  In-process callers (``CliRunner``,
    ``main(standalone_mode=False)``) keep a normal exit."""
    try:
        main()
    except SystemExit as done:
        code = done.code
    else:
        code = 0
    if not _FAST_EXIT["ok"]:
        sys.exit(code)
    if code is not None and not isinstance(code, int):  # (`sys.exit("message")`: printed, status 1)
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`xlaport lint . | head`)
            pass
    atexit._run_exitfuncs()
    os._exit(code or 0)


if __name__ == "__main__":  # pragma: no cover
    entry()
