"""Default model names: from what the user gave, the same rule for folders and GGUF files."""
import os

from headforms.extract import open_checkpoint
from headforms.extract.sources import folder_name
from tests import tiny_models
from tests.test_gguf import write_gguf


def test_a_symlinked_folder_and_file_keep_the_link_s_name(tmp_path):
    model = tiny_models.save(tiny_models.build("llama"), tmp_path / "model")
    os.symlink(model, tmp_path / "all-MiniLM-L6-v2")
    assert open_checkpoint(str(tmp_path / "all-MiniLM-L6-v2")).name == "all-MiniLM-L6-v2"
    write_gguf(tmp_path / "blob.gguf")
    os.symlink(tmp_path / "blob.gguf", tmp_path / "SmolLM2.gguf")
    assert open_checkpoint(str(tmp_path / "SmolLM2.gguf")).name == "SmolLM2"


def test_a_relative_folder_is_named_by_its_own_name(tmp_path, monkeypatch):
    tiny_models.save(tiny_models.build("llama"), tmp_path / "tiny-llama")
    monkeypatch.chdir(tmp_path / "tiny-llama")
    assert open_checkpoint(".").name == "tiny-llama"
    assert folder_name(tmp_path / "tiny-llama" / "sub" / "..") == "tiny-llama"


def test_a_hugging_face_cache_snapshot_is_named_by_its_repo(tmp_path):
    snapshot = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / ("c" * 40)
    tiny_models.save(tiny_models.build("llama"), snapshot)
    ckpt = open_checkpoint(str(snapshot))
    assert ckpt.name == "all-MiniLM-L6-v2" and ckpt.revision == "c" * 40
