"""The DuckDB warehouse: opening (with the single-writer lock), schema, views, transactions."""
from __future__ import annotations

import fcntl
import os
import re
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import duckdb
import polars as pl

from headforms.extract.checkpoint import first_line
from headforms.warehouse.storing.failures import WarehouseError, damaged
from headforms.warehouse.storing.comments import comment_statements

SCHEMA = Path(__file__).with_name("schema.sql")
VIEWS = Path(__file__).resolve().parents[2] / "sql"
# How long an extraction waits to reopen the file for its next commit while readers hold it.
WRITER_WAIT = 600.0
POLL = 0.05          # seconds between attempts to open a file another process holds
ANNOUNCE_AFTER = 1.0  # say that we wait only when it is more than a commit's wait
# How long an extraction, before its next commit, lets readers already waiting for the file in first: its commits
# follow each other within milliseconds, and a reader that tries every POLL seconds would rarely meet a gap.
READERS_FIRST = 2.0


def connect(path: str | Path, *, read_only: bool = False, wait: float = 0.0) -> duckdb.DuckDBPyConnection:
    """Open the warehouse; a writer holding the lock makes us wait up to `wait` seconds, then fail.

    A read-only connection gets this version's views of sql/ as temporary views, shadowing
    any older ones stored in the file."""
    path = Path(path)
    if read_only and not path.exists():
        raise WarehouseError(f"no warehouse at {path}: build one with `make warehouse` or `headforms extract`")
    _refuse_foreign(path)
    con = _open_when_free(path, read_only, wait)
    _refuse_outdated(con, path)
    if read_only:
        _shadow_missing_tables(con)
        _shadow_added_columns(con)
        create_views(con, temporary=True)
    else:
        try:
            refuse_cut_short(con)
        except WarehouseError:
            con.close()
            raise
    return con


