"""Harm audit for every rule: names a conversion leaves unbound.

Converts a corpus with the default rules, in memory, and runs pyflakes on
each changed file before and after.  A rewrite that drops a binding (a
``with ... as bar:`` removed while ``bar`` is still used), or adds a use of
a name it never imports, shows up as an *undefined name* pyflakes reports on
the output and not on the input; a rewrite that breaks the syntax shows up as
a file that no longer parses.  Target: 0 of either.

Usage: python benchmarks/audit_names.py PATH [PATH ...] [-j N]
"""

from __future__ import annotations

import ast
import sys
import time
from collections import Counter
from pathlib import Path
from typing import List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyflakes import checker, messages  # noqa: E402

from xlaport.engine import Settings  # noqa: E402
from xlaport.files import discover  # noqa: E402
from xlaport.runner import process  # noqa: E402

_UNBOUND = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


def unbound(text: str, path: str) -> Set[Tuple[str, str]]:
    """(kind, name) pairs pyflakes reports as unbound; raises SyntaxError."""
    tree = ast.parse(text, filename=path)
    found = checker.Checker(tree, filename=path)
    return {(type(m).__name__, str(m.message_args[0])) for m in found.messages if isinstance(m, _UNBOUND)}


def main(argv: List[str]) -> int:
    paths = [a for a in argv if not a.startswith("-") and not a.isdigit()]
    jobs = int(argv[argv.index("-j") + 1]) if "-j" in argv else 2
    start = time.perf_counter()
    results = process(discover(paths, []), Settings(), jobs)
    changed = broken = 0
    new: List[Tuple[str, str, str]] = []
    rules: Counter = Counter()
    for r in results:
        if r.original is None or r.output is None or r.output == r.original or not str(r.path).endswith(".py"):
            continue
        changed += 1
        rules.update(f.code for f in r.findings if f.fix)
        before_text = r.original.decode("utf-8", "replace")
        after_text = r.output.decode("utf-8", "replace")
        try:
            before = unbound(before_text, str(r.path))
        except SyntaxError:
            continue  # not Python pyflakes can read (a template): nothing to compare
        try:
            after = unbound(after_text, str(r.path))
        except SyntaxError as e:
            broken += 1
            print(f"  does not parse after conversion: {r.path}:{e.lineno}: {e.msg}")
            continue
        for kind, name in sorted(after - before):
            new.append((str(r.path), kind, name))
    print(f"{len(results)} files in {time.perf_counter() - start:.1f} s; {changed} changed "
          f"({sum(rules.values())} rewrites: " + ", ".join(f"{c} {n}" for c, n in sorted(rules.items())) + ")")
    print(f"unbound names added: {len(new)}; files that no longer parse: {broken}")
    for path, kind, name in new:
        print(f"  {path}: {kind} `{name}`")
    return 0 if not new and not broken else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
