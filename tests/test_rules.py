"""Every rule's own examples (its docs) run as tests, Fixit-style."""

import libcst as cst
import pytest

from codemods import all_rules
from tests.conftest import convert_text

RULES = all_rules()


def _target(rule):
    """The target a rule's examples convert to, where it is not the default."""
    return {"target": rule.example_target} if rule.example_target else {}


def test_codes_are_unique_and_documented():
    codes = [r.code for r in RULES]
    assert len(codes) == len(set(codes))
    for r in RULES:
        assert r.code.startswith("XLA") and len(r.code) == 6
        assert r.summary and r.why and r.before, r.code


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_example_before_after(rule):
    out, findings = convert_text(rule.before, select=[rule.code, *rule.requires], options=dict(rule.example_options),
                                 **_target(rule))
    codes = [f.code for f in findings]
    assert rule.code in codes, f"{rule.code} not reported on its own example"
    if rule.fix:
        assert out == rule.after
        cst.parse_module(out)
        again, again_findings = convert_text(out, select=[rule.code], options=dict(rule.example_options),
                                             **_target(rule))
        assert again == out, "second run changed the code"
        assert not [f for f in again_findings if f.fix]
    elif not rule.requires:
        assert out == rule.before
        assert all(not f.fix for f in findings)
    else:  # what it judges may rewrite other lines; its own is reported, not rewritten
        assert all(not f.fix for f in findings if f.code == rule.code)


@pytest.mark.parametrize(
    "rule,source",
    [(r, v) for r in RULES for v in r.valid],
    ids=lambda x: x.code if hasattr(x, "code") else "",
)
def test_valid_examples_untouched(rule, source):
    out, findings = convert_text(source, select=[rule.code, *rule.requires], **_target(rule))
    if not rule.requires:  # (the rules it judges may rewrite a valid example)
        assert out == source
    assert rule.code not in [f.code for f in findings]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_suppression_comment(rule):
    """`# xlaport: ignore[CODE]` on every line silences the rule."""
    lines = rule.before.splitlines()
    source = "\n".join(
        line + f"  # xlaport: ignore[{rule.code}]" if line.strip() else line
        for line in lines
    ) + "\n"
    out, findings = convert_text(source, select=[rule.code, *rule.requires], options=dict(rule.example_options),
                                 **_target(rule))
    assert rule.code not in [f.code for f in findings]


HAND_SYNCED = '''\
import torch_xla.core.xla_model as xm

for t in timesteps:
    latents = scheduler.step(unet(latents, t), t, latents).prev_sample
    xm.mark_step()

for _ in range(max_new_tokens):
    hidden = language_model(hidden)
'''


def test_hand_synced_module_gets_no_new_barrier_only_a_report():
    """Code its authors already ported (diffusers >= 0.31) keeps their choice:
    the unsynced step loop is reported, not rewritten."""
    out, findings = convert_text(HAND_SYNCED, select=["XLA302"])
    assert out == HAND_SYNCED
    [finding] = [f for f in findings if f.code == "XLA302"]
    assert not finding.fix and finding.line == 7
    # without the hand-placed barrier the same loop does get one
    unsynced = HAND_SYNCED.replace("    xm.mark_step()\n", "")
    out, _ = convert_text(unsynced, select=["XLA302"])
    assert out.count("torch_xla.sync()") == 2


def test_epoch_loop_around_a_step_loop_gets_no_barrier():
    source = (
        "for epoch in range(3):\n"
        "    for x, y in batches:\n"
        "        loss = loss_fn(model(x), y)\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "    print(epoch)\n"
    )
    out, findings = convert_text(source, select=["XLA302"])
    assert out.count("torch_xla.sync()") == 1
    assert "        opt.step()\n        torch_xla.sync()\n    print(epoch)\n" in out
    assert [f.line for f in findings if f.code == "XLA302"] == [2]
