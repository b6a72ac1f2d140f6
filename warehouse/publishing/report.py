"""The interactive report: a static site drawn from the warehouse with plotly, readable offline.

`write_report(con, out)` writes index.html (the models and their key figures), per model a page
with the 3-D simplex of profiles, parity by layer and the pairing / symmetric-energy maps beside
the random baseline, and per layer a page with each head's spectra and fitted gamma densities.
plotly.js is written once beside the pages (no CDN), so the site works from file://.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import polars as pl

from headforms.extract.checkpoint import WHOLE
from headforms.warehouse.publishing import numbers
from headforms.warehouse.storing.failures import stage, writable_folder
from headforms.warehouse.storing.store import query

PARITY_COLOURS = {"I+": "#d62728", "II": "#2ca02c", "I-": "#1f77b4", None: "#7f7f7f"}
# Vertices of a regular tetrahedron for the profile simplex: a (antisymmetric), b, c (PSD-like), d (NSD-like).
VERTICES = np.array([[1.0, 1.0, 1.0], [1.0, -1.0, -1.0], [-1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]]) / np.sqrt(3)
VERTEX_NAMES = ("a", "b", "c", "d")
# Histogram samples of a head page: spectrum in `eigenvalues` -> (fits.sample, label).
HEAD_SAMPLES = {"S_pos": ("S_pos", "λ+ (positive lobe of S)"), "S_neg": ("S_neg", "λ− (negative lobe of S)"),
                "T_sigma": ("T", "σ(T)")}

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<script src="plotly.min.js"></script>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;max-width:1400px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:right}}
th{{background:#f4f4f4}}td:first-child,th:first-child{{text-align:left}}nav a{{margin-right:1em}}</style>
</head><body>
<nav>{nav}</nav>
<h1>{title}</h1>
{body}
</body></html>
"""


def write_report(con, out_dir: str | Path) -> list[Path]:
    """Write the whole site into out_dir; returns the pages written (index.html first)."""
    import plotly.offline

    out = Path(out_dir)
    writable_folder(out)
    with stage("report (index.html)"):
        (out / "plotly.min.js").write_text(plotly.offline.get_plotlyjs(), encoding="utf-8")
        models = query(con, "SELECT model, architecture, n_layers, coalesce(attention_layers, range(n_layers)) AS "
                            "attention_layers, n_heads, n_kv_heads, d_model, head_dim, source, revision FROM models "
                            "WHERE complete ORDER BY model")
        pages = [_write(out, "index.html", "headforms report", _index_body(con, models), nav="")]
    for row in models.iter_rows(named=True):
        with stage(f"report ({model_page(row['model'])})", row["model"]):
            heads = query(con, "SELECT * FROM heads WHERE model = ? ORDER BY part, layer, head", [row["model"]])
            pages.append(_write(out, model_page(row["model"]), row["model"], _model_body(con, row, heads)))
        for layer in row["attention_layers"]:
            with stage(f"report ({layer_page(row['model'], layer)})", row["model"], layer):
                pages.append(_write(out, layer_page(row["model"], layer), f"{row['model']}: layer {layer}",
                                    _layer_body(con, row, layer, heads.filter(pl.col("layer") == layer))))
    return pages


def model_page(model: str) -> str:
    return f"model-{_slug(model)}.html"


def layer_page(model: str, layer: int) -> str:
    return f"layer-{_slug(model)}-{layer}.html"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _write(out: Path, name: str, title: str, body: str, nav: str | None = None) -> Path:
    nav = '<a href="index.html">all models</a>' if nav is None else nav
    path = out / name
    path.write_text(PAGE.format(title=html.escape(title), nav=nav, body=body), encoding="utf-8")
    return path


def _figure_html(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"responsive": True})


def _table_html(frame: pl.DataFrame, links: dict[str, str] | None = None) -> str:
    """A frame as an HTML table; numbers to 3 significant digits, NULL as an empty cell."""
    def cell(value, column):
        text = html.escape(_number(value))
        if links and column == frame.columns[0] and value in links:
            return f'<a href="{links[value]}">{text}</a>'
        return text

    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    rows = "".join("<tr>" + "".join(f"<td>{cell(v, c)}</td>" for v, c in zip(r, frame.columns)) + "</tr>"
                   for r in frame.iter_rows())
    return f"<table><tr>{head}</tr>{rows}</table>"


