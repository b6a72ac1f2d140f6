"""RoPE at relative distance delta: R(delta) in a head's n-dimensional space and the forms
L_delta = W_K^T R(delta) W_Q, reduced in the same 2n basis as L (statistics.md section 1).

With [W_K^T | W_Q^T] = U [R_K | R_Q] (the reduction's QR), L_delta = U R_K R(delta) R_Q^T U^T,
so l_delta = R_K R(delta) R_Q^T: one rotation of R_Q's n rows and one r x n by n x r product per
head and distance, on the factors the reduction already has. Query position i and key position j
score x_j^T L_(i-j) x_i (times the score scale): delta = i - j, and R(0) = I gives L.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from headforms.compute.statistics import PARITY_TOLERANCE, profile_statistics
from headforms.compute.threads import Pool, batches

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

    def rotate(self, rows, deltas: np.ndarray, scale: float = 1.0):
        """scale * R(delta) @ rows for every delta: rows (..., n, m) -> (D, ..., n, m).

        Row-wise R(delta) x = c * x + s * x[partner]: a plane's first row takes cos x_first - sin x_second,
        its second row sin x_first + cos x_second; rows in no plane keep c = 1, s = 0. A power-of-two `scale`
        (the halving of S = (L + L^T)/2) is exact, folded into c and s."""
        n = rows.shape[-2]
        angles = np.outer(deltas, self.frequencies)                        # (D, P)
        c, s = np.full((len(deltas), n), scale), np.zeros((len(deltas), n))
        c[:, self.first], c[:, self.second] = scale * np.cos(angles), scale * np.cos(angles)
        s[:, self.first], s[:, self.second] = scale * -np.sin(angles), scale * np.sin(angles)
        partner = np.arange(n)
        partner[self.first], partner[self.second] = self.second, self.first
        shape = (len(deltas),) + (1,) * (rows.ndim - 2) + (n, 1)
        if not isinstance(rows, np.ndarray):  # a torch tensor on a device
            import torch

            c, s = (torch.as_tensor(x, dtype=rows.dtype, device=rows.device) for x in (c, s))
            partner = torch.as_tensor(partner, device=rows.device)
        out = c.reshape(shape) * rows
        out += s.reshape(shape) * rows[..., partner, :]
        return out


def _top_rows(factors, n: int, rotation: Rotation, deltas: np.ndarray):
    """The first n rows [A | B] of every l_delta, (D, H, n, r): R_K's rows below n are zero (R is upper
    triangular), and so are l_delta's. R_K's n x n block is rotated, (R_K R(delta))^T = R(-delta) R_K^T, being
    half the size of R_Q^T's n x r rows. numpy on the CPU, torch on a device."""
    rotated = rotation.rotate(factors[..., :n, :n].swapaxes(-2, -1), -deltas).swapaxes(-2, -1)
    return rotated @ factors[..., n:].swapaxes(-2, -1)


def distance_forms(factors, n: int, rotation: Rotation, deltas: np.ndarray):
    """l_delta = R_K R(delta) R_Q^T, (D, H, r, r), from the reduction's factors [R_K | R_Q] (H, r, 2n)."""
    top = _top_rows(factors, n, rotation, deltas)
    return np.concatenate([top, np.zeros(top.shape[:-2] + (factors.shape[-2] - n, top.shape[-1]))], axis=-2)


def _device_eigenvalues(top) -> np.ndarray:
    """eig(S) of l = [[A, B], [0, 0]] from its top rows [A | B] (..., n, r) as torch tensors on a device, flattened
    to (-1, r), decreasing, back as numpy: S = [[(A + A^T)/2, B/2], [B^T/2, 0]]."""
    import torch

    n, r = top.shape[-2], top.shape[-1]
    top = top.reshape((-1, n, r))
    a, b = top[..., :n], top[..., n:]
    s = top.new_zeros(top.shape[:-2] + (r, r))
    s[..., :n, :n] = (a + a.swapaxes(-2, -1)) / 2
    s[..., :n, n:] = b / 2
    s[..., n:, :n] = b.swapaxes(-2, -1) / 2
    return torch.linalg.eigvalsh(s).flip(-1).cpu().numpy()


def profile_problems(factors, n: int, rotation: Rotation, deltas: np.ndarray, solve=None) -> tuple[np.ndarray, ...]:
    """(eig_S of the deltas where `solve` (a mask; None: all), ||L||^2, ||T||^2 of every delta) of each head of a
    batch, flattened delta-major. With l = [[A, B], [0, 0]]: ||T||^2 = ||A - A^T||^2/4 + ||B||^2/2."""
    solve = np.ones(len(deltas), bool) if solve is None else np.asarray(solve, bool)
    if not isinstance(factors, np.ndarray):
        return _device_problems(factors, n, rotation, deltas, solve)
    H, r = factors.shape[0], factors.shape[-2]
    s = np.empty((int(solve.sum()), H, r, r))  # S_delta in its lower triangle, built where the product lands
    rest = np.empty((len(deltas) - len(s), H, r, min(n, r)))
    l2, t2 = np.empty((len(deltas), H)), np.empty((len(deltas), H))
    for mask, out in ((solve, s[..., :n]), (~solve, rest)):
        for i, j in enumerate(np.flatnonzero(mask)):  # one delta at a time: its forms stay in cache
            _halved_transposed_top(factors, n, rotation, deltas[j:j + 1], out[i:i + 1])
            l2[j], t2[j] = _halved_norms(out[i], symmetrize=out is not rest)
    s[..., n:, n:] = 0.0  # LAPACK reads the lower triangle alone: the block above is left unset
    eig_S = np.linalg.eigvalsh(s.reshape(-1, r, r), UPLO="L")[..., ::-1]
    return eig_S, l2.ravel(), t2.ravel()


