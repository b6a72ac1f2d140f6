"""The Python API: what the command line does, for notebooks and scripts (polars frames in, out).

    import headforms
    headforms.extract_models("demo", db="warehouse.duckdb")   # headforms.api.extract
    heads = headforms.heads("warehouse.duckdb", model="SmolLM2-135M")
    stats = headforms.analyse(w_q, w_k).heads        # any weights in memory, no warehouse

The command line (cli.py) is a thin layer over these functions: each command is one call here.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Iterable

import numpy as np

from headforms.compute.threads import keep_freed_memory
from headforms.extract import MODEL_SETS, ExtractError, ReadOptions
from headforms.extract.sources import REVISION_SETS, ArgumentError, name_clashes, plan_targets
from headforms.warehouse.publishing.render import FORMATS, LIMIT, render, write_parquet
from headforms.warehouse.running import EXECUTORS
from headforms.warehouse.storing import READ_WAIT, default_db
from headforms.warehouse.storing.failures import ModelIncomplete, WarehouseError


class Progress:
    """Callbacks of `extract`: override what you want to show (the CLI draws progress bars)."""

    def model_started(self, ckpt) -> None:
        """A checkpoint was opened and its layers are about to be read."""

    def layer_done(self, layer: int, heads: int) -> None:
        """A layer's rows were committed."""

    def model_done(self, ckpt, result) -> None:
        """A model is complete (or was found up to date)."""


def connect(db: str | Path | None = None, *, read_only: bool = True, wait: float | None = None):
    """A DuckDB connection to the warehouse (default: $HEADFORMS_DB or warehouse.duckdb) with its views.

    Read-only by default, so it can be opened beside other readers and between the commits of a
    running extraction (waiting up to `wait` seconds, default READ_WAIT, for one to end).
    Close it soon: an extraction cannot commit while it is open."""
    from headforms.warehouse.storing.store import connect as open_warehouse, create_schema

    con = open_warehouse(db or default_db(), read_only=read_only, wait=READ_WAIT if wait is None else wait)
    if not read_only:
        create_schema(con)
    return con