# The index's key figures: (label, view, column), in the order shown.
KEY_FIGURES = [
    ("heads", "parity_by_model", "heads"),
    ("I+ %", "parity_by_model", "pct_type_I_plus"), ("II %", "parity_by_model", "pct_type_II"),
    ("I- %", "parity_by_model", "pct_type_I_minus"),
    ("pairing", "model_medians", "median_pairing"), ("random pairing", "model_medians", "median_random_pairing"),
    ("symmetric energy", "model_medians", "median_symmetric_energy"),
    ("share above random", "model_medians", "share_above_random"),
    ("participation ratio", "model_medians", "median_participation_ratio"),
    ("mode ratio", "fit_ratios_by_model", "median_mode_ratio"),
    ("shape ratio", "fit_ratios_by_model", "median_shape_ratio"),
    ("σ-λ correlation", "fit_ratios_by_model", "median_correlation"),
]


def _index_body(con, models: pl.DataFrame) -> str:
    """Models with their key figures (Table 2's parity shares, medians, fit ratios) and, where the warehouse holds
    bootstrap intervals, the layer-resampling 95% interval beside each, with the significant digits (3 or more)
    that keep a column's values and a value's interval ends apart; a figure of every model; and what this
    warehouse holds no data for. A model whose heads have parts (heads.part) has a row per part, named
    'model (part)' (figures.panel_name)."""
    from headforms.warehouse.publishing import figures

    parts = query(con, "SELECT DISTINCT model, part FROM heads")
    rows = (models.select("model", "architecture").join(parts, on="model", how="left")
            .with_columns(pl.col("part").fill_null(WHOLE)).sort("model", "part"))
    keys = list(zip(rows["model"].to_list(), rows["part"].to_list()))
    names = [figures.panel_name(*key) for key in keys]
    intervals = _intervals(con)
    frame = {"model": names, "architecture": rows["architecture"].to_list()}
    for label, view, column in KEY_FIGURES:
        found = {(m, p): v for m, p, v in query(con, f"SELECT model, part, {column} FROM {view}").iter_rows()}
        parts = [[found.get(k) for k in keys], *map(list, zip(*(intervals.get((*k, view, column), (None, None))
                                                                 for k in keys)))] if keys else [[]]
        if all(isinstance(v, int) or v is None for v in parts[0]):
            frame[label] = ["" if v is None else str(v) for v in parts[0]]
            continue
        digits = numbers.significant_digits([p for p in parts if any(v is not None for v in p)])
        frame[label] = [numbers.interval(*row, digits) for row in zip(*parts)]
    links = {name: model_page(model) for name, (model, _) in zip(names, keys)}
    absent = sorted(set(figures.missing(con).values()))
    return ("<p>Per model: parity shares (Table 2, percent), medians of pairing (and of the random baseline), "
            "symmetric energy, participation ratio, the share of heads above their random baseline, and the "
            "fit-ratio medians of Observations 7-9 (retained heads); in brackets the 95% bootstrap interval "
            "resampling layers, where the warehouse has one. Definitions: statistics.md.</p>"
            + _table_html(pl.DataFrame(frame, schema={k: pl.Utf8 for k in frame}), links)
            + (_figure_html(_models_figure(con, keys, names, intervals), "models") if names else "")
            + "".join(f"<p>Not drawn: {html.escape(why)}.</p>" for why in absent))


