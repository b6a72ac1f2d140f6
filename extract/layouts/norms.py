"""The norm whose output feeds each layer's attention, per architecture: its tensor and kind, for
--fold-norm (fold its gain, and LayerNorm's centering, into W_Q and W_K, and W_V for the ov circuit;
statistics.md section 7).

A separate table keyed by model_type (and GGUF architecture), beside extract.layouts.table's LAYOUTS.
Architectures where no norm precedes Q and K, or not listed here, are refused with a reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from headforms.compute.norm_gains import fold_gain
from headforms.extract.checkpoint import ExtractError, ModelSpec

MODES = ("none", "gain", "center")


@dataclass(frozen=True)
class Norm:
    """A pre-norm: 'rms' (RMSNorm) or 'layer' (LayerNorm), its gain tensor for layer i (under the
    layout's prefix), and the offset its gain carries (Gemma multiplies by 1 + weight)."""

    kind: str
    tensor: Callable[[int], str]
    offset: float = 0.0

    def fold(self, w_q: np.ndarray, w_k: np.ndarray, gain: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
        """W_Q and W_K with the gain (and with mode 'center' the centering) folded in."""
        return self.fold_map(w_q, gain, mode), self.fold_map(w_k, gain, mode)

    def fold_map(self, w: np.ndarray, gain: np.ndarray, mode: str) -> np.ndarray:
        """One map reading the norm's output (W_Q, W_K, or the ov circuit's W_V) with the gain (and centering) folded."""
        return fold_gain(w, self.offset + gain, mode == "center")


def _named(template: str) -> Callable[[int], str]:
    return lambda i: template.format(i=i)


def _bert_input(i: int) -> str:
    """BERT is post-norm: layer i reads layer i-1's output LayerNorm, layer 0 the embeddings' LayerNorm."""
    return "embeddings.LayerNorm.weight" if i == 0 else f"encoder.layer.{i - 1}.output.LayerNorm.weight"


_LLAMA = Norm("rms", _named("layers.{i}.input_layernorm.weight"))
_GEMMA = Norm("rms", _named("layers.{i}.input_layernorm.weight"), offset=1.0)
# model_type -> the norm feeding attention, or why there is none to fold.
HF_NORMS: dict[str, Norm | str] = {
    "llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA, "qwen3": _LLAMA,
    "gemma": _GEMMA, "gemma2": _GEMMA, "gemma3_text": _GEMMA, "gemma3": _GEMMA,
    "gpt2": Norm("layer", _named("h.{i}.ln_1.weight")),
    "gpt_neox": Norm("layer", _named("layers.{i}.input_layernorm.weight")),
    "bloom": Norm("layer", _named("h.{i}.input_layernorm.weight")),
    "opt": Norm("layer", _named("layers.{i}.self_attn_layer_norm.weight")),
    "bert": Norm("layer", _bert_input),
    "olmo2": "OLMo 2 normalises attention's output, not its input: no norm precedes W_Q and W_K",
}
# GGUF architecture -> the norm of blk.{i}.attn_norm (llama.cpp stores Gemma's gain as 1 + weight).
GGUF_NORMS: dict[str, Norm] = {arch: Norm("rms", _named("blk.{i}.attn_norm.weight"))
                               for arch in ("llama", "qwen2", "gemma")}


def norm_for(spec: ModelSpec, mode: str, table: dict[str, Norm | str]) -> Norm | None:
    """The norm to fold for fold_norm=`mode` ('none' gives None), or an ExtractError saying why not."""
    if mode not in MODES:
        raise ExtractError(f"unknown fold_norm={mode!r}; expected one of {', '.join(MODES)}")
    if mode == "none":
        return None
    norm = table.get(spec.architecture)
    if norm is None:
        raise ExtractError(f"`fold_norm` is not implemented for {spec.architecture}; "
                           f"implemented: {', '.join(sorted(k for k, v in table.items() if isinstance(v, Norm)))}")
    if isinstance(norm, str):
        raise ExtractError(f"fold_norm={mode!r} is refused for {spec.architecture}: {norm}")
    if spec.architecture == "opt" and spec.config.get("do_layer_norm_before") is False:
        raise ExtractError(f"fold_norm={mode!r} is refused for this OPT: do_layer_norm_before=false normalises "
                           "after attention, so the norm feeding W_Q and W_K is the previous layer's")
    if mode == "center" and norm.kind == "rms":
        raise ExtractError(f"fold_norm='center' is refused for {spec.architecture}: its RMSNorm does not "
                           "subtract the mean; use fold_norm='gain'")
    return norm
