"""Every view of sql/ against the same aggregate recomputed independently with polars from the base tables."""
import shutil

import duckdb
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from conftest import ZERO_HEADS
from headforms.warehouse.storing.store import connect

TOLERANCES = [0.01, 0.02, 0.03, 0.05, 0.10]   # parity_sensitivity's tolerances
TYPES = {"pct_type_I_plus": "I+", "pct_type_II": "II", "pct_type_I_minus": "I-"}


@pytest.fixture(params=["demo", "with NULL statistics", "with ties at the thresholds"])
def con(request, demo_con, nulls_db, ties_db):
    """Each view test runs on the demo warehouse, on its copy holding NULL statistics, and on its copy with
    statistics on the views' thresholds (conftest.TIES)."""
    if request.param == "demo":
        yield demo_con
        return
    if request.param.startswith("with ties"):
        with connect(ties_db, read_only=True) as ties:
            assert ties.execute("SELECT count(*) FROM heads WHERE participation_ratio = 2").fetchall() == [(4,)]
            yield ties
        return
    with connect(nulls_db, read_only=True) as nulls:
        assert nulls.execute("SELECT count(*) FROM heads WHERE parity IS NULL").fetchall() == [(len(ZERO_HEADS),)]
        yield nulls


@pytest.fixture
def tables(con):
    """The base tables of the warehouse under test as polars frames."""
    return {name: con.sql(f"select * from {name}").pl() for name in ("heads", "fits", "models")}


def view(con, name: str, order: str = "model, part") -> pl.DataFrame:
    return con.sql(f"select * from {name} order by {order}").pl()


def assert_same(actual: pl.DataFrame, expected: pl.DataFrame) -> None:
    """Equal up to 1e-9 (values) and up to integer/decimal vs float types."""
    assert_frame_equal(actual, expected.select(actual.columns), check_dtypes=False, abs_tol=1e-9, rel_tol=0)


def percent(condition: pl.Expr) -> pl.Expr:
    """Percent of the group's rows where condition holds, rounded as the SQL does (1 decimal, half away from zero)."""
    return (100 * condition.sum() / pl.len()).round(1, mode="half_away_from_zero")


def parity_percents(column: str = "parity") -> dict[str, pl.Expr]:
    return {out: percent(pl.col(column) == kind) for out, kind in TYPES.items()}


def spectral_geometry(tables) -> pl.DataFrame:
    """spectral_geometry recomputed: gamma-fit modes and shapes per head, then the ratios."""
    gamma = tables["fits"].filter((pl.col("family") == "gamma") & (pl.col("status") == "ok"))

    def pick(column: str, sample: str) -> pl.Expr:
        return pl.col(column).filter(pl.col("sample") == sample).first()

    per_head = gamma.group_by("model", "layer", "head", "part").agg(
        nu=pick("mode", "S_pos"), mu=-pick("mode", "S_neg"), tau=pick("mode", "T"),
        k_plus=pick("shape", "S_pos"), k_minus=pick("shape", "S_neg"), k_T=pick("shape", "T"))
    # every head (and part), fitted or not
    return (tables["heads"].join(per_head, on=["model", "layer", "head", "part"], how="left")
            .with_columns(
                retained=pl.all_horizontal(pl.col("mu", "nu", "tau").is_not_null()),
                mode_ratio=pl.col("tau") / (pl.col("mu").abs() * pl.col("nu")).sqrt(),
                shape_ratio=pl.col("k_T") / (pl.col("k_plus") * pl.col("k_minus")).sqrt())
            .sort("model", "part", "layer", "head"))


def fit_ratios(tables) -> pl.DataFrame:
    retained = pl.col("retained")
    return spectral_geometry(tables).group_by("model", "part").agg(
        retained=retained.sum(), excluded=(~retained).sum(),
        median_mode_ratio=pl.col("mode_ratio").filter(retained).median(),
        median_shape_ratio=pl.col("shape_ratio").filter(retained).median(),
        median_correlation=pl.col("sigma_lambda_correlation").median(),
        median_geometric_mean_error=pl.col("geometric_mean_error").median(),
    ).sort("model", "part")


def test_parity_by_model(con, tables):
    expected = tables["heads"].group_by("model", "part").agg(heads=pl.len(), **parity_percents()).sort("model", "part")
    actual = view(con, "parity_by_model")
    assert_same(actual, expected)
    assert actual["heads"].to_list() == [270, 72]