def _models_figure(con, keys: list[tuple[str, str]], names: list[str], intervals: dict):
    """Every model (and part: `keys` (model, part), `names` their labels) side by side: its parity shares (Table 2),
    and its median pairing with the layer-bootstrap interval beside the random baseline's median."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    parity = query(con, "SELECT * FROM parity_by_model")
    medians = query(con, "SELECT model, part, median_pairing, median_random_pairing FROM model_medians")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Parity types (percent of heads)",
                                                        "Median pairing, 95% layer-bootstrap interval"))
    for column, name in (("pct_type_I_plus", "I+"), ("pct_type_II", "II"), ("pct_type_I_minus", "I-")):
        shares = {(m, p): v for m, p, v in parity.select("model", "part", column).iter_rows()}
        fig.add_trace(go.Bar(x=names, y=[shares.get(k) for k in keys], name=f"parity {name}",
                             marker_color=PARITY_COLOURS[name]), row=1, col=1)
    found = {(m, part): (p, r) for m, part, p, r in medians.iter_rows()}
    middle = [found.get(k, (None, None))[0] for k in keys]
    ends = [intervals.get((*k, "model_medians", "median_pairing"), (None, None)) for k in keys]
    fig.add_trace(go.Scatter(
        x=names, y=middle, mode="markers", name="median pairing", marker=dict(color="black", size=9),
        error_y=dict(type="data", symmetric=False,
                     array=[None if None in (h, v) else h - v for (_, h), v in zip(ends, middle)],
                     arrayminus=[None if None in (lo, v) else v - lo for (lo, _), v in zip(ends, middle)])),
        row=1, col=2)
    fig.add_trace(go.Scatter(x=names, y=[found.get(k, (None, None))[1] for k in keys], mode="markers",
                             name="random baseline median", marker=dict(color="#7f7f7f", symbol="diamond", size=9)),
                  row=1, col=2)
    fig.update_layout(barmode="stack", height=420, title="Every model")
    fig.update_yaxes(title_text="percent", range=[0, 100], row=1, col=1)
    fig.update_yaxes(title_text="pairing", row=1, col=2)
    return fig


def _intervals(con) -> dict[tuple[str, str, str, str], tuple[float, float]]:
    """(model, part, view, figure) -> (low, high) of the layer bootstrap, from the intervals table when there is
    one."""
    tables = set(query(con, "SELECT table_name FROM information_schema.tables")["table_name"])
    if "intervals" not in tables:
        return {}
    found = query(con, "SELECT model, part, view, figure, low, high FROM intervals WHERE method = 'layer'")
    return {(m, p, v, f): (low, high) for m, p, v, f, low, high in found.iter_rows()}


def _number(value) -> str:
    return "" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def simplex_points(heads: pl.DataFrame) -> np.ndarray:
    """Profiles (a, b, c, d) as points of the regular tetrahedron VERTICES (barycentric coordinates)."""
    return heads.select("a", "b", "c", "d").to_numpy() @ VERTICES


def _simplex_figure(heads: pl.DataFrame, what: str):
    """Each head's profile (a, b, c, d) in the regular tetrahedron, coloured by parity; `what` names the heads'
    circuit in the title."""
    import plotly.graph_objects as go

    defined = heads.filter(pl.col("a").is_not_null())
    simplex = go.Figure()
    edges = [VERTICES[i] for i in (0, 1, 2, 0, 3, 1, 3, 2)]
    simplex.add_trace(go.Scatter3d(x=[p[0] for p in edges], y=[p[1] for p in edges], z=[p[2] for p in edges],
                                   mode="lines", line=dict(color="#bbb"), hoverinfo="skip", showlegend=False))
    simplex.add_trace(go.Scatter3d(x=VERTICES[:, 0], y=VERTICES[:, 1], z=VERTICES[:, 2], mode="text",
                                   text=list(VERTEX_NAMES), hoverinfo="skip", showlegend=False))
    for parity in ("I+", "II", "I-", None):
        group = defined.filter(pl.col("parity").eq_missing(parity))
        if not group.height:
            continue
        xyz = simplex_points(group)
        hover = group.select(
            pl.format("layer {} head {}<br>parity {}<br>pairing {}<br>symmetric energy {}<br>a,b,c,d = {}, {}, {}, {}",
                      "layer", "head", pl.col("parity").fill_null("-"), pl.col("pairing").round(3),
                      pl.col("symmetric_energy").round(3), *(pl.col(c).round(3) for c in "abcd"))).to_series()
        simplex.add_trace(go.Scatter3d(
            x=xyz[:, 0].tolist(), y=xyz[:, 1].tolist(), z=xyz[:, 2].tolist(), mode="markers",
            name=f"parity {parity or 'undefined'}", meta="heads", marker=dict(size=3, color=PARITY_COLOURS[parity]),
            text=hover.to_list(), hovertemplate="%{text}<extra></extra>"))
    simplex.update_layout(height=600, margin=dict(l=0, r=0, t=30, b=0),
                          scene=dict(xaxis_visible=False, yaxis_visible=False, zaxis_visible=False),
                          title=f"Profiles of {defined.height} {what} on the simplex (vertices a, b, c, d)")
    return simplex


def _parity_by_layer_figure(by_layer: pl.DataFrame, what: str):
    """Stacked bars of each layer's percent of heads by parity type (rows of the view parity_by_layer)."""
    import plotly.graph_objects as go

    parity = go.Figure([go.Bar(x=by_layer["layer"].to_list(), y=by_layer[col].to_list(), name=name,
                               marker_color=PARITY_COLOURS[name])
                        for col, name in (("pct_type_I_plus", "I+"), ("pct_type_II", "II"), ("pct_type_I_minus", "I-"))])
    parity.update_layout(barmode="stack", height=350, title=f"Parity by layer{what} (percent of heads)",
                         xaxis_title="layer", yaxis_title="percent")
    return parity


