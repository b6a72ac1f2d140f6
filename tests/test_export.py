"""Export of the demo warehouse: every file is written and indexed, tables round-trip, figures are real images."""
import shutil

import duckdb
import numpy as np
import polars as pl
import pytest
from matplotlib import image
from polars.testing import assert_frame_equal

from headforms.warehouse.publishing.export import LIST_SEPARATOR, TABLES, export
from headforms.warehouse.publishing.figures import FIGURES

EXPECTED = ({f"{stem}.{ext}" for stem in TABLES for ext in ("csv", "parquet")} | set(FIGURES) | {"index.csv"})
# Exported empty from the demo warehouse, which holds no training checkpoints (the figure says so);
# tests/test_dynamics.py exports them from checkpoints.
EMPTY_ON_DEMO = {"training_dynamics"}
# the demo fixture runs extract only, not behaviour (tests/test_behaviour.py fills and checks these)
EMPTY_ON_DEMO |= {"behaviour_by_parity", "behaviour_correlations", "behaviour_self_score"}


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
        for table in ("heads", "eigenvalues", "fits", "layers", "models", "intervals", "head_types"):
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
    assert set(index["file"]) == EXPECTED - {"index.csv"}
    assert index["description"].str.len_chars().min() > 10
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


def assert_real_image(path, *, demo: bool = False):
    """A PNG of readable size with actual content: not blank, not one flat colour (drawn from the demo,
    a figure of EMPTY_ON_DEMO holds its message only)."""
    if demo and path.stem in EMPTY_ON_DEMO:
        assert (image.imread(path)[..., :3].min(axis=2) < 0.5).mean() > 0.001
        return
    assert path.stat().st_size > 20_000
    pixels = image.imread(path)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) >= 250 and max(pixels.shape[:2]) >= 600
    rgb = pixels[..., :3]
    assert rgb.var() > 0
    assert (rgb.min(axis=2) < 0.9).mean() > 0.02   # more than 2% of the pixels are not near-white


@pytest.mark.parametrize("name", FIGURES)
def test_figure_is_a_real_image(exported, name):
    out, _ = exported
    assert_real_image(out / name, demo=True)


def test_one_model_export(one_model_export):
    """One model (single-panel figures) and listed exceptions, joined into one CSV field, kept as a list in Parquet."""
    out = one_model_export
    assert {p.name for p in out.iterdir()} == EXPECTED
    csv = pl.read_csv(out / "observation1_signature_check.csv")
    assert csv.rows() == [("SmolLM2-135M", 270, 268, 2, f"L2.H8: 63+/64-{LIST_SEPARATOR}L7.H3: 63+/64-")]
    parquet = pl.read_parquet(out / "observation1_signature_check.parquet")
    assert parquet["exception_heads"].to_list() == [["L2.H8: 63+/64-", "L7.H3: 63+/64-"]]
    for name in FIGURES:
        assert_real_image(out / name, demo=True)
    assert np.array_equal(pl.read_csv(out / "table2_parity.csv")["heads"].to_numpy(), [270])
