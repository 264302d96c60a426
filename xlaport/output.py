"""Printing results in every format a CI or a reviewer reads.

``text`` (the default, with a closing summary per rule), ``concise`` (one
line per finding), ``json``, ``github`` (workflow annotations), ``sarif``
(2.1.0, for code scanning), ``markdown`` (a table a PR bot can post) and
``junit`` (XML for test dashboards).  Rewrites (``[*]``) and items that need
review are kept apart everywhere.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from typing import Dict, List, Optional, Sequence, TextIO, Tuple

import click

from codemods import registry
from codemods.rule import Finding
from xlaport import __version__
from xlaport.runner import ERROR_CODE, FileResult

FORMATS = ("text", "concise", "json", "github", "sarif", "markdown", "junit")
DOCS_PATH = "docs/rules/{code}.md"  # in xlaport's repository; rendered from the Rule objects


def color() -> Optional[bool]:
    """``NO_COLOR`` wins, then ``FORCE_COLOR``; otherwise colour on a terminal."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return None


def docs_url(code: str) -> Optional[str]:
    """An absolute link to a rule's page when ``XLAPORT_DOCS_URL`` says where
    the docs are published (e.g. ``https://example.org/xlaport/{code}``)."""
    template = os.environ.get("XLAPORT_DOCS_URL")
    return template.format(code=code) if template else None


def rows(results: Sequence[FileResult], show_fixes: bool = True) -> List[Finding]:
    out: List[Finding] = []
    for r in results:
        if r.error:
            out.append(r.error_finding())
        out.extend(f for f in r.findings if show_fixes or not f.fix)
    return out


def statistics(results: Sequence[FileResult]) -> List[Dict[str, object]]:
    counts: Dict[str, List[int]] = {}
    for f in rows(results):
        c = counts.setdefault(f.code, [0, 0])
        c[0] += 1
        c[1] += f.fix
    info = registry.rule_info()
    return [{"code": code, "name": info[code].name if code in info else "file-error", "count": n,
             "fixable": bool(fixable)} for code, (n, fixable) in sorted(counts.items())]


def cuda_counts(results: Sequence[FileResult]) -> Dict[str, int]:
    found = sum(r.cuda[0] for r in results)
    left = sum(r.cuda[1] for r in results)
    return {"found": found, "rewritten": max(found - left, 0), "left_for_review": left}


def shown_path(path: str) -> str:
    """A path as one line of text shows it: control characters (a newline in
    a file name) escaped as Python writes them, so that one finding stays
    one line."""
    if path.isprintable():
        return path
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)


def location(f: Finding) -> str:
    if f.cell is not None:
        return f"{shown_path(f.path)}:cell {f.cell}:{f.line}:{f.col}"
    return f"{shown_path(f.path)}:{f.line}:{f.col}"


# ------------------------------------------------------------------ writers


def write(results: Sequence[FileResult], fmt: str, out: TextIO, show_fixes: bool = True,
          stats: bool = False) -> None:
    found = rows(results, show_fixes)
    if fmt == "json":
        data: Dict[str, object] = {"findings": [_json_row(f) for f in found], "cuda": cuda_counts(results)}
        if stats:
            data["statistics"] = statistics(results)
        out.write(json.dumps(data, indent=2) + "\n")
    elif fmt == "sarif":
        log = sarif(found)
        if stats:
            log["runs"][0]["properties"] = {"statistics": statistics(results)}  # type: ignore[index]
        out.write(json.dumps(log, indent=2) + "\n")
    elif fmt == "junit":
        out.write(junit(results, found, statistics(results) if stats else None))
    elif fmt == "markdown":
        out.write(markdown(results, found, stats))
    elif fmt == "github":
        for f in found:
            out.write(github(f) + "\n")
        if stats:
            counts = ", ".join(f"{s['code']} x{s['count']}" for s in statistics(results)) or "no findings"
            out.write(f"::notice title=xlaport statistics::{_escape_data(counts)}\n")
    elif stats:
        for s in statistics(results):
            out.write(f"{s['count']:6d}  {s['code']}  {s['name']}{'  [*]' if s['fixable'] else ''}\n")
    else:
        for f in found:
            out.write(_text_row(f, fmt == "concise", out) + "\n")


def _json_row(f: Finding) -> Dict[str, object]:
    d = f.as_dict()
    if f.code != ERROR_CODE:
        d["docs"] = DOCS_PATH.format(code=f.code)
        url = docs_url(f.code)
        if url:
            d["url"] = url
    return d