def extract(sources: str | Iterable[str], db: str | Path | None = None, *, progress: Progress | None = None,
            name: str | None = None, revision: str | None = None, qk_norm: str | None = None,
            wait: float = 0.0, tower: str | None = None, revisions: str | list[str] | None = None,
            set_file: str | Path | None = None, fold_norm: str = "none", circuits: str | Iterable[str] = "qk",
            jobs: int = 1, executor: str = "local", ray_address: str | None = None, **options):
    """Extract sources (hub ids, folders, .gguf files, pkg:NAME, model sets) into the warehouse.

    `revisions` ('step0,step1000' or a list) extracts each source's training checkpoints, one model
    per revision (named model@revision); `set_file` adds the models of a set file (one
    `source [revision] [name]` a line); `tower` picks the tower of clip/siglip/whisper checkpoints
    (default text/encoder); `fold_norm` ("none", "gain", "center") folds the norm feeding attention
    into W_Q, W_K (recorded in models.fold_norm); `qk_norm` ("refuse" or "fold" a QK-norm model's gains into
    W_Q, W_K) left None reads a model as the warehouse holds it (folded again), else refuses; `circuits` ("qk", or
    "qk,ov" for the output-value circuits too: ov_heads, ov_eigenvalues, ov_fits, recorded in models.circuits).
    `options` are the fields of `headforms.warehouse.running.layers.AnalysisOptions` (parity_tolerance, seed,
    resamples, distances: what the stored numbers depend on) and of `LoadOptions` (device, force: how the run runs).
    Layers are read and analysed in this process, in `jobs` worker processes, or as Ray tasks (executor="ray", on the
    cluster at `ray_address`, else a local one); one writer commits them in order, holding the file only while it
    commits. Returns one row per model: status, layers
    and heads written, seconds, shape, bytes. A failed first run leaves no warehouse file behind; an
    interruption (Ctrl-C, a hub that gave out, a full disk) keeps committed layers, and so does a step after the
    last layer (ModelIncomplete: the model is kept incomplete, models.failed_step names the step; run again to
    finish)."""
    from headforms.compute.threads import single_threaded
    from headforms.extract.sources import open_target
    from headforms.warehouse.running.executors import executor as make_executor
    from headforms.warehouse.storing.failures import no_space, stage
    from headforms.warehouse.running.layers import AnalysisOptions, LoadOptions

    analysed = {f.name for f in fields(AnalysisOptions)}
    unknown = set(options) - analysed - {f.name for f in fields(LoadOptions) if f.name != "analysis"}
    if unknown:
        raise TypeError(f"extract() got unknown options: {', '.join(sorted(unknown))}")
    opts = LoadOptions(AnalysisOptions(**{k: v for k, v in options.items() if k in analysed}),
                       **{k: v for k, v in options.items() if k not in analysed})
    read = ReadOptions(qk_norm=qk_norm or "refuse", tower=tower, fold_norm=fold_norm,
                       circuits=circuit_names(circuits))
    progress = progress or Progress()
    db = Path(db or default_db())
    targets = plan_targets(sources, name=name, revision=revision, revisions=revisions, set_file=set_file)
    created, opened, rows, ckpts, work = not db.exists(), False, [], [], None
    folded = _folded(db, targets, wait) if qk_norm is None and not created else set()
    try:
        for i, target in enumerate(targets):
            with stage(f"open ({target.source})", target.name):
                ckpts.append(open_target(target, replace(read, qk_norm="fold") if i in folded else read))
        if clashes := name_clashes([(target.source, ckpt.name) for target, ckpt in zip(targets, ckpts)]):
            raise ArgumentError(next(iter(clashes.values())))
        with single_threaded():  # the run's BLAS limit, held by this thread from its first layer on
            work = make_executor(jobs, executor, ray_address)
            if created:  # a new warehouse's plans are every layer: they start now, while the writer is set up
                work.start([(ckpt, opts, layer) for ckpt in ckpts for layer in ckpt.spec.layers])
            # the writer's half (DuckDB, polars) is imported now, beside the layers started
            from headforms.warehouse.storing import revision as local_revisions
            from headforms.warehouse.running.load import load_models
            from headforms.warehouse.storing.store import Writer, connect as open_warehouse, create_schema, \
                create_views, exclusive_run, interruptible

            with exclusive_run(db, wait):
                con = open_warehouse(db, wait=wait)
                opened = True
                try:
                    create_schema(con, views=False)  # the views are created while the first layers are computed
                    local_revisions.prepare(con, ckpts)  # a local digest: hashed while read, or first to compare
                finally:
                    with interruptible():
                        con.close()
                with Writer(db) as writer:
                    def views():
                        with writer.connection() as con:
                            create_views(con)

                    for ckpt, result in load_models(writer, ckpts, opts, work, progress.model_started,
                                                    progress.layer_done, on_start=views):
                        local_revisions.record(writer, ckpt)
                        _summary(rows, ckpt, result)
                        progress.model_done(ckpt, result)
    except Exception as error:  # an interruption (Ctrl-C, a lost network) keeps committed layers, and so the file
        from headforms.extract.transport.hub import FetchError
        from headforms.warehouse.storing.store import remove_warehouse

        kept = isinstance(error, (FetchError, ModelIncomplete)) or no_space(error) is not None  # layers stay
        if created and opened and not rows and not kept:  # rows undone: the file too
            remove_warehouse(db)
        raise
    finally:
        if work is not None:  # stopped here too where the run ended before its writer took it
            work.close()
        for ckpt in ckpts:
            ckpt.close()
    import polars as pl

    return pl.DataFrame(rows, schema_overrides={"seconds": pl.Float64})


