"""The Python API and the installed namespace: one package, `headforms`, and functions returning polars frames."""
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import headforms
from headforms import cli
from tests.dense import dense_reference
from tests.test_gguf import write_gguf

ROOT = Path(__file__).resolve().parent.parent


def test_installed_namespace_is_one_package(tmp_path):
    """From a folder outside the checkout only `headforms` imports; cli, compute, extract, sql... do not."""
    probe = ("import importlib, json\n"
             "out = {}\n"
             "for name in ('cli', 'compute', 'extract', 'warehouse', 'sql', 'api', 'headforms', 'headforms.compute.spectra'):\n"
             "    try:\n        importlib.import_module(name); out[name] = True\n"
             "    except ImportError:\n        out[name] = False\n"
             "import headforms\n"
             "out['plain'] = not callable(headforms.extract) and hasattr(headforms.extract, 'open_checkpoint')\n"
             "print(json.dumps(out))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ('{"cli": false, "compute": false, "extract": false, "warehouse": false, '
                                     '"sql": false, "api": false, "headforms": true, '
                                     '"headforms.compute.spectra": true, "plain": true}')


def test_wheel_holds_only_the_headforms_package(tmp_path):
    """`pip wheel .` of a copy of the checkout (setuptools builds in the tree it is given)."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "*.duckdb", "export", "report"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(source)], check=True, capture_output=True)
    wheel, = tmp_path.glob("headforms-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"headforms", next(t for t in tops if t.endswith(".dist-info"))}
    for expected in ("headforms/__init__.py", "headforms/cli.py", "headforms/api.py", "headforms/compute/spectra.py",
                     "headforms/extract/layouts/table.py", "headforms/warehouse/storing/schema.sql", "headforms/sql/signature_check.sql"):
        assert expected in names
    assert not any(name.startswith("headforms/tests") for name in names)
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "headforms = headforms.cli:run" in entry


@pytest.fixture(scope="module")
def tiny_db(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api")
    write_gguf(folder / "tiny.gguf")
    db = folder / "api.duckdb"
    start = time.perf_counter()
    summary = headforms.extract_models([str(folder / "tiny.gguf")], db=db, seed=3)
    assert 0 < summary["seconds"][0] <= time.perf_counter() - start  # the model's own time, within the call's
    return db, summary


def test_extract_returns_a_summary_and_fills_the_warehouse(tiny_db):
    db, summary = tiny_db
    with duckdb.connect(str(db), read_only=True) as con:
        models = con.sql("SELECT model, n_layers, n_heads, baseline_seed, revision FROM models").pl()
        (stored,), = con.execute("SELECT count(*) FROM heads").fetchall()
    assert summary.select("model", "status", "layers", "heads").rows() == [
        (models["model"][0], "extracted", models["n_layers"][0], stored)]
    assert models["baseline_seed"][0] == 3 and summary["revision"][0] == models["revision"][0]
    again = headforms.extract_models(str(Path(db).parent / "tiny.gguf"), db=db, seed=3)
    assert again.select("status", "layers", "heads").rows() == [("up to date", 0, 0)]


def test_extract_rejects_unknown_options(tiny_db):
    with pytest.raises(TypeError, match="unknown options: parity"):
        headforms.extract_models("demo", db=tiny_db[0], parity=0.1)


def test_frames_equal_the_warehouse_rows(tiny_db):
    db, _ = tiny_db
    with duckdb.connect(str(db), read_only=True) as con:
        heads = con.sql("SELECT * FROM heads ORDER BY model, layer, head").pl()
        eig = con.sql("SELECT spectrum, idx, value, imag FROM eigenvalues WHERE layer = 1 AND head = 2 "
                      "ORDER BY spectrum, idx").pl()
    assert_frame_equal(headforms.heads(db), heads)
    assert_frame_equal(headforms.heads(db, model=heads["model"][0]), heads)
    assert headforms.heads(db, model="nope").height == 0
    assert_frame_equal(headforms.spectra(db, heads["model"][0], 1, 2), eig)
    assert set(eig["spectrum"]) == {"S", "S_pos", "S_neg", "T_sv", "T_sigma", "L", "L_sv"}


def test_table_is_the_view_as_the_cli_prints_it(tiny_db):
    db, _ = tiny_db
    frame = headforms.table(db, "parity_by_model")
    printed = cli_csv(db, "select * from parity_by_model")
    assert_frame_equal(frame, printed, check_dtypes=False)
    with pytest.raises(ValueError, match="no table or view 'nope'"):
        headforms.table(db, "nope")


def cli_csv(db, sql):
    from click.testing import CliRunner
    import io

    result = CliRunner().invoke(cli.main, ["sql", sql, "--db", str(db), "--format", "csv"])
    assert result.exit_code == 0, result.output
    return pl.read_csv(io.StringIO(result.output))


def test_connect_is_read_only_with_views(tiny_db):
    con = headforms.connect(tiny_db[0])
    try:
        assert con.execute("SELECT count(*) FROM signature_check").fetchall() == [(1,)]
        with pytest.raises(duckdb.Error, match="read-only"):
            con.execute("DELETE FROM heads")
    finally:
        con.close()


def test_analyse_matches_dense_numpy():
    """Every statistic of analyse() equals the dense N x N computation of tests/dense.py."""
    rng = np.random.default_rng(7)
    w_q, w_k = rng.normal(size=(4, 5, 24)), rng.normal(size=(2, 5, 24))
    result = headforms.analyse(w_q, w_k)
    assert result.heads["kv_head"].to_list() == [0, 0, 1, 1]
    for row in result.heads.iter_rows(named=True):
        ref = dense_reference(w_k[row["kv_head"]].T @ w_q[row["head"]], 5)
        for name, value in ref.items():
            assert row[name] == pytest.approx(value, rel=1e-8, abs=1e-10), name
    assert set(result.fits["family"]) == {"gamma", "lognormal", "weibull", "gengamma"}
    assert result.fits.height == 4 * 4 * 4


def test_analyse_of_one_head_torch_and_lists():
    import torch

    rng = np.random.default_rng(1)
    w_q, w_k = rng.normal(size=(3, 12)), rng.normal(size=(3, 12))
    base = headforms.analyse(w_q, w_k).heads
    assert_frame_equal(headforms.analyse(torch.tensor(w_q, dtype=torch.float32).double(), w_k.tolist()).heads, base)
    assert base.height == 1
    with pytest.raises(ValueError, match="must be \\(heads, n, N\\)"):
        headforms.analyse(w_q, w_k[:, :5])
    with pytest.raises(ValueError, match="finite"):
        headforms.analyse(np.full((3, 12), np.nan), w_k)


def test_analyse_equals_what_extract_stored(tiny_db):
    """The API on a layer's weights in memory gives the rows extraction stored (same seed and layer)."""
    db, _ = tiny_db
    ckpt = headforms.extract.open_checkpoint(str(Path(db).parent / "tiny.gguf"))
    w_q, w_k = ckpt.read_layer(1)
    result = headforms.analyse(w_q, w_k, kv_index=ckpt.spec.kv_index, seed=3, layer=1, model=ckpt.name)
    stored = headforms.heads(db).filter(pl.col("layer") == 1)
    assert stored["sink_logit"].null_count() == stored.height  # a sink is read beside the maps (gpt-oss), not from them
    stored = stored.drop("sink_logit")
    assert_frame_equal(result.heads.select(stored.columns), stored)
    for name in ("eigenvalues", "fits"):  # the same columns, by name and type, and the same rows
        stored = headforms.table(db, name).filter(pl.col("layer") == 1)
        mine = getattr(result, name)
        assert mine.schema == stored.schema, name
        assert_frame_equal(mine.sort(mine.columns[:5]), stored.sort(stored.columns[:5]))


