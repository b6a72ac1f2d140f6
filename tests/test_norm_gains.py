"""--fold-norm: the folded forms diag(g) L diag(g) (and P diag(g) L diag(g) P) reproduce the tiny models'
own logits on normalised inputs; refusals; models.fold_norm; the fold_norm_comparison view."""
from __future__ import annotations

from dataclasses import replace

import duckdb
import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner
from polars.testing import assert_frame_equal

import headforms
from headforms import cli
from headforms.compute.norm_gains import fold_gain
from headforms.extract.checkpoint import ExtractError, ReadOptions
from headforms.extract.formats.gguf_file import open_gguf
from headforms.extract.formats.hf import open_hf_folder
from tests import tiny_models as tm
from tests.test_gguf import write_gguf
from tests.test_layouts import logit_error

# name -> (module feeding layer i's attention, kind): written out here, independently of extract.layouts.norms.
NORM_MODULES = {
    "llama": ("model.layers.{i}.input_layernorm", "rms"),
    "gemma": ("model.layers.{i}.input_layernorm", "rms"),        # multiplies by 1 + weight
    "qwen3": ("model.layers.{i}.input_layernorm", "rms"),        # with its QK-norm folded too
    "gpt2": ("h.{i}.ln_1", "layer"),
    "gpt_neox": ("gpt_neox.layers.{i}.input_layernorm", "layer"),
    "bloom": ("transformer.h.{i}.input_layernorm", "layer"),
    "opt": ("model.decoder.layers.{i}.self_attn_layer_norm", "layer"),
    "bert": (None, "layer"),                                      # post-norm: see norm_module
}


def norm_module(model, name: str, layer: int):
    path, _ = NORM_MODULES[name]
    if name == "bert":
        path = "bert.embeddings.LayerNorm" if layer == 0 else f"bert.encoder.layer.{layer - 1}.output.LayerNorm"
    return model.get_submodule(path.format(i=layer))


def normalised_trace(name: str, model, center: bool):
    """The model's trace, its attention inputs replaced by the norm's input divided by its rms (RMSNorm) or
    sd (LayerNorm), centred for LayerNorm unless `center` (then the folded P does the centering)."""
    captured = {}

    def keep(layer):
        def hook(module, args):
            captured.setdefault(layer, args[0].detach().double().numpy())
        return hook

    hooks = [norm_module(model, name, i).register_forward_pre_hook(keep(i)) for i in range(2)]
    try:
        trace = tm.trace(name, model)
    finally:
        for hook in hooks:
            hook.remove()
    kind = NORM_MODULES[name][1]
    z = []
    for i in range(2):
        module, x = norm_module(model, name, i), captured[i]
        eps = getattr(module, "eps", None) or getattr(module, "variance_epsilon", None)
        if kind == "rms":
            z.append(x / np.sqrt((x**2).mean(-1, keepdims=True) + eps))
        else:
            sd = np.sqrt(x.var(-1, keepdims=True) + eps)
            z.append((x if center else x - x.mean(-1, keepdims=True)) / sd)
    return replace(trace, inputs=z)


CASES = [(name, "gain") for name in NORM_MODULES] + [(name, "center") for name in ("gpt2", "bert", "opt", "bloom")]


@pytest.mark.parametrize("name, mode", CASES)
def test_folded_forms_reproduce_logits_on_normalised_inputs(name, mode, tmp_path):
    model = tm.build(name)
    tm.save(model, tmp_path)
    ckpt = open_hf_folder(tmp_path, name="t", source="t", options=ReadOptions(revision="r", qk_norm="fold", fold_norm=mode))
    plain = open_hf_folder(tmp_path, name="t", source="t", options=ReadOptions(revision="r", qk_norm="fold"))
    assert ckpt.spec.fold_norm == mode and plain.spec.fold_norm is None
    trace = normalised_trace(name, model, center=mode == "center")
    for layer in range(2):
        assert logit_error(ckpt, trace, layer, ckpt.spec.kv_index, model) < 1e-5
    assert logit_error(plain, trace, 0, plain.spec.kv_index, model) > 1e-3  # without folding they differ