def circuit_names(circuits: str | Iterable[str]) -> tuple[str, ...]:
    """'qk,ov' or ['qk', 'ov'] as ReadOptions takes them: 'qk' and optionally 'ov', in that order."""
    names = [name.strip() for name in (circuits.split(",") if isinstance(circuits, str) else circuits)]
    if not names or set(names) - {"qk", "ov"} or "qk" not in names:
        raise ExtractError(f"circuits are qk or qk,ov (the query-key forms, and the output-value circuits beside "
                           f"them), not {','.join(names)!r}")
    return tuple(name for name in ("qk", "ov") if name in names)


def _folded(db: Path, targets: list, wait: float) -> set[int]:
    """The targets whose model the warehouse holds extracted with qk_norm="fold" (by name, else by source): a rerun
    without qk_norm reads them so again."""
    from headforms.warehouse.storing.store import query

    con = connect(db, wait=wait)
    try:
        models = query(con, "SELECT model, source FROM models WHERE qk_norm = 'folded'")
    finally:
        con.close()
    names, sources = set(models["model"]), set(models["source"])
    return {i for i, t in enumerate(targets) if (t.name in names if t.name else t.source in sources)}


def _summary(rows: list, ckpt, result) -> None:
    """extract's row for one model."""
    spec = ckpt.spec
    rows.append({"model": result.model, "status": result.status, "layers": result.layers, "heads": result.heads,
                 "seconds": result.seconds, "architecture": spec.architecture, "n_layers": spec.n_layers,
                 "n_heads": spec.n_heads, "d_model": spec.d_model, "head_dim": spec.head_dim,
                 "revision": ckpt.revision, "bytes_fetched": ckpt.bytes_fetched,
                 "checkpoint_bytes": ckpt.checkpoint_bytes})


def plan(sources: str | Iterable[str], *, name: str | None = None, revision: str | None = None,
         revisions: str | list[str] | None = None, set_file: str | Path | None = None, qk_norm: str = "refuse",
         tower: str | None = None, fold_norm: str = "none", circuits: str | Iterable[str] = "qk"):
    """What extracting `sources` (with extract's options) would read, from headers alone (nothing else is
    fetched): per model, heads, the bytes of its Q/K tensors and of its weight files. `warning` says why
    extract would refuse a model whose header was read whole (a file cut short or too long, a name an earlier
    source has), or a source it refuses (QK-norm without qk_norm="fold", say: the rest are planned), else null.
    Raises the first source's ExtractError when every source is refused: there is nothing to plan."""
    import polars as pl

    from headforms.extract.formats.unreadable import IncompleteFile
    from headforms.extract.sources import open_target

    read = ReadOptions(qk_norm=qk_norm or "refuse", tower=tower, fold_norm=fold_norm,
                       circuits=circuit_names(circuits))
    rows, refusals = [], []
    targets = plan_targets(sources, name=name, revision=revision, revisions=revisions, set_file=set_file)
    for target in targets:
        try:
            ckpt, warning = open_target(target, read), None
        except IncompleteFile as e:  # the header alone still gives the plan
            if e.checkpoint is None:
                raise
            ckpt, warning = e.checkpoint, e.warning
        except ExtractError as e:  # refused (QK-norm unfolded, a family not supported): its row says why
            refusals.append(e)
            rows.append({"model": target.name, "source": target.source, "heads": None, "qk_bytes": None,
                         "checkpoint_bytes": None, "header_bytes_fetched": None,
                         "warning": f"{target.source} is refused: {e}"})
            continue
        ckpt.close()
        rows.append({"model": ckpt.name, "source": target.source, "heads": len(ckpt.spec.layers) * ckpt.spec.n_heads,
                     "qk_bytes": ckpt.qk_bytes, "checkpoint_bytes": ckpt.checkpoint_bytes,
                     "header_bytes_fetched": ckpt.bytes_fetched, "warning": warning})
    if refusals and len(refusals) == len(rows):  # nothing to plan: the refusal is the answer
        raise refusals[0]
    named = [i for i, row in enumerate(rows) if row["model"] is not None]  # a refused source has no name yet
    for j, why in name_clashes([(targets[i].source, rows[i]["model"]) for i in named]).items():
        rows[named[j]]["warning"] = rows[named[j]]["warning"] or why
    return pl.DataFrame(rows, schema_overrides={"model": pl.Utf8, "heads": pl.Int64, "qk_bytes": pl.Int64,
                                                "checkpoint_bytes": pl.Int64, "header_bytes_fetched": pl.Int64,
                                                "warning": pl.Utf8})


