"""Multi-head latent attention (extract.layouts.latent): the two parts of every head, with the latent norms' RMS factors
applied per token, reproduce the pre-softmax logits of tiny random DeepSeek-V2 and -V3 models built by
transformers' own classes, at distance 0 and at nonzero distances (beyond the original context under yarn)."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner
from scipy import stats

from headforms.cli import main
from headforms.compute.analysis import analyse_layer
from headforms.compute.rotary import Rotation
from headforms.extract import ExtractError, ReadOptions, open_checkpoint
from headforms.extract.layouts.latent import latent_spec

VOCAB = 64
_SHAPE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
              qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, intermediate_size=64, moe_intermediate_size=16,
              first_k_dense_replace=2, vocab_size=VOCAB, max_position_embeddings=128)
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
         "beta_fast": 32, "beta_slow": 1, "mscale": 0.8, "mscale_all_dim": 0.6}
# name -> (model class, config class, config kwargs)
MODELS = {
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", _SHAPE | dict(q_lora_rank=24)),
    "deepseek_v3_yarn": ("DeepseekV3ForCausalLM", "DeepseekV3Config",
                         _SHAPE | dict(q_lora_rank=24, rope_parameters=_YARN)),
    "deepseek_v3_split_half": ("DeepseekV3ForCausalLM", "DeepseekV3Config",
                               _SHAPE | dict(q_lora_rank=24, rope_interleave=False)),
    "deepseek_v2": ("DeepseekV2ForCausalLM", "DeepseekV2Config", _SHAPE | dict(q_lora_rank=24)),
    "deepseek_v2_lite": ("DeepseekV2ForCausalLM", "DeepseekV2Config", _SHAPE | dict(q_lora_rank=None)),
}
LOGITS: list[torch.Tensor] = []  # what the capturing attention function saw, one (B, H, T, T) a layer


def _capture(module, query, key, value, attention_mask, scaling, **kwargs):
    """The model's own q.k times its scaling (before mask and softmax), recorded; then its eager attention."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import eager_attention_forward

    LOGITS.append(torch.matmul(query, key.transpose(2, 3)) * scaling)
    return eager_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


def _capturing():
    """transformers with this file's capture registered (`headforms behaviour` registers its own under the name)."""
    import transformers

    transformers.AttentionInterface.register("headforms_capture", _capture)
    return transformers


def build(name: str, seed: int = 0, **overrides):
    """A tiny MLA model of transformers' class, float64, weights re-drawn as tests/tiny_models.py draws them."""
    transformers = _capturing()
    model_class, config_class, kwargs = MODELS[name]
    config = getattr(transformers, config_class)(**(kwargs | overrides))
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)._from_config(config, attn_implementation="headforms_capture")
    model = model.to(torch.float64).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param.ndim == 1:
                param.uniform_(0.5, 1.5, generator=generator)
            else:
                param.normal_(0.0, config.hidden_size**-0.5, generator=generator)
    return model


def trace(model, length: int = 48, seed: int = 1, tokens: np.ndarray | None = None):
    """Per layer: attention inputs x (B, T, N), the model's logits (B, H, T, T), the RMS of the q latent (B, T; ones
    without q_lora_rank) and of the kv latent (B, T), from one forward pass at positions 0..T-1 over `tokens` (B, T),
    or 2 x `length` random ids."""
    _capturing()
    modules = [layer.self_attn for layer in model.model.layers]
    inputs, q_latent, kv_latent, hooks = [], [], [], []
    for m in modules:
        hooks.append(m.register_forward_pre_hook(lambda mod, a, kw: inputs.append(kw["hidden_states"]),
                                                 with_kwargs=True))
        if m.q_a_proj is not None:
            hooks.append(m.q_a_proj.register_forward_hook(lambda mod, a, out: q_latent.append(out)))
        hooks.append(m.kv_a_proj_with_mqa.register_forward_hook(lambda mod, a, out: kv_latent.append(out)))
    tokens = (torch.randint(3, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed)) if tokens is None
              else torch.as_tensor(tokens))
    length = tokens.shape[1]
    LOGITS.clear()
    try:
        with torch.no_grad():
            model(input_ids=tokens, position_ids=torch.arange(length)[None].expand(len(tokens), -1))
    finally:
        for hook in hooks:
            hook.remove()
    out = []
    for layer, m in enumerate(modules):
        eps = m.kv_a_layernorm.variance_epsilon
        c = kv_latent[layer][..., :m.kv_lora_rank].double().numpy()
        rms_kv = np.sqrt((c**2).mean(-1) + eps)
        if m.q_a_proj is not None:
            rms_q = np.sqrt((q_latent[layer].double().numpy()**2).mean(-1) + m.q_a_layernorm.variance_epsilon)
        else:
            rms_q = np.ones_like(rms_kv)
        out.append((inputs[layer].double().numpy(), LOGITS[layer].double().numpy(), rms_q, rms_kv))
    return out


