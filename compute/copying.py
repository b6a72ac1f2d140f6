"""Copying scores of output-value circuits: how much of what a head writes is the token it read.

A head's full OV circuit W_U OV_h W_E^T is vocabulary x vocabulary; its nonzero eigenvalues are those of the
n x n matrix W_V W_E^T W_U W_O (the nonzero eigenvalues of AB and BA agree), so the vocabulary-sized matrix is
never formed: the model's N x N Gram G = W_E^T W_U is taken once, and each head's n x n product from it.
"""
from __future__ import annotations

import numpy as np


def unembedding_gram(w_e: np.ndarray, w_u: np.ndarray) -> np.ndarray:
    """G = W_E^T W_U (N x N) from the embedding W_E and unembedding W_U, both (vocab, N)."""
    return np.asarray(w_e, dtype=np.float64).T @ np.asarray(w_u, dtype=np.float64)


def eigenvalue_share(eigenvalues: np.ndarray) -> np.ndarray:
    """sum(lambda) / sum(|lambda|) over the last axis (real: the imaginary parts of conjugate pairs cancel);
    NaN where every eigenvalue is zero."""
    total = np.abs(eigenvalues).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, eigenvalues.real.sum(axis=-1) / total, np.nan)


def copying_scores(w_v: np.ndarray, w_o: np.ndarray, kv_index: np.ndarray,
                   gram: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(copying_score, residual_copying_score) per head, (H,) each.

    w_v (Hkv, n, N), w_o (H, N, n): head h's OV is w_o[h] @ w_v[kv_index[h]]. copying_score is the eigenvalue
    share of the full circuit through `gram` (NaN for every head where gram is None: no unembedding);
    residual_copying_score that of OV alone, through the n x n matrix W_V W_O."""
    v, o = np.asarray(w_v, dtype=np.float64), np.asarray(w_o, dtype=np.float64)
    kv = np.asarray(kv_index)
    residual = eigenvalue_share(np.linalg.eigvals(v[kv] @ o))
    if gram is None:
        return np.full(len(o), np.nan), residual
    through = v @ gram  # (Hkv, n, N): once per key/value group, the n N^2 products a head would repeat
    return eigenvalue_share(np.linalg.eigvals(through[kv] @ o)), residual