def test_fold_gain_is_the_matrix_product():
    N, n = 12, 3
    rng = np.random.default_rng(0)
    w, g = rng.standard_normal((2, n, N)), rng.uniform(0.5, 1.5, N)
    P = np.eye(N) - np.ones((N, N)) / N
    np.testing.assert_allclose(fold_gain(w, g), w @ np.diag(g), atol=1e-14)
    np.testing.assert_allclose(fold_gain(w, g, center=True), w @ np.diag(g) @ P, atol=1e-14)


def test_gguf_attn_norm_folds(tmp_path):
    """A GGUF llama with blk.i.attn_norm: its folded forms reproduce the tiny llama's logits on x / rms(x)."""
    import gguf

    model = tm.build("llama_gqa")
    weights = {}
    for i, layer in enumerate(model.model.layers):
        weights[f"blk.{i}.attn_q.weight"] = layer.self_attn.q_proj.weight.detach().numpy().astype(np.float32)
        weights[f"blk.{i}.attn_k.weight"] = layer.self_attn.k_proj.weight.detach().numpy().astype(np.float32)
        weights[f"blk.{i}.attn_norm.weight"] = layer.input_layernorm.weight.detach().numpy().astype(np.float32)
    write_gguf(tmp_path / "t.gguf", n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, weights=weights)
    ckpt = open_gguf(tmp_path / "t.gguf", name="t", source="t", options=ReadOptions(revision="r", fold_norm="gain"))
    assert ckpt.spec.fold_norm == "gain"
    trace = normalised_trace("llama", model, center=False)
    for layer in range(2):
        assert logit_error(ckpt, trace, layer, ckpt.spec.kv_index, model) < 1e-5
    with pytest.raises(ExtractError, match="RMSNorm does not subtract the mean"):
        open_gguf(tmp_path / "t.gguf", name="t", source="t", options=ReadOptions(revision="r", fold_norm="center"))
    # the folded gains are part of what the file's digest revision covers (the same file name, as the digest names
    # files, and only layer 1's gain changed), and a gain that is not finite is named
    changed = {**weights, "blk.1.attn_norm.weight": weights["blk.1.attn_norm.weight"] * 2}
    (tmp_path / "g").mkdir()
    write_gguf(tmp_path / "g" / "t.gguf", n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, weights=changed)
    db = tmp_path / "w.duckdb"
    for name, path in (("t", tmp_path / "t.gguf"), ("g", tmp_path / "g" / "t.gguf")):
        headforms.extract_models(str(path), db=db, name=name, fold_norm="gain", resamples=2)
    with duckdb.connect(str(db), read_only=True) as con:
        (first,), (second,) = con.execute("SELECT revision FROM models ORDER BY model DESC").fetchall()
    assert first.startswith("sha256:") and second.startswith("sha256:") and first != second
    changed["blk.1.attn_norm.weight"] = np.full(32, np.nan, np.float32)
    write_gguf(tmp_path / "n.gguf", n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, weights=changed)
    with pytest.raises(ExtractError, match=r"layer 1: tensor 'blk\.1\.attn_norm\.weight' has non-finite values"):
        open_gguf(tmp_path / "n.gguf", name="n", source="n", options=ReadOptions(revision="r", fold_norm="gain")
                  ).read_layer(1)
    del weights["blk.1.attn_norm.weight"]
    write_gguf(tmp_path / "m.gguf", n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, weights=weights)
    with pytest.raises(ExtractError, match=r"has no tensor blk\.1\.attn_norm\.weight \(needed by `fold_norm`\)"):
        open_gguf(tmp_path / "m.gguf", name="m", source="m", options=ReadOptions(revision="r", fold_norm="gain"))
    assert gguf  # the writer's package


