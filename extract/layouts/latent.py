"""Multi-head latent attention (DeepSeek-V2, DeepSeek-V3 and the checkpoints that reuse it, Kimi-K2): each head's
score as two bilinear forms, its parts.

MLA reads x through down-projections: q = W_qb RMSNorm(W_qa x) (or q = W_q x without q_lora_rank) and
[c; k_rope] = W_kva x, k_nope,h = W_kvb,h RMSNorm(c). With the norms' gains folded (--qk-norm fold), head h scores

    score_scale * (1/rms_q(x_i)) * (x_j^T L_nope,h x_i / rms_kv(x_j) + x_j^T L_rope,h(i - j) x_i)

where L_nope,h = K_nope,h^T Q_nope,h (rank <= qk_nope_head_dim) runs through the compressed kv latent and
L_rope,h(delta) = a^2 K_rope^T R(delta) Q_rope,h (rank <= qk_rope_head_dim) through the rotary key K_rope that every
head shares; a is the attention factor transformers puts on RoPE's cos and sin (yarn), rms_q and rms_kv the RMS of
the latents W_qa x and c (rms_q = 1 without q_lora_rank). Their per-token factors differ, so they are two forms (the
head's parts 'nope' and 'rope'), not one. All heads of a layer read x through the same down-projections D = [W_qa;
W_kva] (m rows): with D^T = U R (QR, U orthonormal N x m) every map W = C D is W' U^T, W' = C R^T, so the layer is
reduced through U once and every head's maps are m wide instead of N (where m < N).
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from headforms.extract.checkpoint import ExtractError, FormPart, ModelSpec, first_line
from headforms.extract.layouts.rope import DEFAULT_THETA, Rope

FAMILIES = ("deepseek_v2", "deepseek_v3")
# The treatment in words, for `headforms architectures`.
TREATMENT = ("multi-head latent attention: each head stored as two parts, 'nope' (through the kv latent) and 'rope' "
             "(through the shared rotary key), the latents' RMSNorm gains folded (needs --qk-norm fold); the ov "
             "circuit refused")
PARTS = ("nope", "rope")
PREFIXES = ("model.", "")
_ATTENTION = "layers.{i}.self_attn."
# role -> tensor under the prefix; q without q_lora_rank, q_a / q_a_norm / q_b with it.
TENSORS = {
    "q": "q_proj.weight", "q_a": "q_a_proj.weight", "q_a_norm": "q_a_layernorm.weight", "q_b": "q_b_proj.weight",
    "kv_a": "kv_a_proj_with_mqa.weight", "kv_a_norm": "kv_a_layernorm.weight", "kv_b": "kv_b_proj.weight",
}


@dataclass(frozen=True)
class LatentSpec:
    """The shape and conventions of an MLA model, from its config.json."""

    architecture: str
    n_layers: int
    n_heads: int
    d_model: int                 # N
    q_lora_rank: int | None      # the query latent's width, None where q = W_q x
    kv_lora_rank: int            # the kv latent's width
    nope: int                    # qk_nope_head_dim: the nope part's head size
    rope: int                    # qk_rope_head_dim: the rope part's head size
    v_head_dim: int
    score_scale: float           # on q.k before the softmax: qk_head_dim^-1/2, times mscale^2 under yarn
    rope_factor: float           # a^2, transformers' attention factor on cos and sin squared: in the rope part's L
    pairing: str                 # the rope rows' pairs: 'interleaved' (2k, 2k+1) or 'split-half' (k, k + rope/2)
    frequencies: tuple[float, ...]  # radians per position, one per pair, as transformers computes them
    config: dict
    theta: float = DEFAULT_THETA  # RoPE's base
    scaling: str = "default"     # its rope_type

    @property
    def width(self) -> int:
        """m, the rows of the down-projections D every head reads x through."""
        q_rows = self.q_lora_rank if self.q_lora_rank is not None else self.n_heads * (self.nope + self.rope)
        return q_rows + self.kv_lora_rank + self.rope

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """role -> the shape config.json implies for it."""
        q_out, kv_out = self.n_heads * (self.nope + self.rope), self.n_heads * (self.nope + self.v_head_dim)
        q = ({"q": (q_out, self.d_model)} if self.q_lora_rank is None else
             {"q_a": (self.q_lora_rank, self.d_model), "q_a_norm": (self.q_lora_rank,),
              "q_b": (q_out, self.q_lora_rank)})
        return q | {"kv_a": (self.kv_lora_rank + self.rope, self.d_model), "kv_a_norm": (self.kv_lora_rank,),
                    "kv_b": (kv_out, self.kv_lora_rank)}


@dataclass(frozen=True)
class Part:
    """One part of every head of a layer: W_Q (H, n, m) and W_K (H_k, n, m) in the layer's basis, key of each head."""

    name: str                # 'nope' or 'rope'
    wq: np.ndarray
    wk: np.ndarray
    kv_index: np.ndarray
    factor: str              # the per-token factor on x_j^T L x_i besides score_scale
    rotary: bool             # L depends on i - j (the rope part)


