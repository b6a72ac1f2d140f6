"""Thread policy of the CPU linear algebra: parallel over heads, one BLAS thread per task.

A layer is many small independent problems (one QR of N x 2n and a few 2n x 2n
decompositions per head). Threading *inside* each LAPACK call scales poorly at these
sizes, and OpenMP/OpenBLAS teams that spin at barriers collapse when the machine is
shared (measured on 2 cores under load: torch's eigvalsh on (9, 128, 128) 9 ms with one
thread, 80 ms to 6 s with two; numpy's baseline eigvalsh 4 ms against 140 ms). So on the
CPU the heads are spread over a pool of workers, each running single-threaded
LAPACK/BLAS: no barriers, and a descheduled worker only delays its own heads.
"""
from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterable, TypeVar

from threadpoolctl import threadpool_limits

T = TypeVar("T")
R = TypeVar("R")

def _cores() -> int:
    """OMP_NUM_THREADS when set, else the cores this process may run on."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return int(os.environ["OMP_NUM_THREADS"])
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Worker threads for the CPU pool.
WORKERS = max(1, _cores())


def set_workers(count: int) -> None:
    """Size of the CPU pool; a worker process of a parallel run (--jobs) uses 1, the cores being its siblings'."""
    global WORKERS
    WORKERS = max(1, count)


@contextmanager
def single_threaded():
    """The BLAS and OpenMP pools of numpy and scipy (and torch's, if loaded), at one thread for the duration."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else None
    if torch:
        torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        if torch:
            torch.set_num_threads(threads)


def map_threads(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """[fn(item) for item in items], over a pool of WORKERS threads, each single-threaded.

    fn should spend its time in LAPACK calls (numpy's and torch's release the GIL)."""
    items = list(items)
    count = min(WORKERS, len(items))
    with single_threaded():
        if count <= 1:
            return [fn(item) for item in items]

        def run(item):
            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(1)  # OpenMP's thread count is per calling thread
            return fn(item)

        with ThreadPoolExecutor(max_workers=count, thread_name_prefix="headforms") as pool:
            return list(pool.map(run, items))


def chunks(total: int, parts: int) -> list[slice]:
    """Split range(total) into at most `parts` contiguous slices of near-equal size."""
    parts = max(1, min(parts, total))
    bounds = [total * i // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
