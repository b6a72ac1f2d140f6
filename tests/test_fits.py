"""compute/fits.py: the batched fits against scipy.stats fitted and evaluated one sample at a time."""
import warnings

import numpy as np
import pytest
from scipy import optimize, special, stats

from headforms.compute.fits import FAMILIES, N_PARAMS, NATURAL_LR, PRENTICE, STATUSES, fit_families

DISTS = {"gamma": stats.gamma, "lognormal": stats.lognorm, "weibull": stats.weibull_min,
         "gengamma": stats.gengamma}
FIELDS = ("shape", "shape2", "scale", "mode", "loglik", "ks", "hist_error", "aic", "bic", "n", *PRENTICE)


def prentice_logpdf(x, mu, sigma, q):
    """scipy's log density of Prentice's generalized gamma, log x = mu + sigma w: for q != 0,
    y = q^-2 exp(q w) is gamma(q^-2) (so the density is gamma's times |dy/dx| = y |q| / (sigma x)), a
    form whose numbers stay representable as q -> 0; at q = 0 the lognormal."""
    if q == 0:
        return stats.lognorm.logpdf(x, sigma, scale=np.exp(mu))
    a = q**-2.0
    y = a * np.exp(q * (np.log(x) - mu) / sigma)
    return stats.gamma.logpdf(y, a) + np.log(y * abs(q) / (sigma * x))


def prentice_cdf(x, mu, sigma, q):
    """scipy's CDF of the same law (gamma's CDF of y, or its survival function for q < 0)."""
    if q == 0:
        return stats.lognorm.cdf(x, sigma, scale=np.exp(mu))
    a = q**-2.0
    y = a * np.exp(q * (np.log(x) - mu) / sigma)
    return stats.gamma.cdf(y, a) if q > 0 else stats.gamma.sf(y, a)


class Frozen:
    """A fitted row as a frozen law: scipy's own for gamma, lognormal, Weibull; Prentice's for gengamma."""

    def __init__(self, res, family, i):
        self.family, self.args = family, scipy_args(res, family, i)
        self.prentice = tuple(res[family][k][i] for k in PRENTICE)

    def logpdf(self, x):
        if self.family == "gengamma":
            return prentice_logpdf(np.asarray(x, dtype=float), *self.prentice)
        return DISTS[self.family].logpdf(x, *self.args)

    def pdf(self, x):
        return np.exp(self.logpdf(x))

    def cdf(self, x):
        if self.family == "gengamma":
            return prentice_cdf(np.asarray(x, dtype=float), *self.prentice)
        return DISTS[self.family].cdf(x, *self.args)


def draw_samples(seed: int = 3, per_kind: int = 9) -> list[np.ndarray]:
    """Realistic samples: gamma, lognormal, Weibull and inverse-type gengamma (c < 0) draws,
    32..128 values, over scales from 1e-3 to 1e3."""
    rng = np.random.default_rng(seed)
    kinds = [
        lambda n: rng.gamma(rng.uniform(1.2, 8.0), 1.0, n),
        lambda n: rng.lognormal(0.0, rng.uniform(0.2, 1.2), n),
        lambda n: stats.weibull_min.rvs(rng.uniform(1.2, 8.0), size=n, random_state=rng),
        lambda n: stats.gengamma.rvs(rng.uniform(1.0, 4.0), -rng.uniform(0.5, 2.0), size=n,
                                     random_state=rng),
    ]
    return [kinds[i % 4](rng.integers(32, 129)) * 10 ** rng.uniform(-3, 3)
            for i in range(4 * per_kind)]


def pad(rows: list[np.ndarray], m: int | None = None) -> np.ndarray:
    """Stack samples of unequal length into a NaN-padded (M, m) array."""
    x = np.full((len(rows), m or max(len(r) for r in rows)), np.nan)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
    return x


def fit_quietly(rows):
    """fit_families on the padded rows; any warning fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fit_families(pad(rows))


def scipy_args(res, family, i):
    """scipy (shapes..., loc, scale) of row i of a fit_families result."""
    r = res[family]
    shapes = (r["shape"][i], r["shape2"][i]) if family == "gengamma" else (r["shape"][i],)
    return (*shapes, 0.0, r["scale"][i])


def tight_fmin(func, x0, args=(), disp=0):
    """Nelder-Mead converged far beyond scipy's default tolerances (1e-4)."""
    return optimize.fmin(func, x0, args=args, xtol=1e-11, ftol=1e-13, maxiter=20_000,
                         maxfun=20_000, disp=disp)


