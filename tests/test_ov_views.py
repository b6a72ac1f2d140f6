"""The output-value circuit's side of the warehouse on hand-built rows with known answers: the views circuit_parity,
copying_by_parity and the behaviour views' OV columns, the copying intervals (summaries.copying_intervals, against
a bootstrap written here), and NULL data: a model without unembedding (copying_score NULL), heads of NULL parity,
a model extracted without OV."""
from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from scipy import stats

from headforms.warehouse.running import summaries
from headforms.warehouse.storing.store import connect, create_schema, insert, transaction

TYPES = ("I+", "II", "I-")
# model -> (layers, heads per layer, has OV rows, has an unembedding)
MODELS = {"alpha": (5, 6, True, True), "encoder": (3, 4, True, False), "qkonly": (2, 3, False, False)}
RESAMPLES, SEED = 400, 11


def _model_row(model: str, layers: int, heads: int, ov: bool) -> dict:
    return {"model": model, "source": f"pkg:{model}", "revision": "r", "architecture": "hand", "n_layers": layers,
            "n_heads": heads, "n_kv_heads": heads, "d_model": 16, "head_dim": 4, "parity_tolerance": 0.02,
            "baseline_seed": SEED, "tool_version": "test", "extracted_at": datetime(2026, 1, 1), "complete": True,
            "circuits": "qk,ov" if ov else "qk"}


def _head_rows(model: str, layers: int, heads: int, rng: np.random.Generator) -> pl.DataFrame:
    """The NOT NULL columns of heads (and ov_heads), with random parities (a few NULL) and c_sym, d_sym."""
    count = layers * heads
    parity = rng.choice(np.array(["I+", "II", "I-", None], dtype=object), size=count, p=[0.4, 0.2, 0.3, 0.1])
    return pl.DataFrame({
        "model": model, "layer": np.repeat(np.arange(layers), heads).astype(np.int32),
        "head": np.tile(np.arange(heads), layers).astype(np.int32), "kv_head": np.tile(np.arange(heads), layers),
        "n_pos": 4, "n_neg": 4, "n_zero": 0, "n_zero_ambient": 8, "balanced": True,
        "parity": pl.Series(list(parity), dtype=pl.Utf8), "c_sym": rng.uniform(0, 1, count),
        "d_sym": rng.uniform(0, 1, count), "symmetric_energy": rng.uniform(0.4, 1, count),
        "pairing": rng.uniform(0, 1, count)})


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """A fresh warehouse of MODELS: heads and behaviour for all; ov_heads for alpha (copying scores to one decimal:
    ties, and every head 0 at exactly 0, which does not copy; some of its heads' OV parity NULL) and encoder (no
    unembedding: copying_score NULL); copying intervals from summaries."""
    path = tmp_path_factory.mktemp("ov") / "ov.duckdb"
    rng = np.random.default_rng(5)
    con = connect(path)
    create_schema(con)
    with transaction(con):
        for model, (layers, heads, ov, unembedded) in MODELS.items():
            insert(con, "models", pl.DataFrame([_model_row(model, layers, heads, ov)]))
            qk = _head_rows(model, layers, heads, rng)
            insert(con, "heads", qk)
            count = qk.height
            insert(con, "head_behaviour", qk.select("model", "layer", "head").with_columns(
                self_score=rng.uniform(0, 0.2, count), previous_score=rng.uniform(0, 1, count),
                induction_score=rng.uniform(0, 1, count), self_logit=rng.normal(0, 1, count),
                length=8, sequences=2, seed=1))
            if ov:
                rows = _head_rows(model, layers, heads, rng).with_columns(
                    copying_score=pl.Series(rng.uniform(-1, 1, count).round(1) if unembedded else [None] * count,
                                            dtype=pl.Float64),
                    residual_copying_score=rng.uniform(-1, 1, count)).with_columns(  # head 0: exactly 0
                    copying_score=pl.when(pl.col("head") == 0).then(0.0 if unembedded else None)
                    .otherwise(pl.col("copying_score")))
                insert(con, "ov_heads", rows)
        for model in MODELS:
            copying = summaries.copying_intervals(con, model, RESAMPLES, SEED)
            if copying.height:
                insert(con, "copying_intervals", copying)
    con.close()
    return path


@pytest.fixture
def ro(db):
    with connect(db, read_only=True) as con:
        yield con


