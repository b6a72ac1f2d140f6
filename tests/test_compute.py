"""compute/: the reduction, spectra and statistics against dense float64 algebra and the
closed forms of statistics.md section 5."""
import numpy as np
import pytest
from scipy import stats

from headforms.compute.baseline import random_forms
from headforms.compute.reduction import head_factors, reduce_forms
from headforms.compute.spectra import spectra
from headforms.compute.statistics import fit_samples, head_statistics, parity
from tests.dense import dense_reference

RNG = np.random.default_rng(7)


def analyse(wq, wk, kv_index=None):
    kv_index = np.arange(len(wq)) if kv_index is None else kv_index
    sp = spectra(reduce_forms(wq, wk, kv_index))
    return sp, head_statistics(sp, wq.shape[2])


def test_reduced_spectra_equal_dense_spectra_with_grouped_query_heads():
    N, n, H, Hkv = 96, 8, 6, 2
    wq, wk = RNG.standard_normal((H, n, N)), RNG.standard_normal((Hkv, n, N))
    kv = np.arange(H) // (H // Hkv)
    sp, _ = analyse(wq, wk, kv)
    for h in range(H):
        L = wk[kv[h]].T @ wq[h]
        S, T = (L + L.T) / 2, (L - L.T) / 2
        dense_s = np.sort(np.linalg.eigvalsh(S))[::-1]
        nonzero = np.concatenate([dense_s[:n], dense_s[-n:]])
        np.testing.assert_allclose(sp.eig_S[h], nonzero, rtol=1e-9, atol=1e-9 * abs(dense_s).max())
        np.testing.assert_allclose(sp.sv_T[h], np.linalg.svd(T, compute_uv=False)[: 2 * n], rtol=1e-9,
                                   atol=1e-9 * abs(dense_s).max())
        np.testing.assert_allclose(sp.sv_L[h][:n], np.linalg.svd(L, compute_uv=False)[:n], rtol=1e-9)
        dense_l = np.linalg.eigvals(L)
        dense_l = dense_l[np.argsort(-abs(dense_l), kind="stable")][:n]
        np.testing.assert_allclose(np.sort_complex(sp.eig_L[h][:n]), np.sort_complex(dense_l), rtol=1e-8)


@pytest.mark.parametrize("N, kv", [
    (96, [0, 0, 0, 1, 1, 1]),   # key/value groups of adjacent heads
    (96, [0, 1, 0, 1, 2, 1]),   # groups interleaved, and a head alone with its key head
    (12, [0, 0, 1, 1, 2, 2]),   # n < N < 2n: R has N rows
    (5, [0, 0, 1, 1, 2, 2]),    # N < n: the key part fills R
])
def test_factors_sharing_a_key_head_are_the_stacked_qrs(N, kv):
    """head_factors shares each key head's QR among its query heads: the R of every head's stack [W_K; W_Q]
    all the same, up to the signs of its rows (LAPACK's Householder QR of the stack itself)."""
    n, kv = 8, np.array(kv)
    wq, wk = RNG.standard_normal((len(kv), n, N)), RNG.standard_normal((kv.max() + 1, n, N))
    ours = head_factors(wk, kv, wq)
    for h in range(len(kv)):
        stacked = np.linalg.qr(np.concatenate([wk[kv[h]], wq[h]]).T, mode="r")
        signs = np.sign(np.diag(stacked)) * np.sign(np.diag(ours[h]))
        np.testing.assert_allclose(ours[h], signs[:, None] * stacked, rtol=0, atol=1e-12 * np.abs(stacked).max())


def test_statistics_equal_an_independent_dense_computation():
    N, n, H = 80, 6, 5
    wq, wk = RNG.standard_normal((H, n, N)), RNG.standard_normal((H, n, N))
    wq[1] += 0.8 * wk[1]   # symmetric-leaning head
    wq[2] -= 0.9 * wk[2]   # negative-leaning head
    _, st = analyse(wq, wk)
    for h in range(H):
        ref = dense_reference(wk[h].T @ wq[h], n)
        for key, value in ref.items():
            np.testing.assert_allclose(st[key][h], value, rtol=1e-9, atol=1e-12, err_msg=key)
    np.testing.assert_allclose(st["a"] + st["b"] + st["c"] + st["d"], 1, rtol=1e-12)
    np.testing.assert_allclose(st["b"], (1 - st["a"]) * st["b_sym"], rtol=1e-12)
    assert (st["n_pos"] == n).all() and (st["n_neg"] == n).all() and (st["n_zero"] == 0).all()
    assert (st["n_zero_ambient"] == N - 2 * n).all()


@pytest.mark.parametrize("t", [0.6, -0.3, 0.0])
def test_rank_one_closed_form(t):
    N, h = 40, 2.5
    u = RNG.standard_normal(N)
    u /= np.linalg.norm(u)
    w = RNG.standard_normal(N)
    w -= (w @ u) * u
    w /= np.linalg.norm(w)
    v = t * u + np.sqrt(1 - t**2) * w   # unit, <u, v> = t
    sp, st = analyse((h * v)[None, None, :], u[None, None, :])   # L = W_K^T W_Q = h u v^T
    np.testing.assert_allclose(sp.eig_S[0], [h * (1 + t) / 2, -h * (1 - t) / 2], atol=1e-12)
    np.testing.assert_allclose([st["a"][0], st["b"][0]], [(1 - t**2) / 2] * 2, atol=1e-12)
    np.testing.assert_allclose([st["c"][0], st["d"][0]], [t**2 if t > 0 else 0, t**2 if t < 0 else 0], atol=1e-12)
    np.testing.assert_allclose(sp.sigma_T[0], [h * np.sqrt(1 - t**2) / 2], atol=1e-12)
    np.testing.assert_allclose(sp.sigma_T[0, 0], np.sqrt(h * (1 + t) / 2 * h * (1 - t) / 2), atol=1e-12)
    np.testing.assert_allclose(st["geometric_mean_error"][0], 0, atol=1e-12)


