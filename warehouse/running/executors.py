"""Where a run's layers are read and analysed: in this process, in worker processes (--jobs N), or as
Ray tasks (--executor ray). Every executor runs the same unit of work, `layers.layer_rows`, and yields
its results in task order, so the one writer (warehouse/running/load.py) commits whole layers in order.

Workers open the checkpoint themselves from a `CheckpointRef` (its source, pinned to the revision
the driver resolved), so no weights travel from the driver; results come back as Arrow tables.
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

from headforms.compute import threads
from headforms.extract.checkpoint import ReadOptions
from headforms.extract.sources import open_checkpoint
from headforms.warehouse.running import EXECUTORS, layers

WINDOW = 2  # tasks in flight per worker: enough to keep workers busy while the writer commits
ROWS_AHEAD = 8  # analysed layers' rows the serial executor holds for the writer (a few MB even at 24B shapes; 0: no
#                thread, each layer read and analysed in the writer's thread when it asks)


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
    """Every layer in this process, in order. One thread reads and analyses the layers, up to ROWS_AHEAD ahead of the
    writer, so that reading, the pool's linear algebra, the writer's commits and a finished model's summaries
    overlap; with ROWS_AHEAD = 0, each layer is read and analysed in the writer's thread when it asks for it."""

    def __init__(self):
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started: tuple[list, Results] | None = None  # tasks begun by `start`, and their results

    def start(self, tasks: Iterable[tuple]) -> None:
        """Begin `tasks` now, before the writer asks for them: `map` of the same tasks returns them (a new warehouse's
        layers, every one to do, compute while the writer imports DuckDB and sets the file up)."""
        tasks = list(tasks)
        self._started = (_identities(tasks), self._map(tasks))

    def map(self, tasks: Iterable[tuple]) -> Results:
        tasks = list(tasks)
        if self._started is not None:
            begun, results = self._started
            self._started = None
            if begun == _identities(tasks):
                return results
            self.close()  # planned otherwise (another run wrote the file meanwhile): what was begun is dropped
            self._stop, self._threads = threading.Event(), []
        return self._map(tasks)

    def _map(self, tasks: list[tuple]) -> Results:
        if not ROWS_AHEAD:
            return Results(layers.layer_rows(ckpt, opts, layer) for ckpt, opts, layer in tasks)
        read = (((ckpt, opts, layer), layers.read_weights(ckpt, layer)) for ckpt, opts, layer in tasks)
        rows = _Ahead(_analysed(read), ROWS_AHEAD, self._stop)
        self._threads.append(rows.thread)
        return Results(rows, lambda: not rows.queue.empty())

    def close(self) -> None:
        """Stop computing ahead: a layer being read or analysed is finished and dropped (a rerun resumes it)."""
        self._stop.set()
        for thread in self._threads:
            thread.join()


def _identities(tasks: list[tuple]) -> list[tuple]:
    """Tasks compared by their checkpoint object (not its fields), options and layer."""
    return [(id(ckpt), opts, layer) for ckpt, opts, layer in tasks]


def _analysed(read: Iterator) -> Iterator:
    """The rows of each layer, read as it is asked for: the next layer is read and its linear algebra started on the
    pool before this one's is collected (its statistics, fits and tables made), so the pool's threads never wait
    for this thread, and no more than two layers' maps are held at once (210 MB each at 24B shapes)."""
    with threads.Pool() as pool:
        started: deque = deque()
        try:
            for task, weights in read:
                started.append(layers.start_rows(*task, weights, pool))
                if len(started) > 1:
                    yield started.popleft()()
        except GeneratorExit:  # the consumer stopped: nothing more to hand over
            raise
        except BaseException:  # a layer that failed to read or start: the layers started before it come first
            while started:
                yield started.popleft()()
            raise
        while started:
            yield started.popleft()()


