"""Hybrids (Jamba, Granite 4, Qwen3-Next, Falcon-H1) and attention sinks (gpt-oss), found by discovery: only the
softmax-attention layers have heads, each stored under its index in the stack, and each layer's form reproduces the
tiny model's own logits (at nonzero distances too) there; a head's sink logit is the model's own, and with it the
form reproduces the probabilities the model gives its keys."""
from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from headforms import api
from headforms.cli import main
from headforms.compute.rotary import Rotation
from headforms.extract import ReadOptions, open_checkpoint
from tests import tiny_models as tm
from tests.test_positions import POSITIONS
from tests.test_rope_families import logit_error

_SHAPE = dict(num_hidden_layers=4, hidden_size=32, intermediate_size=64, vocab_size=tm.VOCAB, num_attention_heads=4,
              num_key_value_heads=2, pad_token_id=0)
_MAMBA = dict(mamba_d_state=4, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_chunk_size=8)
# name -> (model class, config class, config kwargs, attention layers or None for all, positional, QK-norm kind)
HYBRIDS = {
    "jamba": ("JambaForCausalLM", "JambaConfig", _SHAPE | dict(attn_layer_period=2, attn_layer_offset=1,
                                                              expert_layer_period=4, num_experts=2, mamba_d_state=4,
                                                              mamba_dt_rank=4), (1, 3), "none", None),
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", _SHAPE | _MAMBA | dict(
        layer_types=["mamba", "attention", "mamba", "attention"], num_local_experts=2, num_experts_per_tok=1),
        (1, 3), "none", None),
    "granitemoehybrid_rope": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", _SHAPE | _MAMBA | dict(
        layer_types=["attention", "mamba", "mamba", "attention"], num_local_experts=2, num_experts_per_tok=1,
        position_embedding_type="rope"), (0, 3), "rope", None),
    "qwen3_next": ("Qwen3NextForCausalLM", "Qwen3NextConfig", _SHAPE | dict(
        head_dim=8, layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8),
        (1, 3), "rope", "head"),
    "falcon_h1": ("FalconH1ForCausalLM", "FalconH1Config", _SHAPE | dict(
        head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=4, mamba_n_groups=1,
        mamba_chunk_size=8), None, "rope", None),
    # muP multipliers: k times key_multiplier inside the module (the score scale then measured by the logits), the
    # module's input times attention_in_multiplier (the form is on what the attention module reads)
    "falcon_h1_multipliers": ("FalconH1ForCausalLM", "FalconH1Config", _SHAPE | dict(
        head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=4, mamba_n_groups=1,
        mamba_chunk_size=8, key_multiplier=0.5, attention_in_multiplier=2.0), None, "rope", None),
}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test proves its families afresh, in a cache of its own."""
    monkeypatch.setenv("HEADFORMS_CACHE", str(tmp_path / "cache"))


def _saved(name: str, folder):
    model_class, config_class, kwargs, *_ = HYBRIDS[name]
    model = tm.build_model(model_class, config_class, kwargs)
    return model, tm.save(model, folder / name)


def _trace(model, positions: np.ndarray, gated: bool) -> tm.Trace:
    """The model run at `positions`: per layer index in its stack (None where it has no softmax attention), each
    attention module's input x, its probabilities and its q/k projections' outputs (q: the query rows only where
    q_proj also holds an output gate, Qwen3-Next's)."""
    n_layers = model.config.num_hidden_layers
    inputs, probs, q, k = ([None] * n_layers for _ in range(4))
    hooks = []
    for name, module in model.named_modules():
        if name.endswith(".self_attn") and hasattr(module, "q_proj"):
            layer = int(name.split(".")[-2])
            hooks += [module.register_forward_pre_hook(
                          lambda m, args, kw, i=layer: inputs.__setitem__(i, kw.get("hidden_states", args and args[0])),
                          with_kwargs=True),
                      module.register_forward_hook(lambda m, args, out, i=layer: probs.__setitem__(i, out[1])),
                      module.q_proj.register_forward_hook(lambda m, args, out, i=layer: q.__setitem__(i, out)),
                      module.k_proj.register_forward_hook(lambda m, args, out, i=layer: k.__setitem__(i, out))]
    tokens = torch.randint(3, tm.VOCAB, (2, len(positions)), generator=torch.Generator().manual_seed(3))
    try:
        with torch.no_grad():
            model(input_ids=tokens, attention_mask=torch.ones_like(tokens),
                  position_ids=torch.as_tensor(positions).repeat(2, 1))
    finally:
        for hook in hooks:
            hook.remove()
    heads, n = model.config.num_attention_heads, model.config.head_dim if hasattr(model.config, "head_dim") else 8

    def arrays(values, query=False):
        out = [None if v is None else v.detach().double().numpy() for v in values]
        if query and gated:
            out = [None if v is None else v.reshape(*v.shape[:2], heads, 2, n)[..., 0, :].reshape(*v.shape[:2], -1)
                   for v in out]
        return out

    return tm.Trace(inputs=arrays(inputs), probs=arrays(probs), q=arrays(q, query=True), k=arrays(k),
                    allowed=np.tril(np.ones((len(positions), len(positions)), bool)))


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_attention_layers_are_stored_under_their_own_indices(name, tmp_path):
    """extract reads the attention layers only: the summary line says how many of how many, models.attention_layers
    and the layers and heads rows hold the stack's own indices, status counts them, and check finds nothing wrong."""
    expected, positional = HYBRIDS[name][3], HYBRIDS[name][4]
    _, folder = _saved(name, tmp_path)
    db = tmp_path / "w.duckdb"
    result = CliRunner().invoke(main, ["extract", str(folder), "--db", str(db), "--qk-norm", "fold"])
    assert result.exit_code == 0, result.output
    layers = expected or (0, 1, 2, 3)
    summary = result.output.splitlines()[-2]
    assert f"{len(layers)} layers, {4 * len(layers)} heads" in summary
    assert ("2 of its 4 layers attention" in summary) == (expected is not None)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT attention_layers, positional_encoding, n_layers FROM models").fetchall() == [
            (list(layers), positional, 4)]
        assert [r[0] for r in con.sql("SELECT layer FROM layers ORDER BY layer").fetchall()] == list(layers)
        assert con.sql("SELECT layer, count(*) FROM heads GROUP BY layer ORDER BY layer").fetchall() == [
            (layer, 4) for layer in layers]
    status = api.status(db).models.row(0, named=True)
    assert (status["n_layers"], status["attention_layers"], status["layers_done"], status["heads_expected"],
            status["heads"]) == (4, len(layers), len(layers), 4 * len(layers), 4 * len(layers))
    assert [f for f in api.check(db) if f.level == "violation"] == []


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_each_attention_layer_reproduces_its_logits_at_every_distance(name, tmp_path):
    """The form read for layer i (its index in the stack) reproduces that layer's own logits at POSITIONS' distances
    (RoPE's rotation where the family rotates, the identity for NoPE); another attention layer's form does not."""
    model, folder = _saved(name, tmp_path)
    expected, positional, kind = HYBRIDS[name][3:]
    ckpt = open_checkpoint(str(folder), ReadOptions(qk_norm="fold"))
    spec = ckpt.spec
    assert spec.layers == (expected or (0, 1, 2, 3)) and spec.positional == positional
    r = spec.rope
    rotation = Rotation.of(r.pairing, r.frequencies) if r else Rotation.of("split-half", np.zeros(spec.head_dim // 2))
    trace = _trace(model, POSITIONS, gated=name == "qwen3_next")
    for layer in spec.layers:
        assert logit_error(ckpt, trace, layer, model, rotation, kind) < 1e-5
    first, last = spec.layers[0], spec.layers[-1]
    trace.inputs[first], trace.probs[first] = trace.inputs[last], trace.probs[last]  # layer first's form, last's run
    trace.q[first], trace.k[first] = trace.q[last], trace.k[last]
    assert logit_error(ckpt, trace, first, model, rotation, kind) > 1e-3
    ckpt.close()


def test_a_multiplier_on_k_is_measured_into_the_score_scale(tmp_path):
    """Falcon-H1's key_multiplier scales k inside the attention module: the recorded score scale is the module's
    scaling times it, and `architectures` says it was measured (the logits test above proves it at every distance)."""
    _, folder = _saved("falcon_h1_multipliers", tmp_path)
    ckpt = open_checkpoint(str(folder))
    assert ckpt.spec.score_scale == pytest.approx(0.5 * 8**-0.5, rel=1e-6)  # measured: log-probabilities
    ckpt.close()
    rows = [row for row in json.loads(CliRunner().invoke(main, ["architectures", "--format", "json"]).output)
            if row["family"] == "falcon_h1"]
    assert rows and "its logits are 0.5 x the module's scaling times q.k" in rows[0]["notes"]


def test_a_layer_without_attention_is_out_of_range_in_one_line(tmp_path):
    _, folder = _saved("jamba", tmp_path)
    ckpt = open_checkpoint(str(folder))
    with pytest.raises(Exception, match=r"^layer 0 out of range: .* has 4 layers, of which \[1, 3\] are attention$"):
        ckpt.read_layer(0)
    ckpt.close()


def test_sink_logits_are_stored_and_with_the_form_give_the_models_probabilities(tmp_path):
    """gpt-oss: heads.sink_logit is each head's `sinks` parameter, and exp(form logit) / (exp(sink) + sum over keys)
    is the probability the model gives each key (distance 0: every position 0); a family without sinks has NULL."""
    model = tm.build("gpt_oss")
    folder = tm.save(model, tmp_path / "gpt_oss")
    db = tmp_path / "w.duckdb"
    assert CliRunner().invoke(main, ["extract", str(folder), "--db", str(db)]).exit_code == 0
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.sql("SELECT layer, head, sink_logit FROM heads ORDER BY layer, head").fetchall()
    sinks = np.stack([layer.self_attn.sinks.detach().numpy() for layer in model.model.layers])
    assert [(layer, head) for layer, head, _ in stored] == [(i, h) for i in range(2) for h in range(4)]
    np.testing.assert_array_equal(np.array([s for _, _, s in stored]).reshape(2, 4), sinks)
    ckpt = open_checkpoint(str(folder))
    trace = tm.trace("gpt_oss", model)  # position_ids 0: RoPE is the identity
    for layer in range(2):
        w_q, w_k = ckpt.read_layer(layer)
        x = trace.inputs[layer]
        logits = ckpt.spec.score_scale * np.einsum("hna,bia,hnc,bjc->bhij", w_q, x, w_k[ckpt.spec.kv_index], x)
        logits = np.where(trace.allowed, logits, -np.inf)
        z = np.exp(sinks[layer])[None, :, None] + np.exp(logits).sum(-1)
        # rtol: transformers' float32 yarn factor on cos and sin
        np.testing.assert_allclose(np.exp(logits) / z[..., None], trace.probs[layer], rtol=1e-6, atol=1e-9)
    ckpt.close()
    tm.save(tm.build("qwen2"), tmp_path / "qwen2")
    assert CliRunner().invoke(main, ["extract", str(tmp_path / "qwen2"), "--db", str(db)]).exit_code == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT count(*), count(sink_logit) FROM heads WHERE model = 'qwen2'").fetchall() == [(8, 0)]


def test_architectures_says_what_discovery_found_of_a_hybrid_and_of_sinks(tmp_path):
    """The verdicts' rows: Granite 4 names RoPE parameters but does not rotate; every hybrid is read by its
    attention layers; gpt-oss's sinks are proven."""
    for name in ("granitemoehybrid", "qwen3_next"):
        _, folder = _saved(name, tmp_path)
        open_checkpoint(str(folder), ReadOptions(qk_norm="fold")).close()
    open_checkpoint(str(tm.save(tm.build("gpt_oss"), tmp_path / "gpt_oss"))).close()
    rows = {row["family"]: row for row in json.loads(CliRunner().invoke(
        main, ["architectures", "--format", "json"]).output) if row["format"] == "hf (discovered)"}
    assert rows["granitemoehybrid"]["positional"] == "none"
    assert "its config names RoPE parameters, but its attention does not rotate (none)" in \
        rows["granitemoehybrid"]["notes"]
    for name in ("granitemoehybrid", "qwen3_next"):
        assert "a hybrid: its softmax-attention layers are read, under their own indices" in rows[name]["notes"]
    assert rows["qwen3_next"]["packing"] == "separate Q (per head: query rows, then gate rows), K"
    assert "a sink logit per head (heads.sink_logit)" in rows["gpt_oss"]["notes"]


@pytest.mark.parametrize("name", ["jamba", "qwen3_next", "falcon_h1_multipliers", "gpt_oss"])
def test_behaviour_reproduces_the_self_logits_of_the_attention_layers(name, tmp_path):
    """behaviour's forward pass meets the forms of the attention layers only, by their indices in the stack: each
    head's row is there and its form (QK-norm factors applied, Qwen3-Next's) gives the model's self-logits."""
    if name in HYBRIDS:
        _, folder = _saved(name, tmp_path)
    else:
        folder = tm.save(tm.build(name), tmp_path / name)
    db = str(tmp_path / "w.duckdb")
    assert CliRunner().invoke(main, ["extract", str(folder), "--db", db, "--qk-norm", "fold"]).exit_code == 0
    result = CliRunner().invoke(main, ["behaviour", str(folder), "--db", db, "--length", "8", "--sequences", "2"])
    assert result.exit_code == 0, result.output
    with duckdb.connect(db, read_only=True) as con:
        rows = con.sql("SELECT layer, head, reproduction_error, self_logit FROM head_behaviour ORDER BY layer, head"
                       ).fetchall()
        heads = con.sql("SELECT layer, head FROM heads ORDER BY layer, head").fetchall()
    assert [(layer, head) for layer, head, _, _ in rows] == heads
    largest = max(abs(logit) for *_, logit in rows)
    assert largest > 0.1 and max(error for _, _, error, _ in rows) < 1e-4 * largest