@pytest.fixture(scope="module")
def samples():
    return draw_samples()


@pytest.fixture(scope="module")
def fitted(samples):
    return fit_quietly(samples)


def test_layout(samples, fitted):
    assert set(fitted) == set(FAMILIES)
    for family in FAMILIES:
        assert set(fitted[family]) == set(FIELDS) | {"status", "limit_law"}
        for field in (*FIELDS, "status", "limit_law"):
            assert fitted[family][field].shape == (len(samples),)
        assert set(fitted[family]["status"]) <= set(STATUSES)
        boundary = fitted[family]["status"] == "boundary"
        assert set(fitted[family]["limit_law"][boundary]) <= {"powerlaw", "pareto"}
        assert all(law is None for law in fitted[family]["limit_law"][~boundary])
        np.testing.assert_array_equal(fitted[family]["n"], [len(s) for s in samples])
        assert np.all(np.isfinite(fitted[family]["loglik"]))
    for family in ("gamma", "lognormal", "weibull"):
        assert np.all(np.isnan(fitted[family]["shape2"]))


def test_gamma_and_lognormal_equal_scipy_closed_forms(samples, fitted):
    for i, s in enumerate(samples):
        k, _, theta = stats.gamma.fit(s, floc=0)
        sigma, _, scale = stats.lognorm.fit(s, floc=0)
        np.testing.assert_allclose([fitted["gamma"]["shape"][i], fitted["gamma"]["scale"][i]],
                                   [k, theta], rtol=1e-9)
        np.testing.assert_allclose([fitted["lognormal"]["shape"][i], fitted["lognormal"]["scale"][i]],
                                   [sigma, scale], rtol=1e-9)


def test_nested_families_in_prentice_coordinates(samples, fitted):
    """Gamma is Prentice's law at q = sigma, lognormal at q = 0, Weibull at q = 1: each fit's (mu, sigma, q) gives
    scipy's own log density of that fit."""
    for family in ("gamma", "lognormal", "weibull"):
        mu, sigma, q = (fitted[family][k] for k in PRENTICE)
        np.testing.assert_allclose(q, {"gamma": sigma, "lognormal": 0.0, "weibull": 1.0}[family], rtol=1e-15)
        for i, s in enumerate(samples[:8]):
            np.testing.assert_allclose(prentice_logpdf(s, mu[i], sigma[i], q[i]),
                                       DISTS[family].logpdf(s, *scipy_args(fitted, family, i)), rtol=1e-10)


def test_weibull_is_the_exact_mle(samples, fitted):
    """scipy's Weibull fit is Nelder-Mead (about 1e-5 relative): converged tightly it agrees
    to 1e-6, and at scipy's default tolerances it never finds a higher likelihood."""
    w = fitted["weibull"]
    for i, s in enumerate(samples[:6]):
        c, scale = w["shape"][i], w["scale"][i]
        ref = stats.weibull_min.fit(s, floc=0, optimizer=tight_fmin)
        np.testing.assert_allclose([c, scale], [ref[0], ref[2]], rtol=1e-6)
        # the two score equations of the Weibull likelihood vanish
        z = (s / scale) ** c
        np.testing.assert_allclose(np.mean(z), 1.0, rtol=1e-12)
        assert abs(1 / c + np.mean(np.log(s / scale) * (1 - z))) < 1e-12 * (1 + 1 / c)
    for i, s in enumerate(samples):
        ref = stats.weibull_min.fit(s, floc=0)
        np.testing.assert_allclose(w["shape"][i], ref[0], rtol=1e-3)
        assert w["loglik"][i] >= stats.weibull_min.logpdf(s, *ref).sum() - 1e-9 * abs(w["loglik"][i])


def test_gengamma_at_least_as_good_as_scipy(samples, fitted):
    """scipy started from the gamma fit (a=k, c=1) and the Weibull fit (a=1, c=c_w); ours is the
    global profile maximum over c of both signs, so it is never worse and often better."""
    g, better = fitted["gengamma"], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's unconstrained search overflows on its way
        for i, s in enumerate(samples):
            starts = [(fitted["gamma"]["shape"][i], 1.0, fitted["gamma"]["scale"][i]),
                      (1.0, fitted["weibull"]["shape"][i], fitted["weibull"]["scale"][i])]
            best = max(stats.gengamma.logpdf(s, *stats.gengamma.fit(s, a0, c0, floc=0, scale=s0)).sum()
                       for a0, c0, s0 in starts)
            assert g["loglik"][i] >= best - 1e-7 * abs(best)
            better += g["loglik"][i] > best + 1e-3
            # and the gamma and Weibull fits are special cases, never better
            assert g["loglik"][i] >= max(fitted["gamma"]["loglik"][i], fitted["weibull"]["loglik"][i])
    assert better >= len(samples) // 4  # e.g. the c < 0 draws, out of scipy's reach from these starts
    assert np.any(g["prentice_q"] < 0) and np.any(g["prentice_q"] > 0)