def frames(con):
    heads = con.sql("SELECT * FROM heads").pl()
    ov = con.sql("SELECT * FROM ov_heads").pl()
    behaviour = con.sql("SELECT * FROM head_behaviour").pl()
    return heads, ov, behaviour


def test_circuit_parity_counts_the_pairs_of_parities(ro):
    heads, ov, _ = frames(ro)
    view = ro.sql("SELECT * FROM circuit_parity").pl()
    assert set(view["model"]) == {"alpha", "encoder"}  # qkonly has no OV rows: no row
    both = heads.join(ov, on=["model", "layer", "head"], suffix="_ov")
    for model in ("alpha", "encoder"):
        rows = both.filter(pl.col("model") == model)
        defined = rows.filter(pl.col("parity").is_not_null() & pl.col("parity_ov").is_not_null())
        assert 0 < defined.height < rows.height  # the NULL parities are there, and left out
        shown = view.filter(pl.col("model") == model)
        assert shown.select("qk_parity", "ov_parity").rows() == [(q, o) for q in TYPES for o in TYPES]
        for qk, ov_parity, count, share in shown.select("qk_parity", "ov_parity", "heads", "share").iter_rows():
            expected = int(((defined["parity"] == qk) & (defined["parity_ov"] == ov_parity)).sum())
            assert count == expected and share == pytest.approx(expected / defined.height)
        assert shown["share"].sum() == pytest.approx(1.0)


def test_copying_by_parity_medians_shares_and_their_intervals(ro):
    heads, ov, _ = frames(ro)
    view = ro.sql("SELECT * FROM copying_by_parity").pl()
    assert set(view["model"]) == {"alpha", "encoder"}
    typed = ov.drop("parity").join(heads.select("model", "layer", "head", "parity"), on=["model", "layer", "head"])
    typed = typed.filter(pl.col("parity").is_not_null())
    stored = ro.sql("SELECT * FROM copying_intervals").pl()
    for model in ("alpha", "encoder"):
        shown = view.filter(pl.col("model") == model)
        present = [p for p in TYPES if typed.filter((pl.col("model") == model) & (pl.col("parity") == p)).height]
        assert shown["parity"].to_list() == present + ["I+ - I-"]
        medians = {}
        for parity in present:
            group = typed.filter((pl.col("model") == model) & (pl.col("parity") == parity))
            row = shown.filter(pl.col("parity") == parity).row(0, named=True)
            assert row["heads"] == group.height
            residual = float(np.median(group["residual_copying_score"].to_numpy()))
            assert row["median_residual_copying_score"] == pytest.approx(residual)
            assert row["residual_copying_score_low"] <= residual <= row["residual_copying_score_high"]
            if model == "encoder":  # no unembedding: the copying figures are NULL, the residual ones are not
                assert row["median_copying_score"] is None and row["share_copying"] is None
                assert row["copying_score_low"] is None and row["copying_score_high"] is None
            else:
                scores = group["copying_score"].to_numpy()
                assert row["median_copying_score"] == pytest.approx(float(np.median(scores)))
                assert row["share_copying"] == pytest.approx(float(np.mean(scores > 0)))
                assert row["copying_score_low"] <= row["median_copying_score"] <= row["copying_score_high"]
            assert row["resamples"] == RESAMPLES
            medians[parity] = row
        contrast = shown.filter(pl.col("parity") == "I+ - I-").row(0, named=True)
        assert contrast["heads"] is None
        for column in ("median_copying_score", "share_copying", "median_residual_copying_score"):
            if model == "alpha" or column == "median_residual_copying_score":
                assert contrast[column] == pytest.approx(medians["I+"][column] - medians["I-"][column])
            else:
                assert contrast[column] is None
        for row in shown.iter_rows(named=True):  # the bounds shown are the stored ones
            found = stored.filter((pl.col("model") == model) & (pl.col("parity") == row["parity"])
                                  & (pl.col("figure") == "median_copying_score"))
            assert (found["low"][0], found["high"][0]) == (row["copying_score_low"], row["copying_score_high"])