def _parts(heads: pl.DataFrame) -> list[tuple[str, pl.DataFrame, str, str]]:
    """A model's heads by part (heads.part), each as (part, rows, what the part's titles add, what its div ids
    add): nothing for 'whole' heads, so that a model of whole heads draws as before."""
    return [(part, rows, "" if part == WHOLE else f" ({part} part)", "" if part == WHOLE else f"-{part}")
            for (part,), rows in heads.group_by("part", maintain_order=True)]


def _model_body(con, row: dict, heads: pl.DataFrame) -> str:
    """A model's page: facts, then per part of its heads (_parts; one for whole heads) the simplex, parity by layer
    and the maps beside the random baseline, then its output-value circuit (whole heads only) and behaviour."""
    model = row["model"]
    drawn = "".join(_form_html(con, model, part, rows, what, ids) for part, rows, what, ids in _parts(heads))
    layer_links = " ".join(f'<a href="{layer_page(model, i)}">{i}</a>' for i in row["attention_layers"])
    hybrid = (f" (softmax attention in {len(row['attention_layers'])} of them: layers "
              f"{', '.join(map(str, row['attention_layers']))})" if len(row["attention_layers"]) < row["n_layers"] else "")
    facts = (f"<p>{html.escape(row['architecture'])}, {row['n_layers']} layers{hybrid} x {row['n_heads']} heads "
             f"({row['n_kv_heads']} key-value heads), N = {row['d_model']}, {_head_sizes(con, model, row['head_dim'])}; "
             f"source {html.escape(row['source'])}, revision {html.escape(row['revision'])}.</p>")
    return (facts + drawn + _ov_html(con, model) + _behaviour_html(con, model)
            + f"<p>Spectra and fitted densities of each head, by layer: {layer_links}</p>")


def _head_sizes(con, model: str, head_dim: int) -> str:
    """'n = ...', or for a model stored as parts each part's head size (models.config's parts)."""
    [parts] = query(con, "SELECT json_extract(config, '$.parts') AS parts FROM models WHERE model = ?",
                    [model])["parts"].to_list()
    if not parts:
        return f"n = {head_dim}"
    return "each head as parts " + ", ".join(f"{name} (n = {part['head_dim']})"
                                             for name, part in json.loads(parts).items())