def test_parity_by_layer(con, tables):
    expected = (tables["heads"].group_by("model", "part", "layer").agg(heads=pl.len(), **parity_percents())
                .sort("model", "part", "layer"))
    actual = view(con, "parity_by_layer", "model, part, layer")
    assert_same(actual, expected)
    assert actual.height == 30 + 6


def test_parity_sensitivity(con, tables):
    total = pl.col("c_sym") + pl.col("d_sym")
    reclassified = (tables["heads"].join(pl.DataFrame({"tolerance": TOLERANCES}), how="cross")
                    .with_columns(kind=pl.when(total.is_null()).then(None)
                                  .when(total <= pl.col("tolerance")).then(pl.lit("II"))
                                  .when(pl.col("c_sym") > pl.col("d_sym")).then(pl.lit("I+"))
                                  .otherwise(pl.lit("I-"))))
    expected = (reclassified.group_by("model", "part", "tolerance").agg(heads=pl.len(), **parity_percents("kind"))
                .sort("model", "part", "tolerance"))
    actual = (view(con, "parity_sensitivity", "model, part, tolerance")
              .with_columns(pl.col("tolerance").cast(pl.Float64)))
    assert_same(actual, expected)
    # at the extraction's own tolerance (1/50) it is Table 2 itself
    at_default = actual.filter(pl.col("tolerance") == 0.02).drop("tolerance")
    assert_same(at_default, view(con, "parity_by_model"))


def test_model_medians(con, tables):
    heads = tables["heads"].join(tables["models"].select("model", "d_model"), on="model")

    def above(left: pl.Expr, right: pl.Expr) -> pl.Expr:
        """Share of the group's heads where left > right; NULL comparisons are left out, as SQL's avg does."""
        return (left > right).cast(pl.Int32).mean()

    expected = heads.group_by("model", "part").agg(
        heads=pl.len(),
        **{f"median_{c}": pl.col(c).median() for c in (
            "symmetric_energy", "pairing", "rho", "lobe_departure", "participation_ratio", "stable_rank",
            "random_symmetric_energy", "random_pairing")},
        share_above_random=above(pl.col("symmetric_energy"), pl.col("random_symmetric_energy")),
        share_above_baseline_mean=above(pl.col("symmetric_energy"), (pl.col("d_model") + 1) / (2 * pl.col("d_model"))),
        share_participation_below_2=above(pl.lit(2.0), pl.col("participation_ratio")),
    ).sort("model", "part")
    assert_same(view(con, "model_medians"), expected)


def test_spectral_geometry(con, tables):
    actual = view(con, "spectral_geometry", "model, part, layer, head")
    expected = spectral_geometry(tables)
    assert_same(actual, expected)
    assert actual.height == 342
    assert (actual["mu"].drop_nulls() < 0).all() and (actual["nu"].drop_nulls() > 0).all()


def test_fit_ratios_by_model(con, tables):
    actual = view(con, "fit_ratios_by_model")
    assert_same(actual, fit_ratios(tables))
    assert (actual["retained"] + actual["excluded"]).to_list() == [270, 72]


def test_survey_ranges(con, tables):
    ratios = fit_ratios(tables)
    assert set(ratios["part"]) == {"whole"}  # the demo's heads are whole: one row per statistic
    total = ratios["retained"].sum() + ratios["excluded"].sum()
    expected = pl.DataFrame([
        ("mode_ratio", "whole", ratios["median_mode_ratio"].min(), ratios["median_mode_ratio"].max(),
         ratios.height, ratios["retained"].sum(), ratios["excluded"].sum()),
        ("shape_ratio", "whole", ratios["median_shape_ratio"].min(), ratios["median_shape_ratio"].max(),
         ratios.height, ratios["retained"].sum(), ratios["excluded"].sum()),
        ("sigma_lambda_correlation", "whole", ratios["median_correlation"].min(), ratios["median_correlation"].max(),
         ratios.height, total, 0),
    ], schema=["statistic", "part", "low", "high", "models", "retained_heads", "excluded_heads"], orient="row")
    actual = con.sql("select * from survey_ranges").pl().with_columns(pl.col("^.*_heads$").cast(pl.Int64))
    assert_same(actual, expected)


