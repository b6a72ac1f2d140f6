"""Opening the warehouse, in this process: waiting while another process holds the file (what is said, when, and the
one error line when the wait runs out), refusals of files that are no warehouse or an older one, the views, the
default path and removal. The subprocess tests of test_concurrency.py meet the same code through the CLI."""
import fcntl
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from headforms.warehouse import storing
from headforms.warehouse.storing import store
from headforms.warehouse.storing.failures import WarehouseError

HOLD_OPEN = r"""
import sys, duckdb
con = duckdb.connect(sys.argv[1])
print("@open", flush=True)
sys.stdin.readline()
con.close()
"""  # a process holding the warehouse (read-write) until a line comes on its stdin


class Clock:
    """store's `time` on a virtual clock: sleep() moves it on by exactly what is asked, so waits, announcements and
    their bounds are exact (POLL is set to a power of two: sums of it are exact too). It starts at ORIGIN rather
    than 0, as a real monotonic clock would; times are read since ORIGIN."""

    ORIGIN = 1024.0

    def __init__(self):
        self.now = self.ORIGIN

    def since(self) -> float:
        return self.now - self.ORIGIN

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Stderr:
    """sys.stderr recording each write and flush with the clock's time."""

    def __init__(self, clock: Clock):
        self.clock, self.events = clock, []

    def write(self, text: str) -> int:
        self.events.append(("write", self.clock.since(), text))
        return len(text)

    def flush(self) -> None:
        self.events.append(("flush", self.clock.since(), ""))

    def lines(self) -> list[tuple[float, str]]:
        return [(at, text.removesuffix("\n")) for kind, at, text in self.events if kind == "write" and text != "\n"]


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(store, "time", clock)
    monkeypatch.setattr(store, "POLL", 0.125)
    return clock


@pytest.fixture
def stderr(clock):
    """A Stderr on the clock; a test puts it in place itself (pytest's capture replaces sys.stderr at each phase)."""
    return Stderr(clock)


def refused_until(clock: Clock, until: float | None, pid: int | None = 4242):
    """An opener refused as DuckDB refuses a file another process holds (its words, PID and all) until the clock
    reaches `until` (None: always), then opening; the times of its calls are kept."""
    calls = []

    def opener():
        calls.append(clock.since())
        if until is None or clock.since() < until:
            held = f" (PID {pid})" if pid else ""
            raise duckdb.IOException(f'IO Error: Could not set lock on file "w.duckdb": Conflicting lock is held in '
                                     f'/usr/bin/python3{held}. See also https://duckdb.org/docs/current/connect/concurrency')
        return "connection"

    opener.calls = calls
    return opener


