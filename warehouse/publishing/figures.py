"""The paper's figures as PNG files, drawn from the warehouse's views and tables.

One function per figure, each `(con, path) -> path`, with one panel per model. Figures are
built on matplotlib's object API (no pyplot, no display) and rendered by the Agg backend.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import duckdb
import matplotlib
import numpy as np
import polars as pl
from matplotlib.colors import CenteredNorm
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import text_to_path

from headforms.extract.checkpoint import WHOLE
from headforms.warehouse.publishing import numbers
from headforms.warehouse.storing.store import VIEWS

SQRT3_2 = np.sqrt(3) / 2
DPI = 150
# Parity type -> (marker, colour, label), the paper's markers: + Type I+, o Type II, - Type I-.
PARITY = {
    "I+": ("+", "tab:red", r"Type $\mathrm{I}_{+}$"),
    "II": ("o", "tab:green", r"Type $\mathrm{II}$"),
    "I-": ("_", "tab:blue", r"Type $\mathrm{I}_{-}$"),
}
PARITY_COLUMNS = ["pct_type_I_plus", "pct_type_II", "pct_type_I_minus"]  # PARITY's types as view columns
# A table of per-head rows -> how a figure's title names its circuit (ov_heads: statistics.md "The output-value
# circuit").
CIRCUIT = {"heads": "", "ov_heads": " of the output-value circuits $OV = W_O W_V$"}


def _frame(con: duckdb.DuckDBPyConnection, sql: str) -> pl.DataFrame:
    return con.sql(sql).pl()


def panel_name(model: str, part: str | None = WHOLE) -> str:
    """A panel's name: its model, and the part after it for a latent-attention head's part (heads.part)."""
    return model if part in (WHOLE, None) else f"{model} ({part})"


def _by_model(frame: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    """(panel name, rows) in the frame's order: a panel per model and, where the frame has a `part` column, per
    part of a model whose heads have parts (panel_name), so that two parts never share a panel."""
    keys = ["model", "part"] if "part" in frame.columns else ["model"]
    return [(panel_name(*key), rows) for key, rows in frame.group_by(keys, maintain_order=True)]


def _rows_of(table: str) -> str:
    """`table` as a FROM item with heads' part column: ov_heads has none, its rows belong to 'whole' heads."""
    return table if table == "heads" else f"(SELECT *, '{WHOLE}' AS part FROM {table}) AS {table}"


# Layout: every figure is laid out by constrained layout; titles are wrapped to the width they may take and
# legends sit beside or above the panels, so that text stays on the canvas for one model as for twenty.
MARGIN = 0.3  # inches of a panel's width taken by its axis labels and ticks, not available to its title
GUIDE = "_nolegend_"  # the label of a guide line (simplex edges, a diagonal): matplotlib leaves it out of legends


def _figure(width: float, height: float) -> Figure:
    """An empty figure of width x height inches, laid out by constrained layout when drawn."""
    return Figure(figsize=(width, height), layout="constrained", dpi=DPI)


