"""Training dynamics: set files, --revisions and the pythia-dynamics set, extracted through a local hub
that serves several revisions of a tiny GPT-NeoX; models.base_model, training_step, dynamics_by_step."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import ThreadingHTTPServer

import duckdb
import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from headforms import api, cli
from headforms.extract.checkpoint import ExtractError
from headforms.extract.sources import PYTHIA_STEPS, REVISION_SETS, Target, plan_targets, read_set_file, training_step
from tests import tiny_models
from tests.dense import dense_reference
from tests.test_sources import FakeHub, go_online, hub_cache  # noqa: F401  (hub_cache is a fixture)

REPO = "org/tiny-neox"
STEPS = {"step0": 0, "step1000": 1000, "step143000": 143000}


def commit(repo_id: str, revision: str) -> str:
    """The commit a revision of a repo resolves to on the local hub."""
    return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


class RevisionHub(FakeHub):
    """FakeHub with revisions: repos[repo][revision] = files; a revision or its commit selects the files.
    Honours byte ranges (`Range: bytes=a-b`)."""

    def do_GET(self):
        self.log.append((self.command, self.path))
        path = self.path.split("?")[0].removeprefix("/api/models/").lstrip("/")
        for marker in ("/revision/", "/tree/", "/resolve/"):
            repo_id, found, rest = path.partition(marker)
            if found and repo_id in self.repos:
                break
        else:
            return self.reply(b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound"}, 404)
        wanted = rest.split("/", 1)[0]
        for revision, files in self.repos[repo_id].items():
            sha = commit(repo_id, revision)
            if wanted in (revision, sha):
                break
        else:
            return self.reply(b'{"error": "no revision"}', {"X-Error-Code": "RevisionNotFound"}, 404)
        if marker == "/revision/":
            info = {"id": repo_id, "sha": sha, "siblings": [{"rfilename": f} for f in files]}
            return self.reply(json.dumps(info).encode(), {"Content-Type": "application/json"})
        if marker == "/tree/":
            tree = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for f, b in files.items()]
            return self.reply(json.dumps(tree).encode(), {"Content-Type": "application/json"})
        body = files[rest.split("/", 1)[1]]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}
        ranged = self.headers.get("Range", "").removeprefix("bytes=").split("-")
        if len(ranged) == 2 and ranged[0]:
            start, stop = int(ranged[0]), int(ranged[1]) + 1 if ranged[1] else len(body)
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(body)}"
            return self.reply(body[start:stop], headers, 206)
        return self.reply(body, headers)

    do_HEAD = do_GET


def neox_files(tmp_path, seed: int) -> dict[str, bytes]:
    """config.json + model.safetensors of the tiny GPT-NeoX with weights drawn from `seed`."""
    folder = tiny_models.save(tiny_models.build("gpt_neox", seed=seed), tmp_path / f"neox-{seed}")
    return {f.name: f.read_bytes() for f in folder.iterdir()}


@pytest.fixture
def revision_hub(hub_cache, monkeypatch, tmp_path):  # noqa: F811
    """A local hub serving REPO at the revisions of STEPS, each a different tiny GPT-NeoX (seed = position)."""
    repos = {REPO: {revision: neox_files(tmp_path, seed) for seed, revision in enumerate(STEPS)}}
    monkeypatch.setattr(RevisionHub, "repos", repos)
    monkeypatch.setattr(RevisionHub, "log", [])
    server = ThreadingHTTPServer(("127.0.0.1", 0), RevisionHub)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    go_online(monkeypatch, f"http://127.0.0.1:{server.server_port}")
    yield RevisionHub
    server.shutdown()
    server.server_close()


def test_revisions_extract_one_model_per_checkpoint(revision_hub, tmp_path):
    db = tmp_path / "w.duckdb"
    summary = api.extract(REPO, db=db, revisions=",".join(STEPS))
    assert summary["model"].to_list() == [f"tiny-neox@{r}" for r in STEPS]
    with duckdb.connect(str(db), read_only=True) as con:
        models = con.sql("select model, base_model, training_step, revision, source from models order by training_step").pl()
    assert models.rows() == [(f"tiny-neox@{r}", "tiny-neox", step, commit(REPO, r), REPO) for r, step in STEPS.items()]


def dense_heads(seed: int) -> pl.DataFrame:
    """Symmetric energy, pairing and parity of every head of the tiny GPT-NeoX drawn from `seed`, straight from
    its fused query_key_value weight ((heads, 3, n, N): Q, K, V per head) and dense N x N forms."""
    model = tiny_models.build("gpt_neox", seed=seed)
    config = model.config
    heads, n = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    rows = []
    for layer, block in enumerate(model.gpt_neox.layers):
        fused = block.attention.query_key_value.weight.detach().double().numpy().reshape(heads, 3, n, -1)
        for head in range(heads):
            ref = dense_reference(fused[head, 1].T @ fused[head, 0], n)
            kind = "II" if ref["c_sym"] + ref["d_sym"] <= 1 / 50 else "I+" if ref["c_sym"] > ref["d_sym"] else "I-"
            rows.append({"layer": layer, "head": head, "symmetric_energy": ref["symmetric_energy"],
                         "pairing": ref["pairing"], "parity": kind})
    return pl.DataFrame(rows)


@pytest.fixture
def dynamics_db(revision_hub, tmp_path):
    """A warehouse holding REPO's three revisions as training checkpoints."""
    db = tmp_path / "dynamics.duckdb"
    api.extract(REPO, db=db, revisions=list(STEPS))
    return db


