"""One layer's rows: the unit of work every executor runs (`layer_rows`: read, analyse, tabulate), with the
settings the stored numbers depend on (`AnalysisOptions`) and how a run runs (`LoadOptions`). No warehouse access
here: the writer (load.py) commits."""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import numpy as np
import pyarrow as pa

from headforms.compute import copying
from headforms.compute import threads
from headforms.compute.analysis import LayerAnalysis, start_layer
from headforms.compute.bootstrap import RESAMPLES
from headforms.compute.reduction import device_problem
from headforms.compute.rotary import DEFAULT_DISTANCES, PROFILE_COLUMNS, Rotation
from headforms.compute.statistics import PARITY_TOLERANCE, lobes
from headforms.compute.threads import Pool
from headforms.extract import Checkpoint, ExtractError
from headforms.extract.checkpoint import WHOLE
from headforms.warehouse.storing.failures import stage


@dataclass(frozen=True)
class AnalysisOptions:
    """What a model's stored numbers depend on beside its checkpoint: the tolerance, seed and distances are part of
    the model's identity (models.parity_tolerance, baseline_seed, distances: load.IDENTITY), and each interval
    records its resamples."""

    parity_tolerance: float = PARITY_TOLERANCE
    seed: int = 0                # the random baseline's, and the bootstrap's
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


@dataclass(frozen=True)
class LoadOptions:
    """How a run runs, which its numbers do not depend on (the device, whether to replace a model that differs),
    beside the analysis they do."""

    analysis: AnalysisOptions = AnalysisOptions()
    device: str = "cpu"
    force: bool = False

    def __post_init__(self):
        if problem := device_problem(self.device):
            raise ExtractError(problem)


@dataclass
class LayerRows:
    """One analysed layer: its rows for every table as Arrow tables (the `layers` progress row last)."""

    layer: int
    heads: int
    tables: dict[str, pa.Table]
    bytes_fetched: int = 0  # checkpoint bytes read for it (a hub source's ranged reads)


def deltas(spec, analysis: AnalysisOptions) -> tuple[int, ...] | None:
    """The distances of a model's distance_profiles: None without RoPE; by default DEFAULT_DISTANCES, or
    only 0 where its RoPE is refused beyond 0 (the reason is in models.config); asked-for ones are checked."""
    if spec.rope is None:
        return None
    if spec.rope.refusal is None:
        return analysis.distances or DEFAULT_DISTANCES
    if analysis.distances not in (None, (0,)):
        raise ExtractError(f"RoPE beyond distance 0 is not computed for this {spec.architecture} checkpoint: "
                           f"{spec.rope.refusal}; pass distances=(0,)")
    return (0,)


@dataclass
class Weights:
    """One layer's maps as read (float64): Q/K, and V/O when the output-value circuit is asked for, with the
    seconds and the network bytes the read took."""

    qk: dict[str, tuple[np.ndarray, np.ndarray]]  # part (spec.forms) -> (W_Q (H, n, width), W_K (Hkv, n, width))
    seconds: float
    bytes_fetched: int
    ov: tuple[np.ndarray, np.ndarray] | None = None  # (W_V (Hkv, n, N), W_O (H, N, n))
    sinks: np.ndarray | None = None  # (H,) each head's sink logit (gpt-oss), else None


def read_weights(ckpt: Checkpoint, layer: int) -> Weights:
    """Read one layer's maps: the first half of `layer_rows`, which an executor may run ahead in its own
    thread (a layer is read while the one before it is analysed)."""
    t0, fetched = time.perf_counter(), ckpt.bytes_fetched or 0
    with stage("read", ckpt.name, layer):
        circuits = ckpt.read_circuits(layer)
    qk = circuits["qk"] if ckpt.spec.parts else {WHOLE: circuits["qk"]}
    return Weights(qk, time.perf_counter() - t0, (ckpt.bytes_fetched or 0) - fetched, circuits.get("ov"),
                   circuits.get("sinks"))


_GRAMS: dict[int, tuple[weakref.ref, np.ndarray | None]] = {}


def unembedding_gram(ckpt: Checkpoint, pool: Pool) -> np.ndarray | None:
    """The checkpoint's W_E^T W_U, formed on `pool` once per checkpoint object in this process (None: it has no
    unembedding) from its embeddings read by blocks of vocabulary rows; the copying scores of every layer use it."""
    ref, gram = _GRAMS.get(id(ckpt), (None, None))
    if ref is None or ref() is not ckpt:
        gram = copying.unembedding_gram(_embedding_blocks(ckpt), pool.submit) if ckpt.unembedding else None
        _GRAMS.clear()  # one model at a time: an executor's worker moves on to the next model's layers
        _GRAMS[id(ckpt)] = (weakref.ref(ckpt), gram)
    return gram