def test_gengamma_is_a_stationary_maximum(samples, fitted):
    """Where the maximum is interior, no step in Prentice's (mu, log sigma, q), along the axes or random
    directions, raises scipy's log-likelihood; where the natural parameters are given, scipy's three score
    equations in (a, c, scale) hold to rounding. Where the likelihood keeps rising towards a limit the fit is
    'boundary' (test_boundary_fits)."""
    rng = np.random.default_rng(11)
    steps = np.concatenate([np.eye(3), rng.normal(size=(20, 3))]) * 1e-4
    steps = np.concatenate([steps, -steps])
    g = fitted["gengamma"]
    ok = g["status"] == "ok"
    assert (~ok).sum() <= 2 and np.all(g["status"][~ok] == "boundary")
    natural = ok & np.isfinite(g["shape"])
    assert natural.sum() >= len(samples) // 2
    for i in np.flatnonzero(ok):
        s, (mu, sigma, q) = samples[i], (g[k][i] for k in PRENTICE)
        ll = g["loglik"][i]
        trials = [prentice_logpdf(s, mu + d[0], sigma * np.exp(d[1]), q + d[2]).sum() for d in steps]
        assert max(trials) < ll
        if natural[i]:
            a, c, _, scale = scipy_args(fitted, "gengamma", i)
            lz = np.log(s / scale)
            zc = np.exp(c * lz)
            np.testing.assert_allclose(zc.mean(), a, rtol=1e-10)  # d/d scale
            np.testing.assert_allclose(c * lz.mean(), special.digamma(a), rtol=1e-10, atol=1e-10)  # d/da
            terms = np.array([1 / c, a * lz.mean(), -np.mean(zc * lz)])  # d/dc
            assert abs(terms.sum()) < 1e-10 * np.abs(terms).sum()


def ok_rows(fitted, family, samples):
    """(index, sample) of the rows whose fit is 'ok' (boundary fits carry no parameters)."""
    return [(i, samples[i]) for i in np.flatnonzero(fitted[family]["status"] == "ok")]


