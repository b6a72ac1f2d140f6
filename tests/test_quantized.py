"""Quantized checkpoints (FP8 block/tensor/channel scales, GPTQ, AWQ, compressed-tensors): a tiny llama's Q/K,
quantized here, extract (folder and hub) with the statistics of the weights dequantized densely in this file from
each format's published description (transformers' own CPU dequantization for DeepSeek's FP8 blocks, torch's float8
dtypes), and those weights loaded into the model reproduce its logits. Bad checkpoints are one Error line, the
warehouse unchanged."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import save_file

from headforms import api, cli
from headforms.extract.formats.hf import span_array
from headforms.extract.sources import open_checkpoint
from tests import tiny_models as tm
from tests.hub_server import serve_hub
from tests.test_hub import serve
from tests.test_layouts import logit_error

GROUP = 32
FP8_BLOCK = [24, 40]  # DeepSeek's [128, 128] at a tiny model's scale: partial blocks at both edges of 64 x 64, 32 x 64
LAYERS = 2


def _group_of(cols: int, act_order: bool, seed: int) -> np.ndarray:
    """Each input column's group: consecutive GROUP columns, or (act-order) groups over a random column order."""
    order = np.random.default_rng(seed).permutation(cols) if act_order else np.arange(cols)
    g = np.empty(cols, np.int64)
    g[order] = np.arange(cols) // GROUP
    return g


def _integer(w: np.ndarray, bits: int, sym: bool, g_idx: np.ndarray, scale_dtype) -> tuple:
    """Round-to-nearest integer quantization per (row, group): q in [0, 2^bits), zero z, scale s (rounded to the
    stored dtype first); the dense dequantization s * (q - z)."""
    out, groups, top = w.shape[0], g_idx.max() + 1, (1 << bits) - 1
    lo = np.stack([w[:, g_idx == g].min(1) for g in range(groups)], 1)
    hi = np.stack([w[:, g_idx == g].max(1) for g in range(groups)], 1)
    if sym:
        s = np.maximum(np.abs(lo), np.abs(hi)) / (top / 2)
        z = np.full((out, groups), 1 << (bits - 1))
    else:
        s = (hi - lo) / top
    s = torch.from_numpy(s).to(scale_dtype).double().numpy()
    if not sym:
        z = np.clip(np.round(-lo / s), 0, top).astype(np.int64)
    q = np.clip(np.round(w / s[:, g_idx]) + z[:, g_idx], 0, top).astype(np.int64)
    return q, z, s, s[:, g_idx] * (q - z[:, g_idx])


def _words(values: np.ndarray, bits: int, axis: int, order=None) -> torch.Tensor:
    """int32 words of `values` (unsigned, < 2^bits) packed along `axis`, value k of each word at bits k*bits
    (AutoGPTQ, compressed-tensors); `order` (AWQ) the column each position of a word holds."""
    per = 32 // bits
    v = np.moveaxis(values, axis, -1)
    pad = -v.shape[-1] % per
    v = np.concatenate([v, np.zeros(v.shape[:-1] + (pad,), np.int64)], -1).reshape(*v.shape[:-1], -1, per)
    order = range(per) if order is None else order
    words = sum(v[..., col] << (bits * k) for k, col in enumerate(order))
    return torch.from_numpy(np.moveaxis(words, -1, axis).astype(np.uint32).view(np.int32).copy())


