"""compute/fits.py: the batched fits against scipy.stats fitted and evaluated one sample at a time."""
import warnings

import numpy as np
import pytest
from scipy import optimize, special, stats

from headforms.compute.fits import FAMILIES, GENGAMMA_GRID, N_PARAMS, STATUSES, fit_families

DISTS = {"gamma": stats.gamma, "lognormal": stats.lognorm, "weibull": stats.weibull_min,
         "gengamma": stats.gengamma}
FIELDS = ("shape", "shape2", "scale", "mode", "loglik", "ks", "hist_error", "aic", "bic", "n")


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
        assert set(fitted[family]) == set(FIELDS) | {"status"}
        for field in (*FIELDS, "status"):
            assert fitted[family][field].shape == (len(samples),)
        assert set(fitted[family]["status"]) <= set(STATUSES)
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
    assert np.any(g["shape2"] < 0) and np.any(g["shape2"] > 0)


def test_gengamma_is_a_stationary_maximum(samples, fitted):
    """Where the maximum is interior, the three score equations hold to rounding and no step in
    (log a, c, log scale), along the axes or random directions, raises scipy's log-likelihood.
    Where the likelihood keeps rising towards a limit the fit is 'boundary' (test_boundary_fits)."""
    rng = np.random.default_rng(11)
    steps = np.concatenate([np.eye(3), rng.normal(size=(20, 3))]) * 1e-4
    steps = np.concatenate([steps, -steps])
    ok = fitted["gengamma"]["status"] == "ok"
    assert (~ok).sum() <= 2 and np.all(fitted["gengamma"]["status"][~ok] == "boundary")
    for i in np.flatnonzero(ok):
        s, (a, c, _, scale) = samples[i], scipy_args(fitted, "gengamma", i)
        lz = np.log(s / scale)
        zc = np.exp(c * lz)
        np.testing.assert_allclose(zc.mean(), a, rtol=1e-12)  # d/d scale
        np.testing.assert_allclose(c * lz.mean(), special.digamma(a), rtol=1e-12, atol=1e-12)  # d/da
        terms = np.array([1 / c, a * lz.mean(), -np.mean(zc * lz)])  # d/dc
        assert abs(terms.sum()) < 1e-12 * np.abs(terms).sum()
        ll = fitted["gengamma"]["loglik"][i]
        a2, c2, scale2 = a * np.exp(steps[:, 0]), c * (1 + steps[:, 1]), scale * np.exp(steps[:, 2])
        assert np.all(stats.gengamma.logpdf(s[:, None], a2, c2, 0.0, scale2).sum(0) < ll)


def ok_rows(fitted, family, samples):
    """(index, sample) of the rows whose fit is 'ok' (boundary fits carry no parameters)."""
    return [(i, samples[i]) for i in np.flatnonzero(fitted[family]["status"] == "ok")]


