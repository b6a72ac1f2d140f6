"""Where a run's layers are read and analysed: in this process, in worker processes (--jobs N), or as
Ray tasks (--executor ray). Every executor runs the same unit of work, `layers.layer_rows`, and yields
its results in task order, so the one writer (warehouse/running/load.py) commits whole layers in order.

Workers open the checkpoint themselves from a `CheckpointRef` (its source, pinned to the revision
the driver resolved), so no weights travel from the driver; results come back as Arrow tables.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

from headforms.compute import threads
from headforms.extract.checkpoint import ReadOptions
from headforms.extract.sources import open_checkpoint
from headforms.warehouse.running import layers

EXECUTORS = ("local", "ray")
WINDOW = 2  # tasks in flight per worker: enough to keep workers busy while the writer commits


@dataclass(frozen=True)
class CheckpointRef:
    """What a worker needs to open the same checkpoint: source (absolute when local), name, and the options it was
    read with, at its pinned revision."""

    source: str
    name: str
    options: ReadOptions

    @classmethod
    def of(cls, ckpt) -> "CheckpointRef":
        path = Path(ckpt.source).expanduser()
        source = str(path.resolve()) if path.exists() else ckpt.source
        return cls(source, ckpt.name, replace(ckpt.options, revision=ckpt.revision))

    def open(self):
        return open_checkpoint(self.source, self.options, name=self.name)


_OPEN: dict = {}  # a worker's open checkpoints: consecutive tasks mostly read the same model


def run_task(ref: CheckpointRef, opts, layer: int):
    """One layer's rows, in a worker: the checkpoint is opened once per worker and model."""
    if ref not in _OPEN:
        for old in _OPEN.values():
            old.close()
        _OPEN.clear()
        _OPEN[ref] = ref.open()
    return layers.layer_rows(_OPEN[ref], opts, layer)


class Results:
    """Results in task order; `ready()` tells whether the next one is already computed, so the writer
    can commit the layers that finished during its last commit together."""

    def __init__(self, results: Iterator, ready: Callable[[], bool] = lambda: False):
        self.results, self.ready = results, ready

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.results)


class Serial:
    """Every layer in this process, computed only when the writer asks for it (one layer in memory)."""

    def map(self, tasks: Iterable[tuple]) -> Results:
        return Results(layers.layer_rows(ckpt, opts, layer) for ckpt, opts, layer in tasks)

    def close(self) -> None:
        """Nothing to release."""


def _worker_setup(parent: int) -> None:
    """A worker process leaves Ctrl-C to the writer (which stops it), runs single-threaded (its siblings
    have the other cores), and exits when the writer is gone (killed: nobody would read its results)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads.set_workers(1)

    def orphaned():
        while _alive(parent):
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True, name="headforms-orphan-watch").start()


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a worker's parent is the fork server, so the writer is watched by pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Windowed:
    """Ordered results of tasks submitted ahead, at most `window` in flight."""

    window: int

    def map(self, tasks: Iterable[tuple]) -> Results:
        tasks, pending = iter(tasks), deque()

        def fill():
            while len(pending) < self.window and (task := next(tasks, None)) is not None:
                ckpt, opts, layer = task
                pending.append(self.submit(CheckpointRef.of(ckpt), opts, layer))

        def results():
            fill()
            while pending:
                result = self.result(pending.popleft())
                fill()
                yield result

        return Results(results(), lambda: bool(pending) and self.done(pending[0]))


class Processes(_Windowed):
    """`jobs` worker processes, each reading and analysing whole layers.

    Workers are forked from a fork server that imported the analysis once (a fresh process, so none
    of this one's threads are copied): each worker starts without paying the imports again."""

    def __init__(self, jobs: int, work: Callable = run_task):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.work, self.window = work, WINDOW * jobs
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["headforms.warehouse.running.load", "headforms.extract.hf",
                                        "headforms.extract.gguf_file"])
        self.pool = ProcessPoolExecutor(jobs, mp_context=context,
                                        initializer=_worker_setup, initargs=(os.getpid(),))

    def submit(self, ref, opts, layer):
        return self.pool.submit(self.work, ref, opts, layer)

    def result(self, future):
        return future.result()

    def done(self, future) -> bool:
        return future.done()

    def close(self) -> None:
        """Stop the workers now (tasks still queued are dropped: an interrupted run resumes them)."""
        processes = list(getattr(self.pool, "_processes", {}).values())  # the pool has no public terminate
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join()


class Ray(_Windowed):
    """Ray tasks on an existing cluster (`address`) or one started here; a task whose worker dies is retried."""

    def __init__(self, address: str | None = None, work: Callable = run_task, retries: int = 3):
        try:
            import ray
        except ImportError:
            from headforms.warehouse.storing.store import WarehouseError

            raise WarehouseError("--executor ray needs Ray: pip install 'headforms[ray]'") from None
        self.ray, self.started = ray, not ray.is_initialized()
        if self.started:
            local = address is None and not os.environ.get("RAY_ADDRESS")  # else: connect to a running cluster
            ray.init(address=address, log_to_driver=False, **({"include_dashboard": False} if local else {}))
        self.window = WINDOW * max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.task = ray.remote(num_cpus=1, max_retries=retries)(work)

    def submit(self, ref, opts, layer):
        return self.task.remote(ref, opts, layer)

    def result(self, handle):
        return self.ray.get(handle)

    def done(self, handle) -> bool:
        return bool(self.ray.wait([handle], timeout=0)[0])

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def executor(jobs: int = 1, kind: str = "local", address: str | None = None):
    """The executor a run asks for: --executor ray [--ray-address], else --jobs N processes (1: this process)."""
    if kind not in EXECUTORS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, not '{kind}'")
    if kind == "ray":
        return Ray(address)
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    return Processes(jobs) if jobs > 1 else Serial()