def predicted(spec, layer, x, rms_q, rms_kv):
    """score_scale * (A / (rms_q(x_i) rms_kv(x_j)) + B(i - j) / rms_q(x_i)) from the stored parts, (B, H, T, T)."""
    x = x @ layer.basis if layer.basis is not None else x
    nope, rope = layer.parts["nope"], layer.parts["rope"]
    forms = np.einsum("hna,hnb->hab", nope.wk[nope.kv_index], nope.wq)
    a = np.einsum("zja,hab,zib->zhij", x, forms, x)
    q = np.einsum("hna,zia->zhin", rope.wq, x)
    k = np.einsum("na,zja->zjn", rope.wk[0], x)
    t = x.shape[1]
    rotation = Rotation.of(spec.pairing, spec.frequencies)
    rotations = np.stack([rotation.rotate(np.eye(spec.rope), np.arange(t) - j) for j in range(t)], axis=1)
    b = np.einsum("zjn,ijnm,zhim->zhij", k, rotations, q)  # rotations[i, j] = R(i - j)
    return spec.score_scale * (a / rms_kv[:, None, None, :] + b) / rms_q[:, None, :, None]


def opened(path):
    """The checkpoint as every run opens it (headforms.extract.open_checkpoint), its latent norms folded."""
    return open_checkpoint(str(path), ReadOptions(qk_norm="fold"))


def saved(name: str, folder, **overrides):
    model = build(name, **overrides)
    model.save_pretrained(folder)
    return model, folder


@pytest.mark.parametrize("name", list(MODELS))
def test_parts_reproduce_model_logits(name, tmp_path):
    model, folder = saved(name, tmp_path)
    ckpt = opened(folder)
    spec = ckpt.spec.form
    assert ckpt.spec.score_scale == model.model.layers[0].self_attn.scaling
    traced = trace(model)
    causal = np.tril(np.ones((48, 48), bool))
    for index, (x, logits, rms_q, rms_kv) in enumerate(traced):
        layer = ckpt.read_layer(index)
        got = predicted(spec, layer, x, rms_q, rms_kv)
        scale = np.abs(got[..., causal]).max()
        assert 0.1 < scale < 100
        diagonal = np.eye(48, dtype=bool)
        assert np.abs(got - logits)[..., diagonal].max() / scale < 1e-6  # distance 0
        assert np.abs(got - logits)[..., causal & ~diagonal].max() / scale < 1e-6  # distances 1 .. 47
        nope, rope = layer.parts["nope"], layer.parts["rope"]
        assert nope.wq.shape == (4, 8, nope.wq.shape[2]) and rope.wk.shape[:2] == (1, 4)
        assert (layer.basis is None) == (spec.width >= spec.d_model)
        lora = spec.q_lora_rank is not None  # the factors `predicted` applies, as the parts name them
        assert (nope.factor, rope.factor) == (("1/(rms_q(x_i) rms_kv(x_j))", "1/rms_q(x_i)") if lora
                                              else ("1/rms_kv(x_j)", "1"))


def test_the_parts_are_two_forms_not_one(tmp_path):
    """Scoring the rope part with the nope part's factor (one form at unit RMS per token) misses the logits."""
    model, folder = saved("deepseek_v3", tmp_path)
    ckpt = opened(folder)
    x, logits, rms_q, rms_kv = trace(model)[0]
    layer = ckpt.read_layer(0)
    one_form = predicted(ckpt.spec.form, layer, x, rms_q, rms_kv * 0 + 1) / rms_kv[:, None, None, :]
    causal = np.tril(np.ones((48, 48), bool))
    assert np.abs(one_form - logits)[..., causal].max() > 1e-2 * np.abs(logits[..., causal]).max()


def test_yarn_scales_only_the_rope_part(tmp_path):
    model, folder = saved("deepseek_v3_yarn", tmp_path)
    spec = opened(folder).spec.form
    attention = model.model.layers[0].self_attn
    mscale = 0.1 * 0.6 * np.log(4.0) + 1.0  # transformers' yarn_get_mscale(factor, mscale_all_dim)
    assert spec.score_scale == pytest.approx(12**-0.5 * mscale**2, rel=1e-12) == attention.scaling
    factor = (0.1 * 0.8 * np.log(4.0) + 1.0) / mscale
    assert spec.rope_factor == pytest.approx(factor**2, rel=1e-12)
    assert spec.rope_factor == pytest.approx(model.model.rotary_emb.attention_scaling**2, rel=1e-12)


def _config(**changes) -> dict:
    return {"model_type": "deepseek_v3", **_SHAPE, "q_lora_rank": 24} | changes