@pytest.mark.parametrize("family", FAMILIES)
def test_loglik_and_ks_equal_scipy(samples, fitted, family):
    for i, s in ok_rows(fitted, family, samples):
        args = scipy_args(fitted, family, i)
        np.testing.assert_allclose(fitted[family]["loglik"][i], DISTS[family].logpdf(s, *args).sum(),
                                   rtol=1e-10)
        ks = stats.kstest(s, DISTS[family](*args).cdf).statistic
        np.testing.assert_allclose(fitted[family]["ks"][i], ks, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_hist_error_equals_per_row_histogram(samples, fitted, family):
    for i, s in ok_rows(fitted, family, samples):
        *shapes, _, scale = scipy_args(fitted, family, i)
        z = s / s.mean()
        heights, edges = np.histogram(z, bins=20, density=True)
        pdf = DISTS[family].pdf((edges[:-1] + edges[1:]) / 2, *shapes, scale=scale / s.mean())
        np.testing.assert_allclose(fitted[family]["hist_error"][i],
                                   np.sqrt(np.mean((heights - pdf) ** 2)), rtol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_mode_is_the_density_peak(samples, fitted, family):
    r = fitted[family]
    p, q = r["shape"], r["shape2"]
    interior = {"gamma": p > 1, "lognormal": np.ones_like(p, bool), "weibull": p > 1,
                "gengamma": (q < 0) | (p * q > 1)}[family]
    np.testing.assert_array_equal(np.isfinite(r["mode"]), interior)
    for i in np.flatnonzero(interior):
        args = scipy_args(fitted, family, i)
        mode, peak = r["mode"][i], DISTS[family].logpdf(r["mode"][i], *args)
        assert np.all(DISTS[family].logpdf(mode * np.array([1 - 1e-4, 1 + 1e-4]), *args) < peak)


def test_scale_equivariance_and_row_independence(samples, fitted):
    """Rescaling a sample rescales only `scale` and `mode`; a row's fit does not depend on the
    other rows or on how much NaN padding it carries."""
    alone = fit_quietly([samples[3]])
    wide = fit_families(pad([samples[3]], m=200))
    scaled = fit_quietly([s * 7.5 for s in samples])
    for family in FAMILIES:
        # near the lognormal limit (small |c|, large a) the gengamma parameters slide along a
        # flat ridge of the likelihood, and log scale ~ -log(a) / c amplifies that further
        rtol = {"shape": 1e-6, "shape2": 1e-6, "scale": 1e-5} if family == "gengamma" else {}
        for field in ("shape", "shape2", "ks", "hist_error"):
            np.testing.assert_allclose(scaled[family][field], fitted[family][field],
                                       rtol=rtol.get(field, 1e-8))
        for field in ("scale", "mode"):
            np.testing.assert_allclose(scaled[family][field], 7.5 * fitted[family][field],
                                       rtol=rtol.get("scale", 1e-8))
        for field in FIELDS:
            np.testing.assert_allclose(alone[family][field], fitted[family][field][3:4], rtol=1e-9)
            np.testing.assert_allclose(wide[family][field], alone[family][field], rtol=1e-9)


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
        for field in FIELDS[:-1]:
            values = res[family][field]
            assert np.all(np.isnan(values[1:7])), (family, field)
            if field not in ("shape2", "mode"):  # a boundary fit (three values, three parameters) has none
                params = field in ("shape", "scale")
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
        for field in ("shape", "scale"):  # boundary fits carry no parameters
            np.testing.assert_array_equal(np.isfinite(res[family][field]), ok)
    for i in np.flatnonzero(res["gengamma"]["status"] == "ok"):
        args = scipy_args(res, "gengamma", i)
        np.testing.assert_allclose(res["gengamma"]["loglik"][i],
                                   stats.gengamma.logpdf(rows[i], *args).sum(), rtol=1e-9)
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
    KS, histogram error). Log-symmetric samples: the profile peaks at c -> 0, the lognormal limit.
    Gamma draws stay 'ok' with finite parameters."""
    rng = np.random.default_rng(4)
    z = stats.norm.ppf((np.arange(1, 25) - 0.5) / 24)
    upper = [rng.uniform(0.0, 1.0, 64), rng.power(2.0, 48) * 3.0, rng.power(0.7, 40)]
    lower = [rng.pareto(3.0, 64) + 1.0, (rng.pareto(1.5, 50) + 1.0) * 1e-3]
    symmetric = [np.exp(np.r_[z, -z] * 0.4) * 5.0, np.exp(np.r_[z, -z] * 1.5)]
    interior = [rng.gamma(4.0, 2.0, 64), rng.gamma(1.5, 1.0, 48)]
    rows = upper + lower + symmetric + interior
    res = fit_quietly(rows)
    g = res["gengamma"]
    expected = ["boundary"] * (len(rows) - len(interior)) + ["ok"] * len(interior)
    assert list(g["status"]) == expected
    for family in ("gamma", "lognormal", "weibull"):
        assert np.all(res[family]["status"] == "ok")
    for field in ("shape", "shape2", "scale", "mode"):
        assert np.all(np.isnan(g[field][:-len(interior)])) and np.all(np.isfinite(g[field][-len(interior):]))

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

    for i, x in enumerate(symmetric, start=len(upper + lower)):
        for field in ("loglik", "ks", "hist_error"):
            assert g[field][i] == res["lognormal"][field][i]
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
