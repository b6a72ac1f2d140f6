"""Spectra of a batch of reduced forms l (statistics.md section 2)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headforms.compute import threads
from headforms.compute.threads import chunks, map_threads


@dataclass
class Spectra:
    """Per-head spectra, one row per head, every vector sorted in decreasing order.

    eig_S: eigenvalues of S = (L + L^T)/2 (r values); sv_T: singular values of
    T = (L - L^T)/2 (r values, in equal pairs); sigma_T: one value per pair (the positive
    imaginary parts of T's eigenvalues); eig_L: eigenvalues of L (complex, by magnitude);
    sv_L: singular values of L. r = min(N, 2n); the ambient zeros are implicit.
    """

    eig_S: np.ndarray
    sv_T: np.ndarray
    sigma_T: np.ndarray
    eig_L: np.ndarray
    sv_L: np.ndarray

    @property
    def n_heads(self) -> int:
        return self.eig_S.shape[0]


def _nonzero_rows(l) -> int:
    """m such that every row of every l from m on is exactly zero (m = r when none is)."""
    rows = (l != 0).any(-1).any(0)  # numpy or torch
    rows = np.flatnonzero(rows if isinstance(rows, np.ndarray) else rows.cpu().numpy())
    return int(rows[-1]) + 1 if len(rows) else 0


def _spectra(l: np.ndarray) -> tuple[np.ndarray, ...]:
    """(eig_S, sv_T, eig_L, sv_L) of a batch (numpy, on the CPU).

    The reduction's l = [[A, B], [0, 0]] has nonzero rows only up to m = min(n, r), so
    eig(l) = eig(A) and m - r exact zeros (block triangular), and sv(l) = sv(l[:m]) and
    m - r zeros: an m x m eigenproblem and an m x r SVD instead of r x r ones, with the
    same values. Any other l (no zero rows) takes the full r x r route.
    """
    H, r = l.shape[0], l.shape[1]
    m = _nonzero_rows(l)
    lt = l.transpose(0, 2, 1)
    eig_S = np.linalg.eigvalsh((l + lt) / 2)[:, ::-1]
    sv_T = np.linalg.svd((l - lt) / 2, compute_uv=False)
    eig_L = np.linalg.eigvals(l[:, :m, :m]).astype(np.complex128) if m else np.zeros((H, 0), np.complex128)
    sv_L = np.linalg.svd(l[:, :m, :], compute_uv=False) if m else np.zeros((H, 0))
    eig_L = np.concatenate([eig_L, np.zeros((H, r - m), np.complex128)], axis=1)
    sv_L = np.concatenate([sv_L, np.zeros((H, r - m))], axis=1)
    order = np.argsort(-np.abs(eig_L), axis=-1, kind="stable")
    return eig_S, sv_T, np.take_along_axis(eig_L, order, axis=-1), sv_L


def _spectra_torch(l) -> tuple[np.ndarray, ...]:
    """`_spectra` of a torch batch on its device (cuda), copied back as numpy."""
    import torch

    H, r = l.shape[0], l.shape[1]
    m = _nonzero_rows(l)
    s = (l + l.transpose(1, 2)) / 2
    t = (l - l.transpose(1, 2)) / 2
    eig_S = torch.linalg.eigvalsh(s).flip(-1)
    sv_T = torch.linalg.svdvals(t)
    eig_L = torch.linalg.eigvals(l[:, :m, :m]) if m else l.new_zeros((H, 0), dtype=torch.complex128)
    sv_L = torch.linalg.svdvals(l[:, :m, :]) if m else l.new_zeros((H, 0))
    if m < r:
        eig_L = torch.cat([eig_L, eig_L.new_zeros((H, r - m))], dim=1)
        sv_L = torch.cat([sv_L, sv_L.new_zeros((H, r - m))], dim=1)
    order = torch.argsort(eig_L.abs(), dim=-1, descending=True, stable=True)
    eig_L = torch.gather(eig_L, -1, order)
    return tuple(x.cpu().numpy() for x in (eig_S, sv_T, eig_L, sv_L))


def spectra(l) -> Spectra:
    """All spectra of section 2 for a batch (H, r, r) of reduced forms (numpy, or a torch tensor).

    On the CPU, slices of heads go to a pool of single-threaded workers (compute.threads);
    on another device the batch is computed there in one go and copied back.
    """
    if not isinstance(l, np.ndarray) and l.device.type == "cpu":
        l = l.numpy()
    if isinstance(l, np.ndarray):
        parts = map_threads(_spectra, [l[part] for part in chunks(len(l), 4 * threads.WORKERS)])
        eig_S, sv_T, eig_L, sv_L = (np.concatenate(p) for p in zip(*parts))
    else:
        eig_S, sv_T, eig_L, sv_L = _spectra_torch(l)
    return Spectra(eig_S=eig_S, sv_T=sv_T, sigma_T=sv_T[:, 0::2].copy(), eig_L=eig_L, sv_L=sv_L)
