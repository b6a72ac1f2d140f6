"""The output-value circuit: every layout's W_V, W_O reproduce its tiny model's own attention output, head by head
(transformers' forward pass, the attention pattern A as the model computed it), and read_embeddings gives the model's
own embedding, unembedding and final norm gain."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch

from safetensors.torch import load_file

from headforms.extract.checkpoint import ExtractError, ReadOptions
from headforms.extract.formats.gguf_file import open_gguf
from headforms.extract.formats.hf import open_hf_folder
from headforms.extract.layouts.spec import model_spec
from headforms.extract.layouts.table import LAYOUTS
from tests import gguf_convert, tiny_models as tm


def open_folder(folder, name: str, **options):
    options = {"qk_norm": "fold", "tower": tm.TINY[name].tower, "circuits": ("qk", "ov")} | options
    return open_hf_folder(folder, name="tiny", source=str(folder), options=ReadOptions(**options))


def out_projection(model, folder, ckpt, layer: int) -> torch.nn.Module:
    """The model's module whose weight is the layer's output projection as the file stores it under the layout's name
    (found by its values: transformers may rename modules from the names its files keep)."""
    layout = model_spec(ckpt.spec.config, ReadOptions(qk_norm="fold", tower=ckpt.options.tower))[0]
    stored = load_file(folder / "model.safetensors")
    template = layout.tensors["o"].format(i=layer)
    name = next(p + template for p in layout.prefixes if p + template in stored)
    found = [m for m in model.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
             and m.weight.shape == stored[name].shape and torch.equal(m.weight, stored[name])]
    assert len(found) == 1, f"{len(found)} modules hold {name}"
    return found[0]


@contextmanager
def outputs_of(modules):
    """A list each module's forward output is appended to while the block runs."""
    outputs = []
    hooks = [m.register_forward_hook(lambda m, a, out: outputs.append(out.detach().double().numpy())) for m in modules]
    try:
        yield outputs
    finally:
        for hook in hooks:
            hook.remove()


def predicted_output(w_v, w_o, kv_index, probs, x) -> np.ndarray:
    """sum_h W_O[h] W_V[kv(h)] sum_j A^h_ij x_j, (B, T, N): each head's OV map applied to its attention average."""
    values = np.einsum("kva,bja->bkjv", w_v, x)[:, kv_index]
    return np.einsum("hnv,bhij,bhjv->bin", w_o, probs, values)


def ov_error(model, folder, ckpt, name: str) -> float:
    """Largest |model's attention output - predicted| relative to its largest entry, over the layers."""
    spec = ckpt.spec
    with outputs_of([out_projection(model, folder, ckpt, layer) for layer in range(spec.n_layers)]) as outs:
        trace = tm.trace(name, model)
    assert len(outs) == spec.n_layers
    worst = 0.0
    for layer in range(spec.n_layers):
        w_v, w_o = ckpt.read_circuits(layer)["ov"]
        assert w_v.dtype == w_o.dtype == np.float64
        assert w_v.shape == (spec.n_kv_heads, spec.head_dim, spec.d_model)
        assert w_o.shape == (spec.n_heads, spec.d_model, spec.head_dim)
        predicted = predicted_output(w_v, w_o, spec.kv_index, trace.probs[layer], trace.inputs[layer])
        scale = np.abs(outs[layer]).max()
        assert scale > 0.1, "the attention output should be O(1) for a meaningful comparison"
        worst = max(worst, np.abs(outs[layer] - predicted).max() / scale)
    return worst


@pytest.mark.parametrize("name", list(tm.TINY))
def test_ov_reproduces_attention_output(name, tmp_path):
    model = tm.build(name)  # float64, biases zero: the output projection's output is the heads' sum
    ckpt = open_folder(tm.save(model, tmp_path), name)
    assert (ckpt.spec.architecture in LAYOUTS) != tm.TINY[name].discovered
    assert ov_error(model, tmp_path, ckpt, name) < 1e-10
    qk_only = open_folder(tmp_path, name, circuits=("qk",))
    for layer in range(ckpt.spec.n_layers):  # the qk circuit is read_layer's pair, with or without ov
        for read, alone in zip(ckpt.read_circuits(layer)["qk"], qk_only.read_layer(layer)):
            np.testing.assert_array_equal(read, alone)
    assert set(qk_only.read_circuits(0)) - {"sinks"} == {"qk"} and ckpt.revision == qk_only.revision


