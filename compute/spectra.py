"""Spectra of a batch of reduced forms l (statistics.md section 2)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from headforms.compute.threads import Pool, batches


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

    @classmethod
    def of(cls, eig_S, sv_T, eig_L, sv_L) -> "Spectra":
        """Spectra from its arrays, sigma(T) taken from T's singular values (one of each equal pair)."""
        return cls(eig_S=eig_S, sv_T=sv_T, sigma_T=sv_T[:, 0::2].copy(), eig_L=eig_L, sv_L=sv_L)


def _nonzero_rows(l) -> int:
    """m such that every row of every l from m on is exactly zero (m = r when none is)."""
    rows = (l != 0).any(-1).any(0)  # numpy or torch
    rows = np.flatnonzero(rows if isinstance(rows, np.ndarray) else rows.cpu().numpy())
    return int(rows[-1]) + 1 if len(rows) else 0


def _symmetric_part(l: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eig_S, sv_T) of a batch: S = (l + l^T)/2's eigenvalues (decreasing), T = (l - l^T)/2's singular values."""
    lt = l.transpose(0, 2, 1)
    return np.linalg.eigvalsh((l + lt) / 2)[:, ::-1], np.linalg.svd((l - lt) / 2, compute_uv=False)


def _top_part(top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eig(A), sv([A | B])) of a batch of l's nonzero rows top = [A | B] (h, m, r), A square."""
    m = top.shape[1]
    return np.linalg.eigvals(top[:, :, :m]).astype(np.complex128), np.linalg.svd(top, compute_uv=False)


def _assemble(eig_S, sv_T, eig_L, sv_L, r: int) -> tuple[np.ndarray, ...]:
    """(eig_S, sv_T, eig_L, sv_L) with eig(l) and sv(l) padded by l's r - m zeros, eig(l) sorted by magnitude."""
    H, m = eig_L.shape
    eig_L = np.concatenate([eig_L, np.zeros((H, r - m), np.complex128)], axis=1)
    sv_L = np.concatenate([sv_L, np.zeros((H, r - m))], axis=1)
    order = np.argsort(-np.abs(eig_L), axis=-1, kind="stable")
    return eig_S, sv_T, np.take_along_axis(eig_L, order, axis=-1), sv_L


def batch_spectra(l: np.ndarray) -> tuple[np.ndarray, ...]:
    """(eig_S, sv_T, eig_L, sv_L) of a batch (numpy, on the CPU).

    The reduction's l = [[A, B], [0, 0]] has nonzero rows only up to m = min(n, r), so
    eig(l) = eig(A) and m - r exact zeros (block triangular), and sv(l) = sv(l[:m]) and
    m - r zeros: an m x m eigenproblem and an m x r SVD instead of r x r ones, with the
    same values. Any other l (no zero rows) takes the full r x r route.
    """
    H, r = l.shape[0], l.shape[1]
    m = _nonzero_rows(l)
    top = _top_part(l[:, :m]) if m else (np.zeros((H, 0), np.complex128), np.zeros((H, 0)))
    return _assemble(*_symmetric_part(l), *top, r)


def _later_spectra(pool: Pool, l: np.ndarray) -> Callable[[], tuple[np.ndarray, ...]]:
    """`batch_spectra` of a CPU batch as pieces on `pool` (by kind of problem and batch of heads, each large enough
    to run without the GIL); the function returned collects them."""
    H, r = l.shape[0], l.shape[1]
    m = _nonzero_rows(l)
    symmetric = [pool.submit(_symmetric_part, l[part]) for part in batches(H, r)]
    top = [pool.submit(_top_part, l[part, :m]) for part in batches(H, m)] if m else []

    def collect() -> tuple[np.ndarray, ...]:
        eig_S, sv_T = (np.concatenate(x) for x in zip(*(f.result() for f in symmetric)))
        eig_L, sv_L = ((np.concatenate(x) for x in zip(*(f.result() for f in top))) if m else
                       (np.zeros((H, 0), np.complex128), np.zeros((H, 0))))
        return _assemble(eig_S, sv_T, eig_L, sv_L, r)

    return collect


def _spectra_torch(l) -> tuple[np.ndarray, ...]:
    """`batch_spectra` of a torch batch on its device (cuda), copied back as numpy."""
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


def later_spectra(pool: Pool, l) -> Callable[[], Spectra]:
    """The spectra of a batch (H, r, r) of reduced forms, started now and collected by the function returned: on
    the CPU as pieces on `pool` (compute.threads); on another device (a torch tensor) computed there at once."""
    if not isinstance(l, np.ndarray) and l.device.type == "cpu":
        l = l.numpy()
    if isinstance(l, np.ndarray):
        collect = _later_spectra(pool, l)
        return lambda: Spectra.of(*collect())
    done = Spectra.of(*_spectra_torch(l))
    return lambda: done


def spectra(l) -> Spectra:
    """All spectra of section 2 for a batch (H, r, r) of reduced forms (numpy, or a torch tensor).

    On the CPU, pieces go to a pool of single-threaded workers (compute.threads); on another
    device the batch is computed there in one go and copied back.
    """
    with Pool() as pool:
        return later_spectra(pool, l)()