def _fp8(w: np.ndarray, block: tuple[int, int], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """float8 values and float32 scales (one per block x block of w, partial at the edges): absmax / the
    dtype's largest, values cast by torch."""
    rows, cols = block
    pad = np.pad(np.abs(w), ((0, -w.shape[0] % rows), (0, -w.shape[1] % cols)))
    amax = pad.reshape(pad.shape[0] // rows, rows, pad.shape[1] // cols, cols).max((1, 3))
    scale = torch.from_numpy(amax / torch.finfo(dtype).max).float()
    wide = scale.double().repeat_interleave(rows, 0)[:w.shape[0]].repeat_interleave(cols, 1)[:, :w.shape[1]]
    return (torch.from_numpy(w) / wide).to(dtype), scale


def fp8_block(w, dtype=torch.float8_e4m3fn):
    values, scale = _fp8(w, tuple(FP8_BLOCK), dtype)
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    dense = _dequantize_fp8_weight(values, scale, FP8_BLOCK, torch.float64).numpy()
    return {"weight": values, "weight_scale_inv": scale}, dense


def fp8_channel(w, scale_name="weight_scale", dtype=torch.float8_e4m3fn):
    values, scale = _fp8(w, (1, w.shape[1]), dtype)
    return {"weight": values, scale_name: scale}, values.double().numpy() * scale.double().numpy()


def fp8_tensor(w):
    values, scale = _fp8(w, w.shape, torch.float8_e4m3fn)
    return {"weight": values, "weight_scale": scale.reshape(1)}, values.double().numpy() * scale.item()


def gptq(bits: int, sym: bool, act_order: bool):
    def make(w):
        g_idx = _group_of(w.shape[1], act_order, w.shape[0])
        q, z, s, dense = _integer(w, bits, sym, g_idx, torch.float16)
        return {"qweight": _words(q.T, bits, 0), "qzeros": _words(z.T - 1, bits, 1),  # GPTQ v1: zero - 1
                "scales": torch.from_numpy(s.T.copy()).half(), "g_idx": torch.from_numpy(g_idx).int()}, dense
    return make


def awq(w):
    q, z, s, dense = _integer(w, 4, False, _group_of(w.shape[1], False, 0), torch.float16)
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    return {"qweight": _words(q.T, 4, 1, order), "qzeros": _words(z.T, 4, 1, order),
            "scales": torch.from_numpy(s.T.copy()).half()}, dense


def packed(bits: int, sym: bool):
    def make(w):
        q, z, s, dense = _integer(w, bits, sym, _group_of(w.shape[1], False, 0), torch.bfloat16)
        # values and zero points stored signed + 2^(bits-1), as unsigned codes: the codes are q and z themselves
        out = {"weight_packed": _words(q, bits, 1), "weight_scale": torch.from_numpy(s).bfloat16(),
               "weight_shape": torch.tensor(w.shape, dtype=torch.int32)}
        return out | ({} if sym else {"weight_zero_point": _words(z, bits, 0)}), dense
    return make


def _ct(fmt: str, num_bits: int, kind: str, strategy: str, sym: bool = True, **weights) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "format": fmt,
                                          "weights": {"num_bits": num_bits, "type": kind, "strategy": strategy,
                                                      "symmetric": sym} | weights}}}


def _gptq_config(bits, sym, act_order):
    return {"quant_method": "gptq", "bits": bits, "group_size": GROUP, "sym": sym, "desc_act": act_order,
            "checkpoint_format": "gptq"}


FORMS = {  # name -> (quantize(W) -> (stored suffix -> tensor, dense W), quantization_config, models.quantization)
    "fp8 e4m3 blocks": (fp8_block, {"quant_method": "fp8", "weight_block_size": FP8_BLOCK},
                        "fp8, 8-bit float, 24x40 blocks"),
    "fp8 e5m2 blocks": (lambda w: fp8_block(w, torch.float8_e5m2),
                        {"quant_method": "fp8", "weight_block_size": FP8_BLOCK}, "fp8, 8-bit float, 24x40 blocks"),
    "fbgemm fp8 channel": (fp8_channel, {"quant_method": "fbgemm_fp8"}, "fbgemm_fp8, 8-bit float, per channel"),
    "ct fp8 tensor": (fp8_tensor, _ct("float-quantized", 8, "float", "tensor"),
                      "compressed-tensors float-quantized, 8-bit float, per tensor"),
    "ct fp8 channel": (fp8_channel, _ct("float-quantized", 8, "float", "channel"),
                       "compressed-tensors float-quantized, 8-bit float, per channel"),
    "gptq 4-bit sym": (gptq(4, True, False), _gptq_config(4, True, False), "gptq, 4-bit int, group 32"),
    "gptq 4-bit asym act-order": (gptq(4, False, True), _gptq_config(4, False, True),
                                  "gptq, 4-bit int, group 32, act-order, asymmetric"),
    "gptq 8-bit asym": (gptq(8, False, False), _gptq_config(8, False, False), "gptq, 8-bit int, group 32, asymmetric"),
    "gptq 8-bit sym act-order": (gptq(8, True, True), _gptq_config(8, True, True),
                                 "gptq, 8-bit int, group 32, act-order"),
    "awq 4-bit gemm": (awq, {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                             "version": "gemm"}, "awq, 4-bit int, group 32, asymmetric"),
    "ct pack 4-bit sym": (packed(4, True), _ct("pack-quantized", 4, "int", "group", group_size=GROUP),
                          "compressed-tensors pack-quantized, 4-bit int, group 32"),
    "ct pack 8-bit asym": (packed(8, False), _ct("pack-quantized", 8, "int", "group", False, group_size=GROUP),
                           "compressed-tensors pack-quantized, 8-bit int, group 32, asymmetric"),
}


@pytest.fixture(scope="module")
def model():
    return tm.build("llama_gqa", hidden_size=64, intermediate_size=64)


