"""Per-model tables computed from a model's stored heads once its last layer is in:
bootstrap intervals of the views' figures (`intervals`), the head types of Figure 5 (`head_types`), and for a model
extracted with its output-value circuit the intervals of its copying scores by QK parity (`copying_intervals`)."""
from __future__ import annotations

import importlib
from typing import Callable

import numpy as np
import polars as pl

from headforms.compute import bootstrap
from headforms.compute.threads import Pool
from headforms.extract.checkpoint import WHOLE
from headforms.warehouse.storing.failures import stage
from headforms.warehouse.storing.store import insert, query

# (view, figure, aggregate, per-head SQL expression): each figure recomputed on a resample exactly as its
# view computes it. h is a row of heads, g of spectral_geometry, m of models. Percent figures count a
# head with undefined parity in the denominator only, as count(*) FILTER does.
FIGURES: tuple[tuple[str, str, str, str], ...] = (
    ("parity_by_model", "pct_type_I_plus", "percent", "coalesce(h.parity = 'I+', false)::INT"),
    ("parity_by_model", "pct_type_II", "percent", "coalesce(h.parity = 'II', false)::INT"),
    ("parity_by_model", "pct_type_I_minus", "percent", "coalesce(h.parity = 'I-', false)::INT"),
    *(("model_medians", f"median_{column}", "median", f"h.{column}") for column in (
        "symmetric_energy", "pairing", "rho", "lobe_departure", "participation_ratio", "stable_rank",
        "random_symmetric_energy", "random_pairing")),
    ("model_medians", "share_above_random", "mean", "(h.symmetric_energy > h.random_symmetric_energy)::INT"),
    ("model_medians", "share_above_baseline_mean", "mean", "(h.symmetric_energy > (m.d_model + 1) / (2.0 * m.d_model))::INT"),
    ("model_medians", "share_participation_below_2", "mean", "(h.participation_ratio < 2)::INT"),
    ("fit_ratios_by_model", "median_mode_ratio", "median", "CASE WHEN g.retained THEN g.mode_ratio END"),
    ("fit_ratios_by_model", "median_shape_ratio", "median", "CASE WHEN g.retained THEN g.shape_ratio END"),
    ("fit_ratios_by_model", "median_correlation", "median", "g.sigma_lambda_correlation"),
    ("fit_ratios_by_model", "median_geometric_mean_error", "median", "g.geometric_mean_error"),
    *(("theta_accumulation", f"median_{column}", "median", f"h.{column}") for column in (
        "theta_distance", "theta_position", "random_theta_distance", "random_theta_position")),
    ("theta_accumulation", "share_closer_to_theta", "mean", "(h.theta_distance < h.theta_position)::INT"),
    ("theta_accumulation", "random_share_closer_to_theta", "mean",
     "(h.random_theta_distance < h.random_theta_position)::INT"),
)
# Resampling methods: which rows are drawn together (statistics.md section 7).
METHODS = ("layer", "head")
# copying_intervals: the ov_heads columns whose median per QK parity type is resampled, and the types.
COPYING = ("copying_score", "residual_copying_score")
PARITIES = ("I+", "II", "I-")
CONTRAST = "I+ - I-"  # the difference of the I+ and I- medians, resampled together


def prepare() -> None:
    """Import the head types' k-means (scipy.cluster, a fifth of a second): a run calls this while its first layers
    compute, so that neither its start nor its last model's summaries wait for the import."""
    importlib.import_module("headforms.compute.head_types")


def write_summaries(con, model: str, resamples: int, seed: int) -> None:
    """Compute and insert the model's intervals, head types and copying intervals (inside the caller's transaction);
    a failure names its step (failures.stage), which models.failed_step records. The intervals' resampling runs on
    the pool while the head types are found in this thread."""
    parts = query(con, "SELECT DISTINCT part FROM heads WHERE model = ? ORDER BY part", [model])["part"].to_list()
    with Pool() as pool:
        with stage("summaries (intervals)", model):
            intervals = [later_intervals(con, pool, model, resamples, seed, part) for part in parts]
        with stage("summaries (head types)", model):
            types = pl.concat([model_head_types(con, model, seed, part) for part in parts])
        with stage("summaries (intervals)", model):
            insert(con, "intervals", pl.concat([collect() for collect in intervals]))
            copying = copying_intervals(con, model, resamples, seed)
            if copying.height:
                insert(con, "copying_intervals", copying)
    with stage("summaries (head types)", model):
        insert(con, "head_types", types)


def model_intervals(con, model: str, resamples: int, seed: int, part: str = WHOLE) -> pl.DataFrame:
    """95% bootstrap intervals of every figure of FIGURES for one model's heads of one form (heads.part), by both
    methods (rows of `intervals`)."""
    with Pool() as pool:
        return later_intervals(con, pool, model, resamples, seed, part)()


