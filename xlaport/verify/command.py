"""The click command for `xlaport verify` (its runtime is imported on use)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--converted", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The converted script (default: convert SCRIPT into a temporary directory).")
@click.option("--device", type=click.Choice(["cpu", "tpu"]), default="cpu", show_default=True,
              help="PJRT device for the XLA run.")
@click.option("--reference", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Run the original on CUDA (auto: when there is a GPU) or retargeted to the CPU.")
@click.option("--rtol", type=float, default=1e-3, show_default=True)
@click.option("--atol", type=float, default=1e-5, show_default=True)
@click.option("--warmup-steps", type=int, default=2, show_default=True,
              help="Steps per sync site allowed to compile; compiles after them fail the run.")
@click.option("--max-host-reads-per-step", type=float, default=None, help="Fail above this (default: report only).")
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds per run.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write the report as JSON here.")
@click.option("--reference-runs", type=click.IntRange(1, 10), default=2, show_default=True,
              help="Run the reference this many times; numbers that differ between them (timings) are not compared.")
@click.option("--lengths", default=None, metavar="ARG=A,B",
              help="Also run the conversion with the script argument ARG at A and at B (e.g. --steps=4,8): "
                   "compilations and the largest graph must not grow.")
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
def verify(script, script_args, converted, device, reference, rtol, atol, warmup_steps, max_host_reads_per_step,
           timeout, json_out, reference_runs, lengths, record_to, against, keep, torchrun, plot, quiet, verbose):
    """Run SCRIPT as the reference and its XLA conversion; compare outputs and compile behaviour.

    Exit 0: pass; 1: outputs differ or a budget is exceeded; 2: could not verify.
    """
    from xlaport.verify.core import verify as run_verify
    from xlaport.verify.report import plot_steps, render

    for option, value in (("--json", json_out), ("--plot", plot), ("--record", record_to)):
        if value and not Path(value).resolve().parent.is_dir():
            raise click.BadParameter(f"the directory of {value} does not exist", param_hint=option)
    if record_to and against:
        raise click.UsageError("--record and --against do not go together")
    if lengths:
        from xlaport.verify.growth import parse_lengths

        try:
            parse_lengths(lengths)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--lengths") from None
    if torchrun:
        os.environ["XLAPORT_TORCHRUN"] = "1"
    report = run_verify(Path(script), Path(converted) if converted else None, script_args, rtol, atol, timeout,
                        max_host_reads_per_step, warmup_steps=warmup_steps, reference=reference, device=device,
                        reference_runs=reference_runs, lengths=lengths, keep=keep,
                        record_to=Path(record_to) if record_to else None, against=Path(against) if against else None)
    if json_out:
        Path(json_out).write_text(json.dumps(report.as_dict(), indent=2))
    if report.error:
        click.echo(f"verify: could not verify: {report.error}", err=True)
        sys.exit(2)
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
