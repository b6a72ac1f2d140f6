"""The exact reduction of L = W_K^T W_Q to its 2n-dimensional span, batched over heads."""
from __future__ import annotations

import numpy as np
from scipy.linalg import lapack

from headforms.compute.threads import batches, map_threads


def on_cpu(device: str) -> bool:
    """Whether a torch device name is the CPU (the path that needs no torch at all)."""
    return str(device).split(":")[0] == "cpu"


def device_problem(device: str, *, float64: bool = True) -> str | None:
    """Why torch cannot compute on `device` here, or None: a name torch does not know, a device type this torch build
    or this machine lacks, an index beyond the devices present; and for float64 work (the reduction and spectra),
    a type other than cpu and cuda. Checked before any work, so that a run refuses it in one line."""
    if on_cpu(device):
        return None
    import torch

    try:
        where = torch.device(device)
    except RuntimeError:
        return f"device {device}: not a torch device name (cpu, cuda or cuda:N)"
    if float64 and where.type != "cuda":
        return f"device {device}: headforms computes in float64 on cpu or cuda, not on {where.type}"
    backend = getattr(torch, where.type, None)
    count = backend.device_count() if hasattr(backend, "device_count") else 0
    if count == 0:
        build = f"torch {torch.__version__}" + ("" if where.type != "cuda" or torch.version.cuda else ", built without CUDA")
        return f"device {device}: no {where.type} device here ({build}); the default device, cpu, needs none"
    if (where.index or 0) >= count:
        return (f"device {device}: this machine has {count} {where.type} device{'s' if count > 1 else ''} "
                f"({where.type}:0{f' to {where.type}:{count - 1}' if count > 1 else ''})")
    return None


def factor(stacked):
    """[R_K | R_Q] (..., r, 2n) from stacked = [W_K; W_Q] of shape (..., 2n, N), float64 (numpy, or torch on a device).

    stacked's transpose is [W_K^T | W_Q^T] (N x 2n) in column-major order, the layout LAPACK's
    QR works in. R_K's rows below n are exactly zero, so only l's first n rows can be nonzero.
    """
    if isinstance(stacked, np.ndarray):
        return np.linalg.qr(stacked.swapaxes(-2, -1), mode="r")  # (..., r, 2n), r = min(N, 2n)
    import torch

    return torch.linalg.qr(stacked.transpose(-2, -1), mode="r").R


def head_factors(k: np.ndarray, kv: np.ndarray, q: np.ndarray) -> np.ndarray:
    """`factor` of a batch of query heads q (h, n, N) stacked under their key heads k[kv] (numpy, float64).

    Heads of the batch that share a key head (a key/value group) share the QR of its W_K^T (`_shared_key`); a
    head alone with its key head is factored with the others alike, in one batched QR."""
    h, n, N = q.shape
    shared = np.bincount(kv, minlength=len(k))[kv] > 1
    if not shared.any():
        return factor(np.concatenate([k[kv], q], axis=1))
    out = np.empty((h, min(N, 2 * n), 2 * n))
    alone = np.flatnonzero(~shared)
    if len(alone):
        out[alone] = factor(np.concatenate([k[kv[alone]], q[alone]], axis=1))
    for key in np.unique(kv[shared]):
        heads = np.flatnonzero(kv == key)
        out[heads] = _shared_key(k[key], q[heads])
    return out


def _shared_key(k: np.ndarray, q: np.ndarray) -> np.ndarray:
    """`factor` of [k; q_i] for each query map q_i of q (g, n, N) under one key map k (n, N).

    Householder QR of [W_K^T | W_Q^T] is, column by column, the QR of W_K^T, its reflectors applied to W_Q^T, and
    the QR of the rows of that below W_K's: so the key's QR is done once for all g heads, its reflectors applied to
    their W_Q^T in one LAPACK call (dormqr, BLAS-3), and only the (N - n) x n remainders are factored per head."""
    g, n, N = q.shape
    top, r = min(N, n), min(N, 2 * n)
    qr_k, tau, _, _ = lapack.dgeqrf(k.T)
    reflectors = qr_k[:, :top]
    c = np.array(q.reshape(g * n, N).T, order="F")                        # [W_Q1^T | ... | W_Qg^T], N x g n
    lwork = int(lapack.dormqr("L", "T", reflectors, tau, c, -1)[1][0])
    c = lapack.dormqr("L", "T", reflectors, tau, c, max(lwork, 1), overwrite_c=1)[0]
    rotated = c.T.reshape(g, n, N).swapaxes(-2, -1)                          # Q_K^T W_Qi^T, (g, N, n)
    out = np.zeros((g, r, 2 * n))
    out[:, :top, :n] = np.triu(qr_k[:top])
    out[:, :top, n:] = rotated[:, :top]
    if r > top:
        out[:, top:, n:] = np.linalg.qr(rotated[:, top:], mode="r")
    return out


def forms(factors, n: int):
    """l = R_K R_Q^T from the factors [R_K | R_Q] (..., r, 2n)."""
    return factors[..., :, :n] @ factors[..., :, n:].swapaxes(-2, -1)


def reduce_factors(wq: np.ndarray, wk: np.ndarray, kv_index: np.ndarray, device: str = "cpu"):
    """The R factors [R_K | R_Q] of [W_K^T | W_Q^T] = U [R_K | R_Q], one (r, 2n) per query head, float64.

    L = U R_K R_Q^T U^T, and with RoPE L_delta = U R_K R(delta) R_Q^T U^T (compute.rotary).
    On the CPU (numpy) batches of heads are factored over a pool of single-threaded workers
    (compute.threads), each batch large enough for numpy to release the GIL, holding its heads'
    N x 2n copies; on another device (cuda, torch) the whole layer is one batched call there.
    """
    if on_cpu(device):
        q = np.asarray(wq, dtype=np.float64)
        k = np.asarray(wk, dtype=np.float64)
        kv = np.asarray(kv_index, dtype=np.intp)

        parts = batches(len(q), min(q.shape[2], 2 * q.shape[1]), kv)  # R has r = min(N, 2n) rows; groups whole
        return np.concatenate(map_threads(lambda heads: head_factors(k, kv[heads], q[heads]), parts))
    import torch

    q = torch.as_tensor(wq, dtype=torch.float64, device=device)
    k = torch.as_tensor(wk, dtype=torch.float64, device=device)
    k = k[torch.as_tensor(np.asarray(kv_index), dtype=torch.long, device=device)]
    return factor(torch.cat([k, q], dim=1))


def reduce_forms(wq: np.ndarray, wk: np.ndarray, kv_index: np.ndarray, device: str = "cpu"):
    """The small matrices l with L = U l U^T, one per query head, in float64: numpy on the CPU, else a
    torch tensor on `device`.

    wq: (H, n, N) query maps; wk: (H_kv, n, N) key maps; kv_index: key head of each query
    head. With [W_K^T | W_Q^T] = U R (QR, U orthonormal N x r, r = min(N, 2n)),
    L = U R_K R_Q^T U^T, so l = R_K R_Q^T is r x r and has L's nonzero spectra exactly.
    """
    return forms(reduce_factors(wq, wk, kv_index, device), wq.shape[1])
