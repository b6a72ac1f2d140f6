"""Llama 4 (llama4_text, and the text part of the multimodal llama4): tiny random models built by transformers' own
classes reproduce their pre-softmax logits as score_scale * x_j^T L_(i-j) x_i times the per-token factors headforms
records: 1 / (rms(W_Q x_i) rms(W_K x_j)) on the RoPE layers (the L2 norm after RoPE, unit gains), the temperature
of the query's position i on the NoPE layers, whose form is the same at every distance."""
from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from headforms.cli import main
from headforms.compute.rotary import Rotation
from headforms.extract import ExtractError, ReadOptions, open_checkpoint
from headforms.extract.layouts.spec import model_spec
from tests.test_ov_layouts import predicted_output

FAMILIES = ("llama4", "llama4_text")  # proven here, not by tests/tiny_models.py's generic logit tests
VOCAB, LENGTH, THETA = 64, 48, 2000.0
_TEXT = dict(num_hidden_layers=4, hidden_size=32, intermediate_size=16, intermediate_size_mlp=64, vocab_size=VOCAB,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
             max_position_embeddings=64, attention_chunk_size=16, floor_scale=4, attn_scale=0.5,
             rope_parameters={"rope_type": "default", "rope_theta": THETA}, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)
# Scout's RoPE scaling (llama3 with low_freq_factor = high_freq_factor), its context cut to 16 so that it bites
_SCOUT = {"rope_type": "llama3", "rope_theta": THETA, "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
          "original_max_position_embeddings": 16}
_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
               patch_size=14, vision_output_dim=16, projector_input_dim=16, projector_output_dim=16)
# name -> (model class, config class, config kwargs)
MODELS = {
    "llama4_text": ("Llama4ForCausalLM", "Llama4TextConfig", _TEXT),
    "llama4_scout": ("Llama4ForCausalLM", "Llama4TextConfig", _TEXT | {"rope_parameters": _SCOUT}),
    "llama4_no_qk_norm": ("Llama4ForCausalLM", "Llama4TextConfig",  # as Maverick: no QK-norm, MoE every 2nd layer
                          _TEXT | {"use_qk_norm": False, "interleave_moe_layer_step": 2}),
    "llama4": ("Llama4ForConditionalGeneration", "Llama4Config",
               dict(text_config=_TEXT | {"vocab_size": VOCAB + 3}, vision_config=_VISION, boi_token_index=VOCAB,
                    eoi_token_index=VOCAB + 1, image_token_index=VOCAB + 2)),
}
LOGITS: list[torch.Tensor] = []  # what the capturing attention function saw, one (B, H, T, T) a layer


def _capture(module, query, key, value, attention_mask, scaling, **kwargs):
    """The model's own q.k times its scaling (before mask and softmax), recorded; then its eager attention."""
    from transformers.models.llama4.modeling_llama4 import eager_attention_forward, repeat_kv

    LOGITS.append(torch.matmul(query, repeat_kv(key, module.num_key_value_groups).transpose(2, 3)) * scaling)
    return eager_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


def build(name: str, seed: int = 0):
    """A tiny Llama 4 of transformers' class, float64, weights re-drawn as tests/tiny_models.py draws them."""
    import transformers

    model_class, config_class, kwargs = MODELS[name]
    transformers.AttentionInterface.register("headforms_capture", _capture)
    config = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)._from_config(config, attn_implementation="headforms_capture").eval()
    getattr(model, "language_model", model).to(torch.float64)  # the vision tower's complex RoPE buffer kept as it is
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.uniform_(0.5, 1.5, generator=generator)
            else:
                param.normal_(0.0, 32**-0.5, generator=generator)
    return model


def saved(name: str, folder):
    model = build(name)
    model.save_pretrained(folder)
    return model, folder


