"""Running a checkpoint with transformers on repeated random tokens (statistics.md section 8): per layer, the
heads' attention scores, their own pre-softmax self-logits, the attention's input x and the q/k biases.

The logits are captured by an attention function registered in transformers' attention-function registry
(ALL_ATTENTION_FUNCTIONS): every family that dispatches through it (llama, qwen2, mistral and other GQA
models with RoPE, gpt2, bert, clip's text tower) hands that function its own q and k, after RoPE and the
biases, and its own scale, so q_i . k_i is the model's diagonal logit whatever the family's layout; the
function then calls the family's own eager attention, so the weights are the model's. A forward pre-hook on
the attention module keeps its input x (after the norm that feeds attention, as the model applies it); on a QK-norm
model (qwen3, gemma3, olmo2), pre-hooks on its q and k norms keep each token's RMS factor 1 / sqrt(mean(u^2) + eps)
of the projection u they normalise, the factor a folded form's self-logit is multiplied by; on multi-head latent
attention (deepseek_v2, deepseek_v3) the same pre-hooks on the norms of its q and kv latents keep 1/rms_q and 1/rms_kv
(extract.layouts.latent), the factors of its parts' forms.
"""
from __future__ import annotations

import contextlib
import functools
import io
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headforms.compute.behaviour import attention_scores, repeated_sequences, self_logits
from headforms.extract.checkpoint import ExtractError, first_line

CAPTURE = "headforms_capture"  # the attention function's name in transformers' registry
# an attention module's norms of q and k; multi-head latent attention's of its q latent (absent without q_lora_rank)
# and of its kv latent, the compressed part of kv_a_proj_with_mqa's output (not its rope slice)
# one module normalising q, then k (Llama 4's unit-gain qk_norm, on its RoPE layers only)
QK_NORMS = (("q_norm", "k_norm"), ("query_layernorm", "key_layernorm"), ("q_a_layernorm", "kv_a_layernorm"),
            ("qk_norm", "qk_norm"))
INSTALL = "pip install 'headforms[behaviour]'"


@dataclass
class LayerRun:
    """One layer of a run: scores (H,), the model's self-logits (B, H, P), inputs x (B, P, N), biases or None, and
    a QK-norm model's per-token RMS factors of q (B, P, H or 1) and k (B, P, H_kv or 1), or a latent-attention
    model's 1/rms_q (B, P, 1; None without q_lora_rank) and 1/rms_kv (B, P, 1), else None."""

    self_score: np.ndarray
    previous_score: np.ndarray
    induction_score: np.ndarray
    logits: np.ndarray
    inputs: np.ndarray
    b_q: np.ndarray | None
    b_k: np.ndarray | None
    q_factor: np.ndarray | None = None
    k_factor: np.ndarray | None = None


@dataclass
class Run:
    """A model's forward pass on B repeated sequences of length 2T: per layer, what LayerRun holds."""

    layers: list[LayerRun]
    seconds: float


class _Recorder:
    """What the capture function sees during one forward pass, in layer order."""

    def __init__(self, on_layer=None):
        self.on_layer = on_layer
        self.inputs: dict[int, object] = {}
        self.norm_inputs: dict[tuple[int, str], object] = {}  # (attention module, 'q' or 'k') -> what its norm read
        self.layers: list[LayerRun] = []

    def record(self, module, query, key, weights, scaling, softcap=None) -> None:
        x = self.inputs.get(id(module))
        if x is None:
            raise ExtractError(f"{type(module).__name__}: its input was not seen (not a self-attention module)")
        scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
        own, previous, induction = attention_scores(weights.detach().double().cpu().numpy())
        b_q, b_k = _qk_biases(module, query.shape[1], key.shape[1], query.shape[-1])
        logits = self_logits(query.detach().double().cpu().numpy(), key.detach().double().cpu().numpy(), scale)
        if softcap:  # the family's eager attention caps the scaled score: cap * tanh(s / cap)
            logits = softcap * np.tanh(logits / softcap)
        q_factor, k_factor = (_rms_factor(self.norm_inputs.get((id(module), side)), _qk_norm(module, side), x.shape[1])
                              for side in ("q", "k"))
        self.layers.append(LayerRun(own, previous, induction, logits, x.detach().double().cpu().numpy(), b_q, b_k,
                                    q_factor, k_factor))
        if self.on_layer is not None:
            self.on_layer(len(self.layers) - 1)


