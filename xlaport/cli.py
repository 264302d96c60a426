"""The ``xlaport`` command line.

``convert`` and ``lint`` never import torch: they must start fast enough for
a pre-commit hook.  ``verify`` imports its runtime only when it runs.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import click

from codemods import registry
from codemods.target import DEFAULT_TARGET, TARGETS
from xlaport.config import load_config
from xlaport.settings import Settings
from xlaport.files import (
    FileProblem,
    atomic_write,
    check_writable,
    copy_tree_files,
    discover,
    is_inside,
    remove_stale_temps,
)
from xlaport.runner import ERROR_CODE, FileResult, process

FORMATS = ("text", "json", "github")


def _codes(value: Optional[str]) -> Optional[List[str]]:
    if value is None:
        return None
    return [c.strip().upper() for c in value.split(",") if c.strip()]


def _check_codes(codes: Optional[Sequence[str]], option: str) -> None:
    known = [r.code for r in registry.rules()]
    for c in codes or ():
        if c != "ALL" and not any(k.startswith(c) for k in known):
            raise click.BadParameter(f"no rule code starts with {c!r} (see `xlaport rules`)", param_hint=option)


def common_options(fn):
    options = [
        click.option("--select", help="Comma-separated rule codes or prefixes to run (default: all)."),
        click.option("--ignore", help="Comma-separated rule codes or prefixes to skip."),
        click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
                     help="How to print findings."),
        click.option("-j", "--jobs", type=int, default=0, help="Worker processes (default: one per core)."),
        click.option("--target", type=click.Choice(sorted(TARGETS)), default=None,
                     help=f"API to emit (default: {DEFAULT_TARGET})."),
        click.option("--exclude", multiple=True, help="Glob of paths to skip (repeatable)."),
        click.option("--keep-progress", is_flag=True, default=None,
                     help="Keep progress bars; only drop their tensor-reading postfixes."),
        click.option("--prints", type=click.Choice(["defer", "delete", "keep"]), default=None,
                     help="Hot-loop prints that read tensors: defer to a step closure (default), delete, or keep."),
        click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                     help="pyproject.toml to read [tool.xlaport] from (default: nearest)."),
        click.option("--no-cache", is_flag=True, help="Neither read nor write the results cache (.xlaport_cache)."),
        click.option("--no-prefilter", is_flag=True, hidden=True,
                     help="Parse every triggered file with LibCST (benchmarks: results must not change)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _run(entries, settings: Settings, jobs: int, no_cache: bool, show_progress: bool) -> List[FileResult]:
    """``process`` with the cache, a progress bar on a terminal, and a clean
    stop on Ctrl-C or SIGTERM (workers are killed, nothing is written)."""
    import signal

    from xlaport.cache import Cache

    no_cache = no_cache or os.environ.get("XLAPORT_NO_CACHE", "") not in ("", "0")
    cache = None if no_cache else Cache.default(settings)

    def on_term(signum, frame):  # SIGTERM: stop like Ctrl-C, so that the workers go too
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        if show_progress and len(entries) > 20 and sys.stderr.isatty():
            from rich.progress import Progress

            with Progress(transient=True, console=_stderr_console()) as bar:
                task = bar.add_task("xlaport", total=len(entries))
                return process(entries, settings, jobs, cache, lambda n: bar.advance(task, n))
        return process(entries, settings, jobs, cache)
    except KeyboardInterrupt:
        click.echo("xlaport: interrupted; nothing was written.", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, old)


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _settings(paths, select, ignore, target, exclude, keep_progress, prints, config_path):
    config = load_config(paths, config_path)
    sel = _codes(select) if select is not None else config.get("select")
    ign = (_codes(ignore) or []) + list(config.get("ignore", []))
    extend = list(config.get("extend_select", []))  # type: ignore[call-overload]
    per_file = dict(config.get("per_file_ignores", {}))  # type: ignore[call-overload]
    _check_codes(sel, "--select")
    _check_codes(ign, "--ignore")
    _check_codes(extend, "extend-select")
    for codes in per_file.values():
        _check_codes(codes, "per-file-ignores")
    if sel is not None and "ALL" in sel:
        sel = None
    if sel is not None and extend:
        sel = list(sel) + extend
    options: Dict[str, object] = dict(config.get("options", {}))
    if keep_progress is not None:
        options["keep_progress"] = keep_progress
    if prints is not None:
        options["prints"] = prints
    target_name = target or config.get("target") or DEFAULT_TARGET
    if target_name not in TARGETS:
        raise click.UsageError(f"[tool.xlaport] target {target_name!r} is not one of {', '.join(sorted(TARGETS))}")
    settings = Settings(
        select=sel,
        ignore=ign,
        target=target_name,  # type: ignore[arg-type]
        options=options,
        per_file_ignores=per_file,
    )
    return settings, list(exclude) + list(config.get("exclude", []))


# ------------------------------------------------------------------ output


def _location(f, path: str) -> str:
    if f.cell is not None:
        return f"{path}:cell {f.cell}:{f.line}:{f.col}"
    return f"{path}:{f.line}:{f.col}"


def _emit(results: List[FileResult], fmt: str, show_fixes: bool) -> None:
    rows = []
    for r in results:
        if r.error:
            rows.append(r.error_finding())
        rows.extend(f for f in r.findings if show_fixes or not f.fix)
    if fmt == "json":
        click.echo(json.dumps({"findings": [f.as_dict() for f in rows], "cuda": _cuda_counts(results)}, indent=2))
        return
    for f in rows:
        path = f.path
        if fmt == "github":
            level = "error" if f.code == ERROR_CODE else "warning"
            msg = f.message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
            click.echo(f"::{level} file={path},line={f.line},col={f.col},title=xlaport {f.code}::{f.code} {msg}")
            continue
        mark = click.style(" [*]", fg="green") if f.fix else ""
        code = click.style(f.code, fg="red" if f.code == ERROR_CODE else "yellow", bold=True)
        click.echo(f"{click.style(_location(f, path), bold=True)}: {code}{mark} {f.message}")


def _diff(r: FileResult) -> str:
    assert r.original is not None and r.output is not None
    try:
        old = r.original.decode("utf-8")
        new = r.output.decode("utf-8")
    except UnicodeDecodeError:
        old = r.original.decode("latin-1")
        new = r.output.decode("latin-1")
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{str(r.path).lstrip('/')}",
            tofile=f"b/{str(r.path).lstrip('/')}",
        )
    )


def _cuda_counts(results: List[FileResult]) -> Dict[str, int]:
    found = sum(r.cuda[0] for r in results)
    left = sum(r.cuda[1] for r in results)
    return {"found": found, "rewritten": max(found - left, 0), "left_for_review": left}


def _coverage_line(results: List[FileResult], after: str) -> None:
    """HIPIFY-style statistics: the CUDA references of the input, how many
    the conversion removes, how many stay (each one reported above)."""
    c = _cuda_counts(results)
    if not c["found"]:
        return
    pct = 100.0 * c["rewritten"] / c["found"]
    click.echo(f"CUDA references: {c['found']} found, {c['rewritten']} {after} ({pct:.0f}%), "
               f"{c['left_for_review']} left for review (each reported above, unless its rule is turned off "
               "or suppressed).", err=True)


def _notices(results: List[FileResult], fmt: str) -> None:
    if fmt != "text":
        return
    for r in results:
        if r.notice:
            click.echo(f"{r.path}: skipped: {r.notice}", err=True)


# ------------------------------------------------------------------ commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="xlaport")
def main() -> None:
    """Migrate CUDA PyTorch code to PyTorch/XLA, and prove the result."""


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("-o", "--output", "output", type=click.Path(file_okay=False), default=None,
              help="Write a converted copy of the tree here (other files are copied) instead of in place.")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff; write nothing.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if anything would change.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors and the summary.")
@common_options
def convert(paths, output, show_diff, check, quiet, select, ignore, fmt, jobs, target, exclude,
            keep_progress, prints, config_path, no_cache, no_prefilter):
    """Rewrite CUDA code for XLA, in place or into an output tree (-o)."""
    settings, excludes = _settings(paths, select, ignore, target, exclude, keep_progress, prints, config_path)
    settings.prefilter = not no_prefilter
    if not paths:
        if fmt == "json":
            click.echo(json.dumps({"findings": [], "cuda": _cuda_counts([])}))
        sys.exit(0)
    out_root = Path(output) if output else None
    if out_root is not None:
        for p in paths:
            if Path(p).is_dir() and (is_inside(out_root, Path(p))):
                raise click.UsageError(f"output directory {output} is inside input {p}; choose another place")
            if Path(p).is_file() and out_root.resolve() == Path(p).resolve().parent:
                raise click.UsageError(f"output directory {output} would overwrite input {p}")
    entries = discover(paths, excludes)
    results = _run(entries, settings, jobs, no_cache, show_progress=fmt == "text" and not quiet)
    write = not (show_diff or check)
    if write:
        for stale in remove_stale_temps({r.path.parent for r in results}):
            click.echo(f"{stale}: removed a temporary file left by an interrupted run", err=True)
        _write(results, paths, out_root)
    if show_diff:
        for r in results:
            if r.changed:
                click.echo(_diff(r), nl=False)
    elif not quiet or fmt != "text":
        _emit(results, fmt, show_fixes=True)
    _notices(results, fmt)
    changed = [r for r in results if r.changed]
    errors = [r for r in results if r.error]
    if fmt == "text":
        fixes = sum(1 for r in results for f in r.findings if f.fix)
        left = sum(1 for r in results for f in r.findings if not f.fix)
        verb = "would change" if not write else "changed"
        click.echo(
            f"{len(changed)} file(s) {verb} ({fixes} rewrite(s)), {left} finding(s) left for review, "
            f"{len(errors)} file(s) could not be processed, {len(results)} file(s) seen.",
            err=True,
        )
        _coverage_line(results, "would be rewritten" if not write else "rewritten")
    if errors:
        sys.exit(2)
    if check and changed:
        sys.exit(1)


def _write(results: List[FileResult], paths: Sequence[str], out_root: Optional[Path]) -> None:
    if out_root is None:
        for r in results:
            if r.writable:
                try:
                    check_writable(r.path)
                    atomic_write(r.path, r.output)  # type: ignore[arg-type]
                except FileProblem as exc:
                    r.error = str(exc)
                except OSError as exc:
                    r.error = f"cannot write: {exc.strerror or exc}"
        return
    single_dir = len(paths) == 1 and Path(paths[0]).is_dir()
    written = []
    for r in results:
        if r.original is None or r.entry.notice:
            continue
        rel = r.entry.relative
        if not single_dir and r.entry.root is not None:
            rel = Path(r.entry.root.name) / rel
        dest = out_root / rel
        try:
            atomic_write(dest, r.output if r.writable else r.original, like=r.path)  # type: ignore[arg-type]
            written.append(r.path)
        except OSError as exc:
            r.error = f"cannot write {dest}: {exc.strerror or exc}"
    for p in paths:
        if Path(p).is_dir():
            dest = out_root if single_dir else out_root / Path(p).name
            for src, reason in copy_tree_files(Path(p), dest, written):
                click.echo(f"{src}: {reason}", err=True)


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--diff", "show_diff", is_flag=True, help="Also print the diff `convert` would apply.")
@click.option("--statistics", is_flag=True, help="Print counts per rule instead of each finding.")
@click.option("--include-cold", is_flag=True,
              help="Also report host reads (XLA4xx) that run once per call, not every step.")
@common_options
def lint(paths, show_diff, statistics, include_cold, select, ignore, fmt, jobs, target, exclude, keep_progress,
         prints, config_path, no_cache, no_prefilter):
    """Report what `convert` would change and which host reads remain. Writes nothing."""
    settings, excludes = _settings(paths, select, ignore, target, exclude, keep_progress, prints, config_path)
    settings.prefilter = not no_prefilter
    if include_cold:
        settings.options = {**settings.options, "include_cold": True}
    if not paths:
        if fmt == "json":
            click.echo(json.dumps({"findings": [], "cuda": _cuda_counts([])}))
        sys.exit(0)
    results = _run(discover(paths, excludes), settings, jobs, no_cache, show_progress=fmt == "text")
    if statistics and fmt == "text":
        counts: Dict[str, List[int]] = {}
        for r in results:
            for f in r.findings:
                c = counts.setdefault(f.code, [0, 0])
                c[0] += 1
                c[1] += f.fix
        index = registry.rule_info()
        for code, (n, fixable) in sorted(counts.items()):
            name = index[code].name if code in index else ""
            click.echo(f"{n:6d}  {code}  {name}{'  [*]' if fixable else ''}")
    else:
        _emit(results, fmt, show_fixes=True)
    if show_diff:
        for r in results:
            if r.changed:
                click.echo(_diff(r), nl=False)
    _notices(results, fmt)
    findings = sum(len(r.findings) for r in results)
    errors = [r for r in results if r.error]
    if fmt == "text":
        fixable = sum(1 for r in results for f in r.findings if f.fix)
        if findings or errors:
            click.echo(
                f"Found {findings} finding(s) ({fixable} fixable with `xlaport convert`) in "
                f"{sum(1 for r in results if r.findings)} file(s); {len(errors)} file(s) could not be processed.",
                err=True,
            )
        else:
            click.echo(f"All checks passed ({len(results)} file(s)).", err=True)
        _coverage_line(results, "would be rewritten by `xlaport convert`")
    if errors:
        sys.exit(2)
    if findings:
        sys.exit(1)


@main.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def rules(fmt):
    """List every rule code with its one-line summary."""
    items = registry.rules()
    if fmt == "json":
        click.echo(json.dumps([{"code": r.code, "name": r.name, "summary": r.summary, "fix": r.fix} for r in items], indent=2))
        return
    for r in items:
        click.echo(f"{r.code}  {'[*]' if r.fix else '   '}  {r.name:32s} {r.summary}")
    click.echo(f"{ERROR_CODE}       file-error                       a file could not be read, parsed or written")
    click.echo("\n[*] = rewritten by `xlaport convert`; the others are reported for review.")


@main.command()
@click.argument("code")
def explain(code):
    """Explain a rule: what it does, why it matters on XLA, an example."""
    from codemods import rule_index
    from xlaport.docs import render_rule

    index = rule_index()
    code = code.upper()
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


if __name__ == "__main__":  # pragma: no cover
    main()
