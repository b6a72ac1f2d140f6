"""A checkpoint's rotary position embedding, as the rows of its Q/K maps are stored: base (theta),
rotated dimensions, pairing of the rows, scaling, and the resulting angular frequencies.

compute.rotary builds R(delta) from a `Rope`; this module only reads the conventions. Scalings
that are not implemented, or that do not make the score bilinear at a fixed distance, leave the
frequencies empty and say why in `refusal` (extract then accepts only --distances 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_THETA = 10000.0
SCALINGS = ("default", "linear", "llama3")
# Scalings computed by transformers' own rope init functions (transformers.modeling_rope_utils), their frequencies and
# attention factor exactly as the model gets them; those whose frequencies change with the sequence length say how.
TRANSFORMERS_SCALINGS = ("yarn", "longrope", "dynamic")
LENGTH_DEPENDENT = {
    "dynamic": "dynamic NTK changes the frequencies with the sequence length",
    "longrope": "longrope uses its short factors up to original_max_position_embeddings tokens and its long factors "
                "beyond, so the frequencies change with the sequence length",
}
PAIRINGS = ("split-half", "interleaved")


@dataclass(frozen=True)
class Rope:
    """RoPE of a checkpoint: rotated coordinates `rotary_dims` (the leading ones of each head) paired
    `pairing` ('split-half' or 'interleaved'), `frequencies` in radians per position (one per pair)."""

    theta: float
    rotary_dims: int
    pairing: str
    scaling: str
    frequencies: tuple[float, ...] = ()
    refusal: str | None = None  # why L_delta at delta != 0 is not computed for this checkpoint
    attention_factor: float = 1.0  # a on cos and sin (yarn, longrope): the rotated part of q.k scaled by a^2
    nope_layers: tuple[int, ...] = ()  # layers it skips (Llama 4's, SmolLM3's NoPE layers): R(delta) = I

    def describe(self) -> dict:
        """The description recorded in models.config (rope)."""
        return {"theta": self.theta, "rotary_dims": self.rotary_dims, "pairing": self.pairing,
                "scaling": self.scaling, "refusal": self.refusal, "attention_factor": self.attention_factor} | (
            {"nope_layers": list(self.nope_layers)} if self.nope_layers else {})

    def frequencies_of(self, layer: int) -> tuple[float, ...]:
        """A layer's frequencies: none where RoPE skips it (a NoPE layer's form is the same at every distance)."""
        return () if layer in self.nope_layers else self.frequencies


def _base_frequencies(theta: float, dims: int) -> np.ndarray:
    """theta^(-2i/d), i < d/2: the unscaled RoPE frequencies."""
    return theta ** -(np.arange(0, dims, 2, dtype=np.float64) / dims)


def _llama3(freq: np.ndarray, params: dict) -> np.ndarray:
    """Llama 3.1's scaling: long wavelengths divided by `factor`, short ones kept, a smooth ramp between."""
    factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
    context = float(params["original_max_position_embeddings"])
    wavelength = 2 * math.pi / freq
    out = np.where(wavelength > context / low, freq / factor, freq)
    ramp = (wavelength <= context / low) & (wavelength >= context / high)  # empty where low = high (Llama 4 Scout)
    smooth = (context / wavelength[ramp] - low) / (high - low)
    out[ramp] = (1 - smooth) * freq[ramp] / factor + smooth * freq[ramp]
    return out


