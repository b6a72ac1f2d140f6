"""Where each Hugging Face architecture keeps its attention Q/K weights, and how to split them per head.

A `Layout` is description plus array code: config.json -> `ModelSpec`, layer -> tensor names with the
shapes the config implies, raw tensors -> W_Q (H, n, N) and W_K (Hkv, n, N). File access lives in
extract.hf, so this module stays testable on plain dicts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from headforms.extract.checkpoint import ExtractError, ModelSpec
from headforms.extract.rope import hf_rope

# config.json spellings of the shape fields, first present wins (families name them differently).
_CONFIG_KEYS = {
    "n_layers": ("num_hidden_layers", "n_layer"),
    "n_heads": ("num_attention_heads", "n_head"),
    "d_model": ("hidden_size", "n_embd", "n_embed"),
}
# RoPE variants whose cos/sin carry an attention factor: q.k gets scaled by it squared at every distance.
_SCALED_ROPE = ("yarn", "longrope")


@dataclass(frozen=True)
class Packing:
    """How a family stores one layer's Q and K: tensor roles, their shapes, and the split into heads."""

    shapes: Callable[[ModelSpec], dict[str, tuple[int, ...]]]
    split: Callable[[dict[str, np.ndarray], ModelSpec], tuple[np.ndarray, np.ndarray]]


def _heads(w: np.ndarray, heads: int, s: ModelSpec) -> np.ndarray:
    """Rows of an (heads*n, N) projection as (heads, n, N)."""
    return w.reshape(heads, s.head_dim, s.d_model)


# q_proj/k_proj as separate nn.Linear weights [H*n, N] and [Hkv*n, N] (llama family, OPT, BERT).
SEPARATE = Packing(
    shapes=lambda s: {"q": (s.n_heads * s.head_dim, s.d_model), "k": (s.n_kv_heads * s.head_dim, s.d_model)},
    split=lambda t, s: (_heads(t["q"], s.n_heads, s), _heads(t["k"], s.n_kv_heads, s)),
)
# GPT-2 Conv1D c_attn [N, 3N]: its transpose stacks the Q | K | V row blocks.
CONV1D_QKV = Packing(
    shapes=lambda s: {"qkv": (s.d_model, 3 * s.d_model)},
    split=lambda t, s: tuple(t["qkv"].T.reshape(3, s.n_heads, s.head_dim, s.d_model)[:2]),
)
# Bloom / GPT-NeoX query_key_value [3N, N], interleaved per head as (heads, 3, n, N).
INTERLEAVED_QKV = Packing(
    shapes=lambda s: {"qkv": (3 * s.d_model, s.d_model)},
    split=lambda t, s: tuple(np.moveaxis(t["qkv"].reshape(s.n_heads, 3, s.head_dim, s.d_model), 1, 0)[:2]),
)


def _inverse_sqrt_head_dim(config: dict, head_dim: int) -> float:
    return head_dim**-0.5


def _gpt2_scale(config: dict, head_dim: int) -> float:
    return head_dim**-0.5 if config["scale_attn_weights"] else 1.0


def _query_pre_attn_scale(config: dict, head_dim: int) -> float:
    """Gemma 2/3 scale q.k by query_pre_attn_scalar**-0.5, not head_dim**-0.5."""
    return float(config["query_pre_attn_scalar"]) ** -0.5


def _no_refusal(config: dict) -> str | None:
    return None


def _gpt2_refusal(config: dict) -> str | None:
    if config.get("scale_attn_by_inverse_layer_idx"):
        return "scale_attn_by_inverse_layer_idx makes the score scale differ per layer"
    return None


def _bert_refusal(config: dict) -> str | None:
    kind = config.get("position_embedding_type", "absolute")
    if kind != "absolute":
        return f"position_embedding_type '{kind}' adds position-dependent terms to q.k"
    return None


def _softcap_refusal(config: dict) -> str | None:
    cap = config.get("attn_logit_softcapping")
    if cap is not None:
        return f"attn_logit_softcapping={cap} makes the score a tanh of q.k, not bilinear in x"
    return None


