"""``verify --html REPORT.html``: the report as one self-contained page.

No script, no external file: inline CSS and SVG.  The verdict first, then
the outputs (with where the runs diverge), a timeline of every step --
compiles, executions and host transfers per sync site, the warm-up shaded --
with the runs at other lengths, and every event with its line of the user's
file and the code around it.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Dict, List

from xlaport.verify.model import BY_FORM, Report

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd}
.verdict{display:inline-block;padding:.25em .8em;border-radius:4px;color:#fff;font-weight:600}
.pass{background:#2e7d32}.fail{background:#c62828}.error{background:#6a1b9a}.recorded{background:#1565c0}
table{border-collapse:collapse;width:100%;margin:.4em 0}td,th{border:1px solid #ddd;padding:.25em .5em;
text-align:left;vertical-align:top}th{background:#f5f5f5}tr.bad td{background:#fdecea}
code,pre{font:12px/1.4 ui-monospace,monospace}pre{background:#f7f7f7;padding:.4em;margin:.2em 0;overflow:auto}
.mark{background:#fff3b0}.muted{color:#777}ul{margin:.2em 0 .6em 1.2em;padding:0}
svg text{font:11px sans-serif}
"""
_SERIES = (("compiles", "#c62828"), ("executions", "#1565c0"), ("transfers", "#ef6c00"))


def page(report: Report) -> str:
    c = report.config
    parts: List[str] = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>xlaport verify: {escape(report.verdict)}</title><style>{_CSS}</style></head><body>",
        f"<h1>xlaport verify <span id='verdict' class='verdict {escape(report.verdict)}'>"
        f"{escape(report.verdict)}</span></h1>",
        f"<p class='muted'>{escape(str(c.get('script', '')))} {escape(' '.join(map(str, c.get('args') or [])))}"
        f" &mdash; project {escape(str(c.get('root', '')))}, run from {escape(str(c.get('cwd', '')))}</p>",
    ]
    if report.error:
        parts.append(f"<h2>Could not verify</h2><pre id='error'>{escape(report.error)}</pre>")
    if report.failures:
        parts.append("<h2>Why it fails</h2><ul id='failures'>"
                     + "".join(f"<li>{escape(f)}</li>" for f in report.failures) + "</ul>")
    if c.get("conversion"):
        parts.append(f"<p id='conversion'>conversion: {escape(str(c['conversion']))}</p>")
    parts += _outputs(report)
    parts += _timeline(report)
    parts += _events(report)
    parts += _notes(report)
    parts.append("</body></html>")
    return "".join(parts)


def _outputs(report: Report) -> List[str]:
    if not report.outputs:
        return []
    tol = report.config.get("tolerance") or {}
    out = ["<h2>Outputs (reference vs XLA)</h2>"]
    if tol:
        out.append(f"<p id='tolerance'>tolerance: rtol {tol['rtol']:g}, atol {tol['atol']:g} "
                   f"<span class='muted'>({escape(str(tol['why']))})</span></p>")
    if report.divergence:
        d = report.divergence
        at = (f"the gradient of <code>{escape(str(d['module']))}</code> in backward pass"
              if d.get("phase") == "backward" else f"<code>{escape(str(d['module']))}</code> in forward pass")
        out.append(f"<p id='divergence' class='mark'>the runs diverge first at {at} {escape(str(d['pass']))}: "
                   f"{escape(str(d['detail']))}</p>")
    out.append("<table id='outputs'><tr><th></th><th>output</th><th>max abs err</th><th>max rel err</th></tr>")
    for o in report.outputs:
        out.append(f"<tr class='output-row {'ok' if o.ok else 'bad'}'><td>{'ok' if o.ok else 'DIFF'}</td>"
                   f"<td><code>{escape(o.name)}</code></td><td>{o.max_abs_err:.3g}</td><td>{o.max_rel_err:.3g}</td></tr>")
    out.append("</table>")
    return out