def independent_bootstrap(layer: np.ndarray, parity: np.ndarray, values: np.ndarray, resamples: int,
                          seed) -> dict[str, tuple[float, float, float]]:
    """Per type (and I+ - I-): the median of `values` (NaN ignored), and the 2.5% and 97.5% quantiles of it over
    resamples of whole layers drawn with numpy's default_rng(seed), one resample at a time."""
    layers = np.unique(layer)
    drawn = np.random.default_rng(seed).integers(0, len(layers), size=(resamples, len(layers)))

    def median(rows: np.ndarray, kind: str) -> float:
        chosen = values[rows][parity[rows] == kind]
        chosen = chosen[~np.isnan(chosen)]
        return float(np.median(chosen)) if chosen.size else np.nan

    found = {}
    for kind in (*TYPES, "I+ - I-"):
        def figure(rows):
            return median(rows, "I+") - median(rows, "I-") if kind == "I+ - I-" else median(rows, kind)
        everything = np.arange(len(layer))
        replicates = []
        for draw in drawn:
            rows = np.concatenate([np.flatnonzero(layer == layers[k]) for k in draw])
            replicates.append(figure(rows))
        replicates = np.array(replicates)
        replicates = replicates[~np.isnan(replicates)]
        low, high = np.quantile(replicates, [0.025, 0.975]) if replicates.size else (np.nan, np.nan)
        found[kind] = (figure(everything), low, high)
    return found


def test_copying_intervals_against_an_independent_bootstrap(ro):
    stored = ro.sql("SELECT * FROM copying_intervals").pl()
    assert set(stored["model"]) == {"alpha", "encoder"}
    assert (stored["resamples"] == RESAMPLES).all() and (stored["seed"] == SEED).all()
    for model in ("alpha", "encoder"):
        rows = ro.sql("SELECT o.layer, h.parity, o.copying_score, o.residual_copying_score FROM ov_heads o "
                      "JOIN heads h USING (model, layer, head) WHERE model = ?", params=[model]).pl()
        parity = rows["parity"].fill_null("none").to_numpy()
        for column in ("copying_score", "residual_copying_score"):
            values = rows[column].cast(pl.Float64).fill_null(np.nan).to_numpy()
            expected = independent_bootstrap(rows["layer"].to_numpy(), parity, values, RESAMPLES, (SEED, 0))
            for kind, (estimate, low, high) in expected.items():
                row = stored.filter((pl.col("model") == model) & (pl.col("parity") == kind)
                                    & (pl.col("figure") == f"median_{column}")).row(0, named=True)
                for got, want in ((row["estimate"], estimate), (row["low"], low), (row["high"], high)):
                    assert (got is None and np.isnan(want)) or got == pytest.approx(want), (model, column, kind)
                if model == "alpha" or column == "residual_copying_score":
                    assert row["low"] is not None and row["low"] < row["high"]


def test_no_copying_intervals_for_a_model_without_ov_rows_or_of_one_layer(db, tmp_path):
    with connect(db, read_only=True) as con:
        assert summaries.copying_intervals(con, "qkonly", RESAMPLES, SEED).height == 0
        assert summaries.copying_intervals(con, "not there", RESAMPLES, SEED).height == 0
    one = tmp_path / "one.duckdb"
    shutil.copy(db, one)
    with duckdb.connect(str(one)) as con:  # a model of one layer: estimates, but no interval
        con.execute("DELETE FROM ov_heads WHERE model = 'alpha' AND layer > 0")
        found = summaries.copying_intervals(con, "alpha", RESAMPLES, SEED)
    assert found.height and found["estimate"].drop_nulls().len() and found["low"].null_count() == found.height


def test_write_summaries_writes_copying_intervals_only_with_ov_rows(tiny_rope_db, tmp_path):
    """On a real extracted model: no copying intervals without ov_heads rows; with them (hand-made from its heads
    rows), summaries writes those of copying_intervals."""
    db = tmp_path / "tiny.duckdb"
    shutil.copy(tiny_rope_db, db)
    with duckdb.connect(str(db)) as con:
        [(model,)] = con.execute("SELECT model FROM models").fetchall()
        assert con.execute("SELECT count(*) FROM copying_intervals").fetchall() == [(0,)]
        con.execute("INSERT INTO ov_heads SELECT * EXCLUDE (part, sink_logit), (layer - 1) / 2 + head / 10, 0.5 - head / 7 "
                    "FROM heads")
        for table in ("intervals", "head_types"):
            con.execute(f"DELETE FROM {table}")
        with transaction(con):
            summaries.write_summaries(con, model, 30, 4)
        written = con.sql("SELECT * EXCLUDE (model) FROM copying_intervals ORDER BY parity, figure").pl()
        assert written.height == 8 and written.equals(
            summaries.copying_intervals(con, model, 30, 4).drop("model").sort("parity", "figure"))
        assert con.execute("SELECT count(*) FROM intervals").fetchall()[0][0] > 0