def cache(clear: bool = False, repo: str | None = None):
    """The hub range cache, one row per repo and commit (files, bytes); clear=True deletes it (or one repo's) first."""
    import polars as pl

    from headforms.extract.transport.hub import cache_usage, clear_cache

    if clear:
        clear_cache(repo)
    rows = [row for row in cache_usage() if repo is None or row["repo"] == repo]
    return pl.DataFrame(rows, schema={"repo": pl.Utf8, "commit": pl.Utf8, "files": pl.Int64, "bytes": pl.Int64})


def cache_folder() -> Path:
    """Where headforms caches hub ranges and local revision digests ($HEADFORMS_CACHE, else beside the HF cache)."""
    from headforms.extract.transport.caches import cache_root

    return cache_root()


def sql(query: str, db: str | Path | None = None, *, write: bool = False, wait: float = READ_WAIT):
    """Run one SQL statement on the warehouse (read-only unless `write`): its result as a polars frame, or None for
    a statement that returns nothing (`frame.to_pandas()` for pandas). Several statements are refused (WarehouseError)."""
    from headforms.warehouse.storing.store import connect as open_warehouse

    con = open_warehouse(db or default_db(), read_only=not write, wait=wait)
    try:
        statements = con.extract_statements(query)
        if len(statements) > 1:  # con.sql would run them all and show the last: one query, one result
            raise WarehouseError(f"the query holds {len(statements)} statements; headforms sql runs one at a time "
                             "(its result is one table): run each on its own")
        relation = con.sql(query)
        return relation.pl() if relation is not None else None
    finally:
        con.close()


@dataclass
class Status:
    """`status`: the models in the warehouse, and a running extraction's progress (None when none runs)."""

    models: object         # one row per model: head counts, progress, provenance
    running: dict | None   # the running extraction's progress file (warehouse.running.progress)


def status(db: str | Path | None = None, *, wait: float = READ_WAIT) -> Status:
    """Models in the warehouse (head counts, progress, provenance) and a running extraction's progress."""
    from headforms.warehouse.running.progress import running
    from headforms.warehouse.storing.store import connect as open_warehouse, query

    db = db or default_db()
    con = open_warehouse(db, read_only=True, wait=wait)
    try:
        frame = query(con, """
            SELECT m.model, m.architecture, m.n_layers,
                   len(coalesce(m.attention_layers, range(m.n_layers))) AS attention_layers,
                   count(DISTINCT l.layer) AS layers_done,
                   len(coalesce(m.attention_layers, range(m.n_layers))) * m.n_heads AS heads_expected,
                   (SELECT count(DISTINCT (h.layer, h.head)) FROM heads h WHERE h.model = m.model) AS heads,
                   m.complete, m.source, m.revision, m.tool_version, m.extracted_at
            FROM models m LEFT JOIN layers l USING (model)
            GROUP BY ALL ORDER BY m.model""")
    finally:
        con.close()
    return Status(frame, running(db))


def export(db: str | Path | None = None, out: str | Path = "export", *, paper_format: bool = False,
           formats: tuple[str, ...] = ("csv", "parquet"), wait: float = READ_WAIT) -> list[Path]:
    """Write the paper's tables (in `formats`: csv, parquet, latex) and figures (PNG), and index.csv; with
    paper_format also the survey files in the format of the paper's published code. Returns the files written."""
    from headforms.warehouse.publishing.export import export as export_all

    con = connect(db, wait=wait)
    try:
        return export_all(con, out, paper_format=paper_format, formats=tuple(formats))
    finally:
        con.close()