def _panel_grid(n: int, ncols: int, panel: tuple[float, float]) -> tuple[Figure, list]:
    """A figure with n panels on a grid of at most ncols columns; unused cells are hidden."""
    cols = min(max(n, 1), ncols)  # no model to draw: one empty panel's canvas for the title
    rows = max(-(-n // cols), 1)
    fig = _figure(panel[0] * cols, panel[1] * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, list(axes[:n])


def _inches(text: str, fontsize: float) -> float:
    """Width of the widest line of `text` (mathtext included) at `fontsize`, in inches."""
    font = FontProperties(size=fontsize)
    return max(text_to_path.get_text_width_height_descent(line, font, ismath=line.count("$") >= 2)[0]
               for line in text.split("\n")) / 72


def _wrap(text: str, inches: float, fontsize: float) -> str:
    """`text` with each line broken at spaces (never inside $...$) to fit `inches` at `fontsize`; a word
    wider than that (a long model name) stays whole on its own line."""
    lines = []
    for paragraph in text.split("\n"):
        words: list[str] = []
        for token in paragraph.split(" "):  # a space inside $...$ joins its neighbours
            if words and words[-1].count("$") % 2:
                words[-1] += " " + token
            else:
                words.append(token)
        line = words[0]
        for word in words[1:]:
            if _inches(f"{line} {word}", fontsize) <= inches:
                line = f"{line} {word}"
            else:
                lines.append(line)
                line = word
        lines.append(line)
    return "\n".join(lines)


def _suptitle(fig: Figure, text: str, fontsize: float) -> None:
    """The figure's title, wrapped to its width."""
    fig.suptitle(_wrap(text, fig.get_figwidth() - MARGIN, fontsize), fontsize=fontsize)


def _title(ax, text: str, inches: float, fontsize: float, **kwargs) -> None:
    """A panel's title, wrapped to the `inches` its panel is wide less its axis labels on either side."""
    ax.set_title(_wrap(text, inches - 2 * MARGIN, fontsize), fontsize=fontsize, **kwargs)


def _legend_outside(fig: Figure, axes: list, fontsize: float) -> None:
    """One legend for every panel (their labelled artists, each label once), right of the panels, halfway down:
    constrained layout narrows the panels to make room (at the top it would cover the figure's title)."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(entries.values(), entries.keys(), loc="outside right center", fontsize=fontsize, frameon=False)


def _legend_beside(ax, fontsize: float) -> None:
    """A panel's own legend (its counts differ per model), right of the panel: constrained layout makes room."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, fontsize=fontsize, frameon=False,
              handletextpad=0.3)


def _number(value: float | None) -> str:
    """A figure's value in a title, to 3 significant digits, or 'undefined' where it is NULL (e.g. the Rand index
    of one head)."""
    return "undefined" if value is None else numbers.shown([value], numbers.AT_LEAST)[0]


def _interval(value: float | None, low: float | None, high: float | None) -> str:
    """'value [low, high]' in a title: 3 significant digits, more where fewer would print two that differ alike."""
    if value is None:
        return "undefined"
    return numbers.interval(value, low, high, numbers.significant_digits([[value], [low], [high]]))


def _save(fig: Figure, path: Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=DPI)
    return path


def profiles(con: duckdb.DuckDBPyConnection, path: Path, table: str = "heads") -> Path:
    """Figure 9: each head's symmetric profile (b_S, c_S, d_S) on the face Delta, marked by parity type; of the
    rows of `table` (ov_heads: the output-value circuit's, see ov_profiles)."""
    data = _frame(con, f"""
        SELECT model, part, parity, c_sym + b_sym / 2 AS x, b_sym * sqrt(3) / 2 AS y
        FROM {_rows_of(table)} WHERE parity IS NOT NULL ORDER BY model, part, layer, head""")
    models = _by_model(data)
    fig, axes = _panel_grid(len(models), 3, (5.0, 4.9))
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, SQRT3_2]])  # d = 1, c = 1, b = 1
    for ax, (model, rows) in zip(axes, models):
        ax.plot(*corners[[1, 2, 0]].T, color="black", lw=1, label=GUIDE)  # edges {d = 0} and {c = 0}
        ax.plot(*corners[[0, 1]].T, color="black", lw=1, ls="--", label=GUIDE)  # edge {b = 0}: empty fibers
        _parity_scatter(ax, rows, "x", "y", s=28, lw=1.0)
        ax.annotate("$b=1$\n" r"$\lambda_{+}=\lambda_{-}$", corners[2], xytext=(0, 6), textcoords="offset points",
                    ha="center", va="bottom", fontsize=9)
        ax.annotate("$c=1$\nPSD", corners[1], xytext=(4, -4), textcoords="offset points", ha="left", va="top", fontsize=9)
        ax.annotate("$d=1$\nNSD", corners[0], xytext=(-4, -4), textcoords="offset points", ha="right", va="top", fontsize=9)
        ax.text(0.86, 0.5, "$d=0$: $S=H+P$", rotation=-60, ha="center", va="center", fontsize=8, color="0.3")
        ax.text(0.14, 0.5, "$c=0$: $S=H-P$", rotation=60, ha="center", va="center", fontsize=8, color="0.3")
        _title(ax, f"{model} ({rows.height} heads)", 5.0, 10)
        ax.set_xlim(-0.22, 1.22)
        ax.set_ylim(-0.14, 1.08)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.legend(loc="upper left", fontsize=8, frameon=False, handletextpad=0.3)
    _suptitle(fig, f"Profiles of the symmetric parts{CIRCUIT[table]} on $\\Delta$\n"
                   "($H$: spectrum symmetric about zero, $P$: positive semidefinite)", 11)
    return _save(fig, path)


