"""The paper beside its reproduction: paper_reference holds what the paper prints, paper_comparison
sets it beside a warehouse whose models carry the paper's names (tiny models under those names),
checked against a polars recomputation from the base tables; `make paper` run against a local hub."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import duckdb
import polars as pl
import pytest

from headforms import api
from headforms.extract import MODEL_SETS
from tests import tiny_models
from tests.test_hub import hub, serve  # noqa: F401  (hub is a fixture: the local hub, an empty headforms cache)
from tests.test_views import fit_ratios, percent

ROOT = Path(__file__).resolve().parent.parent
# Tiny stand-ins of the paper's models: warehouse name -> tiny layout; "extra" is not a paper model.
STAND_INS = {"gpt2": "gpt2", "opt-125m": "opt", "pythia-70m-deduped": "gpt_neox", "bloom-3b": "bloom",
             "extra": "llama"}
# The paper's hub ids -> the tiny layout a local hub serves under that id (for `make paper`).
HUB_STAND_INS = {"distilgpt2": "distilgpt2", "gpt2": "gpt2", "gpt2-medium": "gpt2", "gpt2-large": "gpt2",
                 "facebook/opt": "opt", "bigscience/bloom": "bloom", "EleutherAI/pythia": "gpt_neox",
                 "mistralai/": "mistral"}


@pytest.fixture(scope="module")
def paper_db(tmp_path_factory) -> Path:
    """A warehouse of tiny models named like four of the paper's models, and one other."""
    folder = tmp_path_factory.mktemp("paper")
    db = folder / "w.duckdb"
    for seed, (name, layout) in enumerate(STAND_INS.items()):
        model = tiny_models.save(tiny_models.build(layout, seed=seed), folder / name)
        api.extract(str(model), db=db, name=name)
    return db


def reference() -> pl.DataFrame:
    con = duckdb.connect()
    try:
        return con.sql((ROOT / "sql" / "paper_reference.sql").read_text()).pl()
    finally:
        con.close()


def test_paper_reference_is_what_the_paper_prints():
    """Internal checks a typo would break: shapes multiply out, Table 2's rows sum to 100 and match section
    3.1's head counts, the survey totals add up, the model names are the paper set's."""
    ref = reference()
    models = ref.filter(pl.col("scope") == "model")
    assert set(models["model"]) == {name for name, _ in MODEL_SETS["paper"]}
    shapes = models.filter(pl.col("source") == "§3.1").pivot("figure", index="model", values="value")
    assert (shapes["n_layers"] * shapes["n_heads"] == shapes["heads"]).all()
    survey = dict(ref.filter(pl.col("scope") == "survey").select("figure", "value").rows())
    assert shapes["heads"].sum() == survey["heads"] == survey["balanced_heads"] == 9512
    assert shapes.height == survey["models"] == 14
    assert survey["retained_heads"] + survey["excluded_heads"] == survey["heads"]
    table2 = models.filter(pl.col("source") == "Table 2 (§3.4)").pivot("figure", index="model", values="value")
    assert table2["model"].to_list() == ["distilgpt2", "gpt2", "gpt2-medium", "gpt2-large", "opt-125m", "opt-350m"]
    total = table2["pct_type_I_plus"] + table2["pct_type_II"] + table2["pct_type_I_minus"]
    assert ((total - 100).abs() <= 0.1 + 1e-9).all()
    assert table2.join(shapes, on="model").select((pl.col("heads") == pl.col("heads_right")).all()).item()
    assert ref.filter(pl.col("model").str.starts_with("opt") & (pl.col("source") == "Table 2 (§3.4)"))["note"] \
        .str.contains("transposes").all()
    for low, high in [("min_median_pairing", "max_median_pairing"), ("min_share_above_random", "max_share_above_random"),
                      ("min_median_mode_ratio", "max_median_mode_ratio"), ("min_median_correlation", "max_median_correlation")]:
        assert survey[low] < survey[high]
    assert set(ref["relation"]) == {"=", "<"} and ref.filter(pl.col("relation") == "<")["figure"].to_list() == [
        "share_participation_below_2"]