@dataclass(frozen=True)
class LatentLayer(Mapping):
    """A layer's parts in the common span of its down-projections D (m, N): W = W' U^T, U = basis (N x m,
    orthonormal) with D^T = U R; where m >= N there is no smaller span and W' = W (r None). As a mapping, part
    name -> (W_Q, W_K): what Checkpoint.read_circuits gives as "qk" for a model with parts."""

    parts: dict[str, Part]
    down: np.ndarray = field(repr=False)  # D = [W_qa; W_kva] (or [W_q; W_kva])
    r: np.ndarray | None = field(default=None, repr=False)

    def __getitem__(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return self.parts[name].wq, self.parts[name].wk

    def __iter__(self):
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)

    @property
    def basis(self) -> np.ndarray | None:
        """U = D^T R^-1, solved when asked for (the spectra need only R): for tests and per-token scores."""
        return None if self.r is None else np.linalg.solve(self.r.T, self.down).T  # R^T U^T = D


def _count(config: dict, key: str, label: str, optional: bool = False) -> int | None:
    value = config.get(key)
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ExtractError(f"{label}: {key} must be a positive integer, got {value!r}")
    return value


def latent_spec(raw: dict, qk_norm: str = "fold", label: str = "config.json") -> LatentSpec:
    """Validate an MLA config.json (or a GGUF file's metadata as one, `label` naming it) into a LatentSpec, or
    refuse it in one line."""
    architecture = raw.get("model_type")
    if architecture not in FAMILIES:
        raise ExtractError(f"{architecture} is not multi-head latent attention (expected {', '.join(FAMILIES)})")
    if qk_norm != "fold":
        raise ExtractError(f"{architecture} normalises its latent q and kv (q_a_layernorm, kv_a_layernorm), so the "
                           "score is not bilinear in x; pass qk_norm='fold' to fold the norm gains in (each head "
                           "is then two forms, scored per token by 1/rms of the latents)")
    if raw.get("attention_bias"):
        raise ExtractError(f"{architecture} is refused: attention_bias adds a bias to the latents before their "
                           "RMSNorm, so the score is not bilinear in x")
    n_layers, n_heads, d_model = (_count(raw, k, label) for k in ("num_hidden_layers", "num_attention_heads",
                                                                     "hidden_size"))
    q_lora, kv_lora = _count(raw, "q_lora_rank", label, optional=True), _count(raw, "kv_lora_rank", label)
    nope, rope, v_dim = (_count(raw, k, label) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    for key, rank in (("q_lora_rank", q_lora), ("kv_lora_rank", kv_lora)):
        if rank is not None and rank > d_model:
            raise ExtractError(f"{label}: {key} {rank} is larger than the width N = {d_model} (hidden_size): a "
                               "latent of x has rank at most N")
    if rope % 2:
        raise ExtractError(f"{label}: qk_rope_head_dim {rope} is odd; RoPE rotates pairs")
    frequencies, factor, scale = _rope(raw, architecture, rope, (nope + rope) ** -0.5)
    pairing = "interleaved" if architecture == "deepseek_v2" or raw.get("rope_interleave", True) else "split-half"
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    return LatentSpec(architecture=architecture, n_layers=n_layers, n_heads=n_heads, d_model=d_model,
                      q_lora_rank=q_lora, kv_lora_rank=kv_lora, nope=nope, rope=rope, v_head_dim=v_dim,
                      score_scale=scale, rope_factor=factor**2, pairing=pairing, frequencies=frequencies,
                      config=dict(raw), theta=float(params.get("rope_theta") or raw.get("rope_theta") or DEFAULT_THETA),
                      scaling=params.get("rope_type", params.get("type")) or "default")


def model_spec(latent: LatentSpec) -> ModelSpec:
    """The ModelSpec of an MLA model: each head stored as its two parts (FormPart 'nope' through the kv latent, one
    key per head; 'rope' through the rotary key all heads share), RoPE on the rope part, the norm gains folded."""
    lora = latent.q_lora_rank is not None
    parts = (FormPart("nope", latent.nope, tuple(range(latent.n_heads)), False,
                      "1/(rms_q(x_i) rms_kv(x_j))" if lora else "1/rms_kv(x_j)"),
             FormPart("rope", latent.rope, (0,) * latent.n_heads, True, "1/rms_q(x_i)" if lora else "1"))
    rope = Rope(theta=latent.theta, rotary_dims=latent.rope, pairing=latent.pairing, scaling=latent.scaling,
                frequencies=latent.frequencies, attention_factor=float(np.sqrt(latent.rope_factor)))
    config = dict(latent.config) | {"parts": {p.name: {"head_dim": p.head_dim, "factor": p.factor} for p in parts}}
    return ModelSpec(architecture=latent.architecture, n_layers=latent.n_layers, n_heads=latent.n_heads,
                     n_kv_heads=latent.n_heads, d_model=latent.d_model, head_dim=latent.nope + latent.rope,
                     score_scale=latent.score_scale, positional="rope", qk_norm="folded", config=config, rope=rope,
                     parts=parts, form=latent)


def _rope(raw: dict, architecture: str, dims: int, scale: float) -> tuple[tuple[float, ...], float, float]:
    """(frequencies, attention factor a, score scale) as transformers computes them: unscaled RoPE here, any
    scaling (yarn and the rest) by transformers' own rope init function and the family's yarn_apply_mscale."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type")) or "default"
    if kind == "default":
        theta = float(params.get("rope_theta") or raw.get("rope_theta") or DEFAULT_THETA)
        return tuple(theta ** -(np.arange(0, dims, 2, dtype=np.float64) / dims)), 1.0, scale
    try:
        import transformers
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        config = transformers.AutoConfig.for_model(**raw)
        inv_freq, factor = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, "cpu")
        modeling = importlib.import_module(f"transformers.models.{architecture}.modeling_{architecture}")
        scale = float(modeling.yarn_apply_mscale(config.rope_parameters, scale))
    except ImportError:
        raise ExtractError(f"{architecture} with rope_type '{kind}': its frequencies are computed by transformers "
                           "(pip install transformers)") from None
    except Exception as e:  # a rope_type transformers does not know, a parameter it rejects
        raise ExtractError(f"{architecture}: transformers cannot compute its RoPE '{kind}': {first_line(e)}") from None
    return tuple(float(f) for f in inv_freq.double().numpy()), float(factor), scale


def tensors_for(spec: LatentSpec, prefix: str, layer: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """role -> (tensor name, expected shape) of one layer."""
    return {role: (prefix + _ATTENTION.format(i=layer) + TENSORS[role], shape) for role, shape in spec.shapes().items()}


def common_span(down: np.ndarray) -> np.ndarray | None:
    """R of D^T = U R (m x m, upper triangular) for the down-projections D (m, N); None where m >= N (no smaller
    span to reduce through). D = R^T U^T: a map W = C D is W' U^T with W' = C R^T."""
    m, n = down.shape
    return None if m >= n else np.linalg.qr(down.T, mode="r")


def _through(c: np.ndarray | None, rows: np.ndarray, start: int, r: np.ndarray | None) -> np.ndarray:
    """C D_rows (c None: D_rows) in the layer's coordinates: C R^T[rows], rows = start .. start + len; R^T is lower
    triangular, so only its first start + len columns are filled and multiplied (unreduced, r None: C D_rows)."""
    if r is None:
        return rows if c is None else c @ rows
    filled = start + len(rows)
    block = r[:filled, start:filled].T
    out = np.zeros((len(rows) if c is None else len(c), len(r)))
    out[:, :filled] = block if c is None else c @ block
    return out


def latent_parts(t: dict[str, np.ndarray], spec: LatentSpec) -> LatentLayer:
    """A layer's two parts from its raw tensors (role -> array, float64), the latent norms' gains folded in; the
    nope rows of kv_b from kv_b, or from k_b (H, kv_lora, nope) where a GGUF file stores them so."""
    h, nope, rope, lora = spec.n_heads, spec.nope, spec.rope, spec.q_lora_rank is not None
    q_down = t["q_a"] if lora else t["q"]
    down = np.concatenate([q_down, t["kv_a"]])
    r = common_span(down)
    kv_at, rope_at = len(q_down), len(q_down) + spec.kv_lora_rank
    # q = W_qb diag(g_q) W_qa x / rms_q, or W_q x (rows of D themselves)
    q = _through(t["q_b"] * t["q_a_norm"] if lora else None, q_down, 0, r).reshape(h, nope + rope, -1)
    kv_b = (t["k_b"].swapaxes(1, 2) if "k_b" in t  # GGUF's split layout: (H, kv_lora, nope)
            else t["kv_b"].reshape(h, nope + spec.v_head_dim, spec.kv_lora_rank)[:, :nope])
    k_nope = _through((kv_b * t["kv_a_norm"]).reshape(h * nope, -1), t["kv_a"][:spec.kv_lora_rank], kv_at, r)
    k_rope = _through(None, t["kv_a"][spec.kv_lora_rank:], rope_at, r)[None]  # shared by every head
    heads = np.arange(h)
    return LatentLayer({
        "nope": Part("nope", np.ascontiguousarray(q[:, :nope]), k_nope.reshape(h, nope, -1), heads,
                     "1/(rms_q(x_i) rms_kv(x_j))" if lora else "1/rms_kv(x_j)", False),
        "rope": Part("rope", np.ascontiguousarray(spec.rope_factor * q[:, nope:]), k_rope, np.zeros(h, np.intp),
                     "1/rms_q(x_i)" if lora else "1", True),
    }, down, r)
