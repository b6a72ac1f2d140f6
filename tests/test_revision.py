"""Revisions of local checkpoints: a Hugging Face cache snapshot's commit, else a digest of the headers and the
tensors a run reads, hashed while the layers are read (each byte once) and cached by path, size and mtime."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import tests.tiny_models as tm
from headforms import api, cli
from headforms.extract.checkpoint import ReadOptions
from headforms.extract.formats import hf, provenance
from headforms.extract.sources import open_checkpoint
from tests.test_gguf import write_gguf
from tests.test_robustness import interrupt_at

QK = re.compile(r"\.(q_proj|k_proj)\.weight$")
PAD = (4096, 4096)  # a float32 tensor no survey reads: 64 MB


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path):
    """The digest cache (under the range cache) in tmp_path."""
    monkeypatch.setenv("HEADFORMS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def padded(folder: Path, seed: int = 0, pad: tuple[int, int] = PAD) -> Path:
    """A tiny llama whose safetensors file also holds a large tensor that no survey reads."""
    tm.save(tm.build("llama", seed=seed), folder)
    state = load_file(folder / "model.safetensors")
    state["model.pad.weight"] = torch.ones(pad)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def qk_tensors(path: Path) -> dict[str, bytes]:
    """The Q/K tensors' bytes, by the safetensors library (independent of headforms' reader)."""
    with safe_open(str(path), framework="numpy") as f:
        return {name: f.get_tensor(name).tobytes() for name in f.keys() if QK.search(name)}


def header_bytes(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def rchar() -> int:
    return int(re.search(r"rchar:\s*(\d+)", Path("/proc/self/io").read_text()).group(1))


@pytest.fixture
def reads(monkeypatch):
    """Bytes through headforms' positioned reads, and the tensors the digest hashed, during the test."""
    seen = {"read": 0, "hashed": []}
    read_at, update = hf._read_at, provenance.Digest.update

    def counting_read(f, offset, size, path, *empty):
        seen["read"] += size
        return read_at(f, offset, size, path, *empty)

    def counting_update(self, path, name, data):
        if (path, name) not in self.tensors:
            seen["hashed"].append(name)
        return update(self, path, name, data)

    monkeypatch.setattr(hf, "_read_at", counting_read)
    monkeypatch.setattr(provenance.Digest, "update", counting_update)
    return seen


