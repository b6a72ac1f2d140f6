"""Export the warehouse for the paper: every view of sql/ as CSV and Parquet (or the paper's tables as
booktabs LaTeX), the figures as PNG, and an index.csv saying which paper table or figure each file is (and
why a figure or table is not written); with paper_format, also the survey files of the paper's published
code in their own format."""
from __future__ import annotations

import csv
import re
from pathlib import Path

import duckdb
import polars as pl
from great_tables import GT

from headforms.warehouse.publishing import figures, numbers
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
                                  "self-logit with c_sym - d_sym, symmetric energy and pairing, and of its self, "
                                  "previous-token and induction scores with its copying scores"),
    "ov_circuit_parity": (
        "circuit_parity", "The output-value circuit beside the query-key form: per model, heads by QK parity and "
                          "OV parity (counts and shares)"),
    "ov_copying_by_parity": (
        "copying_by_parity", "The output-value circuit: per model and QK parity type, the median copying score and "
                             "residual copying score with 95% layer-bootstrap intervals, the share of heads that "
                             "copy, and I+ minus I-"),
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
FORMATS = ("csv", "parquet", "latex")  # what a table may be written as; csv and parquet unless told
NOT_WRITTEN = "not written: "  # how index.csv's description begins for a figure or table left out, then why

# LaTeX: every table of TABLES but these as booktabs LaTeX (great_tables), <stem>.tex each, and LATEX_ALL
# \input-ing them all; numbers with the significant digits their column needs (numbers.significant_digits).
LATEX_ALL = "tables.tex"
LATEX_LEFT_OUT = {
    "spectral_geometry": "one row per head, data rather than a table to print (its CSV and Parquet hold it)",
    "paper_reference": "the paper's own figures, printed beside headforms' in paper_comparison",
}
# Per table, columns printed as one "value [low, high]" (no value: "[low, high]"): (label, value, low, high).
LATEX_INTERVALS: dict[str, list[tuple[str, str | None, str, str]]] = {
    "bootstrap_intervals": [("estimate [layer interval]", "estimate", "layer_low", "layer_high"),
                            ("head interval", None, "head_low", "head_high")],
    "observations7to9_survey_ranges": [("range", None, "low", "high")],
    "behaviour_by_parity": [(f"median_{score} [interval]", f"median_{score}", f"{score}_low", f"{score}_high")
                            for score in ("self_score", "previous_score", "induction_score", "self_logit")],
    "ov_copying_by_parity": [(f"median_{score} [interval]", f"median_{score}", f"{score}_low", f"{score}_high")
                             for score in ("copying_score", "residual_copying_score")],
}
# Per table, the columns whose rows are one quantity each (a column's digits are chosen within them).
LATEX_DIGITS_BY = {"bootstrap_intervals": ["view", "figure"], "paper_comparison": ["figure"],
                   "observations7to9_survey_ranges": ["statistic"]}
# Columns LaTeX leaves out: bootstrap_intervals' interval as text (the columns above print it), paper_comparison's
# published text (its number is the paper column, with the digits it needs).
LATEX_DROPPED = {"bootstrap_intervals": ["shown"], "paper_comparison": ["published"]}
LATEX_LONG = 40  # rows above which a table is a longtable (it may run over pages) rather than a float
LATEX_PACKAGES = "booktabs,caption,longtable,array,graphicx,lscape"  # what the .tex files need in a preamble
# A longtable cannot be scaled to the page as a float is: its columns wrap instead, in widths shared as a browser
# lays out an automatic table, in a font small enough (down to LATEX_SMALLEST pt, else on a landscape page) that
# no unbreakable piece of a cell overruns its column, on the article class's text width and height (LATEX_PAGE pt)
# with a character taken as LATEX_CHARACTER of the font's size (a Computer Modern digit is 0.5 of it at 10 pt, 0.58 at 6).
LATEX_PAGE, LATEX_CHARACTER, LATEX_SMALLEST, LATEX_COLUMN_SEP, LATEX_WRAP = (345, 550), 0.62, 6, 2, 30
LATEX_HEADER = rf"""% The paper's tables as `headforms export --format latex` writes them: \input this file or one.
% Preamble: \usepackage{{{LATEX_PACKAGES}}}. From another folder, say where these files are first:
% \newcommand{{\headformsdir}}{{export/}}\input{{export/tables.tex}}
\providecommand{{\headformsdir}}{{}}
"""


