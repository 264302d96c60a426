"""The click command for `xlaport verify` (its runtime is imported on use)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--converted", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The converted script (default: convert SCRIPT into a temporary directory).")
@click.option("--rtol", type=float, default=1e-3, show_default=True)
@click.option("--atol", type=float, default=1e-5, show_default=True)
@click.option("--max-host-reads-per-step", type=float, default=None, help="Fail above this (default: report only).")
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds per run.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write the report as JSON here.")
def verify(script, script_args, converted, rtol, atol, max_host_reads_per_step, timeout, json_out):
    """Run SCRIPT on eager CPU and its conversion on XLA; compare outputs and compile behaviour."""
    from xlaport.verify.core import verify as run_verify

    report = run_verify(Path(script), Path(converted) if converted else None, script_args, rtol, atol, timeout,
                        max_host_reads_per_step)
    if json_out:
        Path(json_out).write_text(json.dumps(report.as_dict(), indent=2))
    if report.error:
        click.echo(f"verify: could not verify: {report.error}", err=True)
        sys.exit(2)
    for o in report.outputs:
        mark = click.style("ok  ", fg="green") if o.ok else click.style("DIFF", fg="red")
        click.echo(f"{mark} {o.name:60s} max abs {o.max_abs_err:.3g}  max rel {o.max_rel_err:.3g}")
    m = report.metrics
    click.echo(f"XLA: {m['compiles']} compile(s) ({m['compile_seconds']:.2f}s), {m['executions']} execution(s), "
               f"{m['steps']} sync(s), {m['host_reads']} host transfer(s), fallbacks: {m['fallbacks'] or 'none'}")
    click.echo(f"verdict: {report.verdict}")
    sys.exit(0 if report.verdict == "pass" else 1)
