"""Head types of Figure 5: the sorted unit-length spectra of S projected on their three leading
singular directions (statistics.md section 7), k-means types with k chosen by silhouette, and
their agreement with parity (adjusted Rand index)."""
from __future__ import annotations

import warnings

import numpy as np
from scipy.cluster.vq import kmeans2
from scipy.spatial.distance import cdist

DIMENSIONS = 3
K_RANGE = range(2, 9)   # candidate numbers of types
RESTARTS = 10           # k-means runs per k (k-means++ starts); the lowest within-type sum of squares is kept


def unit_spectra(eig_S: np.ndarray) -> np.ndarray:
    """Each row sorted decreasing and divided by its Euclidean norm; a zero row stays NaN."""
    ordered = -np.sort(-eig_S, axis=1)
    norm = np.linalg.norm(ordered, axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, ordered / np.where(norm > 0, norm, 1.0), np.nan)


def projection(points: np.ndarray) -> np.ndarray:
    """Coordinates (H, c) of the rows on the c = min(3, H, width) leading right singular vectors (no centering,
    as the paper): fewer than three heads span fewer than three directions, so they get fewer coordinates.

    Singular vectors have no sign: each is flipped so that its largest-magnitude entry is positive."""
    _, _, vt = np.linalg.svd(points, full_matrices=False)
    directions = vt[:DIMENSIONS]
    lead = np.take_along_axis(directions, np.abs(directions).argmax(axis=1)[:, None], axis=1)
    return points @ (directions * np.sign(lead)).T


def distances(points: np.ndarray) -> np.ndarray:
    """The Euclidean distances between every two points (H, H), without the (H, H, 3) differences (1.5 GB at
    DeepSeek-V3's 7,808 heads)."""
    return cdist(points, points)


def silhouette(points: np.ndarray, labels: np.ndarray, apart: np.ndarray | None = None) -> np.ndarray:
    """Per-point silhouette (b - a) / max(a, b) with Euclidean distances (`apart`, when given, is
    `distances(points)`); 0 in a one-point cluster."""
    apart = distances(points) if apart is None else apart
    member = labels[:, None] == np.unique(labels)[None, :]                     # (H, k) one-hot
    sizes = member.sum(axis=0)
    totals = apart @ member                                                # (H, k) summed distances per cluster
    own = member.argmax(axis=1)
    rows = np.arange(len(points))
    with np.errstate(invalid="ignore", divide="ignore"):
        a = totals[rows, own] / (sizes[own] - 1)
        b = np.where(member, np.inf, totals / sizes).min(axis=1)
        return np.where(sizes[own] > 1, (b - a) / np.maximum(a, b), 0.0)


def adjusted_rand_index(first: np.ndarray, second: np.ndarray) -> float:
    """Hubert and Arabie's adjusted Rand index of two labelings, from their contingency table."""
    _, i = np.unique(first, return_inverse=True)
    _, j = np.unique(second, return_inverse=True)
    table = np.zeros((i.max() + 1, j.max() + 1))
    np.add.at(table, (i, j), 1)

    def pairs(x):
        return (x * (x - 1) / 2).sum()

    cells, rows, cols, total = pairs(table), pairs(table.sum(axis=1)), pairs(table.sum(axis=0)), pairs(np.array([len(i)]))
    expected = rows * cols / total
    top = (rows + cols) / 2
    return 1.0 if top == expected else float((cells - expected) / (top - expected))


def kmeans(points: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Types 0..k-1 (0 the largest): the best of RESTARTS seeded k-means++ runs by within-type sum of squares."""
    best, best_inertia = None, np.inf
    for restart in range(RESTARTS):
        with warnings.catch_warnings():  # coinciding heads leave a type empty: fewer types, handled by head_types
            warnings.simplefilter("ignore")
            centres, labels = kmeans2(points, k, minit="++", seed=np.random.default_rng([seed, k, restart]),
                                     check_finite=False)  # finite: head_types keeps heads with a nonzero S
        inertia = ((points - centres[labels]) ** 2).sum()
        if inertia < best_inertia:
            best, best_inertia = labels, inertia
    sizes = np.bincount(best, minlength=k)
    rank = np.empty(k, dtype=int)
    rank[np.lexsort((np.arange(k), -sizes))] = np.arange(k)
    return rank[best]


def head_types(points: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Types and per-point silhouettes for the k of K_RANGE (below the number of points) with the best mean silhouette."""
    best, apart = None, distances(points)
    for k in K_RANGE:
        if k >= len(points):
            break
        labels = kmeans(points, k, seed)
        if len(np.unique(labels)) < 2:
            continue
        scores = silhouette(points, labels, apart)
        if best is None or scores.mean() > best[1].mean():
            best = (labels, scores)
    if best is None:   # too few distinct points for two types
        return np.zeros(len(points), dtype=int), np.zeros(len(points))
    return best
