"""`xlaport verify -m MODULE`: a program its user runs as `python -m
tools.sample_ddpm` (explainingai-code/DDPM-Pytorch's README) is verified as
that, from the working directory, where `python tools/sample_ddpm.py` would
not find the project's packages."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import project_copy
from xlaport.cli import main
from xlaport.verify.project import Project, ProjectError, module_file

HACK = "sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n"


@pytest.fixture
def sampler(tmp_path):
    """fixtures/projects/scheduler_method without its own import-path line:
    `tools/sample.py` imports `schedule.linear` as `python -m tools.sample`
    from the project's root finds it."""
    root = project_copy("scheduler_method", tmp_path)
    script = root / "tools" / "sample.py"
    assert HACK in script.read_text()
    script.write_text(script.read_text().replace(HACK, "") + 'print("as a module", int(__spec__ is not None))\n')
    (root / "tools" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text("[project]\nname = 'sampler'\n")  # (the root's marker)
    return root


def test_a_module_is_found_from_the_working_directory_as_python_finds_it(sampler):
    assert module_file("tools.sample", sampler) == sampler / "tools" / "sample.py"
    (sampler / "schedule" / "__main__.py").write_text("print(1)\n")
    assert module_file("schedule", sampler) == sampler / "schedule" / "__main__.py"
    project = Project.of(None, None, sampler, module="tools.sample")
    assert (project.root, project.script, project.cwd) == (sampler, sampler / "tools" / "sample.py", sampler)
    assert project.command(Path("/copy/tools/sample.py")) == ["-m", "tools.sample"]
    assert Project.of(sampler / "tools" / "sample.py", None, sampler).command(Path("/c/s.py")) == ["/c/s.py"]
    for bad, said in (("tools.missing", "no tools/missing.py"), ("tools..sample", "not a module name"),
                      ("", "not a module name")):
        with pytest.raises(ProjectError, match=said):
            module_file(bad, sampler)


def test_a_module_outside_the_working_directory_or_a_missing_script_is_refused_before_anything_runs(
        sampler, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["verify", "-m", "tools.sample", "--", "--steps", "4"])
    assert result.exit_code == 2 and "-m tools.sample: no tools/sample.py" in result.output, result.output
    result = CliRunner().invoke(main, ["verify", "-m", "tools.sample", "--root", str(sampler)])
    assert result.exit_code == 2 and "no tools/sample.py" in result.output, result.output
    monkeypatch.chdir(sampler / "tools")
    result = CliRunner().invoke(main, ["verify", "-m", "sample", "--root", str(sampler / "schedule")])
    assert result.exit_code == 2 and "not inside --root" in result.output, result.output
    result = CliRunner().invoke(main, ["verify"])
    assert result.exit_code == 2 and "Missing argument 'SCRIPT' (or -m MODULE)" in result.output, result.output


@pytest.mark.xla
@pytest.mark.xla
def test_a_program_run_as_a_module_is_verified_as_one(sampler, tmp_path, monkeypatch):
    """As `-m tools.sample` from the root both sides run as that (as a
    script path, verify runs the script: `__spec__` is None there) and the
    values agree."""
    monkeypatch.chdir(sampler)
    report = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["verify", "-m", "tools.sample", "--json", str(report), "--timeout", "300",
                                       "--", "--steps", "8"])
    data = json.loads(report.read_text())
    assert result.exit_code == 0 and data["verdict"] == "pass", result.output
    assert data["config"]["module"] == "tools.sample" and data["config"]["args"] == ["--steps", "8"]
    names = {o["name"] for o in data["outputs"] if o["ok"]}
    assert "stdout line 2: as a module 1" in names and any(n.startswith("stdout line 1: sample") for n in names)
    as_script = CliRunner().invoke(main, ["verify", "tools/sample.py", "--json", str(report), "--timeout", "300",
                                          "--", "--steps", "8"])
    names = {o["name"] for o in json.loads(report.read_text())["outputs"]}
    assert as_script.exit_code == 0 and "stdout line 2: as a module 0" in names, names
