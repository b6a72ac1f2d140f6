"""Batched maximum-likelihood fits (location fixed at 0) of gamma, lognormal, Weibull and
generalized gamma to many small positive samples at once, with fit-quality statistics.

Every routine works on all rows together (NaN-padded to a common length); the only Python
loops are over a bounded number of Newton/bisection iterations, the 70 gengamma grid powers and
the terms of fixed-length series.

Generalized gamma in Prentice's (1974) parametrisation: log x = mu + sigma w, where w has the
log-density -log(2 pi) / 2 - (w^2 / 2) h(q w) - R(q^-2), h(u) = 2 (e^u - 1 - u) / u^2 and R Stirling's
remainder of log Gamma, continuous through q = 0 (h = 1, R = 0: the lognormal). Gamma is q = sigma,
Weibull q = 1. scipy's gengamma(a, c, scale) is a = q^-2, c = q / sigma, log scale = mu + 2 sigma log|q| / q;
a -> inf, c -> 0 (the lognormal) is an interior point here, q = 0.

Fit status. A fit is `ok` when its likelihood has an interior maximum, `failed` when the sample
cannot be fitted (fewer than 3 values, a non-positive or non-finite value, all values equal), and
`boundary` when the likelihood is maximised only in a limit at the edge of the parameter space.
Gamma, lognormal and Weibull maxima are always interior. The generalized gamma has two limit laws
at the edge of its space, |q| -> inf (a -> 0, |c| -> inf, a c -> beta): the power-function law
beta x^(beta-1) / b^beta on (0, b] (q > 0) and the Pareto law beta b^beta / x^(beta+1) on [b, inf) (q < 0)
(scipy's powerlaw(beta, scale=b) and pareto(beta, scale=b); maximum likelihood: b = max x, resp. min x,
beta = n / sum |log(x / b)|). Rule: the gengamma fit is `boundary`, its `limit_law` named, when the
more likely of these laws is at least as likely as the best interior point found, or when that point
lies within 5% of the search's edge |c| std(log x) = 1e4 (the likelihood still rising towards the
limit): the supremum is then the limit's, approached but not attained. A boundary fit stores the limit
law's log-likelihood, KS distance and histogram error; its parameters and mode are NaN.
An `ok` gengamma fit always has its Prentice (mu, sigma, q); its natural (a, c, scale) are NaN where
they are not estimates: where a likelihood-ratio test does not reject q = 0 (the lognormal) at 5%,
q's 95% interval holds 0, over which a = q^-2, c and the scale are unbounded (or where the scale
overflows a double).
"""
from typing import NamedTuple

import numpy as np
from scipy import special as sc

FAMILIES = ("gamma", "lognormal", "weibull", "gengamma")
N_PARAMS = {"gamma": 2, "lognormal": 2, "weibull": 2, "gengamma": 3}  # free parameters, location fixed at 0
STATUSES = ("ok", "boundary", "failed")
LIMIT_LAWS = ("powerlaw", "pareto")  # a boundary gengamma's limit as q -> +inf, -inf
HIST_BINS = 20
# Profile-likelihood search for the gengamma power c, in units of 1 / std(log x) (Weibull's
# c is about 1.28 of them): log-spaced, both signs, from near-lognormal (a ~ 1e4) to a ~ 1e-4.
GENGAMMA_GRID = np.geomspace(1e-2, 1e4, 35)
MAX_ITERS = 60
GRID_BLOCK = 1 << 18  # values per array when the profile is evaluated on blocks of grid columns
EDGE_SHARE = 0.95  # a gengamma fit past this share of the grid's outer edge is heading for its limit law
NATURAL_LR = 3.841458820694124  # chi-square(1) 95% quantile: the LR test of q = 0 behind natural parameters
PRENTICE = ("prentice_mu", "prentice_sigma", "prentice_q")
_LOG_MAX = 700.0  # |log scale| beyond this is not representable: such c are excluded
_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)
_PHI_SERIES = 1.0 / np.array([float(np.prod(np.arange(1, j + 5))) for j in range(20)])  # 1/(j+4)!
_STIRLING = np.array([1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156])  # q^(4k-2)
_SERIES_Q = 0.3  # below this |q| (a > 11) R comes from Stirling's series, to 1e-16


def _trigamma(x):
    """psi'(x) as scipy's polygamma(1, x) computes it, zeta(2, x) (bit for bit), without polygamma's wrapper
    also evaluating digamma at every x only to discard it."""
    return sc.zeta(2.0, x)