def _qk_norm(module, side: str):
    """The attention module's norm of q (side 'q') or k, or None where it has none."""
    for names in QK_NORMS:
        norm = getattr(module, names[side == "k"], None)
        if norm is not None:
            return norm
    return None


def _rms_factor(u, norm, positions: int) -> np.ndarray | None:
    """(B, P, G): each token's 1 / sqrt(mean(u^2) + eps) over the norm's last axis, G its groups (heads, or 1 for a
    norm of the whole projection), from what the norm read: u (B, P, G, n) (qwen3), (B, G, P, n) (gemma3, normed
    after the heads' transpose) or (B, P, G n) (olmo2, and a latent: G = 1); None without a norm."""
    if norm is None:
        return None
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if u is None or eps is None or u.ndim not in (3, 4) or positions not in u.shape[1:u.ndim - 1]:
        raise ExtractError(f"{type(norm).__name__}: its input is not (batch, positions, ...) with an eps; behaviour "
                           "cannot take the per-token factors of this QK-norm")
    u = u.detach().double().cpu().numpy()
    u = u[:, :, None] if u.ndim == 3 else u if u.shape[1] == positions else u.transpose(0, 2, 1, 3)
    return 1.0 / np.sqrt(np.mean(u * u, axis=-1) + float(eps))


def _alternating(norm_inputs: dict, module: int):
    """A pre-hook for a norm an attention module calls on q, then on k: what it reads, by turns under 'q' and 'k'."""
    calls = [0]

    def hook(norm, args) -> None:
        norm_inputs[(module, "qk"[calls[0] % 2])] = args[0]
        calls[0] += 1

    return hook


_RECORDER: _Recorder | None = None
_GGUF_LOAD = threading.Lock()  # one GGUF load at a time per process: gguf's functions are swapped during it