def quantize(model, case: str, folder: Path, shards: bool = False) -> tuple[Path, dict, list[str]]:
    """The model's folder with each q_proj/k_proj weight stored quantized as `case`; its dense dequantized weights,
    and the names of the quantized tensors. `shards`: two shards, every scale in the other shard than its values."""
    make, config, _ = FORMS[case]
    state, dense, stored = {k: v.clone() for k, v in model.state_dict().items()}, {}, []
    for name in [n for n in state if re.search(r"\.[qk]_proj\.weight$", n)]:
        tensors, dense[name] = make(state.pop(name).numpy())
        base = name[:-len("weight")]
        state |= {base + suffix: t.contiguous() for suffix, t in tensors.items()}
        stored += [base + suffix for suffix in tensors if suffix != "weight_shape"]
    folder.mkdir(parents=True)
    model.config.save_pretrained(folder)
    written = json.loads((folder / "config.json").read_text()) | {"quantization_config": config}
    (folder / "config.json").write_text(json.dumps(written))
    if not shards:
        save_file(state, str(folder / "model.safetensors"))
    else:
        scale = [n for n in state if "scale" in n]
        parts = {"model-00001-of-00002.safetensors": [n for n in state if n not in scale],
                 "model-00002-of-00002.safetensors": scale}
        for shard, names in parts.items():
            save_file({n: state[n] for n in names}, str(folder / shard))
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {n: shard for shard, names in parts.items() for n in names}}))
    return folder, dense, stored


def dense_folder(model, dense: dict, folder: Path):
    """The model with its dequantized Q/K loaded (float64), saved as an unquantized folder."""
    copy = tm.build("llama_gqa", hidden_size=64, intermediate_size=64)
    with torch.no_grad():
        params = dict(copy.named_parameters())
        for name, w in dense.items():
            params[name].copy_(torch.from_numpy(w))
    return copy, tm.save(copy, folder)


def heads(db: Path) -> np.ndarray:
    con = duckdb.connect(str(db), read_only=True)
    try:
        columns = con.execute("SELECT * FROM heads ORDER BY layer, head").fetchnumpy()
    finally:
        con.close()
    return np.stack([np.asarray(v, float) for v in columns.values() if np.asarray(v).dtype.kind == "f"])


@pytest.mark.parametrize("case", FORMS)
def test_a_quantized_checkpoint_has_the_statistics_and_logits_of_its_dequantized_weights(case, model, tmp_path):
    folder, dense, _ = quantize(model, case, tmp_path / "q")
    reference, plain = dense_folder(model, dense, tmp_path / "dense")
    ours, theirs = open_checkpoint(str(folder)), open_checkpoint(str(plain))
    trace = tm.trace("llama_gqa", reference)
    for layer in range(LAYERS):
        for a, b in zip(ours.read_layer(layer), theirs.read_layer(layer)):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * np.abs(b).max())
        assert logit_error(ours, trace, layer, ours.spec.kv_index, reference) < 1e-5
    api.extract(str(folder), db=tmp_path / "q.duckdb", name="m", resamples=20)
    api.extract(str(plain), db=tmp_path / "d.duckdb", name="m", resamples=20)
    q, d = heads(tmp_path / "q.duckdb"), heads(tmp_path / "d.duckdb")
    np.testing.assert_allclose(q, d, rtol=1e-12, atol=1e-12, equal_nan=True)
    con = duckdb.connect(str(tmp_path / "q.duckdb"), read_only=True)
    assert con.execute("SELECT quantization FROM models").fetchone() == (FORMS[case][2],)
    con.close()


def test_the_summary_line_says_the_quantization(model, tmp_path):
    folder, _, _ = quantize(model, "gptq 4-bit sym", tmp_path / "q")
    outcome = CliRunner().invoke(cli.main, ["extract", str(folder), "--db", str(tmp_path / "w.duckdb")])
    assert outcome.exit_code == 0, outcome.output
    assert "; dequantized from gptq, 4-bit int, group 32)" in outcome.output


@pytest.fixture
def hub(monkeypatch, tmp_path):
    server = serve_hub(monkeypatch, tmp_path, hf_home=False)
    yield server
    server.close()


@pytest.mark.parametrize("case", ["fp8 e4m3 blocks", "gptq 4-bit asym act-order", "awq 4-bit gemm",
                                  "ct pack 8-bit asym"])
def test_from_the_hub_by_range_with_scales_in_another_shard(case, model, hub, tmp_path):
    folder, dense, stored = quantize(model, case, tmp_path / "q", shards=True)
    serve(hub, "org/quantized", folder)
    ckpt = open_checkpoint("org/quantized")
    assert ckpt.quantization == FORMS[case][2]
    for layer in range(LAYERS):
        w_q, w_k = ckpt.read_layer(layer)
        prefix = f"model.layers.{layer}.self_attn."
        np.testing.assert_allclose(w_q.reshape(-1, w_q.shape[-1]), dense[prefix + "q_proj.weight"], rtol=0, atol=1e-15)
        np.testing.assert_allclose(w_k.reshape(-1, w_k.shape[-1]), dense[prefix + "k_proj.weight"], rtol=0, atol=1e-15)
    nbytes = 0
    for shard in folder.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            nbytes += sum(f.get_tensor(n).nbytes for n in f.keys() if n in stored)
    assert api.plan("org/quantized")["qk_bytes"].to_list() == [nbytes]  # --plan: the quantized bytes it will fetch
    assert api.plan(str(folder))["qk_bytes"].to_list() == [nbytes]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_every_float8_value_reads_as_torch_reads_it(dtype):
    bits = torch.arange(256, dtype=torch.uint8)
    name = {torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}[dtype]
    ours = span_array(bits.numpy().tobytes(), name, (256,))
    np.testing.assert_array_equal(ours, bits.view(dtype).double().numpy())


