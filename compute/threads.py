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

import ctypes
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
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
_LIMIT = threading.Lock()
_LIMITED = [0, None]  # single_threaded() uses open in this process, and torch's thread count before the first


def set_workers(count: int) -> None:
    """Size of the CPU pool; a worker process of a parallel run (--jobs) uses 1, the cores being its siblings'."""
    global WORKERS
    WORKERS = max(1, count)


@contextmanager
def single_threaded():
    """The BLAS and OpenMP pools of numpy and scipy (and torch's, if loaded), at one thread while any use is open.

    The limits are the process's, so uses are counted across threads: the first sets them, the last restores
    them (a layer computed ahead in another thread keeps its limits while the writer's use ends). OpenBLAS raises
    its thread count again only when asked from the main thread: a run holds a use there for its length."""
    with _LIMIT:
        _LIMITED[0] += 1
        if _LIMITED[0] == 1:
            torch = sys.modules.get("torch")
            _LIMITED[1] = (torch, torch.get_num_threads() if torch else None,
                           threadpool_limits(limits=1))
            if torch:
                torch.set_num_threads(1)
    try:
        yield
    finally:
        with _LIMIT:
            _LIMITED[0] -= 1
            if _LIMITED[0] == 0:
                torch, count, limits = _LIMITED[1]
                limits.restore_original_limits()
                if torch:
                    torch.set_num_threads(count)


# glibc's malloc for a process that computes layers: no block mapped on its own, and freed memory kept (up to 1 GiB).
# A layer's pieces allocate and free tens of MB of temporaries (24B shapes); by default glibc maps large blocks afresh
# and trims what is freed, so every layer's temporaries land on fresh pages the kernel must zero: a 24B folder
# extraction took 66.0 and 66.9 s (9.5 and 9.8 s of system time) against 62.7 and 63.5 s (4.6 and 4.8 s) so set.
# One arena for every thread as well (MALLOC_ARENA_MAX=1) took 60.8 and 62.0 s, but the demo 5% longer: its threads
# then wait on the arena's lock.
KEEP_FREED_MEMORY = {"MALLOC_MMAP_MAX_": 0, "MALLOC_TRIM_THRESHOLD_": 1 << 30}
_MALLOPT = {"MALLOC_MMAP_MAX_": -4, "MALLOC_TRIM_THRESHOLD_": -1}  # malloc.h's M_MMAP_MAX, M_TRIM_THRESHOLD


def keep_freed_memory() -> bool:
    """KEEP_FREED_MEMORY in this process, as glibc would have read it from the environment at start (mallopt); a
    setting the user made (its variable, or GLIBC_TUNABLES naming malloc) is kept. False where the C library has no
    mallopt (not glibc): nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return True
    return all(mallopt(_MALLOPT[name], value) == 1 for name, value in KEEP_FREED_MEMORY.items()
               if name not in os.environ)


def _one_thread(fn: Callable[..., R], *args) -> R:
    """fn(*args) in a pool thread, with torch's OpenMP at one thread (its count is per calling thread)."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    return fn(*args)


_THREADS: list = [None, 0, 0]  # the process's pool threads (a ThreadPoolExecutor), their count, the process id


def _executor() -> ThreadPoolExecutor:
    """The process's WORKERS pool threads, started once and kept (a layer's pieces, and the next layer's, share
    them); started anew when WORKERS changed, or in a forked child, whose pool threads are not copied."""
    with _LIMIT:
        executor, count, pid = _THREADS
        if executor is None or count != WORKERS or pid != os.getpid():
            if executor is not None and pid == os.getpid():
                executor.shutdown(wait=False)
            executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="headforms")
            _THREADS[:] = [executor, WORKERS, os.getpid()]
        return executor


class Pool:
    """The pieces of one layer on the process's WORKERS threads, run in the order they are submitted, each with
    single-threaded BLAS; with one worker a piece runs as it is submitted, in the caller's thread.

    Pieces are submitted all at once and collected as needed (`Future.result`), so the caller's own work,
    the fits say, overlaps the pieces still running. Leaving the pool waits for its pieces (those not yet
    started are cancelled when it is left by an exception). A piece must not use the pool itself."""

    def __init__(self):
        self._limits = single_threaded()
        self._futures: set[Future] = set()  # those not done yet

    def submit(self, fn: Callable[..., R], *args) -> Future:
        if WORKERS > 1:
            future = _executor().submit(_one_thread, fn, *args)
            self._futures.add(future)
            future.add_done_callback(self._futures.discard)
            return future
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
            pending = list(self._futures)
            if exc[0] is not None:
                for future in pending:
                    future.cancel()
            wait(pending)
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


def batches(total: int, width: int, groups=None) -> list[slice]:
    """range(total) in contiguous slices for the pool: up to 4 per worker (to balance them), each with more than
    GIL_FREE_OUTPUTS / width items where `total` allows (`width`: a call's output length per item), so that
    numpy computes it without holding the GIL. With `groups` (a label per item), no slice cuts a run of equal
    labels: each bound moves up to where the next run starts, and a slice left too small joins the next one."""
    least = GIL_FREE_OUTPUTS // max(width, 1) + 1
    parts = chunks(total, min(4 * WORKERS, max(1, total // least)))
    if groups is None:
        return parts
    starts = [i for i in range(1, total) if groups[i] != groups[i - 1]] + [total]
    merged: list[list[int]] = []
    for part in parts:
        stop = next(start for start in starts if start >= part.stop)
        if merged and merged[-1][1] - merged[-1][0] < least:  # the one before is too small: it takes this one in
            merged[-1][1] = max(merged[-1][1], stop)
        elif not merged or stop > merged[-1][1]:
            merged.append([merged[-1][1] if merged else 0, stop])
    if len(merged) > 1 and merged[-1][1] - merged[-1][0] < least:
        merged[-2][1] = merged[-1][1]
        del merged[-1]
    return [slice(a, b) for a, b in merged]