def _transformers_rope(config: dict, scaling: str) -> tuple[np.ndarray, float]:
    """(frequencies, attention factor) of a scaling as transformers' rope init function computes them for the config
    (in float32, as the model has them)."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    text = AutoConfig.for_model(**config).get_text_config()
    inv_freq, factor = ROPE_INIT_FUNCTIONS[scaling](text, "cpu")
    return inv_freq.double().numpy(), float(factor)


def rope(theta: float, rotary_dims: int, pairing: str, scaling: str = "default", params: dict | None = None,
         refusal: str | None = None, config: dict | None = None) -> Rope:
    """A Rope with its frequencies, or with a refusal for a scaling not implemented; `config` (a transformers
    config.json) for the TRANSFORMERS_SCALINGS."""
    if refusal is None and pairing not in PAIRINGS:
        refusal = "the pairing of the rotated coordinates is not recognised (the family's rotate_half is neither "\
                  "split-half nor interleaved)"
    if refusal is None and rotary_dims % 2:
        refusal = f"an odd number of rotary dimensions ({rotary_dims})"
    if refusal is None and scaling in TRANSFORMERS_SCALINGS and config is not None and pairing in PAIRINGS:
        try:
            freq, factor = _transformers_rope(config, scaling)
        except Exception as e:  # transformers not installed, or parameters it rejects: the reason in one line
            return Rope(theta, rotary_dims, pairing, scaling, (), f"RoPE scaling '{scaling}' needs transformers' "
                        f"rope init function, which failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        if len(freq) * 2 != rotary_dims:
            return Rope(theta, rotary_dims, pairing, scaling, (), f"transformers' '{scaling}' frequencies cover "
                        f"{2 * len(freq)} dimensions, not the {rotary_dims} rotated", factor)
        return Rope(theta, rotary_dims, pairing, scaling, () if scaling in LENGTH_DEPENDENT else
                    tuple(float(f) for f in freq), LENGTH_DEPENDENT.get(scaling), factor)
    if refusal is None and scaling not in SCALINGS:
        refusal = (f"RoPE scaling '{scaling}' is not implemented (implemented: {', '.join(SCALINGS)})"
                   + ("; dynamic NTK changes the frequencies with the sequence length" if "dynamic" in scaling else ""))
    if refusal is not None:
        return Rope(theta, rotary_dims, pairing, scaling, (), refusal)
    freq = _base_frequencies(theta, rotary_dims)
    if scaling == "linear":
        freq = freq / float((params or {})["factor"])
    elif scaling == "llama3":
        freq = _llama3(freq, params or {})
    return Rope(theta, rotary_dims, pairing, scaling, tuple(float(f) for f in freq))


# Hugging Face families whose layers do not share one rotation (found by discovery, so no layout says so).
HF_PER_LAYER_ROPE = {
    "cohere2": "its full-attention layers (layer_types) apply no RoPE; per-layer RoPE is not implemented",
}


def hf_rope(settings: list[dict], config: dict, head_dim: int, fraction: float, pairing: str) -> Rope:
    """RoPE of a Hugging Face config over the first fraction of each head: rotate_half pairs (split-half),
    or adjacent pairs (interleaved: GPT-J's rotate_every_two, Cohere)."""
    dims = int(head_dim * fraction)
    distinct = {tuple(sorted((k, str(v)) for k, v in s.items())) for s in settings}
    params = settings[0] if settings else {}
    theta = float(params.get("rope_theta") or config.get("rope_theta") or config.get("rotary_emb_base")
                  or DEFAULT_THETA)
    scaling = params.get("rope_type", params.get("type")) or "default"
    refusal = None
    if len(distinct) > 1:
        refusal = "the layers use different RoPE settings (layer_types), which are not implemented"
    elif config.get("rope_local_base_freq") is not None:
        refusal = "sliding-window layers use another RoPE base (rope_local_base_freq), which is not implemented"
    elif config.get("model_type") in HF_PER_LAYER_ROPE:
        refusal = HF_PER_LAYER_ROPE[config["model_type"]]
    return rope(theta, dims, pairing, scaling, params, refusal, config)


# llama.cpp architectures whose layers do not share one rotation: R(delta) would be wrong for some layers.
GGUF_PER_LAYER_ROPE = {
    "gemma3": "its sliding-window layers use another RoPE base (rope.freq_base_swa, 10000 unless set) than its "
              "global layers (rope.freq_base); per-layer RoPE is not implemented",
    "cohere2": "its full-attention layers (every 4th) apply no RoPE; per-layer RoPE is not implemented",
}


def gguf_rope(meta: dict, arch: str, head_dim: int, pairing: str, tensor_names) -> Rope:
    """RoPE of a GGUF file from its metadata ({arch}.rope.*) and the pairing its rows are stored in."""
    theta = float(meta.get(f"{arch}.rope.freq_base", DEFAULT_THETA))
    dims = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    scaling = str(meta.get(f"{arch}.rope.scaling.type", "none"))
    refusal = GGUF_PER_LAYER_ROPE.get(arch)
    if "rope_freqs.weight" in tensor_names:
        refusal = "per-frequency factors (tensor rope_freqs.weight) are not implemented"
    if scaling == "none":
        return rope(theta, dims, pairing, "default", refusal=refusal)
    return rope(theta, dims, pairing, scaling, {"factor": meta.get(f"{arch}.rope.scaling.factor", 1.0)}, refusal)