def ov_profiles(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Figure 9 of the output-value circuit: each head's OV profile on Delta (ov_heads), by OV parity."""
    return profiles(con, path, "ov_heads")


def view_over(view: str, table: str) -> str:
    """The SELECT of a view of sql/ reading `table` in place of heads (ov_heads has heads' columns): the same
    figures of the output-value circuit (part 'whole': _rows_of)."""
    text = (VIEWS / f"{view}.sql").read_text()
    assert text.count("FROM heads\n") == 1, view  # the view reads heads once, by that name
    return text.replace("FROM heads\n", f"FROM {_rows_of(table)}\n")


def parity_by_layer(con: duckdb.DuckDBPyConnection, path: Path, table: str = "heads") -> Path:
    """Figure 12: percent of each layer's heads of each parity type (view parity_by_layer), white 0% to black 100%;
    of the rows of `table` (ov_heads: the view's query over the output-value circuit's rows)."""
    source = "parity_by_layer" if table == "heads" else f"({view_over('parity_by_layer', table)})"
    data = _frame(con, f"SELECT * FROM {source} ORDER BY model, part, layer")
    models = _by_model(data)
    columns = PARITY_COLUMNS
    widest = max(rows.height for _, rows in models)
    fig = _figure(min(2.5 + 0.32 * widest, 16), 1.0 + 1.45 * len(models))
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    for ax, (model, rows) in zip(axes, models):
        grid = rows.select(columns).to_numpy().T      # types x layers
        image = ax.imshow(grid, cmap="Greys", vmin=0, vmax=100, aspect="auto")
        for (i, j), value in np.ndenumerate(grid):     # cell labels: a few dozen cells per model
            ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=6,
                    color="white" if value > 55 else "black")
        ax.set_yticks(range(3), [label for _, _, label in PARITY.values()], fontsize=8)
        ax.set_xticks(range(rows.height), rows["layer"].to_list(), fontsize=7)
        ax.set_xlabel("layer", fontsize=8)
        _title(ax, f"{model} ({rows['heads'].sum()} heads)", fig.get_figwidth() - 0.5, 9, loc="left")
    fig.colorbar(image, ax=list(axes), label="% of the layer's heads", shrink=0.95, pad=0.01)
    _suptitle(fig, f"Parity by layer{CIRCUIT[table]} " r"(Type II: $c_S + d_S \leq 1/50$)", 11)
    return _save(fig, path)