def readers_locked(db: Path) -> bool | None:
    """Whether a reader holds its shared lock on <db>.readers; None while there is no such file."""
    try:
        fd = os.open(f"{db}.readers", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_waiting_reader_says_so_once_after_half_its_wait_and_names_the_holder(tmp_path, clock, stderr, monkeypatch):
    """A reader refused while another process holds the file retries every POLL seconds; at min(1 s, wait / 2) it
    says once, flushed, that it waits and for whom; meanwhile it holds its shared lock on <db>.readers (an ordinary
    file), released once it is in."""
    monkeypatch.setattr(sys, "stderr", stderr)
    db, locked = tmp_path / "w.duckdb", []
    opener = refused_until(clock, 1.0)
    old = os.umask(0o022)
    try:
        got = store._open_when_free(db, True, 1.5, lambda: locked.append(readers_locked(db)) or opener())
    finally:
        os.umask(old)
    assert got == "connection" and opener.calls == [k * 0.125 for k in range(9)]
    assert locked == [None] + [True] * 8  # the lock is taken at the first refusal and held until it is in
    assert readers_locked(db) is False
    assert stat.S_IMODE(os.stat(f"{db}.readers").st_mode) & 0o111 == 0
    assert stderr.lines() == [(0.75, f"waiting for {db}, in use by another process (process 4242) ...")]
    assert stderr.events[-1] == ("flush", 0.75, "")


def test_a_wait_that_runs_out_is_one_error_line(tmp_path, clock, stderr, monkeypatch):
    """Refused for the whole wait: the wait is said once (after half of it), and at the wait's end one error line,
    naming the holder when DuckDB names it; a writer (not read-only) leaves no readers file."""
    monkeypatch.setattr(sys, "stderr", stderr)
    db = tmp_path / "w.duckdb"
    for pid in (4242, None):
        clock.now = clock.ORIGIN
        opener = refused_until(clock, None, pid)
        with pytest.raises(WarehouseError) as refused:
            store._open_when_free(db, False, 1.0, opener)
        process = " (process 4242)" if pid else ""
        assert str(refused.value) == (f"{db} is in use by another process{process}; retry when it finishes, "
                                      "or pass wait=SECONDS")
        assert opener.calls == [k * 0.125 for k in range(9)]  # the last at the wait's end
    assert stderr.lines() == [(0.5, f"waiting for {db}, in use by another process (process 4242) ..."),
                              (0.5, f"waiting for {db}, in use by another process ...")]
    assert not Path(f"{db}.readers").exists()


def test_a_second_extraction_says_at_once_that_it_waits(tmp_path, clock, stderr, monkeypatch):
    """exclusive_run: the warehouse's run lock held (by the process whose id the lock file holds) makes a second
    extraction say at once that it waits, then give up with one line naming that process."""
    monkeypatch.setattr(sys, "stderr", stderr)
    db = tmp_path / "w.duckdb"
    with open(f"{db}.lock", "w") as held:
        held.write("4242")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(WarehouseError, match=r"in use by another process \(process 4242\); retry"):
            with store.exclusive_run(db, wait=0.5):
                pass
    assert stderr.lines() == [(0.0, f"waiting for {db}, in use by another process (process 4242) ...")]


def test_a_reader_with_the_default_wait_is_refused_at_once_naming_the_real_holder(tmp_path):
    """DuckDB's own refusal, another process holding the file: connect() with no wait fails at once, with the
    holding process's id as DuckDB reports it."""
    db = tmp_path / "w.duckdb"
    store.connect(db).close()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, str(db)], text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "@open"
        start = time.monotonic()
        with pytest.raises(WarehouseError) as refused:
            store.connect(db, read_only=True)
        assert time.monotonic() - start < 0.5
    finally:
        holder.communicate("\n", timeout=30)
    assert str(refused.value) == (f"{db} is in use by another process (process {holder.pid}); retry when it "
                                  "finishes, or pass wait=SECONDS")


@pytest.mark.parametrize("error, line", [
    (duckdb.IOException("IO Error: Could not read from file: Is a directory\nmore detail"),
     "cannot open {db}: IO Error: Could not read from file: Is a directory"),
    (duckdb.IOException(""), "cannot open {db}: IOException"),
    (duckdb.SerializationException("Serialization Error: written by a newer DuckDB\nmore"),
     "cannot open {db} as a DuckDB warehouse: Serialization Error: written by a newer DuckDB"),
])
def test_a_file_that_cannot_be_opened_is_one_line(tmp_path, error, line):
    """An I/O failure that is no lock, or any other DuckDB refusal: one line with the first line of its words (the
    exception's name when it has none), and no retry."""
    db, calls = tmp_path / "w.duckdb", []

    def opener():
        calls.append(1)
        raise error

    with pytest.raises(WarehouseError) as refused:
        store._open_when_free(db, True, 5.0, opener)
    assert str(refused.value) == line.format(db=db) and calls == [1]


def test_a_file_that_is_no_warehouse_or_is_missing_is_refused(tmp_path):
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"x" * 5000)
    with pytest.raises(WarehouseError) as refused:
        store.connect(junk, read_only=True)
    assert str(refused.value) == (f"{junk} is not a DuckDB database: `db` takes a DuckDB warehouse file "
                                  "(warehouse.duckdb)")
    assert sorted(tmp_path.iterdir()) == [junk]  # refused before DuckDB or a lock file touched it
    with pytest.raises(WarehouseError) as missing:
        store.connect(tmp_path / "none.duckdb", read_only=True)
    assert str(missing.value) == (f"no warehouse at {tmp_path / 'none.duckdb'}: build one with `make warehouse` or "
                                  "`headforms extract`")


def test_a_warehouse_from_before_fit_status_is_refused_and_kept(tmp_path):
    db = tmp_path / "old.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE fits (model VARCHAR, loglik DOUBLE)")
    before = db.read_bytes()
    for read_only in (True, False):
        with pytest.raises(WarehouseError) as refused:
            store.connect(db, read_only=read_only)
        assert str(refused.value) == (f"{db} was built by an older headforms (its fits have no status): rebuild it "
                                      "(remove the file, then run `headforms extract` again)")
    assert db.read_bytes() == before


