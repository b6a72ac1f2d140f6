"""Percentile bootstrap intervals of per-model figures (statistics.md section 7), vectorised over resamples.

A resample draws whole groups with replacement (a model's layers, or single heads) and takes every
row of each drawn group; each figure is then an aggregate over the rows of every resample at once.
Aggregates follow SQL: NaN is NULL, ignored by median and avg.
"""
from __future__ import annotations

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000


def resample_rows(groups: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples, G * m) row indices: G groups drawn with replacement from `groups` (G, m), all rows of each."""
    drawn = rng.integers(0, len(groups), size=(resamples, len(groups)))
    return groups[drawn].reshape(resamples, -1)


def median(values: np.ndarray) -> np.ndarray:
    """Row-wise median ignoring NaN, the middle two averaged (DuckDB's median of DOUBLE); NaN for an empty row.

    Without NaN (a figure defined for every head, the common case) the upper middle value is found by selection
    (np.partition, linear time) and the lower one, for an even width, is the largest value before it: the same
    two values as a sort gives, so the same median."""
    width = values.shape[-1]
    if width and not np.isnan(values).any():
        half = width // 2
        chosen = np.partition(values, half, axis=-1)
        low = chosen[..., :half].max(axis=-1) if width % 2 == 0 else chosen[..., half]
        return (low + chosen[..., half]) / 2
    ordered = np.sort(values, axis=-1)                       # NaN sorts last
    count = (~np.isnan(values)).sum(axis=-1, keepdims=True)
    low = np.take_along_axis(ordered, np.maximum(count - 1, 0) // 2, axis=-1)
    high = np.take_along_axis(ordered, count // 2 - (count == 0), axis=-1)
    return np.where(count > 0, (low + high) / 2, np.nan)[..., 0]


def mean(values: np.ndarray) -> np.ndarray:
    """Row-wise mean ignoring NaN (SQL avg); NaN for an empty row."""
    count = (~np.isnan(values)).sum(axis=-1)
    total = np.where(np.isnan(values), 0.0, values).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def percent(values: np.ndarray) -> np.ndarray:
    """round(100 * sum / count(*), 1), half away from zero, as the parity views compute a type's share."""
    share = 100 * values.sum(axis=-1) / values.shape[-1]
    return np.floor(share * 10 + 0.5) / 10


AGGREGATES = {"median": median, "mean": mean, "percent": percent}


def intervals(values: np.ndarray, aggregate: str, groups: np.ndarray, resamples: int,
              seed: int | tuple[int, ...]) -> np.ndarray:
    """(F, 3): estimate, low, high of the 95% percentile interval of each figure.

    values: (rows, F), one column per figure, all aggregated the same way; groups: (G, m) row
    indices resampled together. The same resamples serve every figure (one seed); one figure at a
    time keeps the (resamples, rows) working array small for large models. A single group (one
    layer, one head) cannot vary between resamples: its bounds are NaN (undefined), not a zero-width interval."""
    rows = resample_rows(groups, resamples, np.random.default_rng(seed))
    aggregate_rows = AGGREGATES[aggregate]
    estimate = aggregate_rows(values.T)                                                  # (F,)
    if len(groups) < 2:
        return np.column_stack([estimate, np.full((len(estimate), 2), np.nan)])
    replicates = np.stack([aggregate_rows(column[rows]) for column in values.T])        # (F, B)
    return np.column_stack([estimate, *bounds(replicates)])


def bounds(replicates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The percentile interval's (low, high) of each row of replicates (F, B), NaN ignored; NaN bounds for a figure
    undefined on every resample. Such rows are left out of np.nanquantile rather than its warning silenced: the
    warnings module's filters are global, and this runs on the pool's threads beside other code."""
    alpha = (1 - LEVEL) / 2
    low, high = np.full(len(replicates), np.nan), np.full(len(replicates), np.nan)
    defined = ~np.isnan(replicates).all(axis=1)
    if defined.any():
        low[defined], high[defined] = np.nanquantile(replicates[defined], [alpha, 1 - alpha], axis=1)
    return low, high