class _Ahead:
    """An iterator's items, produced by a thread of their own into a queue of `size`, in order: its exception is
    raised where its item would have been; once `stop` is set, both sides end (at the next item). An item is
    produced only when the queue has room for it, so at most `size` wait."""

    _END = object()

    def __init__(self, items: Iterator, size: int, stop: threading.Event):
        self.queue: queue.Queue = queue.Queue()
        self.room = threading.Semaphore(size)  # taken before an item is produced, given back when it is taken
        self.stop, self.ended = stop, False
        self.thread = threading.Thread(target=self._run, args=(items,), name="headforms-ahead", daemon=True)
        self.thread.start()

    def _run(self, items: Iterator) -> None:
        items = iter(items)
        try:
            while self._room():
                try:
                    self.queue.put((next(items), None))
                except StopIteration:
                    self.queue.put((self._END, None))
                    return
                except BaseException as exc:  # raised in the consumer when it reaches this item
                    self.queue.put((None, exc))
                    return
        finally:
            getattr(items, "close", lambda: None)()  # a generator stopped early ends in this thread

    def _room(self) -> bool:
        """Wait for room in the queue and take it; False once stopped."""
        while not self.stop.is_set():
            if self.room.acquire(timeout=0.1):
                return True
        return False

    def __iter__(self):
        return self

    def __next__(self):
        while not self.ended:
            try:
                item, error = self.queue.get(timeout=0.1)
            except queue.Empty:
                self.ended = self.stop.is_set()
                continue
            self.room.release()
            if error is not None:
                self.ended = True
                raise error
            if item is self._END:
                self.ended = True
                break
            return item
        raise StopIteration


# A worker's linear algebra is single-threaded (its siblings have the other cores): OpenBLAS started with more
# threads spins them idle after its load, 0.1 s of CPU per thread and library, on the cores the writer computes on.
SINGLE_THREADED_BLAS = {"OPENBLAS_NUM_THREADS": "1"}
# What a worker process needs, imported once by the `--jobs` fork server: the layer's task and the readers, not
# the warehouse (no DuckDB, no polars).
WORKER_IMPORTS = ("headforms.warehouse.running.executors", "headforms.extract.formats.hf",
                  "headforms.extract.formats.gguf_file")


