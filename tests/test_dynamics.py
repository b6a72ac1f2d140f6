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