@dataclass(frozen=True)
class Layout:
    """One family's conventions: positional scheme, tensor names (under a prefix), packing, scale."""

    positional: str
    prefixes: tuple[str, ...]     # tried in order against the checkpoint's tensor names
    tensors: dict[str, str]       # role -> name template under the prefix, {i} = layer
    packing: Packing
    grouped: bool = False         # reads num_key_value_heads and an explicit head_dim
    defaults: dict | None = None  # transformers' config defaults that config.json may omit
    text_config: bool = False     # multimodal: the attention shape lives under config["text_config"]
    scale: Callable[[dict, int], float] = _inverse_sqrt_head_dim
    refusal: Callable[[dict], str | None] = _no_refusal
    qk_norm: str | None = None    # None, "head" (gain of size n) or "projection" (gain of size H*n)
    norm_offset: float = 0.0      # the norm multiplies by (offset + weight); gemma3 stores weight - 1

    def tensors_for(self, spec: ModelSpec, prefix: str, layer: int) -> dict[str, tuple[str, tuple[int, ...]]]:
        """role -> (tensor name, expected shape) of one layer; norm gains only when folding."""
        shapes = self.packing.shapes(spec)
        if spec.qk_norm == "folded":
            per_head = self.qk_norm == "head"
            shapes |= {
                "q_norm": (spec.head_dim if per_head else spec.n_heads * spec.head_dim,),
                "k_norm": (spec.head_dim if per_head else spec.n_kv_heads * spec.head_dim,),
            }
        return {role: (prefix + self.tensors[role].format(i=layer), shape) for role, shape in shapes.items()}

    def qk_maps(self, tensors: dict[str, np.ndarray], spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
        """W_Q (H, n, N) and W_K (Hkv, n, N) from a layer's raw tensors, norm gains folded when present.

        Copies to contiguous arrays so no view keeps a fused tensor's V block alive.
        """
        w_q, w_k = self.packing.split(tensors, spec)
        if "q_norm" in tensors:
            w_q = w_q * (self.norm_offset + tensors["q_norm"]).reshape(-1, spec.head_dim, 1)
            w_k = w_k * (self.norm_offset + tensors["k_norm"]).reshape(-1, spec.head_dim, 1)
        return np.ascontiguousarray(w_q), np.ascontiguousarray(w_k)


_LLAMA_TENSORS = {
    "q": "layers.{i}.self_attn.q_proj.weight",
    "k": "layers.{i}.self_attn.k_proj.weight",
    "q_norm": "layers.{i}.self_attn.q_norm.weight",
    "k_norm": "layers.{i}.self_attn.k_norm.weight",
}
_LLAMA_PREFIXES = ("model.", "")


_GEMMA2_DEFAULTS = {"head_dim": 256, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0}
_GEMMA3_DEFAULTS = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256}


def _llama_like(prefixes: tuple[str, ...] = _LLAMA_PREFIXES, **kw) -> Layout:
    """The q_proj/k_proj rotary decoders (llama, mistral, qwen, gemma, olmo2)."""
    return Layout(positional="rope", prefixes=prefixes, tensors=_LLAMA_TENSORS, packing=SEPARATE, grouped=True, **kw)


LAYOUTS: dict[str, Layout] = {
    "gpt2": Layout(positional="learned", prefixes=("transformer.", ""),
                   tensors={"qkv": "h.{i}.attn.c_attn.weight"}, packing=CONV1D_QKV,
                   defaults={"scale_attn_weights": True}, scale=_gpt2_scale, refusal=_gpt2_refusal),
    "opt": Layout(positional="learned", prefixes=("model.decoder.", "decoder."),
                  tensors={"q": "layers.{i}.self_attn.q_proj.weight", "k": "layers.{i}.self_attn.k_proj.weight"},
                  packing=SEPARATE),
    "bloom": Layout(positional="alibi", prefixes=("transformer.", ""),
                    tensors={"qkv": "h.{i}.self_attention.query_key_value.weight"}, packing=INTERLEAVED_QKV),
    "gpt_neox": Layout(positional="rope", prefixes=("gpt_neox.", ""),
                       tensors={"qkv": "layers.{i}.attention.query_key_value.weight"}, packing=INTERLEAVED_QKV),
    "bert": Layout(positional="absolute", prefixes=("bert.", ""),
                   tensors={"q": "encoder.layer.{i}.attention.self.query.weight",
                            "k": "encoder.layer.{i}.attention.self.key.weight"},
                   packing=SEPARATE, refusal=_bert_refusal),
    "llama": _llama_like(),
    "mistral": _llama_like(),
    "qwen2": _llama_like(),
    "gemma": _llama_like(defaults={"head_dim": 256}),
    "gemma2": _llama_like(defaults=_GEMMA2_DEFAULTS, scale=_query_pre_attn_scale, refusal=_softcap_refusal),
    "qwen3": _llama_like(defaults={"head_dim": 128}, qk_norm="head"),
    "olmo2": _llama_like(qk_norm="projection"),
    "gemma3_text": _llama_like(defaults=_GEMMA3_DEFAULTS, scale=_query_pre_attn_scale, refusal=_softcap_refusal,
                               qk_norm="head", norm_offset=1.0),
    "gemma3": _llama_like(("language_model.model.", "model.language_model."), defaults=_GEMMA3_DEFAULTS,
                          text_config=True, scale=_query_pre_attn_scale, refusal=_softcap_refusal,
                          qk_norm="head", norm_offset=1.0),
}
SUPPORTED = sorted(LAYOUTS)


