import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xlaport.engine import Settings, transform  # noqa: E402

# The `verify` extra (torch and torch_xla). Where `make setup` found too little disk for it, the
# tests marked `xla` or `torch` are skipped, saying why, and the run says how many at its end.
MISSING = [name for name in ("torch", "torch_xla") if importlib.util.find_spec(name) is None]
NEEDS_VERIFY = ("xla", "torch")


def pytest_collection_modifyitems(config, items):
    if not MISSING:
        return
    skip = pytest.mark.skip(reason=f"{' and '.join(MISSING)} not installed (the `verify` extra; make setup installs "
                                   f"it where the disk has about 8.5 GB free)")
    for item in items:
        if any(item.get_closest_marker(m) for m in NEEDS_VERIFY):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    if MISSING:
        skipped = sum(1 for r in terminalreporter.stats.get("skipped", []) if "not installed (the `verify` extra"
                      in str(r.longrepr))
        terminalreporter.write_line(f"{skipped} tests that run torch or XLA were skipped: {' and '.join(MISSING)} not "
                                    f"installed here", yellow=True)


def convert_text(source: str, **settings) -> tuple:
    out = transform(source.encode("utf-8"), Settings(**settings))
    return out.code.decode("utf-8"), out.findings


def project_copy(name: str, tmp_path: Path) -> Path:
    """fixtures/projects/NAME copied under ``tmp_path``, for a test to edit."""
    import shutil

    dest = tmp_path / name
    shutil.copytree(ROOT / "fixtures" / "projects" / name, dest)
    return dest


def lint_lines(root: Path, name: str) -> str:
    """The lines of ``xlaport lint ROOT`` about the file ``name`` (the results
    cache is the test's, through ``XLAPORT_CACHE_DIR``)."""
    from click.testing import CliRunner

    from xlaport.cli import main

    output = CliRunner().invoke(main, ["lint", str(root)]).output
    return "".join(line for line in output.splitlines(True) if f"{name}:" in line)


def convert_file(path: Path) -> tuple:
    """The conversion of the file at ``path`` (its project's other modules
    read from beside it) and its findings as (line, code, fix)."""
    out = transform(path.read_bytes(), Settings(), filename=str(path))
    return out.code.decode(), [(f.line, f.code, f.fix) for f in out.findings]


def verify_lengths(program: Path, script: Path, report: Path) -> dict:
    """``xlaport verify --lengths --steps=4,8`` of ``script`` from the
    project's root: the report, once the verdict is pass and the compiles
    are the same at every length."""
    import json

    from click.testing import CliRunner

    from xlaport.cli import main

    result = CliRunner().invoke(main, ["verify", "--json", str(report), "--timeout", "300", "--root", str(program),
                                       "--lengths", "--steps=4,8", str(script)])
    data = json.loads(report.read_text())
    assert result.exit_code == 0 and data["verdict"] == "pass", result.output
    lengths = data["metrics"]["lengths"]
    assert len(lengths) >= 2 and len({r["compiles"] for r in lengths}) == 1, lengths
    return data


def cli(*args, cwd=None):
    """`xlaport ARGS` in process, from ``cwd`` (exceptions raised, not caught)."""
    from click.testing import CliRunner

    from xlaport.cli import main

    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        return CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)
    finally:
        os.chdir(old)


@pytest.fixture(autouse=True)
def _no_results_cache(monkeypatch):
    """Tests patch the engine and reuse paths and texts: a cached answer
    would hide what they test.  tests/test_cache.py turns the cache on."""
    monkeypatch.setenv("XLAPORT_NO_CACHE", "1")


@pytest.fixture
def convert():
    return convert_text


def assert_formatted_as_input(tmp_path: Path, source: str) -> None:
    """``source`` and its conversion both pass ``ruff format --check``."""
    import subprocess

    from xlaport.style import ruff_binary

    (tmp_path / "before.py").write_text(source)
    (tmp_path / "after.py").write_text(convert_text(source)[0])
    for name in ("before.py", "after.py"):
        check = subprocess.run([ruff_binary(), "format", "--isolated", "--check", name], cwd=tmp_path,
                               capture_output=True, text=True)
        assert check.returncode == 0, (name, check.stdout, check.stderr)