@pytest.mark.parametrize("name, mode, message", [
    ("llama", "center", r"^fold_norm='center' is refused for llama: its RMSNorm does not subtract the mean; "
                        r"use fold_norm='gain'$"),
    ("olmo2", "gain", r"^fold_norm='gain' is refused for olmo2: OLMo 2 normalises attention's output"),
    ("opt_base", "gain", r"^fold_norm='gain' is refused for this OPT: do_layer_norm_before=false normalises after "
                         r"attention, so the norm feeding W_Q and W_K is the previous layer's$"),
    ("llama", "both", r"^unknown fold_norm='both'"),
    ("gpt_neo", "gain", r"^`fold_norm` is not implemented for gpt_neo; implemented: bert, bloom, (\w+, )*gpt2, "
                        r"(\w+, )*llama, (\w+, )*qwen3$"),
])
def test_refusals(name, mode, message, tmp_path):
    tm.save(tm.build(name), tmp_path)
    with pytest.raises(ExtractError, match=message):
        open_hf_folder(tmp_path, name="t", source="t", options=ReadOptions(revision="r", qk_norm="fold", fold_norm=mode))


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """A tiny GPT-2 extracted plain, with --fold-norm gain and with --fold-norm center (three names)."""
    folder = tmp_path_factory.mktemp("fold")
    tm.save(tm.build("gpt2"), folder / "gpt2")
    db = folder / "w.duckdb"
    runner = CliRunner()
    for args in ([], ["--fold-norm", "gain", "--name", "gpt2-gain"], ["--fold-norm", "center", "--name", "gpt2-center"]):
        result = runner.invoke(cli.main, ["extract", str(folder / "gpt2"), "--db", str(db), *args])
        assert result.exit_code == 0, result.output
    return folder


def test_fold_norm_recorded_and_part_of_identity(compared):
    db = compared / "w.duckdb"
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select model, fold_norm from models order by model").fetchall() == [
            ("gpt2", None), ("gpt2-center", "center"), ("gpt2-gain", "gain")]
    with duckdb.connect(str(db), read_only=True) as con:
        before = con.execute("select count(*), sum(symmetric_energy) from heads").fetchall()
    result = CliRunner().invoke(cli.main, ["extract", str(compared / "gpt2"), "--db", str(db), "--name", "gpt2-gain"])
    assert result.exit_code == 1
    assert "fold_norm gain -> None" in result.output.strip().splitlines()[-1]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*), sum(symmetric_energy) from heads").fetchall() == before


def test_fold_norm_comparison_view(compared):
    with duckdb.connect(str(compared / "w.duckdb"), read_only=True) as con:
        view = con.sql("select * from fold_norm_comparison order by model, part, folded_model").pl()
        heads, models = con.sql("select * from heads").pl(), con.sql("select * from models").pl()
    plain = heads.join(models.filter(pl.col("fold_norm").is_null()).select("model"), on="model")
    folded = heads.join(models.filter(pl.col("fold_norm").is_not_null()).select("model", "fold_norm"), on="model")
    both = plain.join(folded, on=["layer", "head", "part"], suffix="_f")

    def pct(column, kind):
        return (100 * (pl.col(column) == kind).sum() / pl.len()).round(1, mode="half_away_from_zero")

    expected = both.group_by("model", "part", "model_f", "fold_norm").agg(
        heads=pl.len(),
        median_symmetric_energy=pl.col("symmetric_energy").median(),
        folded_median_symmetric_energy=pl.col("symmetric_energy_f").median(),
        median_pairing=pl.col("pairing").median(), folded_median_pairing=pl.col("pairing_f").median(),
        pct_type_I_plus=pct("parity", "I+"), folded_pct_type_I_plus=pct("parity_f", "I+"),
        pct_type_II=pct("parity", "II"), folded_pct_type_II=pct("parity_f", "II"),
        pct_type_I_minus=pct("parity", "I-"), folded_pct_type_I_minus=pct("parity_f", "I-"),
        pct_parity_changed=(100 * (pl.col("parity") != pl.col("parity_f")).sum() / pl.len())
        .round(1, mode="half_away_from_zero"),
    ).rename({"model_f": "folded_model"}).sort("model", "part", "folded_model")
    assert view["folded_model"].to_list() == ["gpt2-center", "gpt2-gain"]
    assert_frame_equal(view, expected.select(view.columns), check_dtypes=False, abs_tol=1e-12)
    assert (view["median_symmetric_energy"] != view["folded_median_symmetric_energy"]).all()


def test_an_unknown_fold_norm_option_names_the_options():
    """The API's fold_norm (the CLI offers only these) refused with every option named."""
    from headforms.extract.checkpoint import ExtractError
    from headforms.extract.layouts.norms import HF_NORMS, norm_for

    with pytest.raises(ExtractError) as refused:
        norm_for(None, "centre", HF_NORMS)
    assert str(refused.value) == "unknown fold_norm='centre'; expected one of none, gain, center"
