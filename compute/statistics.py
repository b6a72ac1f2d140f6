"""The paper's per-head statistics (statistics.md section 3), vectorised over heads.

Undefined values (a zero form, an empty lobe) come out as NaN, stored as NULL.
"""
from __future__ import annotations

import numpy as np

from headforms.compute.spectra import Spectra

PARITY_TOLERANCE = 1 / 50
ZERO_TOLERANCE = 1e-9  # relative to max |eig(S)|: smaller eigenvalues count as zero


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, NaN where den is zero (an undefined statistic, not a crash)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def lobes(eig_S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """lambda_+ and lambda_- (absolute values), decreasing and zero-padded to equal length.

    eig_S is sorted decreasing, so the positive eigenvalues lead and the negative ones,
    read backwards, lead too; eigenvalues within the zero tolerance are dropped.
    """
    tol = ZERO_TOLERANCE * np.abs(eig_S).max(axis=1, keepdims=True)
    plus = np.where(eig_S > tol, eig_S, 0.0)
    minus = np.where(eig_S < -tol, -eig_S, 0.0)[:, ::-1]
    return plus, minus


def pairing(eig_S: np.ndarray) -> np.ndarray:
    """1 - ||lambda_+ - lambda_-|| / ||S|| (Figures 11 and 14)."""
    plus, minus = lobes(eig_S)
    return 1 - _ratio(np.linalg.norm(plus - minus, axis=1), np.linalg.norm(eig_S, axis=1))


def symmetric_energy(eig_S: np.ndarray, frobenius: np.ndarray) -> np.ndarray:
    """||S||^2 / ||L||^2 (Figure 13)."""
    return _ratio((eig_S**2).sum(axis=1), frobenius**2)


def parity(c_sym: np.ndarray, d_sym: np.ndarray, tolerance: float = PARITY_TOLERANCE) -> np.ndarray:
    """Table 2's types: 'II' if c_sym + d_sym <= tolerance, else 'I+' if c_sym > d_sym, else 'I-'."""
    kind = np.where(c_sym + d_sym <= tolerance, "II", np.where(c_sym > d_sym, "I+", "I-"))
    return np.where(np.isnan(c_sym) | np.isnan(d_sym), None, kind).astype(object)


def profile_statistics(eig_S: np.ndarray, l2: np.ndarray, t2: np.ndarray,
                       parity_tolerance: float = PARITY_TOLERANCE) -> dict[str, np.ndarray]:
    """||L||, symmetric energy, profile, symmetric profile, parity and pairing from eig(S), ||L||^2, ||T||^2.

    Shared by the heads (L) and their distance profiles (L_delta), so both follow one definition."""
    s2 = (eig_S**2).sum(axis=1)         # ||S||^2
    plus, minus = lobes(eig_S)
    u = plus - minus
    cross, c_num, d_num = _profile_numerators(plus, minus)
    c_sym, d_sym = _ratio(c_num, s2), _ratio(d_num, s2)
    return {
        "frobenius": np.sqrt(l2),
        "symmetric_energy": _ratio(s2, l2),
        "a": _ratio(t2, l2),
        "b": _ratio(cross, l2),
        "c": _ratio(c_num, l2),
        "d": _ratio(d_num, l2),
        "b_sym": _ratio(cross, s2),
        "c_sym": c_sym,
        "d_sym": d_sym,
        "parity": parity(c_sym, d_sym, parity_tolerance),
        "pairing": 1 - _ratio(np.linalg.norm(u, axis=1), np.sqrt(s2)),
    }


def _profile_numerators(plus: np.ndarray, minus: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """||L||^2 (b, c, d): 2<lambda_+, lambda_->, and sum u^2 over u = lambda_+ - lambda_- > 0 and < 0."""
    u = plus - minus
    return 2 * (plus * minus).sum(axis=1), np.where(u > 0, u**2, 0.0).sum(axis=1), np.where(u < 0, u**2, 0.0).sum(axis=1)


def profile(eig_S: np.ndarray, frobenius: np.ndarray) -> np.ndarray:
    """The profile (a, b, c, d) as (H, 4) from S's eigenvalues and ||L||, with ||T||^2 = ||L||^2 - ||S||^2."""
    l2 = frobenius**2
    stats = profile_statistics(eig_S, l2, l2 - (eig_S**2).sum(axis=1))
    return np.stack([stats[k] for k in "abcd"], axis=1)


def head_statistics(sp: Spectra, d_model: int, parity_tolerance: float = PARITY_TOLERANCE) -> dict[str, np.ndarray]:
    """Every per-head column of the `heads` table that the spectra determine."""
    eig_S, sv_L = sp.eig_S, sp.sv_L
    r = eig_S.shape[1]
    tol = ZERO_TOLERANCE * np.abs(eig_S).max(axis=1)
    n_pos = (eig_S > tol[:, None]).sum(axis=1)
    n_neg = (eig_S < -tol[:, None]).sum(axis=1)  # a zero form (tol = 0) has neither

    l2 = (sv_L**2).sum(axis=1)          # ||L||^2
    shared = profile_statistics(eig_S, l2, (sp.sv_T**2).sum(axis=1), parity_tolerance)
    plus, minus = lobes(eig_S)
    norm_plus, norm_minus = np.linalg.norm(plus, axis=1), np.linalg.norm(minus, axis=1)
    rho = _ratio(norm_minus, norm_plus)
    bound = 1 - np.abs(1 - rho) / np.sqrt(1 + rho**2)

    n = sp.sigma_T.shape[1]
    sigma = sp.sigma_T
    geometric = np.sqrt(plus[:, :n] * minus[:, :n])
    abs_S = np.sort(np.abs(eig_S), axis=1)[:, ::-1]
    stats = {
        "frobenius": shared["frobenius"],
        "n_pos": n_pos,
        "n_neg": n_neg,
        "n_zero": r - n_pos - n_neg,
        "n_zero_ambient": d_model - n_pos - n_neg,
        **{k: shared[k] for k in ("symmetric_energy", "a", "b", "c", "d", "b_sym", "c_sym", "d_sym", "parity",
                                   "pairing")},
        "rho": rho,
        "pairing_bound": bound,
        "pairing_gap": bound - shared["pairing"],
        "lobe_departure": _ratio(np.linalg.norm(minus - rho[:, None] * plus, axis=1), norm_minus),
        "trace_ratio": _ratio(np.abs(eig_S.sum(axis=1)), np.sqrt(l2)),
        "participation_ratio": _ratio(l2**2, (sv_L**4).sum(axis=1)),
        "stable_rank": _ratio(l2, sv_L[:, 0] ** 2),
        "leading_share": _ratio(sv_L[:, 0] ** 2, l2),
        "sigma_lambda_correlation": _correlation(abs_S, sp.sv_T),
        "geometric_mean_error": _ratio(np.linalg.norm(sigma - geometric, axis=1), np.linalg.norm(sigma, axis=1)),
    }
    stats["theta_distance"], stats["theta_position"] = theta(np.stack([stats[k] for k in "abcd"], axis=1))
    return stats


# Observation 2's set Theta = {a = b, cd = 0}: two segments m + t v, t in [-1/2, 0], through the random midpoint m.
THETA_MIDPOINT = np.array([0.5, 0.5, 0.0, 0.0])
THETA_DIRECTIONS = np.array([[1.0, 1.0, -2.0, 0.0], [1.0, 1.0, 0.0, -2.0]])


def theta(profiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """theta_distance (to the nearer segment of Theta) and theta_position (that point's distance from m), rows of (H, 4).

    Closed form (statistics.md section 7): project on each segment's line, clip t to [-1/2, 0]."""
    offset = profiles - THETA_MIDPOINT                                        # (H, 4)
    norms2 = (THETA_DIRECTIONS**2).sum(axis=1)                                # |v|^2 = 6
    t = np.clip(offset @ THETA_DIRECTIONS.T / norms2, -0.5, 0.0)              # (H, 2)
    gaps = np.linalg.norm(offset[:, None, :] - t[:, :, None] * THETA_DIRECTIONS, axis=2)
    nearer = np.argmin(np.where(np.isnan(gaps), np.inf, gaps), axis=1)[:, None]
    distance = np.take_along_axis(gaps, nearer, axis=1)[:, 0]
    position = np.abs(np.take_along_axis(t, nearer, axis=1)[:, 0]) * np.sqrt(norms2[nearer[:, 0]])
    return distance, np.where(np.isnan(distance), np.nan, position)


def _correlation(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Pearson correlation; NaN where a row is constant."""
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    return _ratio((xc * yc).sum(axis=1), np.sqrt((xc**2).sum(axis=1) * (yc**2).sum(axis=1)))


def fit_samples(sp: Spectra, head_dim: int) -> dict[str, np.ndarray]:
    """The four positive samples of section 4, (H, n) each, NaN where a value is missing.

    L_abs: the n largest |lambda(L)|; S_pos, S_neg: the lobes; T: sigma(T). Values within
    the zero tolerance (relative to ||L||_2) are missing, so a lobe shorter than n is NaN-padded.
    """
    plus, minus = lobes(sp.eig_S)
    scale = sp.sv_L[:, :1]
    tol = ZERO_TOLERANCE * np.where(scale > 0, scale, np.inf)

    def positive(x: np.ndarray) -> np.ndarray:
        x = np.pad(x[:, :head_dim], ((0, 0), (0, max(head_dim - x.shape[1], 0))), constant_values=np.nan)
        return np.where(x > tol, x, np.nan)  # N < 2n (one head of width n = N, say): sigma(T) has N/2 < n values

    return {
        "L_abs": positive(np.abs(sp.eig_L)),
        "S_pos": positive(plus),
        "S_neg": positive(minus),
        "T": positive(sp.sigma_T),
    }
