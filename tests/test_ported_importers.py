"""A module that names no CUDA is code being ported when a module being
ported imports it (codemods/analysis/importers.py ``ported_importer``): the
rules that speak only in code being ported (XLA158-161, XLA409, XLA410,
XLA413) speak there too.  fixtures/projects/seq2seq_helper: ``train.py``
chooses ``"cuda"`` and trains the ``Seq2Seq`` of ``models.py``, whose decoder
is fed the target or its own guess by the host's random numbers.  Converted
before this, ``models.py`` was left alone and the trainer compiled 4 -> 6
graphs at 4 -> 8 steps; now 2 -> 2, one execution a step, the same losses."""

import shutil

import pytest

from tests.conftest import convert_file, lint_lines, project_copy, verify_lengths

CHOICE = "token = torch.where(torch.tensor([teacher_force], device=top1.device)[0], trg[t], top1)"
LOADER = "from torch.utils.data import DataLoader\n\n\ndef loader(ds):\n    return DataLoader(ds, batch_size=4)\n"


@pytest.fixture
def program(tmp_path):
    return project_copy("seq2seq_helper", tmp_path)


def _codes(found):
    return [code for _, code, _ in found]


def test_a_model_the_ported_script_imports_draws_its_choice_on_the_device(program):
    out, found = convert_file(program / "models.py")
    assert CHOICE in out and "import torch_xla" not in out, out
    assert [(line, code) for line, code, fix in found if fix] == [(49, "XLA409")], found
    path = program / "models.py"
    path.write_text(out)
    again, found = convert_file(path)
    assert again == out and "XLA409" not in _codes(found)


def test_the_same_module_alone_or_imported_by_code_not_ported_is_left(program, tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(program / "models.py", alone / "models.py")
    out, found = convert_file(alone / "models.py")
    assert out == (program / "models.py").read_text() and not found, found
    # the importer names no CUDA
    train = program / "train.py"
    train.write_text(train.read_text().replace('"cuda" if torch.cuda.is_available() else "cpu"', '"cpu"'))
    out, found = convert_file(program / "models.py")
    assert CHOICE not in out and not found, found


def test_one_module_between_the_ported_script_and_the_model(program):
    train = program / "train.py"
    (program / "trainer.py").write_text("from models import Decoder, Encoder, Seq2Seq  # noqa: F401\n")
    train.write_text(train.read_text().replace("from models import", "from trainer import"))
    out, found = convert_file(program / "models.py")
    assert CHOICE in out, out
    # two modules between: too far to say
    (program / "trainer2.py").write_text("from trainer import Decoder, Encoder, Seq2Seq  # noqa: F401\n")
    train.write_text(train.read_text().replace("from trainer import", "from trainer2 import"))
    out, found = convert_file(program / "models.py")
    assert CHOICE not in out, out


def test_a_loader_module_the_ported_script_imports_is_told_of_its_last_batch(program):
    (program / "data.py").write_text(LOADER)
    assert "XLA413" not in _codes(convert_file(program / "data.py")[1])  # nothing imports it yet
    train = program / "train.py"
    train.write_text(train.read_text().replace("from models import", "from data import loader  # noqa: F401\n"
                                                                      "from models import"))
    assert [(line, code) for line, code, _ in convert_file(program / "data.py")[1]] == [(5, "XLA413")]


def test_a_cached_answer_is_not_reused_once_the_importer_changes(program, tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPORT_CACHE_DIR", str(tmp_path / "cache"))

    def lint():
        return lint_lines(program, "models.py")

    assert lint().count("XLA409") == 1
    assert lint().count("XLA409") == 1  # (answered from the cache)
    train = program / "train.py"
    original = train.read_text()
    train.write_text(original.replace('"cuda" if torch.cuda.is_available() else "cpu"', '"cpu"'))
    assert "XLA409" not in lint()  # models.py itself unchanged
    train.unlink()
    (program / "run.py").write_text(original)  # another importer: the directory changed
    assert lint().count("XLA409") == 1


@pytest.mark.xla
@pytest.mark.xla
def test_the_converted_trainer_compiles_flat_and_matches_the_original(program, tmp_path):
    """Before: 4 and 6 compiles at 4 and 8 steps (verify: fail)."""
    data = verify_lengths(program, program / "train.py", tmp_path / "report.json")
    assert any(o["name"].startswith("stdout line 1: loss") and o["ok"] for o in data["outputs"]), data["outputs"]