def _phi(u):
    """phi_k(u) = (e^u - sum_{j<k} u^j / j!) / u^k for k = 0..4, accurate through u = 0 (series
    below |u| = 2, then the downward recurrence; the upward one from e^u beyond)."""
    small = np.abs(u) < 2.0
    us = np.where(small, u, 0.0)
    p4 = np.zeros_like(us)
    for coef in _PHI_SERIES[::-1]:
        p4 = p4 * us + coef
    series = [p4]
    for k in (3, 2, 1, 0):
        series.insert(0, 1.0 / np.prod(np.arange(1, k + 1)) + us * series[0])
    ub = np.where(small, 1.0, u)
    up = [np.exp(ub)]
    for k in range(4):
        up.append((up[-1] - 1.0 / np.prod(np.arange(1, k + 1))) / ub)
    return [np.where(small, s, b) for s, b in zip(series, up)]


def _stirling(q):
    """R(q^-2) = log Gamma(a) - (a - 1/2) log a + a - log(2 pi) / 2 at a = q^-2, and its first two
    derivatives in q; 0 at q = 0 (Stirling's series near 0, digamma and trigamma beyond)."""
    small = np.abs(q) < _SERIES_Q
    qs = np.where(small, q, 0.0)
    k = np.arange(1, len(_STIRLING) + 1)
    powers = qs[..., None] ** (4 * k - 4)
    series = (np.sum(_STIRLING * powers, -1) * qs**2,
              np.sum((4 * k - 2) * _STIRLING * powers, -1) * qs,
              np.sum((4 * k - 2) * (4 * k - 3) * _STIRLING * powers, -1))
    qb = np.where(small, 1.0, q)
    a = qb**-2
    r = sc.gammaln(a) - (a - 0.5) * np.log(a) + a - _LOG_SQRT_2PI
    r1 = sc.digamma(a) - np.log(a) + 0.5 / a
    r2 = _trigamma(a) - 1.0 / a - 0.5 / a**2
    beyond = (r, -2.0 * r1 / qb**3, 4.0 * r2 / qb**6 + 6.0 * r1 / qb**4)
    return [np.where(small, s, b) for s, b in zip(series, beyond)]


def _prentice(theta, logs, valid, n, derivatives=False):
    """Log-likelihood of Prentice's generalized gamma at theta = (mu, log sigma, q) (each (M,)), and
    with `derivatives` its gradient (M, 3) and Hessian (M, 3, 3) in (mu, log sigma, q)."""
    mu, tau, q = (t[:, None] for t in theta)
    sigma = np.exp(tau)
    w = np.where(valid, (logs - mu) / sigma, 0.0)
    p0, p1, p2, p3, p4 = _phi(q * w)
    r, r1, r2 = _stirling(theta[2])
    ll = np.where(valid, -logs - tau - w**2 * p2, 0.0).sum(1) - n * (_LOG_SQRT_2PI + r)
    if not derivatives:
        return ll
    total = lambda v: np.where(valid, v, 0.0).sum(1)
    g_w, g_ww = w * p1, p0                                # dG/dw, d2G/dw2 of G = w^2 phi_2(q w)
    g_q, g_wq, g_qq = w**3 * (p2 - 2 * p3), w**2 * (p1 - p2), w**4 * (p2 - 4 * p3 + 6 * p4)
    s = sigma[:, 0]
    grad = np.stack([total(g_w) / s, total(w * g_w) - n, -total(g_q) - n * r1], axis=1)
    h_mt = -total(w * g_ww + g_w) / s
    h_mq, h_tq = total(g_wq) / s, total(w * g_wq)
    hess = np.stack([np.stack([-total(g_ww) / s**2, h_mt, h_mq], -1),
                     np.stack([h_mt, -total(w * g_w + w**2 * g_ww), h_tq], -1),
                     np.stack([h_mq, h_tq, -total(g_qq) - n * r2], -1)], axis=1)
    return ll, grad, hess