def test_fit_errors_by_model(con, tables):
    head = ["model", "layer", "head", "part", "sample"]

    def credit(best: pl.Expr) -> pl.Expr:
        """1/t for each of the t families tied for best at a head, 0 for the others."""
        best = best.fill_null(False)
        return pl.when(best).then(1.0 / best.sum().over(head)).otherwise(0.0)

    fits = tables["fits"].with_columns(
        best_hist=credit(pl.col("hist_error") == pl.col("hist_error").min().over(head)),
        best_loglik=credit(pl.col("loglik") == pl.col("loglik").max().over(head)),
        best_aic=credit(pl.col("aic") == pl.col("aic").min().over(head)),
        best_bic=credit(pl.col("bic") == pl.col("bic").min().over(head)))
    expected = fits.group_by("model", "part", "sample", "family").agg(
        heads=pl.len(),
        median_hist_error=pl.col("hist_error").median(),
        median_ks=pl.col("ks").median(),
        share_best_hist_error=pl.col("best_hist").mean(),
        share_best_loglik=pl.col("best_loglik").mean(),
        share_best_aic=pl.col("best_aic").mean(),
        share_best_bic=pl.col("best_bic").mean(),
        boundary_fits=(pl.col("status") == "boundary").sum(),
        failed_fits=(pl.col("status") == "failed").sum(),
    ).sort("model", "part", "sample", "family")
    actual = view(con, "fit_errors_by_model", "model, part, sample, family")
    assert_same(actual, expected)
    # one best family per head and sample that has a fit (failed fits are never best): a (model, sample)'s
    # shares add up to the share of such heads, one on the demo itself
    shares = ["share_best_hist_error", "share_best_loglik", "share_best_aic", "share_best_bic"]
    fitted = (tables["fits"].group_by(head).agg(fitted=(pl.col("status") != "failed").any())
              .group_by("model", "part", "sample").agg(pl.col("fitted").mean()))
    sums = (actual.group_by("model", "part", "sample").agg(pl.col(shares).sum())
            .join(fitted, on=["model", "part", "sample"]))
    for share in shares:
        assert ((sums[share] - sums["fitted"]).abs() < 1e-9).all()
    # charged its third parameter, the generalized gamma no longer wins nearly every head
    gengamma = actual.filter(pl.col("family") == "gengamma")
    assert (gengamma["share_best_aic"] < gengamma["share_best_loglik"]).all()


def signature(heads: pl.DataFrame) -> pl.DataFrame:
    """signature_check recomputed; a model without exceptions has an empty list."""
    label = pl.format("L{}.H{}: {}+/{}-", "layer", "head", "n_pos", "n_neg")
    return (heads.sort("model", "part", "layer", "head").group_by("model", "part", maintain_order=True)
            .agg(heads=pl.len(), balanced=pl.col("balanced").sum(), exceptions=(~pl.col("balanced")).sum(),
                 exception_heads=label.filter(~pl.col("balanced"))))


def signature_view(con) -> pl.DataFrame:
    """The view less its reasons (tested in tests/test_qk_norm_runs.py), which are NULL exactly without exceptions."""
    frame = view(con, "signature_check")
    assert (frame["reason"].is_null() == (frame["exceptions"] == 0)).all()
    return frame.drop("reason").with_columns(pl.col("exception_heads").fill_null(pl.lit([], pl.List(pl.Utf8))))


def test_signature_check(con, tables):
    actual = signature_view(con)
    assert_same(actual, signature(tables["heads"]))
    if tables["heads"]["parity"].null_count() == 0:  # the demo itself: every head balanced
        assert actual.rows() == [("SmolLM2-135M", "whole", 270, 270, 0, []),
                                 ("all-MiniLM-L6-v2", "whole", 72, 72, 0, [])]


def test_signature_check_lists_exceptions(demo_db, tmp_path):
    """On a copy of the demo warehouse with two heads made unbalanced, the view lists exactly those, in order."""
    path = tmp_path / "unbalanced.duckdb"
    shutil.copy(demo_db, path)
    with duckdb.connect(str(path)) as con:
        con.execute("""UPDATE heads SET n_pos = n_pos - 1, n_zero = n_zero + 1, balanced = false
                       WHERE model = 'SmolLM2-135M' AND (layer, head) IN ((7, 3), (2, 8))""")
        actual = signature_view(con)
        assert_same(actual, signature(con.sql("select * from heads").pl()))
    assert actual.row(0) == ("SmolLM2-135M", "whole", 270, 268, 2, ["L2.H8: 63+/64-", "L7.H3: 63+/64-"])
