"""One layer's linear algebra as pieces on a pool: the pieces are large enough for numpy to release the GIL,
they run concurrently with the caller's own work, and the layer's numbers do not depend on how it was cut."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from headforms.compute import threads
from headforms.compute.analysis import analyse_layer
from headforms.compute.reduction import forms, reduce_factors
from headforms.compute.rotary import Rotation, distance_profiles
from headforms.compute.spectra import batch_spectra, spectra

RNG = np.random.default_rng(19)


@pytest.fixture
def workers():
    """Restores the pool size a test changes."""
    before = threads.WORKERS
    yield
    threads.WORKERS = before


def layer(n_heads=6, n_kv=3, n=8, N=40):
    """A random grouped-query layer: wq (H, n, N), wk (H_kv, n, N), each query head's key head."""
    return (RNG.standard_normal((n_heads, n, N)), RNG.standard_normal((n_kv, n, N)),
            np.repeat(np.arange(n_kv), n_heads // n_kv))


@pytest.mark.parametrize("total, width", [(9, 128), (9, 64), (32, 256), (12, 32), (3, 1000), (0, 64), (1, 1)])
def test_batches_are_above_numpys_gil_threshold_where_the_total_allows(workers, total, width):
    """Contiguous, covering, at most 4 per worker, and each with more than GIL_FREE_OUTPUTS outputs unless the whole
    range has fewer (then one piece)."""
    threads.set_workers(2)
    pieces = threads.batches(total, width)
    assert [i for piece in pieces for i in range(total)[piece]] == list(range(total))
    assert len(pieces) <= 8
    sizes = [piece.stop - piece.start for piece in pieces]
    if total * width > threads.GIL_FREE_OUTPUTS:
        assert all(size * width > threads.GIL_FREE_OUTPUTS for size in sizes)
    else:
        assert len(pieces) <= 1
    if total and total * width > 2 * (threads.GIL_FREE_OUTPUTS + width):
        assert len(pieces) >= 2  # enough work for both workers is split between them


@pytest.mark.parametrize("total, width, group", [(9, 128, 3), (32, 256, 4), (15, 128, 3), (40, 128, 3), (12, 64, 1),
                                                  (24, 16, 6), (7, 128, 7), (50, 128, 2)])
def test_batches_keep_key_value_groups_whole(workers, total, width, group):
    """With the key head of each query head, the slices cover the range in order, never cut a group and stay at most
    4 per worker; each holds more than GIL_FREE_OUTPUTS outputs where whole groups allow it; groups of one head
    cut as without them."""
    threads.set_workers(2)
    kv = np.arange(total) // group
    pieces = threads.batches(total, width, kv)
    assert [i for piece in pieces for i in range(total)[piece]] == list(range(total))
    assert len(pieces) <= 8
    assert all(piece.start == 0 or kv[piece.start] != kv[piece.start - 1] for piece in pieces)
    if total * width > threads.GIL_FREE_OUTPUTS:
        assert all((piece.stop - piece.start) * width > threads.GIL_FREE_OUTPUTS for piece in pieces)
    if group == 1:
        assert pieces == threads.batches(total, width)
    if total * width > 2 * (threads.GIL_FREE_OUTPUTS + group * width):
        assert len(pieces) >= 2


def test_pool_pieces_run_beside_the_caller_and_raise_where_collected(workers):
    """A piece runs on a pool thread while the caller still works (it waits for the caller here); a failing piece
    raises its own exception at result(); with one worker pieces run in the caller's thread as submitted."""
    threads.set_workers(2)
    caller_done = threading.Event()
    with threads.Pool() as pool:
        waiting = pool.submit(lambda: caller_done.wait(timeout=60) and threading.current_thread().name)
        failing = pool.submit(lambda: 1 / 0)
        caller_done.set()  # only the caller sets it: the piece was running concurrently, not after
        assert waiting.result().startswith("headforms")
        with pytest.raises(ZeroDivisionError):
            failing.result()
    threads.set_workers(1)
    seen = []
    with threads.Pool() as pool:
        future = pool.submit(lambda: seen.append(threading.current_thread().name) or 7)
        assert seen == [threading.current_thread().name] and future.result() == 7
        assert pool.submit(lambda: [][0]).exception().__class__ is IndexError


def test_nested_single_threaded_keeps_the_outer_limits():
    """The outermost single_threaded sets BLAS to one thread and restores it; inner ones change nothing."""
    from threadpoolctl import threadpool_info

    def blas():
        return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]

    before = blas()
    with threads.single_threaded():
        with threads.single_threaded():
            assert set(blas()) <= {1}
        assert set(blas()) <= {1}  # still limited after the inner one ended
    assert blas() == before


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_the_layer_is_the_same_however_it_is_cut(workers, monkeypatch, count):
    """Spectra, statistics, fits and distance profiles of a layer, bit for bit, with 1, 2, 3 or 5 workers (a
    different cut of heads into pieces each time: any piece size allowed here), and equal to the unpooled `batch_spectra`."""
    monkeypatch.setattr(threads, "GIL_FREE_OUTPUTS", 0)
    wq, wk, kv = layer()
    rotation = Rotation.of("split-half", 10000.0 ** -(np.arange(4) / 4))
    threads.set_workers(1)
    reference = analyse_layer(wq, wk, kv, layer=3, seed=5, rotation=rotation, deltas=(0, 1, 7))
    threads.set_workers(count)
    ours = analyse_layer(wq, wk, kv, layer=3, seed=5, rotation=rotation, deltas=(0, 1, 7))
    for name, value in reference.statistics.items():
        np.testing.assert_array_equal(ours.statistics[name], value, err_msg=name)
    for name in ("eig_S", "sv_T", "sigma_T", "eig_L", "sv_L"):
        np.testing.assert_array_equal(getattr(ours.spectra, name), getattr(reference.spectra, name), err_msg=name)
    for name, got in zip(("eig_S", "sv_T", "eig_L", "sv_L"), batch_spectra(forms(reduce_factors(wq, wk, kv), 8))):
        np.testing.assert_array_equal(getattr(ours.spectra, name), got, err_msg=name)
    for sample, families in reference.fits.items():
        for family, columns in families.items():
            for column, value in columns.items():
                np.testing.assert_array_equal(ours.fits[sample][family][column], value)
    for column, value in reference.distances.items():
        np.testing.assert_array_equal(ours.distances[column], value, err_msg=column)


def test_delta_zero_profile_reuses_the_spectra_and_equals_solving_it(workers):
    """The layer's distance profile at delta 0 takes eig(S) from the spectra (L_0 = L) instead of solving again:
    it equals distance_profiles, which solves every delta, and the heads' own statistics; other deltas differ."""
    threads.set_workers(2)
    wq, wk, kv = layer(n_heads=4, n_kv=2, n=6, N=30)
    rotation = Rotation.of("interleaved", np.array([1.0, 0.1, 0.01]))
    ours = analyse_layer(wq, wk, kv, layer=0, seed=0, rotation=rotation, deltas=(0, 3))
    solved = distance_profiles(reduce_factors(wq, wk, kv), 6, rotation, (0, 3))
    for column in ("frobenius", "symmetric_energy", "a", "b", "c", "d", "pairing"):
        np.testing.assert_allclose(ours.distances[column], solved[column], rtol=1e-12, atol=1e-14, err_msg=column)
        np.testing.assert_allclose(ours.distances[column][0], ours.statistics[column], rtol=1e-12, atol=1e-14)
    assert not np.allclose(ours.distances["symmetric_energy"][1], ours.distances["symmetric_energy"][0])
    np.testing.assert_array_equal(ours.distances["parity"], solved["parity"])
    np.testing.assert_array_equal(spectra(forms(reduce_factors(wq, wk, kv), 6)).eig_S, ours.spectra.eig_S)
