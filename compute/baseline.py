"""The random baseline of Figures 13 and 14: an independent Gaussian head per real head.

For W_K, W_Q iid standard normal n x N, the R factor of [W_K^T | W_Q^T] has Bartlett's
distribution: independent entries, chi with N - i degrees of freedom on the diagonal and
standard normals above it. Sampling R directly gives the baseline's reduced form l
exactly in distribution, at O(n^2) per head instead of O(N n^2).
"""
from __future__ import annotations

import numpy as np


def random_forms(seed: int, layer: int, n_heads: int, head_dim: int, d_model: int) -> np.ndarray:
    """Reduced forms (n_heads, r, r) of Gaussian heads, reproducible from (seed, layer)."""
    rng = np.random.default_rng([seed, layer])
    width = 2 * head_dim
    r = min(d_model, width)
    upper = np.triu(rng.standard_normal((n_heads, r, width)), k=1)
    diag = np.sqrt(rng.chisquare(d_model - np.arange(r), size=(n_heads, r)))
    idx = np.arange(r)
    upper[:, idx, idx] = diag
    return upper[:, :, :head_dim] @ upper[:, :, head_dim:].transpose(0, 2, 1)
