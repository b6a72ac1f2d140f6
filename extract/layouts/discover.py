"""Layouts of model_types not in the table, found by building the transformers model on the meta device.

The model is instantiated from config.json with no weights (every parameter on torch's meta device),
its per-layer self-attention modules are located, and their query/key projections are accepted only
as separate nn.Linear weights whose shapes `SEPARATE` explains for the config's head counts (their value and
output projections, its token embedding, LM head and final norm likewise, for the ov circuit). Fused
QKV projections are refused (their row order cannot be told from shapes), as is anything that makes
the score not bilinear in x. A layout so found is accepted only once proven (`prove`): a tiny random
instance of the family, built from its own config with the sizes shrunk, must reproduce its own pre-softmax
logits as score_scale * x_j^T L_(i-j) x_i at distance 0 and at nonzero distances (and, for the ov circuit, its
attention output as sum_h W_O W_V A x, its final norm's gain offset by what the norm does); its QK-norms are found by
what the attention module does (a submodule fed q or k), not by their names. The verdict is kept per
(model_type, transformers version) in the headforms cache. transformers is needed here only; the table's
families never import it.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import replace
from typing import Callable

import numpy as np

from headforms.extract.checkpoint import ExtractError, ModelSpec, first_line
from headforms.extract.layouts.rope import PAIRINGS
from headforms.extract.layouts.table import GATED_Q, SEPARATE, SUPPORTED, Embeddings, Layout, Scale
from headforms.extract.transport.caches import cache_root

# (query, key) child names of an attention module holding separate projections.
_QK_NAMES = (("q_proj", "k_proj"), ("query", "key"), ("q_lin", "k_lin"))
_V_NAMES, _O_NAMES = ("v_proj", "value", "v_lin"), ("o_proj", "out_proj", "dense", "out_lin")  # the ov circuit's
_FINAL_NORMS = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f")  # the base model's, before the head
_FUSED_NAMES = ("qkv_proj", "query_key_value", "c_attn", "Wqkv", "qkv")
# Child modules or parameters that make the score non-bilinear, and why.
_NON_BILINEAR = {
    "q_a_layernorm": "multi-head latent attention normalises the latent q and kv inside the projection",
    "kv_a_layernorm": "multi-head latent attention normalises the latent q and kv inside the projection",
    "lambda_q1": "differential attention subtracts two softmaxes",
}
_CROSS = ("encoder_attn", "crossattention", "cross_attn")  # cross-attention reads another sequence: not a form of x


def discover_layout(raw: dict, shaped: Callable[..., ModelSpec]) -> Layout:
    """A SEPARATE layout for raw's model_type from its transformers class on the meta device, proven by `prove` (its
    specs built by `shaped`: extract.layouts.spec.shaped_spec), or one-line refusal."""
    model_type = raw.get("model_type")
    unsupported = f"unsupported architecture '{model_type}' (supported: {', '.join(SUPPORTED)})"
    try:
        import torch
        import transformers
    except ImportError:
        raise ExtractError(f"{unsupported}; finding its layout needs transformers (pip install transformers)") from None
    raw = transformers.PretrainedConfig._decode_special_floats(raw)  # config.json's {"__float__": "Infinity"}
    try:
        config = transformers.AutoConfig.for_model(**raw)
        named = (raw.get("architectures") or [None])[0]
        model_class = getattr(transformers, named, None) if isinstance(named, str) else None
        with torch.device("meta"):
            model = model_class(config) if model_class else transformers.AutoModel.from_config(config)
    except Exception as e:  # unknown model_type, a config the class rejects: one line either way
        raise ExtractError(f"{unsupported}; transformers {transformers.__version__} cannot build it: "
                           f"{first_line(e)}") from None
    return proven(_layout_from_model(model, config, model_type), raw, shaped)


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
    n_layers, attention = text.num_hidden_layers, tuple(sorted(modules))
    if not set(attention) <= set(range(n_layers)):
        raise _refuse(model_type, f"its attention modules cover layers {list(attention)}, not 0..{n_layers - 1}")
    first = modules[attention[0]]
    scale = getattr(first, "scaling", getattr(first, "scale", None))
    if not isinstance(scale, float):
        raise _refuse(model_type, "its attention module records no score scale (scaling)")
    n_heads, d_model = text.num_attention_heads, text.hidden_size
    n_kv = getattr(text, "num_key_value_heads", None) or n_heads
    head_dim = getattr(text, "head_dim", None) or d_model // n_heads
    q_shape = tuple(getattr(first, q_name).weight.shape)
    k_shape = tuple(getattr(first, k_name).weight.shape)
    packing = GATED_Q if q_shape == (2 * n_heads * head_dim, d_model) else SEPARATE  # Qwen3-Next: query and gate rows
    expected = packing.shapes(ModelSpec(model_type, n_layers, n_heads, n_kv, d_model, head_dim, 1.0, "none"))
    if (q_shape, k_shape) != (expected["q"], expected["k"]):
        raise _refuse(model_type, f"q/k projections of shapes {q_shape}, {k_shape} are not separate projections of "
                                  f"{n_heads} query and {n_kv} key heads of size {head_dim} from width {d_model}")
    prefix = model.base_model_prefix + "."
    tensors = {role: f"{template}.{proj}.weight" for role, proj in (("q", q_name), ("k", k_name))}
    tensors |= _value_output(first, template, (n_kv * head_dim, d_model), (d_model, n_heads * head_dim))
    if "sinks" in dict(first.named_parameters(recurse=False)):  # gpt-oss: a logit per head in each softmax
        tensors["sinks"] = f"{template}.sinks"
    embeddings = _embeddings(model, d_model) if "o" in tensors else None
    prefixes = ("",)
    if template.startswith(prefix):
        tensors = {role: name.removeprefix(prefix) for role, name in tensors.items()}
        embeddings = embeddings and replace(embeddings, token=embeddings.token.removeprefix(prefix),
                                            final_norm=embeddings.final_norm.removeprefix(prefix))
        prefixes = (prefix, "")
    rotary = any(getattr(text, key, None) for key in ("rope_parameters", "rope_scaling", "rope_theta"))
    return Layout(positional="rope" if rotary else _unrotated(model), prefixes=prefixes, tensors=tensors, packing=packing,
                  grouped=True, scale=Scale("from the attention module (scaling)", lambda c, n: scale),
                  softcap="attn_logit_softcapping", rope_pairing=_rope_pairing(first) if rotary else "split-half",
                  embeddings=embeddings,  # a hybrid: its state-space or linear-attention layers have no heads
                  attention_layers=None if len(attention) == n_layers else lambda config, found=attention: found)


def _unrotated(model) -> str:
    """The positional scheme of a model whose attention does not rotate: 'learned' when it embeds positions (an
    embedding table besides its tokens'), else 'none' (NoPE: the same form at every distance)."""
    import torch

    tokens = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return "learned" if any(isinstance(m, torch.nn.Embedding) and m is not tokens for m in model.modules()) else "none"


def _value_output(attention, template: str, v_shape: tuple, o_shape: tuple) -> dict[str, str]:
    """The ov circuit's tensors ('v', 'o') of an attention module with separate value and output projections of the
    shapes the config implies (else none: its ov circuit is then refused)."""
    children = dict(attention.named_children())
    v = next((n for n in _V_NAMES if n in children), None)
    o = next((n for n in _O_NAMES if n in children), None)
    if v is None or o is None or tuple(getattr(children[v], "weight", np.empty(0)).shape) != v_shape \
            or tuple(getattr(children[o], "weight", np.empty(0)).shape) != o_shape:
        return {}
    return {"v": f"{template}.{v}.weight", "o": f"{template}.{o}.weight"}


def _embeddings(model, d_model: int) -> Embeddings | None:
    """The token embedding, LM head and final norm of a meta-device model (the norm's offset found by the proof),
    or None where any is not found."""
    names = {id(module): name for name, module in model.named_modules()}
    try:
        token, head, base = model.get_input_embeddings(), model.get_output_embeddings(), model.base_model
    except (NotImplementedError, AttributeError):  # a class that does not say where its embeddings are
        return None
    norm = next((n for n in _FINAL_NORMS if tuple(getattr(getattr(base, n, None), "weight", np.empty(0)).shape)
                 == (d_model,)), None)
    if id(token) not in names or norm is None:
        return None
    head_name = f"{names[id(head)]}.weight" if head is not None else "lm_head.weight"  # a base model: tied, W_E
    return Embeddings(f"{names[id(token)]}.weight", (head_name,), ".".join(filter(None, (names[id(base)], norm)))
                      + ".weight")


VERDICTS = "families.json"  # in the headforms cache: model_type and transformers version -> the proof's verdict
PROOF = 4  # the proof's own version, in the cache key: a changed proof does not reuse an old verdict
# Largest logit mismatch, relative to the largest logit, a proof accepts: transformers computes RoPE's angles and
# many norms in float32 even in a float64 model (1e-5 at distance 6000); a wrong form misses by O(1).
TOLERANCE = 1e-4
# transformers forms RoPE's angles in float32 (inv_freq x position): at position p an angle is off by up to about
# p 2^-24 radians, so the proof allows that much more at far positions (a wrong pairing or frequency misses by O(1))
FLOAT32_ANGLE = 2.0**-24
# Config fields shrunk for the proof (the structure kept: layer types, rope settings, norms, flags).
_SHRUNK = {"hidden_size": 32, "intermediate_size": 64, "vocab_size": 64, "num_attention_heads": 4,
           "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "num_experts": 2,
           "num_local_experts": 2, "n_routed_experts": 2, "num_experts_per_tok": 1}
_TOKENS = 8  # tokens of the proof's sequences


def shrunk_config(raw: dict, keep: int) -> dict:
    """raw with its sizes shrunk (width 32, 4 heads of size 8, `keep` layers, 64 tokens), every other field kept:
    lists over the layers are cut to the layers kept, token ids beyond the vocabulary dropped."""
    out = {k: v for k, v in raw.items() if k != "quantization_config"} | {
        k: v for k, v in _SHRUNK.items() if k in raw}
    layers = raw.get("num_hidden_layers") or 2
    out["num_hidden_layers"] = min(layers, keep)
    for key, value in raw.items():
        if isinstance(value, list) and len(value) == layers and key != "architectures":
            out[key] = value[:out["num_hidden_layers"]]
    heads, kv = raw.get("num_attention_heads") or 4, raw.get("num_key_value_heads")
    if kv is not None:
        out["num_key_value_heads"] = 4 if kv == heads else 1 if kv == 1 else 2
    if raw.get("head_dim") is not None:
        out["head_dim"] = 8
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(raw.get(key), int) and raw[key] >= out.get("vocab_size", 64):
            out[key] = None
        elif isinstance(raw.get(key), list):
            out[key] = [i for i in raw[key] if i < out.get("vocab_size", 64)] or None
    return out


_UNPROVEN_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")  # fields no proof depends on


def _kept_layers(layout: Layout, raw: dict) -> int:
    """Layers of the proof's tiny instance: 2, or a hybrid's layers through its first attention layer (at least 2)."""
    return max(2, layout.attention_layers(raw)[0] + 1) if layout.attention_layers else 2


def _verdict_key(raw: dict, version: str, keep: int) -> str:
    """The cache key: model_type, transformers version and a digest of the config as the proof builds it (sizes
    shrunk): checkpoints of one family differing only in size share a verdict, a changed flag or multiplier not."""
    shrunk = {k: v for k, v in shrunk_config(raw, keep).items() if k not in _UNPROVEN_KEYS}
    digest = hashlib.sha256(json.dumps(shrunk, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{raw.get('model_type')} transformers {version} proof {PROOF} config {digest}"


def _load_verdicts() -> dict:
    try:
        return json.loads((cache_root() / VERDICTS).read_text())
    except (OSError, ValueError):
        return {}


def _save_verdict(key: str, verdict: dict) -> None:
    """Add one verdict to the cache file (a cache that cannot be written is only slower next time)."""
    path = cache_root() / VERDICTS
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{id(verdict)}.tmp")
        tmp.write_text(json.dumps(_load_verdicts() | {key: verdict}, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass


def _with_norms(layout: Layout, norms: dict | None) -> Layout:
    """The layout with the QK-norms the proof found: their kind, gain tensors and offset."""
    if not norms:
        return layout
    base = layout.tensors["q"].rsplit(".", 2)[0]  # the attention module's template
    return replace(layout, qk_norm=norms["kind"], norm_offset=norms["offset"],
                   tensors=layout.tensors | {role: f"{base}.{norms[role]}.weight" for role in ("q_norm", "k_norm")})


def proven(layout: Layout, raw: dict, shaped: Callable[..., ModelSpec]) -> Layout:
    """The discovered layout once the family's tiny instance reproduces its own logits (cached verdict), with the
    QK-norms found on the way; else the one-line refusal saying what did not match."""
    from importlib.metadata import version

    key = _verdict_key(raw, version("transformers"), _kept_layers(layout, raw))
    verdict = _load_verdicts().get(key)
    if verdict is None:
        try:
            verdict = prove(layout, raw, shaped) | {"refusal": None}
        except ExtractError as e:
            verdict = {"refusal": str(e)}
        _save_verdict(key, verdict | {"row": _row(layout, raw.get("model_type"), verdict, version("transformers"))})
    if verdict["refusal"]:
        raise ExtractError(verdict["refusal"])
    layout = replace(_with_norms(layout, verdict["norms"]), rope_pairing=verdict["pairing"],
                     positional=verdict["positional"])
    if verdict["score_factor"] != 1.0:  # a multiplier on q or k beside the module's scaling, proven by the logits
        base, factor = layout.scale, verdict["score_factor"]
        layout = replace(layout, scale=Scale(f"{base.formula} x {factor:.6g} (measured by its logits)",
                                             lambda config, n: base.of(config, n) * factor))
    if verdict["ov"]:
        return replace(layout, ov_refused=verdict["ov"])
    return replace(layout, embeddings=replace(layout.embeddings, norm_offset=verdict["final_norm_offset"]))


def _row(layout: Layout, model_type: str, verdict: dict, version: str) -> dict:
    """The family as `headforms architectures` lists it: its layout and what the proof found, or why it failed."""
    row = {"format": "hf (discovered)", "family": model_type, "positional": verdict.get("positional", layout.positional),
           "packing": layout.packing.name, "score_scale": layout.scale.formula}
    if verdict["refusal"]:
        return row | {"notes": f"refused on transformers {version}: {verdict['refusal'].split('): ', 1)[-1]}"}
    notes = [f"proven by its own logits on transformers {version}"]
    if verdict["norms"]:
        notes.append(f"QK-norm ({verdict['norms']['kind']} gains, found by what the attention module does): "
                     "refused unless --qk-norm fold")
    if verdict["score_factor"] != 1.0:
        notes.append(f"its logits are {verdict['score_factor']:.6g} x the module's scaling times q.k (a multiplier "
                     "on q or k), proven at every position")
    if verdict["positional"] == "rope":
        notes.append(f"RoPE pairs {verdict['pairing']}")
    elif layout.positional == "rope":
        notes.append(f"its config names RoPE parameters, but its attention does not rotate ({verdict['positional']})")
    if "sinks" in layout.tensors:
        notes.append("a sink logit per head (heads.sink_logit), proven by the probability its keys leave over")
    if layout.attention_layers:
        notes.append("a hybrid: its softmax-attention layers are read, under their own indices in the stack")
    return row | {"notes": "; ".join(notes)}


def discovered_families() -> list[dict]:
    """The `headforms architectures` rows of the families proven or refused on this machine (the verdict cache)."""
    rows = {json.dumps(v["row"], sort_keys=True): v["row"] for _, v in sorted(_load_verdicts().items()) if "row" in v}
    return list(rows.values())


def _tiny(raw: dict, keep: int):
    """A tiny random float64 instance of raw's family (eager attention): weights N(0, 1/N), gains U(0.5, 1.5),
    biases zero (the form holds no bias), as the layout tests build theirs."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**shrunk_config(raw, keep))
    named = (raw.get("architectures") or [None])[0]
    model_class = getattr(transformers, named, None) if isinstance(named, str) else None
    model_class = model_class or transformers.AutoModel
    torch.manual_seed(0)
    eager = {"attn_implementation": "eager", "experts_implementation": "eager"}  # float64 runs on eager code only
    model = (model_class._from_config(config, **eager) if model_class is not transformers.AutoModel
             else transformers.AutoModel.from_config(config, **eager))
    model = model.to(torch.float64).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif param.ndim == 1:
                param.uniform_(0.5, 1.5, generator=generator)
            else:
                param.normal_(0.0, config.get_text_config().hidden_size ** -0.5, generator=generator)
    return model, config


def _run(model, modules: list, positions) -> list:
    """One forward pass at the given positions: per attention module (layer), its input x (T, N), its
    probabilities (H, T, T) and every submodule call (name, module, input, output) inside it."""
    import torch

    seen, hooks = [{"calls": []} for _ in modules], []
    for module, record in zip(modules, seen):
        def given(m, args, kwargs, record=record) -> None:
            record.setdefault("x", kwargs.get("hidden_states", args[0] if args else None))

        def returned(m, args, out, record=record) -> None:
            record.setdefault("out", out)

        hooks.append(module.register_forward_pre_hook(given, with_kwargs=True))
        hooks.append(module.register_forward_hook(returned))
        for name, sub in module.named_modules():
            if name:
                hooks.append(sub.register_forward_hook(
                    lambda m, args, out, name=name, calls=record["calls"]:
                    calls.append((name, m, args[0] if args else None, out)) and None))
    tokens = torch.randint(3, 64, (1, _TOKENS), generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad():
            model(input_ids=tokens, attention_mask=torch.ones_like(tokens),
                  position_ids=torch.as_tensor([positions]))
    except Exception as e:
        raise ExtractError(f"its tiny instance does not run in transformers: {first_line(e)}") from None
    finally:
        for hook in hooks:
            hook.remove()
    runs = []
    for record in seen:
        out = record.get("out")
        probs = out[1] if isinstance(out, tuple) and len(out) > 1 else None
        if "x" not in record or not isinstance(probs, torch.Tensor):
            raise ExtractError("its attention module returns no attention weights under eager attention, so its "
                               "logits cannot be checked")
        runs.append((record["x"][0].numpy(), probs[0].numpy(), record["calls"]))
    return runs


def _qk_norms(calls, q_name: str, k_name: str, heads: int, n: int, gated: bool) -> dict | None:
    """The norm submodules fed q and k (position 0: RoPE is the identity, so a norm after RoPE is fed the same
    values), their kind (RMS per head, over the projection, or centred) and gain offset, found by what they do;
    `gated`: q is the query half of each head's rows of the q projection (GATED_Q)."""
    import torch

    outputs = {name: out for name, _, _, out in calls if name in (q_name, k_name)}
    if gated and q_name in outputs:
        outputs[q_name] = outputs[q_name].unflatten(-1, (heads, 2, n))[..., 0, :]
    found = {}
    for name, sub, given, out in calls:
        if name in (q_name, k_name) or not isinstance(given, torch.Tensor) or "." in name:
            continue
        for role, proj in (("q_norm", q_name), ("k_norm", k_name)):
            source = outputs.get(proj)
            if source is not None and given.numel() == source.numel() and torch.equal(
                    given.reshape(-1).sort().values, source.reshape(-1).sort().values):
                found[role] = (name, sub, given, out)
    if not found:
        return None
    if set(found) != {"q_norm", "k_norm"}:
        raise ExtractError(f"a norm ({', '.join(v[0] for v in found.values())}) is applied to only one of q and k")
    kinds = {_norm_kind(*found[role][1:]) for role in found}
    if len(kinds) != 1 or None in kinds:
        raise ExtractError("its q/k norm modules do not act as an RMSNorm or bias-free LayerNorm with a gain, so "
                           "the score is not a bilinear form of x divided by per-token norms")
    kind, offset = kinds.pop()
    return {"kind": kind, "offset": offset, "q_norm": found["q_norm"][0], "k_norm": found["k_norm"][0],
            "eps": _eps(found["q_norm"][1])}


def _eps(module) -> float:
    return float(next((getattr(module, a) for a in ("variance_epsilon", "eps", "epsilon") if hasattr(module, a)), 1e-6))


def _norm_kind(module, given, out) -> tuple[str, float] | None:
    """(kind, offset) of a norm module from its input and output: 'head' or 'projection' by its gain's length, an
    RMS or a centred (LayerNorm) one, gain `offset + weight`; None when it does neither."""
    import torch

    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 1 or getattr(module, "bias", None) is not None:
        return None
    size, eps = weight.numel(), _eps(module)
    x = given.reshape(-1, size)
    for kind, centred in (("rms", False), ("centred", True)):
        y = x - x.mean(-1, keepdim=True) if centred else x
        unit = y / torch.sqrt((y**2).mean(-1, keepdim=True) + eps)
        for offset in (0.0, 1.0):
            if torch.allclose(unit * (offset + weight), out.reshape(-1, size), rtol=1e-5, atol=1e-6):
                return ("centred" if centred else "rms", offset)
    return None


def prove(layout: Layout, raw: dict, shaped: Callable[..., ModelSpec]) -> dict:
    """Run the family's tiny instance at position 0 and at spread positions and require score_scale *
    x_j^T W_K^T R(p_j)^T R(p_i) W_Q x_i (divided by the QK-norms' RMS of q_i and k_j) to reproduce its logits,
    compared as differences to the first key (what the softmax keeps), and the heads' sink logits (if any) to
    reproduce the probability the keys leave over. Returns the QK-norms found (None: none), the RoPE pairing and the
    positional scheme proven (a config naming RoPE whose layers do not rotate is NoPE: the logits decide)."""
    model_type = raw.get("model_type")
    try:
        model, config = _tiny(raw, _kept_layers(layout, raw))
    except Exception as e:
        raise _refuse(model_type, f"its tiny instance cannot be built to prove the layout: {first_line(e)}") from None
    template, q_name, k_name = layout.tensors["q"].rsplit(".", 2)[0], *(layout.tensors[r].rsplit(".", 2)[1]
                                                                        for r in ("q", "k"))
    state = {k: v.double().numpy() for k, v in model.state_dict().items()}
    n_tiny = config.get_text_config().num_hidden_layers
    prefix = next((p for p in layout.prefixes for i in range(n_tiny)
                   if p + template.format(i=i) + f".{q_name}.weight" in state), model.base_model_prefix + ".")
    named = dict(model.named_modules())
    layers = tuple(i for i in range(n_tiny) if prefix + template.format(i=i) in named)  # a hybrid's: some
    if not layers:
        raise _refuse(model_type, f"its tiny instance of {n_tiny} layers has no attention module to prove")
    modules = [named[prefix + template.format(i=i)] for i in layers]
    shrunk = config.to_dict() | {"model_type": model_type}
    layout = replace(layout, attention_layers=None if len(layers) == n_tiny else lambda config: layers)
    spec = shaped(layout, shrunk, shrunk, model_type)
    try:
        norms = _qk_norms(_run(model, modules, [0] * _TOKENS)[0][2], q_name, k_name, spec.n_heads, spec.head_dim,
                          layout.packing is GATED_Q)
    except ExtractError as e:
        raise _refuse(model_type, str(e)) from None
    if norms and norms["kind"] == "rms":
        norms["kind"] = "head" if state[prefix + f"{template.format(i=layers[0])}.{norms['q_norm']}.weight"].size == \
            spec.head_dim else "projection"
    pairings = [layout.rope_pairing] if layout.positional != "rope" or layout.rope_pairing in PAIRINGS else PAIRINGS
    candidates = [replace(_with_norms(layout, norms), rope_pairing=pairing) for pairing in pairings]
    if layout.positional == "rope":  # RoPE parameters in a config whose attention may not rotate (Granite 4's NoPE)
        candidates.append(replace(_with_norms(layout, norms), positional=_unrotated(model)))
    ratio = float(modules[0].scaling) / layout.scale.of(shrunk, spec.head_dim)
    first = shaped(candidates[0], shrunk, shrunk, model_type)
    factor = _score_factor(model, modules, candidates[0], replace(first, score_scale=first.score_scale * ratio), norms,
                           state, prefix, (q_name, k_name))
    failures = []
    for candidate in candidates:  # a rotary the family's source does not name (no rotate_half): the logits decide
        failure = _check(model, modules, candidate, shaped(candidate, shrunk, shrunk, model_type), norms, state,
                         prefix, (q_name, k_name), ratio * factor, int(raw.get("max_position_embeddings") or 4096))
        if failure is None:
            return {"norms": norms, "pairing": candidate.rope_pairing, "positional": candidate.positional,
                    "score_factor": factor} | _prove_ov(model, modules, candidate, spec, state, prefix)
        failures.append(failure)
    raise _refuse(model_type, failures[0])


def _prove_ov(model, modules, layout: Layout, spec: ModelSpec, state, prefix: str) -> dict:
    """The ov circuit's verdict, {'ov': None or why not, 'final_norm_offset'}: each layer's output projection must
    give sum_h W_O[h] W_V[kv(h)] sum_j A_ij x_j (the tiny instance's own A), and the final norm feeding its LM head
    must act as an RMSNorm or bias-free LayerNorm with gain offset + weight."""
    if "o" not in layout.tensors or layout.embeddings is None:
        return {"ov": "its value and output projections, token embedding or final norm were not found"}
    o_name = layout.tensors["o"].rsplit(".", 2)[1]
    worst = 0.0
    for layer, (x, probs, calls) in zip(spec.layers, _run(model, modules, [0] * _TOKENS)):
        raw = {role: state[prefix + name] for role, (name, _) in layout.tensors_for(spec, "", layer, ("ov",)).items()}
        w_v, w_o = layout.ov_maps(raw, spec)
        out = next((o for name, _, _, o in calls if name == o_name), None)
        if out is None:
            return {"ov": f"its output projection {o_name} is not called by the attention module"}
        values = np.einsum("kva,ja->kjv", w_v, x)[spec.kv_index]
        predicted, out = np.einsum("hnv,hij,hjv->in", w_o, probs, values), out[0].numpy()
        worst = max(worst, float(np.abs(out - predicted).max() / max(np.abs(out).max(), 1e-300)))
    if worst > 1e-8:
        return {"ov": f"its tiny instance's attention output differs from sum_h W_O W_V A x by {worst:.2g} of its "
                      "largest value"}
    offset = _final_norm_offset(model, prefix + layout.embeddings.final_norm.removesuffix(".weight"))
    if offset is None:
        return {"ov": "its final norm does not feed its LM head as an RMSNorm or bias-free LayerNorm with a gain"}
    return {"ov": None, "final_norm_offset": offset}


def _final_norm_offset(model, norm_name: str) -> float | None:
    """The offset of the final norm's gain (offset + weight), found by what it does on a forward pass, if its output
    is what the LM head reads; else None."""
    import torch

    norm, head, seen = model.get_submodule(norm_name), model.get_output_embeddings(), {}

    def normed(module, args, out) -> None:
        seen.setdefault("norm", (args[0], out))

    def read(module, args) -> None:
        seen.setdefault("head", args[0])

    hooks = [norm.register_forward_hook(normed)] + ([head.register_forward_pre_hook(read)] if head is not None else [])
    tokens = torch.randint(3, 64, (1, _TOKENS), generator=torch.Generator().manual_seed(2))
    try:
        with torch.no_grad():
            model(input_ids=tokens, attention_mask=torch.ones_like(tokens))
    except Exception:
        return None
    finally:
        for hook in hooks:
            hook.remove()
    if "norm" not in seen or (head is not None and not torch.equal(seen.get("head"), seen["norm"][1])):
        return None
    kind = _norm_kind(norm, *seen["norm"])
    return None if kind is None else kind[1]


def _score_factor(model, modules, layout: Layout, spec: ModelSpec, norms, state, prefix: str, names) -> float:
    """The constant by which the tiny instance's logits exceed the form's at distance 0, least squares over its first
    attention layer's causal pairs: 1 where they agree, else a multiplier the module puts on q or k beside its scaling
    (Falcon-H1's key_multiplier), which `_check` then proves at every position (a capped family: 1)."""
    if spec.softcap:
        return 1.0
    raw = {role: state[prefix + name] for role, (name, _) in layout.tensors_for(spec, "", spec.layers[0]).items()}
    (x, probs, calls), = _run(model, modules[:1], [0] * _TOKENS)
    predicted = _predicted(x, calls, *layout.qk_maps(raw, spec), spec, norms, names, None, [0] * _TOKENS,
                           layout.packing is GATED_Q)
    _, _, model_diff, form_diff = _diffs(probs, predicted)
    factor = float((model_diff * form_diff).sum() / max((form_diff**2).sum(), 1e-300))
    return factor if factor > 0 and abs(factor - 1.0) > TOLERANCE else 1.0


def _check(model, modules, layout: Layout, spec: ModelSpec, norms, state, prefix: str, names, scale_ratio: float,
           far: int) -> str | None:
    """What did not match when `layout` is proven on the tiny model (its layers `modules`), else None: logits at
    positions 0, at position 7 throughout (distance 0 elsewhere than 0), and at positions spread to 1.5x `far`
    (within `far` without RoPE, whose position embeddings end there; none for a RoPE whose distance profiles are
    refused); and the sink logits' probabilities."""
    from headforms.compute.rotary import Rotation

    spec = replace(spec, score_scale=spec.score_scale * scale_ratio)  # the tiny module's own scaling
    raws = [{role: state[prefix + name] for role, (name, _) in layout.tensors_for(spec, "", i).items()}
            for i in spec.layers]
    maps = [layout.qk_maps(raw, spec) for raw in raws]
    rotation = (Rotation.of(spec.rope.pairing, spec.rope.frequencies)
                if spec.rope is not None and spec.rope.frequencies else None)
    spread = [3, 4, 6, 9, 17, 40, far // 2 + 5, far + far // 2 if rotation is not None else far - 1]
    if spec.rope is not None and rotation is None:  # RoPE whose distances are refused (per-layer settings): 0 only
        spread = [0] * _TOKENS
    for positions in ([0] * _TOKENS, [7] * _TOKENS, spread):
        for layer, (x, probs, calls), (w_q, w_k), raw in zip(spec.layers, _run(model, modules, positions), maps, raws):
            error, worst, sink_error = _mismatch(x, probs, calls, w_q, w_k, spec, norms, names, rotation, positions,
                                                 raw.get("sinks"), layout.packing is GATED_Q)
            if sink_error > TOLERANCE:
                return (f"its tiny instance's probability left to the sinks (layer {layer}) differs from "
                        f"exp(sink_logit) / Z by {sink_error:.2g} of its largest value (proof on random weights)")
            if error > TOLERANCE + (max(positions) * FLOAT32_ANGLE if rotation is not None else 0.0):
                where = f"distance {worst}" if worst else f"distance 0 (position {positions[0]})"
                why = ""
                if norms and positions[0] and _norms_moved(calls, norms, names):
                    why = ("; its q/k norm acts after RoPE, and gains that differ within a rotation pair make the "
                           "score depend on the positions i + j, not on i - j alone")
                return (f"its tiny instance's attention logits (layer {layer}) at {where} differ from score_scale * "
                        f"x_j^T L x_i by {error:.2g} of their largest value (proof on random weights){why}")
    return None


def _norms_moved(calls, norms: dict, names) -> bool:
    """Whether the q norm, at a nonzero position, is fed other values than q_proj's: it comes after RoPE."""
    given = {name: inp for name, _, inp, _ in calls}
    q, fed = given.get(names[0]) is not None and [out for name, _, _, out in calls if name == names[0]][0], \
        given.get(norms["q_norm"])
    return q is not False and fed is not None and not np.array_equal(np.sort(q.reshape(-1).numpy()),
                                                                      np.sort(fed.reshape(-1).numpy()))


def _predicted(x, calls, w_q, w_k, spec: ModelSpec, norms, names, rotation, positions, gated: bool) -> np.ndarray:
    """The form's logits (H, T, T) of the tiny instance's attention input x: score_scale * q_i . k_j (rotated to
    their positions), over the QK-norms' RMS of q_i and k_j, soft-capped where the family caps."""
    outputs = {name: out[0].numpy() for name, _, _, out in calls if name in names}
    if gated:  # q: each head's query rows of the q projection (GATED_Q)
        outputs[names[0]] = outputs[names[0]].reshape(len(x), spec.n_heads, 2, spec.head_dim)[:, :, 0].reshape(len(x), -1)
    q = np.einsum("hnd,td->htn", w_q, x)
    k = np.einsum("hnd,td->htn", w_k, x)[spec.kv_index]
    if rotation is not None:
        p = np.asarray(positions, dtype=np.float64)
        q = np.stack([rotation.rotate(q[:, t, :, None], p[t:t + 1])[0, ..., 0] for t in range(len(p))], axis=1)
        k = np.stack([rotation.rotate(k[:, t, :, None], p[t:t + 1])[0, ..., 0] for t in range(len(p))], axis=1)
    predicted = spec.score_scale * np.einsum("hin,hjn->hij", q, k)
    if norms:
        r_q = _rms(outputs[names[0]], spec.n_heads, norms, spec.head_dim)
        r_k = _rms(outputs[names[1]], spec.n_kv_heads, norms, spec.head_dim)[spec.kv_index]
        predicted = predicted / (r_q[:, :, None] * r_k[:, None, :])
    if spec.softcap:
        predicted = spec.softcap * np.tanh(predicted / spec.softcap)
    return predicted


def _diffs(probs: np.ndarray, predicted: np.ndarray):
    """The causal pairs, the model's log-probabilities, and the model's and the form's logit differences to key 0."""
    allowed = np.tril(np.ones(probs.shape[-2:], bool))
    if (probs[..., allowed] <= 0).any():
        raise ExtractError("its tiny instance masks pairs a causal mask allows (a sliding window or chunking "
                           "shorter than 8 tokens)")
    logp = np.log(np.where(allowed, probs, 1.0))
    return allowed, logp, np.where(allowed, logp - logp[..., :1], 0.0), np.where(allowed, predicted - predicted[..., :1], 0.0)


def _mismatch(x, probs, calls, w_q, w_k, spec: ModelSpec, norms, names, rotation, positions,
              sinks, gated: bool) -> tuple[float, int, float]:
    """Largest |model - form| of the logit differences to key 0 over the causal pairs, relative to the largest form
    difference, and the distance p_i - p_j where it is; with sink logits, the largest |model - exp(sink) / Z| of the
    probability the keys leave over (Z from the form's logit of key 0), relative to its largest value (else 0)."""
    predicted = _predicted(x, calls, w_q, w_k, spec, norms, names, rotation, positions, gated)
    allowed, logp, model_diff, form_diff = _diffs(probs, predicted)
    gap = np.abs(model_diff - form_diff)
    _, i, j = np.unravel_index(gap.argmax(), gap.shape)
    sink_error = 0.0
    if sinks is not None:
        left = 1.0 - np.where(allowed, probs, 0.0).sum(-1)  # (H, T)
        log_z = predicted[..., 0] - logp[..., 0]            # log of each row's denominator, sink included
        sink_error = float(np.abs(np.exp(sinks[:, None] - log_z) - left).max() / max(np.abs(left).max(), 1e-300))
    return float(gap.max() / max(np.abs(form_diff).max(), 1e-300)), int(positions[i] - positions[j]), sink_error


def _rms(out: np.ndarray, heads: int, norms: dict, n: int) -> np.ndarray:
    """(heads, T) RMS (without gain) a QK-norm divides q or k by: per head, over the projection, or centred."""
    t = out.shape[0]
    groups = out[:, None, :] if norms["kind"] == "projection" else out.reshape(t, heads, n)
    if norms["kind"] == "centred":
        groups = groups - groups.mean(-1, keepdims=True)
    return np.broadcast_to(np.sqrt((groups**2).mean(-1) + norms["eps"]), (t, heads)).T
