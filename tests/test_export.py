"""Export of the demo warehouse: every file is written and indexed, tables round-trip, figures are real images."""
import re
import shutil
import subprocess

import duckdb
import numpy as np
import polars as pl
import pytest
from matplotlib import image
from polars.testing import assert_frame_equal

from headforms.warehouse.publishing.export import (LATEX_ALL, LATEX_LEFT_OUT, LATEX_PACKAGES, LIST_SEPARATOR,
                                                   NOT_WRITTEN, TABLES, export)
from headforms.warehouse.publishing.figures import FIGURES

# Exported empty from the demo warehouse, which holds no training checkpoints; tests/test_dynamics.py exports them
# from checkpoints. The demo fixture runs extract only, not behaviour (tests/test_behaviour.py fills and checks these).
# The demo is extracted with both circuits (--circuits qk,ov), so the output-value tables and figures are written.
EMPTY_ON_DEMO = {"training_dynamics", "behaviour_by_parity", "behaviour_correlations"}
NOT_DRAWN_ON_DEMO = {"training_dynamics.png", "behaviour_self_score.png"}  # no placeholder image: nothing is written
EXPECTED = ({f"{stem}.{ext}" for stem in TABLES for ext in ("csv", "parquet")} | set(FIGURES) | {"index.csv"}) \
    - NOT_DRAWN_ON_DEMO


@pytest.fixture(scope="module")
def exported(demo_db, tmp_path_factory):
    """The demo warehouse exported (read-only connection) into a folder that does not exist yet."""
    out = tmp_path_factory.mktemp("export") / "paper"
    with duckdb.connect(str(demo_db), read_only=True) as con:
        paths = export(con, out)
    return out, paths


@pytest.fixture(scope="module")
def one_model_export(demo_db, tmp_path_factory):
    """A copy of the demo warehouse reduced to SmolLM2-135M, with two heads made unbalanced, exported."""
    folder = tmp_path_factory.mktemp("one_model")
    path = folder / "warehouse.duckdb"
    shutil.copy(demo_db, path)
    with duckdb.connect(str(path)) as con:
        tables = con.sql("""SELECT table_name FROM duckdb_columns()
                            WHERE column_name = 'model' AND NOT internal AND table_name IN
                                  (SELECT table_name FROM duckdb_tables())""").fetchall()
        for (table,) in tables:  # every table of the warehouse with a model column
            con.execute(f"DELETE FROM {table} WHERE model = 'all-MiniLM-L6-v2'")
        con.execute("""UPDATE heads SET n_pos = n_pos - 1, n_zero = n_zero + 1, balanced = false
                       WHERE (layer, head) IN ((7, 3), (2, 8))""")
    with duckdb.connect(str(path), read_only=True) as con:
        export(con, folder / "out")
    return folder / "out"


def view_frame(con, view: str) -> pl.DataFrame:
    """A view as polars, with decimals as floats (as CSV and, for DuckDB's HUGEINT sums, Parquet readers see them)."""
    return con.sql(f"select * from {view}").pl().with_columns(pl.col(pl.Decimal).cast(pl.Float64))


def test_export_writes_every_file(exported):
    out, paths = exported
    assert {p.name for p in paths} == EXPECTED
    assert {p.name for p in out.iterdir()} == EXPECTED
    assert all(p.parent == out and p.stat().st_size > 0 for p in paths)


def test_index_lists_every_file(exported):
    out, _ = exported
    index = pl.read_csv(out / "index.csv")
    assert set(index["file"]) == EXPECTED - {"index.csv"} | NOT_DRAWN_ON_DEMO
    assert index["description"].str.len_chars().min() > 10
    not_drawn = dict(index.filter(pl.col("description").str.starts_with(NOT_WRITTEN)).select("file", "description")
                     .iter_rows())
    assert set(not_drawn) == NOT_DRAWN_ON_DEMO  # listed, and why
    assert "no training checkpoints" in not_drawn["training_dynamics.png"]
    assert "headforms behaviour" in not_drawn["behaviour_self_score.png"]
    tables = index.filter(pl.col("kind").str.starts_with("table"))
    assert {(f.rsplit(".", 1)[0], v) for f, v in tables.select("file", "source").rows()} == \
           {(stem, view) for stem, (view, _) in TABLES.items()}


@pytest.mark.parametrize("stem", TABLES)
def test_csv_round_trips_to_the_view(exported, demo_con, stem):
    out, _ = exported
    expected = view_frame(demo_con, TABLES[stem][0])
    expected = expected.with_columns(pl.col(pl.List(pl.Utf8)).list.join(LIST_SEPARATOR))
    csv = pl.read_csv(out / f"{stem}.csv", infer_schema_length=None)
    assert csv.columns == expected.columns
    assert csv.height == expected.height
    assert (expected.height > 0) == (stem not in EMPTY_ON_DEMO)
    assert_frame_equal(csv, expected, check_dtypes=False, abs_tol=1e-12, rel_tol=0)


