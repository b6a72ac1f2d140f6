"""Loading a checkpoint into the warehouse, one committed layer at a time.

A new model is written layer by layer, each layer in one transaction with its progress
row, so an interrupted run resumes where it stopped. Replacing a model (--force) happens
in a single transaction: the warehouse holds the old model or the new one, never a mix.
A failing run (a bad weight, say) removes what it wrote, leaving the warehouse as it was.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from typing import Callable

import numpy as np
import polars as pl

from headforms.compute.analysis import LayerAnalysis, analyse_layer
from headforms.compute.bootstrap import RESAMPLES
from headforms.compute.rotary import DEFAULT_DISTANCES, PROFILE_COLUMNS, Rotation
from headforms.compute.statistics import PARITY_TOLERANCE, lobes
from headforms.extract import Checkpoint, ExtractError
from headforms.extract.hub import FetchError
from headforms.warehouse.store import WarehouseError, insert, query, transaction
from headforms.warehouse.summaries import write_summaries


def tool_version() -> str:
    try:
        return version("headforms")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True)
class LoadOptions:
    """Settings the stored numbers depend on, plus how to run."""

    parity_tolerance: float = PARITY_TOLERANCE
    seed: int = 0
    device: str = "cpu"
    force: bool = False
    resamples: int = RESAMPLES   # B of the bootstrap intervals, seeded by `seed`
    distances: tuple[int, ...] | None = None  # RoPE: deltas of distance_profiles; None: DEFAULT_DISTANCES

    def __post_init__(self):
        if self.resamples < 1:
            raise ValueError(f"resamples must be at least 1, not {self.resamples}")
        if self.distances is not None:
            distances = tuple(sorted(set(int(d) for d in self.distances)))
            if not distances or distances[0] < 0:
                raise ValueError(f"distances must be non-negative integers, at least one; got {self.distances!r}")
            object.__setattr__(self, "distances", distances)


@dataclass
class LoadResult:
    model: str
    status: str          # "extracted", "resumed", "replaced" or "up to date"
    layers: int          # layers written by this run
    heads: int           # heads written by this run
    seconds: float


# The columns a stored model's numbers depend on: a source that differs in any of them is another model.
IDENTITY = ("revision", "architecture", "n_layers", "n_heads", "n_kv_heads", "d_model", "head_dim", "qk_norm",
            "parity_tolerance", "baseline_seed", "fold_norm", "distances")
TABLES = ("heads", "eigenvalues", "fits", "distance_profiles", "layers")  # per-layer rows of a model


def load_model(con, ckpt: Checkpoint, opts: LoadOptions,
               on_layer: Callable[[int, int], None] | None = None) -> LoadResult:
    """Extract every missing layer of `ckpt` into the warehouse; on_layer(layer, heads) reports each layer written."""
    start = time.perf_counter()
    name, spec = ckpt.name, ckpt.spec
    deltas(spec, opts)  # refuses distances a RoPE model's conventions do not allow, before any write
    record = _model_record(ckpt, opts)
    old = query(con, f"SELECT {', '.join(IDENTITY)}, complete FROM models WHERE model = ?", [name])
    if old.height:
        prev = old.row(0, named=True)
        changed = [f"{key} {prev[key]} -> {record[key]}" for key in IDENTITY if prev[key] != record[key]]
        if changed and not opts.force:
            raise WarehouseError(f"model '{name}' in the warehouse differs from this source ({'; '.join(changed)}): "
                                 f"use --force to replace it, or --name to keep both")
        if opts.force:
            with transaction(con):
                _delete_model(con, name)
                _write_model(con, ckpt, opts, record, on_layer)
            _record_cost(con, ckpt)
            return LoadResult(name, "replaced", spec.n_layers, spec.n_layers * spec.n_heads,
                              time.perf_counter() - start)
        if prev["complete"]:
            return LoadResult(name, "up to date", 0, 0, time.perf_counter() - start)

    done = set(query(con, "SELECT layer FROM layers WHERE model = ?", [name])["layer"].to_list())
    created = not old.height
    if created:
        with transaction(con):
            insert(con, "models", pl.DataFrame([record]))
    todo = [layer for layer in range(spec.n_layers) if layer not in done]
    written: list[int] = []
    try:
        for layer in todo:
            with transaction(con):
                _write_layer(con, ckpt, opts, layer)
            written.append(layer)
            if on_layer:
                on_layer(layer, spec.n_heads)
        with transaction(con):
            con.execute("UPDATE models SET complete = true, extracted_at = ? WHERE model = ?",
                        [record["extracted_at"], name])
            write_summaries(con, name, opts.resamples, opts.seed)
    except FetchError:  # the network gave out: keep the committed layers, the same command resumes
        _record_cost(con, ckpt)
        raise
    except Exception:
        with transaction(con):  # undo this run only; an interruption (Ctrl-C, kill) keeps its layers
            if created:
                _delete_model(con, name)
            elif written:
                for table in TABLES:
                    con.execute(f"DELETE FROM {table} WHERE model = ? AND list_contains(?, layer)", [name, written])
        raise
    _record_cost(con, ckpt)
    status = "resumed" if done or not created else "extracted"
    return LoadResult(name, status, len(written), len(written) * spec.n_heads, time.perf_counter() - start)


def deltas(spec, opts: LoadOptions) -> tuple[int, ...] | None:
    """The distances of a model's distance_profiles: None without RoPE; by default DEFAULT_DISTANCES, or
    only 0 where its RoPE is refused beyond 0 (the reason is in models.config); asked-for ones are checked."""
    if spec.rope is None:
        return None
    if spec.rope.refusal is None:
        return opts.distances or DEFAULT_DISTANCES
    if opts.distances not in (None, (0,)):
        raise ExtractError(f"RoPE beyond distance 0 is not computed for this {spec.architecture} checkpoint: "
                           f"{spec.rope.refusal}; pass --distances 0")
    return (0,)
def _record_cost(con, ckpt: Checkpoint) -> None:
    """Add this run's hub bytes to the model's bytes_fetched (runs that resume add up)."""
    if ckpt.bytes_fetched is not None:
        with transaction(con):
            con.execute("UPDATE models SET bytes_fetched = coalesce(bytes_fetched, 0) + ? WHERE model = ?",
                        [ckpt.bytes_fetched, ckpt.name])


def _write_model(con, ckpt, opts, record, on_layer) -> None:
    """Every layer of a model, inside the caller's transaction."""
    insert(con, "models", pl.DataFrame([record | {"complete": True}]))
    for layer in range(ckpt.spec.n_layers):
        _write_layer(con, ckpt, opts, layer)
        if on_layer:
            on_layer(layer, ckpt.spec.n_heads)
    write_summaries(con, ckpt.name, opts.resamples, opts.seed)