def _form_html(con, model: str, part: str, heads: pl.DataFrame, what: str, ids: str) -> str:
    """The simplex, parity by layer and pairing / symmetric-energy maps of a model's heads of one part."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    simplex = _simplex_figure(heads, "heads" + what)
    by_layer = query(con, "SELECT * FROM parity_by_layer WHERE model = ? AND part = ? ORDER BY layer", [model, part])
    parity = _parity_by_layer_figure(by_layer, what)

    maps = make_subplots(rows=1, cols=4, subplot_titles=("pairing", "random baseline pairing", "symmetric energy",
                                                         "random baseline symmetric energy"))
    for i, column in enumerate(("pairing", "random_pairing", "symmetric_energy", "random_symmetric_energy")):
        grid = heads.pivot(on="head", index="layer", values=column, sort_columns=True).sort("layer")
        maps.add_trace(go.Heatmap(z=grid.drop("layer").to_numpy(), x=[int(c) for c in grid.columns[1:]],
                                  y=grid["layer"].to_list(), coloraxis="coloraxis",
                                  hovertemplate=f"layer %{{y}} head %{{x}}<br>{column} %{{z:.3f}}<extra></extra>"),
                       row=1, col=i + 1)
    maps.update_layout(height=380, coloraxis=dict(colorscale="Viridis", cmin=0, cmax=1),
                       title=f"Pairing and symmetric energy per head{what} beside the random baseline")
    maps.update_xaxes(title_text="head")
    maps.update_yaxes(title_text="layer", col=1)
    maps.update_yaxes(type="category")  # a row per layer with heads (a hybrid's attention layers, by their index)
    return (_figure_html(simplex, "simplex" + ids) + _figure_html(parity, "parity-by-layer" + ids)
            + _figure_html(maps, "maps" + ids))


def _layer_body(con, row: dict, layer: int, heads: pl.DataFrame) -> str:
    """Each head of a layer: histograms of both lobes of S and of sigma(T), with the fitted gamma densities; per part
    of the heads (_parts), a table and figure each."""
    model = row["model"]
    nav_layers = " ".join(f'<a href="{layer_page(model, i)}">{i}</a>' for i in row["attention_layers"])
    return (f'<p><a href="{model_page(model)}">{html.escape(model)}</a>, layers: {nav_layers}</p>'
            + "".join(_layer_part_html(con, row, layer, *part) for part in _parts(heads)))


def _layer_part_html(con, row: dict, layer: int, part: str, heads: pl.DataFrame, what: str, ids: str) -> str:
    """A layer's heads of one part: their table, then the histograms and fitted gamma densities."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    from scipy import stats

    model, n_heads = row["model"], row["n_heads"]
    values = query(con, "SELECT head, spectrum, value FROM eigenvalues WHERE model = ? AND layer = ? AND part = ? "
                        "AND spectrum IN ('S_pos', 'S_neg', 'T_sigma') ORDER BY head, spectrum, idx",
                   [model, layer, part])
    fits = query(con, "SELECT head, sample, shape, scale FROM fits WHERE model = ? AND layer = ? AND part = ? "
                      "AND family = 'gamma' AND shape IS NOT NULL AND scale IS NOT NULL", [model, layer, part])
    fig = make_subplots(rows=n_heads, cols=3, subplot_titles=[
        f"head {h}: {label}" for h in range(n_heads) for _, label in HEAD_SAMPLES.values()])
    for (head, spectrum), group in values.group_by("head", "spectrum", maintain_order=True):  # the same page each time
        sample, _ = HEAD_SAMPLES[spectrum]
        col = list(HEAD_SAMPLES).index(spectrum) + 1
        x = group["value"].to_numpy()
        fig.add_trace(go.Histogram(x=x, histnorm="probability density", nbinsx=20, marker_color="#9ecae1",
                                   showlegend=False, name=f"head {head} {spectrum}"), row=head + 1, col=col)
        fit = fits.filter((pl.col("head") == head) & (pl.col("sample") == sample))
        if fit.height and x.size:
            grid = np.linspace(0, x.max() * 1.05, 120)
            pdf = stats.gamma.pdf(grid, fit["shape"][0], scale=fit["scale"][0])
            fig.add_trace(go.Scatter(x=grid, y=pdf, mode="lines", line=dict(color="#d62728"), showlegend=False,
                                     name=f"gamma fit k={fit['shape'][0]:.3g}"), row=head + 1, col=col)
    fig.update_layout(height=230 * n_heads, margin=dict(t=90),
                      title=f"Histograms (blue) and fitted gamma densities (red){what}")
    table = heads.select("head", "parity", "pairing", "symmetric_energy", "a", "b", "c", "d", "participation_ratio")
    return _table_html(table) + _figure_html(fig, "spectra" + ids)


def _behaviour_html(con, model: str) -> str:
    """A model page's behaviour beside form: each head's self-score against its form's c_sym - d_sym, by parity, a
    figure per part of its heads (_parts; nothing where the model has no behaviour rows, or the warehouse predates
    them)."""
    import plotly.graph_objects as go

    if "head_behaviour" not in set(query(con, "SELECT table_name FROM information_schema.tables")["table_name"]):
        return ""
    rows = query(con, """
        SELECT h.part, b.layer, b.head, h.parity, h.c_sym - h.d_sym AS c_minus_d, b.self_score, b.self_logit,
               b.previous_score, b.induction_score
        FROM head_behaviour b JOIN heads h USING (model, layer, head)
        WHERE b.model = ? AND h.parity IS NOT NULL ORDER BY h.part, b.layer, b.head""", [model])
    drawn = []
    for _, part_rows, what, ids in _parts(rows):
        fig = go.Figure()
        for parity in ("I+", "II", "I-"):
            group = part_rows.filter(pl.col("parity") == parity)
            hover = group.select(pl.format(
                "layer {} head {}<br>self-score {}<br>self-logit {}<br>previous {}<br>induction {}", "layer", "head",
                *(pl.col(c).round(4) for c in ("self_score", "self_logit", "previous_score", "induction_score"))))
            fig.add_trace(go.Scatter(x=group["c_minus_d"].to_list(), y=group["self_score"].to_list(),
                                     mode="markers", name=f"parity {parity} ({group.height})",
                                     marker=dict(color=PARITY_COLOURS[parity]), text=hover.to_series().to_list(),
                                     hovertemplate="%{text}<extra></extra>"))
        fig.update_layout(height=420, title=f"Behaviour beside form{what}: self-attention score against c_sym - d_sym "
                                            "(repeated random tokens)",
                          xaxis_title="c_sym - d_sym", yaxis_title="self-score", yaxis_type="log")
        drawn.append(_figure_html(fig, "behaviour" + ids))
    return "".join(drawn)