def attentions(model) -> list:
    """The model's Llama4TextAttention modules, in layer order."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    return [m for m in model.modules() if isinstance(m, Llama4TextAttention)]


def trace(model) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer: the attention's input x (B, T, N) and the model's logits (B, H, T, T) at positions 0 .. T-1 (a
    multimodal model's text part run)."""
    modules = attentions(model)
    inputs = []
    hooks = [m.register_forward_pre_hook(lambda mod, a, kw: inputs.append(kw["hidden_states"]), with_kwargs=True)
             for m in modules]
    tokens = torch.randint(3, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    LOGITS.clear()
    try:
        with torch.no_grad():  # Llama4ForConditionalGeneration's own forward fails on text alone (transformers 5.24)
            getattr(model, "language_model", model)(input_ids=tokens)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(LOGITS) == len(modules) == 4
    return [(x.double().numpy(), logits.double().numpy()) for x, logits in zip(inputs, LOGITS)]


def temperature(spec) -> np.ndarray:
    """The NoPE layers' factor on q_i at positions i = 0 .. T-1, from what models.config records."""
    recorded, i = spec.config["attention_temperature"], np.arange(LENGTH)
    return np.log1p(np.floor((i + 1) / recorded["floor_scale"])) * recorded["attn_scale"] + 1


def predicted(ckpt, layer: int, x: np.ndarray, rotation: Rotation, *, norms: bool = True,
              temperatures: bool = True) -> np.ndarray:
    """score_scale * k_j^T R(i - j) q_i (B, H, T, T) over causal pairs (zero elsewhere) from the stored maps, divided
    by rms(q_i) rms(k_j) where the spec folds the L2 norm (RoPE layers), q_i times its temperature on NoPE layers."""
    spec, (w_q, w_k) = ckpt.spec, ckpt.read_layer(layer)
    q = np.einsum("hna,zia->zhni", w_q, x)                                # (B, H, n, T)
    k = np.einsum("gna,zja->zgjn", w_k, x)[:, spec.kv_index]             # (B, H, T, n)
    rotated = rotation.rotate(q, np.arange(LENGTH))                       # (D, B, H, n, T): R(d) q_i
    i, j = np.tril_indices(LENGTH)
    out = np.zeros(q.shape[:2] + (LENGTH, LENGTH))
    out[..., i, j] = np.einsum("zhpn,pzhn->zhp", k[:, :, j], rotated[i - j, :, :, :, i])
    nope = layer in spec.rope.nope_layers
    if norms and spec.qk_norm == "folded" and not nope:
        eps = spec.config.get("rms_norm_eps") or spec.config["text_config"]["rms_norm_eps"]
        r_q = np.sqrt((q**2).mean(2) + eps)                               # (B, H, T)
        r_k = np.sqrt((k**2).mean(3) + eps)
        out = out / (r_q[..., :, None] * r_k[..., None, :])
    if temperatures and nope:
        out = out * temperature(spec)[:, None]
    return spec.score_scale * out


def rotation_of(ckpt, layer: int) -> Rotation:
    """The layer's own rotation as the spec has it (none on a NoPE layer)."""
    return Rotation.of(ckpt.spec.rope.pairing, ckpt.spec.rope.frequencies_of(layer))


def error(got: np.ndarray, logits: np.ndarray, pairs: np.ndarray) -> float:
    """Largest |got - logits| over the pairs, relative to the largest predicted logit there."""
    scale = np.abs(got[..., pairs]).max()
    assert 0.1 < scale < 100, "logits should be O(1) for a meaningful comparison"
    return np.abs(got - logits)[..., pairs].max() / scale


CAUSAL = np.tril(np.ones((LENGTH, LENGTH), bool))
DIAGONAL = np.eye(LENGTH, dtype=bool)


@pytest.mark.parametrize("name", list(MODELS))
def test_forms_reproduce_model_logits(name, tmp_path):
    """At distance 0 and at distances 1 .. 47, on the RoPE layers 0-2 and the NoPE layer 3."""
    model, folder = saved(name, tmp_path)
    ckpt = open_checkpoint(str(folder), ReadOptions(qk_norm="fold"))
    spec = ckpt.spec
    text = model.config.get_text_config()
    assert spec.architecture == model.config.model_type
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim) == (4, 4, 2, 8)
    assert spec.rope.nope_layers == (3,) and spec.rope.pairing == "interleaved" and spec.rope.theta == THETA
    assert spec.qk_norm == ("folded" if text.use_qk_norm else None)
    assert spec.config["attention_temperature"] == {"factor": "log(1 + floor((i + 1) / floor_scale)) * attn_scale + 1",
                                                    "floor_scale": 4, "attn_scale": 0.5}
    assert spec.score_scale == 8**-0.5
    inv_freq = next(m for m in model.modules() if type(m).__name__ == "Llama4TextRotaryEmbedding").inv_freq
    np.testing.assert_allclose(spec.rope.frequencies, inv_freq.double().numpy(), rtol=1e-6)
    assert 1 < temperature(spec).max()  # the NoPE layer's queries are scaled within the sequence
    for layer, (x, logits) in enumerate(trace(model)):
        got = predicted(ckpt, layer, x, rotation_of(ckpt, layer))
        assert error(got, logits, DIAGONAL) < 1e-5            # distance 0
        assert error(got, logits, CAUSAL & ~DIAGONAL) < 1e-5  # distances 1 .. 47