# Families whose residual stream has no linear unembedding: encoders (an MLM head's dense, GELU and LayerNorm come
# before its decoder), towers; and those that read no tokens at all (vision, audio).
NO_UNEMBEDDING = {"bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "clip.text", "siglip.text",
                  "clip_text_model", "siglip_text_model", "whisper.encoder", "vit", "deit", "dinov2", "clip.vision",
                  "siglip.vision", "clip_vision_model", "siglip_vision_model"}
NO_TOKENS = {"whisper.encoder", "vit", "deit", "dinov2", "clip.vision", "siglip.vision", "clip_vision_model",
             "siglip_vision_model"}


def final_norm_gain(model, name: str) -> np.ndarray:
    """The effective gain of the norm whose output the model unembeds (its LM head's input, or the last hidden state
    of the stack run alone), measured by feeding it c (1, -1, 1, ...): zero mean, RMS c, so a zero-bias RMSNorm or
    LayerNorm returns gain * (1, -1, ...) up to eps / c^2 (Gemma's (1 + weight) included)."""
    head = model.get_output_embeddings()
    seen, into = [], []
    norms = [m for m in model.modules() if "norm" in type(m).__name__.lower()
             and len(list(m.children())) == 0]
    hooks = [m.register_forward_hook(lambda m, a, out: seen.append((m, out))) for m in norms]
    hooks.append(head.register_forward_pre_hook(lambda m, args: into.append(args[0])))
    run = tm.TINY[name].run
    if run:  # a stack run alone (whisper's decoder): its last hidden state is what the head would read
        hooks.append(model.get_submodule(run).register_forward_hook(
            lambda m, a, out: into.append(out.last_hidden_state)))
    try:
        tm.trace(name, model)
    finally:
        for hook in hooks:
            hook.remove()
    assert into, "the tiny model should run its LM head"
    final = [m for m, out in seen if isinstance(out, torch.Tensor) and out.shape == into[-1].shape
             and torch.equal(out, into[-1])]
    assert len(final) == 1
    return effective_gain(final[0], into[-1].shape[-1])


def effective_gain(norm, n: int) -> np.ndarray:
    """What a zero-bias norm module multiplies a zero-mean input of RMS 1e4 by, entry by entry: its gain."""
    signs = torch.tensor([(-1.0) ** k for k in range(n)], dtype=torch.float64)
    with torch.no_grad():
        return (norm(1e4 * signs[None, None]) / signs).reshape(-1).double().numpy()


@pytest.mark.parametrize("name", list(tm.TINY))
def test_read_embeddings(name, tmp_path):
    model = tm.build(name)
    ckpt = open_folder(tm.save(model, tmp_path), name)
    w_e, w_u = ckpt.read_embeddings()
    architecture = ckpt.spec.architecture
    if architecture in NO_TOKENS:
        assert w_e is None and w_u is None
        return
    embedded = model.get_submodule(tm.TINY[name].run) if tm.TINY[name].run else model
    np.testing.assert_array_equal(w_e, embedded.get_input_embeddings().weight.detach().numpy())
    if architecture in NO_UNEMBEDDING:
        assert w_u is None
        return
    head = model.get_output_embeddings()
    if head is None:  # a base model without a head: tied, with GPT2Model's ln_f (post-norm OPTModel has no final norm)
        final = {"gpt2": lambda: model.ln_f, "opt_base": lambda: None}[name]()
        gain = 1.0 if final is None else effective_gain(final, ckpt.spec.d_model)
        np.testing.assert_allclose(w_u, w_e * gain, rtol=1e-12)
        return
    assert w_e.dtype == w_u.dtype == np.float64 and w_u.shape == w_e.shape
    tied = head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert tied == (model.config.get_text_config().tie_word_embeddings is not False)
    np.testing.assert_allclose(w_u, head.weight.detach().numpy() * final_norm_gain(model, name),
                               rtol=1e-6)  # Gemma and Cohere norm in float32 even in a float64 model


def test_circuits_option_is_validated():
    assert ReadOptions().circuits == ("qk",)
    assert ReadOptions(circuits=("ov", "qk")).circuits == ("qk", "ov")  # normalised to the order qk, ov
    for bad in ((), ("qk", "vo"), ("OV",)):
        with pytest.raises(ValueError, match="qk, ov"):
            ReadOptions(circuits=bad)