def expected_values(con) -> dict[tuple[str | None, str], float | None]:
    """headforms' side of paper_comparison recomputed with polars from models, heads and fits."""
    tables = {name: con.sql(f"select * from {name}").pl() for name in ("heads", "fits", "models")}
    paper = set(reference().filter(pl.col("scope") == "model")["model"])
    values: dict[tuple[str | None, str], float | None] = {}
    heads = tables["heads"]
    per_model = heads.group_by("model").agg(heads=pl.len(), pct_type_I_plus=percent(pl.col("parity") == "I+"),
                                            pct_type_II=percent(pl.col("parity") == "II"),
                                            pct_type_I_minus=percent(pl.col("parity") == "I-"))
    for row in tables["models"].join(per_model, on="model").iter_rows(named=True):
        for figure in ("n_layers", "n_heads", "n_kv_heads", "d_model", "head_dim", "heads", "pct_type_I_plus",
                       "pct_type_II", "pct_type_I_minus"):
            values[row["model"], figure] = row[figure]
    ours = heads.filter(pl.col("model").is_in(paper))
    shares = ours.group_by("model").agg(
        share=(pl.col("symmetric_energy") > pl.col("random_symmetric_energy")).mean(),
        pairing=pl.col("pairing").median())
    ratios = fit_ratios(tables).filter(pl.col("model").is_in(paper))
    errors = (tables["fits"].filter(pl.col("model").is_in(paper) & pl.col("family").is_in(["gamma", "lognormal", "weibull"]))
              .group_by("family", "sample").agg(pl.col("hist_error").median())["hist_error"])
    pairs = (tables["fits"].filter(pl.col("family").is_in(["gengamma", "lognormal"]))
             .pivot(on="family", index=["model", "layer", "head", "sample"], values="loglik"))
    wins = pairs.with_columns(win=pl.when(pl.col("gengamma").is_null()).then(False)  # the published rule
                              .when(pl.col("lognormal").is_null()).then(True)
                              .otherwise(pl.col("gengamma") >= pl.col("lognormal")))
    component = {"L_abs": "full", "S_pos": "S_positive", "S_neg": "S_negative", "T": "T"}
    for (model, sample), group in wins.group_by("model", "sample"):
        values[model, f"generalized_gamma_best_fit_share_{component[sample]}"] = group["win"].mean()
    values |= {(None, figure): value if ours.height else None for figure, value in {  # none present: NULL
        "models": ours["model"].n_unique(), "heads": ours.height, "balanced_heads": ours["balanced"].sum(),
        "median_participation_ratio": ours["participation_ratio"].median(),
        "share_participation_below_2": (ours["participation_ratio"] < 2).mean(),
        "min_share_above_random": shares["share"].min(), "max_share_above_random": shares["share"].max(),
        "min_median_pairing": shares["pairing"].min(), "max_median_pairing": shares["pairing"].max(),
        "excluded_heads": ratios["excluded"].sum(), "retained_heads": ratios["retained"].sum(),
        "min_median_mode_ratio": ratios["median_mode_ratio"].min(), "max_median_mode_ratio": ratios["median_mode_ratio"].max(),
        "min_median_shape_ratio": ratios["median_shape_ratio"].min(),
        "max_median_shape_ratio": ratios["median_shape_ratio"].max(),
        "min_median_correlation": ratios["median_correlation"].min(),
        "max_median_correlation": ratios["median_correlation"].max(),
        "min_median_hist_error": errors.min(), "max_median_hist_error": errors.max()}.items()}
    return values


def check_comparison(db: Path, present: int) -> pl.DataFrame:
    """paper_comparison of db against paper_reference and the polars recomputation; returns the view."""
    with api.connect(db) as con:
        view = con.sql("select * from paper_comparison").pl()
        values = expected_values(con)
    ref = reference()
    assert view.height == ref.height
    assert view.join(ref, on=["scope", "model", "figure", "source"], how="anti", nulls_equal=True).height == 0
    for row in view.iter_rows(named=True):
        expected = values.get((row["model"], row["figure"]))
        if row["scope"] == "model" and (row["model"], "heads") not in values:
            expected = None                                     # the model is not in this warehouse
        assert (row["headforms"] is None) if expected is None else \
            row["headforms"] == pytest.approx(expected, rel=1e-12, abs=1e-12), row
        assert row["models"] == (present if row["scope"] == "survey" else int(expected is not None)), row
        if expected is None:
            assert row["difference"] is None and row["agrees"] is None
            continue
        assert row["difference"] == pytest.approx(expected - row["paper"], rel=1e-12, abs=1e-12)
        decimals = ref.filter((pl.col("figure") == row["figure"]) & (pl.col("source") == row["source"]))["decimals"][0]
        agrees = (round(expected, decimals) == pytest.approx(row["paper"], abs=1e-9)) if row["relation"] == "=" \
            else expected < row["paper"]
        assert row["agrees"] == agrees, row
    return view