def test_behaviour_views_carry_the_ov_columns(ro):
    heads, ov, behaviour = frames(ro)
    joined = behaviour.join(heads.select("model", "layer", "head", "parity", "c_sym", "d_sym"),
                            on=["model", "layer", "head"]).join(
        ov.select("model", "layer", "head", "copying_score", "residual_copying_score"),
        on=["model", "layer", "head"], how="left")
    correlations = ro.sql("SELECT * FROM behaviour_correlations").pl()
    ov_pairs = correlations.filter(pl.col("statistic").is_in(["copying_score", "residual_copying_score"]))
    expected_pairs = {(m, s, c) for m in ("alpha", "encoder")
                      for s in ("self_score", "previous_score", "induction_score")
                      for c in ("copying_score", "residual_copying_score") if (m, c) != ("encoder", "copying_score")}
    assert set(ov_pairs.select("model", "score", "statistic").rows()) == expected_pairs
    assert ov_pairs.height == len(expected_pairs)
    for model, score, statistic, count, spearman in ov_pairs.select(
            "model", "score", "statistic", "heads", "spearman").iter_rows():
        pairs = joined.filter(pl.col("model") == model).select(score, statistic).drop_nulls()
        assert count == pairs.height == MODELS[model][0] * MODELS[model][1]
        assert spearman == pytest.approx(stats.spearmanr(pairs[score], pairs[statistic]).statistic)
    form = correlations.filter(~pl.col("statistic").is_in(["copying_score", "residual_copying_score"]))
    assert form.height == 3 * 2 * 3  # the form's rows as before, for every model

    by_parity = ro.sql("SELECT * FROM behaviour_by_parity").pl()
    typed = joined.filter(pl.col("parity").is_not_null())
    for row in by_parity.filter(pl.col("parity") != "I+ - I-").iter_rows(named=True):
        group = typed.filter((pl.col("model") == row["model"]) & (pl.col("parity") == row["parity"]))
        assert row["heads"] == group.height
        for column in ("copying_score", "residual_copying_score"):
            values = group[column].drop_nulls().to_numpy()
            want = float(np.median(values)) if values.size else None
            assert row[f"median_{column}"] == (pytest.approx(want) if want is not None else None), (row, column)
    assert by_parity.filter(pl.col("model") == "qkonly")["median_residual_copying_score"].null_count() \
        == by_parity.filter(pl.col("model") == "qkonly").height > 0


@pytest.fixture(scope="module")
def published_db(tiny_rope_db, tmp_path_factory):
    """The tiny extracted model with OV rows made from its heads rows (the profile's c and d swapped, so OV's parity
    is the form's mirrored, and copying scores of a pattern over layer and head), beside a copy of it named qk-only
    without OV rows; summaries' copying intervals of the first."""
    path = tmp_path_factory.mktemp("published") / "published.duckdb"
    shutil.copy(tiny_rope_db, path)
    with duckdb.connect(str(path)) as con:
        [(model,)] = con.execute("SELECT model FROM models").fetchall()
        for table, in con.execute("SELECT DISTINCT table_name FROM duckdb_columns() WHERE column_name = 'model' "
                                  "AND database_name = current_database() AND schema_name = 'main' AND table_name IN "
                                  "(SELECT table_name FROM duckdb_tables())").fetchall():
            con.execute(f"INSERT INTO {table} SELECT * REPLACE ('qk-only' AS model) FROM {table}")
        con.execute("""INSERT INTO ov_heads SELECT * EXCLUDE (part, sink_logit) REPLACE (d AS c, c AS d, d_sym AS c_sym,
                           c_sym AS d_sym,
                           CASE parity WHEN 'I+' THEN 'I-' WHEN 'I-' THEN 'I+' ELSE parity END AS parity),
                           cos(layer + 2 * head), 0.8 * sin(3 * layer - head)
                       FROM heads WHERE model = ?""", [model])
        with transaction(con):
            insert(con, "copying_intervals", summaries.copying_intervals(con, model, 50, 3))
    return path, model


