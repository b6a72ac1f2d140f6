"""RoPE beyond distance 0: R(delta) and L_delta = W_K^T R(delta) W_Q against dense algebra, the tiny
models' own attention logits at real position pairs (i, j), and the distance_profiles table."""
from __future__ import annotations

import json
from dataclasses import replace

import duckdb
import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner

from headforms import api, cli
from headforms.compute.reduction import reduce_factors
from headforms.compute.rotary import DEFAULT_DISTANCES, Rotation, distance_forms, distance_profiles
from headforms.extract.checkpoint import ReadOptions
from headforms.extract.formats.gguf_file import open_gguf
from headforms.extract.formats.hf import open_hf_folder
from headforms.extract.layouts.spec import model_spec
from tests import tiny_models as tm
from tests.dense import dense_reference
from tests.test_gguf import write_gguf

RNG = np.random.default_rng(11)
# Query positions with gaps: every pair (i, j) with j <= i gives a distance delta = pos_i - pos_j up to 90.
POSITIONS = np.array([0, 1, 3, 8, 20, 47, 90])
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0.25, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64, "rope_theta": 500000.0}


def dense_rotation(pairing: str, frequencies: np.ndarray, delta: float, n: int) -> np.ndarray:
    """R(delta) written out: 2 x 2 blocks [[cos, -sin], [sin, cos]] on the planes of the pairing."""
    R = np.eye(n)
    half = len(frequencies)
    for p, f in enumerate(frequencies):
        i, j = (p, p + half) if pairing == "split-half" else (2 * p, 2 * p + 1)
        c, s = np.cos(f * delta), np.sin(f * delta)
        R[np.ix_([i, j], [i, j])] = [[c, -s], [s, c]]
    return R


def parity_of(stats: dict, tolerance: float = 1 / 50) -> str:
    c, d = stats["c_sym"], stats["d_sym"]
    return "II" if c + d <= tolerance else ("I+" if c > d else "I-")


@pytest.mark.parametrize("pairing", ["split-half", "interleaved"])
def test_rotation_matrix_is_the_pairing(pairing):
    freq = np.array([1.0, 0.3, 0.02])
    rotation = Rotation.of(pairing, freq)
    for delta in (0, 1, 5, 1000):
        np.testing.assert_allclose(rotation.matrix(delta, 10), dense_rotation(pairing, freq, delta, 10), atol=1e-13)
    np.testing.assert_array_equal(rotation.matrix(0, 10), np.eye(10))


@pytest.mark.parametrize("pairing", ["split-half", "interleaved"])
@pytest.mark.parametrize("N", [40, 12, 5])
def test_distance_profiles_equal_dense_forms(pairing, N):
    """Every column of every (delta, head) against the N x N form W_K^T R(delta) W_Q, grouped-query heads,
    a partial rotation (6 of n = 8 coordinates); N = 12 < 2n reduces to r = N, N = 5 < n too."""
    n, H, Hkv = 8, 4, 2
    wq, wk = RNG.standard_normal((H, n, N)), RNG.standard_normal((Hkv, n, N))
    kv = np.arange(H) // 2
    freq = 10000.0 ** -(np.arange(0, 6, 2) / 6)
    rotation = Rotation.of(pairing, freq)
    deltas = [0, 1, 7, 300]
    factors = reduce_factors(wq, wk, kv)
    got = distance_profiles(factors, n, rotation, deltas)
    assert got["delta"].tolist() == [[d] * H for d in deltas]
    for t, delta in enumerate(deltas):
        R = dense_rotation(pairing, freq, delta, n)
        for h in range(H):
            L = wk[kv[h]].T @ R @ wq[h]
            ref = dense_reference(L, n)
            for column in ("frobenius", "symmetric_energy", "a", "b", "c", "d", "pairing"):
                assert got[column][t, h] == pytest.approx(ref[column], rel=1e-9, abs=1e-12), (column, delta, h)
            assert got["parity"][t, h] == parity_of(ref)
    # the reduced forms themselves: U l_delta U^T = L_delta with U = A R^-1, A = [W_K^T | W_Q^T]
    if N >= 2 * n:  # then [W_K^T | W_Q^T] = U R with R invertible
        l = distance_forms(factors, n, rotation, np.array([7]))[0]
        A = np.concatenate([wk[kv[1]], wq[1]]).T
        U = np.linalg.solve(factors[1].T, A.T).T
        np.testing.assert_allclose(U @ l[1] @ U.T, wk[kv[1]].T @ dense_rotation(pairing, freq, 7, n) @ wq[1],
                                   atol=1e-10)