@pytest.mark.parametrize("changes, message", [
    ({"kv_lora_rank": 80}, "kv_lora_rank 80 is larger than the width N = 64"),
    ({"q_lora_rank": 65}, "q_lora_rank 65 is larger than the width N = 64"),
    ({"qk_rope_head_dim": 5}, "qk_rope_head_dim 5 is odd"),
    ({"kv_lora_rank": 0}, "kv_lora_rank must be a positive integer, got 0"),
    ({"attention_bias": True}, "attention_bias adds a bias to the latents"),
])
def test_bad_configs_refused_in_one_line(changes, message):
    with pytest.raises(ExtractError) as error:
        latent_spec(_config(**changes))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_latent_norms_need_fold():
    with pytest.raises(ExtractError, match="pass qk_norm=.fold."):
        latent_spec(_config(), qk_norm="refuse")


def test_config_disagreeing_with_tensors(tmp_path):
    _, folder = saved("deepseek_v3", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"kv_lora_rank": 12}))
    with pytest.raises(ExtractError, match=r"tensor 'model.layers.0.self_attn.kv_a_proj_with_mqa.weight' has shape "
                                           r"\(20, 64\), expected \(16, 64\) from config.json"):
        opened(folder)
    (folder / "config.json").write_text(json.dumps(config | {"kv_lora_rank": 80}))
    with pytest.raises(ExtractError, match="kv_lora_rank 80 is larger than the width N = 64"):
        opened(folder)


def test_cli_refuses_latent_attention_without_fold_in_one_line(tmp_path):
    _, folder = saved("deepseek_v3", tmp_path / "ckpt")
    db = tmp_path / "w.duckdb"
    result = CliRunner().invoke(main, ["extract", str(folder), "--db", str(db)])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--qk-norm fold" in lines[0] and lines[0].startswith("Error: deepseek_v3 normalises")
    assert not db.exists()


def dense_parts(model) -> list[dict[str, np.ndarray]]:
    """Per layer, part -> (H, N, N) forms L = K^T Q written out from the model's own parameters in the full width N
    (not through extract.layouts.latent's common span): q = W_qb diag(g_q) W_qa (or W_q), k_nope,h = W_kvb,h diag(g_kv)
    W_kva[:kv_lora], the shared k_rope = W_kva[kv_lora:], the rope part times a^2."""
    c = model.config
    h, nope, rope, lora = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
    a2 = float(model.model.rotary_emb.attention_scaling) ** 2
    out = []
    for layer in model.model.layers:
        m = layer.self_attn
        w = {name: p.detach().double().numpy() for name, p in m.named_parameters()}
        q = (w["q_b_proj.weight"] * w["q_a_layernorm.weight"]) @ w["q_a_proj.weight"] if m.q_a_proj is not None \
            else w["q_proj.weight"]
        q = q.reshape(h, nope + rope, -1)
        kv_a = w["kv_a_proj_with_mqa.weight"]
        kv_b = (w["kv_b_proj.weight"] * w["kv_a_layernorm.weight"]).reshape(h, nope + c.v_head_dim, lora)[:, :nope]
        k_nope = kv_b @ kv_a[:lora]
        k_rope = kv_a[lora:]
        out.append({"nope": np.einsum("hna,hnb->hab", k_nope, q[:, :nope]),
                    "rope": a2 * np.einsum("na,hnb->hab", k_rope, q[:, nope:])})
    return out