def _embedding_blocks(ckpt: Checkpoint):
    """The checkpoint's embedding blocks, a failure to read one labelled the embeddings' read (the products between
    them keep their compute stage)."""
    with stage("read", ckpt.name, "embeddings"):
        yield from ckpt.embedding_blocks()


def layer_rows(ckpt: Checkpoint, opts: LoadOptions, layer: int, weights: Weights | None = None) -> LayerRows:
    """Read (unless `weights` were read already) and analyse one layer into its rows, the `layers` progress row
    included; no warehouse access. The unit of work of every executor (this process, worker processes, Ray
    tasks)."""
    weights = weights or read_weights(ckpt, layer)
    with Pool() as pool:
        return start_rows(ckpt, opts, layer, weights, pool)()


def start_rows(ckpt: Checkpoint, opts: LoadOptions, layer: int, weights: Weights, pool: Pool) -> Callable[[], LayerRows]:
    """`layer_rows` of weights already read: the layer's linear algebra started on `pool` now, and the function
    returned collecting it into the rows (so a caller can start the next layer first). That function keeps the
    read's figures, not the maps: those are freed once the pieces are done, for the layers read next to reuse."""
    t0, read_seconds, fetched, sinks = time.perf_counter(), weights.seconds, weights.bytes_fetched, weights.sinks
    spec, analysis = ckpt.spec, opts.analysis
    rotation = Rotation.of(spec.rope.pairing, spec.rope.frequencies_of(layer)) if spec.rope is not None else None
    with stage("compute", ckpt.name, layer):
        # each form of the heads (spec.forms: one, or a latent-attention head's parts) analysed on its own; maps
        # given in a smaller span than N (extract.layouts.latent) count their ambient zeros and baseline in N
        later = {form.name: start_layer(
            pool, *weights.qk[form.name], np.asarray(form.kv_index), layer=layer, seed=analysis.seed,
            parity_tolerance=analysis.parity_tolerance, device=opts.device, rotation=rotation if form.rotary else None,
            deltas=deltas(spec, analysis), ambient=spec.d_model if weights.qk[form.name][0].shape[2] != spec.d_model
            else None) for form in spec.forms}
        ov_later = None
        if weights.ov is not None:
            # OV_h = W_O[h] W_V[g] is analysed as its transpose W_V[g]^T W_O[h]^T, the L of "queries" W_O[h]^T and
            # the shared "key" W_V[g]: the same spectra and statistics, and a group's heads share W_V's QR
            w_v, w_o = weights.ov
            ov_later = start_layer(pool, w_o.transpose(0, 2, 1), w_v, spec.kv_index, layer=layer, seed=analysis.seed,
                                   parity_tolerance=analysis.parity_tolerance, device=opts.device)
            copying_later = copying.start_copying_scores(pool.submit, w_v, w_o, spec.kv_index,
                                                         unembedding_gram(ckpt, pool), threads.WORKERS)

    def collect() -> LayerRows:
        with stage("compute", ckpt.name, layer):
            forms = [layer_tables(ckpt.name, layer, np.asarray(form.kv_index), form.head_dim,
                                  later[form.name](), form.name) for form in spec.forms]
            tables = {table: pa.concat_tables([form[table] for form in forms if table in form])
                      for table in dict.fromkeys(table for form in forms for table in form)}
            if sinks is not None:  # a head's, so its whole form's row (a latent family has none)
                tables["heads"] = tables["heads"].append_column("sink_logit", pa.array(sinks, pa.float64()))
            if ov_later is not None:
                ov = layer_tables(ckpt.name, layer, spec.kv_index, spec.head_dim, ov_later(), None)
                scores = copying_later()
                ov["heads"] = ov["heads"].append_column("copying_score", pa.array(scores[0], from_pandas=True)) \
                    .append_column("residual_copying_score", pa.array(scores[1], from_pandas=True))
                tables |= {f"ov_{table}": rows for table, rows in ov.items()}
        tables["layers"] = pa.table({
            "model": [ckpt.name], "layer": [layer], "heads": [spec.n_heads],
            "seconds": [read_seconds + time.perf_counter() - t0],
            "written_at": [datetime.now(timezone.utc).replace(tzinfo=None)],
        })
        return LayerRows(layer, spec.n_heads, tables, fetched)

    return collect


