"""Where each Hugging Face architecture keeps its attention Q/K/V/O weights, and how to split them per head.

A `Layout` is description plus array code: config.json -> `ModelSpec`, layer -> tensor names with the
shapes the config implies, raw tensors -> W_Q (H, n, N) and W_K (Hkv, n, N), and for the output-value circuit
W_V (Hkv, n, N) and W_O (H, N, n). File access lives in extract.formats, so this module stays testable on plain dicts.
Biases are never read: a V bias adds a constant W_O b_V to each head's output (each row of the attention sums
to 1), and an O bias one constant per layer, so neither is part of a head's map.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from headforms.extract.checkpoint import ExtractError, ModelSpec
from headforms.extract.layouts import latent

@dataclass(frozen=True)
class Packing:
    """How a family stores one layer's Q and K (and V and O): tensor roles, their shapes, and the split into heads."""

    name: str  # as `headforms architectures` lists it
    shapes: Callable[[ModelSpec], dict[str, tuple[int, ...]]]
    split: Callable[[dict[str, np.ndarray], ModelSpec], tuple[np.ndarray, np.ndarray]]
    ov_shapes: Callable[[ModelSpec], dict[str, tuple[int, ...]]]  # the roles of V and O (a fused V: its QKV)
    ov_split: Callable[[dict[str, np.ndarray], ModelSpec], tuple[np.ndarray, np.ndarray]]  # W_V, W_O (H, N, n)


def _heads(w: np.ndarray, heads: int, s: ModelSpec) -> np.ndarray:
    """Rows of an (heads*n, N) projection as (heads, n, N)."""
    return w.reshape(heads, s.head_dim, s.d_model)


def _fused_rows(s: ModelSpec) -> dict[str, tuple[int, ...]]:
    """A fused [Q; K; V] projection of H query and Hkv key/value heads: ((H + 2 Hkv) n, N)."""
    return {"qkv": ((s.n_heads + 2 * s.n_kv_heads) * s.head_dim, s.d_model)}