@pytest.mark.parametrize("name", ["deepseek_v3_yarn", "deepseek_v2_lite"])
def test_extract_stores_each_part_with_the_spectra_of_its_dense_form(name, tmp_path):
    """`headforms extract --qk-norm fold` stores every head as its two parts; each part's stored spectrum of S, its
    symmetric energy and its counts equal those of the form written out densely from the model's parameters."""
    import duckdb

    model, folder = saved(name, tmp_path / "ckpt")
    db = tmp_path / "w.duckdb"
    result = CliRunner().invoke(main, ["extract", str(folder), "--db", str(db), "--qk-norm", "fold"])
    assert result.exit_code == 0, result.output
    assert "N=64, each head as parts nope (n=8), rope (n=4), revision" in result.output
    con = duckdb.connect(str(db), read_only=True)
    heads = con.sql("SELECT layer, head, part, symmetric_energy, n_pos, n_neg, n_zero_ambient FROM heads "
                    "ORDER BY layer, part, head").fetchall()
    assert [(r[0], r[2]) for r in heads[::4]] == [(0, "nope"), (0, "rope"), (1, "nope"), (1, "rope")]
    spectra = dict(((l, h, p), v) for l, h, p, v in con.sql(
        "SELECT layer, head, part, list(value ORDER BY idx) FROM eigenvalues WHERE spectrum = 'S' "
        "GROUP BY ALL").fetchall())
    for layer, forms in enumerate(dense_parts(model)):
        for part, form in forms.items():
            s = (form + form.swapaxes(1, 2)) / 2
            eig = np.linalg.eigvalsh(s)[:, ::-1]
            energy = (s**2).sum(axis=(1, 2)) / (form**2).sum(axis=(1, 2))
            for head in range(4):
                row = next(r for r in heads if r[:3] == (layer, head, part))
                assert row[3] == pytest.approx(energy[head], rel=1e-9)
                n = {"nope": 8, "rope": 4}[part]
                assert row[4] == row[5] == n and row[6] == 64 - 2 * n  # Theorem 3 per part: n each side
                stored = np.array(spectra[layer, head, part])
                dense = np.r_[eig[head, :n], eig[head, -n:]]
                np.testing.assert_allclose(stored, dense, atol=1e-10 * np.abs(dense).max())
    parts = con.sql("SELECT part, count(*) FROM distance_profiles GROUP BY part").fetchall()
    assert parts == [("rope", 8 * len(con.sql("SELECT DISTINCT delta FROM distance_profiles").fetchall()))]
    [(config,)] = con.sql("SELECT config FROM models").fetchall()
    assert json.loads(config)["parts"]["nope"]["head_dim"] == 8
    assert con.sql("SELECT part, heads, balanced, exceptions FROM signature_check ORDER BY part").fetchall() == [
        ("nope", 8, 8, 0), ("rope", 8, 8, 0)]  # the views per part, each with the part's own n
    assert con.sql("SELECT part, count(*) FROM head_types GROUP BY ALL ORDER BY ALL").fetchall() == [
        ("nope", 8), ("rope", 8)]
    con.close()
    checked = CliRunner().invoke(main, ["check", "--db", str(db)])
    assert checked.exit_code == 0 and "all invariants hold" in checked.output


def test_gguf_extracts_the_parts_of_the_folder(tmp_path):
    """A GGUF deepseek2 file (split kv_b) gives the statistics of the same model's folder, to the float32 it stores."""
    import duckdb

    model, folder = saved("deepseek_v3", tmp_path / "ckpt")
    path = write_gguf(model, tmp_path / "m.gguf", split=True)
    for source, db in ((folder, "a.duckdb"), (path, "b.duckdb")):
        result = CliRunner().invoke(main, ["extract", str(source), "--db", str(tmp_path / db), "--qk-norm", "fold",
                                           "--name", "m"])
        assert result.exit_code == 0, result.output
    rows = [duckdb.connect(str(tmp_path / db), read_only=True).sql(
        "SELECT layer, head, part, symmetric_energy, pairing, parity FROM heads ORDER BY ALL").fetchall()
        for db in ("a.duckdb", "b.duckdb")]
    assert len(rows[0]) == 16 and [r[:3] for r in rows[0]] == [r[:3] for r in rows[1]]
    np.testing.assert_allclose([r[3:5] for r in rows[0]], [r[3:5] for r in rows[1]], rtol=1e-5)


