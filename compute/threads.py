"""Thread policy of the CPU linear algebra: parallel over pieces of a layer, one BLAS thread per piece.

A layer is many small independent problems (one QR of N x 2n and a few 2n x 2n
decompositions per head). Threading *inside* each LAPACK call scales poorly at these
sizes, and OpenMP/OpenBLAS teams that spin at barriers collapse when the machine is
shared (measured on 2 cores under load: torch's eigvalsh on (9, 128, 128) 9 ms with one
thread, 80 ms to 6 s with two; numpy's baseline eigvalsh 4 ms against 140 ms). So on the
CPU a layer's problems are cut into batches spread over a pool of workers, each running
single-threaded LAPACK/BLAS: no barriers, and a descheduled worker only delays its own batch.

numpy runs a batched linear-algebra call without the GIL only when the batch times the length
of its output's core dimensions exceeds GIL_FREE_OUTPUTS (its ufunc threading threshold): a
smaller call, one head's QR say, holds the GIL and the pool runs one piece at a time. `batches`
cuts work into pieces above that size.
"""
from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterable, TypeVar

from threadpoolctl import threadpool_limits

T = TypeVar("T")
R = TypeVar("R")

# numpy's NPY_BEGIN_THREADS_THRESHOLDED: a (g)ufunc call releases the GIL above this many iterations,
# counted over the batch and the output's core dimensions (eigvalsh of (b, m, m): b * m).
GIL_FREE_OUTPUTS = 500


def _cores() -> int:
    """OMP_NUM_THREADS when set, else the cores this process may run on."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return int(os.environ["OMP_NUM_THREADS"])
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Worker threads for the CPU pool.
WORKERS = max(1, _cores())
_LIMITED = threading.local()  # depth of single_threaded() in this thread: only the outermost sets the limits


def set_workers(count: int) -> None:
    """Size of the CPU pool; a worker process of a parallel run (--jobs) uses 1, the cores being its siblings'."""
    global WORKERS
    WORKERS = max(1, count)


@contextmanager
def single_threaded():
    """The BLAS and OpenMP pools of numpy and scipy (and torch's, if loaded), at one thread for the duration.

    Nested uses cost nothing (threadpoolctl's library scan takes about a millisecond each time)."""
    depth = getattr(_LIMITED, "depth", 0)
    if depth:
        _LIMITED.depth = depth + 1
        try:
            yield
        finally:
            _LIMITED.depth = depth
        return
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else None
    if torch:
        torch.set_num_threads(1)
    _LIMITED.depth = 1
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        _LIMITED.depth = 0
        if torch:
            torch.set_num_threads(threads)


def _one_thread(fn: Callable[..., R], *args) -> R:
    """fn(*args) in a pool thread, with torch's OpenMP at one thread (its count is per calling thread)."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    return fn(*args)


class Pool:
    """Up to WORKERS threads for the independent pieces of one layer, run in the order they are submitted,
    each with single-threaded BLAS; with one worker a piece runs as it is submitted, in the caller's thread.

    Pieces are submitted all at once and collected as needed (`Future.result`), so the caller's own work,
    the fits say, overlaps the pieces still running. A piece must not use the pool itself."""

    def __init__(self):
        self._limits = single_threaded()
        self._executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="headforms") if WORKERS > 1 else None

    def submit(self, fn: Callable[..., R], *args) -> Future:
        if self._executor is not None:
            return self._executor.submit(_one_thread, fn, *args)
        future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # raised where the result is collected, as from a thread
            future.set_exception(exc)
        return future

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """[fn(item) for item in items], in order."""
        return [future.result() for future in [self.submit(fn, item) for item in items]]

    def __enter__(self) -> "Pool":
        self._limits.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
        finally:
            self._limits.__exit__(*exc)


def map_threads(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """[fn(item) for item in items], over a pool of WORKERS threads, each single-threaded.

    fn should spend its time in LAPACK calls large enough to release the GIL (see `batches`)."""
    with Pool() as pool:
        return pool.map(fn, items)


def chunks(total: int, parts: int) -> list[slice]:
    """Split range(total) into at most `parts` contiguous slices of near-equal size."""
    parts = max(1, min(parts, total))
    bounds = [total * i // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def batches(total: int, width: int) -> list[slice]:
    """range(total) in contiguous slices for the pool: up to 4 per worker (to balance them), each with more than
    GIL_FREE_OUTPUTS / width items where `total` allows (`width`: a call's output length per item), so that
    numpy computes it without holding the GIL."""
    least = GIL_FREE_OUTPUTS // max(width, 1) + 1
    return chunks(total, min(4 * WORKERS, max(1, total // least)))
