"""Behaviour scores of heads from attention weights and logits (statistics.md section 8): pure array code.

Inputs are one layer's arrays over a batch of B sequences of length 2T (a random sequence repeated
once). Outputs are per head, averaged over sequences and positions.
"""
from __future__ import annotations

import numpy as np


def repeated_sequences(allowed: np.ndarray, length: int, sequences: int, seed: int) -> np.ndarray:
    """(B, 2T) token ids: T ids drawn uniformly (seeded) from `allowed`, then the same T again."""
    rng = np.random.default_rng(seed)
    first = allowed[rng.integers(0, len(allowed), size=(sequences, length))]
    return np.concatenate([first, first], axis=1)


def attention_scores(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per head (self, previous-token, induction) scores of attention weights A (B, H, 2T, 2T).

    self: mean A[i, i] over i >= 1; previous: mean A[i, i-1] over i >= 1; induction: mean
    A[T+i, i+1] over i in 1..T-1 (the token after the query token's first occurrence)."""
    t = weights.shape[-1] // 2
    own = np.diagonal(weights, axis1=-2, axis2=-1)[..., 1:]
    previous = np.diagonal(weights, offset=-1, axis1=-2, axis2=-1)
    i = np.arange(1, t)
    induction = weights[..., t + i, i + 1]
    return own.mean(axis=(0, -1)), previous.mean(axis=(0, -1)), induction.mean(axis=(0, -1))


def self_logits(query: np.ndarray, key: np.ndarray, scale: float) -> np.ndarray:
    """(B, H, P) pre-softmax logits at j = i, scale * q_i . k_i, from the model's own q (B, H, P, n) and
    k (B, H_kv, P, n); query head h reads key head h // (H / H_kv) (repeat_kv order)."""
    groups = query.shape[1] // key.shape[1]
    return scale * np.einsum("bhpn,bhpn->bhp", query, np.repeat(key, groups, axis=1))


def self_logit_parts(x: np.ndarray, w_q: np.ndarray, w_k: np.ndarray, b_q: np.ndarray, b_k: np.ndarray,
                     kv_index: np.ndarray, scale: float, q_factor: np.ndarray | None = None,
                     k_factor: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(B, H, P) twice: the form's self-logit scale * x^T L x = scale * (W_Q x) . (W_K x), and the query/key
    biases' part, which the form does not hold, scale * (b_k . W_Q x + b_q . W_K x + b_q . b_k); for inputs
    x (B, P, N), maps w_q (H, n, N), w_k (H_kv, n, N), biases b_q (H, n), b_k (H_kv, n). Never forms L.
    A folded QK-norm's per-token RMS factors q_factor (B, P, H or 1) and k_factor (B, P, H_kv or 1) multiply
    both parts: its q is r_q W_Q x with the gains in W_Q (statistics.md section 1)."""
    heads, n, width = w_q.shape
    q = (x @ w_q.reshape(-1, width).T).reshape(*x.shape[:2], heads, n)              # (B, P, H, n)
    k = (x @ w_k[kv_index].reshape(-1, width).T).reshape(*x.shape[:2], heads, n)
    b_k = b_k[kv_index]
    form = np.einsum("bphn,bphn->bhp", q, k)
    bias = (np.einsum("bphn,hn->bhp", q, b_k) + np.einsum("bphn,hn->bhp", k, b_q)
            + np.einsum("hn,hn->h", b_q, b_k)[:, None])
    factor = 1.0
    if q_factor is not None:
        factor = factor * np.broadcast_to(q_factor, (*x.shape[:2], heads)).transpose(0, 2, 1)
    if k_factor is not None:
        k_factor = k_factor if k_factor.shape[-1] == 1 else k_factor[..., kv_index]
        factor = factor * np.broadcast_to(k_factor, (*x.shape[:2], heads)).transpose(0, 2, 1)
    return scale * form * factor, scale * bias * factor


def query_temperature(positions: int, floor_scale: float, attn_scale: float) -> np.ndarray:
    """(P,) Llama 4's factor on the query of its NoPE layers at token i: log(1 + floor((i + 1) / floor_scale)) *
    attn_scale + 1 (exactly 1 below floor_scale - 1 tokens)."""
    return np.log1p(np.floor((np.arange(positions) + 1.0) / floor_scale)) * attn_scale + 1.0