def _delete_model(con, name: str) -> None:
    for table in (*TABLES, "intervals", "head_types", "models"):
        con.execute(f"DELETE FROM {table} WHERE model = ?", [name])


def _write_layer(con, ckpt: Checkpoint, opts: LoadOptions, layer: int) -> None:
    """Read, analyse and insert one layer with its progress row (the caller holds the transaction)."""
    t0 = time.perf_counter()
    wq, wk = ckpt.read_layer(layer)
    spec = ckpt.spec
    rotation = Rotation.of(spec.rope.pairing, spec.rope.frequencies) if spec.rope is not None else None
    analysis = analyse_layer(wq, wk, spec.kv_index, layer=layer, seed=opts.seed,
                             parity_tolerance=opts.parity_tolerance, device=opts.device,
                             rotation=rotation, deltas=deltas(spec, opts))
    del wq, wk
    for table, frame in layer_frames(ckpt.name, layer, spec.kv_index, spec.head_dim, analysis).items():
        insert(con, table, frame)
    insert(con, "layers", pl.DataFrame({
        "model": [ckpt.name], "layer": [layer], "heads": [spec.n_heads],
        "seconds": [time.perf_counter() - t0], "written_at": [datetime.now(timezone.utc).replace(tzinfo=None)],
    }))