def test_an_older_warehouse_without_a_later_table_opens_read_only(tmp_path):
    """Read-only, a file holding some of the tables: the columns added later are shadowed as NULL in the tables it
    holds (two of them in one table here), and a table it lacks altogether is left alone."""
    db = tmp_path / "old.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE models (model VARCHAR, n_layers INTEGER)")
        con.execute("INSERT INTO models VALUES ('m', 2)")
    with store.connect(db, read_only=True) as con:
        row = con.execute("SELECT model, n_layers, base_model, training_step, checkpoint_bytes FROM models").fetchone()
    assert row == ("m", 2, None, None, None)


def test_views_resolve_in_any_order_and_a_broken_one_is_an_error(tmp_path, monkeypatch):
    """A view reading another view is created whatever their files' order; a view whose table does not exist fails
    the warehouse's creation with DuckDB's error naming it (only a read-only file leaves such views out)."""
    views = tmp_path / "sql"
    views.mkdir()
    (views / "a_first.sql").write_text("SELECT x + 1 AS y FROM b_second")
    (views / "b_second.sql").write_text("SELECT 1 AS x")
    monkeypatch.setattr(store, "VIEWS", views)
    con = duckdb.connect()
    store.create_views(con)
    assert con.execute("SELECT y FROM a_first").fetchone() == (2,)
    (views / "c_broken.sql").write_text("SELECT * FROM no_such_table")
    with pytest.raises(duckdb.CatalogException, match="no_such_table"):
        store.create_views(con)
    store.create_views(con, temporary=True)  # read-only: left out, and the others' copies the file stores kept alone
    assert con.execute("SELECT y FROM a_first").fetchone() == (2,)
    assert con.execute("SELECT view_name, temporary FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
                       ).fetchall() == [("a_first", False), ("b_second", False)]


def test_default_warehouse_and_its_removal(tmp_path, monkeypatch):
    monkeypatch.delenv(storing.DB_ENV, raising=False)
    assert storing.default_db() == "warehouse.duckdb"
    monkeypatch.setenv(storing.DB_ENV, str(tmp_path / "x.duckdb"))
    assert storing.default_db() == str(tmp_path / "x.duckdb")
    db = tmp_path / "w.duckdb"
    files = [db, Path(f"{db}.wal"), Path(f"{db}.lock"), Path(f"{db}.readers")]
    for file in files:
        file.write_bytes(b"")
    store.remove_warehouse(db)
    assert [file for file in files if file.exists()] == []


def test_insert_appends_by_name_and_leaves_no_frame_registered():
    """store.insert: columns matched by name, and the frame it registered for the statement is gone after it
    (a registration kept would hold the frame's memory until the next insert)."""
    import polars as pl

    con = duckdb.connect()
    con.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    store.insert(con, "t", pl.DataFrame({"b": ["x", "y"], "a": [1, 2]}))
    assert con.execute("SELECT a, b FROM t ORDER BY a").fetchall() == [(1, "x"), (2, "y")]
    with pytest.raises(duckdb.CatalogException):
        con.execute("SELECT * FROM _frame")


@pytest.mark.parametrize("in_transaction", [True, False])
def test_a_failed_insert_is_raised_in_duckdbs_words_for_it_and_leaves_no_frame_registered(in_transaction):
    """A duplicate key aborts the transaction: unregistering the frame then fails (TransactionException, "Current
    transaction is aborted"), which once hid the ConstraintException. Inside store.transaction and in autocommit
    alike, the error raised is the insert's own, the table is as it was and no frame stays registered."""
    import polars as pl

    con = duckdb.connect()
    con.execute("CREATE TABLE t (a INTEGER PRIMARY KEY)")
    store.insert(con, "t", pl.DataFrame({"a": [1]}))
    with pytest.raises(duckdb.ConstraintException, match="Duplicate key"):
        if in_transaction:
            with store.transaction(con):
                store.insert(con, "t", pl.DataFrame({"a": [2]}))
                store.insert(con, "t", pl.DataFrame({"a": [1]}))
        else:
            store.insert(con, "t", pl.DataFrame({"a": [1]}))
    assert con.execute("SELECT a FROM t").fetchall() == [(1,)]
    with pytest.raises(duckdb.CatalogException):
        con.execute("SELECT * FROM _frame")