@pytest.mark.parametrize("family", FAMILIES)
def test_loglik_and_ks_equal_scipy(samples, fitted, family):
    """scipy's log-likelihood and KS distance of each ok fit (gengamma: of its Prentice parameters and, where
    given, of its natural ones: the two describe one law)."""
    for i, s in ok_rows(fitted, family, samples):
        law = Frozen(fitted, family, i)
        np.testing.assert_allclose(fitted[family]["loglik"][i], law.logpdf(s).sum(), rtol=1e-10)
        np.testing.assert_allclose(fitted[family]["ks"][i], stats.kstest(s, law.cdf).statistic, rtol=1e-10, atol=1e-12)
        if family == "gengamma" and np.isfinite(fitted[family]["shape"][i]):
            np.testing.assert_allclose(fitted[family]["loglik"][i],
                                       stats.gengamma.logpdf(s, *scipy_args(fitted, family, i)).sum(), rtol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_hist_error_equals_per_row_histogram(samples, fitted, family):
    for i, s in ok_rows(fitted, family, samples):
        z = s / s.mean()
        heights, edges = np.histogram(z, bins=20, density=True)
        pdf = s.mean() * Frozen(fitted, family, i).pdf((edges[:-1] + edges[1:]) / 2 * s.mean())
        np.testing.assert_allclose(fitted[family]["hist_error"][i],
                                   np.sqrt(np.mean((heights - pdf) ** 2)), rtol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_mode_is_the_density_peak(samples, fitted, family):
    r = fitted[family]
    p, q = r["shape"], r["prentice_q"] * r["prentice_sigma"]
    interior = {"gamma": p > 1, "lognormal": np.ones_like(p, bool), "weibull": p > 1,
                "gengamma": q < 1}[family]  # Prentice: log x = mu + sigma log(1 - q sigma) / q
    np.testing.assert_array_equal(np.isfinite(r["mode"]), interior & (r["status"] == "ok"))
    for i in np.flatnonzero(interior & (r["status"] == "ok")):
        law = Frozen(fitted, family, i)
        mode, peak = r["mode"][i], law.logpdf(r["mode"][i])
        assert np.all(law.logpdf(mode * np.array([1 - 1e-4, 1 + 1e-4])) < peak)


def test_scale_equivariance_and_row_independence(samples, fitted):
    """Rescaling a sample rescales only `scale` and `mode`; a row's fit does not depend on the
    other rows (each row, slow or fast to converge, is its fit alone: the polish iterates on the rows still
    going) or on how much NaN padding it carries."""
    alone_each = [fit_quietly([sample]) for sample in samples]
    wide = fit_families(pad([samples[3]], m=200))
    scaled = fit_quietly([s * 7.5 for s in samples])
    for family in FAMILIES:
        # near the lognormal limit (small |c|, large a) the gengamma parameters slide along a
        # flat ridge of the likelihood, and log scale ~ -log(a) / c amplifies that further
        rtol = {"shape": 1e-6, "shape2": 1e-6, "scale": 1e-5} if family == "gengamma" else {}
        for field in ("shape", "shape2", "ks", "hist_error", "prentice_sigma", "prentice_q"):
            np.testing.assert_allclose(scaled[family][field], fitted[family][field],
                                       rtol=rtol.get(field, 1e-8), atol=1e-9 if field == "prentice_q" else 0)
        for field in ("scale", "mode"):
            np.testing.assert_allclose(scaled[family][field], 7.5 * fitted[family][field],
                                       rtol=rtol.get("scale", 1e-8))
        np.testing.assert_allclose(scaled[family]["prentice_mu"], fitted[family]["prentice_mu"] + np.log(7.5),
                                   rtol=1e-8, atol=1e-9)
        for field in FIELDS:
            for i, single in enumerate(alone_each):
                np.testing.assert_allclose(single[family][field], fitted[family][field][i:i + 1], rtol=1e-9,
                                           atol=1e-12, err_msg=f"row {i}, {family} {field}")
            np.testing.assert_allclose(wide[family][field], alone_each[3][family][field], rtol=1e-9, atol=1e-12)


def test_degenerate_rows_give_nan_quietly():
    good = np.random.default_rng(5).gamma(2.0, 1.0, 40)
    rows = [good,
            np.full(40, 2.5),                       # all equal: no MLE
            np.r_[good[:39], 0.0],                  # a zero value
            np.r_[good[:39], -1.0],                 # a negative value
            np.r_[good[:39], np.inf],               # an infinite value
            good[:2],                               # too few values
            np.empty(0),                            # nothing at all
            good[:3]]                               # three values: enough
    res, alone = fit_quietly(rows), fit_quietly([good])
    for family in FAMILIES:
        np.testing.assert_array_equal(res[family]["n"], [40, 40, 40, 40, 40, 2, 0, 3])
        for field in FIELDS:  # bad rows do not disturb good ones
            np.testing.assert_allclose(res[family][field][:1], alone[family][field], rtol=1e-9)
        np.testing.assert_array_equal(res[family]["status"][1:7], "failed")
        assert "failed" not in res[family]["status"][[0, 7]]
        assert all(law is None for law in res[family]["limit_law"][1:7])
        for field in (f for f in FIELDS if f != "n"):
            values = res[family][field]
            assert np.all(np.isnan(values[1:7])), (family, field)
            natural = family == "gengamma" and field in ("shape", "scale")  # none where q may be 0
            if field not in ("shape2", "mode") and not natural:  # a boundary fit (three values, three parameters) has none
                params = field in ("shape", "scale", *PRENTICE)
                fitted_rows = [i for i in (0, 7) if not params or res[family]["status"][i] == "ok"]
                assert np.all(np.isfinite(values[fitted_rows])), (family, field)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        empty = fit_families(np.empty((0, 8)))
        all_bad = fit_families(np.full((2, 8), np.nan))
    assert empty["gamma"]["loglik"].shape == (0,)
    assert np.all(np.isnan(all_bad["gengamma"]["loglik"])) and np.all(all_bad["weibull"]["n"] == 0)


def test_awkward_samples_fit_quietly():
    """Tiny, flat-topped, nearly constant, heavy-tailed, tied and extreme-scale samples: finite
    fits without warnings, the gengamma one at least as likely as its gamma and Weibull cases."""
    rng = np.random.default_rng(9)
    rows = [rng.uniform(0.5, 1.5, 64), rng.uniform(0, 1, 3) + 0.1, rng.gamma(2.0, 1.0, 4),
            rng.normal(5.0, 0.005, 128), rng.pareto(0.7, 64) + 1.0, rng.lognormal(0.0, 3.0, 64),
            np.round(rng.gamma(3.0, 1.0, 64), 1) + 0.1, rng.gamma(0.3, 1.0, 64),
            rng.gamma(4.0, 1e-150, 64), rng.weibull(3.0, 64) * 1e150]
    res = fit_quietly(rows)
    for family in FAMILIES:
        ok = res[family]["status"] == "ok"
        assert np.all(ok | (res[family]["status"] == "boundary"))
        for field in ("loglik", "ks", "hist_error", "aic", "bic"):
            assert np.all(np.isfinite(res[family][field])), (family, field)
        params = PRENTICE if family == "gengamma" else ("shape", "scale", *PRENTICE)
        for field in params:  # boundary fits carry no parameters
            np.testing.assert_array_equal(np.isfinite(res[family][field]), ok)
    for i in np.flatnonzero(res["gengamma"]["status"] == "ok"):
        np.testing.assert_allclose(res["gengamma"]["loglik"][i],
                                   Frozen(res, "gengamma", i).logpdf(rows[i]).sum(), rtol=1e-9)
    best_case = np.maximum(res["gamma"]["loglik"], res["weibull"]["loglik"])
    assert np.all(res["gengamma"]["loglik"] >= best_case - 1e-9 * np.abs(best_case))


def test_aic_and_bic_by_formula(samples, fitted):
    """aic = 2k - 2 loglik, bic = k ln(n) - 2 loglik with statistics.md's free parameters (location fixed)."""
    free = {"gamma": 2, "lognormal": 2, "weibull": 2, "gengamma": 3}
    assert N_PARAMS == free
    n = np.array([len(s) for s in samples])
    for family, k in free.items():
        ll = fitted[family]["loglik"]
        np.testing.assert_allclose(fitted[family]["aic"], 2 * k - 2 * ll, rtol=1e-14)
        np.testing.assert_allclose(fitted[family]["bic"], k * np.log(n) - 2 * ll, rtol=1e-14)


def profile_loglik(x, c):
    """scipy's gengamma log-likelihood maximised over a and scale at a fixed power c: y = (x/m)^c
    is gamma(a, theta) (m = the geometric mean keeps y representable), fitted by scipy."""
    m = np.exp(np.mean(np.log(x)))
    a, _, theta = stats.gamma.fit((x / m) ** c, floc=0)
    return stats.gengamma.logpdf(x, a, c, 0.0, m * theta ** (1.0 / c)).sum()


def histogram_error(x, dist):
    """statistics.md's histogram error of a frozen scipy distribution fitted to x."""
    heights, edges = np.histogram(x / x.mean(), bins=20, density=True)
    centres = (edges[:-1] + edges[1:]) / 2
    return np.sqrt(np.mean((heights - x.mean() * dist.pdf(centres * x.mean())) ** 2))


def test_boundary_fits():
    """Power-function and Pareto draws: scipy's profile likelihood of gengamma keeps rising with |c|
    towards the power-function / Pareto limit, whose scipy fit is the stored supremum (log-likelihood,
    KS, histogram error), the limit named. Log-symmetric samples: the profile peaks at c = 0, the lognormal,
    an interior point q = 0 in Prentice's parametrisation: 'ok', its natural parameters NULL. Gamma draws
    stay 'ok' with finite parameters."""
    rng = np.random.default_rng(4)
    z = stats.norm.ppf((np.arange(1, 25) - 0.5) / 24)
    upper = [rng.uniform(0.0, 1.0, 64), rng.power(2.0, 48) * 3.0, rng.power(0.7, 40)]
    lower = [rng.pareto(3.0, 64) + 1.0, (rng.pareto(1.5, 50) + 1.0) * 1e-3]
    symmetric = [np.exp(np.r_[z, -z] * 0.4) * 5.0, np.exp(np.r_[z, -z] * 1.5)]
    interior = [rng.gamma(4.0, 2.0, 64), rng.gamma(1.5, 1.0, 48)]
    rows = upper + lower + symmetric + interior
    res = fit_quietly(rows)
    g = res["gengamma"]
    limits = len(upper + lower)
    assert list(g["status"]) == ["boundary"] * limits + ["ok"] * (len(rows) - limits)
    assert list(g["limit_law"]) == ["powerlaw"] * len(upper) + ["pareto"] * len(lower) + [None] * (len(rows) - limits)
    for family in ("gamma", "lognormal", "weibull"):
        assert np.all(res[family]["status"] == "ok")
    for field in ("shape", "shape2", "scale", "mode", *PRENTICE):
        assert np.all(np.isnan(g[field][:limits]))
    for i, x in enumerate(interior, start=len(rows) - len(interior)):
        assert np.all(np.isfinite([g[field][i] for field in ("mode", *PRENTICE)]))
        lr = 2 * (g["loglik"][i] - stats.lognorm.logpdf(x, *stats.lognorm.fit(x, floc=0)).sum())
        assert np.isfinite(g["shape"][i]) == (lr >= stats.chi2.ppf(0.95, 1))  # natural only where q is bounded off 0
    assert np.isfinite(g["shape"][-2]) and np.isnan(g["shape"][-1])  # 64 gamma(4) draws tell; 48 gamma(1.5) do not

    for i, x in enumerate(upper + lower):
        law = stats.powerlaw if i < len(upper) else stats.pareto
        dist = law(*law.fit(x, floc=0))
        sup = dist.logpdf(x).sum()
        np.testing.assert_allclose(g["loglik"][i], sup, rtol=1e-12)
        np.testing.assert_allclose(g["ks"][i], stats.kstest(x, dist.cdf).statistic, rtol=1e-12)
        np.testing.assert_allclose(g["hist_error"][i], histogram_error(x, dist), rtol=1e-10)
        sign = 1.0 if i < len(upper) else -1.0
        powers = sign * np.array([1.0, 3.0, 10.0, 30.0, 100.0]) / np.std(np.log(x))
        profile = np.array([profile_loglik(x, c) for c in powers])
        assert np.all(np.diff(profile) > 0) and profile[-1] < sup, (i, profile, sup)

    for i, x in enumerate(symmetric, start=limits):
        sigma, _, scale = stats.lognorm.fit(x, floc=0)
        np.testing.assert_allclose([g["prentice_mu"][i], g["prentice_sigma"][i]], [np.log(scale), sigma], rtol=1e-9, atol=1e-15)
        assert abs(g["prentice_q"][i]) < 1e-9 and np.isfinite(g["mode"][i])
        assert np.all(np.isnan([g["shape"][i], g["shape2"][i], g["scale"][i]]))
        np.testing.assert_allclose(g["loglik"][i], stats.lognorm.logpdf(x, sigma, 0, scale).sum(), rtol=1e-12)
        powers = np.array([-1.0, -0.3, -0.1, 0.1, 0.3, 1.0]) / np.std(np.log(x))
        assert max(profile_loglik(x, c) for c in powers) < g["loglik"][i]


def test_histogram_equals_numpy_on_values_at_and_one_ulp_around_every_edge():
    """The batched histogram bins a value as np.histogram does where rounding puts it a bin too high or too low:
    rows holding numpy's own bin edges and their neighbours one ulp either side (both corrections occur)."""
    from headforms.compute.fits import HIST_BINS, _histogram

    rng = np.random.default_rng(0)
    rows = []
    for lo, width in zip(rng.uniform(0.01, 1, 40), rng.uniform(0.1, 5, 40)):
        edges = np.linspace(lo, lo + width, HIST_BINS + 1)
        inner = edges[1:-1]
        rows.append(np.concatenate([edges, np.nextafter(inner, -np.inf), np.nextafter(inner, np.inf)]))
    z = pad(rows)
    valid = ~np.isnan(z)
    heights, centres = _histogram(z, valid, valid.sum(1))
    for row, h, c in zip(rows, heights, centres):
        expected, edges = np.histogram(row, bins=HIST_BINS, density=True)
        np.testing.assert_array_equal(h, expected)
        np.testing.assert_array_equal(c, (edges[:-1] + edges[1:]) / 2)


def exact_logpdf(x, mu, sigma, q):
    """Prentice's log density at 60 digits (mpmath, which torch's sympy brings): the reference where
    scipy's gengamma has no representable scale or loses digits to a = q^-2 (0 < |q| < 1e-2)."""
    import mpmath

    with mpmath.workdps(60):
        q, sigma, lam = mpmath.mpf(q), mpmath.mpf(sigma), 1 / mpmath.mpf(q) ** 2
        const = mpmath.log(abs(q)) - mpmath.loggamma(lam) + lam * mpmath.log(lam) - mpmath.log(sigma)
        out = []
        for v in x:
            w = (mpmath.log(mpmath.mpf(v)) - mu) / sigma
            out.append(float(const + lam * (q * w - mpmath.exp(q * w)) - mpmath.log(mpmath.mpf(v))))
        return np.array(out)


def test_prentice_loglik_against_scipy():
    """The stable Prentice log-likelihood (the optimiser's `_prentice` and the stored `_std_logpdf`) against
    scipy's gengamma(a = q^-2, c = q / sigma, scale = exp(mu + 2 sigma log|q| / q)) where scipy is exact
    (|q| >= 1e-2), its lognorm at q = 0 and at |q| = 1e-12 (the limit), and 60-digit arithmetic between."""
    from headforms.compute.fits import _prentice, _std_logpdf

    x = np.random.default_rng(2).gamma(3.0, 0.5, 30)
    logs, valid, n = np.log(x)[None], np.ones((1, 30), bool), np.array([30])
    qs = np.array([0.0, 1e-12, 1e-8, 1e-6, 1e-4, 1e-3, 3e-3, 1e-2, 0.05, 0.3, 0.9, 1.0, 2.0, 7.0])
    qs = np.concatenate([qs, -qs[1:]])
    checked = {"scipy": 0, "lognorm": 0, "exact": 0}
    for q in qs:
        mu, sigma = 0.2, 0.03 if abs(q) < 1e-2 else 0.7  # keeps scipy's scale representable down to |q| = 1e-2
        if q == 0 or abs(q) < 1e-10:
            reference, kind = stats.lognorm.logpdf(x, sigma, scale=np.exp(mu)), "lognorm"
        elif abs(q) >= 1e-2:
            scale = np.exp(mu + 2 * sigma * np.log(abs(q)) / q)
            reference, kind = stats.gengamma.logpdf(x, q**-2, q / sigma, scale=scale), "scipy"
        else:
            reference, kind = exact_logpdf(x, mu, sigma, q), "exact"
        checked[kind] += 1
        pointwise = _std_logpdf("gengamma", x / np.exp(mu), sigma, q) - mu
        np.testing.assert_allclose(pointwise, reference, rtol=1e-10, atol=1e-10, err_msg=f"q = {q}")
        total = _prentice(np.array([[mu], [np.log(sigma)], [q]]), logs, valid, n)[0]
        np.testing.assert_allclose(total, reference.sum(), rtol=1e-10, err_msg=f"q = {q}")
    assert checked == {"scipy": 14, "lognorm": 3, "exact": 10}


def test_lognormal_samples_fit_near_q_zero():
    """Lognormal draws: 'ok', Prentice's (mu, sigma) near scipy's lognorm fit and q near 0, at least as likely
    as the lognormal; no natural parameters, since a likelihood-ratio test (scipy's lognormal likelihood) does
    not reject q = 0; the fit is the maximum (no step raises the 60-digit likelihood)."""
    rng = np.random.default_rng(21)
    z = stats.norm.ppf((np.arange(1, 65) - 0.5) / 64)
    rows = [rng.lognormal(0.3, 0.8, 200), rng.lognormal(-2.0, 1.5, 120) * 1e3, rng.lognormal(1.0, 0.2, 64),
            np.exp(0.6 * z + 0.0005 * (z**2 - 1))]  # a hint of skew: q = -0.005, inside the grid's |c| std(log x) = 0.01
    res = fit_quietly(rows)
    g = res["gengamma"]
    assert list(g["status"]) == ["ok"] * 4
    assert -0.006 < g["prentice_q"][3] < -0.004
    for i, x in enumerate(rows):
        s, _, scale = stats.lognorm.fit(x, floc=0)
        lognormal = stats.lognorm.logpdf(x, s, 0, scale).sum()
        assert 0 <= 2 * (g["loglik"][i] - lognormal) < NATURAL_LR == pytest.approx(stats.chi2.ppf(0.95, 1), rel=1e-15)
        assert np.isnan(g["shape"][i]) and np.isnan(g["shape2"][i]) and np.isnan(g["scale"][i])
        mu, sigma, q = (g[k][i] for k in PRENTICE)
        assert abs(q) < 0.25 and abs(mu - np.log(scale)) < 0.1 * s and abs(sigma / s - 1) < 0.05
        np.testing.assert_allclose(g["loglik"][i], exact_logpdf(x, mu, sigma, q).sum(), rtol=1e-11)
        for d in (1e-4, -1e-4):
            for step in np.eye(3) * d:
                assert exact_logpdf(x, mu + step[0], sigma * np.exp(step[1]), q + step[2]).sum() < g["loglik"][i]


def test_gamma_and_weibull_samples_recover_their_q():
    """Large draws: a gamma(k) sample fits q close to sigma (both near k^-1/2), a Weibull(c) sample q close to 1
    (sigma near 1/c); both reject the lognormal, so their natural parameters are given, a near k (or 1), c near 1
    (or the Weibull's c)."""
    rng = np.random.default_rng(8)
    rows = [rng.gamma(4.0, 2.0, 4000), stats.weibull_min.rvs(1.7, size=4000, random_state=rng) * 3.0]
    g = fit_quietly(rows)["gengamma"]
    assert list(g["status"]) == ["ok", "ok"]
    np.testing.assert_allclose([g["prentice_q"][0], g["prentice_sigma"][0]], [0.5, 0.5], atol=0.08)  # SE(q) ~ 0.05
    assert abs(g["prentice_q"][0] - g["prentice_sigma"][0]) < 0.08  # not the lognormal (0) nor the Weibull (1)
    np.testing.assert_allclose([g["shape"][0], g["shape2"][0]], [4.0, 1.0], rtol=0.3)
    np.testing.assert_allclose([g["prentice_q"][1], g["prentice_sigma"][1]], [1.0, 1 / 1.7], rtol=0.1)
    np.testing.assert_allclose([g["shape"][1], g["shape2"][1]], [1.0, 1.7], rtol=0.3)


def test_gengamma_mode_is_continuous_through_the_lognormal():
    """The mode at q = 0 exactly (the lognormal branch) equals exp(mu - sigma^2), and the modes at q -> 0 from
    either side tend to it: each found as the peak of Prentice's density through scipy's gamma (prentice_logpdf)."""
    from headforms.compute.fits import _mode

    mu, sigma = 0.7, np.array([0.3, 0.8, 1.4])
    lognormal = np.exp(mu - sigma**2)
    at_zero = _mode("gengamma", sigma, np.zeros(3), np.full(3, np.exp(mu)))
    np.testing.assert_allclose(at_zero, lognormal, rtol=1e-15)
    for q in (1e-2, -1e-2):  # beside 0: the peak of the density itself, at 60 digits (exact_logpdf)
        near = _mode("gengamma", sigma, np.full(3, q), np.full(3, np.exp(mu)))
        for s, m in zip(sigma, near):
            around = exact_logpdf(m * np.array([1 - 1e-6, 1.0, 1 + 1e-6]), mu, s, q)
            assert around[1] > around[0] and around[1] > around[2]
    for q in (1e-7, -1e-7):  # and towards 0 from both sides, the lognormal's mode
        np.testing.assert_allclose(_mode("gengamma", sigma, np.full(3, q), np.full(3, np.exp(mu))), lognormal, rtol=1e-6)


def test_a_gengamma_fit_stopped_at_the_search_edge_is_a_boundary_fit(monkeypatch):
    """Draws of scipy's gengamma(a=0.02, c=3) fit at |c| std(log x) about 74, inside the search: moved to 40, the
    fit stops at the search's edge with the likelihood still rising, so it is a `boundary` fit with its limit law
    (the powerlaw, the limit of large positive q), parameters NaN, although that law is less likely than the
    point at the edge."""
    import headforms.compute.fits as fits

    x = stats.gengamma.rvs(0.02, 3.0, size=2000, random_state=np.random.default_rng(1))
    free = fit_quietly([x])["gengamma"]
    assert free["status"][0] == "ok" and abs(free["shape2"][0]) * np.std(np.log(x)) > 40
    monkeypatch.setattr(fits, "GENGAMMA_GRID", np.geomspace(1e-2, 40.0, 35))
    g = fit_quietly([x])["gengamma"]
    assert g["status"][0] == "boundary" and g["limit_law"][0] == "powerlaw"
    assert np.all(np.isnan([g[k][0] for k in ("shape", "shape2", "scale", "mode", *PRENTICE)]))
    law = stats.powerlaw(*stats.powerlaw.fit(x, floc=0))
    np.testing.assert_allclose(g["loglik"][0], law.logpdf(x).sum(), rtol=1e-12)
    assert law.logpdf(x).sum() < free["loglik"][0]  # the edge alone makes it a boundary fit, not the likelihood