def test_the_comparison_tells_the_treatments_apart(tmp_path):
    """Split-half pairs on a RoPE layer, no QK-norm factors there, RoPE on the NoPE layer or no temperature on it: each
    misses the logits."""
    model, folder = saved("llama4_text", tmp_path)
    ckpt = open_checkpoint(str(folder), ReadOptions(qk_norm="fold"))
    traced, frequencies = trace(model), ckpt.spec.rope.frequencies
    (x0, logits0), (x3, logits3) = traced[0], traced[3]
    wrong = [predicted(ckpt, 0, x0, Rotation.of("split-half", frequencies)) - logits0,
             predicted(ckpt, 0, x0, rotation_of(ckpt, 0), norms=False) - logits0,
             predicted(ckpt, 3, x3, Rotation.of("interleaved", frequencies)) - logits3,
             predicted(ckpt, 3, x3, rotation_of(ckpt, 3), temperatures=False) - logits3]
    for gap, logits in zip(wrong, (logits0, logits0, logits3, logits3)):
        assert np.abs(gap[..., CAUSAL]).max() > 1e-2 * np.abs(logits[..., CAUSAL]).max()


def head_maps(model) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer, each query head's W_Q and its key head's W_K (4, 8, N), from the model's own q_proj and k_proj."""
    return [(m.q_proj.weight.detach().double().numpy().reshape(4, 8, -1),
             m.k_proj.weight.detach().double().numpy().reshape(2, 8, -1)[[0, 0, 1, 1]]) for m in attentions(model)]


def test_extract_stores_the_spectra_and_the_nope_layers_distance_profiles(tmp_path):
    """`headforms extract --qk-norm fold`: each head's stored spectrum of S is dense numpy's of the form written out
    from the model's parameters; the NoPE layer's distance profile is its delta-0 row at every distance, and the
    RoPE layers' Frobenius norms are those of W_K^T R(delta) W_Q; models.config records the NoPE layers and the
    temperature."""
    model, folder = saved("llama4", tmp_path / "ckpt")
    db = tmp_path / "w.duckdb"
    refused = CliRunner().invoke(main, ["extract", str(folder), "--db", str(db)])
    assert refused.exit_code == 1 and "pass --qk-norm fold" in refused.output, refused.output
    result = CliRunner().invoke(main, ["extract", str(folder), "--db", str(db), "--qk-norm", "fold",
                                       "--resamples", "20"])
    assert result.exit_code == 0, result.output
    con = duckdb.connect(str(db), read_only=True)
    [(architecture, qk_norm, config)] = con.sql("SELECT architecture, qk_norm, config FROM models").fetchall()
    config = json.loads(config)
    assert (architecture, qk_norm, config["rope"]["nope_layers"]) == ("llama4", "folded", [3])
    assert config["attention_temperature"]["floor_scale"] == 4 and config["attention_temperature"]["attn_scale"] == 0.5
    spectra = dict(((l, h), v) for l, h, v in con.sql(
        "SELECT layer, head, list(value ORDER BY idx) FROM eigenvalues WHERE spectrum = 'S' GROUP BY ALL").fetchall())
    maps = head_maps(model)
    for layer, (q, k) in enumerate(maps):
        form = np.einsum("hna,hnb->hab", k, q)  # L = W_K^T W_Q, N x N per head
        eig = np.linalg.eigvalsh((form + form.swapaxes(1, 2)) / 2)[:, ::-1]
        for head in range(4):
            dense = np.r_[eig[head, :8], eig[head, -8:]]
            np.testing.assert_allclose(spectra[layer, head], dense, atol=1e-10 * np.abs(dense).max())
    columns = "frobenius, symmetric_energy, a, b, c, d, parity, pairing"
    profiles = con.sql(f"SELECT layer, head, delta, {columns} FROM distance_profiles ORDER BY ALL").fetchall()
    deltas = sorted({row[2] for row in profiles})
    assert deltas[0] == 0 and len(deltas) > 5
    spec = open_checkpoint(str(folder), ReadOptions(qk_norm="fold")).spec
    rotation = Rotation.of(spec.rope.pairing, spec.rope.frequencies)
    for layer, head, delta, *stats in profiles:
        at_zero = next(row[3:] for row in profiles if row[:3] == (layer, head, 0))
        if layer == 3:  # NoPE: the same form at every distance
            assert tuple(stats) == at_zero
        else:
            q, k = maps[layer]
            dense = k[head].T @ rotation.matrix(delta, 8) @ q[head]
            assert stats[0] == pytest.approx(np.linalg.norm(dense), rel=1e-9)
    assert any(row[3] != next(r[3] for r in profiles if r[:3] == (0, row[1], 0)) for row in profiles if row[0] == 0)
    con.close()
    checked = CliRunner().invoke(main, ["check", "--db", str(db)])
    assert checked.exit_code == 0 and "all invariants hold" in checked.output, checked.output