def _text_row(f: Finding, concise: bool, out: TextIO) -> str:
    use_color = color()
    if use_color is None:
        use_color = hasattr(out, "isatty") and out.isatty()
    style = (lambda text, **kw: click.style(text, **kw)) if use_color else (lambda text, **kw: text)
    mark = style(" [*]", fg="green") if f.fix else ""
    code = style(f.code, fg="red" if f.code == ERROR_CODE else "yellow", bold=True)
    if concise:
        return f"{location(f)}: {code}{mark} {f.message}"
    return f"{style(location(f), bold=True)}: {code}{mark} {f.message}"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _in_file(f: Finding) -> Tuple[int, int, int, int]:
    """(line, col, end line, end col) in the file itself: a notebook cell's
    line is mapped to the line of the .ipynb that holds it."""
    if f.cell is None:
        return f.line, f.col, f.end_line, f.end_col
    from xlaport.notebook import file_line

    try:
        data = _read_cached(f.path)
    except OSError:
        return 1, 1, 0, 0
    line = file_line(data, f.cell, f.line)
    end = file_line(data, f.cell, f.end_line) if f.end_line else 0
    return line, 1, end, 0


_FILES: Dict[str, bytes] = {}


def _read_cached(path: str) -> bytes:
    if path not in _FILES:
        with open(path, "rb") as fh:
            _FILES[path] = fh.read()
    return _FILES[path]


def github(f: Finding) -> str:
    """A workflow command; properties escaped as GitHub's toolkit does."""
    level = "error" if f.code == ERROR_CODE else "warning"
    line, col, end_line, end_col = _in_file(f)
    props = [f"file={_escape_property(f.path)}", f"line={line}", f"col={col}"]
    if end_line:
        props += [f"endLine={end_line}"] + ([f"endColumn={end_col}"] if end_col else [])
    title = f"xlaport {f.code}" + (" (fixable)" if f.fix else "")
    props.append(f"title={_escape_property(title)}")
    where = f"cell {f.cell}, line {f.line}: " if f.cell is not None else ""
    return f"::{level} {','.join(props)}::{_escape_data(f'{f.code} {where}{f.message}')}"


def sarif(found: Sequence[Finding]) -> Dict[str, object]:
    """SARIF 2.1.0: one run, every rule with its docs, one result per finding."""
    from codemods import rule_index
    from xlaport.docs import render_rule

    index = rule_index()
    codes = sorted({f.code for f in found if f.code in index})
    rules = []
    for code in codes:
        rule, codemod = index[code]
        entry: Dict[str, object] = {
            "id": code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": rule.why},
            "help": {"text": render_rule(rule, codemod), "markdown": f"```\n{render_rule(rule, codemod)}\n```"},
            "defaultConfiguration": {"level": "warning"},
            "properties": {"fixable": rule.fix, "docs": DOCS_PATH.format(code=code)},
        }
        url = docs_url(code)
        if url:
            entry["helpUri"] = url
        rules.append(entry)
    position = {code: k for k, code in enumerate(codes)}
    results = []
    for f in found:
        line, col, end_line, end_col = _in_file(f)
        region: Dict[str, int] = {"startLine": line, "startColumn": col}
        if end_line:
            region["endLine"] = end_line
            if end_col:
                region["endColumn"] = end_col
        result: Dict[str, object] = {
            "ruleId": f.code,
            "level": "error" if f.code == ERROR_CODE else "warning",
            "message": {"text": f.message + (f" (notebook cell {f.cell}, line {f.line})" if f.cell is not None else "")},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": f.path.replace(os.sep, "/")},
                "region": region,
            }}],
        }
        if f.related and f.cell is None:
            result["relatedLocations"] = [{"id": k, "physicalLocation": {
                "artifactLocation": {"uri": f.path.replace(os.sep, "/")},
                "region": {"startLine": a, "endLine": b}}} for k, (a, b) in enumerate(f.related)]
        if f.code in position:
            result["ruleIndex"] = position[f.code]
        if f.fix:
            result["properties"] = {"fixable": True}
        results.append(result)
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "xlaport", "version": __version__, "rules": rules}},
            "results": results,
        }],
    }


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: Sequence[FileResult], found: Sequence[Finding], stats: bool) -> str:
    fixes = [f for f in found if f.fix]
    review = [f for f in found if not f.fix]
    lines = [f"### xlaport: {len(review)} to review, {len(fixes)} rewritable by `xlaport convert`", ""]
    if not found:
        return lines[0] + "\n\nAll checks passed.\n"
    for title, group in (("Needs review", review), ("Rewrites (`xlaport convert`)", fixes)):
        if not group:
            continue
        lines += [f"#### {title}", "", "| Rule | Location | Message |", "| --- | --- | --- |"]
        lines += [f"| [{f.code}]({DOCS_PATH.format(code=f.code)}) | `{_md(location(f))}` | {_md(f.message)} |"
                  for f in group]
        lines.append("")
    if stats:
        lines += ["| Count | Rule | Name | Fixable |", "| ---: | --- | --- | --- |"]
        lines += [f"| {s['count']} | {s['code']} | {s['name']} | {'yes' if s['fixable'] else 'no'} |"
                  for s in statistics(results)]
        lines.append("")
    return "\n".join(lines)


