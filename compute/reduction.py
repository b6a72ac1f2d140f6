"""The exact reduction of L = W_K^T W_Q to its 2n-dimensional span, batched over heads."""
from __future__ import annotations

import numpy as np
import torch


def reduce_forms(wq: np.ndarray, wk: np.ndarray, kv_index: np.ndarray, device: str = "cpu") -> torch.Tensor:
    """The small matrices l with L = U l U^T, one per query head, in float64.

    wq: (H, n, N) query maps; wk: (H_kv, n, N) key maps; kv_index: key head of each query
    head. With [W_K^T | W_Q^T] = U R (QR, U orthonormal N x r, r = min(N, 2n)),
    L = U R_K R_Q^T U^T, so l = R_K R_Q^T is r x r and has L's nonzero spectra exactly.
    """
    q = torch.as_tensor(wq, dtype=torch.float64, device=device)
    k = torch.as_tensor(wk, dtype=torch.float64, device=device)[torch.as_tensor(kv_index, device=device)]
    n = q.shape[1]
    stacked = torch.cat([k, q], dim=1).transpose(1, 2)  # (H, N, 2n) = [W_K^T | W_Q^T]
    r = torch.linalg.qr(stacked, mode="r").R            # (H, r, 2n)
    return r[:, :, :n] @ r[:, :, n:].transpose(1, 2)