def layout_for(model_type: str | None) -> Layout:
    """The layout of a config's model_type, or the ExtractError listing what is supported."""
    if model_type not in LAYOUTS:
        raise ExtractError(f"unsupported architecture '{model_type}'; supported: {', '.join(SUPPORTED)}")
    return LAYOUTS[model_type]


def _positive_int(config: dict, keys: tuple[str, ...]) -> int:
    key = next((k for k in keys if config.get(k) is not None), None)
    if key is None:
        raise ExtractError(f"config.json has none of {', '.join(keys)}")
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ExtractError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def _rope_settings(config: dict) -> list[dict]:
    """RoPE parameter dicts of a config: v5 rope_parameters (possibly one per layer type) or v4 rope_scaling."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if any(isinstance(v, dict) for v in params.values()):
        return [v for v in params.values() if isinstance(v, dict)]
    return [params]


def _rotary_fraction(config: dict) -> float:
    """Share of each head's dimensions that RoPE rotates (GPT-NeoX/Pythia use 0.25)."""
    for rope in _rope_settings(config):
        if "partial_rotary_factor" in rope:
            return float(rope["partial_rotary_factor"])
    return float(config.get("partial_rotary_factor", config.get("rotary_pct", 1.0)))


def _refusal(layout: Layout, raw: dict, config: dict) -> str | None:
    """Why a checkpoint's attention score is not scale * x_j^T L x_i at distance 0, if it is not."""
    if raw.get("quantization_config"):
        method = raw["quantization_config"].get("quant_method", "unknown")
        return f"quantized checkpoints ({method}) are not supported"
    if layout.positional == "rope":
        kinds = {r.get("rope_type", r.get("type")) for r in _rope_settings(config)} & set(_SCALED_ROPE)
        if kinds:
            return f"rope_type '{kinds.pop()}' multiplies q and k by an attention factor"
    return layout.refusal(config)


def model_spec(raw: dict, *, qk_norm: str = "refuse") -> tuple[Layout, ModelSpec]:
    """Validate a config.json and normalise it to (layout, ModelSpec); spec.config keeps the raw config.

    qk_norm="refuse" rejects QK-norm models (their score is not bilinear in x); "fold" folds the
    norm gains into W_Q, W_K and marks the spec qk_norm="folded".
    """
    if qk_norm not in ("refuse", "fold"):
        raise ExtractError(f"unknown qk-norm option '{qk_norm}'; expected 'refuse' or 'fold'")
    model_type = raw.get("model_type")
    layout = layout_for(model_type)
    config = (layout.defaults or {}) | ((raw.get("text_config") or {}) if layout.text_config else raw)
    reason = _refusal(layout, raw, config)
    if reason:
        raise ExtractError(f"{model_type} is refused: {reason}")
    if layout.qk_norm and qk_norm == "refuse":
        raise ExtractError(
            f"{model_type} uses QK-norm, so the attention score is not bilinear in x; "
            "pass --qk-norm fold to fold the norm gains into W_Q and W_K (L then acts on RMS-normalised q, k)"
        )
    n_layers, n_heads, d_model = (_positive_int(config, _CONFIG_KEYS[f]) for f in ("n_layers", "n_heads", "d_model"))
    n_kv_heads, head_dim = n_heads, None
    if layout.grouped:
        n_kv_heads = _positive_int(config, ("num_key_value_heads", "num_attention_heads", "n_head"))
        if config.get("head_dim") is not None:
            head_dim = _positive_int(config, ("head_dim",))
    if head_dim is None:
        if d_model % n_heads:
            raise ExtractError(f"config.json: width {d_model} is not divisible by {n_heads} heads")
        head_dim = d_model // n_heads
    if n_heads % n_kv_heads:
        raise ExtractError(f"config.json: {n_heads} query heads are not divisible by {n_kv_heads} key/value heads")
    recorded, rope = dict(raw), None
    if layout.positional == "rope":
        recorded["rotary_fraction"] = _rotary_fraction(config)
        rope = hf_rope(_rope_settings(config), config, head_dim, recorded["rotary_fraction"])
    spec = ModelSpec(
        architecture=model_type,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_model=d_model,
        head_dim=head_dim,
        score_scale=layout.scale(config, head_dim),
        positional=layout.positional,
        qk_norm="folded" if layout.qk_norm else None,
        config=recorded,
        rope=rope,
    )
    return layout, spec