def _polish(theta, logs, valid, n, c_max):
    """Maximise the Prentice log-likelihood from theta (mu, log sigma, q), never downhill and within the
    search's edge |q / sigma| <= c_max: Newton, shifted to an ascent direction where the Hessian is not
    negative definite, halving steps that lose likelihood; a row is done once its step is below 1e-8
    (taken whole: Newton's next error is ~1e-16) or no step of its direction gains. Each iteration and each
    halving evaluates only the rows still going: one slow row does not keep a layer's batch computing."""
    theta = np.array(theta, dtype=np.float64)
    ll, c_max = _prentice(theta, logs, valid, n), np.broadcast_to(c_max, theta[0].shape)
    done = ~np.isfinite(ll) | (np.abs(theta[2]) >= EDGE_SHARE * c_max * np.exp(theta[1]))  # bound for a limit
    for _ in range(MAX_ITERS):
        rows = np.flatnonzero(~done)
        if not rows.size:
            break
        at, lg, ok, m, before, edge = theta[:, rows], logs[rows], valid[rows], n[rows], ll[rows], c_max[rows]
        _, grad, hess = _prentice(at, lg, ok, m, derivatives=True)
        finite = np.all(np.isfinite(hess), axis=(1, 2)) & np.all(np.isfinite(grad), axis=1)
        grad, hess = np.where(finite[:, None], grad, 0.0), np.where(finite[:, None, None], hess, -np.eye(3))
        top = np.linalg.eigvalsh(hess)[:, -1]
        shift = np.where(top < 0, 0.0, top + 1e-8 * (1.0 + np.abs(hess).max(axis=(1, 2))))
        step = np.linalg.solve(hess - shift[:, None, None] * np.eye(3), -grad[..., None])[..., 0]
        step = np.where(finite[:, None], step, 0.0).T
        last = np.max(np.abs(step) / (1.0 + np.abs(at)), axis=0) < 1e-8
        t, new, accept = np.ones(len(rows)), before.copy(), ~finite
        for _ in range(40):
            trying = np.flatnonzero(~accept)
            if not trying.size:
                break
            trial = at[:, trying] + t[trying] * step[:, trying]
            value = _prentice(trial, lg[trying], ok[trying], m[trying])
            inside = np.abs(trial[2]) <= edge[trying] * np.exp(trial[1])
            gains = inside & ((value >= before[trying]) | last[trying] & np.isfinite(value))
            new[trying], accept[trying] = value, gains
            t[trying] = np.where(gains, t[trying], t[trying] / 2.0)
        t = np.where(accept & finite, t, 0.0)
        theta[:, rows], ll[rows] = at + t * step, np.where(t > 0, new, before)
        done[rows] = ~finite | last | (t == 0.0)
    return theta


def _gamma_shape(s: np.ndarray) -> np.ndarray:
    """Gamma MLE shape k solving log k - digamma(k) = s > 0 (Newton in log k from Thom's
    approximation)."""
    t = np.log((3.0 - s + np.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s))
    for _ in range(3):  # Thom's approximation is within 1.5%: 3 steps reach full precision
        k = np.exp(t)
        t = t - (t - sc.digamma(k) - s) / (1.0 - k * _trigamma(k))
    return np.exp(t)


def _tilt(c, lc, valid, n, moments=False):
    """For powers c of shape (M, K): s = log mean exp(c * lc) over the valid entries, accurate
    as c -> 0 (with lc the centred logs, s = log mean(y) - mean(log y) for y = x^c, the gamma
    statistic of the transformed sample); with `moments`, also ds/dc and d2s/dc2, the mean and
    variance of lc under weights x^c."""
    z = c[:, :, None] * lc[:, None, :]
    top = np.max(np.where(valid[:, None, :], z, -np.inf), axis=-1)
    dev = np.where(valid[:, None, :], np.expm1(z - top[..., None]), 0.0)
    s = top + np.log1p(dev.sum(-1) / n[:, None])
    if not moments:
        return s
    w = dev + valid[:, None, :]
    w /= w.sum(-1, keepdims=True)
    m1 = np.einsum("mkj,mj->mk", w, lc)
    return s, m1, np.einsum("mkj,mkj->mk", w, (lc[:, None, :] - m1[..., None]) ** 2)


def _gengamma_profile(c, lc, valid, n, lbar):
    """Profile of the gengamma log-likelihood per value over power c (shape (M, K)).

    For fixed c, y = x^c is gamma(a, scale^c), so a and scale are the gamma MLE of y; the
    result adds the Jacobian log|c| + (c-1) mean(log x).  Returns (loglik / n, a, log scale),
    with -inf where the fit is degenerate or its scale not representable."""
    s = _tilt(c, lc, valid, n)
    a = _gamma_shape(s)
    log_scale = lbar[:, None] + (s - np.log(a)) / c
    ll = a * np.log(a) - a - sc.gammaln(a) - a * s + np.log(np.abs(c)) - lbar[:, None]
    ok = np.isfinite(ll) & (np.abs(log_scale) < _LOG_MAX)
    return np.where(ok, ll, -np.inf), a, log_scale


