"""Numbers as tables, titles and the report print them: significant digits chosen per column, so that values
that differ print differently (a mode ratio of 1.005 stays 1.005 beside 1.000)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

AT_LEAST, AT_MOST = 3, 6  # significant digits: what a figure needs to be read, and the most a column may take


def rounded(values: np.ndarray, digits: int) -> np.ndarray:
    """values rounded to `digits` significant digits (zeros and NaN as they are)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        exponent = np.floor(np.log10(np.abs(values)))
    scale = 10.0 ** (digits - 1 - np.where(np.isfinite(exponent), exponent, 0))
    return np.round(values * scale) / scale


def significant_digits(columns: Sequence[Sequence[float | None]], at_least: int = AT_LEAST,
                       at_most: int = AT_MOST) -> int:
    """The fewest significant digits, from at_least to at_most, at which values that differ still print
    differently: within each column, and within each row across the columns (an estimate and the ends of
    its interval, given as three columns of the same length). NULLs are ignored."""
    if not columns:
        return at_least
    table = np.array([[np.nan if v is None else v for v in column] for column in columns], dtype=float)
    for digits in range(at_least, at_most):
        short = rounded(table, digits)
        columns_kept = all(np.unique(row[np.isfinite(row)]).size == np.unique(cut[np.isfinite(row)]).size
                           for row, cut in zip(table, short))
        pairs = [(i, j) for i in range(len(table)) for j in range(i + 1, len(table))]
        rows_kept = not any(((table[i] != table[j]) & (short[i] == short[j])).any() for i, j in pairs)
        if columns_kept and rows_kept:
            return digits
    return at_most


def decimals(value: float, digits: int) -> int:
    """Decimals that print `digits` significant digits of value (a zero as digits - 1 decimals, as 0.5 would be)."""
    return max(digits - 1 - int(np.floor(np.log10(abs(value)))) if value else digits - 1, 0)


def shown(values: Sequence[float | None], digits: int) -> list[str]:
    """Each value with `digits` significant digits (trailing zeros kept; more integer digits where it is larger),
    NULL as ''."""
    return ["" if v is None else f"{v:.{decimals(v, digits)}f}" for v in values]


def interval(value: float | None, low: float | None, high: float | None, digits: int) -> str:
    """'value [low, high]' with one number of decimals: those of `digits` significant digits of the value (of the
    ends without one), more while two of the three that differ would print alike (so 1.005 [1.001, 1.009], never
    1.00 [1.00, 1.01]); '[low, high]' without a value, the value alone where the interval is undefined."""
    present = [v for v in (value, low, high) if v is not None]
    places = decimals(value, digits) if value is not None else max((decimals(v, digits) for v in present), default=0)
    while len({f"{v:.{places}f}" for v in present}) < len(set(present)) and places < 15:
        places += 1
    value_text = "" if value is None else f"{value:.{places}f}"
    if low is None or high is None:
        return value_text
    return f"{value_text} [{low:.{places}f}, {high:.{places}f}]".lstrip()
