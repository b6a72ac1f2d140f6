"""Loading checkpoints into the warehouse, one committed layer at a time.

A new model is written layer by layer, each layer in one transaction with its progress
row, so an interrupted run resumes where it stopped. Replacing a model (--force) happens
in a single transaction: the warehouse holds the old model or the new one, never a mix.
A failing run (a bad weight, say) removes what it wrote, leaving the warehouse as it was.

Reading and analysis (`layers.layer_rows`) happen outside the warehouse, in this process or in an
executor's workers (warehouse/running/executors.py); the one writer opens the file only to commit,
so other processes can read it between two commits. Small layers share a commit (up to
COMMIT_SECONDS of work, and whatever workers finished meanwhile): whole layers still, in order.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from typing import Callable, Iterator

import polars as pl
import pyarrow as pa

from headforms.compute.threads import single_threaded
from headforms.extract import Checkpoint
from headforms.extract.transport.hub import FetchError
from headforms.warehouse.running import summaries
from headforms.warehouse.running.executors import Serial
from headforms.warehouse.running.layers import AnalysisOptions, LayerRows, LoadOptions, deltas
from headforms.warehouse.running.progress import RunProgress
from headforms.warehouse.storing.failures import ModelIncomplete, WarehouseError, no_space, place_of, stage, words
from headforms.warehouse.storing.store import Writer, insert, query, transaction


def tool_version() -> str:
    try:
        return version("headforms")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass
class LoadResult:
    model: str
    status: str          # "extracted", "resumed", "replaced" or "up to date"
    layers: int          # layers written by this run
    heads: int           # heads written by this run
    seconds: float


# Layers computed within this many seconds of the first one waiting, or already waiting, share its commit (opening,
# committing and closing the file costs tens of milliseconds, more than a small layer's analysis); 0: one layer each.
COMMIT_SECONDS = 2.0

# The columns a stored model's numbers depend on, its checkpoint's and its analysis's (AnalysisOptions): a source that
# differs in any of them is another model.
IDENTITY = ("revision", "architecture", "n_layers", "n_heads", "n_kv_heads", "d_model", "head_dim", "qk_norm",
            "parity_tolerance", "baseline_seed", "fold_norm", "distances", "circuits")
# per-layer rows of a model
TABLES = ("heads", "eigenvalues", "fits", "distance_profiles", "ov_heads", "ov_eigenvalues", "ov_fits", "layers")
MODEL_TABLES = ("intervals", "head_types", "copying_intervals")  # per-model rows, written when a model completes


def load_model(con, ckpt: Checkpoint, opts: LoadOptions) -> LoadResult:
    """Extract every missing layer of `ckpt` into the warehouse of an open connection, in this process."""
    [(_, result)] = load_models(Writer(con=con), [ckpt], opts)
    return result


def load_models(writer: Writer, ckpts: list[Checkpoint], opts: LoadOptions, executor=None,
                on_model: Callable[[Checkpoint], None] | None = None,
                on_layer: Callable[[int, int], None] | None = None,
                on_start: Callable[[], None] | None = None) -> Iterator[tuple[Checkpoint, LoadResult]]:
    """Extract several checkpoints, yielding (checkpoint, result) as each model completes.

    Every model is checked against the warehouse before any work starts. The executor (default:
    this process) reads and analyses the layers of all models, ahead of the writer; the writer
    commits them model by model, layer by layer, in order. `on_start` is the writer's own work done
    while the first layers are computed (the caller's: the warehouse's views), as is importing what the summaries
    need."""
    with writer.connection() as con:  # the file attached once for every model's plan
        plans = [_plan(con, ckpt, opts) for ckpt in ckpts]
    executor = executor or Serial()
    run = RunProgress(writer.path, len(plans))
    with single_threaded():  # held by the caller's thread for the run: it set the BLAS limit, so it restores it
        rows = executor.map((plan.ckpt, opts, layer) for plan in plans for layer in plan.todo)
        try:
            if on_start:
                on_start()
            summaries.prepare()
            for plan in plans:
                if on_model:
                    on_model(plan.ckpt)
                result = _load(writer, plan, rows, run, on_layer)
                run.model_done()
                yield plan.ckpt, result
        finally:
            run.close()
            executor.close()


@dataclass
class _Plan:
    """What a run does to one model: its record, the layers to compute, and the status it will report."""

    ckpt: Checkpoint
    opts: LoadOptions
    record: dict
    todo: list[int]
    status: str     # "extracted", "resumed", "replaced" or "up to date"
    created: bool   # the models row is this run's


def _plan(con, ckpt: Checkpoint, opts: LoadOptions) -> _Plan:
    """Compare `ckpt` with what the warehouse holds of it: refuse a changed source unless forced."""
    name, layers = ckpt.name, ckpt.spec.layers
    deltas(ckpt.spec, opts.analysis)  # refuses distances a RoPE model's conventions do not allow, before any write
    if ckpt.spec.parts and "part" not in query(con, "SELECT constraint_column_names AS key FROM duckdb_constraints() "
                                                    "WHERE table_name = 'heads' AND constraint_type = 'PRIMARY KEY' "
                                                    "AND database_name = current_database()")["key"].explode():
        raise WarehouseError(f"model '{name}' stores each head as its parts ({', '.join(p.name for p in ckpt.spec.parts)}), "
                             "and this warehouse was built before head parts (its heads are keyed without part): "
                             "extract it into a new warehouse (`db`), or rebuild this one")
    record = _model_record(ckpt, opts.analysis)
    columns = ", ".join("coalesce(circuits, 'qk') AS circuits" if key == "circuits" else key for key in IDENTITY)
    old = query(con, f"SELECT {columns}, complete FROM models WHERE model = ?", [name])  # models before: qk
    if old.height:
        prev = old.row(0, named=True)
        changed = [f"{key} {prev[key]} -> {record[key]}" for key in IDENTITY if prev[key] != record[key]]
        if changed and not opts.force:
            raise WarehouseError(f"model '{name}' in the warehouse differs from this source ({'; '.join(changed)}): "
                                 f"use force=True to replace it, or `name` to keep both")
        if opts.force:
            return _Plan(ckpt, opts, record, list(layers), "replaced", False)
        if prev["complete"]:
            return _Plan(ckpt, opts, record, [], "up to date", False)
    done = set(query(con, "SELECT layer FROM layers WHERE model = ?", [name])["layer"].to_list())
    todo = [layer for layer in layers if layer not in done]
    return _Plan(ckpt, opts, record, todo, "resumed" if done or old.height else "extracted", not old.height)


def _load(writer: Writer, plan: _Plan, rows, run: RunProgress, on_layer) -> LoadResult:
    """Commit a model's layers as `rows` (executors.Results) yields them, whole layers in order: a layer
    with those computed within COMMIT_SECONDS after it or already waiting; a replacement in one transaction."""
    start = time.perf_counter()
    ckpt, record, name = plan.ckpt, plan.record, plan.ckpt.name
    heads = len(plan.todo) * ckpt.spec.n_heads
    if plan.status == "up to date":
        return LoadResult(name, plan.status, 0, 0, time.perf_counter() - start)
    run.model(name, len(ckpt.spec.layers), len(ckpt.spec.layers) - len(plan.todo), ckpt.spec.n_layers)
    if plan.status == "replaced":  # computed first: readers see the old model until the swap
        layers = [next(rows) for _ in plan.todo]

        def swap(con):
            _delete_model(con, name)
            insert(con, "models", pl.DataFrame([record]))
            _insert_layers(con, layers)

        _finish(writer, plan, swap)
        _report(layers, run, on_layer)
        return LoadResult(name, "replaced", len(layers), heads, time.perf_counter() - start)
    if plan.created:
        with _commit(writer) as con:
            insert(con, "models", pl.DataFrame([record]))
    written: list[int] = []
    try:
        while len(written) < len(plan.todo):
            batch, started, failure = [next(rows)], time.perf_counter(), None
            try:
                while len(written) + len(batch) < len(plan.todo) and COMMIT_SECONDS > 0 and (
                        rows.ready() or time.perf_counter() - started < COMMIT_SECONDS):
                    batch.append(next(rows))
            except BaseException as exc:  # the layers already computed are committed before it is raised
                failure = exc
            with stage("write", name, (batch[0].layer, batch[-1].layer)), _commit(writer) as con:
                _insert_layers(con, batch)
            written += [layer.layer for layer in batch]
            _report(batch, run, on_layer)
            if failure is not None:
                raise failure
    except FetchError:  # the network gave out: keep the committed layers, the same command resumes
        with _commit(writer) as con:
            _record_cost(con, ckpt)
        raise
    except Exception as exc:
        if no_space(exc) is not None:  # a full disk: keep the committed layers; the same command resumes
            raise
        with _commit(writer) as con:  # undo this run only; an interruption (Ctrl-C, kill) keeps its layers
            if plan.created:
                _delete_model(con, name)
            elif written:
                for table in TABLES:
                    con.execute(f"DELETE FROM {table} WHERE model = ? AND list_contains(?, layer)", [name, written])
        raise
    _finish(writer, plan)
    return LoadResult(name, plan.status, len(written), len(written) * ckpt.spec.n_heads, time.perf_counter() - start)


def _finish(writer: Writer, plan: _Plan, before: Callable = lambda con: None) -> None:
    """Once every layer is computed: in one transaction, `before` (a replacement's swap of the whole model), the
    model marked complete and its summaries. A failing summary keeps the layers (committed again after `before`
    when the first transaction rolled back) with the model incomplete and models.failed_step naming the step, so
    the same command finishes only what is missing; it is raised as ModelIncomplete."""
    name = plan.ckpt.name
    try:
        with _commit(writer) as con:
            before(con)
            con.execute("UPDATE models SET complete = true, failed_step = NULL, extracted_at = ? WHERE model = ?",
                        [plan.record["extracted_at"], name])
            summaries.write_summaries(con, name, plan.opts.analysis.resamples, plan.opts.analysis.seed)
            _record_cost(con, plan.ckpt)
    except Exception as exc:
        step = place_of(exc).step if place_of(exc) else "finish"
        with _commit(writer) as con:
            before(con)
            con.execute("UPDATE models SET failed_step = ? WHERE model = ?", [step, name])
            _record_cost(con, plan.ckpt)
        raise ModelIncomplete(f"model '{name}': {step} failed ({words(exc)}); its {len(plan.ckpt.spec.layers)} layers "
                              f"are kept, marked incomplete (models.failed_step): run the same command to finish "
                              f"it") from exc


@contextmanager
def _commit(writer: Writer):
    """One transaction on the writer's connection: the file is held for this commit alone."""
    with writer.connection() as con, transaction(con):
        yield con


def _report(layers: list[LayerRows], run: RunProgress, on_layer) -> None:
    """Committed layers: into the progress file, and to the caller's callback."""
    run.layers(len(layers), sum(layer.heads for layer in layers), sum(layer.bytes_fetched for layer in layers))
    for layer in layers:
        if on_layer:
            on_layer(layer.layer, layer.heads)


def _insert_layers(con, layers: list[LayerRows]) -> None:
    """Every table's rows of these layers, one INSERT per table (the caller holds the transaction)."""
    for table in layers[0].tables:
        insert(con, table, pa.concat_tables([layer.tables[table] for layer in layers]))


def _delete_model(con, name: str) -> None:
    for table in (*TABLES, *MODEL_TABLES, "models"):
        con.execute(f"DELETE FROM {table} WHERE model = ?", [name])


def _record_cost(con, ckpt: Checkpoint) -> None:
    """Add this run's hub bytes to the model's bytes_fetched (runs that resume add up)."""
    if ckpt.bytes_fetched is not None:
        con.execute("UPDATE models SET bytes_fetched = coalesce(bytes_fetched, 0) + ? WHERE model = ?",
                    [ckpt.bytes_fetched, ckpt.name])


def _model_record(ckpt: Checkpoint, analysis: AnalysisOptions) -> dict:
    spec = ckpt.spec
    return {
        "model": ckpt.name, "source": ckpt.source, "revision": ckpt.revision, "revision_kind": ckpt.revision_kind,
        "architecture": spec.architecture, "positional_encoding": spec.positional,
        "n_layers": spec.n_layers, "attention_layers": list(spec.layers), "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads,
        "d_model": spec.d_model, "head_dim": spec.head_dim, "score_scale": spec.score_scale,
        "qk_norm": spec.qk_norm, "fold_norm": spec.fold_norm, "attention_softcap": spec.softcap,
        "distances": list(deltas(spec, analysis)) if spec.rope is not None else None,
        "config": json.dumps(spec.config | ({"rope": spec.rope.describe()} if spec.rope else {}), default=str),
        "parity_tolerance": analysis.parity_tolerance, "baseline_seed": analysis.seed,
        "tool_version": tool_version(), "base_model": ckpt.base_model, "training_step": ckpt.training_step,
        "bytes_fetched": None, "checkpoint_bytes": ckpt.checkpoint_bytes,  # bytes_fetched: _record_cost
        "quantization": ckpt.quantization, "circuits": ",".join(ckpt.options.circuits),
        "extracted_at": datetime.now(timezone.utc).replace(tzinfo=None), "complete": False,
    }


