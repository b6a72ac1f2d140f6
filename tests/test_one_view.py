"""`headforms sql` sees each view once in information_schema, and this version's views still answer on a read-only
warehouse written by an older version (stale, missing views and missing columns)."""
import shutil

import duckdb
import pytest
from click.testing import CliRunner

from headforms import cli
from headforms.warehouse.storing.store import VIEWS
from tests.test_gguf import write_gguf

DUPLICATES = "select table_name, count(*) from information_schema.tables group by 1 having count(*) > 1"


def sql(db, query: str, fmt: str = "csv"):
    result = CliRunner().invoke(cli.main, ["sql", query, "--db", str(db), "--format", fmt])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def current(tmp_path_factory):
    """A warehouse of one tiny RoPE model written by this version."""
    folder = tmp_path_factory.mktemp("views")
    write_gguf(folder / "tiny.gguf", n_layers=2, n_heads=4, n_kv_heads=2)
    db = folder / "w.duckdb"
    result = CliRunner().invoke(cli.main, ["extract", str(folder / "tiny.gguf"), "--db", str(db), "--resamples", "5"])
    assert result.exit_code == 0, result.output
    return db


def test_each_view_is_listed_once(current):
    assert sql(current, DUPLICATES) == ["table_name,count_star()"]
    views = sql(current, "select table_name from information_schema.tables where table_type = 'VIEW' order by 1")
    assert views[1:] == sorted(file.stem for file in VIEWS.glob("*.sql"))


def test_an_extraction_stores_every_view_in_the_file(current):
    """Any DuckDB client (not only headforms, which adds temporary views) finds every view of sql/ in the file: the
    extraction creates them while its first layers are computed."""
    with duckdb.connect(str(current), read_only=True) as con:
        stored = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal AND NOT temporary "
                             "ORDER BY 1").fetchall()
        assert [name for (name,) in stored] == sorted(file.stem for file in VIEWS.glob("*.sql"))
        assert con.execute("SELECT count(*) FROM model_medians").fetchone() == (1,)


def test_views_answer_on_a_read_only_warehouse_of_an_older_version(current, tmp_path):
    """An older version's file: a stale parity_by_model, no signature_check, models without bytes_fetched. Opened
    read-only, the current definitions answer, equal to the current warehouse's; only the stale view and the
    table lacking a column are listed twice (the file's own, and this version's temporary one)."""
    old = tmp_path / "old.duckdb"
    shutil.copy(current, old)
    with duckdb.connect(str(old)) as con:
        con.execute("CREATE OR REPLACE VIEW parity_by_model AS SELECT 1 AS stale")
        con.execute("DROP VIEW signature_check")
        con.execute("ALTER TABLE models DROP COLUMN bytes_fetched")
    old.chmod(0o444)
    for view in ("parity_by_model", "signature_check", "model_medians"):
        query = f"select * from {view} order by all"
        assert sql(old, query, "json") == sql(current, query, "json")
    assert sql(old, "select bytes_fetched from models") == ["bytes_fetched", ""]
    assert sorted(sql(old, DUPLICATES)[1:]) == ["models,2", "parity_by_model,2"]