OV_FIGURES = ("ov_figure09_profiles.png", "ov_figure12_parity_by_layer.png", "ov_copying_scores.png")


def test_export_draws_the_ov_figures_of_the_models_with_ov_rows(published_db, tmp_path):
    """export: the OV tables and figures, real images, indexed; each figure's panels are the OV model's alone."""
    from matplotlib import image

    from headforms.warehouse.publishing import export, figures

    path, model = published_db
    with connect(path, read_only=True) as con:
        written = {p.name for p in export.export(con, tmp_path / "out")}
        built = []
        with pytest.MonkeyPatch.context() as patch:  # the figures as built, to read their panels' titles
            patch.setattr(figures, "_save", lambda fig, p: built.append(fig) or p)
            for name in OV_FIGURES:
                figures.FIGURES[name][0](con, tmp_path / name)
        qk_profiles = con.sql("SELECT c_sym, d_sym, parity FROM heads WHERE model = ? ORDER BY layer, head",
                              params=[model]).fetchall()
        ov_profiles = con.sql("SELECT d_sym, c_sym, CASE parity WHEN 'I+' THEN 'I-' WHEN 'I-' THEN 'I+' ELSE parity "
                              "END FROM ov_heads WHERE model = ? ORDER BY layer, head", params=[model]).fetchall()
    assert qk_profiles == ov_profiles  # what the fixture made: OV's profile is the form's mirrored
    assert set(OV_FIGURES) <= written
    for name in OV_FIGURES:  # a real image: not blank, not one flat colour (a model of 3 layers: a small one)
        pixels = image.imread(tmp_path / "out" / name)[..., :3]
        assert min(pixels.shape[:2]) >= 250 and pixels.var() > 0 and (pixels.min(axis=2) < 0.9).mean() > 0.02
    index = pl.read_csv(tmp_path / "out" / "index.csv")
    described = dict(index.select("file", "description").iter_rows())
    assert all(not described[name].startswith(export.NOT_WRITTEN) and "ov_heads" in described[name]
               for name in OV_FIGURES)
    assert pl.read_csv(tmp_path / "out" / "ov_circuit_parity.csv")["model"].unique().to_list() == [model]
    assert pl.read_csv(tmp_path / "out" / "ov_copying_by_parity.csv")["model"].unique().to_list() == [model]
    for fig in built:
        titles = [ax.get_title(loc) for ax in fig.axes for loc in ("left", "center") if ax.get_title(loc)]
        assert titles and all(title.startswith(model) for title in titles), titles  # no panel of qk-only
    assert "output-value" in built[0].get_suptitle() and "output-value" in built[1].get_suptitle()


def test_export_without_ov_rows_says_why_no_ov_figure(tiny_rope_db, tmp_path):
    from headforms.warehouse.publishing import export

    with connect(tiny_rope_db, read_only=True) as con:
        written = {p.name for p in export.export(con, tmp_path / "out")}
    assert not written & set(OV_FIGURES) and not set(OV_FIGURES) & {p.name for p in (tmp_path / "out").iterdir()}
    described = dict(pl.read_csv(tmp_path / "out" / "index.csv").select("file", "description").iter_rows())
    for name in OV_FIGURES:
        assert described[name].startswith(export.NOT_WRITTEN + "no output-value circuit in this warehouse: extract "
                                                               "with --circuits qk,ov")


