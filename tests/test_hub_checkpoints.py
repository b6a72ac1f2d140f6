"""Hub checkpoints whose files are wrong or unusual (`extract/formats/remote.py`): each refusal is one line that names
the repo, the file and what is wrong; unusual but valid layouts (tensors that view a shared storage at an offset, an
empty tensor, a fused GGUF attn_qkv, a named revision) read as the same files do from a folder."""
from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import tests.tiny_models as tm
from headforms.extract.checkpoint import ExtractError, ReadOptions
from headforms.extract.formats import remote as remote_module
from headforms.extract.sources import open_checkpoint
from headforms.extract.transport.hub import HubRepo
from tests.hub_server import serve_hub
from tests.test_hub import legacy_pickle, serve
from tests.test_gguf import write_gguf


@pytest.fixture
def hub(monkeypatch, tmp_path):
    server = serve_hub(monkeypatch, tmp_path, hf_home=False)
    yield server
    server.close()


@pytest.fixture(scope="module")
def llama_bin(tmp_path_factory) -> Path:
    """A tiny llama's config and zip `pytorch_model.bin`."""
    model = tm.build("llama", dtype=torch.float32)
    return tm.save(model, tmp_path_factory.mktemp("bin") / "bin", "bin")


def same_layers(hub_source: str, folder: Path, layers: int = 2, options: ReadOptions = ReadOptions()) -> None:
    ours, theirs = open_checkpoint(hub_source, options=options), open_checkpoint(str(folder), options=options)
    for layer in range(layers):
        for a, b in zip(ours.read_layer(layer), theirs.read_layer(layer)):
            np.testing.assert_array_equal(a, b)


