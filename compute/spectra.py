"""Spectra of a batch of reduced forms l (statistics.md section 2)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from headforms.compute.threads import WORKERS, chunks, map_threads


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


def _nonzero_rows(l: torch.Tensor) -> int:
    """m such that every row of every l from m on is exactly zero (m = r when none is)."""
    rows = torch.nonzero((l != 0).any(dim=2).any(dim=0))
    return int(rows[-1]) + 1 if len(rows) else 0


def _spectra(l: torch.Tensor) -> tuple[np.ndarray, ...]:
    """(eig_S, sv_T, eig_L, sv_L) of a batch, as CPU numpy arrays.

    The reduction's l = [[A, B], [0, 0]] has nonzero rows only up to m = min(n, r), so
    eig(l) = eig(A) and m - r exact zeros (block triangular), and sv(l) = sv(l[:m]) and
    m - r zeros: an m x m eigenproblem and an m x r SVD instead of r x r ones, with the
    same values. Any other l (no zero rows) takes the full r x r route.
    """
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


def spectra(l: torch.Tensor) -> Spectra:
    """All spectra of section 2 for a batch (H, r, r) of reduced forms.

    On the CPU, slices of heads go to a pool of single-threaded workers (compute.threads);
    on another device the batch is computed there in one go and copied back.
    """
    if l.device.type == "cpu":
        parts = map_threads(_spectra, [l[part] for part in chunks(len(l), 4 * WORKERS)])
        eig_S, sv_T, eig_L, sv_L = (np.concatenate(p) for p in zip(*parts))
    else:
        eig_S, sv_T, eig_L, sv_L = _spectra(l)
    return Spectra(eig_S=eig_S, sv_T=sv_T, sigma_T=sv_T[:, 0::2].copy(), eig_L=eig_L, sv_L=sv_L)
