"""Default model names from what the user gave, and hub ids offline from the Hugging Face cache.

A fake Hugging Face cache is laid out as huggingface_hub writes one: models--org--name/{blobs/SHA256,
snapshots/COMMIT/FILE -> ../../blobs/SHA256, refs/main}."""
import hashlib
import importlib
import os
import re
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors import safe_open

import tests.tiny_models as tm
from headforms import api, cli
from headforms.extract import ExtractError, ReadOptions, open_checkpoint
from tests.test_gguf import write_gguf

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def tiny_folder(folder: Path) -> Path:
    """A tiny llama saved with transformers (config.json + model.safetensors)."""
    return tm.save(tm.build("llama"), folder)


def hf_cache(hub: Path, repo_id: str, files: Path | list[Path], commit: str = COMMIT, ref: str = "main") -> Path:
    """Lay `files` (a folder's files, or a list of files) out as huggingface_hub's cache holds repo_id at commit;
    returns the snapshot folder."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(files.iterdir()) if isinstance(files, Path) else files:
        blob = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, repo / "blobs" / blob)
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE with the Hugging Face cache and the headforms cache in tmp_path (both empty)."""
    constants = importlib.import_module("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HEADFORMS_CACHE", str(tmp_path / "ranges"))
    return tmp_path / "hub"


def qk(folder: Path) -> dict[str, np.ndarray]:
    """Layer 0's q_proj and k_proj weights, read by the safetensors library (not by headforms)."""
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        return {k: f.get_tensor(f"model.layers.0.self_attn.{k}_proj.weight") for k in "qk"}


# Names ------------------------------------------------------------------------------------------

def test_a_symlinked_folder_is_named_as_the_link_not_its_target(tmp_path):
    """A folder `model` reached through a link `all-MiniLM-L6-v2` was model 'model'; a GGUF link was named as the
    link already: both now keep the name the user gave."""
    tiny_folder(tmp_path / "store" / "model")
    (tmp_path / "all-MiniLM-L6-v2").symlink_to(tmp_path / "store" / "model")
    assert open_checkpoint(str(tmp_path / "all-MiniLM-L6-v2")).name == "all-MiniLM-L6-v2"
    assert open_checkpoint(str(tmp_path / "all-MiniLM-L6-v2") + "/").name == "all-MiniLM-L6-v2"
    assert open_checkpoint(str(tmp_path / "store" / "model")).name == "model"
    write_gguf(tmp_path / "store" / "weights-q8_0.gguf")
    (tmp_path / "tiny-llama.gguf").symlink_to(tmp_path / "store" / "weights-q8_0.gguf")
    assert open_checkpoint(str(tmp_path / "tiny-llama.gguf")).name == "tiny-llama"
    assert open_checkpoint(str(tmp_path / "store" / "weights-q8_0.gguf")).name == "weights-q8_0"


def test_a_folder_given_as_dot_is_named_as_the_folder(tmp_path, monkeypatch):
    tiny_folder(tmp_path / "tiny-llama")
    monkeypatch.chdir(tmp_path / "tiny-llama")
    assert open_checkpoint(".").name == "tiny-llama"
    (tmp_path / "tiny-llama" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "tiny-llama" / "sub")
    assert open_checkpoint("..").name == "tiny-llama"


def test_a_hugging_face_cache_snapshot_is_named_as_its_hub_id_is(tmp_path):
    """A snapshot path was named after its 40-character commit; it is `name` of models--org--name, as the hub id
    org/name is named (a link to a snapshot keeps the link's name)."""
    snapshot = hf_cache(tmp_path / "hub", "sentence-transformers/all-MiniLM-L6-v2", tiny_folder(tmp_path / "tiny"))
    ckpt = open_checkpoint(str(snapshot))
    assert (ckpt.name, ckpt.revision, ckpt.revision_kind) == ("all-MiniLM-L6-v2", COMMIT, "hf-cache")
    bare = hf_cache(tmp_path / "hub", "gpt2", tmp_path / "tiny")
    assert open_checkpoint(str(bare) + "/").name == "gpt2"
    (tmp_path / "mine").symlink_to(snapshot)
    assert open_checkpoint(str(tmp_path / "mine")).name == "mine"


def test_the_command_line_stores_the_names(tmp_path):
    tiny_folder(tmp_path / "store" / "model")
    (tmp_path / "all-MiniLM-L6-v2").symlink_to(tmp_path / "store" / "model")
    snapshot = hf_cache(tmp_path / "hub", "org/tiny-llama", tmp_path / "store" / "model")
    db = tmp_path / "w.duckdb"
    for source in (tmp_path / "all-MiniLM-L6-v2", snapshot):
        result = CliRunner().invoke(cli.main, ["extract", str(source), "--db", str(db), "--resamples", "5"])
        assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT model FROM models ORDER BY model").fetchall() == [("all-MiniLM-L6-v2",),
                                                                                ("tiny-llama",)]


# Offline hub ids --------------------------------------------------------------------------------