def _timeline(report: Report) -> List[str]:
    """One SVG per measure: a bar per step, coloured by sync site, the
    warm-up steps of each site shaded."""
    steps = list(report.metrics.get("per_step") or [])
    out: List[str] = []
    m = report.metrics
    if "compiles" in m:
        out.append("<h2>Compile behaviour</h2>"
                   f"<p id='metrics'>{m.get('steps', 0)} step(s), {m.get('compiles', 0)} compile(s), "
                   f"{m.get('compiles_after_warmup', 0)} after {m.get('warmup_steps', 0)} warm-up step(s), "
                   f"{m.get('executions', 0)} execution(s), {m.get('host_reads', 0)} host read(s)</p>")
    if steps:
        warm = int(m.get("warmup_steps", 2) or 0)  # type: ignore[call-overload]
        seen: Dict[tuple, int] = {}
        warmup = []
        for s in steps:
            site = (s.get("path"), s.get("line"))
            seen[site] = seen.get(site, 0) + 1
            warmup.append(seen[site] <= warm)
        sites = sorted(seen, key=lambda k: str(k))
        for key, colour in _SERIES:
            out.append(_bars(key, colour, [int(s.get(key, 0) or 0) for s in steps], warmup))
        out.append("<p class='muted'>shaded: each sync site's warm-up steps; sync sites: "
                   + ", ".join(f"<code>{escape(Path(str(p)).name)}:{l}</code>" for p, l in sites) + "</p>")
    lengths = m.get("lengths") or []
    if lengths:
        out.append("<table id='lengths'><tr><th>length</th><th>compiles</th><th>largest graph (IR nodes)</th></tr>"
                   + "".join(f"<tr><td>{escape(str(r['value']))}</td><td>{r['compiles']}</td>"  # type: ignore[index]
                             f"<td>{r['largest_graph']}</td></tr>" for r in lengths)  # type: ignore[union-attr, index]
                   + "</table>")
    return out


def _bars(key: str, colour: str, values: List[int], warmup: List[bool]) -> str:
    width, height, top = 900, 90, max(values + [1])
    step = width / max(len(values), 1)
    shapes = [f"<text x='0' y='12'>{escape(key)} per step (max {top})</text>"]
    for k, (v, warm) in enumerate(zip(values, warmup)):
        x = k * step
        if warm:
            shapes.append(f"<rect x='{x:.1f}' y='16' width='{step:.1f}' height='{height - 16}' fill='#eee'/>")
        h = (height - 22) * v / top
        shapes.append(f"<rect class='bar' data-step='{k + 1}' data-value='{v}' x='{x + 1:.1f}' "
                      f"y='{height - h:.1f}' width='{max(step - 2, 1):.1f}' height='{h:.1f}' fill='{colour}'>"
                      f"<title>step {k + 1}: {v} {key}</title></rect>")
    return (f"<svg class='series' id='series-{key}' width='100%' viewBox='0 0 {width} {height + 2}' "
            f"role='img' aria-label='{key} per step'>{''.join(shapes)}</svg>")


def _events(report: Report) -> List[str]:
    if not report.events:
        return []
    out = ["<h2>Where</h2><table id='events'><tr><th>kind</th><th>line of your file</th><th>count</th>"
           "<th>detail</th></tr>"]
    for e in report.events:
        where = f"{Path(str(e.get('original_path') or e.get('path') or '')).name}:{e.get('original_line') or '-'}"
        out.append(f"<tr class='event'><td>{escape(str(e['kind']))}</td><td><code>{escape(where)}</code>"
                   f"{_snippet(e)}</td><td>{escape(str(e['count']))}</td><td>{escape(str(e['detail']))}</td></tr>")
    out.append("</table>")
    return out


def _snippet(e: Dict[str, object]) -> str:
    path, line = e.get("original_path"), e.get("original_line")
    if not path or not line:
        return ""
    try:
        lines = Path(str(path)).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    n = int(line)  # type: ignore[call-overload]
    rows = []
    for k in range(max(1, n - 2), min(len(lines), n + 2) + 1):
        text = escape(f"{k:5d}  {lines[k - 1]}")
        rows.append(f"<span class='mark'>{text}</span>" if k == n else text)
    return "<pre>" + "\n".join(rows) + "</pre>"


def _notes(report: Report) -> List[str]:
    out: List[str] = []
    for title, items, ident in (("Random, not compared", report.random, "random"),
                                ("Varies between reference runs (not compared)", report.varies, "varies"),
                                (BY_FORM.capitalize(), report.by_form, "by-form"),
                                ("Not compared", report.not_compared, "not-compared"),
                                ("Differences explained: float order, precision, torch_xla's BatchNorm", report.float_order, "float-order")):
        if items:
            out.append(f"<h2>{title}</h2><ul id='{ident}'>" + "".join(f"<li>{escape(i)}</li>" for i in items)
                       + "</ul>")
    for side, trees in report.imported.items():
        own = trees.get("own") or []
        if own:
            out.append(f"<p class='muted'>{escape(side)} imported its own copy of: "
                       f"{escape(', '.join(own))}</p>")
    return out
