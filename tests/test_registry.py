"""The registry the command line reads instead of importing LibCST."""

import subprocess
import sys
import textwrap
from pathlib import Path

from codemods import CODEMODS, all_rules, registry
from codemods._registry_gen import main as regenerate

ROOT = Path(__file__).resolve().parent.parent


def test_registry_data_is_in_sync_with_the_codemods():
    # a failure here means: run `python -m codemods._registry_gen`
    assert regenerate(["--check"]) == 0


def test_registry_matches_the_classes():
    assert [(c.module, c.name) for c in registry.CODEMODS] == [(k.__module__, k.__name__) for k in CODEMODS]
    assert sorted((r.code, r.name, r.summary, r.fix) for r in registry.rules()) == sorted(
        (r.code, r.name, r.summary, r.fixes_by_default) for r in all_rules()  # (an unsafe fix: not by default)
    )
    for info, cls in zip(registry.CODEMODS, CODEMODS):
        assert set(info.triggers) == set(cls.TRIGGERS)  # (ordered shortest first)


def _modules_after(args, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from xlaport.cli import main
        try:
            main({args!r}, standalone_mode=False)
        except SystemExit:
            pass
        print(sorted(m for m in sys.modules if m.split('.')[0] in ('libcst', 'torch', 'torch_xla', 'rich')))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_a_file_no_rule_concerns_is_answered_without_libcst(tmp_path):
    (tmp_path / "plain.py").write_text("import os\nHERE = os.getcwd()\n")
    assert _modules_after(["lint", "plain.py"], tmp_path) == "[]"


def test_a_file_with_cuda_code_loads_libcst(tmp_path):
    (tmp_path / "gpu.py").write_text("import torch\nx = torch.ones(2).cuda()\n")
    assert "'libcst'" in _modules_after(["lint", "gpu.py"], tmp_path)


def test_rule_pages_are_in_sync_with_the_rules():
    # a failure here means: run `python -m xlaport.docs`
    from xlaport.docs import main as docs

    assert docs(["--check"]) == 0
    for rule in all_rules():
        page = (ROOT / "docs" / "rules" / f"{rule.code}.md").read_text()
        assert page.startswith(f"# {rule.code} ({rule.name})")
        assert "## What it does" in page and "## Why it matters on XLA" in page and "## Example" in page
