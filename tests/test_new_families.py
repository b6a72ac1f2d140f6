"""Families found by discovery are accepted only once proven on their own tiny instance
(extract.layouts.discover.prove), and the verdict is kept per (model_type, transformers version) in the headforms
cache."""
from __future__ import annotations

import json

import pytest
import transformers
from click.testing import CliRunner

from headforms import cli
from headforms.extract.checkpoint import ExtractError, ReadOptions
from headforms.extract.layouts import discover
from headforms.extract.layouts.spec import model_spec
from tests import tiny_models as tm


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test proves afresh, in a cache of its own."""
    monkeypatch.setenv("HEADFORMS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _config(name: str) -> dict:
    tiny = tm.TINY[name]
    return getattr(transformers, tiny.config_class)(**tiny.kwargs).to_dict() | {"architectures": [tiny.model_class]}


def test_the_verdict_is_cached_per_model_type_and_transformers_version(own_cache, monkeypatch):
    layout, _ = model_spec(_config("olmo3"), ReadOptions(qk_norm="fold"))
    assert layout.qk_norm == "projection" and layout.tensors["q_norm"] == "layers.{i}.self_attn.q_norm.weight"
    verdicts = json.loads((own_cache / discover.VERDICTS).read_text())
    (key, verdict), = verdicts.items()
    assert key.startswith(f"olmo3 transformers {transformers.__version__} ") and verdict["refusal"] is None

    def unproven(*args):
        raise AssertionError("proved again")

    monkeypatch.setattr(discover, "prove", unproven)
    assert model_spec(_config("olmo3"), ReadOptions(qk_norm="fold"))[0].tensors == layout.tensors
    wider = _config("olmo3") | {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 8}
    assert model_spec(wider, ReadOptions(qk_norm="fold"))[0].tensors == layout.tensors  # sizes alone: the same verdict
    with pytest.raises(AssertionError, match="proved again"):  # another setting: another verdict
        model_spec(_config("olmo3") | {"rms_norm_eps": 1e-3}, ReadOptions(qk_norm="fold"))
    monkeypatch.setattr("importlib.metadata.version", lambda name: "0.0.1")  # another version: proved again
    with pytest.raises(AssertionError, match="proved again"):
        model_spec(_config("olmo3"), ReadOptions(qk_norm="fold"))


def test_a_discovered_qk_norm_is_refused_unless_folded():
    with pytest.raises(ExtractError, match="^exaone4 uses QK-norm, .*pass qk_norm=.fold."):
        model_spec(_config("exaone4"))


def test_a_family_whose_logits_the_form_misses_is_refused_in_one_line(tmp_path):
    """Hunyuan's QK-norm comes after RoPE: at a nonzero position the form misses its logits, and extract says so."""
    import torch

    config = transformers.HunYuanDenseV1Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                               vocab_size=tm.VOCAB, num_attention_heads=4, num_key_value_heads=2,
                                               head_dim=8, pad_token_id=0)
    torch.manual_seed(0)
    transformers.HunYuanDenseV1ForCausalLM(config).save_pretrained(tmp_path / "hunyuan")
    result = CliRunner().invoke(cli.main, ["extract", str(tmp_path / "hunyuan"), "--db", str(tmp_path / "w.duckdb"),
                                           "--qk-norm", "fold"])
    assert result.exit_code != 0
    assert result.output.count("\n") == 1 and result.output.startswith("Error: hunyuan_v1_dense is refused")
    assert "at distance 0 (position 7) differ from score_scale * x_j^T L x_i" in result.output


def test_a_soft_capped_family_is_extracted_and_its_behaviour_reproduced(tmp_path, monkeypatch):
    """Gemma 2 with a cap near its logits' size: the cap is on the models row, the model's own self-logits are the
    capped ones (its softmax input), and cap * tanh(form + biases) reproduces them at every position."""
    import duckdb
    import numpy as np

    from headforms import api
    from tests.test_behaviour import LENGTH, SEED, SEQUENCES, Tokens, behaviour_rows, extracted, reference

    folder, db = extracted(tmp_path, "gemma2_softcap")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT attention_softcap FROM models").fetchall() == [(2.0,)]
    tokens = Tokens(monkeypatch)
    api.behaviour(str(folder), db=db, length=LENGTH, sequences=SEQUENCES, seed=SEED, resamples=50)
    _, diagonals = reference(folder, tokens.drawn[0], monkeypatch)
    rows = behaviour_rows(db)
    model_logit = np.concatenate([d.mean(axis=(0, 2)) for d in diagonals])
    np.testing.assert_allclose(rows["self_logit"].to_numpy(), model_logit, atol=1e-5)
    assert rows["reproduction_error"].max() < 1e-5
    # the cap bends these logits: the uncapped form is not the model's logit
    assert np.abs((rows["form_self_logit"] + rows["bias_self_logit"]).to_numpy() - model_logit).max() > 1e-2