def test_report_model_page_draws_the_ov_circuit(published_db):
    """The OV model's page: its OV simplex at the barycentric points of ov_heads' profiles, OV parity by layer as the
    parity_by_layer view computes it over ov_heads, and both copying maps equal to the stored columns; the page of
    a model without OV rows has none of these."""
    from headforms.warehouse.publishing import report
    from tests.test_report import _page_figures

    path, model = published_db
    drawn, heads = _page_figures(path, model)
    plain, _ = _page_figures(path, "qk-only")
    assert {"ov-simplex", "ov-parity-by-layer", "ov-copying"} <= set(drawn)
    assert not {"ov-simplex", "ov-parity-by-layer", "ov-copying"} & set(plain)
    with duckdb.connect(str(path), read_only=True) as con:
        ov = con.sql("SELECT * FROM ov_heads WHERE model = ? ORDER BY layer, head", params=[model]).pl()
    points = [t for t in drawn["ov-simplex"].data if t.meta == "heads"]
    assert sum(len(t.x) for t in points) == ov.filter(pl.col("a").is_not_null()).height
    for trace in points:
        parity = trace.name.removeprefix("parity ")
        group = ov.filter(pl.col("parity").eq_missing(None if parity == "undefined" else parity)
                          & pl.col("a").is_not_null())
        np.testing.assert_allclose(np.c_[trace.x, trace.y, trace.z], report.simplex_points(group))
    bars = {t.name: list(t.y) for t in drawn["ov-parity-by-layer"].data}
    for name, parity in (("I+", "I+"), ("II", "II"), ("I-", "I-")):
        share = ov.group_by("layer").agg(((pl.col("parity") == parity).sum() * 100 / pl.len()).round(1)
                                         .alias("pct")).sort("layer")["pct"].to_list()
        assert bars[name] == pytest.approx(share)
    for trace, column in zip(drawn["ov-copying"].data, ("copying_score", "residual_copying_score")):
        layers, heads_per_layer = ov["layer"].max() + 1, ov["head"].max() + 1
        np.testing.assert_allclose(np.array(trace.z, dtype=float),
                                   ov[column].to_numpy().reshape(layers, heads_per_layer))


def test_ov_figures_keep_their_text_on_the_canvas(published_db):
    """As tests/test_figure_layout.py checks every figure: each OV figure's text lies on its canvas."""
    from headforms.warehouse.publishing import figures
    from tests.test_figure_layout import _drawn_text

    path, _ = published_db
    built = []
    with connect(path, read_only=True) as con, pytest.MonkeyPatch.context() as patch:
        patch.setattr(figures, "_save", lambda fig, p: built.append(fig) or p)
        for name in OV_FIGURES:
            figures.FIGURES[name][0](con, Path(name))
    for fig in built:
        canvas = fig.bbox
        outside = [extent for _, extent in _drawn_text(fig)
                   if extent.x0 < canvas.x0 - 1 or extent.y0 < canvas.y0 - 1
                   or extent.x1 > canvas.x1 + 1 or extent.y1 > canvas.y1 + 1]
        assert not outside


@pytest.fixture(scope="module")
def checked_db(tiny_rope_db, tmp_path_factory):
    """The tiny model extracted with its QK rows copied as its OV rows (a consistent warehouse, circuits 'qk,ov')."""
    path = tmp_path_factory.mktemp("checked") / "checked.duckdb"
    shutil.copy(tiny_rope_db, path)
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE models SET circuits = 'qk,ov'")
        con.execute("INSERT INTO ov_heads SELECT * EXCLUDE (part, sink_logit), 0.5, -0.5 FROM heads")
        con.execute("INSERT INTO ov_eigenvalues SELECT * EXCLUDE (part) FROM eigenvalues")
        con.execute("INSERT INTO ov_fits SELECT * EXCLUDE (part) FROM fits")
    return path


# damage -> the findings expected, (check, layer, head) of the tiny model
OV_DAMAGE = {
    "a head missing from OV": ([f"DELETE FROM {table} WHERE layer = 1 AND head = 2"
                                for table in ("ov_heads", "ov_eigenvalues", "ov_fits")], {("ov_rows", 1, 2)}),
    "orphan OV eigenvalues and fits": (["INSERT INTO ov_eigenvalues SELECT * REPLACE (99 AS head) FROM ov_eigenvalues "
                                        "WHERE layer = 0 AND head = 0",
                                        "INSERT INTO ov_fits SELECT * REPLACE (98 AS head) FROM ov_fits "
                                        "WHERE layer = 0 AND head = 0"], {("ov_rows", 0, 99), ("ov_rows", 0, 98)}),
    "ov rows of a qk model": (["UPDATE models SET circuits = 'qk'"], {("ov_rows", None, None)}),
    "ov rows of a model from before circuits": (["UPDATE models SET circuits = NULL"], {("ov_rows", None, None)}),
    "ov row without heads row": (["DELETE FROM heads WHERE layer = 2 AND head = 0"],
                                 {("missing_head", 2, 0), ("orphan_rows", 2, 0), ("distance_profiles", 2, 0),
                                  ("ov_rows", 2, 0)}),
    "change an OV n_zero": (["UPDATE ov_heads SET n_zero = n_zero + 1 WHERE layer = 0 AND head = 3"],
                            {("ov_signature", 0, 3)}),
    "break an OV profile": (["UPDATE ov_heads SET c = c + 1e-6 WHERE layer = 2 AND head = 5"], {("ov_profile", 2, 5)}),
    "wrong OV kv_head": (["UPDATE ov_heads SET kv_head = 2 WHERE layer = 0 AND head = 0"], {("ov_kv_head", 0, 0)}),
    "delete an OV eigenvalue": (["DELETE FROM ov_eigenvalues WHERE layer = 1 AND head = 1 AND spectrum = 'S' "
                                 "AND idx = 0"], {("ov_eigenvalue_rows", 1, 1)}),
    "delete an OV fit": (["DELETE FROM ov_fits WHERE layer = 0 AND head = 4 AND sample = 'T' AND family = 'gamma'"],
                         {("ov_fits", 0, 4)}),
    "duplicate an OV fit": (["INSERT INTO ov_fits SELECT * FROM ov_fits WHERE layer = 0 AND head = 4 AND sample = 'T' "
                             "AND family = 'gamma'"], {("duplicate_rows", 0, 4)}),
}