def check(db: str | Path | None = None, *, quick: bool = False, wait: float = READ_WAIT) -> list:
    """Verify the warehouse: every stored value readable (unless `quick`) and its invariants; returns the findings
    (each with its level, 'violation' or 'warning', and its place)."""
    from headforms.warehouse.storing.check import check_warehouse

    con = connect(db, wait=wait)
    try:
        return check_warehouse(con, full=not quick)
    finally:
        con.close()


def architectures(markdown: bool = False):
    """Supported families of both formats (positional scheme, Q/K packing, score scale, what is refused): a polars
    frame, or the README's markdown table."""
    from headforms.extract.layouts import architectures as table_of

    if markdown:
        return table_of.markdown()
    import polars as pl

    return pl.DataFrame(table_of.architectures())


def failure(exc: Exception) -> tuple[str, bool]:
    """A failure of any call here as the one line a user reads, and whether its traceback is worth keeping."""
    from headforms.warehouse.storing.failures import one_line

    return one_line(exc)


def describe(db: str | Path | None = None, name: str | None = None):
    """The warehouse's tables and views with their descriptions, row counts and columns; with `name`, that table's
    or view's columns, their types and descriptions (polars frames; DuckDB's duckdb_columns() holds the same)."""
    from headforms.warehouse.storing.comments import describe as catalog

    con = connect(db)
    try:
        return catalog(con, name)
    except LookupError:
        raise WarehouseError(f"no table or view '{name}' in the warehouse: `headforms describe` lists them") from None
    finally:
        con.close()


def table(db: str | Path | None, view: str):
    """A table or view of the warehouse (e.g. 'parity_by_model') as a polars frame."""
    from headforms.warehouse.storing.store import query

    con = connect(db)
    try:
        if view not in set(query(con, "SELECT table_name FROM information_schema.tables")["table_name"]):
            raise ValueError(f"no table or view '{view}' in the warehouse")
        return query(con, f'SELECT * FROM "{view}"')
    finally:
        con.close()


def heads(db: str | Path | None = None, model: str | None = None):
    """One row per head and part (heads.part; every statistic of statistics.md section 3), of one model or all."""
    from headforms.warehouse.storing.store import query

    con = connect(db)
    try:
        where = "WHERE model = ?" if model is not None else ""
        return query(con, f"SELECT * FROM heads {where} ORDER BY model, layer, head, part",
                     [model] if model is not None else None)
    finally:
        con.close()


def spectra(db: str | Path | None, model: str, layer: int, head: int, *, part: str = "whole"):
    """A head's spectra in long form: spectrum ('S', 'S_pos', 'S_neg', 'T_sv', 'T_sigma', 'L', 'L_sv'), idx, value,
    imag; of its form `part` (heads.part: 'whole', or a latent-attention head's 'nope' or 'rope')."""
    from headforms.warehouse.storing.store import query

    con = connect(db)
    try:
        return query(con, "SELECT spectrum, idx, value, imag FROM eigenvalues WHERE model = ? AND layer = ? "
                          "AND head = ? AND part = ? ORDER BY spectrum, idx", [model, layer, head, part])
    finally:
        con.close()


def report(db: str | Path | None = None, out: str | Path = "report", *, wait: float = 0.0) -> list[Path]:
    """Write the interactive report (a static site, offline from file://) of the warehouse; returns its pages."""
    from headforms.warehouse.publishing.report import write_report

    con = connect(db, wait=wait)
    try:
        return write_report(con, out)
    finally:
        con.close()


