"""Issue 13: formats, changed lines, config on the command line, excludes,
stdin, exit codes and colour -- each checked through the real CLI."""

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from xlaport.cli import main

ROOT = Path(__file__).resolve().parent.parent
CUDA = "import torch\nx = torch.zeros(2).cuda()\nprint(torch.cuda.memory_allocated())\n"


def run(*args, env=None, input=None, cwd=None):
    import os

    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        return CliRunner().invoke(main, list(map(str, args)), env=env, input=input, catch_exceptions=False)
    finally:
        os.chdir(old)


@pytest.fixture
def gpu(tmp_path):
    f = tmp_path / "gpu.py"
    f.write_text(CUDA)
    return f


def test_concise_is_one_line_per_finding(gpu):
    out = run("lint", "--format", "concise", gpu).stdout.splitlines()
    assert out[0] == f"{gpu}:2:5: XLA101 [*] `.cuda()` -> `.to(<XLA device>)`"
    assert out[1].startswith(f"{gpu}:3:7: XLA115 `cuda.memory_allocated`: no XLA counterpart")
    assert len(out) == 2


def test_json_links_docs_and_carries_statistics(gpu):
    data = json.loads(run("lint", "--format", "json", "--statistics", gpu).stdout)
    assert {f["docs"] for f in data["findings"]} == {"docs/rules/XLA101.md", "docs/rules/XLA115.md"}
    assert all((ROOT / f["docs"]).is_file() for f in data["findings"])
    assert [(s["code"], s["count"], s["fixable"]) for s in data["statistics"]] == [
        ("XLA101", 1, True), ("XLA115", 1, False)]
    assert data["findings"][0]["end_line"] == 2