@contextmanager
def _environment(values: dict[str, str]):
    """os.environ with `values` set where the user has not set them, restored after (for a child started inside)."""
    added = {key: value for key, value in values.items() if key not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _import_work() -> None:
    """A worker's imports (WORKER_IMPORTS), made before its first layer is submitted."""
    import importlib

    for module in WORKER_IMPORTS:
        importlib.import_module(module)


def _worker_setup(parent: int) -> None:
    """A worker process leaves Ctrl-C to the writer (which stops it), runs single-threaded (its siblings
    have the other cores), keeps freed memory as the command line does, and exits when the writer is gone (killed:
    nobody would read its results)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads.set_workers(1)
    threads.keep_freed_memory()

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
    """Ordered results of tasks submitted ahead, at most `window` in flight. An executor whose workers take a while
    to start (`ping` answers once one has) has the writer compute the next task itself until then, so that no core
    waits on the start; the tasks waiting are submitted as soon as it answers."""

    window: int
    work: Callable

    def __init__(self, starts: bool):
        self.up, self._lock, self._fill, self._closed = threading.Event(), threading.Lock(), None, False
        if not starts:
            self.up.set()

    def ping(self):
        """A trivial task submitted to the workers: its result comes once one of them is up."""
        raise NotImplementedError

    def _wait_up(self) -> None:
        """In a thread of its own (a submission may wait on the workers' start): mark the workers up once `ping`
        answers, then submit the tasks waiting."""
        try:
            self.result(self.ping())
        except BaseException:  # workers that cannot start fail the tasks submitted to them, in the writer's order
            pass
        with self._lock:
            self.up.set()
            fill = self._fill
        if fill:
            fill()

    def start(self, tasks: Iterable[tuple]) -> None:
        """Nothing ahead of the writer: the workers start with the executor, and a task names its checkpoint's
        revision (CheckpointRef), which for a local digest the writer settles first."""

    def map(self, tasks: Iterable[tuple]) -> Results:
        """The results of `tasks`, in order (one map per executor)."""
        tasks, pending = iter(tasks), deque()
        if not self.up.is_set():
            threading.Thread(target=self._wait_up, name="headforms-workers-up", daemon=True).start()

        def fill():
            """Submit tasks up to the window, or keep one to compute here while the workers start; called by the
            writer and, once, by the thread that sees the workers up."""
            with self._lock:
                while not self._closed and len(pending) < (self.window if self.up.is_set() else 1) and (
                        task := next(tasks, None)) is not None:
                    ckpt, opts, layer = task
                    ref = CheckpointRef.of(ckpt)
                    if not self.up.is_set():
                        pending.append(_Here(self.work, ref, opts, layer))
                        continue
                    try:
                        pending.append(self.submit(ref, opts, layer))
                    except Exception as exc:  # raised where its result would have been
                        pending.append(_Here(_raise, exc))

        def results():
            with self._lock:
                self._fill = fill
            fill()
            while pending:
                with self._lock:
                    entry = pending.popleft()
                result = entry() if isinstance(entry, _Here) else self.result(entry)
                fill()
                yield result

        def ready() -> bool:
            with self._lock:
                return bool(pending) and not isinstance(pending[0], _Here) and self.done(pending[0])

        return Results(results(), ready)

    def _close_here(self) -> bool:
        """Submit nothing more, and close what the tasks computed here opened (a worker's open checkpoints live as
        long as the worker); False where the executor was closed already."""
        with self._lock:
            closing, self._closed = not self._closed, True
        for ckpt in _OPEN.values():
            ckpt.close()
        _OPEN.clear()
        return closing


class _Here:
    """A task computed in the writer's thread when its result is asked for."""

    def __init__(self, fn: Callable, *args):
        self.fn, self.args = fn, args

    def __call__(self):
        return self.fn(*self.args)


def _raise(exc: BaseException):
    raise exc


class Processes(_Windowed):
    """`jobs` worker processes, each reading and analysing whole layers.

    Workers are forked from a fork server that imported the analysis once (a fresh process, so none
    of this one's threads are copied): each worker starts without paying the imports again. The server is
    started with the executor, so that its imports (a second on a small machine) run on the other core while
    the writer prepares the warehouse; until a worker is up, the writer computes layers itself."""

    def __init__(self, jobs: int, work: Callable = run_task):
        import multiprocessing
        import multiprocessing.forkserver
        from concurrent.futures import ProcessPoolExecutor

        super().__init__(starts=True)
        self.work, self.window = work, WINDOW * jobs
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(WORKER_IMPORTS))
        with _environment(SINGLE_THREADED_BLAS):  # the server's environment is this process's at its start
            multiprocessing.forkserver.ensure_running()  # its imports start now, beside the writer's own set-up
        self.pool = ProcessPoolExecutor(jobs, mp_context=context,
                                        initializer=_worker_setup, initargs=(os.getpid(),))

    def ping(self):
        return self.pool.submit(os.getpid)

    def submit(self, ref, opts, layer):
        return self.pool.submit(self.work, ref, opts, layer)

    def result(self, future):
        return future.result()

    def done(self, future) -> bool:
        return future.done()

    def close(self) -> None:
        """Stop the workers now (tasks still queued are dropped: an interrupted run resumes them)."""
        if not self._close_here():
            return
        processes = list(getattr(self.pool, "_processes", {}).values())  # the pool has no public terminate
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join()


class Ray(_Windowed):
    """Ray tasks on an existing cluster (`address`) or one started here; a task whose worker dies is retried. One task
    per CPU imports the layer's modules at once, so that the workers' imports run while the writer sets up."""

    def __init__(self, address: str | None = None, work: Callable = run_task, retries: int = 3):
        try:
            import ray
        except ImportError:
            from headforms.warehouse.storing.failures import WarehouseError

            raise WarehouseError("executor='ray' needs Ray: pip install 'headforms[ray]'") from None
        super().__init__(starts=False)  # a task is submitted at once; a worker's imports are its own
        self.ray, self.started = ray, not ray.is_initialized()
        if self.started:
            local = address is None and not os.environ.get("RAY_ADDRESS")  # else: connect to a running cluster
            ray.init(address=address, log_to_driver=False, **({"include_dashboard": False} if local else {}))
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.window = WINDOW * cpus
        self.task = ray.remote(num_cpus=1, max_retries=retries)(work)
        warm = ray.remote(num_cpus=1, max_retries=0)(_import_work)
        self._warming = [warm.remote() for _ in range(cpus)]

    def submit(self, ref, opts, layer):
        return self.task.remote(ref, opts, layer)

    def result(self, handle):
        return self.ray.get(handle)

    def done(self, handle) -> bool:
        return bool(self.ray.wait([handle], timeout=0)[0])

    def close(self) -> None:
        if self._close_here() and self.started:
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
