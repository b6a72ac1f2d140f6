"""Layouts of model_types not in the table, found by building the transformers model on the meta device.

The model is instantiated from config.json with no weights (every parameter on torch's meta device),
its per-layer self-attention modules are located, and their query/key projections are accepted only
as separate nn.Linear weights whose shapes `SEPARATE` explains for the config's head counts. Fused
QKV projections are refused (their row order cannot be told from shapes), as is anything that makes
the score not bilinear in x. transformers is needed here only; the table's families never import it.
"""
from __future__ import annotations

import re
import sys

from headforms.extract.checkpoint import ExtractError, first_line
from headforms.extract.layouts import SEPARATE, SUPPORTED, Layout, Scale, _softcap_refusal

# (query, key) child names of an attention module holding separate projections.
_QK_NAMES = (("q_proj", "k_proj"), ("query", "key"), ("q_lin", "k_lin"))
_FUSED_NAMES = ("qkv_proj", "query_key_value", "c_attn", "Wqkv", "qkv")
# Child modules or parameters that make the score non-bilinear, and why.
_NON_BILINEAR = {
    "q_a_layernorm": "multi-head latent attention normalises the latent q and kv inside the projection",
    "kv_a_layernorm": "multi-head latent attention normalises the latent q and kv inside the projection",
    "lambda_q1": "differential attention subtracts two softmaxes",
    "q_norm": "QK-norm (q_norm, k_norm) divides q and k by their RMS; --qk-norm fold needs the family in the table",
    "q_layernorm": "q and k pass through a LayerNorm",
}
_CROSS = ("encoder_attn", "crossattention", "cross_attn")  # cross-attention reads another sequence: not a form of x


def discover_layout(raw: dict) -> Layout:
    """A SEPARATE layout for raw's model_type from its transformers class on the meta device, or one-line refusal."""
    model_type = raw.get("model_type")
    unsupported = f"unsupported architecture '{model_type}' (supported: {', '.join(SUPPORTED)})"
    try:
        import torch
        import transformers
    except ImportError:
        raise ExtractError(f"{unsupported}; finding its layout needs transformers (pip install transformers)") from None
    try:
        config = transformers.AutoConfig.for_model(**raw)
        named = (raw.get("architectures") or [None])[0]
        model_class = getattr(transformers, named, None) if isinstance(named, str) else None
        with torch.device("meta"):
            model = model_class(config) if model_class else transformers.AutoModel.from_config(config)
    except Exception as e:  # unknown model_type, a config the class rejects: one line either way
        raise ExtractError(f"{unsupported}; transformers {transformers.__version__} cannot build it: "
                           f"{first_line(e)}") from None
    return _layout_from_model(model, config, model_type)


def _rope_pairing(module) -> str:
    """The RoPE pairing of the family's `rotate_half` (in the attention module's source module), probed on
    (1, 2, 3, 4): (-3, -4, 1, 2) rotates split halves, (-2, 1, -4, 3) adjacent pairs; else 'unrecognised'."""
    import torch

    rotate = getattr(sys.modules.get(type(module).__module__), "rotate_half", None)
    if rotate is None:
        return "unrecognised"
    probe = tuple(rotate(torch.arange(1.0, 5.0)).tolist())
    return {(-3.0, -4.0, 1.0, 2.0): "split-half", (-2.0, 1.0, -4.0, 3.0): "interleaved"}.get(probe, "unrecognised")


def _refuse(model_type: str, reason: str) -> ExtractError:
    return ExtractError(f"{model_type} is refused (layout found by transformers on the meta device): {reason}")


def _layout_from_model(model, config, model_type: str) -> Layout:
    """The attention stack of a meta-device model as a Layout: one module per layer, separate Q/K, known shapes."""
    stacks: dict[str, dict[int, object]] = {}
    for name, module in model.named_modules():
        children = dict(module.named_children())
        if any(part in _CROSS for part in name.split(".")):
            continue
        for attr, why in _NON_BILINEAR.items():
            if attr in children or attr in dict(module.named_parameters(recurse=False)):
                raise _refuse(model_type, f"{why}, so the score is not bilinear in x")
        fused = next((f for f in _FUSED_NAMES if f in children), None)
        if fused:
            raise _refuse(model_type, f"its fused QKV projection '{name}.{fused}' cannot be split by shape alone")
        pair = next(((q, k) for q, k in _QK_NAMES if q in children and k in children), None)
        match = re.search(r"\.(\d+)\.", f".{name}.")
        if pair and match:
            template = f".{name}.".replace(match.group(0), ".{i}.", 1).strip(".")
            stacks.setdefault(template + "|" + "|".join(pair), {})[int(match.group(1))] = module
    if len(stacks) != 1:
        found = "no" if not stacks else f"{len(stacks)}"
        raise _refuse(model_type, f"{found} stacks of self-attention modules with separate q/k projections "
                                  "(expected exactly one)")
    key, modules = stacks.popitem()
    template, q_name, k_name = key.split("|")
    text = config.get_text_config()
    n_layers = text.num_hidden_layers
    if sorted(modules) != list(range(n_layers)):
        raise _refuse(model_type, f"its attention modules cover layers {sorted(modules)}, not 0..{n_layers - 1}")
    first = modules[0]
    scale = getattr(first, "scaling", getattr(first, "scale", None))
    if not isinstance(scale, float):
        raise _refuse(model_type, "its attention module records no score scale (scaling)")
    n_heads, d_model = text.num_attention_heads, text.hidden_size
    n_kv = getattr(text, "num_key_value_heads", None) or n_heads
    head_dim = getattr(text, "head_dim", None) or d_model // n_heads
    q_shape = tuple(getattr(first, q_name).weight.shape)
    k_shape = tuple(getattr(first, k_name).weight.shape)
    if (q_shape, k_shape) != ((n_heads * head_dim, d_model), (n_kv * head_dim, d_model)):
        raise _refuse(model_type, f"q/k projections of shapes {q_shape}, {k_shape} are not separate projections of "
                                  f"{n_heads} query and {n_kv} key heads of size {head_dim} from width {d_model}")
    prefix = model.base_model_prefix + "."
    tensors = {role: f"{template}.{proj}.weight" for role, proj in (("q", q_name), ("k", k_name))}
    prefixes = ("",)
    if template.startswith(prefix):
        tensors = {role: name.removeprefix(prefix) for role, name in tensors.items()}
        prefixes = (prefix, "")
    rotary = any(getattr(text, key, None) for key in ("rope_parameters", "rope_scaling", "rope_theta"))
    return Layout(positional="rope" if rotary else "learned", prefixes=prefixes, tensors=tensors, packing=SEPARATE,
                  grouped=True, scale=Scale("from the attention module (scaling)", lambda c, n: scale),
                  refusal=_softcap_refusal, rope_pairing=_rope_pairing(first) if rotary else "split-half")