def rezip(raw: bytes, change) -> bytes:
    """A torch zip rewritten record by record: change(info, data) -> (data, compress_type) or None to drop it."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            changed = change(info, source.read(info))
            if changed is not None:
                data, compression = changed
                target.writestr(zipfile.ZipInfo(info.filename, info.date_time), data, compress_type=compression)
    return out.getvalue()


# What a repo holds ---------------------------------------------------------------------------------------------

def test_a_repo_without_config_or_weights_says_which_is_missing(hub, llama_bin):
    config = (llama_bin / "config.json").read_bytes()
    hub.repos["org/noconfig"] = {"pytorch_model.bin": (llama_bin / "pytorch_model.bin").read_bytes()}
    hub.repos["org/noweights"] = {"config.json": config, "README.md": b"hi"}
    hub.repos["org/badconfig"] = {"config.json": b"{not json", "pytorch_model.bin": b""}
    with pytest.raises(ExtractError, match=r"^'org/noconfig' on the Hugging Face hub has no config\.json$"):
        open_checkpoint("org/noconfig")
    with pytest.raises(ExtractError, match=r"^'org/noweights' on the Hugging Face hub has no model\.safetensors or "
                                           r"pytorch_model\.bin weights \(sharded or not\)$"):
        open_checkpoint("org/noweights")
    with pytest.raises(ExtractError, match=r"^cannot parse org/badconfig/config\.json: "):
        open_checkpoint("org/badconfig")


def test_the_read_options_reach_the_configs_check(hub, tmp_path):
    """A QK-norm model (OLMo-2) from the hub is refused by default before any weight header is read, and read with
    its gains folded when the options say so."""
    model = tm.build("olmo2", dtype=torch.float32)
    folder = tm.save(model, tmp_path / "olmo2", "safetensors")
    serve(hub, "org/olmo2", folder)
    with pytest.raises(ExtractError, match=r"QK-norm"):
        open_checkpoint("org/olmo2")
    assert "model.safetensors" not in hub.served
    same_layers("org/olmo2", folder, options=ReadOptions(qk_norm="fold"))


@pytest.mark.parametrize("index, error", [(b"{not json", "JSONDecodeError"), (b'{"metadata": {}}', "KeyError"),
                                          (b'{"weight_map": [1]}', "AttributeError")])
def test_an_unreadable_shard_index_is_named_with_its_error(hub, tmp_path, index, error):
    serve(hub, "org/idx", tm.save(tm.build("llama", dtype=torch.float32), tmp_path / "sharded", "sharded"))
    hub.repos["org/idx"]["model.safetensors.index.json"] = index
    with pytest.raises(ExtractError, match=rf"^unreadable model\.safetensors\.index\.json of 'org/idx': {error}: "):
        open_checkpoint("org/idx")


def test_a_tensor_missing_from_one_safetensors_file_names_the_repo(hub, tmp_path):
    model = tm.build("llama", dtype=torch.float32)
    folder = tm.save(model, tmp_path / "one", "safetensors")
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "model.layers.1.self_attn.k_proj.weight"}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    serve(hub, "org/gap", folder)
    with pytest.raises(ExtractError, match=r"'model\.layers\.1\.self_attn\.k_proj\.weight'.* org/gap$"):
        open_checkpoint("org/gap").read_layer(1)


def test_safetensors_tensors_come_as_the_safetensors_library_reads_them(hub, tmp_path):
    """Each tensor's header, then its bytes by range: float64 arrays of its shape equal to safetensors' own."""
    tensors = {"bf16": torch.randn(3, 5, dtype=torch.bfloat16), "f32": torch.randn(2, 3, 4),
               "f16": torch.randn(7, dtype=torch.float16), "f64": torch.randn(1, 6, dtype=torch.float64)}
    save_file(tensors, tmp_path / "model.safetensors")
    serve(hub, "org/st", tmp_path)
    remote = HubRepo.resolve("org/st", None).file("model.safetensors")
    meta, spans = remote_module._safetensors_header(remote)
    got = remote_module._safetensors_fetch(remote, list(tensors), spans)
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        for name in tensors:
            expected = f.get_tensor(name).to(torch.float64).numpy()
            assert got[name].dtype == np.float64 and got[name].shape == expected.shape == tuple(meta[name][0])
            np.testing.assert_array_equal(got[name], expected)


def test_safetensors_from_the_hub_need_a_little_endian_machine(hub, monkeypatch):
    monkeypatch.setattr(remote_module.sys, "byteorder", "big")
    with pytest.raises(ExtractError, match=r"^reading safetensors from the hub needs a little-endian machine$"):
        remote_module._safetensors_fetch(None, [], {})


# torch zip checkpoints -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case, message", [
    ("no data.pkl", r"cannot read org/bad/pytorch_model\.bin: not a torch checkpoint \(no single <name>/data\.pkl\)$"),
    ("a list", r"org/bad/pytorch_model\.bin does not hold a state dict$"),
    ("cut pickle", r"cannot read org/bad/pytorch_model\.bin \(refused or corrupt torch checkpoint\): "
                   r"(EOFError|UnpicklingError): "),
    ("deflated", r"cannot read org/bad/pytorch_model\.bin: tensor 'model\.[\w.]+' has no stored record for its "
                 r"storage$"),
])
def test_a_torch_zip_that_is_not_a_checkpoint_is_refused_in_one_line(hub, llama_bin, case, message):
    raw = (llama_bin / "pytorch_model.bin").read_bytes()

    def change(info, data):
        if not info.filename.endswith("data.pkl"):
            return data, zipfile.ZIP_DEFLATED if case == "deflated" and "/data/" in info.filename else zipfile.ZIP_STORED
        if case == "no data.pkl":
            return None
        return {"a list": pickle.dumps([1, 2]), "cut pickle": data[:len(data) // 2]}.get(case, data), zipfile.ZIP_STORED

    hub.repos["org/bad"] = {"config.json": (llama_bin / "config.json").read_bytes(),
                            "pytorch_model.bin": rezip(raw, change)}
    with pytest.raises(ExtractError, match=f"^{message}"):
        open_checkpoint("org/bad").read_layer(0)


def test_a_torch_zip_with_bad_local_headers_or_short_records_is_refused(hub, llama_bin):
    """Every storage record's local header overwritten, or every record cut to half its bytes: reading layer 0 names
    the record or the tensor."""
    raw = (llama_bin / "pytorch_model.bin").read_bytes()
    config = (llama_bin / "config.json").read_bytes()
    broken = bytearray(raw)
    for info in zipfile.ZipFile(io.BytesIO(raw)).infolist():
        if "/data/" in info.filename:
            broken[info.header_offset:info.header_offset + 4] = b"XXXX"
    short = rezip(raw, lambda info, data: (data[:len(data) // 2] if "/data/" in info.filename else data,
                                           zipfile.ZIP_STORED))
    hub.repos["org/header"] = {"config.json": config, "pytorch_model.bin": bytes(broken)}
    hub.repos["org/short"] = {"config.json": config, "pytorch_model.bin": short}
    with pytest.raises(ExtractError, match=r"^cannot read org/header/pytorch_model\.bin: bad local header of record "
                                           r"[\w]+/data/\d+$"):
        open_checkpoint("org/header").read_layer(0)
    with pytest.raises(ExtractError, match=r"^cannot read org/short/pytorch_model\.bin: tensor "
                                           r"'model\.layers\.0\.self_attn\.[qk]_proj\.weight' runs past its storage "
                                           r"record$"):
        open_checkpoint("org/short").read_layer(0)


def test_q_and_k_that_view_one_storage_at_offsets_read_as_from_the_folder(hub, tmp_path):
    """Each layer's q_proj and k_proj saved as views of one storage (k at an offset, q transposed twice over): the
    hub reads exactly their elements, as torch.load does."""
    model = tm.build("llama", dtype=torch.float32)
    folder = tmp_path / "views"
    model.config.save_pretrained(folder)
    state = model.state_dict()
    for layer in range(model.config.num_hidden_layers):
        q, k = (state[f"model.layers.{layer}.self_attn.{p}_proj.weight"] for p in "qk")
        shared = torch.cat([q.flatten(), k.flatten()])
        state[f"model.layers.{layer}.self_attn.q_proj.weight"] = shared[:q.numel()].view(q.shape)
        state[f"model.layers.{layer}.self_attn.k_proj.weight"] = shared[q.numel():].view(k.shape)
    assert state["model.layers.0.self_attn.k_proj.weight"].storage_offset() > 0
    torch.save(state, folder / "pytorch_model.bin")
    serve(hub, "org/views", folder)
    same_layers("org/views", folder)


def test_an_empty_tensor_of_a_torch_zip_is_an_empty_array(hub, tmp_path):
    torch.save({"empty": torch.empty(0, 4, dtype=torch.bfloat16), "x": torch.arange(6.).reshape(2, 3)},
               tmp_path / "pytorch_model.bin")
    serve(hub, "org/empty", tmp_path)
    remote = HubRepo.resolve("org/empty", None).file("pytorch_model.bin")
    meta, spans = remote_module._zip_header(remote)
    got = remote_module._zip_fetch(remote, ["empty", "x"], spans)
    assert meta["empty"] == ((0, 4), "bfloat16") and got["empty"].shape == (0, 4) and got["empty"].dtype == np.float64
    np.testing.assert_array_equal(got["x"], np.arange(6.).reshape(2, 3))


# GGUF ----------------------------------------------------------------------------------------------------------

def test_an_empty_gguf_file_on_the_hub_is_an_incomplete_download(hub):
    hub.repos["org/g"] = {"model.gguf": b""}
    with pytest.raises(ExtractError, match=r"^cannot read org/g/model\.gguf: it is 0 bytes and ends inside its GGUF "
                                           r"header \(metadata and tensor table\): the download is incomplete"):
        open_checkpoint("org/g/model.gguf")


def test_a_fused_gguf_attn_qkv_from_the_hub_reads_as_from_the_file(hub, tmp_path):
    """phi-2's early files fuse Q, K and V in one attn_qkv: only its Q and K rows are read, by row."""
    rng = np.random.default_rng(5)
    weights = {f"blk.{i}.attn_qkv.weight": rng.standard_normal((96, 32)).astype(np.float32) for i in range(2)}
    path = tmp_path / "phi.gguf"
    write_gguf(path, "phi2", n_heads=4, n_kv_heads=4, d_model=32, head_dim=8, weights=weights)
    hub.repos["org/phi"] = {"phi.gguf": path.read_bytes()}
    ours, theirs = open_checkpoint("org/phi/phi.gguf"), open_checkpoint(str(path))
    for layer in range(2):
        for a, b in zip(ours.read_layer(layer), theirs.read_layer(layer)):
            np.testing.assert_array_equal(a, b)