def test_balanced_needs_n_positive_and_n_negative_eigenvalues():
    """W_Q = W_K makes S = W^T W positive semidefinite: n positive eigenvalues and none negative, so the head is
    not balanced; a generic head has n of each."""
    rng = np.random.default_rng(4)
    w = rng.normal(size=(1, 4, 16))
    same = headforms.analyse(w, w).heads
    assert same.select("n_pos", "n_neg", "balanced").row(0) == (4, 0, False)
    generic = headforms.analyse(w, rng.normal(size=(1, 4, 16))).heads
    assert generic.select("n_pos", "n_neg", "balanced").row(0) == (4, 4, True)


def test_zero_heads_keep_the_tables_types():
    """Heads whose L is 0 have no parity or pairing (NULL), yet analyse() gives the same column types as for
    any other layer, so frames of different layers concatenate."""
    zero = headforms.analyse(np.zeros((2, 4, 16)), np.zeros((1, 4, 16)))
    other = headforms.analyse(np.random.default_rng(0).normal(size=(2, 4, 16)), np.ones((1, 4, 16)))
    assert zero.heads["parity"].to_list() == [None, None]
    for name in ("heads", "eigenvalues", "fits"):
        assert getattr(zero, name).schema == getattr(other, name).schema, name


def test_subpackages_load_on_first_use():
    """`headforms.compute`, `.warehouse` and `.cli` load on first use (the package's __getattr__); any other name is
    an AttributeError that names it."""
    import importlib

    for name in ("compute", "warehouse", "cli"):
        assert headforms.__getattr__(name) is importlib.import_module(f"headforms.{name}")
    with pytest.raises(AttributeError, match="^module 'headforms' has no attribute 'nothing'$"):
        headforms.__getattr__("nothing")


def test_plan_reads_the_tower_asked_for(tmp_path):
    """plan(tower=...) counts that tower's heads (whisper: 4 per encoder layer, 2 per decoder layer), and its columns
    keep their types when no model has a warning (an all-null column would otherwise have no type)."""
    from tests import tiny_models as tm

    folder = tm.save(tm.build("whisper_encoder"), tmp_path / "whisper")
    encoder, decoder = headforms.plan(str(folder)), headforms.plan(str(folder), tower="decoder")
    assert (encoder["model"][0], encoder["heads"][0]) == ("whisper", 2 * 4)
    assert decoder["heads"][0] == 2 * 2
    assert dict(decoder.schema) == {"model": pl.Utf8, "source": pl.Utf8, "heads": pl.Int64, "qk_bytes": pl.Int64,
                                    "checkpoint_bytes": pl.Int64, "header_bytes_fetched": pl.Int64,
                                    "warning": pl.Utf8}


def test_the_tool_version_without_package_metadata_is_a_canonical_version_below_every_release(monkeypatch):
    """Run from a checkout that was never installed, models.tool_version is still a PEP 440 version, written in its
    canonical form (as `importlib.metadata` gives an installed one) and older than any release."""
    from importlib.metadata import PackageNotFoundError

    from packaging.version import Version

    from headforms.warehouse.running import load

    assert Version(load.tool_version()) >= Version("0.1")  # installed here: the package's own version

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(load, "version", missing)
    unknown = load.tool_version()
    assert str(Version(unknown)) == unknown and Version(unknown) < Version("0.0.1")
