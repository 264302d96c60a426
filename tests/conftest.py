import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xlaport.engine import Settings, transform  # noqa: E402


def convert_text(source: str, **settings) -> tuple:
    out = transform(source.encode("utf-8"), Settings(**settings))
    return out.code.decode("utf-8"), out.findings


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