def test_each_checkpoint_holds_its_own_weights(dynamics_db):
    with duckdb.connect(str(dynamics_db), read_only=True) as con:
        stored = con.sql("select model, layer, head, symmetric_energy, pairing, parity from heads").pl()
    for seed, revision in enumerate(STEPS):
        actual = stored.filter(pl.col("model") == f"tiny-neox@{revision}").drop("model").sort("layer", "head")
        expected = dense_heads(seed)
        assert actual["parity"].to_list() == expected["parity"].to_list()
        np.testing.assert_allclose(actual.select("symmetric_energy", "pairing").to_numpy(),
                                   expected.select("symmetric_energy", "pairing").to_numpy(), rtol=1e-9)


def test_rerun_is_up_to_date_and_names_base_model(revision_hub, dynamics_db):
    again = api.extract(REPO, db=dynamics_db, revisions=list(STEPS))
    assert set(again["status"]) == {"up to date"}
    named = api.extract(REPO, db=dynamics_db, revisions=["step1000"], name="neox")
    assert named["model"].to_list() == ["neox@step1000"]
    with duckdb.connect(str(dynamics_db), read_only=True) as con:
        row = con.execute("select base_model, training_step from models where model = 'neox@step1000'").fetchone()
    assert row == ("neox", 1000)


def test_dynamics_by_step_view(dynamics_db, tmp_path):
    """The view against polars over heads and models; a model without training_step stays out of it."""
    with duckdb.connect(str(dynamics_db)) as con:
        con.execute("""INSERT INTO models SELECT * REPLACE ('plain' AS model, NULL AS base_model,
                       NULL AS training_step) FROM models WHERE model = 'tiny-neox@step0'""")
        con.execute("INSERT INTO heads SELECT * REPLACE ('plain' AS model) FROM heads WHERE model = 'tiny-neox@step0'")
    with duckdb.connect(str(dynamics_db), read_only=True) as con:
        actual = con.sql("select * from dynamics_by_step").pl()
        heads, models = con.sql("select * from heads").pl(), con.sql("select * from models").pl()

    def pct(kind: str) -> pl.Expr:
        return (100 * (pl.col("parity") == kind).sum() / pl.len()).round(1, mode="half_away_from_zero")

    expected = (heads.join(models.filter(pl.col("training_step").is_not_null()), on="model")
                .group_by("base_model", "training_step", "model", "revision")
                .agg(heads=pl.len(), pct_type_I_plus=pct("I+"), pct_type_II=pct("II"), pct_type_I_minus=pct("I-"),
                     median_pairing=pl.col("pairing").median(), median_random_pairing=pl.col("random_pairing").median(),
                     median_symmetric_energy=pl.col("symmetric_energy").median(),
                     median_random_symmetric_energy=pl.col("random_symmetric_energy").median(),
                     share_above_random=(pl.col("symmetric_energy") > pl.col("random_symmetric_energy")).mean())
                .sort("base_model", "training_step"))
    assert actual["training_step"].to_list() == list(STEPS.values())
    assert actual.columns == expected.columns
    from polars.testing import assert_frame_equal
    assert_frame_equal(actual, expected, check_dtypes=False, abs_tol=1e-12, rel_tol=0)


def test_training_dynamics_figure(dynamics_db, tmp_path):
    from matplotlib import image

    from headforms.warehouse.figures import training_dynamics

    with duckdb.connect(str(dynamics_db), read_only=True) as con:
        path = training_dynamics(con, tmp_path / "training_dynamics.png")
    picture = image.imread(path)
    assert picture.shape[0] > 300 and picture.shape[1] > 1000 and picture[..., :3].std() > 0.05