def test_the_common_span_keeps_every_statistic_spectrum_and_fit(tmp_path):
    """Each part analysed in the layer's m-wide basis (ambient N given) equals the part analysed at width N, and its
    spectrum of S is dense numpy's of the N x N form."""
    _, folder = saved("deepseek_v3", tmp_path)
    ckpt = opened(folder)
    spec, layer = ckpt.spec.form, ckpt.read_layer(1)
    basis = layer.basis
    assert basis.shape == (64, 44) and np.allclose(basis.T @ basis, np.eye(44), atol=1e-12)
    rotation = Rotation.of(spec.pairing, spec.frequencies)
    for part in layer.parts.values():
        kw = dict(layer=1, seed=0, rotation=rotation if part.rotary else None,
                  deltas=(0, 1, 4, 40) if part.rotary else (0,))
        reduced = analyse_layer(part.wq, part.wk, part.kv_index, ambient=64, **kw)
        full = analyse_layer(part.wq @ basis.T, part.wk @ basis.T, part.kv_index, **kw)
        for column, value in full.statistics.items():
            if value.dtype.kind in "OU":
                assert list(reduced.statistics[column]) == list(value), column
            else:
                np.testing.assert_allclose(reduced.statistics[column], value, rtol=1e-8, atol=1e-10, err_msg=column)
        for sample, families in full.fits.items():
            for family, columns in families.items():
                for column, value in columns.items():
                    got = reduced.fits[sample][family][column]
                    if value.dtype.kind in "OU":
                        assert list(got) == list(value)
                    else:
                        np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-8, err_msg=f"{sample} {family}")
        if part.rotary:
            for column, value in full.distances.items():
                if value.dtype.kind in "OU":
                    assert (reduced.distances[column] == value).all()
                else:
                    np.testing.assert_allclose(reduced.distances[column], value, rtol=1e-8, atol=1e-10)
        dense = np.einsum("hna,hnb->hab", part.wk[part.kv_index], part.wq)
        dense = basis @ dense @ basis.T
        s = np.linalg.eigvalsh((dense + dense.swapaxes(1, 2)) / 2)[:, ::-1]
        r = reduced.spectra.eig_S.shape[1]
        keep = np.r_[0:r // 2, 64 - (r - r // 2):64]  # the nonzero end of each side; the ambient zeros between
        np.testing.assert_allclose(reduced.spectra.eig_S, s[:, keep], atol=1e-10)
        assert ((reduced.statistics["n_pos"] + reduced.statistics["n_neg"]) <= 2 * part.wq.shape[1]).all()
        assert (reduced.statistics["n_zero_ambient"] == 64 - reduced.statistics["n_pos"]
                - reduced.statistics["n_neg"]).all()


def write_gguf(model, path, *, split: bool, mla_lengths: bool = False, drop: str | None = None,
               kv_lora_rank: int | None = None):
    """The tiny model's attention as llama.cpp's convert_hf_to_gguf.py writes DeepseekV2/V3 (float32): attn_kv_b
    whole, or split into attn_k_b (each head's k rows transposed, (H, kv_lora, nope)) and attn_v_b; with
    `mla_lengths` the absorbed files' key_length = kv_lora + rope beside key_length_mla = nope + rope; `drop` leaves
    a tensor out, `kv_lora_rank` overrides the metadata's (bad files)."""
    import gguf

    c = model.config
    writer = gguf.GGUFWriter(str(path), "deepseek2")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_head_count(c.num_attention_heads)
    writer.add_embedding_length(c.hidden_size)
    head_k = c.qk_nope_head_dim + c.qk_rope_head_dim
    if mla_lengths:
        writer.add_key_length(c.kv_lora_rank + c.qk_rope_head_dim)
        writer.add_value_length(c.kv_lora_rank)
        writer.add_uint32("deepseek2.attention.key_length_mla", head_k)
        writer.add_uint32("deepseek2.attention.value_length_mla", c.v_head_dim)
    else:
        writer.add_key_length(head_k)
        writer.add_value_length(c.v_head_dim)
    writer.add_rope_dimension_count(c.qk_rope_head_dim)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    if c.q_lora_rank is not None:
        writer.add_q_lora_rank(c.q_lora_rank)
    writer.add_kv_lora_rank(kv_lora_rank or c.kv_lora_rank)
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        tensors = {"attn_kv_a_mqa": a.kv_a_proj_with_mqa, "attn_kv_a_norm": a.kv_a_layernorm}
        tensors |= ({"attn_q_a": a.q_a_proj, "attn_q_a_norm": a.q_a_layernorm, "attn_q_b": a.q_b_proj}
                    if a.q_a_proj is not None else {"attn_q": a.q_proj})
        arrays = {stem: m.weight.detach().double().numpy() for stem, m in tensors.items()}
        kv_b = a.kv_b_proj.weight.detach().double().numpy()
        if split:
            heads = kv_b.reshape(c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
            arrays["attn_k_b"] = heads[:, :c.qk_nope_head_dim].swapaxes(1, 2)
            arrays["attn_v_b"] = heads[:, c.qk_nope_head_dim:]
        else:
            arrays["attn_kv_b"] = kv_b
        for stem, array in arrays.items():
            if f"blk.{i}.{stem}" != drop:
                writer.add_tensor(f"blk.{i}.{stem}.weight", array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v2_lite", "deepseek_v3"])
@pytest.mark.parametrize("split, mla_lengths", [(False, False), (True, False), (True, True)])
def test_gguf_parts_reproduce_model_logits(name, split, mla_lengths, tmp_path):
    """Both of llama.cpp's layouts of kv_b, read from a GGUF deepseek2 file, reproduce the model's logits (to the
    float32 the file stores)."""
    model = build(name)
    ckpt = opened(write_gguf(model, tmp_path / "m.gguf", split=split, mla_lengths=mla_lengths))
    spec = ckpt.spec.form
    assert (spec.architecture, spec.nope, spec.rope, spec.v_head_dim) == ("deepseek2", 8, 4, 8)
    assert spec.score_scale == model.model.layers[0].self_attn.scaling
    causal = np.tril(np.ones((48, 48), bool))
    for index, (x, logits, rms_q, rms_kv) in enumerate(trace(model)):
        got = predicted(spec, ckpt.read_layer(index), x, rms_q, rms_kv)
        assert np.abs(got - logits)[..., causal].max() / np.abs(got[..., causal]).max() < 1e-5


def test_gguf_bad_files_refused_in_one_line(tmp_path):
    model = build("deepseek_v3")
    with pytest.raises(ExtractError, match=r"GGUF file .* has no tensor blk.1.attn_k_b.weight \(layer 1\)"):
        opened(write_gguf(model, tmp_path / "a.gguf", split=True, drop="blk.1.attn_k_b"))
    path = write_gguf(model, tmp_path / "b.gguf", split=False, kv_lora_rank=12)
    with pytest.raises(ExtractError, match=r"GGUF tensor blk.0.attn_kv_a_mqa.weight has shape \(20, 64\), expected "
                                           r"\(16, 64\) from the file's metadata"):
        opened(path)
    path = write_gguf(model, tmp_path / "c.gguf", split=False, kv_lora_rank=80)
    with pytest.raises(ExtractError, match=r"GGUF file .*c.gguf \(its metadata\): kv_lora_rank 80 is larger than "
                                           r"the width N = 64"):
        opened(path)


def test_a_warehouse_keyed_without_part_refuses_a_latent_model_and_is_unchanged(tmp_path):
    """A warehouse built before head parts keys heads by (model, layer, head): a latent model is refused in one line
    before anything is written (a 'whole' model still extracts into it)."""
    import duckdb

    from headforms.warehouse.storing.store import create_schema

    _, folder = saved("deepseek_v3", tmp_path / "ckpt")
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    create_schema(con)
    table = con.execute("SELECT sql FROM duckdb_tables() WHERE table_name = 'heads'").fetchone()[0]
    old_key = table.replace("PRIMARY KEY(model, layer, head, part)", "PRIMARY KEY(model, layer, head)")
    assert old_key != table
    for (view,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall():
        con.execute(f"DROP VIEW IF EXISTS {view} CASCADE")
    con.execute("DROP TABLE heads")
    con.execute(old_key)
    con.close()
    before = db.read_bytes()
    result = CliRunner().invoke(main, ["extract", str(folder), "--db", str(db), "--qk-norm", "fold"])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "built before head parts" in lines[0] and "(nope, rope)" in lines[0]
    assert db.read_bytes() == before


def test_fp8_block_scaled_from_the_hub_is_its_dequantized_weights(tmp_path, monkeypatch):
    """DeepSeek-V3's own format: every projection of the attention FP8 with 128 x 128 block scales (24 x 40 here,
    partial at the edges), its scales in another shard, fetched by range from the local hub: the parts read are those
    of the weights dequantized by transformers' own CPU code (1e-12), and reproduce that dequantized model's logits."""
    import re

    from safetensors.torch import save_file

    from tests.hub_server import serve_hub
    from tests.test_hub import serve
    from tests.test_quantized import FP8_BLOCK, fp8_block

    model = build("deepseek_v3")
    state, dense = {k: v.clone() for k, v in model.state_dict().items()}, {}
    for name in [n for n in state if re.search(r"\.(q_a|q_b|kv_a|kv_b)_proj(_with_mqa)?\.weight$", n)]:
        tensors, dense[name] = fp8_block(state.pop(name).double().numpy())
        state |= {name[:-len("weight")] + suffix: t.contiguous() for suffix, t in tensors.items()}
    folder = tmp_path / "fp8"
    folder.mkdir()
    model.config.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": FP8_BLOCK}
    (folder / "config.json").write_text(json.dumps(config))
    scales = [n for n in state if n.endswith("scale_inv")]
    shards = {"model-00001-of-00002.safetensors": [n for n in state if n not in scales],
              "model-00002-of-00002.safetensors": scales}
    for shard, names in shards.items():
        save_file({n: state[n] for n in names}, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: shard for shard, names in shards.items() for n in names}}))
    with torch.no_grad():  # the model as its dequantized weights
        params = dict(model.named_parameters())
        for name, w in dense.items():
            params[name].copy_(torch.from_numpy(w))
    plain = tmp_path / "dense"
    model.save_pretrained(plain)
    server = serve_hub(monkeypatch, tmp_path, hf_home=False)
    try:
        serve(server, "org/deepseek-fp8", folder)
        hub, reference = opened("org/deepseek-fp8"), opened(plain)
        assert hub.quantization.startswith("fp8, 8-bit float, 24x40 blocks")
        causal = np.tril(np.ones((48, 48), bool))
        for index, (x, logits, rms_q, rms_kv) in enumerate(trace(model)):
            ours, theirs = hub.read_layer(index), reference.read_layer(index)
            for part in ("nope", "rope"):
                for a, b in zip(ours[part], theirs[part]):
                    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * np.abs(b).max())
            got = predicted(hub.spec.form, ours, x, rms_q, rms_kv)
            assert np.abs(got - logits)[..., causal].max() / np.abs(got[..., causal]).max() < 1e-6
    finally:
        server.close()