def test_attention_left_unquantized_is_read_as_stored(tmp_path):
    """gpt-oss quantizes its experts (mxfp4) and lists every self_attn in modules_to_not_convert: its Q/K are read
    as stored; a quantization_config that leaves some layer's attention out is refused in one line."""
    import numpy as np

    from headforms.extract.formats.hf import open_hf_folder

    model = tm.build("gpt_oss")
    folder = tm.save(model, tmp_path / "gpt_oss")
    config = json.loads((folder / "config.json").read_text())
    skip = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
    (folder / "config.json").write_text(json.dumps(config | {"quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": skip}}))
    ckpt = open_hf_folder(folder, name="g", source=str(folder))
    w_q, _ = ckpt.read_layer(1)
    np.testing.assert_array_equal(w_q, model.model.layers[1].self_attn.q_proj.weight.detach().numpy().reshape(4, 8, 32))
    (folder / "config.json").write_text(json.dumps(config | {"quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.0.self_attn"]}}))
    with pytest.raises(ExtractError, match=r"^gpt_oss is refused: quantized checkpoints \(mxfp4\): MXFP4's "
                                           r"e8m0-scaled fp4 blocks are not read"):  # layer 1's attention is quantized
        open_hf_folder(folder, name="g", source=str(folder))


def test_length_dependent_rope_scalings_keep_distance_zero_only():
    """dynamic NTK and longrope change their frequencies with the sequence length: the form at distance 0 holds
    (with longrope's attention factor), the distance profiles are refused with the reason."""
    config = _config("qwen2_yarn") | {"rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}}
    spec = model_spec(config)[1]
    assert spec.rope.frequencies == () and spec.rope.refusal.startswith("dynamic NTK changes the frequencies")
    assert spec.score_scale == 8**-0.5


def test_a_gguf_gemma2_records_its_cap(tmp_path):
    """llama.cpp's gemma2 soft-caps at the file's attn_logit_softcapping, 50 when the file omits it (its default)."""
    from headforms.extract.formats.gguf_file import open_gguf
    from tests import gguf_convert

    model = tm.build("gemma2_softcap")
    capped = gguf_convert.write(model, "gemma2", tmp_path / "capped.gguf")
    assert open_gguf(capped, name="c", source="c", options=ReadOptions(revision="r")).spec.softcap == 2.0
    plain = gguf_convert.write(tm.build("gemma2"), "gemma2", tmp_path / "plain.gguf")
    assert open_gguf(plain, name="p", source="p", options=ReadOptions(revision="r")).spec.softcap == 50.0


def test_architectures_lists_what_discovery_proved_and_refused():
    model_spec(_config("olmo3"), ReadOptions(qk_norm="fold"))
    with pytest.raises(ExtractError):
        model_spec(transformers.HunYuanDenseV1Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                                     vocab_size=tm.VOCAB, num_attention_heads=4,
                                                     num_key_value_heads=2, head_dim=8, pad_token_id=0).to_dict())
    result = CliRunner().invoke(cli.main, ["architectures", "--format", "json"])
    rows = {row["family"]: row for row in json.loads(result.output) if row["format"] == "hf (discovered)"}
    assert set(rows) == {"olmo3", "hunyuan_v1_dense"}
    assert rows["olmo3"]["notes"] == (f"proven by its own logits on transformers {transformers.__version__}; QK-norm "
                                      "(projection gains, found by what the attention module does): refused unless "
                                      "--qk-norm fold; RoPE pairs split-half")
    assert rows["hunyuan_v1_dense"]["notes"].startswith(
        f"refused on transformers {transformers.__version__}: its tiny instance's attention logits (layer 0) at "
        "distance 0 (position 7) differ")