def test_sarif_has_rules_with_help_and_results_that_point_at_them(gpu, monkeypatch):
    monkeypatch.setenv("XLAPORT_DOCS_URL", "https://docs.example/xlaport/{code}")
    log = json.loads(run("lint", "--format", "sarif", gpu).stdout)
    assert log["version"] == "2.1.0" and "sarif-2.1.0" in log["$schema"]
    driver = log["runs"][0]["tool"]["driver"]
    rules = driver["rules"]
    assert [r["id"] for r in rules] == ["XLA101", "XLA115"]
    assert all(r["help"]["text"] and r["shortDescription"]["text"] for r in rules)
    assert rules[0]["helpUri"] == "https://docs.example/xlaport/XLA101"
    results = log["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["XLA101", "XLA115"]
    for r in results:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        loc = r["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"].endswith("gpu.py")
        assert loc["region"]["startLine"] >= 1 and loc["region"]["endLine"] >= loc["region"]["startLine"]


def test_markdown_table_keeps_review_and_rewrites_apart(tmp_path):
    f = tmp_path / "a.py"
    f.write_text(CUDA)
    md = run("lint", "--format", "markdown", f).stdout
    assert md.startswith("### xlaport: 1 to review, 1 rewritable")
    review, rewrites = md.split("#### Rewrites")
    assert "#### Needs review" in review and "XLA115" in review and "XLA101" not in review
    assert "XLA101" in rewrites and "| Rule | Location | Message |" in rewrites
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nx = torch.ones(1).cuda(\ny = (1 |\n")  # the parser lists `|` as expected
    rows = [r for r in run("lint", "--format", "markdown", broken).stdout.splitlines() if r.startswith("| [")]
    assert rows and all(r.replace("\\|", "").count("|") == 4 for r in rows)


def test_junit_is_xml_with_a_failure_per_finding(gpu):
    root = ET.fromstring(run("lint", "--format", "junit", gpu).stdout)
    cases = root.findall(".//testcase")
    assert len(cases) == 2 and all(c.find("failure") is not None for c in cases)
    assert root.get("failures") == "2"


def test_github_annotations_escape_properties(tmp_path):
    odd = tmp_path / "odd,dir"
    odd.mkdir()
    f = odd / "a:b.py"
    f.write_text(CUDA)
    line = run("lint", "--format", "github", f).stdout.splitlines()[0]
    assert line.startswith("::warning file=") and "odd%2Cdir/a%3Ab.py,line=2,col=5,endLine=2," in line


def test_output_file_and_statistics_in_text(gpu, tmp_path):
    target = tmp_path / "report.json"
    result = run("lint", "--format", "json", "--output-file", target, gpu)
    assert result.exit_code == 1 and result.stdout == ""
    assert len(json.loads(target.read_text())["findings"]) == 2
    stats = run("lint", "--statistics", gpu).stdout
    assert "XLA101" in stats and "XLA115" in stats and "gpu.py" not in stats


def test_convert_diff_and_exit_non_zero_on_fix(gpu, tmp_path):
    clean = tmp_path / "clean.py"
    clean.write_text("import os\n")
    assert run("convert", "--diff", gpu).exit_code == 1
    assert run("convert", "--diff", clean).exit_code == 0
    assert run("convert", "--exit-non-zero-on-fix", clean).exit_code == 0
    assert run("convert", "--exit-non-zero-on-fix", gpu).exit_code == 1
    assert "xla" in gpu.read_text()
    assert run("convert", "--exit-non-zero-on-fix", gpu).exit_code == 0  # nothing left to rewrite


def test_quiet_keeps_the_review_items_and_the_summary_groups_by_rule(gpu):
    result = run("lint", "-q", gpu)
    assert "XLA115" in result.stdout and "XLA101" not in result.stdout
    assert "Would be rewritten by `xlaport convert`:" in result.stderr
    assert "Needs review (not rewritten):" in result.stderr
    converted = run("convert", "-q", gpu)
    assert "XLA115" in converted.stdout and "XLA101" not in converted.stdout
    assert "Rewritten:" in converted.stderr


def test_no_color_and_force_color(gpu):
    assert "\x1b[" in run("lint", gpu, env={"FORCE_COLOR": "1"}).stdout
    assert "\x1b[" not in run("lint", gpu, env={"FORCE_COLOR": "1", "NO_COLOR": "1"}).stdout
    assert "\x1b[" not in run("lint", gpu).stdout  # not a terminal


def test_stdin(tmp_path):
    result = run("lint", "--format", "json", "-", "--stdin-filename", "pkg/train.py", input=CUDA)
    assert {f["path"] for f in json.loads(result.stdout)["findings"]} == {"pkg/train.py"}
    converted = run("convert", "-", input=CUDA)
    assert converted.exit_code == 0
    assert ".to(" in converted.stdout and converted.stdout.startswith("import torch")
    assert "XLA115" in converted.stderr


def test_config_key_value_overrides_and_is_checked(gpu):
    only = json.loads(run("lint", "--format", "json", "--config", "select = ['XLA115']", gpu).stdout)
    assert {f["code"] for f in only["findings"]} == {"XLA115"}
    bad = run("lint", "--config", "selct = ['XLA1']", gpu)
    assert bad.exit_code == 2 and "selct" in bad.output and "select" in bad.output


def test_force_exclude_applies_to_named_files(tmp_path, gpu):
    (tmp_path / "pyproject.toml").write_text("[tool.xlaport]\nexclude = ['gpu.py']\n")
    assert run("lint", gpu, cwd=tmp_path).exit_code == 1  # named explicitly: linted
    assert run("lint", "--force-exclude", gpu, cwd=tmp_path).exit_code == 0
    (tmp_path / "pyproject.toml").write_text("[tool.xlaport]\nexclude = ['gpu.py']\nforce-exclude = true\n")
    assert run("lint", gpu, cwd=tmp_path).exit_code == 0


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(repo)})


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "old.py").write_text("import torch\n" + "a = torch.ones(1).cuda()\n" + "x = 1\n" * 6
                                     + "b = torch.ones(1).cuda()\n")
    (tmp_path / "gone.py").write_text(CUDA)
    (tmp_path / ".gitignore").write_text("generated/\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "base")
    return tmp_path


def test_gitignored_files_are_skipped_in_walks(repo):
    (repo / "generated").mkdir()
    (repo / "generated" / "g.py").write_text(CUDA)
    paths = {f["path"] for f in json.loads(run("lint", "--format", "json", repo).stdout)["findings"]}
    assert not any("generated" in p for p in paths) and any(p.endswith("old.py") for p in paths)
    paths = {f["path"] for f in json.loads(run("lint", "--format", "json", "--no-respect-gitignore",
                                               repo).stdout)["findings"]}
    assert any("generated" in p for p in paths)
    # a directory named on the command line is walked even when git ignores it
    paths = {f["path"] for f in json.loads(run("lint", "--format", "json", repo / "generated").stdout)["findings"]}
    assert any(p.endswith("g.py") for p in paths)


def test_diff_base_reports_and_rewrites_only_changed_lines(repo):
    old = repo / "old.py"
    old.write_text(old.read_text().replace("b = torch.ones(1)", "b = torch.ones(2)"))  # line 9 changed
    (repo / "gone.py").unlink()
    (repo / "new.py").write_text(CUDA)  # untracked: every line is new
    result = run("lint", "--format", "json", "--diff-base", "HEAD", old, repo / "gone.py", repo / "new.py")
    assert result.exit_code == 1, result.output
    found = [(Path(f["path"]).name, f["line"], f["code"]) for f in json.loads(result.stdout)["findings"]]
    assert ("old.py", 9, "XLA101") in found and ("old.py", 2, "XLA101") not in found
    assert ("new.py", 2, "XLA101") in found
    assert not any(name == "gone.py" for name, _, _ in found)
    converted = run("convert", "--diff-base", "HEAD", old)
    assert converted.exit_code == 0, converted.output
    text = old.read_text()
    assert "a = torch.ones(1).cuda()" in text  # an unchanged line: left alone
    assert "b = torch.ones(2).to(" in text


def test_diff_base_outside_git_or_bad_ref_is_a_usage_error(repo, tmp_path_factory):
    assert run("lint", "--diff-base", "no-such-ref", repo / "old.py").exit_code == 2
    outside = tmp_path_factory.mktemp("nogit") / "a.py"
    outside.write_text(CUDA)
    assert run("lint", "--diff-base", "HEAD", outside).exit_code == 2


def test_lint_words_rewrites_as_proposals_and_convert_as_done(tmp_path):
    f = tmp_path / "loop.py"
    f.write_text("import torch\nfor x in data:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n")
    proposed = [x["message"] for x in json.loads(run("lint", "--format", "json", "--port-cpu", f).stdout)["findings"]]
    assert any("would be added" in m for m in proposed), proposed
    done = run("convert", "--format", "json", "--port-cpu", f).stdout
    assert "would be" not in done and " added" in done


def test_github_and_sarif_point_notebook_findings_at_the_notebook_line(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title"),
                nbformat.v4.new_code_cell("import torch\nx = 1\nmodel = torch.nn.Linear(2, 2).cuda()")]
    f = tmp_path / "n.ipynb"
    f.write_text(nbformat.writes(nb))
    file_lines = f.read_text().splitlines()
    line = run("lint", "--format", "github", f).stdout.splitlines()[0]
    at = int(line.split(",line=")[1].split(",")[0])
    assert ".cuda()" in file_lines[at - 1] and "cell 2, line 3:" in line
    result = json.loads(run("lint", "--format", "sarif", f).stdout)["runs"][0]["results"][0]
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == at


@pytest.mark.parametrize("fmt", ["text", "concise", "json", "github", "sarif", "markdown", "junit"])
def test_statistics_in_every_format(gpu, fmt):
    out = run("lint", "--format", fmt, "--statistics", gpu).stdout
    assert "XLA101" in out and "XLA115" in out
    if fmt == "json":
        assert json.loads(out)["statistics"]
    elif fmt == "sarif":
        assert json.loads(out)["runs"][0]["properties"]["statistics"]
    elif fmt == "junit":
        assert ET.fromstring(out).find(".//property[@name='XLA101']").get("value") == "1"


def test_explain_file_error_and_every_rule():
    assert "could not be read" in run("explain", "XLA001").stdout
    assert "silences nothing" in run("explain", "xla002").stdout


def test_every_command_that_reports_takes_quiet_and_verbose():
    for command in ("lint", "convert", "verify"):
        text = run(command, "--help").stdout
        assert "-q, --quiet" in text and "-v, --verbose" in text, command


def test_bad_output_file_and_stdin_with_output_dir_are_usage_errors(gpu, tmp_path):
    result = run("lint", "--output-file", tmp_path / "no" / "such" / "dir.json", gpu)
    assert result.exit_code == 2 and "cannot write --output-file" in result.stderr
    assert run("convert", "-", "-o", tmp_path / "out", input=CUDA).exit_code == 2


def test_unused_suppression_is_reported_and_a_used_one_is_not(tmp_path):
    f = tmp_path / "s.py"
    f.write_text("import torch\nx = torch.ones(2).cuda()  # noqa: XLA101\ny = torch.ones(2)  # noqa: XLA101\n"
                 "z = 1  # xlaport: ignore[XLA950]\n")
    found = [(x["line"], x["code"]) for x in json.loads(run("lint", "--format", "json", f).stdout)["findings"]]
    assert found == [(3, "XLA002"), (4, "XLA002")]


def test_related_lines_reach_json_sarif_and_the_cache(tmp_path):
    """A trap reached through a call names the callee's line: `related` in
    JSON, `relatedLocations` in SARIF, the same from a warm cache."""
    src = Path(__file__).resolve().parent.parent / "fixtures" / "sampler_traps" / "input.py"
    f = tmp_path / "sampler.py"
    f.write_bytes(src.read_bytes())
    fill = src.read_text().splitlines().index(
        "        return torch.full((x.shape[0], 1), self.alphas[index], device=x.device)") + 1
    for _ in range(2):  # cold, then from the cache
        rows = json.loads(run("lint", "--format", "json", "--select", "XLA407", str(f), cwd=tmp_path).stdout)["findings"]
        assert [r.get("related") for r in rows] == [None, None, [[fill, fill]]], rows
    result = json.loads(run("lint", "--format", "sarif", "--select", "XLA407", str(f), cwd=tmp_path).stdout)
    related = [r.get("relatedLocations") for r in result["runs"][0]["results"]]
    assert related[:2] == [None, None] and related[2][0]["physicalLocation"]["region"] == {"startLine": fill,
                                                                                          "endLine": fill}