def refused(db: Path, source, *words) -> None:
    """One Error line saying `words`, exit 1, and the warehouse as it was (here: never created)."""
    outcome = CliRunner().invoke(cli.main, ["extract", str(source), "--db", str(db)])
    assert outcome.exit_code == 1 and outcome.output.startswith("Error: ") and outcome.output.count("\n") == 1, \
        outcome.output
    assert all(word in outcome.output for word in words), outcome.output
    assert not db.exists()


@pytest.mark.parametrize("config, words", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, ["bitsandbytes", "nf4", "unquantized model"]),
    ({"quant_method": "aqlm", "in_group_size": 8}, ["AQLM", "codebook"]),
    ({"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "marlin"}, ["marlin", "permuted"]),
    ({"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemv"}, ["gemv", "GEMM"]),
    ({"quant_method": "gptq", "bits": 3, "group_size": 32}, ["3-bit", "2, 4 or 8"]),
    (_ct("sparse-24-bitmask", 8, "float", "tensor"), ["sparse-24-bitmask", "not read"]),
    ({"quant_method": "hqq"}, ["HQQ"]),
])
def test_formats_that_cannot_be_dequantized_are_refused_in_one_line(config, words, model, tmp_path):
    folder, _, _ = quantize(model, "gptq 4-bit sym", tmp_path / "q")
    written = json.loads((folder / "config.json").read_text()) | {"quantization_config": config}
    (folder / "config.json").write_text(json.dumps(written))
    refused(tmp_path / "w.duckdb", folder, *words)


def _rewrite(folder: Path, change) -> None:
    """The folder's safetensors with change(state) applied."""
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        state = {n: f.get_tensor(n) for n in f.keys()}
    change(state)
    save_file(state, str(folder / "model.safetensors"))


def test_bad_scales_are_one_error_naming_the_tensor(model, tmp_path):
    name = "model.layers.1.self_attn.k_proj.weight_scale_inv"
    folder, _, _ = quantize(model, "fp8 e4m3 blocks", tmp_path / "a")
    _rewrite(folder, lambda s: s.__setitem__(name, s[name][:1]))  # a block row short
    refused(tmp_path / "a.duckdb", folder, f"'{name}' has shape (1, 2)", "need (2, 2)")

    folder, _, _ = quantize(model, "fp8 e4m3 blocks", tmp_path / "b")
    _rewrite(folder, lambda s: s.pop(name))
    refused(tmp_path / "b.duckdb", folder, f"'{name}' is not in the checkpoint")

    folder, _, _ = quantize(model, "gptq 4-bit asym act-order", tmp_path / "c")
    scales = "model.layers.0.self_attn.q_proj.scales"
    _rewrite(folder, lambda s: s.__setitem__(scales, s[scales].T.contiguous()))
    refused(tmp_path / "c.duckdb", folder, f"'{scales}' has shape (64, 2)", "need (2, 64)")

    folder, _, _ = quantize(model, "gptq 4-bit sym", tmp_path / "d")  # group size 24 does not tile 64 columns
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["group_size"] = 24
    (folder / "config.json").write_text(json.dumps(config))
    refused(tmp_path / "d.duckdb", folder, "'model.layers.0.self_attn.q_proj.qweight'", "group size 24",
            "64 input columns")


def test_a_file_cut_inside_a_scale_names_it(model, tmp_path):
    folder, _, _ = quantize(model, "fp8 e4m3 blocks", tmp_path / "q")
    raw = (folder / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    name = "model.layers.1.self_attn.k_proj.weight_scale_inv"
    cut = 8 + int.from_bytes(raw[:8], "little") + header[name]["data_offsets"][0] + 4
    (folder / "model.safetensors").write_bytes(raw[:cut])
    outcome = CliRunner().invoke(cli.main, ["extract", str(folder), "--db", str(tmp_path / "w.duckdb")])
    assert outcome.exit_code == 1 and outcome.output.startswith("Error: ") and outcome.output.count("\n") == 1
    assert f"incomplete (first missing tensor: {name})" in outcome.output and not (tmp_path / "w.duckdb").exists()
