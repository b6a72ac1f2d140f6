"""Revisions of one hub repo through the range cache: each revision gets its own weights, online after
another revision filled the cache, and offline (HF_HUB_OFFLINE or the hub gone) from the cache alone.

Two revisions serve the same file paths with different weights (a tiny GPT-NeoX drawn from two seeds);
what is stored is proven against the dense forms of the weights each revision served."""
from __future__ import annotations

import importlib

import duckdb
import numpy as np
import polars as pl
import pytest

from headforms import api
from tests.hub_server import serve_hub
from tests.test_dynamics import REPO, commit, dense_heads, neox_files, serve_revisions

SEEDS = {"step0": 0, "step1000": 1}  # revision -> the seed of its weights; main is served as step0


@pytest.fixture
def served(monkeypatch, tmp_path):
    """The local hub (online) serving REPO at SEEDS' revisions; the headforms cache and HF_HOME in tmp_path."""
    server = serve_hub(monkeypatch, tmp_path)
    serve_revisions(server, REPO, {revision: neox_files(tmp_path, seed) for revision, seed in SEEDS.items()})
    yield server
    server.close()


def stored(db, model: str) -> pl.DataFrame:
    """A model's recorded commit and its heads' statistics, in (layer, head) order."""
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(f"select h.layer, h.head, h.symmetric_energy, h.pairing, h.parity, m.revision "
                       f"from heads h join models m using (model) where model = '{model}' order by layer, head").pl()


def assert_weights_of(heads: pl.DataFrame, revision: str) -> None:
    """The stored heads are those of the weights served for `revision` (dense forms), not another seed's."""
    assert heads["revision"].unique().to_list() == [commit(REPO, revision)]
    expected = dense_heads(SEEDS[revision])
    assert heads["parity"].to_list() == expected["parity"].to_list()
    got, want = (f.select("symmetric_energy", "pairing").to_numpy() for f in (heads, expected))
    np.testing.assert_allclose(got, want, rtol=1e-9)
    other = dense_heads(1 - SEEDS[revision]).select("symmetric_energy", "pairing").to_numpy()
    assert np.abs(got - other).max() > 1e-3  # the two revisions' weights are told apart


def test_second_revision_reads_its_own_bytes_not_the_cached_revision(served, tmp_path):
    """Revision step0 fills the range cache; step1000, same paths and byte ranges, fetches and stores its own."""
    db = tmp_path / "w.duckdb"
    first = api.extract(REPO, db=db, revision="step0", name="a")
    fetched = dict(served.served)
    second = api.extract(REPO, db=db, revision="step1000", name="b")
    assert_weights_of(stored(db, "a"), "step0")
    assert_weights_of(stored(db, "b"), "step1000")
    # the second run fetched its own file's ranges over the network, as many bytes as the first
    assert second["bytes_fetched"][0] == first["bytes_fetched"][0] > 0
    assert served.served["model.safetensors"] == 2 * fetched["model.safetensors"] > 0


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "hub unreachable"])
def test_offline_each_revision_resolves_to_its_own_commit(served, tmp_path, monkeypatch, offline):
    """Both revisions cached online; then, without the hub, each asked for by name gets its own commit and weights."""
    api.extract(REPO, db=tmp_path / "online.duckdb", revisions=list(SEEDS))
    if offline == "HF_HUB_OFFLINE":
        monkeypatch.setattr(importlib.import_module("huggingface_hub.constants"), "HF_HUB_OFFLINE", True)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:  # a port nothing listens on (closing the server would leave its kept-alive connections answering)
        constants = importlib.import_module("huggingface_hub.constants")
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    requests = len(served.requests)
    db = tmp_path / "offline.duckdb"
    for revision in ("step1000", "step0"):
        summary = api.extract(REPO, db=db, revision=revision, name=revision)
        assert summary["bytes_fetched"][0] == 0
        assert_weights_of(stored(db, revision), revision)
    # a revision given as its commit (40 hex digits) is its own name: found without any recorded name
    summary = api.extract(REPO, db=db, revision=commit(REPO, "step1000"), name="by-commit")
    assert summary["bytes_fetched"][0] == 0
    assert_weights_of(stored(db, "by-commit"), "step1000")
    assert len(served.requests) == requests  # nothing reached the hub