def stored(db: Path) -> tuple[str, str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT revision, revision_kind FROM models").fetchone()


def extract(*args: str):
    return CliRunner().invoke(cli.main, ["extract", *args])


def test_first_extraction_reads_each_qk_byte_once_and_records_their_digest(tmp_path, reads, cache):
    folder, db = padded(tmp_path / "tiny"), tmp_path / "w.duckdb"
    weights = folder / "model.safetensors"
    qk, header = qk_tensors(weights), header_bytes(weights)
    extract(str(padded(tmp_path / "warm", seed=1, pad=(1, 1))), "--db", str(tmp_path / "warm.duckdb"))  # imports
    reads["read"], reads["hashed"] = 0, []
    before = rchar()
    result = extract(str(folder), "--db", str(db), "--name", "m")
    read = rchar() - before
    assert result.exit_code == 0, result.output
    qk_bytes = sum(len(b) for b in qk.values())
    assert weights.stat().st_size > 64e6 > 100 * qk_bytes
    assert read < qk_bytes + header + 16e6  # the whole process's reads: Q/K, headers, DuckDB's and the views' own
    assert reads["read"] == qk_bytes + header  # every Q/K byte once (the digest did not read them again)
    assert sorted(reads["hashed"]) == sorted(qk)  # hashed as read, the pad never
    revision, kind = stored(db)
    assert kind == "digest" and revision.startswith("sha256:")
    [entry] = [entry for entry in (json.loads(f.read_text()) for f in (cache / "digests").glob("*.json"))
               if entry["path"] == str(weights.resolve())]  # the warm-up model has its own entry beside it
    assert entry["tensors"] == {name: hashlib.sha256(data).hexdigest() for name, data in qk.items()}
    fresh = open_checkpoint(str(folder))  # the same revision when hashed before any layer is read (cache gone)
    for f in (cache / "digests").glob("*.json"):
        f.unlink()
    assert open_checkpoint(str(folder)).revision == fresh.revision == revision
    os.rename(folder, tmp_path / "moved")
    assert open_checkpoint(str(tmp_path / "moved")).revision == revision  # files named by name, not path


def test_rerun_reads_and_hashes_nothing(tmp_path, reads):
    folder, db = padded(tmp_path / "tiny"), tmp_path / "w.duckdb"
    assert extract(str(folder), "--db", str(db)).exit_code == 0
    revision = stored(db)[0]
    reads["read"], reads["hashed"] = 0, []
    result = extract(str(folder), "--db", str(db))
    assert result.exit_code == 0 and "up to date" in result.output
    assert reads["hashed"] == [] and reads["read"] == header_bytes(folder / "model.safetensors")
    assert stored(db)[0] == revision


def test_touched_file_with_the_same_bytes_is_rehashed_and_up_to_date(tmp_path, reads):
    folder, db = padded(tmp_path / "tiny", pad=(1, 1)), tmp_path / "w.duckdb"
    assert extract(str(folder), "--db", str(db)).exit_code == 0
    revision = stored(db)[0]
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    reads["hashed"] = []
    result = extract(str(folder), "--db", str(db))
    assert result.exit_code == 0 and "up to date" in result.output, result.output
    assert sorted(reads["hashed"]) == sorted(qk_tensors(weights))  # hashed again, found the same
    assert stored(db)[0] == revision


def test_changed_bytes_are_another_revision_refused_without_force(tmp_path):
    folder, db = padded(tmp_path / "tiny", pad=(1, 1)), tmp_path / "w.duckdb"
    assert extract(str(folder), "--db", str(db), "--name", "m").exit_code == 0
    revision = stored(db)[0]
    weights = folder / "model.safetensors"
    state = load_file(weights)
    state["model.layers.1.self_attn.k_proj.weight"][0, 0] += 1.0  # one value, same size
    save_file(state, weights, metadata={"format": "pt"})
    result = extract(str(folder), "--db", str(db), "--name", "m")
    assert result.exit_code != 0 and result.output.startswith("Error:") and "--force" in result.output
    assert f"revision {revision} -> sha256:" in result.output
    assert stored(db)[0] == revision  # the warehouse as it was
    assert extract(str(folder), "--db", str(db), "--name", "m", "--force").exit_code == 0
    changed = stored(db)[0]
    assert changed != revision and changed == open_checkpoint(str(folder)).revision


def test_a_config_edit_is_another_revision_and_is_extracted_again(tmp_path):
    """The digest covers config.json: a rope base edited, the weights kept, is not 'up to date'."""
    folder, db = padded(tmp_path / "tiny", pad=(1, 1)), tmp_path / "w.duckdb"
    assert extract(str(folder), "--db", str(db), "--name", "m").exit_code == 0
    revision = stored(db)[0]
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = 5e4
    (folder / "config.json").write_text(json.dumps(config))
    result = extract(str(folder), "--db", str(db), "--name", "m")
    assert result.exit_code != 0 and "up to date" not in result.output and "--force" in result.output
    assert stored(db)[0] == revision
    assert extract(str(folder), "--db", str(db), "--name", "m", "--force").exit_code == 0
    with duckdb.connect(str(db), read_only=True) as con:
        new, kept = con.execute("SELECT revision, config FROM models").fetchone()
    assert new != revision and new == open_checkpoint(str(folder)).revision
    assert json.loads(kept)["rope"]["theta"] == 5e4  # the numbers of the edited config, not the old ones


def test_interrupted_first_run_resumes_under_its_pending_name(tmp_path, reads, monkeypatch):
    folder, db = padded(tmp_path / "tiny", pad=(1, 1)), tmp_path / "w.duckdb"
    interrupt_at(monkeypatch, 1, lambda: api.extract(str(folder), db=db, name="m"))
    assert stored(db)[0].startswith("pending:")
    summary = api.extract(str(folder), db=db, name="m")
    assert summary["status"][0] == "resumed"
    assert stored(db) == (open_checkpoint(str(folder)).revision, "digest")
    assert sorted(reads["hashed"]) == sorted(qk_tensors(folder / "model.safetensors"))  # each tensor hashed once


def test_gguf_digest_tells_changed_bytes_from_a_touch(tmp_path):
    path = tmp_path / "tiny.gguf"
    weights = write_gguf(path)
    first = open_checkpoint(str(path))
    assert first.revision_kind == "digest" and first.revision.startswith("sha256:")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert open_checkpoint(str(path)).revision == first.revision
    changed = dict(weights)
    changed["blk.1.attn_k.weight"] = weights["blk.1.attn_k.weight"] + np.float32(1)
    write_gguf(path, weights=changed)
    assert open_checkpoint(str(path)).revision != first.revision


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_inside_a_hugging_face_cache_snapshot_the_revision_is_its_commit(tmp_path, reads, kind):
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / commit
    if kind == "folder":
        source = padded(snapshot, pad=(1, 1))
    else:
        snapshot.mkdir(parents=True)
        write_gguf(source := snapshot / "tiny.gguf")
    ckpt = open_checkpoint(str(source))
    assert (ckpt.revision, ckpt.revision_kind, ckpt.digest) == (commit, "hf-cache", None)
    assert reads["hashed"] == []
    given = open_checkpoint(str(source), ReadOptions(revision="mine"))
    assert (given.revision, given.revision_kind) == ("mine", "given")


def test_a_local_revision_kind_is_decided_in_one_place(tmp_path):
    """local_provenance, for every local opener: the revision given ('given'), else the commit of the Hugging Face
    cache snapshot holding the path ('hf-cache'), else the opener's Digest, made only then ('digest'); the Checkpoint
    reads its name, source and revision from that one record."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "models--org--tiny" / "snapshots" / commit
    made = []

    def local(path, revision=None):
        record = provenance.local_provenance(path, name="m", source="s", revision=revision, checkpoint_bytes=7,
                                             digest=lambda: made.append(path) or "its digest")
        return record.pinned, record.revision_kind, record.digest

    assert local(snapshot / "tiny.gguf", "mine") == ("mine", "given", None)
    assert local(snapshot / "tiny.gguf") == (commit, "hf-cache", None)
    assert made == []
    assert local(tmp_path / "tiny.gguf") == (None, "digest", "its digest") and made == [tmp_path / "tiny.gguf"]
    write_gguf(tmp_path / "tiny.gguf")
    ckpt = open_checkpoint(str(tmp_path / "tiny.gguf"), ReadOptions(revision="mine"), name="named")
    assert (ckpt.name, ckpt.source, ckpt.revision) == (ckpt.provenance.name, ckpt.provenance.source, "mine")
    assert ckpt.provenance.checkpoint_bytes == (tmp_path / "tiny.gguf").stat().st_size and ckpt.name == "named"


def cache_root_under(env: dict) -> Path:
    """extract.transport.hub.cache_root() in a fresh interpreter with only `env` of the cache variables set."""
    clean = {k: v for k, v in os.environ.items() if k not in ("HEADFORMS_CACHE", "HF_HOME", "HF_HUB_CACHE")}
    out = subprocess.run([sys.executable, "-c", "from headforms.extract.transport.caches import cache_root; print(cache_root())"],
                         env=clean | env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def test_range_cache_lives_in_the_hugging_face_cache_unless_headforms_cache_says(tmp_path):
    assert cache_root_under({"HF_HOME": str(tmp_path / "home")}) == tmp_path / "home" / "hub" / "headforms"
    assert cache_root_under({"HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hub")}) \
        == tmp_path / "hub" / "headforms"
    assert cache_root_under({"HF_HOME": str(tmp_path / "home"), "HEADFORMS_CACHE": str(tmp_path / "mine")}) \
        == tmp_path / "mine"



def test_the_cache_root_is_a_headforms_folder_in_the_hub_cache(tmp_path, monkeypatch):
    """In this process (as a run calls it): the hub cache huggingface_hub resolved, its `headforms` folder."""
    import huggingface_hub.constants

    from headforms.extract.transport.caches import cache_root

    monkeypatch.delenv("HEADFORMS_CACHE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert cache_root() == tmp_path / "hub" / "headforms"
    monkeypatch.setenv("HEADFORMS_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_a_run_cut_after_its_last_layer_gets_its_digest_from_the_next(tmp_path, reads, monkeypatch):
    """Cut short after its last layer was committed, before its pending name became the digest: the same command
    finds every tensor's digest in the cache, names the stored row by it, and has nothing left to read or hash."""
    from headforms.warehouse.storing import revision as revision_module

    folder, db = padded(tmp_path / "tiny", pad=(1, 1)), tmp_path / "w.duckdb"
    # A file that exists: the model is planned before any layer is read (a new file's layers start at once, and may
    # all be hashed by the time the model is planned, which then stores the digest itself).
    api.connect(db, read_only=False).close()
    record = revision_module.record

    def cut(writer, ckpt):
        raise KeyboardInterrupt

    monkeypatch.setattr(revision_module, "record", cut)
    with pytest.raises(KeyboardInterrupt):
        api.extract(str(folder), db=db, name="m")
    assert stored(db)[0].startswith("pending:")
    monkeypatch.setattr(revision_module, "record", record)
    reads["hashed"].clear()
    summary = api.extract(str(folder), db=db, name="m")
    assert summary["status"][0] == "up to date" and reads["hashed"] == []
    assert stored(db) == (open_checkpoint(str(folder)).revision, "digest")


def test_each_local_checkpoint_of_a_run_is_hashed_as_it_is_read(tmp_path):
    """Before planning, every checkpoint's digest the warehouse does not hold is deferred (hashed while its layers
    are read), also after a checkpoint without a digest (a hub model, a given revision) earlier in the run."""
    from types import SimpleNamespace

    from headforms.warehouse.storing import revision as revision_module
    from headforms.warehouse.storing.store import create_schema

    ckpt = open_checkpoint(str(padded(tmp_path / "tiny", pad=(1, 1))))
    with duckdb.connect() as con:
        create_schema(con)
        revision_module.prepare(con, [SimpleNamespace(digest=None), ckpt])
    assert ckpt.digest.deferred