def _model_record(ckpt: Checkpoint, opts: LoadOptions) -> dict:
    spec = ckpt.spec
    return {
        "model": ckpt.name, "source": ckpt.source, "revision": ckpt.revision,
        "architecture": spec.architecture, "positional_encoding": spec.positional,
        "n_layers": spec.n_layers, "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads,
        "d_model": spec.d_model, "head_dim": spec.head_dim, "score_scale": spec.score_scale,
        "qk_norm": spec.qk_norm, "fold_norm": spec.fold_norm,
        "distances": list(deltas(spec, opts)) if spec.rope is not None else None,
        "config": json.dumps(spec.config | ({"rope": spec.rope.describe()} if spec.rope else {}), default=str),
        "parity_tolerance": opts.parity_tolerance, "baseline_seed": opts.seed,
        "tool_version": tool_version(), "base_model": ckpt.base_model, "training_step": ckpt.training_step,
        "bytes_fetched": None, "checkpoint_bytes": ckpt.checkpoint_bytes,  # bytes_fetched: _record_cost
        "extracted_at": datetime.now(timezone.utc).replace(tzinfo=None), "complete": False,
    }


def _frame(columns: dict) -> pl.DataFrame:
    """A polars frame with NaN turned into NULL (an undefined statistic)."""
    frame = pl.DataFrame(columns)
    return frame.with_columns(pl.col(pl.Float64).fill_nan(None))


def layer_frames(model: str, layer: int, kv_index: np.ndarray, head_dim: int,
                 analysis: LayerAnalysis) -> dict[str, pl.DataFrame]:
    """The rows of heads, eigenvalues and fits for one analysed layer."""
    stats, sp = analysis.statistics, analysis.spectra
    n_heads = sp.n_heads
    heads = np.arange(n_heads)
    head_cols = {"model": model, "layer": layer, "head": heads, "kv_head": kv_index}
    head_cols.update({k: pl.Series(k, v, dtype=pl.Utf8) if k == "parity" else v for k, v in stats.items()})
    head_cols["balanced"] = (stats["n_pos"] == head_dim) & (stats["n_neg"] == head_dim)

    rank = min(head_dim, sp.eig_L.shape[1])
    plus, minus = lobes(sp.eig_S)
    spectra = {
        "S": sp.eig_S, "S_pos": _lobe(plus, stats["n_pos"]), "S_neg": _lobe(minus, stats["n_neg"]),
        "T_sv": sp.sv_T, "T_sigma": sp.sigma_T, "L": sp.eig_L[:, :rank], "L_sv": sp.sv_L[:, :rank],
    }
    parts = []
    for code, values in spectra.items():
        keep = ~np.isnan(values.real) if np.isrealobj(values) else np.ones(values.shape, bool)
        head_idx, idx = np.nonzero(keep)
        parts.append(pl.DataFrame({
            "head": head_idx.astype(np.int32), "spectrum": code, "idx": idx.astype(np.int32),
            "value": values.real[keep].astype(np.float64),
            "imag": values.imag[keep].astype(np.float64) if np.iscomplexobj(values) else 0.0,
        }))
    eigen = pl.concat(parts).with_columns(pl.lit(model).alias("model"), pl.lit(layer).alias("layer"))

    fit_parts = [
        _frame({"head": heads, "sample": sample, "family": family, **cols})
        for sample, families in analysis.fits.items() for family, cols in families.items()
    ]
    fits = pl.concat(fit_parts).with_columns(pl.lit(model).alias("model"), pl.lit(layer).alias("layer"),
                                             pl.col("n").cast(pl.Int32))
    frames = {"heads": _frame(head_cols), "eigenvalues": eigen, "fits": fits}
    if analysis.distances is not None:
        dist = analysis.distances
        frames["distance_profiles"] = _frame({
            "model": model, "layer": layer, "head": np.tile(heads, len(dist["delta"])),
            "delta": dist["delta"].ravel(),
            **{k: pl.Series(k, dist[k].ravel(), dtype=pl.Utf8) if k == "parity" else dist[k].ravel()
               for k in PROFILE_COLUMNS}})
    return frames


def _lobe(values: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The first `count` entries of each row (a lobe's nonzero eigenvalues), NaN after."""
    return np.where(np.arange(values.shape[1]) < count[:, None], values, np.nan)
