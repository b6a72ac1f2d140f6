"""Every RoPE family of the layout tables, Hugging Face and GGUF, at distances other than 0: the forms
L_delta = W_K^T R(delta) W_Q that headforms builds from a checkpoint (its rotation's pairing, base, rotated
fraction and scaling, as read from config.json or GGUF metadata) reproduce the tiny model's own attention
logits at real position pairs, and a rotation with another pairing or base, or none, does not.

The cases are derived from the tables: each tiny model (tests/tiny_models.py) whose layout has RoPE is a case,
and every RoPE layout must have one, so a new family is covered (or fails) without editing this file."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest
import torch
import transformers

from headforms import api
from headforms.compute.reduction import reduce_factors
from headforms.compute.rotary import Rotation, distance_forms
from headforms.extract.checkpoint import ReadOptions
from headforms.extract.formats.gguf_file import open_gguf
from headforms.extract.formats.hf import open_hf_folder
from headforms.extract.layouts import latent
from headforms.extract.layouts.gguf_table import GGUF_ARCHITECTURES
from headforms.extract.layouts.rope import DEFAULT_THETA, GGUF_PER_LAYER_ROPE, HF_PER_LAYER_ROPE, rope
from headforms.extract.layouts.table import LAYOUTS, layout_key
from tests import gguf_convert, test_llama4 as llama4
from tests import tiny_models as tm
from tests.dense import dense_reference
from tests.test_gguf import GGUF_CASES, _additive_mask, tiny, write_gguf  # noqa: F401  (tiny: a fixture)
from tests.test_layouts import qk_norm_kind, qk_rms
from tests.test_positions import POSITIONS, dense_rotation, parity_of

THETA = 2000.0  # a base that is no family's default, set in every config that lets a model choose it
DELTAS = np.unique(POSITIONS[:, None] - POSITIONS[None, :])
DELTAS = DELTAS[DELTAS >= 0]
# RoPE families whose forms beyond distance 0 are refused by design (extract records why and accepts only
# --distances 0): the case asserts that refusal instead of the logits.
REFUSED_BEYOND_ZERO = {  # sliding-window layers use another base than global ones
    "gemma3_text": "the layers use different RoPE settings (layer_types)",
    "gemma3": "the layers use different RoPE settings (layer_types)",
    "phi3_longrope": "longrope uses its short factors up to original_max_position_embeddings tokens",
}


def _family(name: str) -> str:
    """The LAYOUTS key a tiny model is read with ('discovered' for model_types found by extract.layouts.discover)."""
    tiny_spec = tm.TINY[name]
    if tiny_spec.discovered:
        return "discovered"
    return layout_key({"model_type": getattr(transformers, tiny_spec.config_class).model_type}, tiny_spec.tower)


def _has_rope(name: str) -> bool:
    family = _family(name)
    return tm.TINY[name].rope if family == "discovered" else LAYOUTS[family].positional == "rope"


HF_ROPE = [name for name in tm.TINY if _has_rope(name)]


def rope_overrides(name: str) -> dict:
    """Config overrides giving a tiny model base THETA and at least 4 rotated coordinates per head (so that the
    pairings differ); GPT-J's base is fixed at 10000 by its code, so its config is kept."""
    config = getattr(transformers, tm.TINY[name].config_class)(**tm.TINY[name].kwargs)
    params = getattr(config.get_text_config(), "rope_parameters", None)
    if not params or any(isinstance(v, dict) for v in params.values()):
        return {}
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    fraction = params.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", None) or 1.0)
    return {"rope_parameters": {**params, "rope_theta": THETA}
            | ({"partial_rotary_factor": 0.5} if fraction * head_dim < 4 else {})}