class BehaviourProgress:
    """Callbacks of `behaviour`: override what you want to show (the CLI prints the estimate and draws a bar)."""

    def estimate(self, model: str, bytes_needed: int, parameters: int, tokens: int) -> None:
        """Before the forward pass: the bytes it will hold (extract.behaviour.forward_bytes: float32 weights, one
        layer's attention, activations, the inputs kept per layer), within 0.8x to 1.5x of the peak RSS measured."""

    def layer_done(self, model: str, stage: str, layer: int, n_layers: int) -> None:
        """A layer of the forward pass ('forward') or of the forms' reproduction ('forms') is done."""


def behaviour(sources: str | Iterable[str], db: str | Path | None = None, *, length: int = 64, sequences: int = 8,
              seed: int = 0, device: str = "cpu", tower: str | None = None, name: str | None = None,
              resamples: int = 2000, wait: float = 0.0, progress: BehaviourProgress | None = None):
    """Each head's behaviour beside its form (statistics.md section 8), for models already in the warehouse.

    A source is what extract was given (hub id, folder, .gguf, pkg:NAME) or a warehouse model's name (its stored
    source and revision are used); a model extracted with qk_norm="fold" is read folded again, its self-logits
    reproduced with the per-token RMS factors of its q and k norms (a latent-attention head's as the sum of its two
    parts, with the RMS factors of its q and kv latents). Runs each model with transformers on
    `sequences` seeded sequences of `length` random ordinary tokens, each
    repeated once, and stores per head (`head_behaviour`) its self, previous-token and induction scores and its
    mean self-logit, with the warehouse form's part, the q/k biases' part and the largest reproduction error;
    and per parity type the medians' layer-bootstrap intervals (`behaviour_intervals`, `resamples`, seeded by
    `seed`). Returns one row per model: heads, seconds (all, and the forward pass's), largest reproduction error."""
    import time

    import polars as pl

    from headforms.compute.reduction import device_problem
    from headforms.extract import behaviour as run_model
    from headforms.extract.sources import open_target
    from headforms.warehouse.running.behaviour import behaviour_rows, stored_model, stored_targets, write_behaviour
    from headforms.warehouse.storing.store import Writer, exclusive_run, refuse_cut_short

    if length < 2 or sequences < 1 or resamples < 1:
        raise ValueError(f"length >= 2, sequences >= 1 and resamples >= 1 (got {length}, {sequences}, {resamples})")
    if problem := device_problem(device, float64=False):  # the forward pass runs in float32
        raise ExtractError(problem)
    progress = progress or BehaviourProgress()
    db, rows = Path(db or default_db()), []
    if not db.exists():
        raise FileNotFoundError(f"no warehouse {db}: run `headforms extract` first")
    con = connect(db, wait=wait)
    try:
        refuse_cut_short(con)  # before the forward pass, whose rows could not be written
        targets = stored_targets(con, plan_targets(sources, name=name))
    finally:
        con.close()
    for target, qk_norm in targets:
        started, ckpt = time.perf_counter(), open_target(target, ReadOptions(tower=tower, qk_norm=qk_norm))
        try:
            con = connect(db, wait=wait)
            try:
                model = stored_model(con, ckpt)
            finally:
                con.close()
            n_layers, label = len(ckpt.spec.layers), ckpt.name  # a hybrid's: its attention layers
            network, allowed = run_model.load(
                target.source, ckpt.revision if ckpt.meter is not None else None, ckpt.spec, tower=tower,
                length=length, sequences=sequences, device=device,
                on_estimate=lambda need, params: progress.estimate(label, need, params, 2 * length * sequences))
            run = run_model.run(network, allowed, length=length, sequences=sequences, seed=seed,
                                n_layers=n_layers, label=label,
                                on_layer=lambda i: progress.layer_done(label, "forward", i, n_layers))
            del network
            frame = behaviour_rows(model, ckpt, run, length=length, sequences=sequences, seed=seed,
                                   on_layer=lambda i: progress.layer_done(label, "forms", i, n_layers))
        finally:
            ckpt.close()
        with exclusive_run(db, wait), Writer(db) as writer, writer.connection() as con:
            write_behaviour(con, frame, resamples, seed)
        rows.append({"model": ckpt.name, "heads": frame.height, "seconds": time.perf_counter() - started,
                     "forward_seconds": run.seconds,
                     "reproduction_error": frame["reproduction_error"].max(),
                     "largest_self_logit": frame["self_logit"].abs().max()})
    return pl.DataFrame(rows, schema_overrides={"seconds": pl.Float64, "reproduction_error": pl.Float64})