def test_check_passes_a_warehouse_with_ov_rows_and_reports_their_damage(checked_db):
    from headforms.warehouse.storing.check import check_warehouse

    con = duckdb.connect(str(checked_db))
    try:
        assert check_warehouse(con) == []
        for damage, (statements, expected) in OV_DAMAGE.items():
            con.execute("BEGIN")
            try:
                for statement in statements:
                    con.execute(statement)
                found = {(f.check, f.layer, f.head) for f in check_warehouse(con, full=False)}
            finally:
                con.execute("ROLLBACK")
            assert found == expected, damage
    finally:
        con.close()


def test_a_warehouse_from_before_the_ov_tables_reads_them_as_empty(tiny_rope_db, tmp_path):
    """A file written before the OV tables, opened read-only: its views of them answer with no rows, the behaviour
    views and export run (no OV figure, index says why), and nothing is written to the file."""
    from headforms.warehouse.publishing import export

    old = tmp_path / "old.duckdb"
    shutil.copy(tiny_rope_db, old)
    with duckdb.connect(str(old)) as con:
        for view in ("circuit_parity", "copying_by_parity", "behaviour_by_parity", "behaviour_correlations"):
            con.execute(f"DROP VIEW {view}")
        for table in ("ov_heads", "ov_eigenvalues", "ov_fits", "copying_intervals"):
            con.execute(f"DROP TABLE {table}")
    old.chmod(0o444)
    before = old.read_bytes()
    with connect(old, read_only=True) as con:
        for view in ("circuit_parity", "copying_by_parity", "behaviour_by_parity", "behaviour_correlations"):
            assert con.execute(f"SELECT count(*) FROM {view}").fetchall() == [(0,)]
        assert con.execute("SELECT count(*) FROM parity_by_model").fetchall() == [(1,)]
        written = {p.name for p in export.export(con, tmp_path / "out")}
    assert not written & set(OV_FIGURES) and "ov_circuit_parity.csv" in written
    assert old.read_bytes() == before


def test_report_prints_copying_by_parity_with_its_intervals(published_db):
    """The model page's copying table: each median and its interval's ends read back as copying_by_parity's, to the
    digits printed; the share that copies as the view's."""
    from headforms.warehouse.publishing import report

    path, model = published_db
    with connect(path, read_only=True) as con:
        view = con.sql("SELECT * FROM copying_by_parity WHERE model = ?", params=[model]).pl()
    table = report._copying_table(view)
    assert table["QK parity"].to_list() == view["parity"].to_list()
    for printed, row in zip(table.iter_rows(named=True), view.iter_rows(named=True)):
        for label, score in (("median copying score [95%]", "copying_score"),
                             ("median residual copying score [95%]", "residual_copying_score")):
            value, low, high = (float(x) for x in printed[label].replace("[", "").replace("]", "")
                                .replace(",", "").split())
            places = len(printed[label].split()[0].split(".")[1])
            for got, want in ((value, row[f"median_{score}"]), (low, row[f"{score}_low"]),
                              (high, row[f"{score}_high"])):
                assert abs(got - want) <= 0.5 * 10 ** -places + 1e-12
        assert float(printed["share that copies"]) == pytest.approx(row["share_copying"], abs=5e-3)