def extracted(name: str, tmp_path):
    """(model, db): the tiny model saved to tmp_path/ckpt (model 'ckpt') and extracted with --qk-norm fold."""
    model, folder = saved(name, tmp_path / "ckpt")
    db = tmp_path / "w.duckdb"
    result = CliRunner().invoke(main, ["extract", str(folder), "--db", str(db), "--qk-norm", "fold"])
    assert result.exit_code == 0, result.output
    return model, db


def behaved(db, monkeypatch) -> tuple[np.ndarray, pl.DataFrame]:
    """`headforms behaviour ckpt` on 3 repeated sequences of 6 tokens: the token ids it drew and its rows."""
    import duckdb

    from headforms.extract import behaviour as run_model

    drawn, draw = [], run_model.repeated_sequences
    monkeypatch.setattr(run_model, "repeated_sequences", lambda *a: drawn.append(draw(*a)) or drawn[-1])
    result = CliRunner().invoke(main, ["behaviour", "ckpt", "--db", str(db), "--length", "6", "--sequences", "3",
                                       "--seed", "5", "--resamples", "50"])
    assert result.exit_code == 0, result.output
    assert "ckpt: 8 heads" in result.output
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.sql("SELECT * FROM head_behaviour ORDER BY layer, head").pl()
    (tokens,) = drawn
    return tokens, rows


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2_lite"])
def test_behaviour_reproduces_the_self_logits_from_both_parts(name, tmp_path, monkeypatch):
    """`headforms behaviour` on a latent model (with q_lora_rank, and V2-lite without): a row per head, its self-logit
    and self-score the float64 model's own on the tokens drawn, and the stored parts, each with the latents' per-token
    factors the forward pass read, reproduce the self-logits at every position."""
    model, db = extracted(name, tmp_path)
    tokens, rows = behaved(db, monkeypatch)
    assert rows.select("layer", "head").rows() == [(layer, head) for layer in range(2) for head in range(4)]
    traced = trace(model, tokens=tokens)
    diagonals = np.concatenate([np.diagonal(logits, axis1=-2, axis2=-1).mean(axis=(0, 2))
                                for _, logits, _, _ in traced])
    causal = np.tril(np.ones((12, 12), bool))
    weights = [np.exp(logits - logits.max(-1, keepdims=True)) * causal
               for logits in (np.where(causal, logits, -np.inf) for _, logits, _, _ in traced)]
    own = np.concatenate([np.diagonal(w / w.sum(-1, keepdims=True), axis1=-2, axis2=-1)[..., 1:].mean(axis=(0, 2))
                          for w in weights])
    assert np.abs(diagonals).max() > 0.1
    np.testing.assert_allclose(rows["self_logit"].to_numpy(), diagonals, atol=1e-5)
    np.testing.assert_allclose(rows["form_self_logit"].to_numpy(), diagonals, atol=1e-5)
    np.testing.assert_allclose(rows["self_score"].to_numpy(), own, atol=1e-5)
    assert (rows["bias_self_logit"] == 0).all() and rows["reproduction_error"].max() < 1e-5


