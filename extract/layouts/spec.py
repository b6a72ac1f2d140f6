"""A config.json read as (layout, ModelSpec): the table's layout for its model_type (extract.layouts.table), else
one discovered from transformers (extract.layouts.discover), validated against the reading options, or refused in one
line."""
from __future__ import annotations

import fnmatch
from dataclasses import replace

from headforms.extract.checkpoint import ExtractError, ModelSpec, ReadOptions
from headforms.extract.layouts import latent, quantized
from headforms.extract.layouts.discover import discover_layout
from headforms.extract.layouts.rope import hf_rope
from headforms.extract.layouts.table import LATENT_NORMS, LAYOUTS, REFUSED, SUPPORTED, Layout, layout_key

# config.json spellings of the shape fields, first present wins (families name them differently).
CONFIG_KEYS = {
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "n_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "d_model": ("hidden_size", "n_embd", "n_embed", "d_model", "dim"),
}


def layout_for(model_type: str | None, raw: dict) -> Layout:
    """The layout of a LAYOUTS key; other model_types are discovered from raw with transformers, or refused."""
    if model_type in LAYOUTS:
        return LAYOUTS[model_type]
    if model_type in REFUSED:
        raise ExtractError(f"{model_type} is refused: {REFUSED[model_type]}")
    if not isinstance(model_type, str):
        raise ExtractError(f"config.json names no architecture (model_type is {model_type!r}); supported: "
                           f"{', '.join(SUPPORTED)}")
    return discover_layout(raw, shaped_spec)


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


def _rotary_fraction(config: dict, head_dim: int) -> float:
    """Share of each head's dimensions that RoPE rotates (GPT-NeoX/Pythia use 0.25, GPT-J rotary_dim of n)."""
    for rope in _rope_settings(config):
        if "partial_rotary_factor" in rope:
            return float(rope["partial_rotary_factor"])
    if config.get("rotary_dim"):
        return config["rotary_dim"] / head_dim
    return float(config.get("partial_rotary_factor", config.get("rotary_pct", 1.0)))


def attention_unconverted(layout: Layout, raw: dict, config: dict) -> bool:
    """Whether quantization_config.modules_to_not_convert names every layer's attention module (gpt-oss quantizes
    its experts only): its Q/K are then stored as they are, and read so (a parent module or a glob names it too)."""
    skipped = (raw.get("quantization_config") or {}).get("modules_to_not_convert") or []
    module = layout.tensors.get("q", "").rsplit(".", 2)[0]
    keys = CONFIG_KEYS | (layout.config_keys or {})
    layers = next((config[k] for k in keys["n_layers"] if isinstance(config.get(k), int)), 0)

    def covered(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) or name.startswith(p + ".") for p in skipped if isinstance(p, str))

    return bool(module and layers) and all(any(covered(prefix + module.format(i=i)) for prefix in layout.prefixes)
                                           for i in range(layers))


def _refusal(layout: Layout, raw: dict, config: dict) -> str | None:
    """Why a checkpoint's attention score is not scale * x_j^T L x_i at distance 0, if it is not."""
    if raw.get("quantization_config") and not attention_unconverted(layout, raw, config):
        reason = quantized.refusal(raw)  # a quantized checkpoint this cannot dequantize
        if reason:
            return reason
    return layout.refusal(config)


