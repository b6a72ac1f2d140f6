"""Export the warehouse for the paper: every view of sql/ as CSV and Parquet, the figures as PNG,
and an index.csv saying which paper table or figure each file is; with paper_format, also the
survey files of the paper's published code in their own format."""
from __future__ import annotations

import csv
from pathlib import Path

import duckdb
import polars as pl

from headforms.warehouse.publishing import figures
from headforms.warehouse.storing.failures import stage, writable_folder

# Output file stem -> (view of sql/, what it is in the paper). Each table is written as .csv and .parquet.
TABLES: dict[str, tuple[str, str]] = {
    "observation1_signature_check": (
        "signature_check", "Observation 1: heads, balanced heads (n positive, n negative eigenvalues of S) "
                           "and the exceptions, per model"),
    "table2_parity": (
        "parity_by_model", "Table 2: percent of each model's heads of parity type I+, II, I-"),
    "table2_parity_sensitivity": (
        "parity_sensitivity", "Table 2 at Type II tolerances 0.01, 0.02, 0.03, 0.05, 0.10"),
    "figure12_parity_by_layer": (
        "parity_by_layer", "Figure 12: percent of each layer's heads of parity type I+, II, I-"),
    "model_medians": (
        "model_medians", "Per model: medians of symmetric energy (Figure 13), pairing (Figures 11, 14), rho, lobe "
                         "departure, participation ratio, stable rank; shares above the random baseline"),
    "spectral_geometry": (
        "spectral_geometry", "Per head: gamma-fit modes mu, nu, tau and shapes k_plus, k_minus, k_T, mode and "
                             "shape ratios, sigma-lambda correlation, geometric-mean error"),
    "observations7to9_fit_ratios_by_model": (
        "fit_ratios_by_model", "Observations 7-9 per model: median mode ratio, shape ratio (retained heads), "
                               "sigma-lambda correlation; retained and excluded heads"),
    "observations7to9_survey_ranges": (
        "survey_ranges", "Observations 7-9: min and max across models of the per-model medians"),
    "parity_by_distance": (
        "parity_by_distance", "RoPE models: percent of heads by parity type, median pairing and symmetric "
                              "energy of L_delta at each relative distance delta"),
    "figure6_fit_errors": (
        "fit_errors_by_model", "Figure 6: median histogram error and KS per model, sample and family; "
                               "share of heads where each family fits best by histogram error, "
                               "log-likelihood, AIC, BIC"),
    "bootstrap_intervals": (
        "model_intervals", "Every per-model figure of the tables above beside its 95% bootstrap intervals, "
                           "resampling layers and resampling heads"),
    "observation2_theta_accumulation": (
        "theta_accumulation", "Observation 2 per model: medians of the distance to Theta and of the position along "
                              "it, trained and random heads; share of heads closer to Theta than to the midpoint"),
    "figure05_head_types": (
        "head_types_by_model", "Figure 5 per model: k-means types of the projected spectra of S, mean silhouette, "
                               "adjusted Rand index with parity"),
    "paper_reference": (
        "paper_reference", "The paper's published figures (Table 2, section 3.1's model shapes, the survey-wide "
                           "ranges), as printed, with their section"),
    "paper_comparison": (
        "paper_comparison", "The paper beside its reproduction: per model and figure, the paper's value, "
                            "headforms' value and the difference"),
    "training_dynamics": (
        "dynamics_by_step", "Training dynamics: per training checkpoint, parity shares and the medians of pairing "
                            "and symmetric energy with their random baselines"),
    "nested_fit_tests": (
        "nested_fit_tests", "Likelihood-ratio tests at 1%: share of heads where the generalized gamma "
                            "improves on gamma, Weibull and lognormal (its interior point q = 0), per model "
                            "and sample ('ok' fits)"),
    "behaviour_by_parity": (
        "behaviour_by_parity", "Behaviour beside form: per model and parity type, the median self, previous-token and "
                               "induction scores and self-logit with 95% layer-bootstrap intervals, and I+ minus I-"),
    "behaviour_correlations": (
        "behaviour_correlations", "Behaviour beside form: Spearman correlations of each head's self-score and "
                                  "self-logit with c_sym - d_sym, symmetric energy and pairing"),
}
# Paper-format file -> (view of sql/, row order after the model): the survey files of the paper's
# published code (aodesky/attention-bilinear-forms, scripts/survey_results/), same names, columns and
# conventions, models in the paper's order, written as pandas' to_csv writes them, into PAPER_FOLDER
# (spectral_geometry.csv would otherwise meet the view's own export).
PAPER_FOLDER = "survey_results"
_COMPONENT_ORDER = "list_position(['full', 'S_positive', 'S_negative', 'T'], component)"
PAPER_FORMAT: dict[str, tuple[str, str]] = {
    "head_statistics.csv": ("paper_head_statistics", "layer, head"),
    "spectral_geometry.csv": ("paper_spectral_geometry", "layer, head"),
    "gamma_goodness_of_fit.csv": ("paper_gamma_goodness_of_fit", f"{_COMPONENT_ORDER}, head_index, family"),
    "gamma_goodness_of_fit_summary.csv": ("paper_gamma_goodness_of_fit_summary", _COMPONENT_ORDER),
}
LIST_SEPARATOR = "; "