def test_offline_a_hub_id_is_read_from_the_hugging_face_cache(offline, tmp_path):
    """HF_HUB_OFFLINE=1 with the snapshot in HF_HUB_CACHE said the model 'is not in the headforms cache'; it is
    read from the snapshot (huggingface_hub's own lookup), named and pinned as the hub would have it."""
    folder = tiny_folder(tmp_path / "tiny")
    hf_cache(offline, "sentence-transformers/all-MiniLM-L6-v2", folder)
    ckpt = open_checkpoint("sentence-transformers/all-MiniLM-L6-v2")
    assert (ckpt.name, ckpt.source, ckpt.revision) == ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2",
                                                       COMMIT)
    w_q, w_k = ckpt.read_layer(0)
    expected = qk(folder)
    np.testing.assert_array_equal(w_q.reshape(-1, w_q.shape[-1]), expected["q"])
    np.testing.assert_array_equal(w_k.reshape(-1, w_k.shape[-1]), expected["k"])
    assert not (tmp_path / "ranges").exists()  # nothing went through the range cache


def test_offline_a_revision_is_looked_up_in_the_hugging_face_cache(offline, tmp_path):
    other = "fedcba9876543210fedcba9876543210fedcba98"
    hf_cache(offline, "org/tiny", tiny_folder(tmp_path / "a"))
    hf_cache(offline, "org/tiny-b", tiny_folder(tmp_path / "b"), commit=other, ref="v2")
    assert open_checkpoint("org/tiny-b", ReadOptions(revision="v2")).revision == other
    assert open_checkpoint("org/tiny", ReadOptions(revision=COMMIT)).revision == COMMIT
    with pytest.raises(ExtractError, match=r"^'org/tiny' at v9 is in neither the Hugging Face cache \(.+\) nor the "
                                           r"headforms cache \(.+\) and HF_HUB_OFFLINE is set$"):
        open_checkpoint("org/tiny", ReadOptions(revision="v9"))


def test_offline_extract_from_the_hugging_face_cache_equals_the_folder(offline, tmp_path):
    folder = tiny_folder(tmp_path / "tiny-llama")
    hf_cache(offline, "org/tiny-llama", folder)
    db_hub, db_folder = tmp_path / "hub.duckdb", tmp_path / "folder.duckdb"
    result = CliRunner().invoke(cli.main, ["extract", "org/tiny-llama", "--db", str(db_hub), "--resamples", "5"])
    assert result.exit_code == 0, result.output
    api.extract(str(folder), db=db_folder, resamples=5)
    with duckdb.connect(str(db_hub), read_only=True) as con:
        assert con.sql("SELECT model, source, revision FROM models").fetchall() == [
            ("tiny-llama", "org/tiny-llama", COMMIT)]
        hub_heads = con.sql("SELECT * EXCLUDE (model) FROM heads ORDER BY layer, head").fetchall()
    with duckdb.connect(str(db_folder), read_only=True) as con:
        assert hub_heads == con.sql("SELECT * EXCLUDE (model) FROM heads ORDER BY layer, head").fetchall()


def test_offline_a_snapshot_without_weights_falls_back_to_the_range_cache(offline, tmp_path):
    """A snapshot of config.json alone (left by AutoConfig) is no model: the range cache is looked in next, and
    the error names both caches."""
    folder = tiny_folder(tmp_path / "tiny")
    hf_cache(offline, "org/tiny", [folder / "config.json"])
    with pytest.raises(ExtractError, match=r"^'org/tiny' is in neither the Hugging Face cache \("
                                           + re.escape(str(offline)) + r"\) nor the headforms cache \("
                                           + re.escape(str(tmp_path / "ranges")) + r"\) and HF_HUB_OFFLINE is set$"):
        open_checkpoint("org/tiny")


def test_offline_a_hub_gguf_file_is_read_from_the_hugging_face_cache(offline, tmp_path):
    weights = write_gguf(tmp_path / "tiny-q8_0.gguf")
    hf_cache(offline, "org/tiny-GGUF", [tmp_path / "tiny-q8_0.gguf"])
    ckpt = open_checkpoint("org/tiny-GGUF/tiny-q8_0.gguf")
    assert (ckpt.name, ckpt.source, ckpt.revision) == ("tiny-q8_0", "org/tiny-GGUF/tiny-q8_0.gguf", COMMIT)
    w_q, _ = ckpt.read_layer(1)
    np.testing.assert_array_equal(w_q.reshape(-1, w_q.shape[-1]), weights["blk.1.attn_q.weight"])
    with pytest.raises(ExtractError, match=r"^'org/tiny-GGUF' is in neither the Hugging Face cache"):
        open_checkpoint("org/tiny-GGUF/other.gguf")


def test_online_the_hugging_face_cache_is_not_taken_for_the_hub(tmp_path, monkeypatch):
    """Online, a hub id is resolved on the hub (its newest commit), not from a possibly older snapshot."""
    from headforms.extract import sources

    constants = importlib.import_module("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    hf_cache(tmp_path / "hub", "org/tiny", tiny_folder(tmp_path / "tiny"))
    asked = []
    monkeypatch.setattr("headforms.extract.formats.remote.open_hub", lambda source, **kw: asked.append(source) or "hub")
    assert sources.open_checkpoint("org/tiny") == "hub" and asked == ["org/tiny"]
