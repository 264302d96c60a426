"""The click command for `xlaport verify` (its runtime is imported on use)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Optional

import click

from codemods.target import CPU, DEFAULT_TARGET, TARGETS

# what a conversion verify runs may target (the CPU target is its own reference's)
VERIFIED_TARGETS = [name for name in TARGETS if name != CPU.name]
RUNS_THE_PROGRAM = ("verify runs your program, unsandboxed and with your rights, at least three times "
                    "(the reference twice, the conversion once; more with --lengths or to locate a divergence), "
                    "each in a temporary copy of its project tree")


@click.command(context_settings={"ignore_unknown_options": True}, epilog=RUNS_THE_PROGRAM + ".")
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("-m", "module", default=None, metavar="MODULE",
              help="Run the program as `python -m MODULE` from the working directory (a module of the project, "
                   "`tools.sample_ddpm`); every argument after it is the program's.")
@click.option("--root", type=click.Path(exists=True, file_okay=False), default=None,
              help="The project's root (default: the nearest directory above SCRIPT with .git, pyproject.toml, "
                   "setup.py or setup.cfg; else SCRIPT's directory).")
@click.option("--converted", type=click.Path(exists=True), default=None,
              help="The converted tree, or the converted script at its place in that tree (default: convert "
                   "every module of the project into a temporary copy).")
@click.option("--device", type=click.Choice(["cpu", "tpu"]), default="cpu", show_default=True,
              help="PJRT device for the XLA run.")
@click.option("--target", type=click.Choice(sorted(VERIFIED_TARGETS)), default=None,
              help=f"What the conversion targets (default: the project's [tool.xlaport] target, else {DEFAULT_TARGET}). "
                   "torchtpu: on a host without a TPU its device-generic port runs its CPU path, and the report "
                   "says so.")
@click.option("--unsafe-fixes/--no-unsafe-fixes", "unsafe_fixes", default=None,
              help="Convert with the rewrites that change what the program computes, as `convert --unsafe-fixes` "
                   "(default: the project's [tool.xlaport] unsafe-fixes). The conversion made here reads the "
                   "project's [tool.xlaport] as `xlaport convert` run from its root does.")
@click.option("--reference", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Run the original on CUDA (auto: when there is a GPU) or retargeted to the CPU.")
@click.option("--rtol", type=float, default=None,
              help="Relative tolerance (default: 1e-3, or the dtype's when bf16/fp16 ran; printed in the report).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance (default: 1e-5, likewise).")
@click.option("--warmup-steps", type=int, default=2, show_default=True,
              help="Steps per sync site allowed to compile; compiles after them fail the run.")
@click.option("--max-host-reads-per-step", type=float, default=None, help="Fail above this (default: report only).")
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds per run.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write the report as JSON here.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Write the report as one self-contained HTML page here.")
@click.option("--reference-runs", type=click.IntRange(1, 10), default=2, show_default=True,
              help="Run the reference this many times; numbers that differ between them (timings) are not compared.")
@click.option("--lengths", default=None, metavar="ARG=A,B[,C]",
              help="Also run the conversion with the script argument ARG at each length (--steps=4,8; @0=4,8 for "
                   "the first positional argument; a third length is added to two): compilations and the "
                   "largest graph must not keep growing.")
@click.option("--converted-args", default=None, metavar="ARGS",
              help="Run the conversion with these arguments (shell words) instead of SCRIPT_ARGS: for a device "
                   "named on the command line (`-- --device cuda` for the original, `--converted-args "
                   "'--device xla'`).")
@click.option("--device-rng", is_flag=True,
              help="Compare the values of the run as it is, random numbers drawn on the device by XLA's generator "
                   "(default: where they differ, compare a second run whose device draws come from the CPU "
                   "generator, as the reference drew them; the run that is judged is never changed).")
@click.option("--record", "record_to", type=click.Path(dir_okay=False), default=None,
              help="Run only the reference (on CUDA where there is a GPU) and store its outputs here.")
@click.option("--against", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Compare the conversion with a record made by --record instead of running the original.")
@click.option("--keep", is_flag=True, help="Keep the temporary directories (their path is in the JSON report).")
@click.option("--torchrun", is_flag=True,
              help="Run both sides as `torchrun --nproc_per_node=1` would (RANK, WORLD_SIZE, MASTER_* set).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a per-step compiles/executions/transfers plot to this PNG (needs matplotlib).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the verdict line.")
@click.option("-v", "--verbose", is_flag=True, help="Also print the whole report as JSON (on stderr).")
def verify(script, script_args, module, root, converted, device, target, unsafe_fixes, reference, rtol, atol, warmup_steps, max_host_reads_per_step,
           timeout, json_out, html_out, reference_runs, lengths, converted_args, device_rng, record_to, against, keep,
           torchrun, plot, quiet, verbose):
    """Run SCRIPT as the reference and its XLA conversion; compare outputs and compile behaviour.

    The program is run as you run it: its whole project tree, from your
    working directory, with SCRIPT_ARGS (`-m MODULE`: as `python -m MODULE`).  Exit 0: pass; 1: outputs differ or
    a budget is exceeded; 2: could not verify; 130/143: interrupted."""
    from xlaport.verify.project import Project, ProjectError
    from xlaport.verify.report import plot_steps, render
    from xlaport.verify.verification import verify as run_verify

    if module is not None:
        script_args = (script, *script_args) if script is not None else script_args  # (all the program's)
        script = None
    elif script is None:
        raise click.UsageError("Missing argument 'SCRIPT' (or -m MODULE).")
    elif not Path(script).is_file():
        raise click.BadParameter(f"'{script}': {'is a directory' if Path(script).is_dir() else 'does not exist'}.",
                                 param_hint="'SCRIPT'")
    try:
        project = Project.of(Path(script) if script else None, Path(root) if root else None, module=module)
    except ProjectError as exc:
        raise click.UsageError(str(exc)) from None
    script = str(project.script)
    settings = _conversion_settings(project, target, unsafe_fixes)
    _check_outputs(project, script, converted, against, json_out=json_out, html=html_out, plot=plot,
                   record=record_to)
    if record_to and against:
        raise click.UsageError("--record and --against do not go together")
    if lengths:
        from xlaport.verify.growth import parse_lengths

        try:
            parse_lengths(lengths)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--lengths") from None
    if converted_args is not None:
        import shlex

        try:
            converted_args = shlex.split(converted_args)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--converted-args") from None
    if torchrun:
        os.environ["XLAPORT_TORCHRUN"] = "1"
    if not quiet:
        click.echo(f"xlaport: {RUNS_THE_PROGRAM}.", err=True)
    with _stopped_by_signals():
        report = run_verify(Path(script), Path(converted) if converted else None, script_args, rtol, atol, timeout,
                            max_host_reads_per_step, warmup_steps=warmup_steps, reference=reference, device=device,
                            reference_runs=reference_runs, lengths=lengths, keep=keep,
                            record_to=Path(record_to) if record_to else None,
                            against=Path(against) if against else None, root=Path(root) if root else None,
                            device_rng=device_rng, converted_args=converted_args, module=module, settings=settings)
    if json_out:
        _write(Path(json_out), json.dumps(report.as_dict(), indent=2))
    if html_out:
        from xlaport.verify.html import page

        _write(Path(html_out), page(report))
    if report.error:
        click.echo(f"verify: could not verify: {report.error}", err=True)
        sys.exit(2)
    if report.verdict == "nothing to port":  # what `convert` says of it, and as `convert`, exit 0
        click.echo(f"verify: {report.config['nothing_to_port']}; there is no conversion to verify "
                   "(`--converted` verifies one you made)")
        sys.exit(0)
    if report.verdict == "recorded":
        click.echo(f"recorded {report.metrics['runs']} {report.metrics['reference']} reference run(s) to {record_to}")
        sys.exit(0)
    if quiet:
        click.echo(f"verify: {report.verdict}")
    else:
        render(report)
    if verbose:
        click.echo(json.dumps(report.as_dict(), indent=2), err=True)
    if plot:
        try:
            plot_steps(report, Path(plot))
            click.echo(f"plot: {plot}")
        except ImportError:
            click.echo("verify: --plot needs matplotlib: pip install matplotlib", err=True)
            sys.exit(2)
    sys.exit(0 if report.verdict == "pass" else 1)


def _conversion_settings(project, target: Optional[str], unsafe_fixes: Optional[bool]):  # type: ignore[no-untyped-def]
    """What the conversion verify makes is asked to do: the project's
    ``[tool.xlaport]`` (found from its root, as ``xlaport convert ROOT``
    finds it) with the command line's ``--target`` and ``--unsafe-fixes``
    over it: the conversion checked is the one the user gets."""
    from xlaport.config import load_config, settings_for

    settings = settings_for(load_config([str(project.root)]), target=target, unsafe_fixes=unsafe_fixes)
    if settings.target not in VERIFIED_TARGETS:
        raise click.UsageError(f"[tool.xlaport] target {settings.target!r}: verify checks a conversion for "
                               f"{' or '.join(sorted(VERIFIED_TARGETS))} (--target chooses one)")
    return settings


def _check_outputs(project, script: str, converted: Optional[str], against: Optional[str], **outputs) -> None:  # type: ignore[no-untyped-def]
    """Files verify writes are refused, before anything runs, where they
    would replace the script, an input, or anything in the project's tree;
    and a --record's store is replaced only if verify made it."""
    from xlaport.files import same_file

    inputs = {Path(p).resolve() for p in (script, converted, against) if p}
    for option, value in outputs.items():
        if not value:
            continue
        path = Path(value).resolve()
        hint = f"--{option.replace('_out', '').replace('_', '-')}"
        if not path.parent.is_dir():
            raise click.BadParameter(f"the directory of {value} does not exist", param_hint=hint)
        if path in inputs or path.is_dir() or any(same_file(path, p) for p in inputs):  # a hard link of one too
            raise click.BadParameter(f"{value} is an input of this verification: it would be replaced",
                                     param_hint=hint)
        try:
            path.relative_to(project.root)
            raise click.BadParameter(f"{value} is inside the project ({project.root}): verify never writes "
                                     "the program's tree; write the report elsewhere", param_hint=hint)
        except ValueError:
            pass
        if option == "record":
            from xlaport.verify.record import owns_store

            store = path.with_name(path.name + ".d")
            if store.exists() and not owns_store(store):
                raise click.BadParameter(f"{store} exists and is not a record store verify made: it would be "
                                         "deleted; choose another name", param_hint=hint)


def _write(path: Path, text: str) -> None:
    from xlaport.files import write_report

    write_report(path, text.encode("utf-8"))


class _Stopped(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _stopped_by_signals:
    """SIGINT and SIGTERM stop the verification: the running program and its
    children are killed, the temporary trees removed, and the exit status is
    130 or 143 with a message."""

    def __enter__(self):  # type: ignore[no-untyped-def]
        def stop(signum, frame):  # type: ignore[no-untyped-def]
            raise _Stopped(signum)

        self.old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, kind, value, tb):  # type: ignore[no-untyped-def]
        for s, handler in self.old.items():
            signal.signal(s, handler)
        if isinstance(value, KeyboardInterrupt):
            signum = getattr(value, "signum", signal.SIGINT)
            click.echo("verify: interrupted; the program was stopped and its temporary copies removed.", err=True)
            sys.exit(128 + int(signum))
        return False