def export(con: duckdb.DuckDBPyConnection, out_dir: Path, paper_format: bool = False) -> list[Path]:
    """Write TABLES (CSV and Parquet), the figures (PNG), with paper_format the PAPER_FORMAT files, and
    index.csv into out_dir; returns the written paths."""
    out_dir = Path(out_dir)
    writable_folder(out_dir)
    written, index = [], []
    for stem, (view, what) in TABLES.items():
        csv, parquet = out_dir / f"{stem}.csv", out_dir / f"{stem}.parquet"
        with stage(f"export ({stem})"):
            con.sql(_csv_select(con, view)).write_csv(str(csv), header=True)
            con.sql(f"SELECT * FROM {view}").write_parquet(str(parquet))
        written += [csv, parquet]
        index += [(csv.name, "table (CSV)", view, what), (parquet.name, "table (Parquet)", view, what)]
    with stage("export (figures)"):
        drawn = figures.draw_all(con, out_dir)
    for path in drawn:
        written.append(path)
        index.append((path.name, "figure (PNG)", f"warehouse.figures.{figures.FIGURES[path.name][0].__name__}",
                      figures.FIGURES[path.name][1]))
    if paper_format:
        writable_folder(out_dir / PAPER_FOLDER)
        for name, (view, _) in PAPER_FORMAT.items():
            with stage(f"export ({PAPER_FOLDER}/{name})"):
                written.append(write_paper_format(con, name, out_dir / PAPER_FOLDER / name))
            index.append((f"{PAPER_FOLDER}/{name}", "paper-format table (CSV)", view,
                          f"The published survey file {name} of the paper's code, same columns and conventions"))
    index_path = out_dir / "index.csv"
    pl.DataFrame(index, schema=["file", "kind", "source", "description"], orient="row").write_csv(index_path)
    return written + [index_path]


def write_paper_format(con: duckdb.DuckDBPyConnection, name: str, path: Path) -> Path:
    """One PAPER_FORMAT file as pandas' to_csv(index=False) writes it: floats by repr, NULL as an empty
    field, booleans True/False; models in the paper set's order, then any others by name."""
    from headforms.extract import MODEL_SETS

    view, order = PAPER_FORMAT[name]
    paper_models = [model for model, _ in MODEL_SETS["paper"]]
    relation = con.execute(f"SELECT * FROM {view} ORDER BY coalesce(list_position($models, model), "
                           f"len($models) + 1), model, {order}", {"models": paper_models})
    columns = [d[0] for d in relation.description]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(relation.fetchall())
    return path


def _csv_select(con: duckdb.DuckDBPyConnection, view: str) -> str:
    """SELECT of a view with its list columns joined into strings, which CSV cannot hold as lists."""
    relation = con.sql(f"SELECT * FROM {view}")
    lists = [name for name, kind in zip(relation.columns, relation.types) if kind.id == "list"]
    if not lists:
        return f"SELECT * FROM {view}"
    joined = ", ".join(f"array_to_string({name}, '{LIST_SEPARATOR}') AS {name}" for name in lists)
    return f"SELECT * REPLACE ({joined}) FROM {view}"