def later_intervals(con, pool: Pool, model: str, resamples: int, seed: int,
                    part: str = WHOLE) -> Callable[[], pl.DataFrame]:
    """`model_intervals`, its resampling started now on `pool` (a piece per method and aggregate, compute.threads)
    and the function returned collecting it."""
    columns = ", ".join(f"{expr} AS f{i}" for i, (_, _, _, expr) in enumerate(FIGURES))
    heads = query(con, f"""
        SELECT h.layer, {columns} FROM heads h JOIN models m USING (model)
        JOIN spectral_geometry g USING (model, layer, head, part)
        WHERE h.model = ? AND h.part = ? ORDER BY h.layer, h.head""", [model, part])
    values = heads.drop("layer").to_numpy().astype(float)
    layer = heads["layer"].to_numpy()
    groups = {"layer": np.stack([np.flatnonzero(layer == k) for k in np.unique(layer)]),
              "head": np.arange(len(layer))[:, None]}
    chosen = [(m, method, aggregate, [i for i, figure in enumerate(FIGURES) if figure[2] == aggregate])
              for m, method in enumerate(METHODS) for aggregate in bootstrap.AGGREGATES]
    pieces = [pool.submit(bootstrap.intervals, values[:, figures], aggregate, groups[method], resamples, (seed, m))
              for m, method, aggregate, figures in chosen]

    def collect() -> pl.DataFrame:
        """One frame of every piece's rows, in `chosen` order, NaN stored as NULL (built from lists and Series: a
        polars expression, such as a scalar broadcast to a column, costs a millisecond or more each)."""
        figures = [i for *_, piece_figures in chosen for i in piece_figures]
        rows = np.concatenate([piece.result() for piece in pieces])
        return pl.DataFrame([
            pl.Series("model", [model] * len(figures)), pl.Series("part", [part] * len(figures)),
            pl.Series("view", [FIGURES[i][0] for i in figures]),
            pl.Series("figure", [FIGURES[i][1] for i in figures]),
            pl.Series("method", [method for _, method, _, piece_figures in chosen for _ in piece_figures]),
            *(pl.Series(name, rows[:, k], nan_to_null=True) for k, name in enumerate(("estimate", "low", "high"))),
            pl.Series("resamples", [resamples] * len(figures)), pl.Series("seed", [seed] * len(figures))])

    return collect


def copying_intervals(con, model: str, resamples: int, seed: int) -> pl.DataFrame:
    """Rows of `copying_intervals`: per QK parity type, the median of each COPYING column over the type's heads with
    its 95% interval resampling layers, and the I+ minus I- difference over the same resamples; drawn with the seed
    (seed, 0) of intervals' method 'layer', so the same layers. Heads of undefined QK parity are in no type, NULL
    scores in no median. No rows for a model without ov_heads rows."""
    rows = query(con, f"""
        SELECT o.layer, h.parity, {", ".join(f"o.{c}" for c in COPYING)}
        FROM ov_heads o JOIN heads h USING (model, layer, head)
        WHERE o.model = ? AND h.part = 'whole' ORDER BY o.layer, o.head""", [model])
    if not rows.height:
        return pl.DataFrame()
    values = rows.select(COPYING).to_numpy().astype(float)  # NULL as NaN, as bootstrap.median ignores it
    types, layer = rows["parity"].to_numpy(), rows["layer"].to_numpy()
    groups = np.stack([np.flatnonzero(layer == k) for k in np.unique(layer)])
    seeded = (seed, METHODS.index("layer"))
    masked = np.concatenate([np.where((types == p)[:, None], values, np.nan) for p in PARITIES], axis=1)
    typed = bootstrap.intervals(masked, "median", groups, resamples, seeded)
    plus, minus = (masked[:, i * len(COPYING):(i + 1) * len(COPYING)] for i in (0, 2))
    estimate = bootstrap.median(plus.T) - bootstrap.median(minus.T)
    if len(groups) < 2:  # one layer cannot vary between resamples, as bootstrap.intervals says
        low = high = np.full(len(COPYING), np.nan)
    else:
        drawn = bootstrap.resample_rows(groups, resamples, np.random.default_rng(seeded))  # the same resamples
        low, high = bootstrap.bounds(np.stack([
            bootstrap.median(plus[:, f][drawn]) - bootstrap.median(minus[:, f][drawn]) for f in range(len(COPYING))]))
    return pl.DataFrame({
        "model": model, "parity": [p for p in (*PARITIES, CONTRAST) for _ in COPYING],
        "figure": [f"median_{c}" for _ in range(len(PARITIES) + 1) for c in COPYING],
        "estimate": np.concatenate([typed[:, 0], estimate]), "low": np.concatenate([typed[:, 1], low]),
        "high": np.concatenate([typed[:, 2], high]), "resamples": resamples, "seed": seed,
    }).with_columns(pl.col(pl.Float64).fill_nan(None))


def model_head_types(con, model: str, seed: int, part: str = WHOLE) -> pl.DataFrame:
    """Figure 5 coordinates, k-means type and silhouette of each head with a nonzero S (rows of `head_types`), the
    heads of one form (heads.part) together: a latent-attention head's two parts are spectra of different sizes."""
    from headforms.compute.head_types import DIMENSIONS, head_types, projection, unit_spectra

    spectra = query(con, """
        SELECT layer, head, list(value ORDER BY idx) AS eig FROM eigenvalues
        WHERE model = ? AND part = ? AND spectrum = 'S' GROUP BY layer, head ORDER BY layer, head""", [model, part])
    points = unit_spectra(np.array(spectra["eig"].to_list(), dtype=float))
    keep = ~np.isnan(points).any(axis=1)
    found = projection(points[keep])
    types, scores = head_types(found, seed)
    coords = np.zeros((len(found), DIMENSIONS))  # fewer than three heads lie in fewer directions: 0 on the others
    coords[:, :found.shape[1]] = found
    return pl.DataFrame({
        "model": model, "layer": spectra["layer"].filter(keep), "head": spectra["head"].filter(keep), "part": part,
        "x": coords[:, 0], "y": coords[:, 1], "z": coords[:, 2],
        "type": types.astype(np.int32), "silhouette": scores})
