"""RoPE at relative distance delta: R(delta) in a head's n-dimensional space and the forms
L_delta = W_K^T R(delta) W_Q, reduced in the same 2n basis as L (statistics.md section 1).

With [W_K^T | W_Q^T] = U [R_K | R_Q] (the reduction's QR), L_delta = U R_K R(delta) R_Q^T U^T,
so l_delta = R_K R(delta) R_Q^T: one rotation of R_Q's n rows and one r x n by n x r product per
head and distance, on the factors the reduction already has. Query position i and key position j
score x_j^T L_(i-j) x_i (times the score scale): delta = i - j, and R(0) = I gives L.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headforms.compute.statistics import PARITY_TOLERANCE, profile_statistics
from headforms.compute import threads
from headforms.compute.threads import chunks, map_threads

PAIRINGS = ("split-half", "interleaved")
DEFAULT_DISTANCES = (0,) + tuple(2**k for k in range(13))  # 0, 1, 2, 4, ..., 4096
# Columns of a distance profile: the per-head statistics of L_delta (statistics.md section 3).
PROFILE_COLUMNS = ("frobenius", "symmetric_energy", "a", "b", "c", "d", "parity", "pairing")


@dataclass(frozen=True)
class Rotation:
    """The planes RoPE rotates in a head's n coordinates (rows first[p], second[p]) and their
    angular frequencies (radians per position); coordinates in no plane are not rotated."""

    first: np.ndarray
    second: np.ndarray
    frequencies: np.ndarray

    @classmethod
    def of(cls, pairing: str, frequencies) -> "Rotation":
        """Planes (i, i + d/2) for split-half (Hugging Face's rotate_half, GGUF neox), (2i, 2i+1) for
        interleaved (llama.cpp's permuted llama rows); d = 2 len(frequencies) rotated coordinates first."""
        freq = np.asarray(frequencies, dtype=np.float64)
        i = np.arange(len(freq))
        if pairing == "split-half":
            return cls(i, i + len(freq), freq)
        if pairing == "interleaved":
            return cls(2 * i, 2 * i + 1, freq)
        raise ValueError(f"unknown RoPE pairing '{pairing}'; expected one of {', '.join(PAIRINGS)}")

    def matrix(self, delta: float, n: int) -> np.ndarray:
        """R(delta) as a dense n x n matrix (for tests and small checks; the batch code never forms it)."""
        return self.rotate(np.eye(n), np.array([delta]))[0]

    def rotate(self, rows, deltas: np.ndarray):
        """R(delta) @ rows for every delta: rows (..., n, m) -> (D, ..., n, m).

        Row-wise R(delta) x = c * x + s * x[partner]: a plane's first row takes cos x_first - sin x_second,
        its second row sin x_first + cos x_second; rows in no plane keep c = 1, s = 0."""
        n = rows.shape[-2]
        angles = np.outer(deltas, self.frequencies)                        # (D, P)
        c, s = np.ones((len(deltas), n)), np.zeros((len(deltas), n))
        c[:, self.first], c[:, self.second] = np.cos(angles), np.cos(angles)
        s[:, self.first], s[:, self.second] = -np.sin(angles), np.sin(angles)
        partner = np.arange(n)
        partner[self.first], partner[self.second] = self.second, self.first
        shape = (len(deltas),) + (1,) * (rows.ndim - 2) + (n, 1)
        if not isinstance(rows, np.ndarray):  # a torch tensor on a device
            import torch

            c, s = (torch.as_tensor(x, dtype=rows.dtype, device=rows.device) for x in (c, s))
            partner = torch.as_tensor(partner, device=rows.device)
        return c.reshape(shape) * rows + s.reshape(shape) * rows[..., partner, :]


def _top_rows(factors, n: int, rotation: Rotation, deltas: np.ndarray):
    """The first n rows [A | B] of every l_delta, (D, H, n, r): R_K's rows below n are zero (R is upper
    triangular), and so are l_delta's. numpy on the CPU, torch on a device."""
    return factors[..., :n, :n] @ rotation.rotate(factors[..., n:].swapaxes(-2, -1), deltas)


def distance_forms(factors, n: int, rotation: Rotation, deltas: np.ndarray):
    """l_delta = R_K R(delta) R_Q^T, (D, H, r, r), from the reduction's factors [R_K | R_Q] (H, r, 2n)."""
    top = _top_rows(factors, n, rotation, deltas)
    return np.concatenate([top, np.zeros(top.shape[:-2] + (factors.shape[-2] - n, top.shape[-1]))], axis=-2)


def _profiles(factors, n: int, rotation: Rotation, deltas: np.ndarray) -> tuple[np.ndarray, ...]:
    """(eig_S, ||L||^2, ||T||^2) of every (delta, head) of a batch, flattened delta-major.

    With l = [[A, B], [0, 0]]: S = [[(A + A^T)/2, B/2], [B^T/2, 0]], ||T||^2 = ||A - A^T||^2/4 + ||B||^2/2."""
    top = _top_rows(factors, n, rotation, deltas)
    top = top.reshape((-1,) + tuple(top.shape[2:]))                      # (D*H, n, r)
    a, b = top[..., :n], top[..., n:]
    r = top.shape[-1]
    if not isinstance(top, np.ndarray):  # a device: the eigenproblems there, the results back as numpy
        import torch

        s = top.new_zeros(top.shape[:-2] + (r, r))
    else:
        s = np.zeros(top.shape[:-2] + (r, r))
    s[..., :n, :n] = (a + a.swapaxes(-2, -1)) / 2
    s[..., :n, n:] = b / 2
    s[..., n:, :n] = b.swapaxes(-2, -1) / 2
    if isinstance(top, np.ndarray):
        eig_S = np.linalg.eigvalsh(s)[..., ::-1]
    else:
        eig_S = torch.linalg.eigvalsh(s).flip(-1).cpu().numpy()
        top, a, b = (x.cpu().numpy() for x in (top, a, b))
    l2 = (top**2).sum(axis=(-2, -1))
    t2 = ((a - a.swapaxes(-2, -1)) ** 2).sum(axis=(-2, -1)) / 4 + (b**2).sum(axis=(-2, -1)) / 2
    return eig_S, l2, t2


def distance_profiles(factors, n: int, rotation: Rotation, deltas, *,
                      parity_tolerance: float = PARITY_TOLERANCE) -> dict[str, np.ndarray]:
    """PROFILE_COLUMNS of L_delta for every delta and head, each (D, H), plus "delta" (D, H).

    On the CPU slices of heads go to the single-threaded worker pool (compute.threads), so a
    slice's (D, h, r, r) forms are all that is held at once; elsewhere the batch is one call."""
    deltas = np.asarray(deltas, dtype=np.int64)
    H = factors.shape[0]
    if isinstance(factors, np.ndarray):
        parts = map_threads(lambda part: _profiles(factors[part], n, rotation, deltas),
                            chunks(H, 4 * threads.WORKERS))
        eig_S, l2, t2 = (np.concatenate([x.reshape(len(deltas), -1, *x.shape[1:]) for x in p], axis=1)
                         for p in zip(*parts))
    else:
        eig_S, l2, t2 = (x.reshape(len(deltas), H, *x.shape[1:]) for x in _profiles(factors, n, rotation, deltas))
    flat = profile_statistics(eig_S.reshape(len(deltas) * H, -1), l2.ravel(), t2.ravel(), parity_tolerance)
    out = {name: flat[name].reshape(len(deltas), H) for name in PROFILE_COLUMNS}
    out["delta"] = np.broadcast_to(deltas[:, None], (len(deltas), H))
    return out