def model_spec(raw: dict, options: ReadOptions = ReadOptions()) -> tuple[Layout, ModelSpec]:
    """Validate a config.json and normalise it to (layout, ModelSpec); spec.config keeps the raw config.

    options.qk_norm="refuse" rejects QK-norm models (their score is not bilinear in x); "fold" folds the
    norm gains into W_Q, W_K and marks the spec qk_norm="folded". options.tower picks the tower of a
    multi-tower model (TOWERS; default its first), recorded as architecture "model_type.tower".
    """
    qk_norm, tower = options.qk_norm, options.tower
    if qk_norm not in ("refuse", "fold"):
        raise ExtractError(f"unknown qk_norm={qk_norm!r}; expected 'refuse' or 'fold'")
    architecture = layout_key(raw, tower)
    layout = layout_for(architecture, raw)
    config = (layout.defaults or {}) | ((raw.get(layout.sub_config) or {}) if layout.sub_config else raw)
    layout = layout.for_config(config)
    reason = _refusal(layout, raw, config)
    if reason:
        raise ExtractError(f"{architecture} is refused: {reason}")
    if layout.qk_norm == LATENT_NORMS:  # each head's two parts (extract.layouts.latent), or its refusal in one line
        if options.fold_norm != "none":
            raise ExtractError(f"{architecture}: fold_norm='{options.fold_norm}' is not built for multi-head latent "
                               "attention (its pre-attention norm feeds the down-projections of every head)")
        return layout, latent.model_spec(latent.latent_spec(raw, qk_norm))
    if layout.qk_norm and qk_norm == "refuse":
        raise ExtractError(
            f"{architecture} uses QK-norm, so the attention score is not bilinear in x; "
            "pass qk_norm='fold' to fold the norm gains into W_Q and W_K (L then acts on RMS-normalised q, k)"
        )
    return layout, shaped_spec(layout, raw, config, architecture)


def _whole_head_factor(rope, head_dim: int) -> float:
    """a^2 of RoPE's attention factor a (yarn, longrope) where it rotates the whole head: q.k scaled by it at every
    distance, so score_scale carries it; with partial rotary only the rotated rows are scaled (Layout.qk_maps)."""
    if rope is None or rope.rotary_dims != head_dim:
        return 1.0
    return rope.attention_factor**2


def shaped_spec(layout: Layout, raw: dict, config: dict, architecture: str) -> ModelSpec:
    """The ModelSpec of a config read with an accepted layout: head counts, sizes, scale and RoPE."""
    keys = CONFIG_KEYS | (layout.config_keys or {})
    n_layers, n_heads, d_model = (_positive_int(config, keys[f]) for f in ("n_layers", "n_heads", "d_model"))
    n_kv_heads, head_dim = n_heads, None
    if layout.kv_heads:
        n_kv_heads = layout.kv_heads(config, n_heads)
    elif layout.grouped:
        n_kv_heads = _positive_int(config, ("num_key_value_heads", "num_attention_heads", "n_head"))
    if layout.grouped and config.get("head_dim") is not None:
        head_dim = _positive_int(config, ("head_dim",))
    if head_dim is None:
        if d_model % n_heads:
            raise ExtractError(f"config.json: width {d_model} is not divisible by {n_heads} heads")
        head_dim = d_model // n_heads
    if n_heads % n_kv_heads:
        raise ExtractError(f"config.json: {n_heads} query heads are not divisible by {n_kv_heads} key/value heads")
    recorded, rope = dict(raw), None
    if layout.positional == "rope":
        recorded["rotary_fraction"] = _rotary_fraction(config, head_dim)
        rope = hf_rope(_rope_settings(config), config, head_dim, recorded["rotary_fraction"], layout.rope_pairing)
        if layout.nope is not None:  # layers without RoPE (Llama 4, SmolLM3): R(delta) = I, a query factor recorded
            rope = replace(rope, nope_layers=layout.nope.layers(config, n_layers))
            if rope.nope_layers and layout.nope.temperature and (temperature := layout.nope.temperature(config)):
                recorded["attention_temperature"] = temperature
            if rope.nope_layers and rope.attention_factor != 1.0:
                raise ExtractError(f"{architecture} is refused: RoPE's attention factor {rope.attention_factor:g} "
                                   "scales the scores of its RoPE layers but not of its NoPE layers; per-layer score "
                                   "scales are not implemented")
    if architecture != raw.get("model_type"):
        recorded["tower"] = architecture.partition(".")[2]
    attention = layout.attention_layers(config) if layout.attention_layers else None
    if attention is not None and not (attention and set(attention) <= set(range(n_layers))):
        raise ExtractError(f"config.json: the attention layers {list(attention)} are not among its {n_layers} layers")
    return ModelSpec(
        architecture=architecture,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_model=d_model,
        head_dim=head_dim,
        score_scale=layout.scale.of(config, head_dim) * _whole_head_factor(rope, head_dim),
        positional=layout.positional,
        qk_norm="folded" if layout.qk_norm else None,
        config=recorded,
        rope=rope,
        softcap=float(config[layout.softcap]) if layout.softcap and config.get(layout.softcap) else None,
        attention_layers=attention,
    )