def _weibull_slope(c, lc, valid, n):
    """Derivative in c of the Weibull profile log-likelihood per value, 1/c - ds/dc, and its
    (negative) derivative."""
    _, m1, var = _tilt(c[:, None], lc, valid, n, moments=True)
    return 1.0 / c - m1[:, 0], -1.0 / c**2 - var[:, 0]


def _gengamma_slope(c, lc, valid, n):
    """Derivative in c of the gengamma profile log-likelihood per value, 1/c - a ds/dc (the
    a-dependence drops out at the gamma MLE), and its derivative."""
    s, m1, var = (v[:, 0] for v in _tilt(c[:, None], lc, valid, n, moments=True))
    a = _gamma_shape(s)
    da = m1 / (1.0 / a - _trigamma(a))
    return 1.0 / c - a * m1, -1.0 / c**2 - a * var - da * m1


def _climb(slope, c, lo, hi):
    """Maximiser in [lo, hi] of a profile from its slope(c) -> (derivative, second derivative):
    Newton, with the bracket tightened from the slope's sign at every iterate and bisection
    (doubling while hi is infinite) whenever Newton leaves it or heads downhill."""
    for _ in range(MAX_ITERS):
        d, dd = slope(c)
        lo, hi = np.where(d > 0, c, lo), np.where(d > 0, hi, c)
        newton = c - d / dd
        bisect = np.where(np.isinf(hi), 2.0 * lo, (lo + hi) / 2.0)
        new = np.where((dd < 0) & (newton >= lo) & (newton <= hi), newton, bisect)
        if np.all(np.abs(new - c) <= 1e-9 * np.abs(c)):  # Newton: next error ~1e-18
            return new
        c = new
    return c


def _weibull_shape(lc, valid, n, sigma):
    """Weibull MLE shape: the root of the (monotone) profile equation 1/c = mean of log x under
    weights x^c, started from sigma = std(log x) as for a Gumbel variable."""
    c = np.pi / (np.sqrt(6.0) * sigma)
    slope = lambda c: _weibull_slope(c, lc, valid, n)
    return _climb(slope, c, np.zeros_like(c), np.full_like(c, np.inf))


