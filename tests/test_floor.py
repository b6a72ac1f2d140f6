"""The bench's floor (tests/floor.py) times the problems the tables need: its forms have the spectra of the dense
N x N forms L = W_K^T W_Q and L_delta = W_K^T R(delta) W_Q, and its rotations are RoPE's."""
import numpy as np
import pytest

from headforms.compute.rotary import Rotation
from headforms.extract.layouts.rope import rope
from tests import floor

H, HKV, n, N = 4, 2, 6, 30


def nonzero(values: np.ndarray, scale: float) -> np.ndarray:
    """The values of magnitude above 1e-9 * scale, sorted."""
    return np.sort(values[np.abs(values) > 1e-9 * scale])


@pytest.fixture(scope="module")
def layer():
    rng = np.random.default_rng(19)
    wq, wk = rng.standard_normal((H, n, N)), rng.standard_normal((HKV, n, N))
    kv = np.arange(H) // (H // HKV)
    per_head, per_group = floor.stacks(wq, wk, kv)
    return wq, wk, kv, np.linalg.qr(per_head.swapaxes(-2, -1), mode="r"), per_group


@pytest.mark.parametrize("pairing", ["split-half", "interleaved"])
def test_rotations_are_ropes(pairing):
    freq = [1.0, 0.3]  # 4 of 6 coordinates rotated: two stay
    rot = floor.rotations(n, pairing, freq, [0, 3, 17])
    for matrix, delta in zip(rot, [0, 3, 17]):
        np.testing.assert_allclose(matrix, Rotation.of(pairing, freq).matrix(delta, n), atol=1e-15)


def test_form_problems_have_the_dense_spectra(layer):
    wq, wk, kv, R, _ = layer
    p = floor.form_problems(R, n)
    for h in range(H):
        L = wk[kv[h]].T @ wq[h]
        scale = np.linalg.norm(L)
        S, T = (L + L.T) / 2, (L - L.T) / 2
        np.testing.assert_allclose(nonzero(np.linalg.eigvalsh(p["S"][h]), scale),
                                   nonzero(np.linalg.eigvalsh(S), scale), rtol=1e-9)
        np.testing.assert_allclose(nonzero(np.linalg.svd(p["T"][h], compute_uv=False), scale),
                                   nonzero(np.linalg.svd(T, compute_uv=False), scale), rtol=1e-9)
        np.testing.assert_allclose(nonzero(np.abs(np.linalg.eigvals(p["A"][h])), scale),
                                   nonzero(np.abs(np.linalg.eigvals(L)), scale), rtol=1e-7)
        np.testing.assert_allclose(nonzero(np.linalg.svd(p["AB"][h], compute_uv=False), scale),
                                   nonzero(np.linalg.svd(L, compute_uv=False), scale), rtol=1e-9)


def test_distance_problems_have_the_dense_spectra(layer):
    wq, wk, kv, R, _ = layer
    conventions = rope(10000.0, 4, "split-half")
    deltas = [1, 64]
    s = floor.distance_problems(R, n, conventions, deltas)
    rot = Rotation.of(conventions.pairing, conventions.frequencies)
    for d, delta in enumerate(deltas):
        for h in range(H):
            L = wk[kv[h]].T @ rot.matrix(delta, n) @ wq[h]
            scale = np.linalg.norm(L)
            np.testing.assert_allclose(nonzero(np.linalg.eigvalsh(s[d * H + h]), scale),
                                       nonzero(np.linalg.eigvalsh((L + L.T) / 2), scale), rtol=1e-9)


def test_shared_key_qr_has_the_dense_spectra(layer):
    wq, wk, kv, _, _ = layer
    blocks = floor.shared_key_qr(floor.key_groups(wq, wk, kv), n)
    for j, (r_kk, top, r_qq) in enumerate(blocks):
        for i, h in enumerate(np.flatnonzero(kv == j)):
            l = np.zeros((2 * n, 2 * n))
            l[:n] = r_kk @ np.vstack([top[i], r_qq[i]]).T           # R_K R_Q^T, R_K's rows below n zero
            L = wk[j].T @ wq[h]
            scale = np.linalg.norm(L)
            np.testing.assert_allclose(nonzero(np.linalg.eigvalsh((l + l.T) / 2), scale),
                                       nonzero(np.linalg.eigvalsh((L + L.T) / 2), scale), rtol=1e-9)
            np.testing.assert_allclose(nonzero(np.linalg.svd(l, compute_uv=False), scale),
                                       nonzero(np.linalg.svd(L, compute_uv=False), scale), rtol=1e-9)