def export(con: duckdb.DuckDBPyConnection, out_dir: Path, paper_format: bool = False,
           formats: tuple[str, ...] = ("csv", "parquet")) -> list[Path]:
    """Write TABLES in `formats` (of FORMATS), the figures (PNG) whose data the warehouse holds, with paper_format
    the PAPER_FORMAT files, and index.csv into out_dir; returns the written paths."""
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ValueError(f"unknown export format {', '.join(unknown)}: choose from {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    writable_folder(out_dir)
    written, index, inputs = [], [], []
    for stem, (view, what) in TABLES.items():
        if "csv" in formats:
            with stage(f"export ({stem}.csv)"):
                con.sql(_csv_select(con, view)).write_csv(str(out_dir / f"{stem}.csv"), header=True)
            written.append(out_dir / f"{stem}.csv")
            index.append((f"{stem}.csv", "table (CSV)", view, what))
        if "parquet" in formats:
            with stage(f"export ({stem}.parquet)"):
                con.sql(f"SELECT * FROM {view}").write_parquet(str(out_dir / f"{stem}.parquet"))
            written.append(out_dir / f"{stem}.parquet")
            index.append((f"{stem}.parquet", "table (Parquet)", view, what))
        if "latex" in formats:
            with stage(f"export ({stem}.tex)"):
                why = LATEX_LEFT_OUT.get(stem) or latex_empty(con, view)
                if not why:
                    (out_dir / f"{stem}.tex").write_text(latex_table(con, stem), encoding="utf-8")
            if why:
                index.append((f"{stem}.tex", "table (LaTeX)", view, f"{NOT_WRITTEN}{why}. {what}"))
            else:
                written.append(out_dir / f"{stem}.tex")
                inputs.append(stem)
                index.append((f"{stem}.tex", "table (LaTeX)", view, what))
    if "latex" in formats:
        (out_dir / LATEX_ALL).write_text(LATEX_HEADER + "".join(f"\\input{{\\headformsdir {stem}}}\n"
                                                                for stem in inputs), encoding="utf-8")
        written.append(out_dir / LATEX_ALL)
        index.append((LATEX_ALL, "tables (LaTeX)", "", "Inputs every table's .tex file above; its header names "
                                                        "the packages they need"))
    with stage("export (figures)"):
        drawn = figures.draw_all(con, out_dir)
        absent = figures.missing(con)
    for name, (draw, what) in figures.FIGURES.items():
        source = f"warehouse.figures.{draw.__name__}"
        if name in absent:
            index.append((name, "figure (PNG)", source, f"{NOT_WRITTEN}{absent[name]}. {what}"))
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


def latex_empty(con: duckdb.DuckDBPyConnection, view: str) -> str:
    """Why a view is not printed as LaTeX ('' when it has rows)."""
    return "" if con.sql(f"SELECT count(*) FROM {view}").fetchall()[0][0] else "no rows in this warehouse"


def latex_table(con: duckdb.DuckDBPyConnection, stem: str) -> str:
    """One table of TABLES as a booktabs LaTeX fragment (a float, or a longtable past LATEX_LONG rows), titled with
    what it is: numbers with the fewest significant digits (3 or more) that keep a column's distinct values (within
    LATEX_DIGITS_BY's rows of one quantity) and a value and its interval's ends distinct; intervals in brackets beside
    their value (a per-model figure's from its layer bootstrap, where the warehouse has one); lists joined, NULL as
    an empty cell."""
    view, what = TABLES[stem]
    frame = con.sql(f"SELECT * FROM {view}").pl().drop(LATEX_DROPPED.get(stem, []))
    frame, bootstrapped = _layer_intervals(con, view, frame)
    specs = LATEX_INTERVALS.get(stem, []) + bootstrapped
    merged = {column: spec for spec in specs for column in spec[1:] if column}
    by = LATEX_DIGITS_BY.get(stem)
    groups = [rows.to_list() for rows in (frame.with_row_index().group_by(by, maintain_order=True).agg("index")
                                           ["index"] if by else [pl.Series(range(frame.height))])]
    cells, right = {}, []
    for column, kind in frame.schema.items():
        if column in merged or kind.is_float() or kind.is_decimal():
            label, value, low, high = merged.get(column, (column, column, None, None))
            if column != (value or low):
                continue  # printed with the first column of its interval
            parts = [frame[c].cast(pl.Float64).to_list() if c else [None] * frame.height for c in (value, low, high)]
            cells[label] = [numbers.interval(*row) for row in zip(*parts, _digits(parts, groups))]
            right.append(label)
        elif kind.is_integer():
            cells[column] = ["" if v is None else str(v) for v in frame[column]]
            right.append(column)
        elif kind == pl.Boolean:
            cells[column] = ["" if v is None else "yes" if v else "no" for v in frame[column]]
        elif isinstance(kind, pl.List):
            cells[column] = ["" if v is None else LIST_SEPARATOR.join(map(str, v)) for v in frame[column]]
        else:
            cells[column] = ["" if v is None else str(v) for v in frame[column]]
    table = pl.DataFrame(cells, schema={label: pl.Utf8 for label in cells})
    note = f"headforms view {view}" + "; in brackets the 95% bootstrap interval resampling layers" * bool(bootstrapped)
    long = frame.height > LATEX_LONG
    gt = (GT(table).tab_header(title=what).tab_source_note(note).cols_align("right", columns=right)
          .tab_options(table_font_size="8pt" if long else "10pt"))
    return _fit_page(gt.as_latex(use_longtable=long), table, right)


def _fit_page(latex: str, table: pl.DataFrame, right: list[str]) -> str:
    """great_tables' LaTeX made to fit the text width: a float's tabular scaled down to it when wider (never up);
    a longtable's columns as paragraph columns (right-aligned where numbers are) in the widths and font of
    _longtable_layout, names and values free to break after an underscore."""
    if "\\begin{longtable}" not in latex:
        latex = re.sub(r"\\begin\{tabular\*\}\{\\linewidth\}\{@\{\\extracolsep\{\\fill\}\}([^}]*)\}",
                       lambda m: "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{"
                                 f"\\begin{{tabular}}{{{m[1]}}}", latex, count=1)
        return latex.replace("\\end{tabular*}", "\\end{tabular}}", 1)
    size, widths, landscape = _longtable_layout([[name, *table[name].to_list()] for name in table.columns])
    share = f"\\dimexpr(\\linewidth-{2 * len(widths)}\\tabcolsep)"
    columns = "".join(f">{{\\{'raggedleft' if name in right else 'raggedright'}\\arraybackslash}}"
                      f"p{{{share}*{round(1000 * width)}/1000\\relax}}"
                      for name, width in zip(table.columns, widths))
    latex = re.sub(r"\\begin\{longtable\}\{[^}]*\}", lambda _: f"\\begin{{longtable}}{{{columns}}}", latex, count=1)
    latex = re.sub(r"\\fontsize\{[^}]*\}\{[^}]*\}\\selectfont", lambda _: f"\\fontsize{{{size:.1f}pt}}"
                   f"{{{1.2 * size:.1f}pt}}\\selectfont\\setlength{{\\tabcolsep}}{{{LATEX_COLUMN_SEP}pt}}", latex, count=1)
    latex = latex.replace("\\end{longtable}\n\\begin{minipage}", "\\end{longtable}\n\\noindent\\begin{minipage}")
    if landscape:
        latex = f"\\begin{{landscape}}\n{latex.strip()}\n\\end{{landscape}}\n"
    return latex.replace("\\_", "\\_\\allowbreak{}")


def _longtable_layout(columns: list[list[str]]) -> tuple[float, list[float], bool]:
    """A longtable's font size (pt, 8 at most), the share of a line each column (its header and cells) gets, and
    whether it goes on a landscape page: all a column needs when every column fits, else the columns needing
    no more than an equal share of what is left keep their need and the others get their longest unbreakable
    piece (between spaces, hyphens and escaped underscores) and the rest in proportion to their need; the font is made small enough
    that a line holds every column at its need or, wrapped, LATEX_WRAP characters (on a landscape page where a
    portrait one would need less than LATEX_SMALLEST pt)."""
    need = [max(len(cell) for cell in cells) for cells in columns]
    piece = [max(len(p) for cell in cells for p in re.split(r"[ _-]", cell)) for cells in columns]
    wanted = sum(min(n, max(p, LATEX_WRAP)) for n, p in zip(need, piece))
    for landscape, width in enumerate(LATEX_PAGE):
        room = width - 2 * LATEX_COLUMN_SEP * len(columns)
        size = min(8.0, room / (LATEX_CHARACTER * wanted))
        if size >= LATEX_SMALLEST:
            break
    size = max(size, LATEX_SMALLEST)
    line = room / (LATEX_CHARACTER * size)
    widths, wrapped = list(need), set(range(len(need)))
    while wrapped:  # the columns that fit an equal share of what is left keep their need
        share = (line - sum(widths[i] for i in range(len(need)) if i not in wrapped)) / len(wrapped)
        fitting = {i for i in wrapped if need[i] <= share}
        if not fitting:
            break
        wrapped -= fitting
    left = line - sum(widths[i] for i in range(len(need)) if i not in wrapped) - sum(piece[i] for i in wrapped)
    more = sum(need[i] - piece[i] for i in wrapped)
    for i in wrapped:  # the others their piece and a part of the rest in proportion to what more they need
        widths[i] = piece[i] + (max(left, 0) * (need[i] - piece[i]) / more if more else 0)
    return size, [w / max(line, sum(widths)) for w in widths], bool(landscape)


def _digits(parts: list[list[float | None]], groups: list[list[int]]) -> list[int]:
    """Per row, the numbers.significant_digits of its group's (value, low, high) columns."""
    digits = [numbers.AT_LEAST] * len(parts[0])
    for rows in groups:
        chosen = [[part[i] for i in rows] for part in parts]
        needed = numbers.significant_digits([c for c in chosen if any(v is not None for v in c)])
        for i in rows:
            digits[i] = needed
    return digits


def _layer_intervals(con: duckdb.DuckDBPyConnection, view: str, frame: pl.DataFrame):
    """The frame with, for each per-model figure model_intervals holds of this view, its layer-bootstrap interval's
    ends as <figure>_layer_low and <figure>_layer_high (matched by model and part); and the (label, value, low,
    high) to print them by."""
    found = con.sql("SELECT model, part, figure, layer_low, layer_high FROM model_intervals WHERE view = $view "
                    "AND layer_low IS NOT NULL", params={"view": view}).pl()
    if not found.height or not {"model", "part"} <= set(frame.columns):
        return frame, []
    wide = found.pivot(on="figure", index=["model", "part"], values=["layer_low", "layer_high"], separator="|")
    wide = wide.rename({c: f"{c.split('|')[1]}_{c.split('|')[0]}" for c in wide.columns if "|" in c})
    figures_ = [c for c in frame.columns if f"{c}_layer_low" in wide.columns]
    return (frame.join(wide, on=["model", "part"], how="left", maintain_order="left"),
            [(c, c, f"{c}_layer_low", f"{c}_layer_high") for c in figures_])


def _csv_select(con: duckdb.DuckDBPyConnection, view: str) -> str:
    """SELECT of a view with its list columns joined into strings, which CSV cannot hold as lists."""
    relation = con.sql(f"SELECT * FROM {view}")
    lists = [name for name, kind in zip(relation.columns, relation.types) if kind.id == "list"]
    if not lists:
        return f"SELECT * FROM {view}"
    joined = ", ".join(f"array_to_string({name}, '{LIST_SEPARATOR}') AS {name}" for name in lists)
    return f"SELECT * REPLACE ({joined}) FROM {view}"