def _copying_table(rows: pl.DataFrame) -> pl.DataFrame:
    """copying_by_parity's rows of a model as the page prints them: each median with its interval as
    "value [low, high]", with the digits that keep them apart (numbers.significant_digits)."""
    frame = {"QK parity": rows["parity"].to_list(),
             "heads": ["" if v is None else str(v) for v in rows["heads"].to_list()]}
    for label, score in (("median copying score [95%]", "copying_score"),
                         ("median residual copying score [95%]", "residual_copying_score")):
        parts = [rows[column].to_list() for column in (f"median_{score}", f"{score}_low", f"{score}_high")]
        digits = numbers.significant_digits([p for p in parts if any(v is not None for v in p)])
        frame[label] = [numbers.interval(*row, digits) for row in zip(*parts)]
        if label.startswith("median copying"):
            frame["share that copies"] = numbers.shown(rows["share_copying"].to_list(), numbers.AT_LEAST)
    return pl.DataFrame(frame, schema={k: pl.Utf8 for k in frame})


def _ov_html(con, model: str) -> str:
    """A model page's output-value circuit (statistics.md "The output-value circuit"): the simplex and parity by layer
    of its OV (ov_heads), its heads by QK and OV parity (circuit_parity), its copying figures by QK parity
    (copying_by_parity) and a layers x heads map of both copying scores; nothing where the model has no ov_heads
    rows, or the warehouse predates them."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from headforms.warehouse.publishing.figures import view_over

    if "ov_heads" not in set(query(con, "SELECT table_name FROM information_schema.tables")["table_name"]):
        return ""
    heads = query(con, "SELECT * FROM ov_heads WHERE model = ? ORDER BY layer, head", [model])
    if not heads.height:
        return ""
    by_layer = query(con, f"SELECT * FROM ({view_over('parity_by_layer', 'ov_heads')}) WHERE model = ? "
                          f"ORDER BY layer", [model])
    crossed = query(con, "SELECT qk_parity, ov_parity, heads, share FROM circuit_parity WHERE model = ?", [model])
    copying = _copying_table(query(con, "SELECT * FROM copying_by_parity WHERE model = ?", [model]))
    maps = make_subplots(rows=1, cols=2, subplot_titles=("copying score (W_U OV W_E^T)",
                                                         "residual copying score (OV alone)"))
    for i, column in enumerate(("copying_score", "residual_copying_score")):
        grid = heads.pivot(on="head", index="layer", values=column, sort_columns=True).sort("layer")
        maps.add_trace(go.Heatmap(z=grid.drop("layer").to_numpy(), x=[int(c) for c in grid.columns[1:]],
                                  y=grid["layer"].to_list(), coloraxis="coloraxis",
                                  hovertemplate=f"layer %{{y}} head %{{x}}<br>{column} %{{z:.3f}}<extra></extra>"),
                       row=1, col=i + 1)
    maps.update_layout(height=380, coloraxis=dict(colorscale="RdBu", reversescale=True, cmin=-1, cmax=1),
                       title="Copying scores per head: sum(lambda) / sum(|lambda|), red copies, blue suppresses")
    maps.update_xaxes(title_text="head")
    maps.update_yaxes(title_text="layer", col=1)
    maps.update_yaxes(type="category")  # a row per layer with heads (a hybrid's attention layers, by their index)
    unembedded = "" if heads["copying_score"].null_count() < heads.height else (
        " This model has no unembedding (a sentence encoder): its copying scores are NULL.")
    return ("<h2>The output-value circuit OV = W_O W_V</h2><p>What each head writes, analysed as its form: "
            "profiles and parity of OV, its parity beside the form's, and its copying scores (statistics.md, "
            f"\"The output-value circuit\").{unembedded}</p>"
            + _figure_html(_simplex_figure(heads, "OV circuits"), "ov-simplex")
            + _figure_html(_parity_by_layer_figure(by_layer, " of OV"), "ov-parity-by-layer")
            + "<p>Heads by QK parity and OV parity (circuit_parity):</p>" + _table_html(crossed)
            + "<p>Copying by QK parity, with 95% layer-bootstrap intervals (copying_by_parity):</p>"
            + _table_html(copying) + _figure_html(maps, "ov-copying"))
