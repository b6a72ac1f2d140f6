"""Tiny random transformers models of every supported layout, their checkpoint folders, and their own
attention logits, for tests that check extracted W_Q, W_K against what the model computes.

Weights are re-drawn (normal std 1/sqrt(N), norm gains in [0.5, 1.5], biases zero) so attention logits
are O(1) and the score is exactly scale * x_j^T W_K^T W_Q x_i at relative distance 0.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
import numpy as np
import torch

VOCAB = 64


@dataclass(frozen=True)
class Tiny:
    """How to build one tiny model: transformers class and config names, config kwargs, and forward quirks."""

    model_class: str
    config_class: str
    kwargs: dict
    causal: bool = True   # decoder mask (j <= i); BERT attends everywhere
    rope: bool = False    # feed position_ids = 0 so RoPE is the identity
    inputs: str = "tokens"  # "tokens", "pixels" (image models) or "features" (whisper's log-mel frames)
    run: str | None = None  # the submodule to run (one tower of a multi-tower model), else the whole model
    tower: str | None = None  # the tower to open (clip, siglip, whisper), None for the default one
    discovered: bool = False  # its model_type is not in LAYOUTS: the layout comes from extract.layouts.discover


def _decoder(**kw) -> dict:
    """Common llama-family shape: 2 layers, width 32."""
    return dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, vocab_size=VOCAB,
                max_position_embeddings=64) | kw


TINY: dict[str, Tiny] = {
    "gpt2": Tiny("GPT2Model", "GPT2Config",  # hub gpt2: no key prefix
                 dict(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=32)),
    "distilgpt2": Tiny("GPT2LMHeadModel", "GPT2Config",  # distilgpt2: LM head, keys under "transformer."
                       dict(n_layer=2, n_head=6, n_embd=48, vocab_size=VOCAB, n_positions=32)),
    "opt": Tiny("OPTForCausalLM", "OPTConfig",
                dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, ffn_dim=64, vocab_size=VOCAB,
                     max_position_embeddings=32, word_embed_proj_dim=32)),
    "opt_base": Tiny("OPTModel", "OPTConfig",  # keys under "decoder."
                     dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, ffn_dim=64, vocab_size=VOCAB,
                          max_position_embeddings=32, word_embed_proj_dim=32, do_layer_norm_before=False)),
    "bloom": Tiny("BloomForCausalLM", "BloomConfig", dict(n_layer=2, n_head=4, hidden_size=32, vocab_size=VOCAB)),
    "gpt_neox": Tiny("GPTNeoXForCausalLM", "GPTNeoXConfig",
                     _decoder(num_attention_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                      "partial_rotary_factor": 0.25}), rope=True),
    "llama": Tiny("LlamaForCausalLM", "LlamaConfig", _decoder(num_attention_heads=4, num_key_value_heads=4), rope=True),
    "llama_gqa": Tiny("LlamaForCausalLM", "LlamaConfig",
                      _decoder(num_attention_heads=4, num_key_value_heads=2), rope=True),
    "mistral": Tiny("MistralForCausalLM", "MistralConfig",  # explicit head_dim: 4 x 16 != 32
                    _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=16), rope=True),
    "qwen2": Tiny("Qwen2ForCausalLM", "Qwen2Config", _decoder(num_attention_heads=4, num_key_value_heads=2), rope=True),
    "gemma": Tiny("GemmaForCausalLM", "GemmaConfig",  # multi-query, as gemma-2b
                  _decoder(num_attention_heads=4, num_key_value_heads=1, head_dim=8), rope=True),
    "gemma2": Tiny("Gemma2ForCausalLM", "Gemma2Config",
                   _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                            attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window=16), rope=True),
    "gemma2_softcap": Tiny("Gemma2ForCausalLM", "Gemma2Config",  # a cap near the logits' size: tanh bends them
                           _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                                    attn_logit_softcapping=2.0, final_logit_softcapping=None, sliding_window=16),
                           rope=True),
    # rope scaling: yarn's attention factor a on cos and sin (q.k times a^2: score_scale, or the rotated rows alone
    # with partial rotary), its frequencies beyond original_max_position_embeddings; longrope's a at distance 0
    "qwen2_yarn": Tiny("Qwen2ForCausalLM", "Qwen2Config", _decoder(
        num_attention_heads=4, num_key_value_heads=2, rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4, "original_max_position_embeddings": 16}), rope=True),
    "gpt_neox_yarn": Tiny("GPTNeoXForCausalLM", "GPTNeoXConfig", _decoder(
        num_attention_heads=4, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                "partial_rotary_factor": 0.5, "original_max_position_embeddings": 16}),
        rope=True),
    "phi3_longrope": Tiny("Phi3ForCausalLM", "Phi3Config", _decoder(
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, original_max_position_embeddings=16,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0, 1.5, 2.0, 3.0],
                         "long_factor": [1.0, 2.0, 4.0, 8.0], "original_max_position_embeddings": 16}), rope=True),
    "bert": Tiny("BertForMaskedLM", "BertConfig",  # keys under "bert."
                 dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64,
                      vocab_size=VOCAB, max_position_embeddings=32), causal=False),
    "minilm": Tiny("BertModel", "BertConfig",  # sentence-transformers' all-MiniLM: BertModel, no prefix
                   dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64,
                        vocab_size=VOCAB, max_position_embeddings=32), causal=False),
    "qwen3": Tiny("Qwen3ForCausalLM", "Qwen3Config",
                  _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=16), rope=True),
    "olmo2": Tiny("Olmo2ForCausalLM", "Olmo2Config", _decoder(num_attention_heads=4, num_key_value_heads=2), rope=True),
    "gemma3_text": Tiny("Gemma3ForCausalLM", "Gemma3TextConfig",
                        _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                                 sliding_window=16), rope=True),
    "gemma3": Tiny("Gemma3ForConditionalGeneration", "Gemma3Config",  # multimodal: text under language_model
                   dict(text_config=_decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                             query_pre_attn_scalar=24, sliding_window=16, vocab_size=VOCAB + 3),
                        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=28, patch_size=14),
                        mm_tokens_per_image=4, boi_token_index=VOCAB, eoi_token_index=VOCAB + 1,
                        image_token_index=VOCAB + 2), rope=True),
}


def _encoder(**kw) -> dict:
    """Common BERT-family shape: 2 layers, width 32, 4 heads."""
    return dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64, vocab_size=VOCAB,
                max_position_embeddings=40) | kw


def _image(**kw) -> dict:
    """Common ViT-family shape: 16x16 images of 8x8 patches (4 patches + CLS), width 32, 4 heads."""
    return dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, image_size=16, patch_size=8) | kw


_CLIP = dict(text_config=dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                              vocab_size=VOCAB, max_position_embeddings=16),
             vision_config=dict(num_hidden_layers=2, hidden_size=48, intermediate_size=64, num_attention_heads=6,
                                image_size=16, patch_size=8))
_WHISPER = dict(encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4, decoder_attention_heads=2,
                encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, num_mel_bins=8, max_source_positions=8,
                max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
_MOE = dict(moe_intermediate_size=16, num_experts=2, num_experts_per_tok=1)

TINY |= {
    "phi": Tiny("PhiForCausalLM", "PhiConfig", _decoder(num_attention_heads=4, num_key_value_heads=4), rope=True),
    "phi3": Tiny("Phi3ForCausalLM", "Phi3Config",  # fused qkv_proj with grouped K/V
                 _decoder(num_attention_heads=4, num_key_value_heads=2, pad_token_id=0), rope=True),
    "falcon": Tiny("FalconForCausalLM", "FalconConfig",  # multi-query (falcon-7b)
                   dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=VOCAB), rope=True),
    "falcon_mha": Tiny("FalconForCausalLM", "FalconConfig",
                       dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=VOCAB,
                            multi_query=False), rope=True),
    "falcon_gqa": Tiny("FalconForCausalLM", "FalconConfig",  # new decoder architecture (falcon-40b/180b);
                       # 3 queries a group: a group's q rows, k row and v row are told apart by position
                       dict(num_hidden_layers=2, hidden_size=48, num_attention_heads=6, vocab_size=VOCAB,
                            new_decoder_architecture=True, num_kv_heads=2), rope=True),
    "gpt_neo": Tiny("GPTNeoForCausalLM", "GPTNeoConfig",  # one global and one local attention layer
                    dict(num_layers=2, hidden_size=32, num_heads=4, vocab_size=VOCAB, max_position_embeddings=32,
                         attention_types=[[["global", "local"], 1]])),
    "gptj": Tiny("GPTJForCausalLM", "GPTJConfig", dict(n_layer=2, n_embd=32, n_head=4, rotary_dim=4, vocab_size=VOCAB),
                 rope=True),
    "gpt_bigcode": Tiny("GPTBigCodeForCausalLM", "GPTBigCodeConfig",  # multi-query (starcoder)
                        dict(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32)),
    "gpt_bigcode_mha": Tiny("GPTBigCodeForCausalLM", "GPTBigCodeConfig",
                            dict(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32, multi_query=False)),
    "starcoder2": Tiny("Starcoder2ForCausalLM", "Starcoder2Config",
                       _decoder(num_attention_heads=4, num_key_value_heads=2), rope=True),
    "stablelm": Tiny("StableLmForCausalLM", "StableLmConfig",  # partial rotary (0.25)
                     _decoder(num_attention_heads=4, num_key_value_heads=2), rope=True),
    "stablelm_qk_norm": Tiny("StableLmForCausalLM", "StableLmConfig",  # a LayerNorm module per head on q, k
                             _decoder(num_attention_heads=4, num_key_value_heads=2, qk_layernorm=True), rope=True),
    "olmo": Tiny("OlmoForCausalLM", "OlmoConfig", _decoder(num_attention_heads=4, num_key_value_heads=2), rope=True),
    "cohere": Tiny("CohereForCausalLM", "CohereConfig", _decoder(num_attention_heads=4, num_key_value_heads=2),
                   rope=True),
    "cohere_qk_norm": Tiny("CohereForCausalLM", "CohereConfig",  # LayerNorm on q, k: folded with its centring
                           _decoder(num_attention_heads=4, num_key_value_heads=2, use_qk_norm=True), rope=True),
    "granite": Tiny("GraniteForCausalLM", "GraniteConfig",
                    _decoder(num_attention_heads=4, num_key_value_heads=2, attention_multiplier=0.2), rope=True),
    "smollm3": Tiny("SmolLM3ForCausalLM", "SmolLM3Config",  # layer 0 a NoPE layer, layer 1 rotated
                    _decoder(num_attention_heads=4, num_key_value_heads=2, no_rope_layers=[0, 1], pad_token_id=0,
                             bos_token_id=1, eos_token_id=2), rope=True),
    "mixtral": Tiny("MixtralForCausalLM", "MixtralConfig",
                    _decoder(num_attention_heads=4, num_key_value_heads=2, num_local_experts=2), rope=True),
    "qwen2_moe": Tiny("Qwen2MoeForCausalLM", "Qwen2MoeConfig",
                      _decoder(num_attention_heads=4, num_key_value_heads=2, shared_expert_intermediate_size=16,
                               **_MOE), rope=True),
    "qwen3_moe": Tiny("Qwen3MoeForCausalLM", "Qwen3MoeConfig",
                      _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **_MOE), rope=True),
    "mpt": Tiny("MptForCausalLM", "MptConfig",
                dict(n_layers=2, d_model=32, n_heads=4, vocab_size=VOCAB, max_seq_len=32,
                     attn_config=dict(softmax_scale=0.25))),
    "roberta": Tiny("RobertaForMaskedLM", "RobertaConfig", _encoder(pad_token_id=1), causal=False),
    "xlm-roberta": Tiny("XLMRobertaForMaskedLM", "XLMRobertaConfig", _encoder(pad_token_id=1), causal=False),
    "camembert": Tiny("CamembertForMaskedLM", "CamembertConfig", _encoder(pad_token_id=1), causal=False),
    "electra": Tiny("ElectraForPreTraining", "ElectraConfig", _encoder(embedding_size=32), causal=False),
    "distilbert": Tiny("DistilBertForMaskedLM", "DistilBertConfig",
                       dict(n_layers=2, n_heads=4, dim=32, hidden_dim=64, vocab_size=VOCAB,
                            max_position_embeddings=32), causal=False),
    "vit": Tiny("ViTForImageClassification", "ViTConfig", _image(intermediate_size=64), causal=False,
                inputs="pixels"),
    "deit": Tiny("DeiTModel", "DeiTConfig", _image(intermediate_size=64), causal=False, inputs="pixels"),
    "dinov2": Tiny("Dinov2Model", "Dinov2Config", _image(mlp_ratio=2), causal=False, inputs="pixels"),
    "clip_text": Tiny("CLIPModel", "CLIPConfig", _CLIP, run="text_model", tower="text"),
    "clip_vision": Tiny("CLIPModel", "CLIPConfig", _CLIP, causal=False, inputs="pixels", run="vision_model",
                        tower="vision"),
    "clip_text_model": Tiny("CLIPTextModel", "CLIPTextConfig", _CLIP["text_config"]),
    "clip_vision_model": Tiny("CLIPVisionModel", "CLIPVisionConfig", _CLIP["vision_config"], causal=False,
                              inputs="pixels"),
    "siglip_text": Tiny("SiglipModel", "SiglipConfig", _CLIP, causal=False, run="text_model"),
    "siglip_vision": Tiny("SiglipModel", "SiglipConfig", _CLIP, causal=False, inputs="pixels", run="vision_model",
                          tower="vision"),
    "siglip_text_model": Tiny("SiglipTextModel", "SiglipTextConfig", _CLIP["text_config"], causal=False),
    "siglip_vision_model": Tiny("SiglipVisionModel", "SiglipVisionConfig", _CLIP["vision_config"], causal=False,
                                inputs="pixels"),
    "whisper_encoder": Tiny("WhisperForConditionalGeneration", "WhisperConfig", _WHISPER, causal=False,
                            inputs="features", run="model.encoder"),
    "whisper_decoder": Tiny("WhisperForConditionalGeneration", "WhisperConfig", _WHISPER, run="model.decoder",
                            tower="decoder"),
    # not in LAYOUTS: found on the meta device by extract.layouts.discover
    "arcee": Tiny("ArceeForCausalLM", "ArceeConfig", _decoder(num_attention_heads=4, num_key_value_heads=2),
                  rope=True, discovered=True),
    "helium": Tiny("HeliumForCausalLM", "HeliumConfig",
                   _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=8), rope=True, discovered=True),
    # QK-norms found by what the attention module does (extract.layouts.discover), folded under --qk-norm fold
    "olmo3": Tiny("Olmo3ForCausalLM", "Olmo3Config",  # RMSNorm over the whole q/k projection
                  _decoder(num_attention_heads=4, num_key_value_heads=2, pad_token_id=0), rope=True, discovered=True),
    "apertus": Tiny("ApertusForCausalLM", "ApertusConfig",  # RMSNorm per head, llama3 rope scaling
                    _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0), rope=True,
                    discovered=True),
    "gpt_oss": Tiny("GptOssForCausalLM", "GptOssConfig",  # yarn (factor 32), attention sinks, mxfp4 experts in real files
                    _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                             num_experts_per_tok=1, sliding_window=16, pad_token_id=0), rope=True, discovered=True),
    "exaone4": Tiny("Exaone4ForCausalLM", "Exaone4Config",  # RMSNorm per head
                    _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0), rope=True,
                    discovered=True),
    # the recent families the table does not name, read by discovery as they are
    "glm4_moe": Tiny("Glm4MoeForCausalLM", "Glm4MoeConfig",  # partial rotary (0.5), a dense first layer, then experts
                     _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=8, n_routed_experts=2,
                              num_experts_per_tok=1, moe_intermediate_size=16, first_k_dense_replace=1, n_group=1,
                              topk_group=1, pad_token_id=0), rope=True, discovered=True),
    "seed_oss": Tiny("SeedOssForCausalLM", "SeedOssConfig",
                     _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0), rope=True,
                     discovered=True),
    "ernie4_5": Tiny("Ernie4_5ForCausalLM", "Ernie4_5Config",  # RoPE on adjacent pairs
                     _decoder(num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0), rope=True,
                     discovered=True),
}


def build(name: str, *, dtype: torch.dtype = torch.float64, seed: int = 0, **overrides):
    """A TINY model with re-drawn weights, eager attention, in eval mode and the given dtype."""
    tiny = TINY[name]
    return build_model(tiny.model_class, tiny.config_class, tiny.kwargs | overrides, dtype=dtype, seed=seed)


def build_model(model_class: str, config_class: str, kwargs: dict, *, dtype: torch.dtype = torch.float64,
                seed: int = 0):
    """transformers' model_class of a config_class(**kwargs), eager, in eval mode and the given dtype, weights
    re-drawn: N(0, 1/N) matrices, U(0.5, 1.5) vectors (gains), zero biases."""
    import transformers

    config = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)._from_config(
        config, attn_implementation="eager", experts_implementation="eager").to(dtype).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias"):
                param.zero_()
            elif param.ndim == 1:
                param.uniform_(0.5, 1.5, generator=generator)
            else:
                param.normal_(0.0, config.get_text_config().hidden_size**-0.5, generator=generator)
    return model


def save(model, folder: Path, fmt: str = "safetensors") -> Path:
    """Write model to folder as "safetensors", "sharded" (safetensors + index), "bin" or "sharded_bin"."""
    folder = Path(folder)
    if fmt == "safetensors":
        model.save_pretrained(folder)
    elif fmt == "sharded":
        model.save_pretrained(folder, max_shard_size="20KB")
    elif fmt in ("bin", "sharded_bin"):
        model.config.save_pretrained(folder)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        if fmt == "bin":
            torch.save(state, folder / "pytorch_model.bin")
        else:
            names = sorted(state)
            shards = {f"pytorch_model-0000{s + 1}-of-00002.bin": names[s::2] for s in range(2)}
            for shard, keys in shards.items():
                torch.save({k: state[k] for k in keys}, folder / shard)
            weight_map = {k: shard for shard, keys in shards.items() for k in keys}
            (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        raise ValueError(f"unknown format {fmt!r}")
    return folder


def _attention_modules(model) -> list:
    """Each layer's self-attention module: the one owning the query projection, in layer order."""
    owners = ("q_proj", "query", "c_attn", "query_key_value", "qkv_proj", "Wqkv", "q_lin")
    return [m for m in model.modules() if any(hasattr(m, o) and isinstance(getattr(m, o), torch.nn.Module)
                                              for o in owners)]