def _capture(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """The family's own eager attention, recording q, k and the weights on the way (see the module docstring)."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise ExtractError(f"{type(module).__name__} has no eager attention in transformers to run")
    output, weights = eager(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    if _RECORDER is not None:
        _RECORDER.record(module, query, key, weights, scaling, kwargs.get("softcap"))
    return output, weights


def _qk_biases(module, heads: int, kv_heads: int, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The query and key biases of an attention module, (H, n) and (H_kv, n), or None where it has none."""
    def array(bias, rows):
        return None if bias is None else bias.detach().double().cpu().numpy().reshape(rows, n)

    for q_name, k_name in (("q_proj", "k_proj"), ("query", "key")):
        if hasattr(module, q_name) and hasattr(module, k_name):
            return array(getattr(module, q_name).bias, heads), array(getattr(module, k_name).bias, kv_heads)
    if hasattr(module, "c_attn"):  # GPT-2's Conv1D [Q | K | V]
        bias = module.c_attn.bias
        return array(bias[:heads * n], heads), array(bias[heads * n:(heads + kv_heads) * n], kv_heads)
    return None, None


def _transformers():
    """transformers with the capture function and its (eager) mask registered, else an ExtractError: what to install."""
    try:
        import transformers
        from transformers.masking_utils import AttentionMaskInterface, eager_mask
    except ImportError:
        raise ExtractError(f"behaviour runs models with transformers, which is not installed: {INSTALL}") from None
    transformers.logging.set_verbosity_error()  # its load reports (keys of heads not loaded) are not the user's concern
    transformers.logging.disable_progress_bar()
    transformers.AttentionInterface.register(CAPTURE, _capture)
    AttentionMaskInterface.register(CAPTURE, eager_mask)
    return transformers


def where(source: str, revision: str | None) -> tuple[str, dict]:
    """transformers' from_pretrained arguments for a source as extract resolves it (folder, .gguf, pkg:, hub id)."""
    from headforms.extract.sources import HF_SCHEME, _package_model

    path = _package_model(source[len("pkg:"):]) if source.startswith("pkg:") else Path(source).expanduser()
    if path.exists():
        return (str(path.parent), {"gguf_file": path.name}) if path.suffix == ".gguf" else (str(path), {})
    hub = source.removeprefix(HF_SCHEME)
    if hub.endswith(".gguf"):
        repo, filename = hub.rsplit("/", 1)
        return repo, {"gguf_file": filename, "revision": revision}
    return hub, {"revision": revision}


def forward_bytes(params: int, spec, length: int, sequences: int) -> int:
    """Estimated peak bytes of a float32 forward pass: the weights, one layer's attention logits and weights
    (B H P^2, a few copies), the residual stream and MLP activations, and the inputs kept for every layer."""
    p = 2 * length
    attention = 4 * sequences * spec.n_heads * p * p * 4
    activations = 4 * sequences * p * spec.d_model * 16
    kept = 8 * sequences * p * (spec.d_model + 2 * spec.n_heads) * len(spec.layers)
    return 4 * params + attention + activations + kept


def available_bytes(device: str) -> int | None:
    """Free memory of the device (cuda: torch's free bytes; cpu: MemAvailable), or None where unknown."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def load(source: str, revision: str | None, spec, *, tower: str | None, length: int, sequences: int,
         device: str = "cpu", on_estimate=None):
    """The model (float32, eval, capture attention) and the token ids to draw from, after checking the
    estimated memory of the forward pass against what the device has free (told to on_estimate(bytes, parameters)
    once the model is ready to run)."""
    transformers = _transformers()
    name, kwargs = where(source, revision)
    label = source if revision is None else f"{source}@{revision}"
    with _gguf_parsed_once() if "gguf_file" in kwargs else contextlib.nullcontext():
        model, need, params = _load_model(transformers, name, kwargs, label, spec, length=length,
                                          sequences=sequences, device=device)
    model = _tower(model.eval().to(device), tower, label)
    if on_estimate is not None:
        on_estimate(need, params)
    return model, _allowed_ids(transformers, name, kwargs, model.config)


def _load_model(transformers, name: str, kwargs: dict, label: str, spec, *, length: int, sequences: int, device: str):
    """`load`'s model from transformers, the forward pass's estimated bytes and the parameters; refused in one line
    where transformers cannot run it, its positions are too few or the device's free memory too little."""
    import torch

    try:
        config = transformers.AutoConfig.from_pretrained(name, **kwargs)
        with torch.device("meta"):
            params = sum(p.numel() for p in transformers.AutoModel.from_config(config).parameters())
    except Exception as error:  # an architecture or file transformers cannot read: one line, its reason
        raise ExtractError(f"{label}: transformers cannot run it ({first_line(error)}); behaviour needs a model "
                           "transformers can load") from None
    text = config.get_text_config()
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if spec.positional in ("learned", "absolute") and positions and 2 * length > positions:
        raise ExtractError(f"{label}: length={length} makes sequences of {2 * length} tokens and the model has "
                           f"{positions} learned positions: use length={positions // 2} or less")
    need, free = forward_bytes(params, spec, length, sequences), available_bytes(device)
    if free is not None and need > free:
        raise ExtractError(f"{label}: the forward pass needs about {need / 2**30:.1f} GiB ({params / 1e6:.0f}M "
                           f"parameters in float32, {sequences} x {2 * length} tokens) and {device} has "
                           f"{free / 2**30:.1f} GiB free: use fewer `sequences` or a smaller `length`")
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the GGUF loader's own progress bar (plain tqdm)
            model = transformers.AutoModel.from_pretrained(name, config=config, attn_implementation=CAPTURE,
                                                           dtype=torch.float32, **kwargs)
    except Exception as error:
        raise ExtractError(f"{label}: transformers cannot run it ({first_line(error)})") from None
    return model, need, params


@contextlib.contextmanager
def _gguf_parsed_once():
    """While transformers loads a GGUF model: each file parsed once (by gguf_file.PlainReader, a third of gguf's
    reader's time), and gguf's tensor-name map of an architecture built once. transformers parses the file for the
    config and again for the weights (SmolLM2's vocabulary of 49,152 tokens takes 3.4 s each time) and builds the name
    map again for every submodule (4.4 s of SmolLM2's load); both are read-only, so the same objects serve every call
    (gguf's own functions, which transformers imports when it calls them, are swapped for the load and put back, one
    load at a time)."""
    import gguf

    from headforms.extract.formats.gguf_file import PlainReader

    with _GGUF_LOAD:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        kept = functools.lru_cache(maxsize=None)  # each distinct call made once: a file parsed, a map built
        gguf.GGUFReader, gguf.get_tensor_name_map = kept(PlainReader), kept(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _tower(model, tower: str | None, label: str):
    """The module that reads token ids: the model, or clip/siglip's text tower; image and audio towers are refused."""
    if hasattr(model, "text_model") and tower in (None, "text"):
        return model.text_model
    if tower is not None or getattr(model, "main_input_name", "input_ids") != "input_ids":
        raise ExtractError(f"{label}: behaviour runs sequences of token ids; the {tower or 'default'} tower reads "
                           f"{getattr(model, 'main_input_name', 'other inputs')} (text towers only)")
    return model


def _allowed_ids(transformers, name: str, kwargs: dict, config) -> np.ndarray:
    """Ids of ordinary tokens: the tokenizer's vocabulary less its special tokens, or where there is no tokenizer
    holding ordinary tokens, the config's vocabulary less the ids it names; a GGUF file's own token types (its
    tokenizer takes seconds to build and lists fewer specials)."""
    if "gguf_file" in kwargs:
        return _gguf_normal_ids(name, kwargs)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name, **kwargs)
        allowed = np.setdiff1d(np.arange(min(text.vocab_size, len(tokenizer))), tokenizer.all_special_ids)
    except Exception:  # no tokenizer files
        allowed = np.zeros(0, dtype=np.int64)
    if len(allowed):
        return allowed
    special = [getattr(text, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
                                                    "cls_token_id", "decoder_start_token_id")]
    special = [i for value in special if value is not None for i in np.atleast_1d(value)]
    return np.setdiff1d(np.arange(text.vocab_size), np.asarray(special, dtype=np.int64))


def _gguf_normal_ids(name: str, kwargs: dict) -> np.ndarray:
    """The ids a GGUF file's tokenizer.ggml.token_type marks NORMAL (not control, user-defined, unused or byte)."""
    import gguf

    from headforms.extract.formats.gguf_file import gguf_array

    path = Path(name) / kwargs["gguf_file"]
    if not path.exists():  # a hub file: transformers has just downloaded it into the hub cache
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(name, kwargs["gguf_file"], revision=kwargs.get("revision")))
    types = gguf_array(path, "tokenizer.ggml.token_type")
    if types is None:
        raise ExtractError(f"{path}: no tokenizer.ggml.token_type to tell ordinary tokens from special ones")
    return np.flatnonzero(types == gguf.TokenType.NORMAL)