def _refuse_foreign(path: Path) -> None:
    """A file that is not a DuckDB database (a Parquet or CSV file given as --db, say) is refused before DuckDB or
    the warehouse's own lock files touch it: DuckDB's files say DUCK at byte 8."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except (FileNotFoundError, IsADirectoryError):
        return
    if head and head[8:12] != b"DUCK":
        kind = "a Parquet file" if head[:4] == b"PAR1" else "not a DuckDB database"
        hint = f"; to query it, read_parquet('{path}') in `headforms sql` on a warehouse" if head[:4] == b"PAR1" else ""
        raise WarehouseError(f"{path} is {kind}: `db` takes a DuckDB warehouse file (warehouse.duckdb){hint}")


# Tables of schema.sql (`CREATE TABLE IF NOT EXISTS t (...)` to its closing line).
_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+) \(.*?^\);", re.MULTILINE | re.DOTALL)


def _shadow_missing_tables(con: duckdb.DuckDBPyConnection) -> None:
    """A warehouse written by an older version, opened read-only, lacks tables schema.sql adds later (the output-value
    circuit's, say): an empty temporary table of each, so this version's views read them as no rows."""
    present = {name for (name,) in con.execute("SELECT table_name FROM duckdb_tables() "
                                               "WHERE database_name = current_database() AND schema_name = 'main'")
               .fetchall()}
    for match in _CREATE_TABLE.finditer(SCHEMA.read_text()):
        if match[1] not in present:
            con.execute(match[0].replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE", 1))


# Columns schema.sql adds to existing tables (`ALTER TABLE t ADD COLUMN IF NOT EXISTS c TYPE`).
_ADDED_COLUMN = re.compile(r"^ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+) (\w+(?:\[\])?)(?: DEFAULT ('[^']*'))?",
                           re.MULTILINE)


def _shadow_added_columns(con: duckdb.DuckDBPyConnection) -> None:
    """A warehouse written by an older version, opened read-only, lacks columns schema.sql adds later:
    temporary views of its tables with those columns as their default (NULL unless one is declared), so this
    version's views can read it."""
    present = set(con.execute("SELECT table_name, column_name FROM duckdb_columns() "
                              "WHERE database_name = current_database() AND schema_name = 'main'").fetchall())
    missing: dict[str, list[str]] = {}
    for table, column, kind, default in _ADDED_COLUMN.findall(SCHEMA.read_text()):
        if (table, column) not in present and any(t == table for t, _ in present):
            missing.setdefault(table, []).append(f"{default or 'NULL'}::{kind} AS {column}")
    [(database,)] = con.execute("SELECT current_database()").fetchall()
    for table, columns in missing.items():
        con.execute(f'CREATE TEMP VIEW {table} AS SELECT *, {", ".join(columns)} FROM "{database}".main.{table}')


class _Busy(Exception):
    """Another process holds the warehouse; args[0] names it (" (process N)") when known, else ""."""


def _when_free(path: Path, wait: float, attempt, announce_after: float = 0.0):
    """attempt() until it stops raising _Busy: up to `wait` seconds, saying once after `announce_after` that
    we wait; then one WarehouseError line."""
    start, announced = time.monotonic(), False
    while True:
        try:
            return attempt()
        except _Busy as busy:
            who = busy.args[0]
            if time.monotonic() - start >= wait:
                raise WarehouseError(f"{path} is in use by another process{who}; "
                                     f"retry when it finishes, or pass wait=SECONDS") from None
            if not announced and time.monotonic() - start >= announce_after:
                print(f"waiting for {path}, in use by another process{who} ...", file=sys.stderr, flush=True)
                announced = True
            time.sleep(POLL)


def _open_when_free(path: Path, read_only: bool, wait: float, opener=None):
    """opener() (default: duckdb.connect of the file), retried while another process holds the file; a reader that
    has to wait says so in `<db>.readers` (a shared lock, until it is in), so that the writer lets it in first."""
    waiting: list[int | None] = []  # the reader's descriptor of <db>.readers once it waits (None: not writable)

    def attempt():
        try:
            return opener() if opener else duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise WarehouseError(f"cannot open {path}: {first_line(exc)}") from None
            holder = re.search(r"PID (\d+)", str(exc))
            if read_only and not waiting:
                waiting.append(_reader_waits(path))
            raise _Busy(f" (process {holder.group(1)})" if holder else "") from None
        except duckdb.Error as exc:
            raise WarehouseError(f"cannot open {path} as a DuckDB warehouse: {first_line(exc)}") from None

    try:
        return _when_free(path, wait, attempt, announce_after=min(ANNOUNCE_AFTER, wait / 2))
    finally:
        for fd in waiting:
            if fd is not None:
                os.close(fd)  # the lock goes with it


def _readers_file(path: Path) -> str:
    return f"{path}.readers"


def _reader_waits(path: Path) -> int | None:
    """A shared lock on `<db>.readers` (created if need be), held by its descriptor: None where it cannot be created
    (the reader then waits for a gap between commits, as any reader did before)."""
    try:
        fd = os.open(_readers_file(path), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _readers_first(path: Path) -> None:
    """Before a commit: while readers wait for the file (a shared lock on `<db>.readers`), wait for them to be
    in, up to READERS_FIRST seconds; then the commit waits for them to close it, as for any reader."""
    try:
        fd = os.open(_readers_file(path), os.O_RDONLY)
    except OSError:  # no reader has waited for this warehouse
        return
    try:
        deadline = time.monotonic() + READERS_FIRST
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody waits (closing releases it)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(POLL / 5)
    finally:
        os.close(fd)


def _refuse_outdated(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """A warehouse from before fit status (fits without a status column) is closed and refused: its fits
    cannot say which are estimates, and this version's views need the column."""
    current = con.execute("SELECT bool_or(column_name = 'status') FROM information_schema.columns "
                          "WHERE table_schema = 'main' AND table_name = 'fits'").fetchall()[0][0]
    if current is False:
        con.close()
        raise WarehouseError(f"{path} was built by an older headforms (its fits have no status): "
                             f"rebuild it (remove the file, then run `headforms extract` again)")


# DuckDB's main header and its two database headers, before block 0 of a file; DuckDB writes whole blocks after them.
FILE_HEADERS = 3 * 4096


def cut_short(con: duckdb.DuckDBPyConnection) -> str | None:
    """How the file of the connection's database is shorter than DuckDB left it (a copy or a download that stopped),
    or None. Seen here: a length that is not the headers and whole blocks (a cut anywhere but on a block's edge;
    unless a write-ahead log holds what a checkpoint that stopped was writing), a block that the tables or the
    metadata list past the end, more blocks in use than the file holds (a cut on an edge that took only an index's
    blocks, with as many free blocks in the file, is not). The blocks' lists are read, not their bytes (about 10 ms
    for the demo warehouse)."""
    [(database, file)] = con.execute("SELECT database_name, path FROM duckdb_databases() "
                                     "WHERE database_name = current_database()").fetchall()
    if file is None:  # in memory
        return None
    quoted = '"{}"'.format(database.replace('"', '""'))
    tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main'",
                         [database]).fetchall()
    listed = " UNION ALL ".join(["SELECT max(block_id) AS block FROM pragma_metadata_info(?)"] + [
        "SELECT max(greatest(block_id, list_max(additional_block_ids))) FROM pragma_storage_info(?)"] * len(tables))
    arguments = [database] + [f'{quoted}.main."{name}"' for (name,) in tables] + [database]
    [(last, block_size, in_use)] = con.execute(
        f"SELECT (SELECT max(block) FROM ({listed})), block_size, used_blocks FROM pragma_database_size() "
        f"WHERE database_name = ?", arguments).fetchall()
    size = os.path.getsize(file)
    blocks, rest = divmod(size - FILE_HEADERS, block_size)
    wal = Path(f"{file}.wal")
    if size < FILE_HEADERS or (rest and not (wal.exists() and wal.stat().st_size)):
        why = f"{size:,} bytes, not {FILE_HEADERS:,} bytes of headers and whole blocks of {block_size:,}"
    elif last is not None and last >= blocks:
        why = f"{size:,} bytes, where its block {last} ends at byte {FILE_HEADERS + (last + 1) * block_size:,}"
    elif in_use > blocks:
        why = f"{size:,} bytes, room for {blocks} blocks of {block_size:,} bytes, where it uses {in_use}"
    else:
        return None
    return f"{file} is cut short: {why}"


def refuse_cut_short(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a file cut short before anything is written to it: DuckDB opens such a file and fails only on reading a
    missing block, by when a write may have changed it."""
    if why := cut_short(con):
        raise WarehouseError(damaged(why))


class Writer:
    """The warehouse opened for writing only for the length of each transaction, so that readers in
    other processes (status, sql, check, export) get in between two commits of a running extraction.

    The file is attached to one in-memory DuckDB per run and detached after each transaction: that
    releases it as closing would, at a fifth of a fresh connection's cost (about 3 ms against 15 ms).
    Given an open connection instead (`Writer(con=...)`), every transaction uses it and nothing is closed."""

    ALIAS = "headforms_warehouse"

    def __init__(self, path: str | Path | None = None, *, wait: float = WRITER_WAIT, con=None):
        self.path, self.wait, self.con = Path(path) if path is not None else None, wait, con
        self._host = None  # the in-memory DuckDB the file is attached to
        self._checked = False  # the file's length against its blocks, on the first attach

    @contextmanager
    def connection(self):
        """A read-write connection for one unit of work: the held one, or the file attached and detached around it."""
        if self.con is not None:
            yield self.con
            return
        if self._host is None:
            self._host = duckdb.connect(":memory:")
        host, path = self._host, str(self.path).replace("'", "''")
        _readers_first(self.path)
        _open_when_free(self.path, False, self.wait, lambda: host.execute(f"ATTACH '{path}' AS {self.ALIAS}"))
        try:
            host.execute(f"USE {self.ALIAS}")
            if not self._checked:
                refuse_cut_short(host)
                self._checked = True
            yield host
        finally:
            with interruptible():
                host.execute("USE memory")
                host.execute(f"DETACH {self.ALIAS}")

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def exclusive_run(path: str | Path, wait: float = 0.0):
    """One extraction at a time per warehouse: a lock on `<db>.lock` held for the whole run (the file
    itself is held only while committing, so readers get in; a second writer must not)."""
    _refuse_foreign(Path(path))
    try:
        lock = open(f"{path}.lock", "a+")
    except OSError as exc:
        raise WarehouseError(f"cannot open {path}: {exc.strerror}") from None

    def attempt():
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip()
            raise _Busy(f" (process {holder})" if holder.isdigit() else "") from None

    try:
        _when_free(Path(path), wait, attempt)
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield
    finally:
        lock.close()


def remove_warehouse(path: str | Path) -> None:
    """Delete a warehouse file and its write-ahead log."""
    for file in (Path(path), Path(f"{path}.wal"), Path(f"{path}.lock"), Path(_readers_file(Path(path)))):
        file.unlink(missing_ok=True)


def create_schema(con: duckdb.DuckDBPyConnection, views: bool = True) -> None:
    """Tables of schema.sql, then (unless `views` is False: the caller creates them later) every view of sql/,
    stored in the warehouse for any DuckDB client."""
    with interruptible():
        con.execute(SCHEMA.read_text())
    if views:
        create_views(con)


def create_views(con: duckdb.DuckDBPyConnection, temporary: bool = False) -> None:
    """Every view of sql/ (a file holds one SELECT; the view's name is the file's stem).

    Temporary views serve read-only connections, which cannot store them; one is kept only where the file
    lacks that view or stores another definition (an older version's), so information_schema lists it once.
    Stored views are written only when the file lacks one or stores another definition, so that a run that changes
    nothing writes nothing. Then the comments of storing/comments.py, where they differ from those there."""
    if temporary:
        _create_views(con, "TEMP VIEW")
        _drop_stored_copies(con)
    elif not _stored_as_they_are(con):
        _create_views(con, "VIEW")
    if statements := comment_statements(con, SCHEMA, VIEWS, temporary_only=temporary):
        with transaction(con):  # one commit: a fresh warehouse's ~530 comments in 0.30 s, against 0.86 s one by one
            con.execute("; ".join(statements))


def _create_views(con: duckdb.DuckDBPyConnection, kind: str) -> None:
    """CREATE OR REPLACE `kind` (VIEW or TEMP VIEW) of every view of sql/."""
    pending = sorted(VIEWS.glob("*.sql"))
    with interruptible():
        while pending:  # views may read other views (missing, or stored by an older version): retry until all resolve
            failed = []
            for file in pending:
                try:
                    con.execute(f"CREATE OR REPLACE {kind} {file.stem} AS {file.read_text()}")
                except (duckdb.CatalogException, duckdb.BinderException):  # a table, column or view not there yet
                    failed.append(file)
            if len(failed) == len(pending):
                if kind == "TEMP VIEW":  # a read-only warehouse of an earlier version lacks these views' tables
                    break
                con.execute(f"CREATE OR REPLACE {kind} {failed[0].stem} AS {failed[0].read_text()}")  # the error
            pending = failed


def _stored_as_they_are(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the file stores every view of sql/ word for word (as DuckDB prints them): compared through temporary
    copies, all dropped after."""
    if not con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal AND NOT temporary "
                       "AND database_name = current_database()").fetchall()[0][0]:
        return False  # a new warehouse: nothing to compare
    _create_views(con, "TEMP VIEW")
    same = _drop_stored_copies(con)
    with interruptible():
        for (name,) in con.execute("SELECT view_name FROM duckdb_views() WHERE temporary AND NOT internal").fetchall():
            con.execute(f"DROP VIEW temp.main.{name}")
    return {file.stem for file in VIEWS.glob("*.sql")} <= same


def _drop_stored_copies(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Drop the temporary views the file stores word for word (as DuckDB prints both), and name them: the stored one
    answers the same, since names in a view resolve to temporary views and tables first, as in the temporary copy."""
    same = con.execute("""
        SELECT t.view_name FROM duckdb_views() t JOIN duckdb_views() s USING (view_name)
        WHERE t.temporary AND NOT s.temporary AND s.database_name = current_database() AND s.schema_name = 'main'
          AND s.sql = replace(t.sql, 'CREATE TEMP VIEW ', 'CREATE VIEW ')""").fetchall()
    for (name,) in same:
        con.execute(f"DROP VIEW temp.main.{name}")
    return {name for (name,) in same}


@contextmanager
def interruptible():
    """Ctrl-C during a DuckDB query surfaces as DuckDB's own error; turn it back into KeyboardInterrupt,
    so callers treat it as an interruption (work kept, resumable) and not as a failure (work undone)."""
    try:
        yield
    except duckdb.InterruptException:
        raise KeyboardInterrupt from None
    except RuntimeError as exc:
        if str(exc) != "Query interrupted":
            raise
        raise KeyboardInterrupt from None


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection):
    """All or nothing: commit on success, roll back on any exception (Ctrl-C included)."""
    con.begin()
    try:
        with interruptible():
            yield con
    except BaseException:
        con.rollback()
        raise
    with interruptible():
        con.commit()


def insert(con: duckdb.DuckDBPyConnection, table: str, frame) -> None:
    """Append a polars frame or Arrow table to a table in one statement, matching columns by name. A failed INSERT
    is raised in DuckDB's words for it (a duplicate key, say): it aborts the caller's transaction, whose rollback
    drops the frame's registration with it (unregistering first would fail, and hide why)."""
    con.register("_frame", frame)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _frame")
    except duckdb.Error:
        with suppress(duckdb.TransactionException):  # outside a transaction, nothing is aborted: unregister
            con.unregister("_frame")
        raise
    con.unregister("_frame")


def query(con: duckdb.DuckDBPyConnection, sql: str, params=None) -> pl.DataFrame:
    """A query's result as a polars frame."""
    with interruptible():
        return con.sql(sql, params=params).pl()