def ov_parity_by_layer(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Figure 12 of the output-value circuit: percent of each layer's heads by OV parity type (ov_heads)."""
    return parity_by_layer(con, path, "ov_heads")


def _trained_vs_random(con: duckdb.DuckDBPyConnection, path: Path, column: str, random_column: str,
                       label: str, title: str, *, table: str = "heads", centre: float = 0.5,
                       halfrange: float | None = None,
                       sides: tuple[str, str] = ("trained heads", "random baseline")) -> Path:
    """A layers x heads heat map of `column` beside `random_column` (its random baseline), per model, colours centred
    at `centre` (over the largest deviation unless `halfrange`); the panels named by `sides`, a panel whose
    column is NULL at every head of its model says so."""
    data = _frame(con, f"""
        SELECT model, part, layer, head, {column} AS trained, {random_column} AS random
        FROM {_rows_of(table)} ORDER BY model, part, layer, head""")
    models = _by_model(data)
    if halfrange is None:
        halfrange = np.nanmax(np.abs(data.select("trained", "random").to_numpy(allow_copy=True).astype(float)
                                     - centre))
    norm = CenteredNorm(vcenter=centre, halfrange=halfrange)
    layers = [rows["layer"].max() + 1 for _, rows in models]
    heads = max(rows["head"].max() + 1 for _, rows in models)
    panel = max(1.1 + 0.21 * heads, max(_inches(model, 8) for model, _ in models) + 3 * MARGIN)  # a name fits
    fig = _figure(2 * panel, 2.2 + 0.21 * sum(layers) + 0.8 * len(models))
    axes = fig.subplots(len(models), 2, squeeze=False, gridspec_kw={"height_ratios": layers})
    for (left, right), (model, rows), n_layers in zip(axes, models, layers):
        n_heads = rows["head"].max() + 1
        layer, head = rows["layer"].to_numpy(), rows["head"].to_numpy()
        for ax, side, name in ((left, "trained", sides[0]), (right, "random", sides[1])):
            grid = np.full((n_layers, n_heads), np.nan)
            grid[layer, head] = rows[side].cast(pl.Float64).fill_null(np.nan).to_numpy()
            image = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="auto")  # the panel fills its cell
            _title(ax, f"{model}: {name}" + (" (NULL at every head)" if np.isnan(grid).all() else ""), panel, 8)
            step = max(1, n_layers // 10)
            ax.set_yticks(range(0, n_layers, step))
            ax.set_xticks(range(0, n_heads, max(1, n_heads // 12)))
            ax.tick_params(labelsize=7)
            ax.set_xlabel("head", fontsize=8)
            ax.set_ylabel("layer", fontsize=8)
    bar = fig.colorbar(image, ax=axes.ravel().tolist(), location="top", shrink=0.8, aspect=30)
    bar.set_label(label, fontsize=8)
    bar.ax.tick_params(labelsize=7)
    _suptitle(fig, title, 10)
    return _save(fig, path)


def symmetric_energy(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Figure 13: symmetric energy ||S||^2/||L||^2 of every head beside its Gaussian baseline."""
    return _trained_vs_random(con, path, "symmetric_energy", "random_symmetric_energy",
                              r"symmetric energy $\|S\|^2/\|L\|^2$",
                              "Symmetric energy at each head: trained (left), random $K^TQ$ (right)\n"
                              "white at 1/2, red above, blue below; random baseline mean $(N+1)/(2N)$")


def pairing(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Figure 14: pairing score 1 - ||lambda_+ - lambda_-||/||S|| of every head beside its Gaussian baseline."""
    return _trained_vs_random(con, path, "pairing", "random_pairing",
                              r"pairing $1-\|\lambda_{+}-\lambda_{-}\|/\|S\|$",
                              "Pairing score at each head: trained (left), random $K^TQ$ (right)\n"
                              "white at 1/2, red above, blue below; 1 = spectrum of $S$ symmetric about zero")


def copying_scores(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """The output-value circuit: each head's copying score (of W_U OV W_E^T) beside its residual copying score (of OV
    alone), layers x heads, white at 0, red copying, blue suppressing (ov_heads)."""
    return _trained_vs_random(con, path, "copying_score", "residual_copying_score",
                              r"$\sum\lambda / \sum|\lambda|$ over the nonzero eigenvalues",
                              "Copying scores at each head: of the full circuit $W_U\\,OV\\,W_E^T$ (left; NULL without "
                              "an unembedding), of $OV = W_O W_V$ alone (right)\n"
                              "white at 0, red: the head copies what it attends to, blue: it suppresses it",
                              table="ov_heads", centre=0.0, halfrange=1.0,
                              sides=("copying score", "residual copying score"))


def mean_spectrum(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Figure 3: per model, the index-wise mean over heads of the sorted, unit-length eigenvalues of S."""
    data = _frame(con, """
        WITH unit AS (
            SELECT model, part, layer, head,
                   value / nullif(sqrt(sum(value * value) OVER (PARTITION BY model, part, layer, head)), 0) AS u
            FROM eigenvalues WHERE spectrum = 'S'
        ), ranked AS (
            SELECT model, part, u, row_number() OVER (PARTITION BY model, part, layer, head ORDER BY u DESC) - 1 AS rank
            FROM unit WHERE u IS NOT NULL
        )
        SELECT model, part, rank, avg(u) AS mean_u, count(*) AS heads FROM ranked
        GROUP BY model, part, rank ORDER BY model, part, rank""")
    models = _by_model(data)
    fig, axes = _panel_grid(len(models), 2, (6.0, 3.4))
    for ax, (model, rows) in zip(axes, models):
        mean_u = rows["mean_u"].to_numpy()
        ax.bar(rows["rank"].to_numpy(), mean_u, width=1.0, color=np.where(mean_u >= 0, "tab:red", "tab:blue"))
        ax.axhline(0, color="black", lw=0.6)
        _title(ax, f"{model} (mean of {rows['heads'].max()} heads, {rows.height} eigenvalues each)", 6.0, 9)
        ax.set_xlabel("index $i$ (eigenvalues in decreasing order)", fontsize=8)
        ax.set_ylabel(r"mean $\lambda_i(S)/\|\lambda(S)\|$", fontsize=8)
        ax.set_xlim(-1, rows.height)
        ax.tick_params(labelsize=7)
    _suptitle(fig, "The mean eigenvalue distribution of symmetric parts (sorted, unit-length spectra)", 10)
    return _save(fig, path)


def pairing_distribution(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Figure 11: histogram of the trained heads' pairing scores per model, dashed at the model median."""
    data = _frame(con, """
        SELECT h.model, h.part, h.pairing, m.median_pairing
        FROM heads h JOIN model_medians m USING (model, part)
        WHERE h.pairing IS NOT NULL ORDER BY h.model, h.part""")
    models = _by_model(data)
    fig = _figure(6.5, 0.8 + 1.5 * max(len(models), 1))
    axes = fig.subplots(max(len(models), 1), 1, squeeze=False, sharex=True)[:, 0]  # no pairing at all: one empty panel
    bins = np.linspace(0, 1, 51)
    for ax, (model, rows) in zip(axes, models):
        median = rows["median_pairing"][0]
        ax.hist(rows["pairing"].to_numpy(), bins=bins, color="tab:gray", edgecolor="white", lw=0.4)
        ax.axvline(median, color="black", ls="--", lw=1.2)
        ax.text(median, 0.95, f" median {_number(median)}", transform=ax.get_xaxis_transform(),
                ha="left", va="top", fontsize=8, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
        _title(ax, f"{model} ({rows.height} heads)", 6.5, 9, loc="left")
        ax.set_ylabel("heads", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[-1].set_xlabel(r"pairing score $\mathscr{P}=1-\|\lambda_{+}-\lambda_{-}\|/\|S\|$", fontsize=9)
    axes[-1].set_xlim(0, 1)
    _suptitle(fig, "Distribution of the trained-head pairing scores (dashed: model medians)", 10)
    return _save(fig, path)


def _parity_scatter(ax, rows: pl.DataFrame, *columns: str, s: float = 22, lw: float = 0.9) -> None:
    """Scatter of rows' columns (x, y[, z]) with the paper's parity markers, the count of each type in the legend."""
    for kind, (marker, colour, label) in PARITY.items():
        pts = rows.filter(pl.col("parity") == kind)
        paint = {"facecolors": "none", "edgecolors": colour} if marker == "o" else {"color": colour}
        ax.scatter(*(pts[c].to_numpy() for c in columns), marker=marker, s=s, lw=lw, label=f"{label} ({pts.height})",
                   **paint)


def theta_accumulation(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Observation 2: each head's distance to Theta against its position along Theta, trained beside random heads."""
    data = _frame(con, """
        SELECT model, part, parity, theta_distance, theta_position, random_theta_distance, random_theta_position
        FROM heads WHERE theta_distance IS NOT NULL ORDER BY model, part, layer, head""")
    shown = {(panel_name(model, part), figure): _interval(estimate, low, high)
             for model, part, figure, estimate, low, high in _frame(
                 con, "SELECT model, part, figure, estimate, layer_low, layer_high FROM model_intervals "
                      "WHERE view = 'theta_accumulation'").iter_rows()}
    models = _by_model(data)
    fig, axes = _panel_grid(max(len(models), 1), 2, (6.6, 4.6))  # 5 inches of plot, its legend beside
    for ax, (model, rows) in zip(axes, models):
        ax.scatter(rows["random_theta_position"], rows["random_theta_distance"], s=10, color="0.55", marker=".",
                   label=f"random baseline ({rows.height})")
        _parity_scatter(ax, rows, "theta_position", "theta_distance")
        values = rows.select(pl.exclude("model", "part", "parity")).to_numpy()
        bottom, top = values[values > 0].min() / 2, values.max() * 2
        ax.plot([bottom, top], [bottom, top], color="black", lw=0.8, ls="--", label=GUIDE)
        ax.text(top / 1.5, top / 1.9, "distance = position", ha="right", va="top", rotation=45, fontsize=7,
                rotation_mode="anchor", transform_rotates_text=True)
        _title(ax, f"{model} ({rows.height} heads)\nmedian distance {shown.get((model, 'median_theta_distance'))}, "
                   f"position {shown.get((model, 'median_theta_position'))}\nshare below the diagonal "
                   f"{shown.get((model, 'share_closer_to_theta'))}", 5.0, 8)
        ax.set_xlabel(r"theta_position: distance of the nearest point of $\Theta$ from $(1/2, 1/2, 0, 0)$",
                      fontsize=7)
        ax.set_ylabel(r"theta_distance: distance of the profile to $\Theta$", fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(bottom, top)
        ax.set_ylim(bottom, top)
        ax.set_aspect("equal")
        ax.tick_params(labelsize=7)
        _legend_beside(ax, 7)
    _suptitle(fig, "Profiles near $\\Theta=\\{a=b,\\ cd=0\\}$: trained heads (parity markers) and "
                   "random heads (grey)\nbelow the dashed diagonal a head lies closer to $\\Theta$ than its foot "
                   "point lies to the random midpoint\nmedians with 95% layer-bootstrap intervals; log axes (zeros "
                   "not drawn)", 9)
    return _save(fig, path)


def head_types(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Figure 5: the three-dimensional projection of the sorted unit-length spectra of S, k-means types and parity."""
    data = _frame(con, """
        SELECT t.model, t.part, t.x, t.y, t.z, t.type, h.parity, v.k, v.silhouette AS mean_silhouette, v.ari_parity
        FROM head_types t JOIN heads h USING (model, layer, head, part) JOIN head_types_by_model v USING (model, part)
        ORDER BY t.model, t.part, t.layer, t.head""")
    models = _by_model(data)
    fig = _figure(10.4, 4.8 * len(models))
    colours = matplotlib.colormaps["Dark2"].colors
    for row, (model, rows) in enumerate(models):
        left = fig.add_subplot(len(models), 2, 2 * row + 1, projection="3d")
        right = fig.add_subplot(len(models), 2, 2 * row + 2, projection="3d")
        _parity_scatter(left, rows, "x", "y", "z")
        for kind in range(rows["k"][0]):
            pts = rows.filter(pl.col("type") == kind)
            right.scatter(pts["x"], pts["y"], pts["z"], s=14, color=colours[kind % len(colours)],
                          label=f"type {kind} ({pts.height})")
        for ax, what in ((left, "parity"), (right, f"k-means types (k = {rows['k'][0]} by silhouette, "
                                                    f"mean {_number(rows['mean_silhouette'][0])})\n"
                                                    f"adjusted Rand index with parity {_number(rows['ari_parity'][0])}")):
            _title(ax, f"{model}: {what}", 5.2, 9)
            ax.set_xlabel("1st", fontsize=7)
            ax.set_ylabel("2nd", fontsize=7)
            ax.set_zlabel("3rd", fontsize=7)
            ax.tick_params(labelsize=6)
            ax.legend(loc="upper left", fontsize=7, frameon=False)
    _suptitle(fig, "Sorted unit-length spectra of $S$ projected on their three leading singular directions",
              10)
    return _save(fig, path)


def parity_by_distance(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """RoPE models: percent of heads of each parity type (view parity_by_distance) and median pairing
    of L_delta against the relative distance delta (0, then a log scale)."""
    data = _frame(con, "SELECT * FROM parity_by_distance ORDER BY model, part, delta")
    models = _by_model(data)
    fig, axes = _panel_grid(len(models), 2, (5.2, 3.4))
    columns = {"I+": "pct_type_I_plus", "II": "pct_type_II", "I-": "pct_type_I_minus"}
    for ax, (model, rows) in zip(axes, models):
        delta = rows["delta"].to_numpy()
        for kind, column in columns.items():
            marker, colour, label = PARITY[kind]
            ax.plot(delta, rows[column].to_numpy(), marker=marker, color=colour, label=label, lw=1.2, ms=6)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_ylim(0, 100)
        ax.set_xlabel(r"relative distance $\delta = i - j$", fontsize=8)
        ax.set_ylabel("% of heads", fontsize=8)
        ax.tick_params(labelsize=7)
        twin = ax.twinx()
        twin.plot(delta, rows["median_pairing"].to_numpy(), color="black", ls="--", lw=1, label="median pairing")
        twin.set_ylim(0, 1)
        twin.set_ylabel("median pairing", fontsize=8)
        twin.tick_params(labelsize=7)
        _title(ax, f"{model} ({rows['heads'][0]} heads)", 5.2, 9, loc="left")
    _legend_outside(fig, fig.axes, 8)
    _suptitle(fig, r"Parity of $L_\delta = W_K^T R(\delta) W_Q$ by relative distance (RoPE models)", 10)
    return _save(fig, path)


def training_dynamics(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Per base model, against the training step (view dynamics_by_step): parity shares, median pairing
    and median symmetric energy, the random baseline's medians dashed."""
    data = _frame(con, "SELECT * FROM dynamics_by_step ORDER BY base_model, part, training_step")
    models = _by_model(data.rename({"model": "checkpoint", "base_model": "model"}))
    fig, axes = _panel_grid(3 * len(models), 3, (4.6, 3.2))
    panels = [("pct", "% of heads", None), ("median_pairing", r"median pairing $\mathscr{P}$", "median_random_pairing"),
              ("median_symmetric_energy", r"median symmetric energy $\|S\|^2/\|L\|^2$",
               "median_random_symmetric_energy")]
    for row, (model, rows) in enumerate(models):
        step = rows["training_step"].to_numpy()
        for ax, (column, label, random_column) in zip(axes[3 * row:3 * row + 3], panels):
            if column == "pct":
                for (marker, colour, type_label), share in zip(PARITY.values(), PARITY_COLUMNS):
                    ax.plot(step, rows[share].to_numpy(), marker=marker, color=colour, label=type_label,
                            mfc="none", lw=1.2)
                ax.set_ylim(0, 100)
            else:
                ax.plot(step, rows[column].to_numpy(), marker="o", ms=3, color="black", lw=1.2, label="trained")
                ax.plot(step, rows[random_column].to_numpy(), color="0.5", ls="--", lw=1.0, label="random baseline")
            ax.set_xscale("symlog", linthresh=1)
            ax.set_xlim(0, max(step.max(), 1) * 1.3)
            ax.set_xlabel("training step", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
        _title(axes[3 * row], f"{model} ({rows.height} checkpoints, {rows['heads'][0]} heads each)", 3 * 4.6, 9,
               loc="left")
    _legend_outside(fig, axes, 8)
    _suptitle(fig, "Training dynamics against the training step:\n"
                   "parity shares, median pairing, median symmetric energy", 10)
    return _save(fig, path)


# File name -> (drawing function, what the figure shows); export writes these and lists them in its index.
FIGURES: dict[str, tuple[Callable[[duckdb.DuckDBPyConnection, Path], Path], str]] = {
    "figure03_mean_spectrum.png": (
        mean_spectrum, "Figure 3: mean sorted unit-length spectrum of S per model"),
    "figure05_head_types.png": (
        head_types, "Figure 5: 3-D projection of the sorted unit-length spectra of S, by parity and by k-means type"),
    "parity_by_distance.png": (
        parity_by_distance, "RoPE models: parity types and median pairing of L_delta by relative distance"),
    "observation2_theta.png": (
        theta_accumulation, "Observation 2: distance of each profile to Theta against its position along Theta, "
                            "trained and random heads"),
    "figure09_profiles.png": (
        profiles, "Figure 9: symmetric profiles (b_S, c_S, d_S) on the face Delta, by parity"),
    "figure11_pairing.png": (
        pairing_distribution, "Figure 11: distribution of trained-head pairing scores, model medians dashed"),
    "figure12_parity_by_layer.png": (
        parity_by_layer, "Figure 12: percent of each layer's heads by parity type"),
    "figure13_symmetric_energy.png": (
        symmetric_energy, "Figure 13: symmetric energy per layer and head, trained vs random baseline"),
    "figure14_pairing.png": (
        pairing, "Figure 14: pairing score per layer and head, trained vs random baseline"),
    "ov_figure09_profiles.png": (
        ov_profiles, "Figure 9 of the output-value circuits OV = W_O W_V: symmetric profiles on Delta, by OV parity "
                     "(ov_heads)"),
    "ov_figure12_parity_by_layer.png": (
        ov_parity_by_layer, "Figure 12 of the output-value circuits: percent of each layer's heads by OV parity type "
                            "(ov_heads)"),
    "ov_copying_scores.png": (
        copying_scores, "Copying scores per layer and head: of the full circuit W_U OV W_E^T and of OV alone "
                        "(ov_heads, copying_by_parity)"),
    "training_dynamics.png": (
        training_dynamics, "Training dynamics: parity shares, median pairing and symmetric energy against the "
                           "training step, per base model (view dynamics_by_step)"),
}


def draw_all(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Every figure of FIGURES whose data the warehouse holds (see missing) as a PNG in out_dir; returns their
    paths. The others are not written: no empty placeholder images."""
    absent = missing(con)
    return [draw(con, Path(out_dir) / name) for name, (draw, _) in FIGURES.items() if name not in absent]


def behaviour_self_score(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """Behaviour beside form (statistics.md section 8): each head's self-attention score against its form's
    c_sym - d_sym, by parity; per model (and part of a latent-attention model's heads, a panel each) the I+ minus I-
    difference of medians with its layer-bootstrap interval."""
    data = _frame(con, """
        SELECT b.model, h.part, h.parity, h.c_sym - h.d_sym AS c_sym_minus_d_sym, b.self_score
        FROM head_behaviour b JOIN heads h USING (model, layer, head)
        WHERE h.parity IS NOT NULL ORDER BY b.model, h.part, b.layer, b.head""")
    models = _by_model(data)
    contrast = {panel_name(row["model"], row["part"]): row for row in _frame(
        con, "SELECT * FROM behaviour_by_parity WHERE parity = 'I+ - I-'").iter_rows(named=True)}
    spearman = {panel_name(model, part): value for model, part, value in _frame(
        con, "SELECT model, part, spearman FROM behaviour_correlations WHERE score = 'self_score' "
             "AND statistic = 'c_sym_minus_d_sym'").iter_rows()}
    fig, axes = _panel_grid(len(models), 2, (5.2, 4.0))
    for ax, (model, rows) in zip(axes, models):
        _parity_scatter(ax, rows, "c_sym_minus_d_sym", "self_score")
        ax.axvline(0, color="black", lw=0.6, ls="--")
        row = contrast.get(model, {})
        _title(ax, f"{model} ({rows.height} heads)\nmedian self-score I+ minus I-: "
                   f"{_interval(row.get('median_self_score'), row.get('self_score_low'), row.get('self_score_high'))}"
                   f"; Spearman {_number(spearman.get(model))}", 5.2, 8)
        ax.set_xlabel(r"$c_{sym} - d_{sym}$ (the form's symmetric part: > 0 positive-leaning)", fontsize=8)
        ax.set_ylabel("self-score: mean attention weight on the token itself", fontsize=8)
        ax.set_yscale("log")
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, frameon=False)
    _suptitle(fig, "Behaviour beside form: does a head whose S leans positive (type I+) attend to its own token?\n"
                   "repeated random tokens; differences of medians with 95% layer-bootstrap intervals", 9)
    return _save(fig, path)


FIGURES["behaviour_self_score.png"] = (
    behaviour_self_score, "Behaviour beside form: each head's self-attention score against its form's c_sym - d_sym, "
                          "by parity (head_behaviour, behaviour_by_parity, behaviour_correlations)")


# Figures drawn only where the warehouse holds their data: file name -> (the view of their rows, why not drawn).
NEEDS: dict[str, tuple[str, str]] = {
    "figure05_head_types.png": (
        "head_types_by_model", "no model with head types in this warehouse (they are computed once a model's last "
                               "layer is in, from the heads whose S is not zero)"),
    "parity_by_distance.png": ("parity_by_distance", "no RoPE model in this warehouse"),
    "training_dynamics.png": (
        "dynamics_by_step", "no training checkpoints in this warehouse: extract with --revisions or the "
                            "pythia-dynamics set"),
    "behaviour_self_score.png": (
        "behaviour_by_parity", "no behaviour in this warehouse: run `headforms behaviour SOURCE`"),
    **{name: ("ov_heads", "no output-value circuit in this warehouse: extract with --circuits qk,ov")
       for name in ("ov_figure09_profiles.png", "ov_figure12_parity_by_layer.png", "ov_copying_scores.png")},
}


def missing(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """File name -> why it is not drawn, for each figure of NEEDS whose view is empty (or absent from an older
    warehouse)."""
    present = set(_frame(con, "SELECT table_name FROM information_schema.tables")["table_name"])
    return {name: why for name, (view, why) in NEEDS.items()
            if view not in present or not con.sql(f"SELECT count(*) FROM {view}").fetchall()[0][0]}