def test_a_discovered_family_without_a_proven_ov_circuit_refuses_it(tmp_path, monkeypatch):
    """Discovery proves a family's ov circuit beside its Q/K (extract.layouts.discover._prove_ov); where it finds no
    output projection it refuses ov alone, in one line."""
    from headforms.extract.layouts import discover

    monkeypatch.setenv("HEADFORMS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(discover, "_O_NAMES", ("no_such_projection",))
    folder = tm.save(tm.build("arcee"), tmp_path / "m")
    assert open_folder(folder, "arcee", circuits=("qk",)).read_layer(0)[0].shape == (4, 8, 32)
    with pytest.raises(ExtractError, match="arcee: the ov circuit is refused: its value and output projections, token "
                                           "embedding or final norm were not found"):
        open_folder(folder, "arcee")


def rewritten(folder, change):
    """The folder's safetensors with `change(tensors)` applied."""
    from safetensors.torch import save_file

    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_missing_or_misshapen_v_o_refused_up_front(tmp_path):
    folder = tm.save(tm.build("llama_gqa"), tmp_path / "m")
    rewritten(folder, lambda t: t.pop("model.layers.1.self_attn.v_proj.weight"))
    assert open_folder(folder, "llama_gqa", circuits=("qk",)).read_layer(1)  # qk alone never reads V
    with pytest.raises(ExtractError, match=r"missing tensor 'model.layers.1.self_attn.v_proj.weight' \(layer 1\)"):
        open_folder(folder, "llama_gqa")
    folder = tm.save(tm.build("llama_gqa"), tmp_path / "o")
    rewritten(folder, lambda t: t.update({"model.layers.0.self_attn.o_proj.weight":
                                          t["model.layers.0.self_attn.o_proj.weight"][:, :16].contiguous()}))
    with pytest.raises(ExtractError, match=r"'model.layers.0.self_attn.o_proj.weight' has shape \(32, 16\), "
                                           r"expected \(32, 32\)"):
        open_folder(folder, "llama_gqa")


def test_non_finite_v_refused(tmp_path):
    folder = tm.save(tm.build("gpt2"), tmp_path)

    def spoil(t):
        t["h.1.attn.c_attn.weight"][3, 70] = float("nan")  # column 70 of c_attn: a V row (V is columns 64..95)
    rewritten(folder, spoil)
    ckpt = open_folder(folder, "gpt2")
    with pytest.raises(ExtractError, match="layer 1: tensor 'h.1.attn.c_attn.weight' has non-finite values"):
        ckpt.read_circuits(1)
    folder = tm.save(tm.build("llama"), tmp_path / "o")
    rewritten(folder, lambda t: t["model.layers.0.self_attn.o_proj.weight"].__setitem__((0, 0), float("inf")))
    with pytest.raises(ExtractError, match="layer 0: tensor 'model.layers.0.self_attn.o_proj.weight' has non-finite"):
        open_folder(folder, "llama").read_circuits(0)


@pytest.mark.parametrize("name, mode, norm", [("llama_gqa", "gain", "input_layernorm"), ("gpt2", "center", "ln_1")])
def test_fold_norm_folds_into_w_v(name, mode, norm, tmp_path):
    """With the norm folded, W_V reads the norm's normalised input z: W_V' z = W_V (g * z) (centred: z has zero mean,
    so W_V' = W_V diag(g) P gives the same on it)."""
    model = tm.build(name)
    folder = tm.save(model, tmp_path)
    plain, folded = open_folder(folder, name), open_folder(folder, name, fold_norm=mode)
    gain = next(p for n, p in model.named_parameters() if n.endswith(f"0.{norm}.weight")).detach().numpy()
    z = np.random.default_rng(0).standard_normal((5, plain.spec.d_model))
    z -= z.mean(axis=1, keepdims=True)
    w_v, w_o = plain.read_circuits(0)["ov"]
    w_v_folded, w_o_folded = folded.read_circuits(0)["ov"]
    np.testing.assert_allclose(np.einsum("kva,ta->tkv", w_v_folded, z), np.einsum("kva,ta->tkv", w_v, gain * z),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(w_o_folded, w_o)
    assert not np.allclose(w_v_folded, w_v)


def _out_projection_module(attention):
    """An attention module's output projection, and whether it is GPT-2's Conv1D (stored [H n, N])."""
    module = next(getattr(attention, n) for n in ("o_proj", "c_proj", "dense", "out_proj") if hasattr(attention, n))
    return module, type(module).__name__ == "Conv1D"


def write_gguf_with_ov(model, arch: str, path, skip: str | None = None):
    """The tiny model as llama.cpp's converter writes it, with V and O: gguf_convert's Q/K (permuted for llama, fused
    attn_qkv regrouped Q|K|V), attn_v unpermuted, attn_output (a Conv1D transposed), token_embd, output where the
    model does not tie it, output_norm (Gemma's stored as 1 + w); `skip`: a tensor left out."""
    import gguf

    config = model.config.get_text_config()
    heads, width = config.num_attention_heads, config.hidden_size
    head_dim = getattr(config, "head_dim", None) or width // heads
    attentions = tm._attention_modules(model)
    kv_heads = getattr(attentions[0], "num_kv_heads", None) or getattr(config, "num_key_value_heads", None) or heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_embedding_length(width)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(gguf_convert.rope_theta(config))
    for i, attention in enumerate(attentions):
        tensors = gguf_convert._attention_tensors(arch, attention, heads, kv_heads, head_dim, False)
        if "attn_q" in tensors:
            tensors["attn_v"] = gguf_convert._array(attention.v_proj)
        module, conv1d = _out_projection_module(attention)
        tensors["attn_output"] = gguf_convert._array(module).T if conv1d else gguf_convert._array(module)
        for stem, array in tensors.items():
            if f"blk.{i}.{stem}.weight" != skip:
                writer.add_tensor(f"blk.{i}.{stem}.weight", array.astype(np.float32))
    embedding = model.get_input_embeddings().weight.detach().double().numpy()
    writer.add_tensor("token_embd.weight", embedding.astype(np.float32))
    head = model.get_output_embeddings().weight
    if head.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        writer.add_tensor("output.weight", head.detach().numpy().astype(np.float32))
    norm = next(m for n, m in model.named_modules() if n.endswith(("model.norm", "ln_f", "transformer.ln_f")))
    gain = norm.weight.detach().double().numpy() + (1.0 if arch.startswith("gemma") else 0.0)
    writer.add_tensor("output_norm.weight", gain.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


GGUF_OV_CASES = [("llama", "llama_gqa"), ("qwen2", "qwen2"), ("gemma", "gemma"), ("gpt2", "distilgpt2"),
                 ("bloom", "bloom"), ("falcon", "falcon_gqa"), ("phi3", "phi3")]


@pytest.mark.parametrize(("arch", "name"), GGUF_OV_CASES, ids=[c[1] for c in GGUF_OV_CASES])
def test_gguf_ov_equals_the_models(arch, name, tmp_path):
    """A GGUF file's W_V, W_O and embeddings are the Hugging Face folder's (proven against the model above), to the
    float32 the file stores; llama.cpp's Q/K permutation leaves V alone."""
    model = tm.build(name)
    path = write_gguf_with_ov(model, arch, tmp_path / "m.gguf")
    folder = open_folder(tm.save(model, tmp_path / "hf"), name)
    ckpt = open_gguf(path, name=name, source=str(path), options=ReadOptions(circuits=("qk", "ov")))
    assert ckpt.spec.n_kv_heads == folder.spec.n_kv_heads
    for layer in range(ckpt.spec.n_layers):
        for got, expected in zip(ckpt.read_circuits(layer)["ov"], folder.read_circuits(layer)["ov"]):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    for got, expected in zip(ckpt.read_embeddings(), folder.read_embeddings()):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    qk_only = open_gguf(path, name=name, source=str(path), options=ReadOptions())
    np.testing.assert_array_equal(qk_only.read_layer(1)[1], ckpt.read_layer(1)[1])
    assert qk_only.revision == ckpt.revision and qk_only.qk_bytes < ckpt.qk_bytes


def test_gguf_missing_v_refused_only_for_ov(tmp_path):
    path = write_gguf_with_ov(tm.build("llama_gqa"), "llama", tmp_path / "m.gguf", skip="blk.1.attn_v.weight")
    assert open_gguf(path, name="m", source=str(path)).read_layer(1)
    with pytest.raises(ExtractError, match=f"GGUF file {path} has no tensor blk.1.attn_v.weight"):
        open_gguf(path, name="m", source=str(path), options=ReadOptions(circuits=("qk", "ov")))


def test_opt_350m_projections_fold_into_the_embeddings(monkeypatch, tmp_path):
    """OPT-350m's shape: embeddings of width 16 projected in and out of the width-32 residual stream, post-norm (no
    final norm): W_E P_in^T and W_U P_out are what the residual stream sees, computed here by the model's own modules."""
    monkeypatch.setitem(tm.TINY, "opt_350m", tm.Tiny("OPTForCausalLM", "OPTConfig", dict(
        num_hidden_layers=2, num_attention_heads=4, hidden_size=32, ffn_dim=64, vocab_size=tm.VOCAB,
        max_position_embeddings=32, word_embed_proj_dim=16, do_layer_norm_before=False)))
    model = tm.build("opt_350m")
    ckpt = open_folder(tm.save(model, tmp_path), "opt_350m")
    assert ov_error(model, tmp_path, ckpt, "opt_350m") < 1e-10
    decoder = model.model.decoder
    assert decoder.final_layer_norm is None and decoder.project_in is not None
    with torch.no_grad():
        w_e = decoder.project_in(model.get_input_embeddings().weight).numpy()
        w_u = model.get_output_embeddings()(decoder.project_out(torch.eye(32, dtype=torch.float64))).T.numpy()
    got_e, got_u = ckpt.read_embeddings()
    np.testing.assert_allclose(got_e, w_e, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_u, w_u, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", ["fp8 e4m3 blocks", "gptq 4-bit asym act-order", "awq 4-bit gemm"])
def test_quantized_v_o_read_as_their_dequantized_weights(case, tmp_path):
    """V and O stored quantized (as a quantized checkpoint stores every projection) read as the dense model's."""
    import json
    import re

    from safetensors.torch import save_file

    from tests.test_quantized import FORMS

    make, config, _ = FORMS[case]
    model = tm.build("llama_gqa", hidden_size=64, intermediate_size=64)
    state, dense = {k: v.clone() for k, v in model.state_dict().items()}, {}
    for name in [n for n in state if re.search(r"\.(q|k|v|o)_proj\.weight$", n)]:
        tensors, dense[name] = make(state.pop(name).numpy())
        state |= {name[:-len("weight")] + suffix: t.contiguous() for suffix, t in tensors.items()}
    folder = tmp_path / "q"
    folder.mkdir()
    model.config.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(json.loads((folder / "config.json").read_text())
                                                   | {"quantization_config": config}))
    save_file(state, str(folder / "model.safetensors"))
    with torch.no_grad():
        for name, w in dense.items():
            model.get_parameter(name).copy_(torch.from_numpy(w))
    plain = open_folder(tm.save(model, tmp_path / "dense"), "llama_gqa")
    ours = open_folder(folder, "llama_gqa")
    assert ours.quantization and ours.qk_bytes < plain.qk_bytes
    for layer in range(2):
        for got, expected in zip(ours.read_circuits(layer)["ov"], plain.read_circuits(layer)["ov"]):
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12 * np.abs(expected).max())


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_ov_alone(name, tmp_path):
    """circuits ('ov',): only V/O (and a fused QKV) read and counted; the revision is still the Q/K digest."""
    folder = tm.save(tm.build(name), tmp_path)
    both, alone, qk = (open_folder(folder, name, circuits=c) for c in (("qk", "ov"), ("ov",), ("qk",)))
    assert set(alone.read_circuits(0)) == {"ov"}
    for got, expected in zip(alone.read_circuits(1)["ov"], both.read_circuits(1)["ov"]):
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ExtractError, match="opened for the circuits ov"):
        alone.read_layer(0)
    assert alone.revision == qk.revision
    spec = qk.spec
    v_o = 8 * spec.n_layers * (spec.n_kv_heads + spec.n_heads) * spec.head_dim * spec.d_model  # float64 files
    assert both.qk_bytes == qk.qk_bytes + (v_o if name != "gpt2" else v_o // 2)  # GPT-2: V is in c_attn, read by qk
    assert alone.qk_bytes == (v_o if name != "gpt2" else both.qk_bytes)
