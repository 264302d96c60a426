"""Human-readable output of a verification: a table (rich) and a PNG plot."""

from __future__ import annotations

from pathlib import Path

from xlaport.verify.model import BY_FORM, Report


def render(report: Report) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    outputs = Table(title="Outputs (reference vs XLA)")
    for col in ("", "output", "max abs err", "max rel err"):
        outputs.add_column(col)
    for o in report.outputs:
        outputs.add_row("[green]ok[/]" if o.ok else "[red]DIFF[/]", escape(o.name), f"{o.max_abs_err:.3g}", f"{o.max_rel_err:.3g}")
    console.print(outputs)
    m = report.metrics
    if "compiles" in m and not (report.config.get("device_ran") and not m.get("executions")):  # (no XLA ran)
        console.print(
            f"XLA ({m['reference']} reference): {m['steps']} step(s), {m['compiles']} compile(s) "
            f"({m['compile_seconds']:.2f}s), {m['compiles_after_warmup']} after {m['warmup_steps']} warm-up step(s) "
            f"({m.get('steady_state_recompiles', 0)} recompiling the same graph), "
            f"{m['cached_compiles']} cache hit(s), {m['executions']} execution(s), {m['host_reads']} host read(s)"
            + (f" ({m['host_reads_per_step']:.2f}/step)" if m.get("host_reads_per_step") is not None else "")
            + f", fallbacks: {m['fallbacks'] or 'none'}"
            + (f" ({m['fallbacks_after_warmup']} after warm-up)" if m.get("fallbacks_after_warmup") else "")
        )
    if m.get("lengths"):
        lengths = Table(title="Compiles at each length (--lengths)")
        for col in ("length", "compiles", "largest graph (IR nodes)"):
            lengths.add_column(col)
        for r in m["lengths"]:  # type: ignore[union-attr]
            lengths.add_row(str(r["value"]), str(r["compiles"]), str(r["largest_graph"]))
        console.print(lengths)
    if report.config.get("fixed_costs"):
        console.print(f"fixed costs: {escape(str(report.config['fixed_costs']))}")
    if report.events:
        events = Table(title="Where")
        for col in ("kind", "line", "original line", "count", "detail"):
            events.add_column(col)
        for e in report.events:
            original = f"{e['original_line']}: {e.get('source') or ''}" if e["original_line"] else "-"
            events.add_row(str(e["kind"]), f"{Path(str(e['path'])).name}:{e['line']}", escape(original[:60]),
                           str(e["count"]), escape(str(e["detail"])))
        console.print(events)
    if report.config.get("reference"):
        console.print(f"reference: {escape(str(report.config['reference']))}")
    if report.config.get("values_from"):
        console.print(f"values compared from: {escape(str(report.config['values_from']))}")
    if report.config.get("device_ran"):
        console.print(f"device: {escape(str(report.config['device_ran']))}")
    tol = report.config.get("tolerance") or {}
    if tol:
        console.print(f"tolerance: rtol {tol['rtol']:g}, atol {tol['atol']:g} ({escape(str(tol['why']))})")
    for side, trees in report.imported.items():
        own = trees.get("own") or []
        if own:
            console.print(f"{side} imported its own copy of: {escape(', '.join(own[:12]))}"
                          + (f" (+{len(own) - 12} more)" if len(own) > 12 else ""))
    for item in report.random:
        console.print(f"[yellow]random, not compared[/]: {escape(item)}")
    if report.varies:
        console.print(f"varies between reference runs (not compared): {escape('; '.join(report.varies[:8]))}"
                      + (f" (+{len(report.varies) - 8} more)" if len(report.varies) > 8 else ""))
    if report.by_form:
        console.print(f"{BY_FORM}: {escape('; '.join(report.by_form[:4]))}"
                      + (f" (+{len(report.by_form) - 4} more)" if len(report.by_form) > 4 else ""))
    for item in report.not_compared:
        console.print(f"[yellow]not compared[/]: {escape(item)}")
    if report.float_order:
        console.print(f"differences explained (float order, precision, torch_xla's BatchNorm) ({len(report.float_order)}): "
                      f"{escape('; '.join(report.float_order[:3]))}"
                      + (f" (+{len(report.float_order) - 3} more)" if len(report.float_order) > 3 else ""))
    for f in report.failures:
        console.print(f"[red]fail:[/] {escape(f)}")
    if report.config.get("conversion"):
        console.print(f"conversion: {escape(str(report.config['conversion']))}")
    console.print(f"verdict: [bold]{report.verdict}[/]")


def plot_steps(report: Report, path: Path) -> None:
    """Compiles, executions and host transfers per step, one panel each (on
    one shared axis the series hide each other: 0 and 1 overlap on most
    steps); each sync site's warm-up steps shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report.metrics.get("per_step") or []
    xs = [s["step"] for s in steps]
    warm = int(report.metrics.get("warmup_steps", 2) or 0)
    seen: dict = {}
    warmup = []
    for s in steps:
        site = (s.get("path"), s.get("line"))
        seen[site] = seen.get(site, 0) + 1
        warmup.append(seen[site] <= warm)
    series = (("compiles", "tab:red"), ("executions", "tab:blue"), ("transfers", "tab:orange"))
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 6), sharex=True)
    for ax, (key, colour) in zip(axes, series):
        for x, w in zip(xs, warmup):
            if w:
                ax.axvspan(x - 0.5, x + 0.5, color="0.9", lw=0)
        ax.bar(xs, [s[key] for s in steps], color=colour)
        ax.set_ylabel(key)
        ax.yaxis.get_major_locator().set_params(integer=True)
    axes[-1].set_xlabel("step (one barrier); shaded: warm-up")
    axes[0].set_title(f"xlaport verify: {report.verdict}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