def test_paper_comparison_against_polars(paper_db):
    view = check_comparison(paper_db, present=4)
    gpt2 = view.filter((pl.col("model") == "gpt2") & (pl.col("figure") == "head_dim"))
    assert gpt2.select("paper", "headforms", "difference", "agrees").row(0) == (64.0, 8.0, -56.0, False)
    missing = view.filter(pl.col("model") == "opt-350m")
    assert missing["headforms"].is_null().all() and (missing["models"] == 0).all()


def test_histogram_errors_are_the_papers_three_families(paper_db, tmp_path):
    """Figure 6 compares gamma, lognormal and Weibull: the generalized gamma's errors stay out of the range."""
    db = tmp_path / "gengamma.duckdb"
    db.write_bytes(paper_db.read_bytes())
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE fits SET hist_error = 100 WHERE family = 'gengamma'")
    view = check_comparison(db, present=4)
    assert view.filter(pl.col("figure") == "max_median_hist_error")["headforms"][0] < 100


def test_paper_comparison_at_the_participation_threshold(paper_db, tmp_path):
    """Participation ratios of exactly 2 (not below 2) and below 2 in the paper's models: the share is
    neither 0 nor 1, and the view still equals the polars recomputation."""
    db = tmp_path / "ties.duckdb"
    db.write_bytes(paper_db.read_bytes())
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE heads SET participation_ratio = 2.0 WHERE layer = 0 AND head IN (0, 1)")
        con.execute("UPDATE heads SET participation_ratio = 1.5 WHERE layer = 1 AND head = 0")
    view = check_comparison(db, present=4)
    share = view.filter(pl.col("figure") == "share_participation_below_2")["headforms"][0]
    assert 0 < share < 0.5


def test_paper_comparison_without_paper_models(paper_db, tmp_path):
    """A warehouse of other models: every headforms value NULL, nothing made up."""
    db = tmp_path / "other.duckdb"
    db.write_bytes(paper_db.read_bytes())
    with duckdb.connect(str(db)) as con:
        for table in ("heads", "eigenvalues", "fits", "layers", "models"):
            con.execute(f"DELETE FROM {table} WHERE model <> 'extra'")
    view = check_comparison(db, present=0)
    assert view["headforms"].is_null().all() and view["agrees"].is_null().all()


def test_make_paper_against_a_local_hub(hub, tmp_path):  # noqa: F811
    """`make paper`'s own recipe, with the paper set's fourteen hub ids served by a local hub (tiny models
    of each architecture), writes the warehouse and the export with paper_comparison."""
    for seed, (_, hub_id) in enumerate(MODEL_SETS["paper"]):
        layout = next(layout for prefix, layout in HUB_STAND_INS.items() if hub_id.startswith(prefix))
        serve(hub, hub_id, tiny_models.save(tiny_models.build(layout, seed=seed), tmp_path / "models" / hub_id))
    db, out = tmp_path / "paper.duckdb", tmp_path / "paper"
    # the recipe's extract, online, against the local hub; HEADFORMS_CACHE (the fixture's) comes along
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {"HF_ENDPOINT": hub.endpoint}
    result = subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "paper",
                             f"PAPER_DB={db}", f"PAPER_OUT={out}"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].endswith(f"files written to {out} (index.csv lists what each one is)")
    comparison = pl.read_csv(out / "paper_comparison.csv")
    assert comparison.height == reference().height
    survey = comparison.filter(pl.col("scope") == "survey")
    assert (survey["models"] == 14).all()
    check_comparison(db, present=14)