@dataclass
class Trace:
    """One forward pass: per layer, the attention inputs x (B, T, N), the attention probabilities
    (B, H, T, T), and the q_proj/k_proj outputs (B, T, H*n) where the model has those modules."""

    inputs: list[np.ndarray]
    probs: list[np.ndarray]
    q: list[np.ndarray]
    k: list[np.ndarray]
    allowed: np.ndarray  # (T, T) pairs (query i, key j) the mask lets through


def _model_inputs(tiny: Tiny, model, batch: int, length: int, seed: int) -> dict:
    """Random tokens (with an all-ones mask, position_ids 0 under RoPE), images or log-mel frames."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    if tiny.inputs == "pixels":
        vision = getattr(config, "vision_config", config)
        size = (batch, vision.num_channels, vision.image_size, vision.image_size)
        return {"pixel_values": torch.randn(size, generator=generator, dtype=model.dtype)}
    if tiny.inputs == "features":
        size = (batch, config.num_mel_bins, 2 * config.max_source_positions)
        return {"input_features": torch.randn(size, generator=generator, dtype=model.dtype)}
    tokens = torch.randint(3, VOCAB, (batch, length), generator=generator)
    extra = {"position_ids": torch.zeros_like(tokens)} if tiny.rope else {}
    return {"input_ids": tokens, "attention_mask": torch.ones_like(tokens)} | extra


@contextmanager
def captured(model):
    """(inputs, q, k): lists that each attention module's input and q/k projection outputs are appended to
    while the block runs (hooks removed after)."""
    inputs, q, k, hooks = [], [], [], []
    for module in _attention_modules(model):
        hooks.append(module.register_forward_pre_hook(
            lambda m, args, kwargs: inputs.append(kwargs.get("hidden_states", args[0] if args else None)),
            with_kwargs=True))
        if hasattr(module, "q_proj") and hasattr(module, "k_proj"):
            hooks.append(module.q_proj.register_forward_hook(lambda m, a, out: q.append(out)))
            hooks.append(module.k_proj.register_forward_hook(lambda m, a, out: k.append(out)))
    try:
        yield inputs, q, k
    finally:
        for hook in hooks:
            hook.remove()


def trace(name: str, model, *, batch: int = 2, length: int = 7, seed: int = 1) -> Trace:
    """Run model (or its tower) on random inputs, RoPE at distance 0 (position_ids = 0), ALiBi zeroed (Bloom, MPT)."""
    tiny = TINY[name]
    kwargs = _model_inputs(tiny, model, batch, length, seed)
    model = model.get_submodule(tiny.run) if tiny.run else model
    base = getattr(model, "transformer", model)
    if hasattr(base, "build_alibi_tensor"):
        base.build_alibi_tensor = lambda mask, heads, dtype: torch.zeros(mask.shape[0] * heads, 1, mask.shape[-1],
                                                                        dtype=dtype)
    if hasattr(base, "build_mpt_alibi_tensor"):
        base.build_mpt_alibi_tensor = lambda heads, length, *a, **kw: torch.zeros(heads, 1, length)
    try:
        with captured(model) as (inputs, q, k), torch.no_grad():
            out = model(output_attentions=True, **kwargs)
    finally:
        vars(base).pop("build_alibi_tensor", None)
        vars(base).pop("build_mpt_alibi_tensor", None)
    length = out.attentions[0].shape[-1]
    allowed = np.tril(np.ones((length, length), bool)) if tiny.causal else np.ones((length, length), bool)
    return Trace(inputs=_numpy(inputs), probs=_numpy(out.attentions), q=_numpy(q), k=_numpy(k), allowed=allowed)


def _numpy(tensors) -> list[np.ndarray]:
    return [t.detach().double().numpy() for t in tensors]
