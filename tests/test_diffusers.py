"""diffusers, converted whole and run (issue 5): the real-world proof.

* the installed ``diffusers==0.30.3`` is converted into a scratch tree: no file
  fails, a second run changes nothing, the Stable Diffusion denoising loop ends
  with the barrier;
* the files of ``diffusers==0.42.1`` that already sync by hand (its wheel,
  fetched by ``make setup`` into ``.cache/wheels``) get no second barrier;
* a tiny Stable Diffusion pipeline (``fixtures/diffusers_sd``) runs on eager CPU
  with the original package and on XLA with the converted one, through
  ``xlaport verify``'s machinery, at 4 and at 8 inference steps.
"""

import importlib.util
import re
import zipfile
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

from codemods.base import find_all
from xlaport.cli import main

ROOT = Path(__file__).resolve().parent.parent
WHEEL_042 = ROOT / ".cache" / "wheels" / "diffusers-0.42.1-py3-none-any.whl"
SD_PIPELINE = Path("pipelines") / "stable_diffusion" / "pipeline_stable_diffusion.py"


def _installed_diffusers():
    spec = importlib.util.find_spec("diffusers")
    if spec is None or spec.origin is None:
        return None
    version = re.search(r'__version__ = "([^"]+)"', Path(spec.origin).read_text())
    return Path(spec.origin).parent if version and version.group(1) == "0.30.3" else None


DIFFUSERS = _installed_diffusers()
needs_diffusers = pytest.mark.skipif(DIFFUSERS is None, reason="diffusers==0.30.3 not installed (the diffusers extra)")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The installed diffusers 0.30.3 converted into <tmp>/diffusers, with the
    tiny SD script converted beside it (so it imports the converted package)."""
    out = tmp_path_factory.mktemp("sd")
    result = CliRunner().invoke(main, ["convert", str(DIFFUSERS), "-o", str(out / "diffusers"), "-q"])
    script = CliRunner().invoke(main, ["convert", str(ROOT / "fixtures" / "diffusers_sd" / "input.py"),
                                       "-o", str(out), "-q"])
    assert script.exit_code == 0, script.output
    return out, result


@needs_diffusers
def test_whole_package_converts_without_failures_and_is_stable(converted):
    out, result = converted
    assert result.exit_code == 0, result.output
    summary = next(l for l in result.output.splitlines() if "file(s) seen" in l)
    assert " 0 file(s) could not be processed" in summary, summary
    changed = int(re.match(r"(\d+) file\(s\) changed", summary).group(1))
    assert changed >= 100  # measured: 148 of 467
    # a second run parses every output (one that did not would be exit 2,
    # "could not be processed") and changes nothing (exit 0, not 1)
    again = CliRunner().invoke(main, ["convert", str(out / "diffusers"), "--check", "-q"])
    assert again.exit_code == 0, again.output
    assert " 0 file(s) could not be processed, 467 file(s) seen" in again.output


@needs_diffusers
def test_denoising_loop_ends_with_the_barrier(converted):
    out, _ = converted
    module = cst.parse_module((out / "diffusers" / SD_PIPELINE).read_text())
    loops = [n for n in find_all(module, cst.For)
             if module.code_for_node(n).startswith("for i, t in enumerate(timesteps)")]
    assert len(loops) == 1
    body = loops[0].body.body
    assert module.code_for_node(body[-1]).strip() == "torch_xla.sync()"
    text = module.code
    assert "progress_bar" not in text  # the bar is gone with its with-block...
    assert "callback_on_step_end(self, i, t, callback_kwargs)" in text  # ...the callbacks stay
    # the flax and onnx pipelines beside it are not torch step loops
    for other in ("pipeline_flax_stable_diffusion.py", "pipeline_onnx_stable_diffusion.py"):
        assert "torch_xla.sync()" not in (out / "diffusers" / SD_PIPELINE.parent / other).read_text()


@pytest.mark.skipif(not WHEEL_042.exists(), reason="diffusers 0.42.1 wheel not fetched (make setup)")
def test_042_hand_synced_files_get_no_second_barrier(tmp_path):
    with zipfile.ZipFile(WHEEL_042) as wheel:
        names = [n for n in wheel.namelist() if n.endswith(".py")]
        synced = {}
        for name in names:
            data = wheel.read(name)
            if b"mark_step()" in data:
                dest = tmp_path / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
                synced[dest] = data.decode()
    assert len(synced) > 100  # every pipeline syncs under `if XLA_AVAILABLE:`
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "diffusers"), "-q"])
    assert result.exit_code == 0, result.output
    doubled = [p.relative_to(tmp_path) for p in synced if "torch_xla.sync()" in p.read_text()]
    assert doubled == []
    # the hand-placed barriers are all still there, and nothing was added
    for path, original in synced.items():
        assert path.read_text().count("mark_step()") == original.count("mark_step()"), path
    assert (tmp_path / "diffusers" / SD_PIPELINE) in synced


xla = pytest.mark.xla


def _verify_sd(converted, steps):
    from xlaport.verify.verification import verify

    out, _ = converted
    report = verify(ROOT / "fixtures" / "diffusers_sd" / "input.py", converted=out / "input.py",
                    root=ROOT / "fixtures" / "diffusers_sd",
                    args=["--steps", str(steps)], timeout=600)
    assert report.error is None, report.error
    return report


@needs_diffusers
@xla
@pytest.mark.xla
@pytest.mark.slow
def test_tiny_stable_diffusion_on_xla_matches_eager_cpu(converted):
    out, _ = converted
    four, eight = _verify_sd(converted, 4), _verify_sd(converted, 8)
    for report in (four, eight):
        assert report.verdict == "pass", report.failures
        image = [o for o in report.outputs if o.name.endswith("[image]")]
        assert image and image[0].ok and image[0].max_abs_err <= 1e-3
        # every step synced at the barrier xlaport put at the end of the converted
        # pipeline's denoising loop: the converted package is the one that ran
        sites = {(s["path"], s["line"]) for s in report.metrics["per_step"]}
        assert sites == {(str(out / "diffusers" / SD_PIPELINE), _barrier_line(out / "diffusers" / SD_PIPELINE))}
        # the scheduler's index_for_timestep (.nonzero, .item) runs in the first
        # step only: reported, not in the steady-state loop
        assert report.metrics["fallbacks_after_warmup"] == {}
        assert report.metrics["host_reads_per_step"] == 0
    # the same compilations at 4 and at 8 steps
    assert four.metrics["compiles"] == eight.metrics["compiles"]
    # the step graph is reused: after the first two steps (first-order start,
    # then the second-order step) nothing compiles until the solver's
    # first-order last step, which verify names a one-off new graph
    per_step = [(s["compiles"], s["cached_compiles"]) for s in eight.metrics["per_step"]]
    assert len(per_step) == 8 and per_step[2:7] == [(0, 1)] * 5, per_step  # a cache hit each
    # four more steps are four more cache hits and nothing else (torch_xla
    # counts an execution only when it finishes, so executions are not exact)
    assert eight.metrics["cached_compiles"] - four.metrics["cached_compiles"] == 4
    assert eight.metrics["steady_state_recompiles"] == 0
    assert [e["count"] for e in eight.events if e["kind"] == "new_graph"] == [1]


def _barrier_line(path):
    """The line of the barrier that ends the denoising loop (the last one in
    the file; the other sits before the loop's ``continue``)."""
    lines = path.read_text().splitlines()
    return max(i for i, line in enumerate(lines, 1) if line.strip() == "torch_xla.sync()")