def trace_at_positions(model, batch: int = 2, seed: int = 3) -> tm.Trace:
    """Attention inputs, q/k projection outputs and probabilities of a causal model run at POSITIONS."""
    length = len(POSITIONS)
    tokens = torch.randint(3, tm.VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
    with tm.captured(model) as (inputs, q, k), torch.no_grad():
        out = model(input_ids=tokens, attention_mask=torch.ones_like(tokens), output_attentions=True,
                    position_ids=torch.as_tensor(POSITIONS).repeat(batch, 1))
    return tm.Trace(inputs=tm._numpy(inputs), probs=tm._numpy(out.attentions), q=tm._numpy(q), k=tm._numpy(k),
                    allowed=np.tril(np.ones((length, length), bool)))


def logit_error(ckpt, trace: tm.Trace, layer: int, model, rotation: Rotation, qk_norm_kind: str | None) -> float:
    """max |model - predicted| / max |predicted| of the logit differences to key 0 over causal pairs, with
    predicted_ij = scale * x_j^T L_(pos_i - pos_j) x_i (over the QK-norm RMS of q_i and k_j when folded), the
    forms L_delta = U l_delta U^T from headforms' reduction and distance_forms under `rotation`."""
    spec = ckpt.spec
    w_q, w_k = ckpt.read_layer(layer)
    kv = spec.kv_index
    factors = reduce_factors(w_q, w_k, kv)
    forms = distance_forms(factors, spec.head_dim, rotation, DELTAS)  # (D, H, r, r)
    x = trace.inputs[layer]                                            # (B, T, N)
    flat = x.reshape(-1, x.shape[-1]).T
    coords = np.stack([np.linalg.solve(factors[h].T, np.concatenate([w_k[kv[h]], w_q[h]]) @ flat)  # U^T x
                       for h in range(spec.n_heads)]).reshape(spec.n_heads, -1, *x.shape[:2])  # (H, r, B, T)
    at = np.searchsorted(DELTAS, np.clip(POSITIONS[:, None] - POSITIONS[None, :], 0, None))  # (T, T) -> delta index
    predicted = spec.score_scale * np.einsum("hrbj,ijhrs,hsbi->bhij", coords, forms[at], coords)
    if qk_norm_kind is not None:
        text = model.config.get_text_config()
        eps = getattr(text, "rms_norm_eps", None) or text.layer_norm_eps
        r_q = qk_rms(trace.q[layer], spec.n_heads, qk_norm_kind, spec.head_dim, eps)
        r_k = qk_rms(trace.k[layer], spec.n_kv_heads, qk_norm_kind, spec.head_dim, eps)[:, kv]
        predicted = predicted / (r_q[..., :, None] * r_k[..., None, :])
    if spec.softcap:
        predicted = spec.softcap * np.tanh(predicted / spec.softcap)
    probs, allowed = trace.probs[layer], trace.allowed
    assert (probs[..., allowed] > 0).all()
    logp = np.log(np.where(allowed, probs, 1.0))
    model_diff = (logp - logp[..., :1])[..., allowed]
    predicted_diff = (predicted - predicted[..., :1])[..., allowed]
    scale = np.abs(predicted_diff).max()
    assert 0.1 < scale < 100, "logits should be O(1) for a meaningful comparison"
    return np.abs(model_diff - predicted_diff).max() / scale


def assert_forms_reproduce_logits(ckpt, model, qk_norm_kind: str | None) -> None:
    """Every layer's distance forms reproduce the logits; another pairing, the default base (where the model's
    differs) or no rotation at all do not, so the comparison tells each setting apart."""
    r = ckpt.spec.rope
    assert r.refusal is None and len(r.frequencies) == r.rotary_dims // 2 >= 2
    trace = trace_at_positions(model)
    for layer in range(ckpt.spec.n_layers):
        own = Rotation.of(r.pairing, r.frequencies_of(layer))  # none on a layer RoPE skips (SmolLM3's NoPE layers)
        assert logit_error(ckpt, trace, layer, model, own, qk_norm_kind) < 1e-5
        if layer in r.nope_layers:  # rotating it misses
            assert logit_error(ckpt, trace, layer, model, Rotation.of(r.pairing, r.frequencies), qk_norm_kind) > 1e-3
    other = {"split-half": "interleaved", "interleaved": "split-half"}[r.pairing]
    wrong = [Rotation.of(other, r.frequencies), Rotation.of(r.pairing, np.zeros(len(r.frequencies)))]
    if r.theta != DEFAULT_THETA and r.scaling == "default":
        wrong.append(Rotation.of(r.pairing, rope(DEFAULT_THETA, r.rotary_dims, r.pairing).frequencies))
    for rotation in wrong:
        assert logit_error(ckpt, trace, ckpt.spec.n_layers - 1, model, rotation, qk_norm_kind) > 1e-3


def test_every_rope_layout_has_a_case():
    """Each Hugging Face layout with RoPE (a config variant may switch it off: Falcon's alibi) has a tiny model
    here, and each GGUF architecture with RoPE a GGUF case; families found by discovery are cases too."""
    # multi-head latent attention's rope part: proven at distances 1 .. 47 (and beyond yarn's context) by
    # tests/test_latent.py; Llama 4's RoPE and NoPE layers by tests/test_llama4.py
    rope_layouts = {key for key, layout in LAYOUTS.items() if layout.positional == "rope"} - set(latent.FAMILIES) \
        - set(llama4.FAMILIES)
    assert rope_layouts == {_family(name) for name in HF_ROPE} - {"discovered"}
    assert {name for name in HF_ROPE if _family(name) == "discovered"} == {
        name for name, t in tm.TINY.items() if t.discovered and t.rope}
    rope_gguf = {arch for arch, a in GGUF_ARCHITECTURES.items() if a.positional == "rope" and a.refusal is None
                 and a.packings != ("latent",)}
    assert {case[0] for case in GGUF_ROPE_CASES} == rope_gguf


@pytest.mark.parametrize("name", HF_ROPE)
def test_hf_distance_forms_reproduce_model_logits(name, tmp_path):
    model = tm.build(name, **rope_overrides(name))
    tm.save(model, tmp_path)
    for module in model.modules():  # Falcon's eager path adds a boolean mask as 0/1
        if type(module).__name__ == "FalconAttention":
            module.register_forward_pre_hook(_additive_mask, with_kwargs=True)
    ckpt = open_hf_folder(tmp_path, name=name, source=str(tmp_path), options=ReadOptions(revision="r", qk_norm="fold", tower=tm.TINY[name].tower))
    if name in REFUSED_BEYOND_ZERO:
        assert REFUSED_BEYOND_ZERO[name] in ckpt.spec.rope.refusal
        return
    kind = qk_norm_kind(ckpt.spec)
    if "rope_theta" in rope_overrides(name).get("rope_parameters", {}):
        assert ckpt.spec.rope.theta == THETA
    assert_forms_reproduce_logits(ckpt, model, kind)


# GGUF: every architecture with RoPE, written from its tiny model as llama.cpp's converter does (tests/gguf_convert).
GGUF_ROPE_CASES = [case for case in GGUF_CASES if GGUF_ARCHITECTURES[case[0]].positional == "rope"]


class _NoRotateHalf(torch.nn.Module):
    """An attention module whose source module (this test file) defines no rotate_half."""


def test_an_unrecognised_pairing_is_refused_beyond_distance_zero():
    """Discovery probes the family's rotate_half; without one the pairing is unknown, and the RoPE says so."""
    from headforms.extract.layouts.discover import _rope_pairing

    assert _rope_pairing(_NoRotateHalf()) == "unrecognised"
    refused = rope(THETA, 8, "unrecognised")
    assert refused.frequencies == () and refused.refusal == (
        "the pairing of the rotated coordinates is not recognised (the family's rotate_half is neither split-half "
        "nor interleaved)")


# Architectures whose layers differ in RoPE (refused beyond distance 0), built with a sliding-window layer 0 and
# a full-attention layer 1: Gemma 3's have two bases, Cohere 2's full-attention layers no RoPE.
PER_LAYER = {arch: {"layer_types": ["sliding_attention", "full_attention"]} for arch in GGUF_PER_LAYER_ROPE}
# Linear RoPE scaling as llama.cpp's converter records it (rope.scaling.type and .factor) beside the table's cases.
LINEAR = {"rope_type": "linear", "factor": 4.0, "rope_theta": THETA}
GGUF_SCALED = [("llama", "llama_gqa", {"rope_parameters": LINEAR},
                {"{arch}.rope.scaling.type": "linear", "{arch}.rope.scaling.factor": 4.0})]


@pytest.mark.parametrize(("arch", "name", "overrides", "metadata"),
                         [(*case, {}) for case in GGUF_ROPE_CASES] + GGUF_SCALED,
                         ids=[f"{case[0]}-{case[1]}" for case in GGUF_ROPE_CASES] + ["llama-linear"])
def test_gguf_distance_forms_reproduce_model_logits(arch, name, overrides, metadata, tiny, tmp_path):  # noqa: F811
    """The file's rope.freq_base, rope.dimension_count, scaling and its architecture's pairing as stored."""
    model = tiny(name, **(rope_overrides(name) | PER_LAYER.get(arch, {}) | overrides))
    path = gguf_convert.write(model, arch, tmp_path / f"{name}.gguf", metadata=metadata)
    ckpt = open_gguf(path, name=name, source=str(path), options=ReadOptions(revision="r", qk_norm="fold"))
    r = ckpt.spec.rope
    assert r.theta == gguf_convert.rope_theta(model.config.get_text_config())
    kind = GGUF_ARCHITECTURES[arch].qk_norm if ckpt.spec.qk_norm == "folded" else None
    if arch not in PER_LAYER:
        assert_forms_reproduce_logits(ckpt, model, kind)
        return
    assert r.refusal == GGUF_PER_LAYER_ROPE[arch]
    assert_one_rotation_misses_a_layer(ckpt, model, kind, wrong_layer=1 if arch == "cohere2" else 0)


def assert_one_rotation_misses_a_layer(ckpt, model, kind: str | None, wrong_layer: int) -> None:
    """A RoPE refused beyond distance 0 for per-layer settings, and rightly: the rotation of the checkpoint's
    base reproduces one layer's logits and misses the other's (gemma3's sliding layer 0 has another base, its
    rope.freq_base is the global layers'; cohere2's full-attention layer 1 has no RoPE)."""
    r = ckpt.spec.rope
    assert r.frequencies == ()
    one = Rotation.of(r.pairing, rope(r.theta, r.rotary_dims, r.pairing).frequencies)
    trace = trace_at_positions(model)
    errors = [logit_error(ckpt, trace, layer, model, one, kind) for layer in range(ckpt.spec.n_layers)]
    assert errors[1 - wrong_layer] < 1e-5 and errors[wrong_layer] > 1e-3


def test_hf_cohere2_full_attention_layers_refused_beyond_distance_zero(tiny, tmp_path):  # noqa: F811
    """cohere2 (read by discovery) rotates only its sliding-window layers: refused beyond distance 0."""
    model = tiny("gguf_cohere2", **PER_LAYER["cohere2"])
    tm.save(model, tmp_path)
    ckpt = open_hf_folder(tmp_path, name="c", source=str(tmp_path), options=ReadOptions(revision="r"))
    assert ckpt.spec.rope.refusal == HF_PER_LAYER_ROPE["cohere2"]
    assert_one_rotation_misses_a_layer(ckpt, model, None, wrong_layer=1)


def test_gguf_freq_base_sets_the_distance_profiles(tmp_path):
    """A llama GGUF with rope.freq_base 100000 (SmolLM2's): every distance_profiles row equals the statistics of
    W_K^T R(delta) W_Q written out densely from the file's own tensors, R rotating adjacent pairs (2k, 2k + 1) by
    delta * 100000^(-2k/8); with the default base the rows at delta 64 would differ."""
    base, n, heads, kv_heads, deltas = 100000.0, 8, 4, 2, (0, 1, 64)
    weights = write_gguf(tmp_path / "t.gguf", n_heads=heads, n_kv_heads=kv_heads, head_dim=n,
                         metadata={"{arch}.rope.freq_base": base})
    db = tmp_path / "w.duckdb"
    api.extract(str(tmp_path / "t.gguf"), db=db, name="t", distances=deltas)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.sql("select * from distance_profiles order by layer, head, delta").pl()
    assert rows.height == 2 * heads * len(deltas)
    columns = ("frobenius", "symmetric_energy", "a", "b", "c", "d", "pairing")
    for row in rows.iter_rows(named=True):
        w_q = weights[f"blk.{row['layer']}.attn_q.weight"].astype(np.float64).reshape(heads, n, -1)[row["head"]]
        w_k = weights[f"blk.{row['layer']}.attn_k.weight"].astype(np.float64).reshape(kv_heads, n, -1)
        w_k = w_k[row["head"] // (heads // kv_heads)]
        ref = {b: dense_reference(w_k.T @ dense_rotation("interleaved", b ** -(np.arange(0, n, 2) / n), row["delta"], n)
                                  @ w_q, n) for b in (base, DEFAULT_THETA)}
        for column in columns:
            assert row[column] == pytest.approx(ref[base][column], rel=1e-9, abs=1e-12), (row, column)
        assert row["parity"] == parity_of(ref[base])
        if row["delta"] == 64:
            assert max(abs(ref[base][c] - ref[DEFAULT_THETA][c]) for c in columns) > 1e-3


def test_gguf_per_frequency_factors_are_refused_beyond_distance_zero(tmp_path):
    """A GGUF carrying rope_freqs.weight (llama 3's per-frequency factors) is read at distance 0 only, saying why."""
    weights = write_gguf(tmp_path / "plain.gguf")
    weights["rope_freqs.weight"] = np.ones(4, np.float32)
    write_gguf(tmp_path / "freqs.gguf", weights=weights)
    rope = open_gguf(tmp_path / "freqs.gguf", name="f", source="f").spec.rope
    assert rope.refusal == "per-frequency factors (tensor rope_freqs.weight) are not implemented"
    assert open_gguf(tmp_path / "plain.gguf", name="p", source="p").spec.rope.refusal is None