def test_a_gguf_at_a_named_revision_is_that_revisions_file(hub, tmp_path):
    old, new = tmp_path / "old.gguf", tmp_path / "new.gguf"
    write_gguf(old, seed=1)
    write_gguf(new, seed=2)
    hub.revisions["org/g"] = {"v1": ("1" * 40, {"m.gguf": old.read_bytes()}),
                              "main": ("2" * 40, {"m.gguf": new.read_bytes()})}
    ours = open_checkpoint("org/g/m.gguf", options=ReadOptions(revision="v1"))
    for a, b in zip(ours.read_layer(0), open_checkpoint(str(old)).read_layer(0)):
        np.testing.assert_array_equal(a, b)


def test_the_arrays_a_legacy_pickle_gives_are_the_callers(hub, tmp_path):
    """A float64 legacy pickle's tensors are held for later reads: what a read returns may be changed in place
    without changing the next read."""
    folder = legacy_pickle(tmp_path / "legacy64", torch.float64)
    serve(hub, "org/legacy64", folder)
    ckpt = open_checkpoint("org/legacy64")
    for array in ckpt.read_layer(0):
        array[...] = 0.0
    same_layers("org/legacy64", folder, layers=1)
    for a, b in zip(ckpt.read_layer(0), open_checkpoint(str(folder)).read_layer(0)):
        np.testing.assert_array_equal(a, b)