def test_rotation_changes_the_form():
    """A rotation of the wrong pairing gives other forms: the tests can tell pairings apart."""
    N, n = 24, 8
    wq, wk = RNG.standard_normal((1, n, N)), RNG.standard_normal((1, n, N))
    factors = reduce_factors(wq, wk, np.array([0]))
    freq = np.array([1.0, 0.5, 0.25, 0.125])
    split, inter = (distance_profiles(factors, n, Rotation.of(p, freq), [3]) for p in ("split-half", "interleaved"))
    assert abs(split["a"][0, 0] - inter["a"][0, 0]) > 1e-3


# ---- the tiny models' own logits at real positions -------------------------------------------------------

def rope_trace(model, length: int = len(POSITIONS), batch: int = 2, seed: int = 3):
    """Attention inputs x (per layer, (B, T, N)) and probabilities (B, H, T, T) with position_ids = POSITIONS."""
    tokens = torch.randint(0, tm.VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
    inputs = []
    hooks = [m.register_forward_pre_hook(
        lambda m, args, kwargs: inputs.append(kwargs.get("hidden_states", args[0] if args else None)),
        with_kwargs=True) for m in tm._attention_modules(model)]
    try:
        with torch.no_grad():
            out = model(input_ids=tokens, attention_mask=torch.ones_like(tokens), output_attentions=True,
                        position_ids=torch.as_tensor(POSITIONS[:length]).repeat(batch, 1))
    finally:
        for hook in hooks:
            hook.remove()
    return [x.double().numpy() for x in inputs], [p.double().numpy() for p in out.attentions]


def logit_error_at_positions(ckpt, inputs, probs, layer: int) -> float:
    """max |model - predicted| / max |predicted| of the logit differences to key 0 over causal pairs, with
    predicted_ij = scale * x_j^T L_(pos_i - pos_j) x_i, L_delta = U l_delta U^T from our reduction's factors."""
    spec = ckpt.spec
    w_q, w_k = ckpt.read_layer(layer)
    kv = spec.kv_index
    factors = reduce_factors(w_q, w_k, kv)
    rotation = Rotation.of(spec.rope.pairing, spec.rope.frequencies)
    deltas = np.unique(POSITIONS[:, None] - POSITIONS[None, :])
    deltas = deltas[deltas >= 0]
    l = distance_forms(factors, spec.head_dim, rotation, deltas)              # (D, H, r, r)
    x = inputs[layer]                                                           # (B, T, N)
    coords = np.stack([np.linalg.solve(factors[h].T,                    # U^T x = R^-T A^T x
                                       np.concatenate([w_k[kv[h]], w_q[h]]) @ x.reshape(-1, x.shape[-1]).T)
                       for h in range(spec.n_heads)]).reshape(spec.n_heads, -1, *x.shape[:2])  # (H, r, B, T)
    T = x.shape[1]
    predicted = np.zeros((x.shape[0], spec.n_heads, T, T))
    allowed = np.tril(np.ones((T, T), bool))
    for i in range(T):
        for j in range(i + 1):
            t = np.searchsorted(deltas, POSITIONS[i] - POSITIONS[j])
            predicted[:, :, i, j] = spec.score_scale * np.einsum("hrb,hrs,hsb->bh", coords[:, :, :, j], l[t],
                                                                 coords[:, :, :, i])
    p = probs[layer]
    logp = np.log(np.where(allowed, p, 1.0))
    model_diff = (logp - logp[..., :1])[..., allowed]
    predicted_diff = (predicted - predicted[..., :1])[..., allowed]
    scale = np.abs(predicted_diff).max()
    assert 0.1 < scale < 100, "logits should be O(1) for a meaningful comparison"
    return np.abs(model_diff - predicted_diff).max() / scale


HF_CASES = {
    "llama": {},
    "gpt_neox": {},   # partial rotary: 2 of 8 coordinates
    "qwen2": {},      # grouped-query heads
    "mistral": {},    # explicit head_dim
    "gptj": {},       # rotary_dim 4 of 8 (a top-level setting), rotate_every_two pairs
    "llama_linear": {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
    "llama_llama3": {"rope_parameters": LLAMA3},
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_distance_forms_reproduce_model_logits(case, tmp_path):
    name = case.split("_")[0] if case.startswith("llama_") else case
    model = tm.build(name, **HF_CASES[case])
    tm.save(model, tmp_path)
    ckpt = open_hf_folder(tmp_path, name="tiny", source=str(tmp_path), options=ReadOptions(revision="r"))
    assert ckpt.spec.rope.refusal is None
    assert ckpt.spec.rope.pairing == ("interleaved" if name == "gptj" else "split-half")
    inputs, probs = rope_trace(model)
    for layer in range(ckpt.spec.n_layers):
        assert logit_error_at_positions(ckpt, inputs, probs, layer) < 1e-5
    # the same forms without the rotation (distance 0 everywhere) do not reproduce the logits
    flat = replace(ckpt, spec=replace(ckpt.spec, rope=_no_rotation(ckpt.spec.rope)))
    assert logit_error_at_positions(flat, inputs, probs, 0) > 1e-3


def _no_rotation(rope):
    return replace(rope, frequencies=tuple(0.0 for _ in rope.frequencies))


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permute of Q/K rows: within each head, split halves to adjacent pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_gguf_permuted_llama_reproduces_model_logits(tmp_path):
    """A GGUF written from the tiny llama with llama.cpp's row permutation: interleaved pairing, same logits."""
    model = tm.build("llama_gqa")
    weights = {}
    for i, layer in enumerate(model.model.layers):
        for kind, proj, heads in (("q", layer.self_attn.q_proj, 4), ("k", layer.self_attn.k_proj, 2)):
            weights[f"blk.{i}.attn_{kind}.weight"] = llama_cpp_permute(
                proj.weight.detach().numpy(), heads).astype(np.float32)
    write_gguf(tmp_path / "tiny.gguf", n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, weights=weights)
    ckpt = open_gguf(tmp_path / "tiny.gguf", name="tiny", source="tiny.gguf", options=ReadOptions(revision="r"))
    rope = ckpt.spec.rope
    assert (rope.pairing, rope.theta, rope.rotary_dims) == ("interleaved", model.config.rope_parameters["rope_theta"], 8)
    inputs, probs = rope_trace(model)
    for layer in range(2):
        assert logit_error_at_positions(ckpt, inputs, probs, layer) < 1e-5
    wrong = replace(ckpt, spec=replace(ckpt.spec, rope=_with_pairing(rope, "split-half")))
    assert logit_error_at_positions(wrong, inputs, probs, 0) > 1e-3


def _with_pairing(rope, pairing):
    return replace(rope, pairing=pairing)


# ---- RoPE settings from configs ---------------------------------------------------------------------------

@pytest.mark.parametrize("params", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    LLAMA3,
    {**LLAMA3, "partial_rotary_factor": 0.5},
])
def test_frequencies_equal_transformers(params):
    """Our frequencies against transformers' own RoPE initialisers (computed in float32 there)."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, rope_parameters=dict(params))
    raw = json.loads(config.to_json_string())
    _, spec = model_spec(raw)
    rotary = ROPE_INIT_FUNCTIONS.get(params["rope_type"])
    expected = (rotary(config, "cpu")[0] if rotary else
                1.0 / (params["rope_theta"] ** (torch.arange(0, 32, 2, dtype=torch.float) / 32))).double().numpy()
    assert spec.rope.refusal is None and spec.rope.rotary_dims == int(32 * params.get("partial_rotary_factor", 1))
    np.testing.assert_allclose(spec.rope.frequencies, expected, rtol=1e-6)


def test_unimplemented_scaling_is_refused_beyond_distance_zero(tmp_path):
    """dynamic NTK: distance 0 only (recorded why); asking for more is one Error line, no warehouse left."""
    model = tm.build("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    tm.save(model, tmp_path / "dyn")
    db = tmp_path / "w.duckdb"
    result = CliRunner().invoke(cli.main, ["extract", str(tmp_path / "dyn"), "--db", str(db), "--distances", "0,4"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        "Error: RoPE beyond distance 0 is not computed for this llama checkpoint: dynamic NTK changes the "
        "frequencies with the sequence length; pass --distances 0")
    assert not db.exists()
    api.extract(str(tmp_path / "dyn"), db=db)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select distinct delta from distance_profiles").fetchall() == [(0,)]
        distances, rope = con.execute("select distances, config->'rope' from models").fetchone()
        assert distances == [0] and "dynamic" in json.loads(rope)["refusal"]


@pytest.mark.parametrize("value", ["a,b", "-1", "1,,2"])
def test_bad_distances_are_usage_errors(value, tmp_path):
    result = CliRunner().invoke(cli.main, ["extract", "pkg:nothing", "--db", str(tmp_path / "w.duckdb"),
                                           "--distances", value])
    assert result.exit_code == 2 and "--distances" in result.output
    assert not (tmp_path / "w.duckdb").exists()


# ---- the warehouse ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_warehouse(tmp_path_factory):
    """A tiny GQA llama and a tiny GPT-2 (no RoPE) extracted with distances 0, 1, 5, 64."""
    folder = tmp_path_factory.mktemp("pos")
    for name in ("llama_gqa", "gpt2"):
        tm.save(tm.build(name), folder / name)
        api.extract(str(folder / name), db=folder / "w.duckdb", distances=(64, 0, 1, 5, 1))
    return folder


def test_distance_zero_equals_heads(tiny_warehouse):
    with duckdb.connect(str(tiny_warehouse / "w.duckdb"), read_only=True) as con:
        joined = con.sql("""SELECT h.*, d.frobenius AS d_frobenius, d.symmetric_energy AS d_symmetric_energy,
                                   d.a AS d_a, d.b AS d_b, d.c AS d_c, d.d AS d_d, d.parity AS d_parity,
                                   d.pairing AS d_pairing
                            FROM heads h JOIN distance_profiles d USING (model, layer, head) WHERE d.delta = 0""").pl()
        heads = con.execute("select count(*) from heads where model = 'llama_gqa'").fetchone()[0]
    assert joined.height == heads == 8
    for column in ("frobenius", "symmetric_energy", "a", "b", "c", "d", "pairing"):
        np.testing.assert_allclose(joined[f"d_{column}"], joined[column], rtol=1e-12)
    assert joined["d_parity"].to_list() == joined["parity"].to_list()


def test_distance_profiles_rows_and_values(tiny_warehouse):
    """One row per head and distance (only for the RoPE model), each equal to the dense L_delta's statistics."""
    folder = tiny_warehouse
    with duckdb.connect(str(folder / "w.duckdb"), read_only=True) as con:
        rows = con.sql("select * from distance_profiles order by layer, head, delta").pl()
        models = con.execute("select model, distances, fold_norm from models order by model").fetchall()
    assert models == [("gpt2", None, None), ("llama_gqa", [0, 1, 5, 64], None)]
    assert set(rows["model"]) == {"llama_gqa"} and rows.height == 2 * 4 * 4
    ckpt = open_hf_folder(folder / "llama_gqa", name="t", source="t", options=ReadOptions(revision="r"))
    freq = np.asarray(ckpt.spec.rope.frequencies)
    for (layer, head, delta), row in zip(rows.select("layer", "head", "delta").rows(), rows.iter_rows(named=True)):
        w_q, w_k = ckpt.read_layer(layer)
        L = w_k[ckpt.spec.kv_index[head]].T @ dense_rotation("split-half", freq, delta, 8) @ w_q[head]
        ref = dense_reference(L, 8)
        for column in ("frobenius", "symmetric_energy", "a", "b", "c", "d", "pairing"):
            assert row[column] == pytest.approx(ref[column], rel=1e-9), (layer, head, delta, column)
        assert row["parity"] == parity_of(ref)


@pytest.mark.parametrize("zero_head", [False, True], ids=["as extracted", "with a zero head"])
def test_parity_by_distance_view(tiny_warehouse, tmp_path, zero_head):
    """The view against polars; also where one head's profiles are those of a zero form (NULL statistics and
    parity, as stored for S = 0): it counts in `heads` and in every percentage's denominator."""
    db = tmp_path / "w.duckdb"
    db.write_bytes((tiny_warehouse / "w.duckdb").read_bytes())
    if zero_head:
        with duckdb.connect(str(db)) as con:
            doubles = [c for (c,) in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'distance_profiles' "
                "AND data_type = 'DOUBLE'").fetchall()]
            con.execute(f"UPDATE distance_profiles SET {', '.join(f'{c} = NULL' for c in doubles)}, parity = NULL "
                        "WHERE layer = 0 AND head = 1")
    with duckdb.connect(str(db), read_only=True) as con:
        view = con.sql("select * from parity_by_distance order by model, part, delta").pl()
        base = con.sql("select * from distance_profiles").pl()
    assert base["parity"].null_count() == (4 if zero_head else 0)
    expected = base.group_by("model", "part", "delta").agg(
        heads=pl.len(),
        **{out: (100 * (pl.col("parity") == kind).sum() / pl.len()).round(1, mode="half_away_from_zero")
           for out, kind in (("pct_type_I_plus", "I+"), ("pct_type_II", "II"), ("pct_type_I_minus", "I-"))},
        median_pairing=pl.col("pairing").median(), median_symmetric_energy=pl.col("symmetric_energy").median(),
    ).sort("model", "part", "delta")
    from polars.testing import assert_frame_equal

    assert_frame_equal(view, expected.select(view.columns), check_dtypes=False, abs_tol=1e-12)
    assert view["delta"].to_list() == [0, 1, 5, 64]


def test_default_distances():
    assert DEFAULT_DISTANCES == (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def test_check_guards_distance_profiles(tiny_warehouse, tmp_path):
    from headforms.warehouse.storing.check import check_warehouse

    db = tmp_path / "w.duckdb"
    db.write_bytes((tiny_warehouse / "w.duckdb").read_bytes())
    with duckdb.connect(str(db)) as con:
        assert check_warehouse(con) == []
        con.execute("DELETE FROM distance_profiles WHERE layer = 1 AND head = 2 AND delta = 5")
        con.execute("UPDATE distance_profiles SET a = a + 0.1 WHERE layer = 0 AND head = 3 AND delta = 64")
        con.execute("INSERT INTO distance_profiles SELECT * REPLACE (7 AS delta) FROM distance_profiles "
                    "WHERE layer = 0 AND head = 0 AND delta = 0")
        found = {(f.check, f.layer, f.head, f.detail.split(":")[0]) for f in check_warehouse(con)}
    assert found == {("distance_profiles", 1, 2, "distance_profiles row for delta 5 missing"),
                     ("distance_profiles", 0, 3, "delta 64"),
                     ("distance_profiles", 0, 0,
                      "distance_profiles row for delta 7 without a heads row or a delta in models.distances")}


def test_warehouse_of_an_earlier_version_opens(tiny_warehouse, tmp_path):
    """Without distance_profiles and the new models columns: readers work, check finds it consistent (read-only, the
    missing table and columns are shadowed empty and NULL: a list column as a NULL list), a writer upgrades it."""
    db = tmp_path / "old.duckdb"
    db.write_bytes((tiny_warehouse / "w.duckdb").read_bytes())
    with duckdb.connect(str(db)) as con:
        for view in ("parity_by_distance", "fold_norm_comparison"):
            con.execute(f"DROP VIEW {view}")
        con.execute("DROP TABLE distance_profiles")
        con.execute("ALTER TABLE models DROP COLUMN fold_norm")
        con.execute("ALTER TABLE models DROP COLUMN distances")
    runner = CliRunner()
    result = runner.invoke(cli.main, ["sql", "select model, heads from parity_by_model", "--db", str(db)])
    assert result.exit_code == 0 and "llama_gqa" in result.output
    result = runner.invoke(cli.main, ["check", "--db", str(db)])
    assert result.exit_code == 0 and "all invariants hold (0 warnings)" in result.output
    api.extract(str(tiny_warehouse / "gpt2"), db=db, name="gpt2-again")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*) from distance_profiles").fetchone() == (0,)
        assert con.execute("select model, fold_norm, distances from models order by model").fetchall() == [
            ("gpt2", None, None), ("gpt2-again", None, None), ("llama_gqa", None, None)]


def test_an_unknown_pairing_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"^unknown RoPE pairing 'diagonal'; expected one of split-half, interleaved$"):
        Rotation.of("diagonal", [1.0, 0.5])