def _stacked_split(t: dict[str, np.ndarray], s: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    q_rows = s.n_heads * s.head_dim
    w = t["qkv"]
    return _heads(w[:q_rows], s.n_heads, s), _heads(w[q_rows:q_rows + s.n_kv_heads * s.head_dim], s.n_kv_heads, s)


def _grouped_split(t: dict[str, np.ndarray], s: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    groups = t["qkv"].reshape(s.n_kv_heads, s.n_heads // s.n_kv_heads + 2, s.head_dim, s.d_model)
    return groups[:, :-2].reshape(s.n_heads, s.head_dim, s.d_model), groups[:, -2]


def _out_columns(s: ModelSpec) -> tuple[int, ...]:
    """An nn.Linear output projection [N, H n]: head h's columns h n .. (h+1) n write the residual stream."""
    return (s.d_model, s.n_heads * s.head_dim)


def _w_o(w: np.ndarray, s: ModelSpec) -> np.ndarray:
    """Columns of an (N, H*n) output projection as (H, N, n)."""
    return w.reshape(s.d_model, s.n_heads, s.head_dim).transpose(1, 0, 2)


def _fused_ov(v: Callable[[np.ndarray, ModelSpec], np.ndarray]) -> tuple[Callable, Callable]:
    """(ov_shapes, ov_split) of a fused QKV projection whose V block `v` takes from the same tensor, and a Linear O."""
    return (lambda s: _fused_rows(s) | {"o": _out_columns(s)},
            lambda t, s: (v(t["qkv"], s), _w_o(t["o"], s)))


# q_proj/k_proj as separate nn.Linear weights [H*n, N] and [Hkv*n, N] (llama family, OPT, BERT).
SEPARATE = Packing(
    name="separate Q, K",
    shapes=lambda s: {"q": (s.n_heads * s.head_dim, s.d_model), "k": (s.n_kv_heads * s.head_dim, s.d_model)},
    split=lambda t, s: (_heads(t["q"], s.n_heads, s), _heads(t["k"], s.n_kv_heads, s)),
    ov_shapes=lambda s: {"v": (s.n_kv_heads * s.head_dim, s.d_model), "o": _out_columns(s)},
    ov_split=lambda t, s: (_heads(t["v"], s.n_kv_heads, s), _w_o(t["o"], s)),
)
# Qwen3-Next's q_proj [2 H n, N]: per head its n query rows, then n rows of an output gate (sigmoid(gate_i) scales the
# head's output at token i, so its OV map is not one linear map: discovery's proof refuses it).
GATED_Q = replace(SEPARATE, name="separate Q (per head: query rows, then gate rows), K",
                  shapes=lambda s: SEPARATE.shapes(s) | {"q": (2 * s.n_heads * s.head_dim, s.d_model)},
                  split=lambda t, s: (t["q"].reshape(s.n_heads, 2, s.head_dim, s.d_model)[:, 0],
                                      _heads(t["k"], s.n_kv_heads, s)))
# GPT-2 Conv1D c_attn [N, 3N]: its transpose stacks the Q | K | V row blocks; Conv1D c_proj is [N_in = H n, N_out].
CONV1D_QKV = Packing(
    name="Conv1D [Q|K|V]",
    shapes=lambda s: {"qkv": (s.d_model, 3 * s.d_model)},
    split=lambda t, s: tuple(t["qkv"].T.reshape(3, s.n_heads, s.head_dim, s.d_model)[:2]),
    ov_shapes=lambda s: {"qkv": (s.d_model, 3 * s.d_model), "o": (s.n_heads * s.head_dim, s.d_model)},
    ov_split=lambda t, s: (t["qkv"].T.reshape(3, s.n_heads, s.head_dim, s.d_model)[2], _w_o(t["o"].T, s)),
)
# Bloom / GPT-NeoX query_key_value [3N, N], interleaved per head as (heads, 3, n, N).
INTERLEAVED_QKV = Packing(
    name="fused, per head (q,k,v)",
    shapes=lambda s: {"qkv": (3 * s.d_model, s.d_model)},
    split=lambda t, s: tuple(np.moveaxis(t["qkv"].reshape(s.n_heads, 3, s.head_dim, s.d_model), 1, 0)[:2]),
    ov_shapes=lambda s: {"qkv": (3 * s.d_model, s.d_model), "o": _out_columns(s)},
    ov_split=lambda t, s: (t["qkv"].reshape(s.n_heads, 3, s.head_dim, s.d_model)[:, 2], _w_o(t["o"], s)),
)
# Phi-3 qkv_proj, MPT Wqkv, multi-query Falcon and GPT-BigCode: row blocks Q (H n) | K (Hkv n) | V (Hkv n).
STACKED_QKV = Packing("fused [Q|K|V] blocks", _fused_rows, _stacked_split, *_fused_ov(
    lambda w, s: _heads(w[(s.n_heads + s.n_kv_heads) * s.head_dim:], s.n_kv_heads, s)))
# Falcon's new decoder architecture: per key/value group, its H/Hkv query heads then one K and one V head.
GROUPED_QKV = Packing("fused, per group (q..q,k,v)", _fused_rows, _grouped_split, *_fused_ov(
    lambda w, s: w.reshape(s.n_kv_heads, s.n_heads // s.n_kv_heads + 2, s.head_dim, s.d_model)[:, -1]))


# Multi-head latent attention (layouts.latent): the down-projections, their RMSNorm gains and the up-projections.
LATENT = Packing(
    name="latent (q_a, q_b or q; kv_a, kv_b)",
    shapes=lambda s: s.form.shapes(),
    split=lambda t, s: latent.latent_parts(t, s.form),
    ov_shapes=lambda s: {},
    ov_split=lambda t, s: (),
)
LATENT_NORMS = "latent"  # Layout.qk_norm of MLA: its q and kv latents' RMSNorms, always folded
UNIT_NORMS = "unit"  # Layout.qk_norm of an RMS norm per head without a gain (Llama 4's L2 norm): no tensor to fold

_SHAPE_PROBE = ModelSpec("probe", 1, 1, 1, 1, 1, 1.0, "learned")  # a spec to list a packing's roles with


@dataclass(frozen=True)
class Scale:
    """The factor on q.k before the softmax, as a function of the config and head_dim n, with its formula."""

    formula: str
    of: Callable[[dict, int], float]


INVERSE_SQRT_HEAD_DIM = Scale("1/sqrt(n)", lambda config, n: n**-0.5)
UNSCALED = Scale("1 (unscaled)", lambda config, n: 1.0)
# GPT-2 and GPT-BigCode can switch the scaling off.
GPT2_SCALE = Scale("1/sqrt(n), 1 if not scale_attn_weights",
                   lambda config, n: n**-0.5 if config["scale_attn_weights"] else 1.0)
# Gemma 2/3 scale q.k by query_pre_attn_scalar**-0.5, not head_dim**-0.5.
QUERY_PRE_ATTN_SCALE = Scale("1/sqrt(query_pre_attn_scalar)",
                             lambda config, n: float(config["query_pre_attn_scalar"]) ** -0.5)
# Granite multiplies q.k by its attention_multiplier instead.
ATTENTION_MULTIPLIER = Scale("attention_multiplier", lambda config, n: float(config["attention_multiplier"]))
# MPT: attn_config.softmax_scale when set.
MPT_SCALE = Scale("attn_config.softmax_scale, else 1/sqrt(n)",
                  lambda config, n: float(config["attn_config"].get("softmax_scale") or n**-0.5))


def _no_refusal(config: dict) -> str | None:
    """Accepts every config of the family."""
    return None


def _gpt2_refusal(config: dict) -> str | None:
    """scale_attn_by_inverse_layer_idx is set (the scale differs per layer)"""
    if config.get("scale_attn_by_inverse_layer_idx"):
        return "scale_attn_by_inverse_layer_idx makes the score scale differ per layer"
    return None


def _bert_refusal(config: dict) -> str | None:
    """position_embedding_type is relative (position terms inside q.k)"""
    kind = config.get("position_embedding_type", "absolute")
    if kind != "absolute":
        return f"position_embedding_type '{kind}' adds position-dependent terms to q.k"
    return None


@dataclass(frozen=True)
class FlagRefusal:
    """A refusal of configs that set `key` (QK LayerNorms, clipped q/k): why the score is then not bilinear."""

    key: str
    why: str

    def __call__(self, config: dict) -> str | None:
        value = config.get(self.key)
        return f"{self.key}={value}: {self.why}, not bilinear in x" if value else None

    @property
    def __doc__(self) -> str:  # the condition, as the architectures listing shows it
        return f"{self.key} is set ({self.why})"


_QK_LAYERNORM = "q and k pass through a LayerNorm"
_CLIPPED = "q and k are clipped elementwise"


def _mpt_refusal(config: dict) -> str | None:
    """attn_config.qk_ln or clip_qkv is set (q, k normalised or clipped)"""
    attn = config.get("attn_config") or {}
    for key, why in (("qk_ln", _QK_LAYERNORM), ("clip_qkv", _CLIPPED)):
        if attn.get(key):
            return f"attn_config.{key}={attn[key]}: {why}, not bilinear in x"
    return None


@dataclass(frozen=True)
class Variant:
    """Layout fields a config switches (Falcon's and GPT-BigCode's QKV packings, Falcon's ALiBi, QK LayerNorms)."""

    when: str                      # the condition, as the architectures listing shows it
    applies: Callable[[dict], bool]
    fields: dict


@dataclass(frozen=True)
class NoPE:
    """Layers a family's RoPE skips (Llama 4, SmolLM3) and any factor their queries take: their form is L at every
    distance, times Llama 4's temperature of the query's position, recorded in models.config."""

    layers: Callable[[dict, int], tuple[int, ...]]  # (config, n_layers) -> the layers without RoPE
    treatment: str                                  # in words, for `headforms architectures`
    temperature: Callable[[dict], dict | None] | None = None  # config -> the query factor's parameters (None: 1)


@dataclass(frozen=True)
class Embeddings:
    """Where a family keeps its token embedding W_E (under the layout's prefix), its unembedding W_U (full names, the
    first present wins; absent or tie_word_embeddings: W_E) and the final norm whose gain folds into W_U."""

    token: str | None                  # W_E (vocab, N); None: the model reads no tokens (a vision or audio tower)
    unembedding: tuple[str, ...] | None = ("lm_head.weight",)  # None: no linear unembedding of the residual stream
    final_norm: str | None = None      # its gain (N,), under the prefix; None: no norm (or one without a gain)
    norm_offset: float = 0.0           # the final norm multiplies by (offset + weight): Gemma's 1
    projections: tuple[str, str] | None = None  # OPT's project_in, project_out (when present): W_E P_in^T, W_U P_out


def _gains(tensors: dict[str, np.ndarray], role: str, heads: int) -> np.ndarray:
    """A QK-norm's gains: one tensor, or one per head's norm module (role.0, role.1, ...) stacked."""
    return tensors[role] if role in tensors else np.stack([tensors[f"{role}.{h}"] for h in range(heads)])


@dataclass(frozen=True)
class Layout:
    """One family's conventions: positional scheme, tensor names (under a prefix), packing, scale."""

    positional: str
    prefixes: tuple[str, ...]     # tried in order against the checkpoint's tensor names
    tensors: dict[str, str]       # role -> name template under the prefix, {i} = layer
    packing: Packing
    grouped: bool = False         # reads num_key_value_heads and an explicit head_dim
    defaults: dict | None = None  # transformers' config defaults that config.json may omit
    sub_config: str | None = None  # multimodal / multi-tower: the attention shape lives under config[sub_config]
    config_keys: dict | None = None  # per-tower spellings of the shape fields (whisper's encoder_layers, ...)
    kv_heads: Callable[[dict, int], int] | None = None  # key heads from (config, H) where a family fixes them
    variants: tuple[Variant, ...] = ()  # config-switched fields, every matching one applied in order
    scale: Scale = INVERSE_SQRT_HEAD_DIM
    refusal: Callable[[dict], str | None] = _no_refusal
    qk_norm: str | None = None    # None, "head" (gain of size n), "projection" (H*n), "centred" (LayerNorm, (H, n)),
    #                               or "unit" (per head, no gain)
    norm_offset: float = 0.0      # the norm multiplies by (offset + weight); gemma3 stores weight - 1
    rope_pairing: str = "split-half"  # RoPE's pairs of each head's rows: rotate_half, or GPT-J's rotate_every_two
    softcap: str | None = None    # the config key of a soft cap: the logit is cap * tanh(s / cap), the form gives s
    embeddings: Embeddings | None = None  # W_E, W_U and the final norm (read for the ov circuit's copying scores)
    ov_refused: str | None = None  # why the ov circuit is refused although Q/K are read (a discovered family's proof)
    attention_layers: Callable[[dict], tuple[int, ...]] | None = None  # a hybrid's softmax-attention layers; None: all
    nope: NoPE | None = None      # layers without RoPE, and the factor on their queries

    def ov_refusal(self) -> str | None:
        """Why this layout cannot read the ov circuit (its V, O tensors or embeddings not described), or None."""
        if self.ov_refused:
            return self.ov_refused
        missing = [role for role in self.packing.ov_shapes(_SHAPE_PROBE) if role not in self.tensors]
        if missing or self.embeddings is None:
            return "its V and O tensors or its embeddings are not described"
        return None

    def tensors_for(self, spec: ModelSpec, prefix: str, layer: int,
                    circuits: tuple[str, ...] = ("qk",)) -> dict[str, tuple[str, tuple[int, ...]]]:
        """role -> (tensor name, expected shape) of one layer for the circuits; QK-norm gains only when folding, the
        heads' sink logits (role 'sinks') with the qk circuit."""
        shapes = self.packing.shapes(spec) if "qk" in circuits else {}
        if "sinks" in self.tensors and "qk" in circuits:
            shapes["sinks"] = (spec.n_heads,)
        if "ov" in circuits:
            shapes |= self.packing.ov_shapes(spec)
        per_module = {}  # one norm module per head (stablelm): role.h -> its gain of size n
        # gains to read (latent: among the packing's roles; unit: none)
        if spec.qk_norm == "folded" and "qk" in circuits and self.qk_norm not in (LATENT_NORMS, UNIT_NORMS):
            gains = {"head": lambda heads: (spec.head_dim,), "projection": lambda heads: (heads * spec.head_dim,),
                     "centred": lambda heads: (heads, spec.head_dim)}[self.qk_norm]
            for role, heads in (("q_norm", spec.n_heads), ("k_norm", spec.n_kv_heads)):
                if "{h}" in self.tensors[role]:
                    per_module |= {f"{role}.{h}": (prefix + self.tensors[role].format(i=layer, h=h), (spec.head_dim,))
                                   for h in range(heads)}
                else:
                    shapes[role] = gains(heads)
        return {role: (prefix + self.tensors[role].format(i=layer), shape) for role, shape in shapes.items()} | per_module

    def qk_maps(self, tensors: dict[str, np.ndarray], spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
        """W_Q (H, n, N) and W_K (Hkv, n, N) from a layer's raw tensors, norm gains folded when present (a latent
        layout: its parts, a mapping part -> (W_Q, W_K), extract.layouts.latent).

        A centred norm (LayerNorm without bias) first subtracts each head's mean row: q - mean(q) = C q
        with the centring matrix C, so C W_Q is the map the RMS then normalises. Copies to contiguous
        arrays so no view keeps a fused tensor's V block alive.
        """
        if self.qk_norm == LATENT_NORMS:  # a latent-attention layer: its parts (extract.layouts.latent), gains folded
            return self.packing.split(tensors, spec)
        w_q, w_k = self.packing.split(tensors, spec)
        if spec.qk_norm == "folded" and self.qk_norm == "centred":
            w_q, w_k = w_q - w_q.mean(axis=1, keepdims=True), w_k - w_k.mean(axis=1, keepdims=True)
        if spec.qk_norm == "folded" and self.qk_norm != UNIT_NORMS:
            w_q = w_q * (self.norm_offset + _gains(tensors, "q_norm", spec.n_heads)).reshape(-1, spec.head_dim, 1)
            w_k = w_k * (self.norm_offset + _gains(tensors, "k_norm", spec.n_kv_heads)).reshape(-1, spec.head_dim, 1)
        rope = spec.rope
        if rope is not None and rope.attention_factor != 1.0 and rope.rotary_dims < spec.head_dim:
            # partial rotary: a on cos and sin scales the rotated rows only, L = L_pass + a^2 L_rot
            w_q, w_k = w_q.copy(), w_k.copy()
            w_q[:, :rope.rotary_dims] *= rope.attention_factor
            w_k[:, :rope.rotary_dims] *= rope.attention_factor
        return np.ascontiguousarray(w_q), np.ascontiguousarray(w_k)

    def ov_maps(self, tensors: dict[str, np.ndarray], spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
        """W_V (Hkv, n, N) and W_O (H, N, n) from a layer's raw tensors: head h writes W_O[h] W_V[kv_index[h]] x_j
        weighted by its attention A_ij. QK-norms and RoPE act on q, k only, so nothing of them applies here."""
        w_v, w_o = self.packing.ov_split(tensors, spec)
        return np.ascontiguousarray(w_v), np.ascontiguousarray(w_o)

    def for_config(self, config: dict) -> Layout:
        """This layout with the fields of every variant the config selects."""
        layout = self
        for variant in self.variants:
            if variant.applies(config):
                layout = replace(layout, **variant.fields)
        return layout


_LLAMA_TENSORS = {
    "q": "layers.{i}.self_attn.q_proj.weight",
    "k": "layers.{i}.self_attn.k_proj.weight",
    "q_norm": "layers.{i}.self_attn.q_norm.weight",
    "k_norm": "layers.{i}.self_attn.k_norm.weight",
    "v": "layers.{i}.self_attn.v_proj.weight",
    "o": "layers.{i}.self_attn.o_proj.weight",
}
# W_E, W_U and the final norm: the llama family's (Gemma's norm multiplies by 1 + weight); a multimodal model's
# LM head may sit under its language model.
_LLAMA_EMBEDDINGS = Embeddings("embed_tokens.weight", ("lm_head.weight", "language_model.lm_head.weight"), "norm.weight")
_GEMMA_EMBEDDINGS = replace(_LLAMA_EMBEDDINGS, norm_offset=1.0)
_ENCODER = Embeddings(None, None)  # a tower or encoder: no tokens read, or no linear unembedding (see _text_encoder)


def _text_encoder(token: str) -> Embeddings:
    """A text encoder: token embeddings, no linear unembedding (an MLM head's dense, GELU and LayerNorm come before its
    decoder; a sentence encoder or a CLIP text tower has none)."""
    return Embeddings(token, None)


_LLAMA_PREFIXES = ("model.", "")
# StableLM's qk_layernorm: one bias-free LayerNorm module per head, h = head.
_STABLELM_TENSORS = _LLAMA_TENSORS | {"q_norm": "layers.{i}.self_attn.q_layernorm.norms.{h}.weight",
                                      "k_norm": "layers.{i}.self_attn.k_layernorm.norms.{h}.weight"}


_SOFTCAP = "attn_logit_softcapping"  # Gemma 2's cap (50 by default); Gemma 3's configs leave it None
_GEMMA2_DEFAULTS = {"head_dim": 256, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0}
_GEMMA3_DEFAULTS = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256}


# The factories below run once, at import, to build LAYOUTS: they are data shorthand, and mutation
# testing (which switches a mutant on during a test's calls) cannot reach them. What they build is
# proven row by row by the logit tests of every family (tests/MUTANTS.md).
# pragma: no mutate start
def _llama_like(prefixes: tuple[str, ...] = _LLAMA_PREFIXES, **kw) -> Layout:
    """The q_proj/k_proj rotary decoders (llama, mistral, qwen, gemma, olmo2)."""
    return Layout(**{"positional": "rope", "prefixes": prefixes, "tensors": _LLAMA_TENSORS, "packing": SEPARATE,
                      "grouped": True, "embeddings": _LLAMA_EMBEDDINGS} | kw)


def _named_qk(template: str, q: str, k: str) -> dict[str, str]:
    """Separate Q/K tensor names from one template with {proj} (and {i} for the layer)."""
    return {"q": template.format(proj=q, i="{i}"), "k": template.format(proj=k, i="{i}")}


def _bert_like(prefix: str) -> Layout:
    """BERT's encoder layout under another base-model prefix (RoBERTa, ELECTRA, XLM-R, CamemBERT)."""
    return Layout(positional="absolute", prefixes=(prefix, ""),
                  tensors=_named_qk("encoder.layer.{i}.attention.self.{proj}.weight", "query", "key")
                  | {"v": "encoder.layer.{i}.attention.self.value.weight",
                     "o": "encoder.layer.{i}.attention.output.dense.weight"},
                  packing=SEPARATE, refusal=_bert_refusal, embeddings=_text_encoder("embeddings.word_embeddings.weight"))


def _vit_like(prefix: str) -> Layout:
    """ViT-style image encoders: patch tokens plus learned position embeddings, query/key Linear layers."""
    return Layout(positional="absolute", prefixes=(prefix, ""),
                  tensors=_named_qk("encoder.layer.{i}.attention.attention.{proj}.weight", "query", "key")
                  | {"v": "encoder.layer.{i}.attention.attention.value.weight",
                     "o": "encoder.layer.{i}.attention.output.dense.weight"},
                  packing=SEPARATE, embeddings=_ENCODER)


def _tower(prefixes: tuple[str, ...], sub_config: str | None = None, **kw) -> Layout:
    """A CLIP/SigLIP text or vision tower: encoder.layers.{i}.self_attn.q_proj/k_proj under its prefix."""
    return Layout(positional="absolute", prefixes=prefixes, sub_config=sub_config,
                  tensors=_named_qk("encoder.layers.{i}.self_attn.{proj}.weight", "q_proj", "k_proj")
                  | {"v": "encoder.layers.{i}.self_attn.v_proj.weight", "o": "encoder.layers.{i}.self_attn.out_proj.weight"},
                  packing=SEPARATE, embeddings=_text_encoder("embeddings.token_embedding.weight")
                  if "text" in prefixes[0] else _ENCODER, **kw)


def _whisper(stack: str) -> Layout:
    """Whisper's encoder or decoder self-attention (the decoder's cross-attention, encoder_attn, is not read)."""
    return Layout(positional="absolute", prefixes=(f"model.{stack}.", f"{stack}."),
                  tensors=_named_qk("layers.{i}.self_attn.{proj}.weight", "q_proj", "k_proj")
                  | {"v": "layers.{i}.self_attn.v_proj.weight", "o": "layers.{i}.self_attn.out_proj.weight"},
                  packing=SEPARATE, embeddings=Embeddings("embed_tokens.weight", ("proj_out.weight",), "layer_norm.weight")
                  if stack == "decoder" else _ENCODER,
                  config_keys={"n_layers": (f"{stack}_layers",), "n_heads": (f"{stack}_attention_heads",),
                               "d_model": ("d_model",)})
# pragma: no mutate end


_MULTI_QUERY = Variant("multi_query", lambda c: c["multi_query"], {"packing": STACKED_QKV, "kv_heads": lambda c, h: 1})
_FALCON_VARIANTS = (
    _MULTI_QUERY,
    Variant("new_decoder_architecture", lambda c: c["new_decoder_architecture"],
            {"packing": GROUPED_QKV, "kv_heads": lambda c, h: c.get("num_kv_heads") or h}),
    Variant("alibi", lambda c: c["alibi"], {"positional": "alibi"}),
)
_GPT_BIGCODE_VARIANTS = (_MULTI_QUERY,)


# Llama 4: its NoPE layers apply no RoPE and no QK-norm and, with attn_temperature_tuning, multiply q_i by a
# temperature of the query's position i; its RoPE layers rotate complex pairs (2k, 2k+1) and, with use_qk_norm,
# L2-normalise q and k after the rotation without a gain. RoPE keeps each head's norm, so that norm is R(q / rms(q)):
# an RMS norm of unit gains before the rotation, the score x_j^T L_(i-j) x_i / (rms(W_Q x_i) rms(W_K x_j)).
_LLAMA4_TEMPERATURE = "log(1 + floor((i + 1) / floor_scale)) * attn_scale + 1"
_LLAMA4_DEFAULTS = {"head_dim": 128, "num_key_value_heads": 8, "rope_theta": 500000.0, "use_qk_norm": True,
                    "no_rope_layer_interval": 4, "attn_temperature_tuning": True, "floor_scale": 8192,
                    "attn_scale": 0.1}


def _no_rope_layers(config: dict, n_layers: int) -> tuple[int, ...]:
    """no_rope_layers' zeros (a flag per layer, 1: RoPE), or every no_rope_layer_interval-th layer where it is empty
    (Llama 4, SmolLM3)."""
    flags = config.get("no_rope_layers") or [int((i + 1) % config["no_rope_layer_interval"] != 0)
                                             for i in range(n_layers)]
    if len(flags) != n_layers:
        raise ExtractError(f"config.json: no_rope_layers has {len(flags)} entries for {n_layers} layers")
    return tuple(i for i, rotary in enumerate(flags) if not rotary)


def _llama4_temperature(config: dict) -> dict | None:
    """The NoPE layers' query temperature and its floor_scale and attn_scale, None without attn_temperature_tuning."""
    if not config.get("attn_temperature_tuning"):
        return None
    return {"factor": _LLAMA4_TEMPERATURE, "floor_scale": config["floor_scale"], "attn_scale": config["attn_scale"]}


_LLAMA4_NOPE = NoPE(_no_rope_layers, temperature=_llama4_temperature, treatment=(
    "RoPE layers rotate complex pairs (2k, 2k+1), their L2 norm after RoPE an RMS norm of unit gains (a rotation keeps "
    "the norm); NoPE layers (no_rope_layers 0, else every no_rope_layer_interval-th): no RoPE, no QK-norm, one form at "
    f"every distance, q_i times {_LLAMA4_TEMPERATURE} of its position i with attn_temperature_tuning (models.config "
    "attention_temperature)"))
_llama4 = _llama_like(defaults=_LLAMA4_DEFAULTS, rope_pairing="interleaved", nope=_LLAMA4_NOPE,
                      variants=(Variant("use_qk_norm", lambda c: c.get("use_qk_norm"), {"qk_norm": UNIT_NORMS}),))
# SmolLM3: a llama whose NoPE layers apply no RoPE (and nothing else differs).
_smollm3 = _llama_like(defaults={"num_key_value_heads": 4, "rope_theta": 2000000.0, "no_rope_layer_interval": 4},
                       nope=NoPE(_no_rope_layers, "NoPE layers (no_rope_layers 0, else every "
                                                  "no_rope_layer_interval-th): no RoPE, one form at every distance"))


# DeepSeek-V2/V3 (and the checkpoints reusing deepseek_v3: Kimi-K2): each head two forms, extract.layouts.latent. The OV
# circuit's values run through the kv latent's RMSNorm too (W_O W_vb diag(g) W_kva / rms_kv(x_j)): not built yet.
_latent = Layout(positional="rope", prefixes=_LLAMA_PREFIXES,
                 tensors={role: "layers.{i}.self_attn." + name for role, name in latent.TENSORS.items()},
                 packing=LATENT, qk_norm=LATENT_NORMS, embeddings=_LLAMA_EMBEDDINGS,
                 scale=Scale("1/sqrt(qk_nope_head_dim + qk_rope_head_dim), times yarn's mscale^2",
                             lambda config, n: n**-0.5),
                 ov_refused="multi-head latent attention's values are read through the kv latent's RMSNorm; its OV "
                            "maps are not built yet")

LAYOUTS: dict[str, Layout] = {
    "gpt2": Layout(positional="learned", prefixes=("transformer.", ""),
                   tensors={"qkv": "h.{i}.attn.c_attn.weight", "o": "h.{i}.attn.c_proj.weight"}, packing=CONV1D_QKV,
                   defaults={"scale_attn_weights": True}, scale=GPT2_SCALE, refusal=_gpt2_refusal,
                   embeddings=Embeddings("wte.weight", final_norm="ln_f.weight")),
    "opt": Layout(positional="learned", prefixes=("model.decoder.", "decoder."),
                  tensors={"q": "layers.{i}.self_attn.q_proj.weight", "k": "layers.{i}.self_attn.k_proj.weight",
                           "v": "layers.{i}.self_attn.v_proj.weight", "o": "layers.{i}.self_attn.out_proj.weight"},
                  packing=SEPARATE, embeddings=Embeddings("embed_tokens.weight", final_norm="final_layer_norm.weight",
                                                          projections=("project_in.weight", "project_out.weight"))),
    "bloom": Layout(positional="alibi", prefixes=("transformer.", ""),
                    tensors={"qkv": "h.{i}.self_attention.query_key_value.weight", "o": "h.{i}.self_attention.dense.weight"},
                    packing=INTERLEAVED_QKV, embeddings=Embeddings("word_embeddings.weight", final_norm="ln_f.weight")),
    "gpt_neox": Layout(positional="rope", prefixes=("gpt_neox.", ""),
                       tensors={"qkv": "layers.{i}.attention.query_key_value.weight",
                                "o": "layers.{i}.attention.dense.weight"}, packing=INTERLEAVED_QKV,
                       embeddings=Embeddings("embed_in.weight", ("embed_out.weight",), "final_layer_norm.weight")),
    "bert": _bert_like("bert."),
    "llama": _llama_like(),
    "mistral": _llama_like(),
    "qwen2": _llama_like(),
    "gemma": _llama_like(defaults={"head_dim": 256}, embeddings=_GEMMA_EMBEDDINGS),
    "gemma2": _llama_like(defaults=_GEMMA2_DEFAULTS, scale=QUERY_PRE_ATTN_SCALE, softcap=_SOFTCAP,
                          embeddings=_GEMMA_EMBEDDINGS),
    "qwen3": _llama_like(defaults={"head_dim": 128}, qk_norm="head"),
    "deepseek_v2": _latent,
    "deepseek_v3": _latent,
    "olmo2": _llama_like(qk_norm="projection"),
    "gemma3_text": _llama_like(defaults=_GEMMA3_DEFAULTS, scale=QUERY_PRE_ATTN_SCALE, softcap=_SOFTCAP,
                               qk_norm="head", norm_offset=1.0, embeddings=_GEMMA_EMBEDDINGS),
    "gemma3": _llama_like(("language_model.model.", "model.language_model."), defaults=_GEMMA3_DEFAULTS,
                          sub_config="text_config", scale=QUERY_PRE_ATTN_SCALE, softcap=_SOFTCAP,
                          qk_norm="head", norm_offset=1.0, embeddings=_GEMMA_EMBEDDINGS),
    "llama4_text": _llama4,
    "llama4": replace(_llama4, prefixes=("language_model.model.", "model.language_model."), sub_config="text_config"),
    "smollm3": _smollm3,
    # rotary decoders with q_proj/k_proj
    "mixtral": _llama_like(),
    "starcoder2": _llama_like(),
    "qwen2_moe": _llama_like(),
    "qwen3_moe": _llama_like(qk_norm="head"),
    "granite": _llama_like(scale=ATTENTION_MULTIPLIER),
    "olmo": _llama_like(refusal=FlagRefusal("clip_qkv", _CLIPPED),  # its LayerNorms have no gain
                        embeddings=replace(_LLAMA_EMBEDDINGS, final_norm=None)),
    "cohere": _llama_like(rope_pairing="interleaved",
                          variants=(Variant("use_qk_norm", lambda c: c.get("use_qk_norm"), {"qk_norm": "centred"}),)),
    "phi": _llama_like(refusal=FlagRefusal("qk_layernorm", _QK_LAYERNORM + " with a bias"),
                       tensors=_LLAMA_TENSORS | {"o": "layers.{i}.self_attn.dense.weight"},
                       embeddings=replace(_LLAMA_EMBEDDINGS, final_norm="final_layernorm.weight")),
    "stablelm": _llama_like(defaults={"partial_rotary_factor": 0.25}, variants=(
        Variant("qk_layernorm", lambda c: c.get("qk_layernorm"), {"qk_norm": "centred", "tensors": _STABLELM_TENSORS}),)),
    "phi3": _llama_like(tensors={"qkv": "layers.{i}.self_attn.qkv_proj.weight", "o": "layers.{i}.self_attn.o_proj.weight"},
                        packing=STACKED_QKV),
    "gptj": Layout(positional="rope", prefixes=("transformer.", ""),
                   tensors=_named_qk("h.{i}.attn.{proj}.weight", "q_proj", "k_proj")
                   | {"v": "h.{i}.attn.v_proj.weight", "o": "h.{i}.attn.out_proj.weight"}, packing=SEPARATE,
                   rope_pairing="interleaved", embeddings=Embeddings("wte.weight", final_norm="ln_f.weight")),
    "gpt_neo": Layout(positional="learned", prefixes=("transformer.", ""),
                      tensors=_named_qk("h.{i}.attn.attention.{proj}.weight", "q_proj", "k_proj")
                      | {"v": "h.{i}.attn.attention.v_proj.weight", "o": "h.{i}.attn.attention.out_proj.weight"},
                      packing=SEPARATE, scale=UNSCALED, embeddings=Embeddings("wte.weight", final_norm="ln_f.weight")),
    # fused QKV whose packing the config switches
    "falcon": Layout(positional="rope", prefixes=("transformer.", ""),
                     tensors={"qkv": "h.{i}.self_attention.query_key_value.weight",
                              "o": "h.{i}.self_attention.dense.weight"},
                     packing=INTERLEAVED_QKV,
                     defaults={"multi_query": True, "new_decoder_architecture": False, "alibi": False},
                     variants=_FALCON_VARIANTS, embeddings=Embeddings("word_embeddings.weight", final_norm="ln_f.weight")),
    "gpt_bigcode": Layout(positional="learned", prefixes=("transformer.", ""),
                          tensors={"qkv": "h.{i}.attn.c_attn.weight", "o": "h.{i}.attn.c_proj.weight"},
                          packing=INTERLEAVED_QKV, defaults={"multi_query": True, "scale_attn_weights": True},
                          variants=_GPT_BIGCODE_VARIANTS, scale=GPT2_SCALE,
                          embeddings=Embeddings("wte.weight", final_norm="ln_f.weight")),
    "mpt": Layout(positional="alibi", prefixes=("transformer.", ""),
                  tensors={"qkv": "blocks.{i}.attn.Wqkv.weight", "o": "blocks.{i}.attn.out_proj.weight"},
                  packing=STACKED_QKV, defaults={"attn_config": {}}, scale=MPT_SCALE,
                  refusal=_mpt_refusal, embeddings=Embeddings("wte.weight", final_norm="norm_f.weight")),
    # encoders
    "roberta": _bert_like("roberta."),
    "xlm-roberta": _bert_like("roberta."),
    "camembert": _bert_like("roberta."),
    "electra": _bert_like("electra."),
    "distilbert": Layout(positional="absolute", prefixes=("distilbert.", ""),
                         tensors=_named_qk("transformer.layer.{i}.attention.{proj}.weight", "q_lin", "k_lin")
                         | {"v": "transformer.layer.{i}.attention.v_lin.weight",
                            "o": "transformer.layer.{i}.attention.out_lin.weight"},
                         packing=SEPARATE, embeddings=_text_encoder("embeddings.word_embeddings.weight")),
    "vit": _vit_like("vit."),
    "deit": _vit_like("deit."),
    "dinov2": _vit_like("dinov2."),
    # multi-tower models: one model per tower, the tower after the dot (TOWERS lists them, default first)
    "clip.text": _tower(("text_model.",), "text_config"),
    "clip.vision": _tower(("vision_model.",), "vision_config"),
    "clip_text_model": _tower(("text_model.", "")),
    "clip_vision_model": _tower(("vision_model.", "")),
    "siglip.text": _tower(("text_model.",), "text_config"),
    "siglip.vision": _tower(("vision_model.",), "vision_config"),
    "siglip_text_model": _tower(("text_model.", "")),
    "siglip_vision_model": _tower(("vision_model.", "")),
    "whisper.encoder": _whisper("encoder"),
    "whisper.decoder": _whisper("decoder"),
}
# model_type -> its towers, the first read unless another is asked for.
TOWERS = {"clip": ("text", "vision"), "siglip": ("text", "vision"), "whisper": ("encoder", "decoder")}
# Families transformers knows whose attention score is not scale * x_j^T L x_i: refused by name, never discovered.
REFUSED = {
    "diffllama": "differential attention subtracts two softmaxes, so no single bilinear score exists",
    "t5": "a learned relative-position bias is added to q.k, and the score is unscaled per bucket",
}
SUPPORTED = sorted({key.partition(".")[0] for key in LAYOUTS})


def layout_key(raw: dict, tower: str | None = None) -> str:
    """The LAYOUTS key of a config: its model_type, with the tower for multi-tower models."""
    model_type = raw.get("model_type")
    if model_type in TOWERS:
        towers = TOWERS[model_type]
        if tower not in (None, *towers):
            raise ExtractError(f"{model_type} has no tower '{tower}'; towers: {', '.join(towers)}")
        return f"{model_type}.{tower or towers[0]}"
    if tower is not None:
        raise ExtractError(f"{model_type} has a single tower; `tower` applies to {', '.join(TOWERS)}")
    return model_type