def _halved_transposed_top(factors: np.ndarray, n: int, rotation: Rotation, deltas: np.ndarray, out: np.ndarray) -> None:
    """out (D, H, r, n) = [A^T; B^T] / 2 of each l_delta's top rows [A | B]: R_Q (R_K R(delta))^T / 2, one batched
    product written where S_delta's lower triangle wants it (halving is exact, a power of two)."""
    rotated = rotation.rotate(factors[..., :n, :n].swapaxes(-2, -1), -deltas, 0.5)  # R(-delta) R_K^T / 2
    np.matmul(factors[..., n:], rotated, out=out)


def _halved_norms(half: np.ndarray, symmetrize: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """||L||^2 and ||T||^2 (D, H) of forms given as [A^T; B^T] / 2 (D, H, r, n); with `symmetrize`, the A^T/2 block
    then becomes (A + A^T)/2 in place (exactly A^T/2 + A/2), from the same transposed copy (B^T/2 lies below it)."""
    n = half.shape[-1]
    a, b = half[..., :n, :], half[..., n:, :]
    b2 = _squares(b)
    transposed = a.swapaxes(-2, -1).copy()
    l2, t2 = 4 * (_squares(a) + b2), _squares(a - transposed) + 2 * b2
    if symmetrize:
        a += transposed
    return l2, t2


def _device_problems(factors, n: int, rotation: Rotation, deltas: np.ndarray, solve: np.ndarray):
    """`profile_problems` of torch factors on a device: the forms and eigenproblems there, the norms back as numpy."""
    top = _top_rows(factors, n, rotation, deltas)                         # (D, H, n, r)
    eig_S = _device_eigenvalues(top if solve.all() else top[solve])
    top = top.cpu().numpy().reshape((-1,) + tuple(top.shape[2:]))        # (D*H, n, r)
    a, b = top[..., :n], top[..., n:]
    a2, b2 = _squares(a), _squares(b)
    return eig_S, a2 + b2, _squares(a - a.swapaxes(-2, -1)) / 4 + b2 / 2


def _squares(x: np.ndarray) -> np.ndarray:
    """The squared Frobenius norm of each matrix of a batch (..., m, k), without a squared copy."""
    return np.einsum("...ij,...ij->...", x, x)


def assemble_profiles(pieces, parts: list[slice], deltas: np.ndarray, solve: np.ndarray, eig_S0: np.ndarray | None,
                      parity_tolerance: float) -> dict[str, np.ndarray]:
    """The profile columns of a layer from the `profile_problems` of its batches of heads (`parts`); `eig_S0`
    (H, r): eig(S) of L itself, for the deltas not solved (delta 0, L_0 = L)."""
    solved, l2, t2 = (np.concatenate([x.reshape(-1, part.stop - part.start, *x.shape[1:])
                                      for x, part in zip(piece, parts)], axis=1) for piece in zip(*pieces))
    eig_S = np.empty(l2.shape + solved.shape[2:])
    eig_S[solve] = solved
    if not solve.all():
        eig_S[~solve] = eig_S0
    return _columns(eig_S, l2, t2, deltas, parity_tolerance)


def later_profiles(pool: Pool, factors, n: int, rotation: Rotation, deltas, *,
                   parity_tolerance: float = PARITY_TOLERANCE) -> Callable[[], dict[str, np.ndarray]]:
    """`distance_profiles`, started now and collected by the function returned: on the CPU batches of heads go to
    `pool` (compute.threads), so a batch's (D, h, r, r) forms are all that is held at once; on another device
    the batch is one call, made at once."""
    deltas = np.asarray(deltas, dtype=np.int64)
    H = factors.shape[0]
    if not isinstance(factors, np.ndarray):
        parts = profile_problems(factors, n, rotation, deltas)
        return lambda: _columns(*(x.reshape(len(deltas), H, *x.shape[1:]) for x in parts), deltas, parity_tolerance)
    solve = np.ones(len(deltas), bool)
    parts = batches(H, len(deltas) * factors.shape[-2])
    futures = [pool.submit(profile_problems, factors[part], n, rotation, deltas, solve) for part in parts]
    return lambda: assemble_profiles([f.result() for f in futures], parts, deltas, solve, None, parity_tolerance)


def _columns(eig_S, l2, t2, deltas: np.ndarray, parity_tolerance: float) -> dict[str, np.ndarray]:
    """PROFILE_COLUMNS and "delta", each (D, H), from eig(S), ||L||^2 and ||T||^2 of every (delta, head)."""
    D, H = l2.shape
    flat = profile_statistics(eig_S.reshape(D * H, -1), l2.ravel(), t2.ravel(), parity_tolerance)
    out = {name: flat[name].reshape(D, H) for name in PROFILE_COLUMNS}
    out["delta"] = np.broadcast_to(deltas[:, None], (D, H))
    return out


def distance_profiles(factors, n: int, rotation: Rotation, deltas, *,
                      parity_tolerance: float = PARITY_TOLERANCE) -> dict[str, np.ndarray]:
    """PROFILE_COLUMNS of L_delta for every delta and head, each (D, H), plus "delta" (D, H).

    On the CPU batches of heads go to the single-threaded worker pool (compute.threads); elsewhere
    the batch is one call."""
    with Pool() as pool:
        return later_profiles(pool, factors, n, rotation, deltas, parity_tolerance=parity_tolerance)()
