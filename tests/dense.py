"""Independent references for tests: statistics straight from the dense N x N form with numpy."""
import numpy as np


def dense_reference(L: np.ndarray, n: int) -> dict:
    """Every statistic straight from the N x N matrix, with plain numpy, one head."""
    S, T = (L + L.T) / 2, (L - L.T) / 2
    eig = np.linalg.eigvalsh(S)
    tol = 1e-9 * np.abs(eig).max()
    plus = np.sort(eig[eig > tol])[::-1]
    minus = np.sort(-eig[eig < -tol])[::-1]
    m = max(len(plus), len(minus))
    plus, minus = np.pad(plus, (0, m - len(plus))), np.pad(minus, (0, m - len(minus)))
    l2, s2, t2 = (L**2).sum(), (S**2).sum(), (T**2).sum()
    u = plus - minus
    sv = np.linalg.svd(L, compute_uv=False)
    rho = np.linalg.norm(minus) / np.linalg.norm(plus)
    c_sym, d_sym = (u[u > 0] ** 2).sum() / s2, (u[u < 0] ** 2).sum() / s2
    sigma = np.sort(np.linalg.eigvals(T).imag)[::-1][:n]
    sigma = np.pad(sigma, (0, n - len(sigma)))  # N < n: the ambient zeros
    gm = np.sqrt(plus[:n] * minus[:n]) if m >= n else np.pad(np.sqrt(plus * minus), (0, n - m))
    abs_s = np.sort(np.abs(eig))[::-1][: 2 * n]
    sv_t = np.linalg.svd(T, compute_uv=False)[: 2 * n]
    bound = 1 - abs(1 - rho) / np.sqrt(1 + rho**2)
    pairing = 1 - np.linalg.norm(u) / np.sqrt(s2)
    return {
        "frobenius": np.sqrt(l2), "n_pos": (eig > tol).sum(), "n_neg": (eig < -tol).sum(),
        "symmetric_energy": s2 / l2, "a": t2 / l2, "b": 2 * plus @ minus / l2,
        "c": (u[u > 0] ** 2).sum() / l2, "d": (u[u < 0] ** 2).sum() / l2,
        "b_sym": 2 * plus @ minus / s2, "c_sym": c_sym, "d_sym": d_sym,
        "pairing": pairing, "rho": rho, "pairing_bound": bound, "pairing_gap": bound - pairing,
        "lobe_departure": np.linalg.norm(minus - rho * plus) / np.linalg.norm(minus),
        "trace_ratio": abs(np.trace(L)) / np.sqrt(l2),
        "participation_ratio": (sv**2).sum() ** 2 / (sv**4).sum(),
        "stable_rank": (sv**2).sum() / sv[0] ** 2, "leading_share": sv[0] ** 2 / (sv**2).sum(),
        "sigma_lambda_correlation": np.corrcoef(abs_s, sv_t)[0, 1],
        "geometric_mean_error": np.linalg.norm(sigma - gm) / np.linalg.norm(sigma),
    }