@pytest.mark.parametrize("name", ["llama4_text", "llama4"])
def test_ov_reproduces_attention_output(name, tmp_path):
    """W_V, W_O give each layer's attention output sum_h W_O W_V A x (A the model's own) and the embeddings are the
    model's: RoPE, the L2 norm and the temperature act on q and k alone."""
    model, folder = saved(name, tmp_path)
    ckpt = open_checkpoint(str(folder), ReadOptions(qk_norm="fold", circuits=("qk", "ov")))
    outputs = []
    hooks = [m.register_forward_hook(lambda m, a, out: outputs.append(out)) for m in attentions(model)]
    try:
        traced = trace(model)
    finally:
        for hook in hooks:
            hook.remove()
    for layer, ((x, _), (out, probs)) in enumerate(zip(traced, outputs)):
        w_v, w_o = ckpt.read_circuits(layer)["ov"]
        got = predicted_output(w_v, w_o, ckpt.spec.kv_index, probs.double().numpy(), x)
        assert np.abs(got - out.double().numpy()).max() < 1e-10 * out.abs().max().item()
    w_e, w_u = ckpt.read_embeddings()
    text = getattr(model, "language_model", model)
    np.testing.assert_array_equal(w_e, text.model.embed_tokens.weight.detach().numpy())
    np.testing.assert_allclose(w_u, text.lm_head.weight.detach().numpy() * text.model.norm.weight.detach().numpy(),
                               rtol=1e-12)


_CONFIG = {"model_type": "llama4_text", "num_hidden_layers": 8, "num_attention_heads": 16, "hidden_size": 32}


def test_the_nope_layers_default_to_every_fourth():
    """An empty no_rope_layers (Scout's config.json has one) is every no_rope_layer_interval-th layer, 4 unless set."""
    options = ReadOptions(qk_norm="fold")
    assert model_spec(_CONFIG | {"no_rope_layers": []}, options)[1].rope.nope_layers == (3, 7)
    assert model_spec(_CONFIG | {"no_rope_layer_interval": 2}, options)[1].rope.nope_layers == (1, 3, 5, 7)
    spec = model_spec(_CONFIG | {"attn_temperature_tuning": False}, options)[1]
    assert "attention_temperature" not in spec.config and spec.rope.theta == 500000.0 and spec.head_dim == 128


@pytest.mark.parametrize("changes, message", [
    ({}, "^llama4_text uses QK-norm, so the attention score is not bilinear in x; pass qk_norm='fold'"),
    ({"no_rope_layers": [1, 0]}, "^config.json: no_rope_layers has 2 entries for 8 layers$"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                          "original_max_position_embeddings": 16}, "max_position_embeddings": 64},
     r"^llama4_text is refused: RoPE's attention factor 1\.13863 scales the scores of its RoPE layers but not of its "
     "NoPE layers; per-layer score scales are not implemented$"),
])
def test_refused_in_one_line(changes, message):
    options = ReadOptions(qk_norm="refuse" if not changes else "fold")
    with pytest.raises(ExtractError, match=message):
        model_spec(_CONFIG | changes, options)


@pytest.mark.parametrize("name", ["llama4_text", "llama4_no_qk_norm"])
def test_behaviour_reproduces_the_self_logits(name, tmp_path):
    """behaviour's forward pass of 16-token sequences (floor_scale 4: the NoPE layers' temperature is above 1 from the
    fourth token on): the RoPE layers' unit-norm factors of q and k (one qk_norm module, called on q then k) and the
    NoPE layers' temperature make every head's form give its self-logits."""
    _, folder = saved(name, tmp_path)
    db = str(tmp_path / "w.duckdb")
    assert CliRunner().invoke(main, ["extract", str(folder), "--db", db, "--qk-norm", "fold"]).exit_code == 0
    result = CliRunner().invoke(main, ["behaviour", str(folder), "--db", db, "--length", "8", "--sequences", "2"])
    assert result.exit_code == 0, result.output
    with duckdb.connect(db, read_only=True) as con:
        rows = con.sql("SELECT layer, reproduction_error, self_logit FROM head_behaviour").fetchall()
    assert sorted({layer for layer, _, _ in rows}) == [0, 1, 2, 3] and len(rows) == 16
    largest = max(abs(logit) for *_, logit in rows)
    assert largest > 0.1 and max(error for _, error, _ in rows) < 1e-4 * largest