@pytest.mark.parametrize("stem", TABLES)
def test_parquet_is_the_view(exported, demo_con, stem):
    out, _ = exported
    parquet = pl.read_parquet(out / f"{stem}.parquet")
    assert_frame_equal(parquet, view_frame(demo_con, TABLES[stem][0]), check_dtypes=False, abs_tol=0, rel_tol=0)


def test_key_values(exported):
    """Spot checks of what the paper reads off the files."""
    out, _ = exported
    parity = pl.read_csv(out / "table2_parity.csv")
    assert parity.select("model", "heads").rows() == [("SmolLM2-135M", 270), ("all-MiniLM-L6-v2", 72)]
    sums = parity.select(pl.sum_horizontal("pct_type_I_plus", "pct_type_II", "pct_type_I_minus"))
    assert ((sums.to_series() - 100).abs() <= 0.15).all()
    signature = pl.read_csv(out / "observation1_signature_check.csv")
    assert signature["heads"].to_list() == signature["balanced"].to_list() == [270, 72]
    assert pl.read_csv(out / "figure12_parity_by_layer.csv").height == 36
    assert pl.read_csv(out / "spectral_geometry.csv").height == 342


def assert_real_image(path):
    """A PNG of readable size with actual content: not blank, not one flat colour."""
    assert path.stat().st_size > 20_000
    pixels = image.imread(path)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) >= 250 and max(pixels.shape[:2]) >= 600
    rgb = pixels[..., :3]
    assert rgb.var() > 0
    assert (rgb.min(axis=2) < 0.9).mean() > 0.02   # more than 2% of the pixels are not near-white


@pytest.mark.parametrize("name", sorted(set(FIGURES) - NOT_DRAWN_ON_DEMO))
def test_figure_is_a_real_image(exported, name):
    out, _ = exported
    assert_real_image(out / name)


def test_one_model_export(one_model_export):
    """One model (single-panel figures) and listed exceptions, joined into one CSV field, kept as a list in Parquet."""
    out = one_model_export
    assert {p.name for p in out.iterdir()} == EXPECTED
    csv = pl.read_csv(out / "observation1_signature_check.csv")
    assert csv.rows() == [("SmolLM2-135M", "whole", 270, 268, 2, f"L2.H8: 63+/64-{LIST_SEPARATOR}L7.H3: 63+/64-",
                           "W_Q and W_K rows share directions (2 heads)")]  # a zero eigenvalue set by hand, rank(L) = n
    parquet = pl.read_parquet(out / "observation1_signature_check.parquet")
    assert parquet["exception_heads"].to_list() == [["L2.H8: 63+/64-", "L7.H3: 63+/64-"]]
    for name in set(FIGURES) - NOT_DRAWN_ON_DEMO:
        assert_real_image(out / name)
    assert np.array_equal(pl.read_csv(out / "table2_parity.csv")["heads"].to_numpy(), [270])


@pytest.fixture(scope="module")
def latex(demo_db, tmp_path_factory):
    """The demo warehouse exported as LaTeX only."""
    out = tmp_path_factory.mktemp("latex") / "paper"
    with duckdb.connect(str(demo_db), read_only=True) as con:
        paths = export(con, out, formats=("latex",))
    return out, paths


def test_latex_writes_a_file_per_table_and_one_inputting_them(latex):
    out, paths = latex
    tables = {f"{stem}.tex" for stem in TABLES if stem not in EMPTY_ON_DEMO | set(LATEX_LEFT_OUT)}
    assert {p.name for p in paths} == tables | {LATEX_ALL, "index.csv"} | set(FIGURES) - NOT_DRAWN_ON_DEMO
    assert [p.name for p in out.glob("*.csv")] == ["index.csv"] and not list(out.glob("*.parquet"))
    inputs = re.findall(r"^\\input\{\\headformsdir (\w+)\}$", (out / LATEX_ALL).read_text(), re.M)
    assert {f"{stem}.tex" for stem in inputs} == tables
    index = pl.read_csv(out / "index.csv")
    skipped = set(index.filter(pl.col("description").str.starts_with(NOT_WRITTEN))["file"])
    assert skipped == {f"{stem}.tex" for stem in EMPTY_ON_DEMO | set(LATEX_LEFT_OUT)} | NOT_DRAWN_ON_DEMO
    for path in (out / f"{stem}.tex" for stem in inputs):
        text = path.read_text()
        assert "\\toprule" in text and "\\midrule" in text and "\\bottomrule" in text  # booktabs


