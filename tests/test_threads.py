"""The CPU thread policy: how many workers, and that each runs single-threaded BLAS."""
import contextlib
import os
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from headforms.compute import threads


@pytest.fixture
def workers():
    """Restores the pool size a test changes."""
    before = threads.WORKERS
    yield
    threads.WORKERS = before


def test_cores_are_omp_num_threads_when_it_is_a_number(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert threads._cores() == 7
    for value in ("", "two", "-1"):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert threads._cores() == len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads._cores() == len(os.sched_getaffinity(0))


def test_cores_without_an_affinity_call_are_the_cpu_count(monkeypatch):
    """Platforms without sched_getaffinity (macOS, Windows) count the CPUs; an unknown count is 1."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert threads._cores() == 64
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert threads._cores() == 5
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert threads._cores() == 1


def test_set_workers_keeps_at_least_one(workers):
    threads.set_workers(3)
    assert threads.WORKERS == 3
    threads.set_workers(0)
    assert threads.WORKERS == 1


def test_map_threads_keeps_order_and_runs_single_threaded_blas(workers):
    """Results in the items' order, on up to WORKERS pool threads, each with BLAS at one thread; inline for one."""
    seen = []

    def work(i):
        blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
        seen.append((threading.current_thread().name, blas))
        return np.linalg.eigvalsh(np.diag([float(i), -float(i)]))[1]

    threads.set_workers(2)
    assert threads.map_threads(work, range(6)) == [float(i) for i in range(6)]
    assert all(name.startswith("headforms") and set(blas) <= {1} for name, blas in seen)
    seen.clear()
    threads.set_workers(1)
    assert threads.map_threads(work, iter([3, 1])) == [3.0, 1.0]
    assert [name for name, _ in seen] == [threading.current_thread().name] * 2
    assert threads.map_threads(work, []) == []


@pytest.mark.parametrize("count", [2, 3])
def test_the_pool_runs_workers_pieces_at_once(workers, count):
    """Pieces submitted together run WORKERS at a time, no more (no more threads than the cores they were sized for)
    and no fewer (each piece waits until WORKERS of them are running)."""
    threads.set_workers(count)
    lock, running, most = threading.Lock(), [0], [0]
    together = threading.Barrier(count, timeout=30)

    def piece(_):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        together.wait()
        threading.Event().wait(0.02)  # time for any further thread to start a piece (none can, with WORKERS threads)
        with lock:
            running[0] -= 1

    with threads.Pool() as pool:
        pool.map(piece, range(4 * count))
    assert most[0] == count


@pytest.mark.parametrize("leaving", ["normally", "by an exception"])
def test_leaving_the_pool_finishes_its_pieces_or_cancels_those_not_started(workers, leaving):
    """Left normally, the pool waits for every piece submitted (collected or not); left by an exception (a failed
    layer, Ctrl-C), the pieces not started yet are cancelled, so the error is not held up by work nobody will read,
    and those running are waited for."""
    threads.set_workers(2)
    release, started = threading.Event(), threading.Barrier(3, timeout=30)
    ran = []

    def blocker():  # holds a pool thread until released
        started.wait()
        release.wait(30)
        ran.append("blocker")

    def queued(i):
        ran.append(i)

    pool = threads.Pool()
    with pytest.raises(RuntimeError) if leaving != "normally" else contextlib.nullcontext():
        with pool:
            for _ in range(2):
                pool.submit(blocker)
            started.wait()  # both pool threads are held: what follows waits in the queue
            for i in range(6):
                pool.submit(queued, i)
            threading.Timer(0.2, release.set).start()
            if leaving != "normally":
                raise RuntimeError("injected")
    assert ran.count("blocker") == 2  # the running pieces were waited for either way
    assert sorted(x for x in ran if x != "blocker") == ([] if leaving != "normally" else list(range(6)))


def test_pool_threads_run_torch_single_threaded(workers):
    """torch's OpenMP thread count is per calling thread: each pool thread sets its own to 1."""
    import torch

    threads.set_workers(2)
    assert set(threads.map_threads(lambda _: torch.get_num_threads(), range(8))) == {1}


def test_single_threaded_restores_torch_threads():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threads.single_threaded():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("total, parts", [(10, 3), (3, 8), (0, 4), (7, 1), (8, 0)])
def test_chunks_split_the_range_into_near_equal_contiguous_parts(total, parts):
    pieces = threads.chunks(total, parts)
    assert [i for piece in pieces for i in range(total)[piece]] == list(range(total))
    assert len(pieces) <= max(1, parts)
    sizes = [piece.stop - piece.start for piece in pieces]
    assert not sizes or (min(sizes) >= 1 and max(sizes) - min(sizes) <= 1)