def test_behaviour_without_the_kv_latent_factor_misses_the_self_logits(tmp_path, monkeypatch):
    """The check can fail: the same run with 1/rms_kv(x_i) taken as 1 leaves the nope part unscaled, and the stored
    reproduction error shows it; a run that finds no latent norms to read is refused in one line."""
    from headforms.extract import behaviour as run_model

    _, db = extracted("deepseek_v3", tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(run_model, "QK_NORMS", tuple(names for names in run_model.QK_NORMS  # the latents' not looked for
                                                   if "kv_a_layernorm" not in names))
        result = CliRunner().invoke(main, ["behaviour", "ckpt", "--db", str(db), "--length", "4"])
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 1 and "Traceback" not in result.output and errors == [
        "Error: ckpt: the part nope is scored by 1/(rms_q(x_i) rms_kv(x_j)), but layer 0's attention has no norm "
        "behaviour can read rms_q from"]
    run = run_model.run

    def without_rms_kv(*args, **kwargs):
        taken = run(*args, **kwargs)
        for layer in taken.layers:
            layer.k_factor = np.ones_like(layer.k_factor)
        return taken

    monkeypatch.setattr(run_model, "run", without_rms_kv)
    _, rows = behaved(db, monkeypatch)
    assert rows["reproduction_error"].max() > 1e-2 * rows["self_logit"].abs().max()


def test_behaviour_views_type_a_latent_head_by_each_part(tmp_path, monkeypatch):
    """behaviour_by_parity, behaviour_correlations and behaviour_intervals of a latent model: a row set per part,
    each over all its heads typed by that part's parity, the medians those of the joined rows; the behaviour figure
    draws a panel per part, the report's page a figure per part."""
    import duckdb

    _, db = extracted("deepseek_v3", tmp_path)
    behaved(db, monkeypatch)
    with duckdb.connect(str(db), read_only=True) as con:
        joined = con.sql("SELECT h.part, h.parity, b.self_score, h.pairing FROM head_behaviour b "
                         "JOIN heads h USING (model, layer, head)").pl()
        by_parity = con.sql("SELECT * FROM behaviour_by_parity").pl()
        correlations = con.sql("SELECT * FROM behaviour_correlations").pl()
        intervals = con.sql("SELECT part, count(DISTINCT figure) FROM behaviour_intervals GROUP BY part "
                            "ORDER BY part").fetchall()
    assert joined.height == 16 and intervals == [("nope", 4), ("rope", 4)]
    typed = by_parity.filter(pl.col("parity") != "I+ - I-")
    assert set(typed["part"]) == {"nope", "rope"}
    for part in ("nope", "rope"):
        assert typed.filter(pl.col("part") == part)["heads"].sum() == joined.filter(
            (pl.col("part") == part) & pl.col("parity").is_not_null()).height == 8
    for row in typed.iter_rows(named=True):
        group = joined.filter((pl.col("part") == row["part"]) & (pl.col("parity") == row["parity"]))
        assert row["heads"] == group.height
        assert row["median_self_score"] == pytest.approx(float(np.median(group["self_score"].to_numpy())))
        assert row["self_score_low"] <= row["median_self_score"] <= row["self_score_high"]
    assert set(correlations["part"]) == {"nope", "rope"} and set(correlations["heads"]) == {8}
    for part in ("nope", "rope"):
        pairs = joined.filter(pl.col("part") == part)
        got = correlations.filter((pl.col("part") == part) & (pl.col("score") == "self_score")
                                  & (pl.col("statistic") == "pairing"))["spearman"].item()
        assert got == pytest.approx(stats.spearmanr(pairs["self_score"], pairs["pairing"]).statistic)
    from headforms import api
    from headforms.warehouse.publishing import figures

    titles = []
    monkeypatch.setattr(figures, "_title", lambda ax, text, *a, **k: titles.append(text))
    with api.connect(db) as con:
        figures.behaviour_self_score(con, tmp_path / "behaviour.png")
    assert [title.split("\n")[0] for title in titles] == ["ckpt (nope) (8 heads)", "ckpt (rope) (8 heads)"]
    assert CliRunner().invoke(main, ["report", "--db", str(db), "--out", str(tmp_path / "r")]).exit_code == 0
    page = (tmp_path / "r" / "model-ckpt.html").read_text()
    assert 'id="behaviour-nope"' in page and 'id="behaviour-rope"' in page


def test_behaviour_refuses_a_latent_model_where_its_intervals_are_keyed_without_part(tmp_path):
    """A warehouse whose behaviour_intervals were built before parts (keyed by model, parity, figure) cannot hold a
    latent model's intervals per part: refused in one line before the forward pass, nothing written."""
    import duckdb

    _, db = extracted("deepseek_v3", tmp_path)
    with duckdb.connect(str(db)) as con:
        for (view,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall():
            con.execute(f"DROP VIEW IF EXISTS {view} CASCADE")
        con.execute("DROP TABLE behaviour_intervals")
        con.execute("CREATE TABLE behaviour_intervals (model VARCHAR NOT NULL, parity VARCHAR NOT NULL, figure "
                    "VARCHAR NOT NULL, estimate DOUBLE, low DOUBLE, high DOUBLE, resamples INTEGER NOT NULL, seed "
                    "BIGINT NOT NULL, PRIMARY KEY (model, parity, figure))")
    result = CliRunner().invoke(main, ["behaviour", "ckpt", "--db", str(db), "--length", "4"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output  # before the forward pass
    assert result.output.startswith("Error: ckpt stores each head as its parts (nope, rope), and this warehouse's "
                                    "behaviour_intervals were built before parts")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT (SELECT count(*) FROM head_behaviour) + (SELECT count(*) FROM "
                           "behaviour_intervals)").fetchall() == [(0,)]


def test_the_report_page_names_the_parts_and_their_head_sizes(tmp_path):
    _, folder = saved("deepseek_v3", tmp_path / "ckpt")
    db = tmp_path / "w.duckdb"
    assert CliRunner().invoke(main, ["extract", str(folder), "--db", str(db), "--qk-norm", "fold"]).exit_code == 0
    assert CliRunner().invoke(main, ["report", "--db", str(db), "--out", str(tmp_path / "r")]).exit_code == 0
    page = (tmp_path / "r" / "model-ckpt.html").read_text()
    assert "N = 64, each head as parts nope (n = 8), rope (n = 4);" in page and "n = 12" not in page