def symmetric_head(eigenvalues: np.ndarray, N: int):
    """W_Q, W_K (n = len(eigenvalues)) with L = Q diag(eigenvalues) Q^T."""
    q, _ = np.linalg.qr(RNG.standard_normal((N, len(eigenvalues))))
    return (np.diag(eigenvalues) @ q.T)[None], q.T[None]


@pytest.mark.parametrize("rho", [0.5, 0.8, 1.0])
def test_proportional_lobes_closed_form(rho):
    lam = np.sort(RNG.gamma(2.0, 1.0, size=12))[::-1]
    wq, wk = symmetric_head(np.concatenate([lam, -rho * lam]), 64)
    _, st = analyse(wq, wk)
    expected = np.array([2 * rho, (1 - rho) ** 2, 0]) / (1 + rho**2)
    np.testing.assert_allclose([st["b"][0], st["c"][0], st["d"][0]], expected, atol=1e-12)
    np.testing.assert_allclose(st["a"][0], 0, atol=1e-12)
    np.testing.assert_allclose(st["rho"][0], rho, rtol=1e-12)
    np.testing.assert_allclose(st["lobe_departure"][0], 0, atol=1e-12)
    np.testing.assert_allclose(st["pairing_gap"][0], 0, atol=1e-12)   # the bound is attained
    if rho == 0.5:
        np.testing.assert_allclose([st["b"][0], st["c"][0], st["d"][0]], [0.8, 0.2, 0.0], atol=1e-12)


def test_psd_and_antisymmetric_vertices():
    wq, wk = symmetric_head(RNG.uniform(0.5, 3, size=10), 50)
    _, st = analyse(wq, wk)
    np.testing.assert_allclose([st[k][0] for k in "abcd"], [0, 0, 1, 0], atol=1e-12)
    assert parity(st["c_sym"], st["d_sym"])[0] == "I+"
    wq, wk = symmetric_head(-RNG.uniform(0.5, 3, size=10), 50)
    _, st = analyse(wq, wk)
    np.testing.assert_allclose([st[k][0] for k in "abcd"], [0, 0, 0, 1], atol=1e-12)
    assert st["parity"][0] == "I-"
    N, m = 50, 5   # antisymmetric: L = Q J Q^T with 2 x 2 rotation blocks
    q, _ = np.linalg.qr(RNG.standard_normal((N, 2 * m)))
    J = np.zeros((2 * m, 2 * m))
    s = RNG.uniform(1, 2, m)
    J[2 * np.arange(m), 2 * np.arange(m) + 1], J[2 * np.arange(m) + 1, 2 * np.arange(m)] = s, -s
    sp, st = analyse((J @ q.T)[None], q.T[None])
    np.testing.assert_allclose([st[k][0] for k in "abcd"], [1, 0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(np.sort(sp.sigma_T[0][:m]), np.sort(s), rtol=1e-12)


def test_random_heads_profile_and_baseline():
    N, n, H = 256, 16, 64
    wq, wk = RNG.standard_normal((H, n, N)), RNG.standard_normal((H, n, N))
    _, st = analyse(wq, wk)
    assert abs(st["a"].mean() - 0.5) < 0.02 and abs(st["b"].mean() - 0.5) < 0.05
    assert st["c"].mean() + st["d"].mean() < 0.05
    assert abs(st["symmetric_energy"].mean() - (N + 1) / (2 * N)) < 0.01
    # The Bartlett-sampled baseline has the distribution of the Gaussian heads above.
    sp_rand = spectra(__import__("torch").as_tensor(random_forms(3, 0, 4 * H, n, N)))
    st_rand = head_statistics(sp_rand, N)
    assert stats.ks_2samp(st_rand["symmetric_energy"], st["symmetric_energy"]).pvalue > 1e-3
    assert stats.ks_2samp(st_rand["pairing"], st["pairing"]).pvalue > 1e-3
    np.testing.assert_array_equal(random_forms(3, 1, 2, n, N), random_forms(3, 1, 2, n, N))
    assert not np.allclose(random_forms(3, 1, 2, n, N), random_forms(3, 2, 2, n, N))


def test_zero_form_and_empty_lobe_give_nan_not_errors():
    wq, wk = np.zeros((2, 4, 20)), RNG.standard_normal((2, 4, 20))
    psd_q, psd_k = symmetric_head(RNG.uniform(1, 2, 4), 20)   # PSD head: empty negative lobe
    wq[1], wk[1] = psd_q[0], psd_k[0]
    L1 = wk[1].T @ wq[1]
    assert np.linalg.eigvalsh((L1 + L1.T) / 2).min() > -1e-9
    sp, st = analyse(wq, wk)
    assert st["n_pos"][0] == st["n_neg"][0] == 0 and st["frobenius"][0] == 0
    for key in ("symmetric_energy", "a", "pairing", "rho", "participation_ratio", "trace_ratio"):
        assert np.isnan(st[key][0]), key
    assert st["parity"][0] is None
    assert np.isnan(st["lobe_departure"][1]) and st["rho"][1] == 0
    samples = fit_samples(sp, 4)
    assert np.isnan(samples["S_pos"][0]).all() and np.isnan(samples["S_neg"][1]).all()
