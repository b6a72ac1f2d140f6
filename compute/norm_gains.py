"""Folding a pre-norm's gain (and LayerNorm's centering) into the query and key maps (statistics.md section 7).

With x_hat = g * z, z = x / rms(x) (RMSNorm) or (x - mean(x)) / sd(x) (LayerNorm), feeding both
W_Q and W_K, the score is z_j^T diag(g) L diag(g) z_i: the maps W diag(g) give that form. With the
centering, z = P x / sd(x), P = I - 1 1^T / N, and the maps W diag(g) P give P diag(g) L diag(g) P
on x / sd(x). The per-token factors 1/rms, 1/sd scale the score and leave the form's profile alone.
"""
from __future__ import annotations

import numpy as np


def fold_gain(w: np.ndarray, gain: np.ndarray, center: bool = False) -> np.ndarray:
    """W diag(g), or W diag(g) P with center (each row minus its mean), for maps w (..., n, N) and g (N,)."""
    folded = w * gain
    if center:
        folded = folded - folded.mean(axis=-1, keepdims=True)
    return folded