@dataclass
class Analysis:
    """Every number the warehouse would store about some heads, as polars frames."""

    heads: object        # one row per query head
    eigenvalues: object  # long-form spectra
    fits: object         # one row per head, sample and family


def analyse(w_q, w_k, *, kv_index=None, parity_tolerance: float | None = None, seed: int = 0,
            layer: int = 0, model: str = "") -> Analysis:
    """Statistics, spectra and fits of query/key maps in memory, without a warehouse.

    w_q: (H, n, N) or one head's (n, N); w_k: (H_kv, n, N) or (n, N) (numpy, torch or lists).
    kv_index: the key head of each query head (default: grouped-query order). `seed` and
    `layer` select the random baseline heads as an extraction would."""
    from headforms.compute.analysis import analyse_layer
    from headforms.compute.statistics import PARITY_TOLERANCE
    import polars as pl

    from headforms.warehouse.running.layers import layer_tables

    w_q, w_k = (np.asarray(_as_numpy(w), dtype=np.float64) for w in (w_q, w_k))
    w_q, w_k = (w[None] if w.ndim == 2 else w for w in (w_q, w_k))
    if w_q.ndim != 3 or w_k.ndim != 3 or w_q.shape[1:] != w_k.shape[1:]:
        raise ValueError(f"w_q {w_q.shape} and w_k {w_k.shape} must be (heads, n, N) with the same n and N")
    if w_q.shape[0] % w_k.shape[0]:
        raise ValueError(f"{w_q.shape[0]} query heads are not a multiple of {w_k.shape[0]} key heads")
    if not (np.isfinite(w_q).all() and np.isfinite(w_k).all()):
        raise ValueError("w_q and w_k must be finite")
    if kv_index is None:
        kv_index = np.arange(w_q.shape[0]) // (w_q.shape[0] // w_k.shape[0])
    kv_index = np.asarray(kv_index)
    result = analyse_layer(w_q, w_k, kv_index, layer=layer, seed=seed,
                           parity_tolerance=PARITY_TOLERANCE if parity_tolerance is None else parity_tolerance)
    tables = layer_tables(model, layer, kv_index, w_q.shape[1], result)
    frames = {name: pl.from_arrow(tables[name]).with_columns(pl.col(pl.Categorical).cast(pl.Utf8))
              for name in ("heads", "eigenvalues", "fits")}
    return Analysis(**{name: _part_after_head(frame) for name, frame in frames.items()})


def _part_after_head(frame):
    """A frame of layer_tables with its `part` column where the warehouse's tables have it: right after head."""
    columns = [c for c in frame.columns if c != "part"]
    at = columns.index("head") + 1
    return frame.select(columns[:at] + ["part"] + columns[at:])


def _as_numpy(w):
    """torch tensors (any dtype or device) and array-likes as numpy."""
    if hasattr(w, "detach"):
        return w.detach().to("cpu").double().numpy()
    return w


__all__ = ["Analysis", "BehaviourProgress", "Progress", "Status", "analyse", "architectures", "behaviour", "cache", "cache_folder", "check",
           "connect", "export", "extract", "failure", "heads", "plan", "report", "spectra", "sql",
           "status", "table",
           "EXECUTORS", "MODEL_SETS", "READ_WAIT", "REVISION_SETS", "ArgumentError", "ExtractError", "ModelIncomplete", "ReadOptions",
           "WarehouseError", "default_db", "keep_freed_memory"]