def _cells(tex: str) -> list[list[str]]:
    """The body rows of a booktabs table, cell by cell, LaTeX's escapes undone."""
    body = tex.split("\\midrule", 1)[1].split("\\bottomrule", 1)[0]
    return [[cell.strip().replace("\\_", "_") for cell in line.rstrip(" \\").split(" & ")]
            for line in body.splitlines() if " & " in line]


def _numbers(cell: str) -> list[tuple[float, int]]:
    """Each number of a cell with its decimals as printed."""
    return [(float(x), len(x.partition(".")[2])) for x in re.findall(r"-?\d+(?:\.\d+)?", cell)]


def test_latex_numbers_keep_the_digits_that_tell_them_apart(latex, demo_con):
    """Each printed number rounds from the view's value (and the layer bootstrap's interval), and values that
    differ, down a column or inside one value's interval, print differently: the mode ratio 1.0049 of SmolLM2 is not
    a 1.00 beside an interval of 1.00."""
    out, _ = latex
    view = demo_con.sql("SELECT * FROM fit_ratios_by_model ORDER BY model, part").pl()
    bounds = dict(((m, f), (lo, hi)) for m, f, lo, hi in demo_con.sql(
        "SELECT model, figure, layer_low, layer_high FROM model_intervals WHERE view = 'fit_ratios_by_model'")
        .fetchall())
    rows = _cells((out / "observations7to9_fit_ratios_by_model.tex").read_text())
    header = ["model", "part", "retained", "excluded", "median_mode_ratio", "median_shape_ratio", "median_correlation",
              "median_geometric_mean_error"]
    assert [row[0] for row in rows] == view["model"].to_list()
    for column in header[4:]:
        printed = [_numbers(row[header.index(column)]) for row in rows]
        for cell, model, true in zip(printed, view["model"], view[column]):
            exact = (true, *bounds[(model, column)])
            for (shown, places), real in zip(cell, exact):
                assert abs(shown - real) <= 0.5 * 10 ** -places + 1e-12, (column, shown, real)
            assert len({shown for shown, _ in cell}) == len(set(exact)) == 3
        assert len({cell[0][0] for cell in printed}) == len(set(view[column]))
    mode = rows[view["model"].to_list().index("SmolLM2-135M")][header.index("median_mode_ratio")]
    assert _numbers(mode)[0][0] != 1.0 and mode.count("[") == 1


def test_latex_compiles_with_booktabs(latex, tmp_path):
    """The tables input into a document compile with pdflatex (texlive-latex-recommended: booktabs, caption;
    longtable, array and graphicx from texlive-latex-base), no line wider than the text, run from another folder
    with headformsdir set as tables.tex's header says."""
    if not shutil.which("pdflatex"):
        pytest.fail("no pdflatex on this machine: install Debian's texlive-latex-base and texlive-latex-recommended")
    out, _ = latex
    (tmp_path / "paper.tex").write_text(
        f"\\documentclass{{article}}\n\\usepackage{{{LATEX_PACKAGES}}}\n\\begin{{document}}\n"
        f"\\newcommand{{\\headformsdir}}{{{out}/}}\\input{{{out}/{LATEX_ALL}}}\n\\end{{document}}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "paper.pdf").stat().st_size > 10_000
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert "Undefined control sequence" not in log and "Missing character" not in log
    # every table fits the text width: a float scaled down to it, a longtable's columns wrapped
    assert re.findall(r"Overfull \\hbox.*", log) == []


def test_cli_export_format_latex(demo_db, tmp_path):
    """`headforms export --format latex` writes the LaTeX tables and no CSV or Parquet; an unknown format is one
    line naming the choices, and nothing is written."""
    from click.testing import CliRunner

    from headforms import cli

    result = CliRunner().invoke(cli.main, ["export", "--db", str(demo_db), "--out", str(tmp_path / "x"),
                                           "--format", "latex"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x" / LATEX_ALL).exists() and (tmp_path / "x" / "table2_parity.tex").exists()
    assert not list((tmp_path / "x").glob("*.parquet")) and [p.name for p in (tmp_path / "x").glob("*.csv")] == \
        ["index.csv"]
    result = CliRunner().invoke(cli.main, ["export", "--db", str(demo_db), "--out", str(tmp_path / "y"),
                                           "--format", "pdf"])
    assert result.exit_code != 0 and "'pdf' is not one of 'csv', 'parquet', 'latex'" in result.output
    assert not (tmp_path / "y").exists()