def run(model, allowed: np.ndarray, *, length: int, sequences: int, seed: int, n_layers: int, label: str,
        on_layer=None) -> Run:
    """One forward pass over `sequences` seeded random sequences of `length` tokens, each repeated once;
    on_layer(i) is called as the pass leaves layer i's attention."""
    global _RECORDER
    import torch

    if len(allowed) == 0:
        raise ExtractError(f"{label}: its vocabulary has no ordinary tokens to draw")
    tokens = repeated_sequences(allowed, length, sequences, seed)
    recorder, hooks = _Recorder(on_layer), []
    for module in model.modules():
        if type(module).__name__.endswith("Attention"):
            hooks.append(module.register_forward_pre_hook(
                lambda m, args, kwargs: recorder.inputs.__setitem__(id(m), kwargs.get("hidden_states",
                                                                                     args[0] if args else None)),
                with_kwargs=True))
            norms = {side: _qk_norm(module, side) for side in ("q", "k")}
            if norms["q"] is not None and norms["q"] is norms["k"]:  # one norm: q, then k
                hooks.append(norms["q"].register_forward_pre_hook(_alternating(recorder.norm_inputs, id(module))))
                continue
            for side, norm in norms.items():
                if norm is not None:
                    hooks.append(norm.register_forward_pre_hook(
                        lambda m, args, key=(id(module), side): recorder.norm_inputs.__setitem__(key, args[0])))
    device = next(model.parameters()).device
    ids = torch.as_tensor(tokens, device=device)
    started, _RECORDER = time.perf_counter(), recorder
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        _RECORDER = None
        for hook in hooks:
            hook.remove()
    if len(recorder.layers) != n_layers:
        raise ExtractError(f"{label}: {len(recorder.layers)} attention calls went through transformers' attention "
                           f"registry for {n_layers} layers; this family computes attention its own way")
    return Run(recorder.layers, time.perf_counter() - started)

