"""Golden tests: fixtures/<name>/input.py -> fixtures/<name>/expected.py."""

import json
from pathlib import Path

import libcst as cst
import pytest

from codemods.target import DEFAULT_TARGET
from xlaport.engine import Settings, transform

FIXTURES = sorted(p for p in (Path(__file__).parent.parent / "fixtures").iterdir() if (p / "input.py").exists())


def settings_for(fixture: Path) -> Settings:
    """The settings a fixture converts with: its ``target`` file names a
    target other than the default (``torchtpu``), its ``options`` file (JSON)
    the options (``{"unsafe_fixes": true}``)."""
    target, options = fixture / "target", fixture / "options"
    return Settings(target=target.read_text().strip() if target.exists() else DEFAULT_TARGET,
                    options=json.loads(options.read_text()) if options.exists() else {})


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_golden(fixture):
    source = (fixture / "input.py").read_bytes()
    settings = settings_for(fixture)
    out = transform(source, settings).code
    assert out.decode() == (fixture / "expected.py").read_text()
    cst.parse_module(out)  # parses
    compile(out, str(fixture / "expected.py"), "exec")
    again = transform(out, settings)
    assert again.code == out, "not idempotent"
    assert not [f for f in again.findings if f.fix]


def test_already_xla_is_byte_identical():
    source = (Path(__file__).parent.parent / "fixtures" / "already_xla" / "input.py").read_bytes()
    outcome = transform(source, Settings())
    assert outcome.code == source
    assert not [f for f in outcome.findings if f.fix]


def test_training_fixture_rewrites_in_the_right_places():
    text = (Path(__file__).parent.parent / "fixtures" / "train_mlp" / "expected.py").read_text()
    # the step loop iterates an MpDeviceLoader and so gets no explicit barrier
    assert "enumerate(pl.MpDeviceLoader(loader, torch_xla.device()))" in text
    assert "torch_xla.sync()" not in text
    # the per-step print is kept but deferred; the final print is not touched
    assert "xm.add_step_closure(lambda epoch=epoch, step=step, loss=loss: print(" in text
    assert 'print(f"accuracy {correct.item() / 256:.4f}")' in text
    assert "tqdm" not in text


def test_sampling_fixture_barrier_is_last_statement_of_denoising_loop():
    module = cst.parse_module((Path(__file__).parent.parent / "fixtures" / "sample_loop" / "expected.py").read_text())
    loops = [n for n in module.body if isinstance(n, cst.With)][0].body.body
    loop = [n for n in loops if isinstance(n, cst.For)][0]
    last = loop.body.body[-1]
    assert module.code_for_node(last).strip() == "torch_xla.sync()"
    assert module.code.count("torch_xla.sync()") == 1