def junit(results: Sequence[FileResult], found: Sequence[Finding], stats=None) -> str:
    from xml.sax.saxutils import escape, quoteattr  # pulls in urllib: only for this format

    by_file: Dict[str, List[Finding]] = {}
    for f in found:
        by_file.setdefault(f.path, []).append(f)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites name="xlaport" tests="{len(found)}" failures="{len(found)}">']
    if stats:  # counts per rule, as the properties of a suite of their own
        out.append('  <testsuite name="xlaport statistics" tests="0" failures="0">')
        out.append("    <properties>")
        out += [f'      <property name={quoteattr(str(s["code"]))} value="{s["count"]}"/>' for s in stats]
        out.append("    </properties>")
        out.append("  </testsuite>")
    for path, group in by_file.items():
        out.append(f'  <testsuite name={quoteattr(path)} tests="{len(group)}" failures="{len(group)}">')
        for f in group:
            name = f"{f.code} line {f.line}, col {f.col}" + (f" (cell {f.cell})" if f.cell is not None else "")
            out.append(f"    <testcase name={quoteattr(name)} classname={quoteattr(path)}>")
            out.append(f"      <failure message={quoteattr(f.message)} type={quoteattr(f.code)}>"
                       f"{escape(location(f))}: {escape(f.message)}</failure>")
            out.append("    </testcase>")
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


_DONE_RE = re.compile(r"\b(added|removed|dropped|deferred|dedented|replaced|unwrapped|wrapped|deleted|rewritten|"
                      r"inserted|moved)\b|\b(becomes|become)\b")


def as_proposal(message: str) -> str:
    """A rewrite's message as `lint` says it: what `convert` *would* do
    (``sync() added`` -> ``sync() would be added``)."""
    return _DONE_RE.sub(lambda m: f"would be {m.group(1)}" if m.group(1) else "would become", message)


# ------------------------------------------------------------------ summary


def summary_by_rule(results: Sequence[FileResult], fixes_done: bool) -> List[str]:
    """The closing summary: rewrites and items needing review apart, by rule."""
    fix_rows: List[Tuple[int, str, str]] = []
    review_rows: List[Tuple[int, str, str]] = []
    counts: Dict[Tuple[str, bool], int] = {}
    for f in rows(results):
        counts[(f.code, f.fix)] = counts.get((f.code, f.fix), 0) + 1
    info = registry.rule_info()
    for (code, fix), n in sorted(counts.items()):
        name = info[code].name if code in info else "file-error"
        (fix_rows if fix else review_rows).append((n, code, name))
    lines: List[str] = []
    if fix_rows:
        lines.append("Rewritten:" if fixes_done else "Would be rewritten by `xlaport convert`:")
        lines += [f"  {n:5d}  {code}  {name}" for n, code, name in fix_rows]
    if review_rows:
        lines.append("Needs review (not rewritten):")
        lines += [f"  {n:5d}  {code}  {name}" for n, code, name in review_rows]
    hidden = [f.code for f in rows(results) if f.unsafe_fix]
    if hidden:
        lines.append(f"{len(hidden)} hidden fix{'es' if len(hidden) != 1 else ''} can be enabled with the "
                     "`--unsafe-fixes` option (they change what the program computes: "
                     f"{', '.join(f'`xlaport explain {c}`' for c in sorted(set(hidden)))}).")
    return lines


def unified_diff(r: FileResult) -> str:
    """What `--diff` prints for one changed file (per cell for notebooks)."""
    assert r.original is not None and r.output is not None
    if str(r.path).endswith(".ipynb"):
        from xlaport.notebook import cell_diff

        cells = cell_diff(r.original, r.output, str(r.path).lstrip("/"))
        if cells is not None:
            return cells
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
