"""Where llama.cpp's converter keeps each architecture's attention in a GGUF file, and what its score needs.

What each architecture's file holds is data, `GGUF_ARCHITECTURES`: where Q and K live (separate
attn_q / attn_k, or one fused attn_qkv), how RoPE pairs the rows as stored, which QK-norm gains
come with it, and the score-scale rule llama.cpp applies; extract.formats.gguf_file reads a file by it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from headforms.extract.checkpoint import ExtractError
from headforms.extract.layouts import latent
from headforms.extract.layouts.rope import DEFAULT_THETA


def _inverse_sqrt_head_dim(meta: dict, arch: str, spec: dict) -> float:
    """1/sqrt(n), n = attention.key_length (llama.cpp's default kq_scale)."""
    return spec["head_dim"] ** -0.5


def _attention_scale_key(meta: dict, arch: str, spec: dict) -> float:
    """`{arch}.attention.scale` when the file sets it (Granite's attention_multiplier), else 1/sqrt(n)."""
    return float(meta.get(f"{arch}.attention.scale") or _inverse_sqrt_head_dim(meta, arch, spec))


_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # how llama.cpp recognises the 27B models


def _gemma_by_size(meta: dict, arch: str, spec: dict) -> float:
    """llama.cpp's Gemma 2/3 rule (their query_pre_attn_scalar): 1/sqrt(N/H) for the 27B, 1/sqrt(n) otherwise."""
    if spec["n_layers"] == _GEMMA_27B_LAYERS[arch]:
        return (spec["d_model"] // spec["n_heads"]) ** -0.5
    return _inverse_sqrt_head_dim(meta, arch, spec)


# Score-scale rules by the name `headforms architectures` shows.
SCALE_RULES = {
    "1/sqrt(head_dim)": _inverse_sqrt_head_dim,
    "attention.scale, else 1/sqrt(head_dim)": _attention_scale_key,
    "1/sqrt(N/H) for the 27B, else 1/sqrt(head_dim)": _gemma_by_size,
}


@dataclass(frozen=True)
class GGUFArchitecture:
    """How llama.cpp's converter stores one architecture's attention, and what its score needs."""

    positional: str
    """Positional scheme: "rope", "learned" (absolute embeddings added to x) or "alibi"."""
    packings: tuple[str, ...] = ("separate",)
    """Q/K tensors the converter writes, first present wins: "separate" attn_q/attn_k, "fused" attn_qkv (rows
    Q|K|V), "latent" multi-head latent attention's down- and up-projections (extract.layouts.latent)."""
    rope_pairing: str | None = None
    """RoPE pairs of a head's rows as stored: "interleaved" (2i, 2i+1) or "split-half" (i, i + n/2); None: no RoPE."""
    qk_norm: str | None = None
    """QK-norm gains the file may hold: "head" (RMS, size n), "projection" (RMS, size H*n), "layer" (LayerNorm)."""
    norm_offset: float = 0.0
    """The norm multiplies by (offset + stored gain); llama.cpp stores Gemma's 1 + w, so 0 for every file."""
    score_scale: str = "1/sqrt(head_dim)"
    """Score-scale rule, a key of SCALE_RULES: the factor on q.k before the softmax."""
    refusal: str | None = None
    """Why every file of the architecture is refused (its score is not bilinear in x), or None."""
    softcap: float | None = None
    """llama.cpp soft-caps the logit, cap * tanh(s / cap): {arch}.attn_logit_softcapping, this when the file omits it."""

    @property
    def packing(self) -> str:
        """The Q/K tensors in words, for `headforms architectures`."""
        return " or ".join({"separate": "attn_q, attn_k", "fused": "attn_qkv (Q|K|V)",
                            "latent": "latent: attn_q_a, attn_q_b (or attn_q), attn_kv_a_mqa, attn_kv_b (or attn_k_b)"}[p]
                           for p in self.packings)

    @property
    def notes(self) -> str:
        """RoPE pairing, QK-norm handling and refusal in words, for `headforms architectures`."""
        notes = [f"RoPE pairs {self.rope_pairing} as stored"] if self.rope_pairing else []
        if self.qk_norm in ("head", "projection"):
            notes.append(f"QK-norm ({self.qk_norm} gains): refused unless --qk-norm fold")
        elif self.qk_norm == "layer":
            notes.append("refused when the file has QK LayerNorm")
        elif self.qk_norm == "latent":
            notes.append(latent.TREATMENT)
        if self.softcap:
            notes.append(f"soft-capped: the logit is cap * tanh(s / cap), cap = attn_logit_softcapping (default "
                         f"{self.softcap:g}); the form gives s (models.attention_softcap)")
        if self.refusal:
            notes.append(f"refused: {self.refusal}")
        return "; ".join(notes)


_INTERLEAVED = GGUFArchitecture("rope", rope_pairing="interleaved")  # permuted from HF's split halves (Cohere: native)
_SPLIT_HALF = GGUFArchitecture("rope", rope_pairing="split-half")     # stored as Hugging Face has them
_GRANITE = GGUFArchitecture("rope", rope_pairing="interleaved", score_scale="attention.scale, else 1/sqrt(head_dim)")
_FUSED_SPLIT_HALF = GGUFArchitecture("rope", packings=("fused",), rope_pairing="split-half")

GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "llama": _INTERLEAVED,  # Mistral and SmolLM are stored as llama too
    "mistral3": _INTERLEAVED,
    "olmo": _INTERLEAVED,
    "arcee": _INTERLEAVED,
    "granite": _GRANITE,
    "granitemoe": _GRANITE,
    "qwen2": _SPLIT_HALF,
    "qwen2moe": _SPLIT_HALF,
    "qwen3": GGUFArchitecture("rope", rope_pairing="split-half", qk_norm="head"),
    "qwen3moe": GGUFArchitecture("rope", rope_pairing="split-half", qk_norm="head"),
    "olmo2": GGUFArchitecture("rope", rope_pairing="split-half", qk_norm="projection"),
    "olmoe": GGUFArchitecture("rope", rope_pairing="split-half", qk_norm="projection"),
    "gemma": _SPLIT_HALF,
    "gemma2": GGUFArchitecture("rope", rope_pairing="split-half",
                               score_scale="1/sqrt(N/H) for the 27B, else 1/sqrt(head_dim)", softcap=50.0),
    "gemma3": GGUFArchitecture("rope", rope_pairing="split-half", qk_norm="head",
                               score_scale="1/sqrt(N/H) for the 27B, else 1/sqrt(head_dim)"),
    "phi3": _FUSED_SPLIT_HALF,
    "falcon": _FUSED_SPLIT_HALF,  # the converter regroups query_key_value as Q|K|V
    "gptneox": _FUSED_SPLIT_HALF,
    "starcoder2": _SPLIT_HALF,
    "stablelm": GGUFArchitecture("rope", rope_pairing="split-half", qk_norm="layer"),
    "command-r": GGUFArchitecture("rope", rope_pairing="interleaved", qk_norm="layer"),  # Cohere rotates pairs
    "cohere2": _INTERLEAVED,
    "phi2": GGUFArchitecture("rope", packings=("separate", "fused"), rope_pairing="split-half"),  # early files fused
    "gpt2": GGUFArchitecture("learned", packings=("fused",)),
    "starcoder": GGUFArchitecture("learned", packings=("fused",)),  # multi-query gpt_bigcode
    "bloom": GGUFArchitecture("alibi", packings=("fused",)),
    # Known to llama.cpp, refused with the reason:
    "grok": GGUFArchitecture("rope", refusal="its soft cap and score scale are fixed in llama.cpp's code, not in the "
                                             "file, and transformers has no Grok whose logits could prove its Q/K "
                                             "layout"),
    "deepseek2": GGUFArchitecture("rope", packings=("latent",), rope_pairing="interleaved", qk_norm="latent"),
    "llama4": GGUFArchitecture("rope", refusal="which of its layers skip RoPE, scale q by a temperature and "
                                               "L2-normalise q and k is not in the file but in llama.cpp's code, whose "
                                               "rules for it have changed between versions (the Hugging Face "
                                               "checkpoint is read)"),
}
SUPPORTED_GGUF = [name for name, a in GGUF_ARCHITECTURES.items() if a.refusal is None]


def file_refusal(meta: dict, arch: str) -> str | None:
    """Why a file's score is not scale * x_j^T L x_i at distance 0 although its architecture can be, if so."""
    cap = meta.get(f"{arch}.attn_logit_softcapping")
    if cap and not GGUF_ARCHITECTURES[arch].softcap:
        return f"attn_logit_softcapping={cap:g} makes the score a tanh of q.k, not bilinear in x"
    if meta.get(f"{arch}.attention.clamp_kqv"):
        return "attention.clamp_kqv clips q and k, so the score is not bilinear in x"
    if meta.get(f"{arch}.attention.temperature_scale"):
        return "attention.temperature_scale multiplies q by a factor that grows with position"
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.attn_factor", 1.0)
    if kind in ("yarn", "longrope") or factor != 1.0:
        return f"rope scaling '{kind}' (attention factor {factor:g}) multiplies q and k by an attention factor"
    return None


def qk_norm_refusal(arch: str, layout: GGUFArchitecture) -> str:
    """The one line refusing a file's QK-norm: LayerNorm never folds, RMS gains fold on request."""
    if layout.qk_norm == "layer":
        return (f"GGUF {arch} file has QK LayerNorm (attn_q_norm, attn_k_norm): it subtracts the mean of q and k, "
                "so the score is not bilinear in x and its gains do not fold into W_Q, W_K")
    return (f"GGUF {arch} file uses QK-norm (attn_q_norm, attn_k_norm), so the attention score is not bilinear in x; "
            "pass qk_norm='fold' to fold the norm gains into W_Q and W_K (L then acts on RMS-normalised q, k)")


# GGUF deepseek2 (llama.cpp): role -> tensor stem of blk.{i}; kv_b is stored whole (attn_kv_b, as Hugging Face's), or,
# by converters since MLA's absorption, as attn_k_b (H, kv_lora, nope: each head's k rows transposed) and attn_v_b.
LATENT_TENSORS = {"q": "attn_q", "q_a": "attn_q_a", "q_a_norm": "attn_q_a_norm", "q_b": "attn_q_b",
                  "kv_a": "attn_kv_a_mqa", "kv_a_norm": "attn_kv_a_norm", "kv_b": "attn_kv_b", "k_b": "attn_k_b"}


def latent_roles(meta: dict, names: set[str], path, qk_norm: str) -> tuple[latent.LatentSpec, dict]:
    """(LatentSpec, role -> (tensor stem, shape)) of a GGUF deepseek2 file from its metadata and tensor names, kv_b
    whole or split into k_b; llama.cpp's RoPE for deepseek2 rotates consecutive pairs, its score scale is
    1/sqrt(nope + rope)."""
    arch = meta.get("general.architecture")

    def key(suffix: str, optional: bool = False):
        value = meta.get(f"{arch}.{suffix}")
        if value is None and not optional:
            raise ExtractError(f"GGUF file {path} lacks the scalar metadata {arch}.{suffix}")
        return value

    rope = key("rope.dimension_count")
    head_k = key("attention.key_length_mla", optional=True) or key("attention.key_length")
    head_v = key("attention.value_length_mla", optional=True) or key("attention.value_length")
    lora = "blk.0.attn_q_a.weight" in names
    raw = {"model_type": "deepseek_v2", "num_hidden_layers": key("block_count"),
           "num_attention_heads": key("attention.head_count"), "hidden_size": key("embedding_length"),
           "q_lora_rank": key("attention.q_lora_rank") if lora else None,
           "kv_lora_rank": key("attention.kv_lora_rank"), "qk_rope_head_dim": rope,
           "qk_nope_head_dim": head_k - rope, "v_head_dim": head_v,
           "rope_theta": float(key("rope.freq_base", optional=True) or DEFAULT_THETA)}
    spec = latent.latent_spec({k: int(v) if isinstance(v, (int, np.integer)) else v for k, v in raw.items()},
                              qk_norm, label=f"GGUF file {path} (its metadata)")
    shapes = spec.shapes()
    if "blk.0.attn_k_b.weight" in names:
        del shapes["kv_b"]
        shapes["k_b"] = (spec.n_heads, spec.kv_lora_rank, spec.nope)
    return replace(spec, architecture=arch, config=meta), {role: (LATENT_TENSORS[role], shape)
                                                           for role, shape in shapes.items()}
