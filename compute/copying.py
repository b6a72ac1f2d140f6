"""Copying scores of output-value circuits: how much of what a head writes is the token it read.

A head's full OV circuit W_U OV_h W_E^T is vocabulary x vocabulary; its nonzero eigenvalues are those of the
n x n matrix W_V W_E^T W_U W_O (the nonzero eigenvalues of AB and BA agree), so the vocabulary-sized matrix is
never formed: the model's N x N Gram G = W_E^T W_U is taken once, and each head's n x n product from it.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, Iterable

import numpy as np

from headforms.compute.threads import chunks

# G's column blocks, each its own product per row block of the vocabulary: a pool's single-threaded workers share the
# model's largest call (at the 24B shape, 131072 x 5120 by 131072 x 5120: 178 s on one thread), and G is the same
# whatever the number of workers.
GRAM_BLOCKS = 16


def unembedding_gram(blocks: Iterable[tuple[np.ndarray, np.ndarray]], submit: Callable[..., Future]) -> np.ndarray:
    """G = W_E^T W_U (N x N) as the sum of E_b^T U_b over `blocks` of vocabulary rows (E_b, U_b) of the embedding
    and unembedding, each block's GRAM_BLOCKS column blocks submitted (a pool's submit) while the next block is read:
    two blocks in memory at most."""
    gram, pending = None, []
    for e, u in blocks:
        e, u = np.asarray(e, dtype=np.float64), np.asarray(u, dtype=np.float64)
        gram = np.zeros((e.shape[1], u.shape[1])) if gram is None else gram
        added = []
        for i, columns in enumerate(chunks(u.shape[1], GRAM_BLOCKS)):
            if pending:  # the block before has added to these columns: no worker waits for a whole block's end
                pending[i].result()
            added.append(submit(_add_product, gram[:, columns], e, u[:, columns]))
        pending = added
    for future in pending:
        future.result()
    return gram


def _add_product(into: np.ndarray, e: np.ndarray, u: np.ndarray) -> None:
    """into += e^T u: one column block of one row block's product, added in place to G's view."""
    into += e.T @ u


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


def start_copying_scores(submit: Callable[..., Future], w_v: np.ndarray, w_o: np.ndarray, kv_index: np.ndarray,
                         gram: np.ndarray | None, pieces: int) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    """copying_scores in up to `pieces` pieces of whole key/value groups (a group's heads share W_V G), each
    submitted (a pool's submit); returns the function collecting them into copying_scores' two arrays."""
    kv = np.asarray(kv_index)
    present = np.unique(kv)
    groups = np.array_split(present, min(pieces, len(present)))
    started = []
    for group in groups:
        heads = np.flatnonzero(np.isin(kv, group))
        started.append((heads, submit(copying_scores, w_v[group], w_o[heads], np.searchsorted(group, kv[heads]),
                                      gram)))

    def collect() -> tuple[np.ndarray, np.ndarray]:
        copying, residual = np.empty(len(kv)), np.empty(len(kv))
        for heads, future in started:
            copying[heads], residual[heads] = future.result()
        return copying, residual

    return collect