def _gengamma_power(lc, valid, n, lbar, sigma, starts):
    """Gengamma power c maximising the profile likelihood: the best point of a grid over both
    signs, refined by `_climb` between its neighbours; the grid point and the starting powers
    (columns of `starts`) stay candidates, so the result never loses to a start."""
    M = len(lc)
    unit = np.concatenate([-GENGAMMA_GRID[::-1], GENGAMMA_GRID])
    grid = unit / sigma[:, None]
    # the grid in blocks of columns: a few (M, k, m) arrays of at most GRID_BLOCK values at a time
    k = max(1, GRID_BLOCK // lc.size)
    f = np.concatenate([_gengamma_profile(grid[:, j:j + k], lc, valid, n, lbar)[0] for j in range(0, unit.size, k)],
                       axis=1)
    rows, best = np.arange(M), np.argmax(f, axis=1)
    j = np.clip(best, 1, unit.size - 2)
    slope = lambda c: _gengamma_slope(c, lc, valid, n)
    peak = _climb(slope, grid[rows, best], grid[rows, j - 1], grid[rows, j + 1])
    cand = np.concatenate([grid[rows, best][:, None], peak[:, None], starts], axis=1)
    ll = _gengamma_profile(cand, lc, valid, n, lbar)[0]
    return cand[rows, np.argmax(ll, axis=1)]


def _std_logpdf(family, z, p, q):
    """scipy's log density of the standardised variable z = x / scale (p, q: shape parameters; the generalized
    gamma's in Prentice's form, p = sigma, q = q, scale = e^mu, stable through q = 0)."""
    if family == "gamma":
        return sc.xlogy(p - 1.0, z) - z - sc.gammaln(p)
    if family == "lognormal":
        return -np.log(z) ** 2 / (2.0 * p**2) - np.log(p * z) - _LOG_SQRT_2PI
    if family == "weibull":
        return np.log(p) + sc.xlogy(p - 1.0, z) - z**p
    if family == "powerlaw":
        return np.where(z <= 1.0, np.log(p) + sc.xlogy(p - 1.0, z), -np.inf)
    if family == "pareto":
        return np.where(z >= 1.0, np.log(p) - sc.xlogy(p + 1.0, z), -np.inf)
    w = np.log(z) / p  # prentice: p = sigma, q = q, scale = e^mu
    return -np.log(z * p) - _LOG_SQRT_2PI - w**2 * _phi(q * w)[2] - _stirling(q)[0]


def _std_cdf(family, z, p, q):
    """scipy's CDF of the standardised variable z = x / scale."""
    if family == "gamma":
        return sc.gammainc(p, z)
    if family == "lognormal":
        return sc.ndtr(np.log(z) / p)
    if family == "weibull":
        return -sc.expm1(-(z**p))
    if family == "powerlaw":
        return np.minimum(z, 1.0) ** p
    if family == "pareto":
        return 1.0 - np.maximum(z, 1.0) ** -p
    w, a = np.log(z) / p, np.where(q == 0, 1.0, q) ** -2.0  # prentice; Y = a e^(q w) is gamma(a)
    y = a * np.exp(q * w)
    return np.where(q == 0, sc.ndtr(w), np.where(q > 0, sc.gammainc(a, y), sc.gammaincc(a, y)))


def _mode(family, p, q, scale):
    """Interior mode of the fitted density; NaN where the density has none (it peaks at 0)."""
    if family == "gamma":
        return np.where(p > 1, (p - 1.0) * scale, np.nan)
    if family == "lognormal":
        return scale * np.exp(-(p**2))
    if family == "weibull":
        return np.where(p > 1, scale * ((p - 1.0) / p) ** (1.0 / p), np.nan)
    # prentice (p = sigma, scale = e^mu): log x = mu + sigma log(1 - q sigma) / q, when q sigma < 1
    r = np.where(q == 0, -p, np.log1p(-q * p) / np.where(q == 0, 1.0, q))
    return np.where(q * p < 1, scale * np.exp(p * r), np.nan)


def _histogram(z, valid, n):
    """Row-wise np.histogram(z, bins=HIST_BINS, density=True): (bar heights, bin centres)."""
    M = len(z)
    zmin = np.min(np.where(valid, z, np.inf), axis=1)
    zmax = np.max(np.where(valid, z, -np.inf), axis=1)
    edges = np.linspace(zmin, zmax, HIST_BINS + 1, axis=1)
    zf = np.where(valid, z, zmin[:, None])
    idx = (((zf - zmin[:, None]) / (zmax - zmin)[:, None]) * HIST_BINS).astype(np.intp)
    idx[idx == HIST_BINS] -= 1
    idx -= zf < np.take_along_axis(edges, idx, axis=1)  # numpy's one-ulp edge corrections
    idx += (zf >= np.take_along_axis(edges, idx + 1, axis=1)) & (idx != HIST_BINS - 1)
    rows = np.broadcast_to(np.arange(M)[:, None], z.shape)
    counts = np.bincount((rows * HIST_BINS + idx)[valid], minlength=M * HIST_BINS)
    heights = counts.reshape(M, HIST_BINS) / np.diff(edges, axis=1) / n[:, None]
    return heights, (edges[:, :-1] + edges[:, 1:]) / 2.0


class _Observed(NamedTuple):
    """What the quality of every fit of the same samples compares with, computed once for all families: the
    valid values (1.0 elsewhere), each row sorted (1.0 past its n values), its mean, and its histogram of x / mean."""

    xf: np.ndarray
    valid: np.ndarray
    n: np.ndarray
    xs: np.ndarray
    inside: np.ndarray
    mean: np.ndarray
    heights: np.ndarray
    centres: np.ndarray

    @classmethod
    def of(cls, x, valid, n) -> "_Observed":
        xf = np.where(valid, x, 1.0)
        inside = np.arange(1, x.shape[1] + 1) <= n[:, None]  # valid entries sort first
        xs = np.where(inside, np.sort(np.where(valid, x, np.inf), axis=1), 1.0)
        mean = xf.sum(1, where=valid) / n
        return cls(xf, valid, n, xs, inside, mean, *_histogram(xf / mean[:, None], valid, n))


def _quality(family, seen: _Observed, p, q, scale):
    """Log-likelihood, KS distance and histogram error of fitted parameters (each shape (M,))."""
    P, Q, S = p[:, None], q[:, None], scale[:, None]
    loglik = np.where(seen.valid, _std_logpdf(family, seen.xf / S, P, Q) - np.log(S), 0.0).sum(1)

    rank = np.arange(1, seen.xs.shape[1] + 1)
    cdf = _std_cdf(family, seen.xs / S, P, Q)
    nn = seen.n[:, None].astype(np.float64)
    gap = np.maximum(rank / nn - cdf, cdf - (rank - 1) / nn)
    ks = np.max(np.where(seen.inside, gap, -np.inf), axis=1)

    Sm = (scale / seen.mean)[:, None]
    density = np.exp(_std_logpdf(family, seen.centres / Sm, P, Q)) / Sm
    hist_error = np.sqrt(np.mean((seen.heights - density) ** 2, axis=1))
    return loglik, ks, hist_error


def _limit_laws(x, logs, valid, n):
    """Maximum-likelihood (beta, b) of the gengamma's power-function limit (b = max x) and of its
    Pareto limit (b = min x), beta = n / sum |log(x / b)|; b is a sample value, so x / b is exactly 1 there."""
    laws = {}
    for name, pick, pad in zip(LIMIT_LAWS, (np.max, np.min), (-np.inf, np.inf)):
        b = pick(np.where(valid, x, pad), axis=1)
        laws[name] = (n / np.where(valid, np.abs(logs - np.log(b)[:, None]), 0.0).sum(1), b)
    return laws


def fit_families(x: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """x: (M, m) float64; each row one sample; NaN entries are missing (samples of unequal length are NaN-padded).
    Returns {family: {"shape", "shape2", "scale", "mode", "loglik", "ks", "hist_error", "aic", "bic", "n", "status",
    "prentice_mu", "prentice_sigma", "prentice_q", "limit_law"}} with arrays of shape (M,). shape: gamma k /
    lognormal s / weibull_min c / gengamma a; shape2: gengamma c, NaN for the others; scale: scipy's scale (gengamma's
    natural a, c, scale NaN where they are not estimates, module docstring); prentice_*: every ok fit as Prentice's
    (mu, sigma, q) (gamma q = sigma, lognormal q = 0, Weibull q = 1); aic = 2k - 2 loglik, bic = k ln(n) - 2 loglik
    with k = N_PARAMS[family]; status: 'ok', 'boundary' or 'failed'; limit_law: 'powerlaw' or 'pareto' for a
    boundary fit, else None. Rows with fewer than 3 valid values, any non-positive/non-finite valid value, or all
    values equal are 'failed', NaN everywhere (n still reported)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"expected an (M, m) array, got shape {x.shape}")
    M = len(x)
    present = ~np.isnan(x)
    n_all = present.sum(1)
    with np.errstate(all="ignore"):
        good = np.all(~present | ((x > 0) & (x < np.inf)), axis=1) & (n_all >= 3)
        good &= np.max(np.where(present, x, -np.inf), 1) > np.min(np.where(present, x, np.inf), 1)
        out = {f: {k: np.full(M, np.nan) for k in ("shape", "shape2", "scale", "mode",
                                                    "loglik", "ks", "hist_error", "aic", "bic")}
               for f in FAMILIES}
        for f in FAMILIES:
            out[f]["n"] = n_all.copy()
            out[f]["status"] = np.where(good, "ok", "failed").astype("<U8")
            out[f] |= {key: np.full(M, np.nan) for key in PRENTICE}
            out[f]["limit_law"] = np.full(M, None, dtype=object)  # a name or None: any pyarrow types it
        if not good.any():
            return out

        x, valid, n = x[good], present[good], n_all[good]
        logs = np.where(valid, np.log(np.where(valid, x, 1.0)), 0.0)
        lbar = logs.sum(1) / n
        lc = np.where(valid, logs - lbar[:, None], 0.0)
        sigma = np.sqrt((lc**2).sum(1) / n)  # also the lognormal MLE shape
        nan = np.full(len(x), np.nan)

        _, k, log_theta = _gengamma_profile(np.ones((len(x), 1)), lc, valid, n, lbar)
        c_w = _weibull_shape(lc, valid, n, sigma)
        log_scale_w = lbar + _tilt(c_w[:, None], lc, valid, n)[:, 0] / c_w
        starts = np.stack([np.ones_like(c_w), c_w], axis=1)
        c_g = _gengamma_power(lc, valid, n, lbar, sigma, starts)
        _, a_g, log_scale_g = _gengamma_profile(c_g[:, None], lc, valid, n, lbar)
        # from the profile's best power to Prentice's coordinates, or from the lognormal (q = 0) if likelier
        a_g, log_scale_g = a_g[:, 0], log_scale_g[:, 0]
        profiled = np.stack([log_scale_g + np.log(a_g) / c_g, -np.log(np.abs(c_g) * np.sqrt(a_g)),
                             np.sign(c_g) / np.sqrt(a_g)])
        lognormal = np.stack([lbar, np.log(sigma), np.zeros_like(lbar)])
        likelier = _prentice(profiled, logs, valid, n) > _prentice(lognormal, logs, valid, n)
        mu_g, log_sigma_g, q_g = _polish(np.where(likelier, profiled, lognormal), logs, valid, n,
                                         GENGAMMA_GRID[-1] / sigma)
        sigma_g = np.exp(log_sigma_g)
        k_root = 1.0 / np.sqrt(k[:, 0])
        prentice = {  # (mu, sigma, q) of every family
            "gamma": (log_theta[:, 0] + np.log(k[:, 0]), k_root, k_root),
            "lognormal": (lbar, sigma, np.zeros_like(lbar)),
            "weibull": (log_scale_w, 1.0 / c_w, np.ones_like(c_w)),
            "gengamma": (mu_g, sigma_g, q_g),
        }
        params = {
            "gamma": (k[:, 0], nan, np.exp(log_theta[:, 0])),
            "lognormal": (sigma, nan, np.exp(lbar)),
            "weibull": (c_w, nan, np.exp(log_scale_w)),
            "gengamma": (sigma_g, q_g, np.exp(mu_g)),  # Prentice's, for quality and mode; natural ones below
        }
        seen = _Observed.of(x, valid, n)
        quality = {f: _quality(f, seen, p, q, scale) for f, (p, q, scale) in params.items()}
        modes = {f: _mode(f, p, q, scale) for f, (p, q, scale) in params.items()}
        limits = [_quality(law, seen, beta, nan, b) for law, (beta, b) in _limit_laws(x, logs, valid, n).items()]
        best = np.argmax(np.stack([lim[0] for lim in limits]), axis=0)
        sup = [np.choose(best, [lim[j] for lim in limits]) for j in range(3)]
        at_edge = np.abs(q_g / sigma_g) * sigma >= EDGE_SHARE * GENGAMMA_GRID[-1]
        limit_wins = ~(quality["gengamma"][0] > sup[0]) | at_edge  # a limit law is at least as likely
        quality["gengamma"] = [np.where(limit_wins, s, q) for s, q in zip(sup, quality["gengamma"])]
        # natural parameters where the data bound q away from 0 (LR test of the lognormal at 5%)
        log_scale_n = mu_g + 2.0 * sigma_g * np.log(np.abs(q_g)) / q_g
        bounded = (2.0 * (quality["gengamma"][0] - quality["lognormal"][0]) >= NATURAL_LR) & (np.abs(log_scale_n) < _LOG_MAX)
        params["gengamma"] = tuple(np.where(bounded, v, np.nan) for v in (q_g**-2.0, q_g / sigma_g, np.exp(log_scale_n)))
        boundary = {f: limit_wins if f == "gengamma" else np.zeros(len(x), bool) for f in FAMILIES}
        for f, (p, q, scale) in params.items():
            loglik, ks, hist_error = quality[f]
            edge = boundary[f]
            fields = {"shape": p, "shape2": q, "scale": scale, "mode": modes[f]} | dict(zip(PRENTICE, prentice[f]))
            fields = {key: np.where(edge, np.nan, value) for key, value in fields.items()}
            fields |= {"loglik": loglik, "ks": ks, "hist_error": hist_error,
                       "aic": 2.0 * N_PARAMS[f] - 2.0 * loglik, "bic": N_PARAMS[f] * np.log(n) - 2.0 * loglik}
            for key, value in fields.items():
                out[f][key][good] = value
            rows = np.flatnonzero(good)[edge]
            out[f]["status"][rows] = "boundary"
            out[f]["limit_law"][rows] = np.array(LIMIT_LAWS)[best[edge]]
    return out
