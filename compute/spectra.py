"""Spectra of a batch of reduced forms l (statistics.md section 2)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


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


def spectra(l: torch.Tensor) -> Spectra:
    """All spectra of section 2 for a batch (H, r, r) of reduced forms."""
    s = (l + l.transpose(1, 2)) / 2
    t = (l - l.transpose(1, 2)) / 2
    eig_S = torch.linalg.eigvalsh(s).flip(-1)
    sv_T = torch.linalg.svdvals(t)
    eig_L = torch.linalg.eigvals(l)
    order = torch.argsort(eig_L.abs(), dim=-1, descending=True, stable=True)
    eig_L = torch.gather(eig_L, -1, order)
    sv_L = torch.linalg.svdvals(l)
    return Spectra(
        eig_S=eig_S.cpu().numpy(),
        sv_T=sv_T.cpu().numpy(),
        sigma_T=sv_T[:, 0::2].cpu().numpy(),
        eig_L=eig_L.cpu().numpy(),
        sv_L=sv_L.cpu().numpy(),
    )
