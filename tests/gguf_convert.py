"""Write a tiny transformers model as GGUF the way llama.cpp's convert_hf_to_gguf.py does, for the
attention tensors only: its tensor names and metadata keys, its Q/K row permutation for llama-family
models, its Q|K|V regrouping of fused projections, and Gemma's norm gains stored as 1 + w.

Independent of headforms' reader: tests compare what headforms extracts from these files with the
tiny model's own attention logits.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests import tiny_models as tm

PERMUTED = ("llama", "mistral3", "granite", "granitemoe", "arcee", "olmo")  # q_proj/k_proj rows permuted
NORM_PLUS_ONE = ("gemma3",)                  # Gemma3Model adds 1 to every norm weight


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation of a head's rows from split-half RoPE pairs to adjacent pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _array(module) -> np.ndarray:
    return module.weight.detach().double().numpy()


def _attention_tensors(arch: str, attention, heads: int, kv_heads: int, head_dim: int,
                       fuse: bool) -> dict[str, np.ndarray]:
    """GGUF stem -> array of one layer's attention module, as the converter writes it (fuse: q|k|v rows in
    one attn_qkv, as early phi-2 files converted from its Wqkv)."""
    if hasattr(attention, "qkv_proj"):  # phi3: q | k | v rows already
        return {"attn_qkv": _array(attention.qkv_proj)}
    if hasattr(attention, "c_attn"):    # gpt2's Conv1D (N, 3N) is transposed; gpt_bigcode's Linear is rows already
        w = _array(attention.c_attn)
        return {"attn_qkv": w.T if type(attention.c_attn).__name__ == "Conv1D" else w}
    if hasattr(attention, "query_key_value"):
        w = _array(attention.query_key_value)
        n_embd = w.shape[1]
        if arch == "falcon":  # kv groups of (heads/kv query heads, one key, one value) -> Q | K | V
            groups = w.reshape(kv_heads, heads // kv_heads + 2, head_dim, n_embd)
            parts = (groups[:, :-2], groups[:, -2], groups[:, -1])
        else:                 # bloom, gpt-neox: (heads, 3, n, N) -> Q | K | V
            per_head = w.reshape(heads, 3, head_dim, n_embd)
            parts = (per_head[:, 0], per_head[:, 1], per_head[:, 2])
        return {"attn_qkv": np.concatenate([p.reshape(-1, n_embd) for p in parts])}
    q, k = _array(attention.q_proj), _array(attention.k_proj)
    if fuse:
        return {"attn_qkv": np.concatenate([q, k, _array(attention.v_proj)])}
    if arch in PERMUTED:
        q, k = permute(q, heads), permute(k, kv_heads)
    out = {"attn_q": q, "attn_k": k}
    for stem, norm in (("attn_q_norm", "q_norm"), ("attn_k_norm", "k_norm")):
        if hasattr(attention, norm):
            out[stem] = _array(getattr(attention, norm)) + (1.0 if arch in NORM_PLUS_ONE else 0.0)
    return out


def rope_theta(config) -> float:
    """The RoPE base the converter writes as rope.freq_base: the config's rope_theta (Gemma 3's global layers'
    where each layer type has its own), 10000 where the config names none (GPT-J's fixed base)."""
    params = config.to_dict().get("rope_parameters") or {}
    params = params.get("full_attention", params)
    return float(params.get("rope_theta", 10000.0))


def write(model, arch: str, path: Path, *, qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
          metadata: dict | None = None, fuse: bool = False) -> Path:
    """`model` as a GGUF file of architecture `arch`; 2-D tensors quantized to qtype; `metadata` keys ({arch}
    filled in) added as strings or float32."""
    config = model.config.get_text_config()
    heads, width = config.num_attention_heads, config.hidden_size
    head_dim = getattr(config, "head_dim", None) or width // heads
    attentions = tm._attention_modules(model)
    # Falcon's config keeps num_kv_heads = heads for multi-query models; its attention module knows better
    kv_heads = getattr(attentions[0], "num_kv_heads", None) or getattr(config, "num_key_value_heads", None) or heads
    rotary = getattr(config, "partial_rotary_factor", None) or config.to_dict().get("rope_parameters", {}).get(
        "partial_rotary_factor", 1.0)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_embedding_length(width)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(int(head_dim * rotary))
    writer.add_rope_freq_base(rope_theta(config))
    if getattr(config, "attention_multiplier", None):  # Granite
        writer.add_attention_scale(config.attention_multiplier)
    if getattr(config, "attn_logit_softcapping", None):  # Gemma 2
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
    for key, value in (metadata or {}).items():
        (writer.add_string if isinstance(value, str) else writer.add_float32)(key.format(arch=arch), value)
    for i, attention in enumerate(attentions):
        for stem, array in _attention_tensors(arch, attention, heads, kv_heads, head_dim, fuse).items():
            if array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
                writer.add_tensor(f"blk.{i}.{stem}.weight", gguf.quants.quantize(array.astype(np.float32), qtype),
                                  raw_dtype=qtype)
            else:
                writer.add_tensor(f"blk.{i}.{stem}.weight", array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
