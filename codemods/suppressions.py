"""XLA002: suppression comments that silence nothing, or name no rule.

Runs after every other codemod of the file (Ruff's RUF100): a
``# noqa: XLA101`` or ``# xlaport: ignore[XLA3]`` is *unused* when no finding
of a rule it names was silenced on its line in this run, and *unknown* when a
code it names matches no rule.  A comment naming rules that this run did not
select is not judged (it may be needed by another run), nor is a file-level
``ignore-file``.
"""

from __future__ import annotations

import io
import re
import tokenize
from typing import List, Set, Tuple

import libcst as cst

from codemods.base import (
    FINDINGS_KEY,
    ORIGINAL_LINE_KEY,
    SELECT_KEY,
    SOURCE_KEY,
    USED_SUPPRESSIONS_KEY,
    Finding,
    Rule,
    XlaCodemod,
    code_matches,
    parse_suppressions,
)

UNUSED_SUPPRESSION = Rule(
    code="XLA002",
    name="unused-suppression",
    summary="a suppression comment silences nothing, or names no xlaport rule",
    why=(
        "A `# noqa: XLA...` or `# xlaport: ignore[...]` that no longer silences anything hides the next real "
        "problem on that line, and a misspelt code silences nothing at all while looking as if it did. Delete "
        "the comment or fix the code it names."
    ),
    before="import torch\nx = torch.ones(2)  # noqa: XLA950\n",
    after=None,
    valid=("import torch\nx = torch.ones(2)  # noqa: E501\n",),
)


class UnusedSuppressions(XlaCodemod):
    DESCRIPTION = "Report suppression comments that silence nothing or name no rule."
    RULES = (UNUSED_SUPPRESSION,)
    # an xlaport suppression names an XLA code (a bare `# noqa` or one for
    # other tools' codes is not ours, and must not cost a parse)
    TRIGGERS = (b"xlaport:", b"noqa: XLA", b"noqa:XLA", b"NOQA: XLA", b"noqa: xla")

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if not self.enabled(UNUSED_SUPPRESSION.code):
            return tree
        source = self.context.scratch.get(SOURCE_KEY)
        text = source if isinstance(source, str) else tree.code
        comments = parse_suppressions(text)
        if not comments:
            return tree
        from codemods import registry

        known = [r.code for r in registry.rules()]
        selected = set(self.context.scratch.get(SELECT_KEY) or known)  # type: ignore[arg-type]
        back = self.context.scratch.get(ORIGINAL_LINE_KEY) or (lambda n: n)
        used: Set[Tuple[int, str]] = self.context.scratch.get(USED_SUPPRESSIONS_KEY) or set()  # type: ignore[assignment]
        columns = _comment_columns(text)
        only = self.options.get("only_lines")  # --diff-base
        findings: List[Finding] = self.context.scratch.setdefault(FINDINGS_KEY, [])  # type: ignore[assignment]
        for line, codes in sorted(comments.items()):
            original = back(line)  # type: ignore[operator]
            if UNUSED_SUPPRESSION.code in codes or (only is not None and original not in only):  # type: ignore[operator]
                continue  # this rule silenced on the line by name, or a line the change did not touch
            for code in sorted(codes):
                covered = [k for k in known if code_matches(k, [code])]
                if not covered:
                    message = f"`{code}` names no xlaport rule (see `xlaport rules`); the comment silences nothing"
                elif not all(k in selected for k in covered):
                    continue  # rules this run did not run: cannot tell
                elif any(ln == original and code_matches(k, [code]) for ln, k in used):
                    continue
                else:
                    what = "every rule" if code == "*" else f"`{code}`"
                    message = f"suppression of {what} silences nothing on this line; remove it"
                findings.append(Finding(UNUSED_SUPPRESSION.code, message, line, columns.get(line, 1), False))
        return tree


_MARKER = re.compile(r"#\s*(xlaport:|noqa)", re.IGNORECASE)


def _comment_columns(text: str) -> dict:
    out = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and _MARKER.search(tok.string):
                out[tok.start[0]] = tok.start[1] + 1
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out