def _table(columns: dict, rows: int) -> pa.Table:
    """An Arrow table from whole columns: a scalar is repeated (a string dictionary-encoded, one value
    stored once), integers are 32-bit as in the tables, a float's NaN becomes NULL (an undefined statistic), and
    an object column of names and None is typed string (NULL where None; all-None columns too)."""
    arrays = {}
    for name, value in columns.items():
        if isinstance(value, pa.Array):
            arrays[name] = value
        elif isinstance(value, str):
            arrays[name] = _repeat([value], [rows])
        else:
            value = np.asarray(value)
            value = np.broadcast_to(value, (rows,)) if value.ndim == 0 else value
            value = value.astype(np.int32) if value.dtype.kind in "iu" else value  # the tables' INTEGER
            arrays[name] = pa.array(value, pa.string() if value.dtype.kind == "O" else None,
                                    from_pandas=value.dtype.kind == "f")
    return pa.table(arrays)


def layer_tables(model: str, layer: int, kv_index: np.ndarray, head_dim: int,
                 analysis: LayerAnalysis, part: str | None = WHOLE) -> dict[str, pa.Table]:
    """The rows of heads, eigenvalues, fits (and distance_profiles) for one analysed layer, as Arrow
    tables built from whole numpy columns (no per-row work, no intermediate frames); every row of the heads'
    form `part` (None: the ov tables, which have no part)."""
    stats, sp = analysis.statistics, analysis.spectra
    n_heads = sp.n_heads
    heads = np.arange(n_heads)
    key = {"model": model, "layer": layer} | ({} if part is None else {"part": part})
    head_cols = key | {"head": heads, "kv_head": kv_index}
    head_cols.update({k: pa.array(v, pa.string()) if k == "parity" else v for k, v in stats.items()})
    head_cols["balanced"] = (stats["n_pos"] == head_dim) & (stats["n_neg"] == head_dim)

    rank = min(head_dim, sp.eig_L.shape[1])
    plus, minus = lobes(sp.eig_S)
    spectra = {
        "S": sp.eig_S, "S_pos": _lobe(plus, stats["n_pos"]), "S_neg": _lobe(minus, stats["n_neg"]),
        "T_sv": sp.sv_T, "T_sigma": sp.sigma_T, "L": sp.eig_L[:, :rank], "L_sv": sp.sv_L[:, :rank],
    }
    parts = []
    for values in spectra.values():
        keep = ~np.isnan(values.real)  # lobes are NaN-padded; complex spectra are never NaN
        head_idx, idx = np.nonzero(keep)
        parts.append((head_idx, idx, values.real[keep], values.imag[keep] if np.iscomplexobj(values)
                      else np.zeros(len(idx))))
    head_idx, idx, value, imag = (np.concatenate(column) for column in zip(*parts))
    eigen = _table(key | {
        "head": head_idx.astype(np.int32),
        "spectrum": _repeat(list(spectra), [len(p[0]) for p in parts]), "idx": idx.astype(np.int32),
        "value": value.astype(np.float64), "imag": imag.astype(np.float64)}, len(idx))

    combos = [(sample, family, cols) for sample, families in analysis.fits.items() for family, cols in families.items()]
    fits = _table(key | {
        "head": np.tile(heads, len(combos)),
        "sample": _repeat([sample for sample, _, _ in combos], [n_heads] * len(combos)),
        "family": _repeat([family for _, family, _ in combos], [n_heads] * len(combos)),
        **{column: np.concatenate([cols[column] for _, _, cols in combos]) for column in combos[0][2]},
    }, n_heads * len(combos))
    tables = {"heads": _table(head_cols, n_heads), "eigenvalues": eigen, "fits": fits}
    if analysis.distances is not None:
        dist = analysis.distances
        tables["distance_profiles"] = _table(key | {
            "head": np.tile(heads, len(dist["delta"])),
            "delta": dist["delta"].ravel(),
            **{k: pa.array(dist[k].ravel(), pa.string()) if k == "parity" else dist[k].ravel()
               for k in PROFILE_COLUMNS}}, dist["delta"].size)
    return tables


def _repeat(labels: list[str], counts: list[int]) -> pa.DictionaryArray:
    """labels[0] counts[0] times, then labels[1] counts[1] times, ...: a dictionary-encoded string column."""
    codes = np.repeat(np.arange(len(labels), dtype=np.int32), counts)
    return pa.DictionaryArray.from_arrays(codes, pa.array(labels, pa.string()))


def _lobe(values: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The first `count` entries of each row (a lobe's nonzero eigenvalues), NaN after."""
    return np.where(np.arange(values.shape[1]) < count[:, None], values, np.nan)