def test_shared_key_qr_needs_shared_keys_and_room_below_them():
    rng = np.random.default_rng(3)
    wq, wk = rng.standard_normal((4, 6, 30)), rng.standard_normal((4, 6, 30))
    assert floor.key_groups(wq, wk, np.arange(4)) == []           # one query head per key head
    assert floor.key_groups(wq[:, :, :10], wk[:2, :, :10], np.arange(4) // 2) == []   # N < 2n
    assert len(floor.key_groups(wq, wk[:2], np.arange(4) // 2)) == 2


def test_group_stacks_hold_each_groups_key_and_queries(layer):
    wq, wk, kv, _, per_group = layer
    g = H // HKV
    for j in range(HKV):
        np.testing.assert_array_equal(per_group[j, :n], wk[j])
        for i in range(g):
            np.testing.assert_array_equal(per_group[j, n * (1 + i):n * (2 + i)], wq[j * g + i])
            assert kv[j * g + i] == j


def test_floor_adds_start_compute_over_cores_and_reading():
    f = floor.Floor({"qr": 1.0, "spectra": 2.0, "distances": 3.0, "baseline": 0.0}, cores=2, start=0.5,
                    qk_bytes=2_000_000_000, read_gbps=4.0)
    assert f.compute == 3.0 and f.reading == 0.5 and f.total == 4.0


def test_layer_floor_times_every_part(layer):
    wq, wk, kv, _, _ = layer
    with_rope = floor.layer_floor(wq, wk, kv, rope=rope(10000.0, 6, "interleaved"), deltas=(0, 1, 2), repeats=1)
    without = floor.layer_floor(wq, wk, kv, repeats=1)
    assert set(with_rope) == set(floor.PARTS) - {"copying", "up-projections"} and all(v > 0 for v in with_rope.values())
    assert without["distances"] == 0.0 and all(without[p] > 0 for p in ("qr", "spectra", "baseline"))


def test_the_copying_floor_times_the_products_a_model_without_unembedding_skips(layer):
    """The output-value circuits' extra part: the Gram once per model (none without W_U), and a layer's products
    and eigenvalues, more of them where there is a Gram."""
    wq, wk, kv, _, _ = layer
    rng = np.random.default_rng(1)
    w_e, w_u = rng.normal(size=(50, wq.shape[2])), rng.normal(size=(50, wq.shape[2]))
    assert floor.gram_floor(w_e, None) == 0.0 and floor.gram_floor(w_e, w_u, repeats=1) > 0
    w_o = wq.transpose(0, 2, 1)
    assert floor.copying_floor(wk, w_o, kv, w_e.T @ w_u, repeats=1) > 0
    assert floor.copying_floor(wk, w_o, kv, None, repeats=1) > 0
    assert "copying 0.00" in floor.Floor({"qr": 1.0}, cores=1, start=0.0, qk_bytes=0, read_gbps=1.0).describe()


def test_parallel_share_is_a_share_of_the_ideal_and_the_floor_says_it(layer):
    """The machine's share of ideal full use on a layer's own largest part (a positive fraction, at most a little
    over 1 for timing noise); the floor prints what it would be at that share, its targets unchanged."""
    wq, wk, kv, _, _ = layer
    share = floor.parallel_share(wq, wk, kv, rope=rope(10000.0, 6, "interleaved"), deltas=(0, 1, 2), repeats=1)
    assert 0 < share < 1.5
    f = floor.Floor({"qr": 1.0, "spectra": 2.0, "distances": 3.0, "baseline": 0.0}, cores=2, start=0.5,
                    qk_bytes=2_000_000_000, read_gbps=4.0, share=0.75)
    assert f.total == 4.0 and "the floor would be 5.00 s" in f.describe()
