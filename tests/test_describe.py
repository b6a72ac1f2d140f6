"""The warehouse describes itself: every table, view and column carries its comment (schema.sql's comments, each
view's header) in DuckDB's catalog, and `headforms describe` lists them with row counts and columns."""
import duckdb
import polars as pl
import pytest
from click.testing import CliRunner

from headforms import api, cli
from headforms.warehouse.storing.comments import comment_statements
from headforms.warehouse.storing.store import SCHEMA, VIEWS, connect, create_schema


def catalog(con, what: str, params=None) -> list[tuple]:
    return con.execute(what, params).fetchall()


def test_every_table_and_view_of_the_demo_is_described_and_its_documented_columns_carry_their_text(demo_db):
    """Every table and view carries its comment, stored and on a read-only connection's views; every column that
    schema.sql or a view's header documents (or a table column of the same name a view passes through) carries
    that text in duckdb_columns()."""
    from headforms.warehouse.storing.comments import described, table_comments

    docs = described(SCHEMA, VIEWS)
    by_name = {}
    for _, (_, cols) in table_comments(SCHEMA).items():
        for column, text in cols.items():
            by_name.setdefault(column, text)
    for read_only in (True, False):
        con = connect(demo_db, read_only=True) if read_only else duckdb.connect(str(demo_db), read_only=True)
        try:
            bare = catalog(con, "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND comment IS NULL "
                                "UNION ALL SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' "
                                "AND comment IS NULL")
            columns = catalog(con, "SELECT table_name, column_name, comment FROM duckdb_columns() "
                                   "WHERE schema_name = 'main'")
        finally:
            con.close()
        assert bare == []
        documented = 0
        for name, column, comment in columns:
            if name in docs:
                want = docs[name][1].get(column) or by_name.get(column)
                assert comment == (want or None), (name, column)
                documented += bool(want)
        assert documented > 50


def undocumented(con, kind: str) -> list[str]:
    """`name.column` of every column of a table (`kind` 'table': duckdb_tables()) or a view ('view': duckdb_views(),
    DuckDB's own internal ones left out) of schema main whose comment is NULL or empty, stored or temporary alike."""
    objects = ("SELECT database_name, table_name AS name FROM duckdb_tables() WHERE schema_name = 'main'"
               if kind == "table" else
               "SELECT database_name, view_name AS name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'")
    return [f"{name}.{column}" for name, column in catalog(con, f"""
        SELECT DISTINCT c.table_name, c.column_name FROM duckdb_columns() c
        JOIN ({objects}) o ON o.database_name = c.database_name AND o.name = c.table_name
        WHERE c.schema_name = 'main' AND (c.comment IS NULL OR trim(c.comment) = '')
        ORDER BY ALL""")]


@pytest.mark.parametrize("warehouse", ["demo", "empty"])
def test_every_column_of_every_table_and_view_is_documented(warehouse, request, tmp_path):
    """No column of a table or view lacks its comment, in the demo warehouse and in a new empty one, on a read-only
    connection (its views this checkout's): a table column's is the comment ending its line in schema.sql, a view
    column's its `-- Columns:` line in sql/ (or the comment of a table column of the same name it passes through)."""
    if warehouse == "demo":
        path = request.getfixturevalue("demo_db")
    else:
        path = tmp_path / "empty.duckdb"
        with duckdb.connect(str(path)) as con:
            create_schema(con)
    con = connect(path, read_only=True)
    try:
        missing = {kind: undocumented(con, kind) for kind in ("table", "view")}
        (tables,), = catalog(con, "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main'")
        (views,), = catalog(con, "SELECT count(*) FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'")
    finally:
        con.close()
    assert tables >= 14 and views >= len(list(VIEWS.glob("*.sql")))
    assert not missing["table"] and not missing["view"], (
        f"undocumented columns in the {warehouse} warehouse: {len(missing['table'])} of tables (a column's comment "
        f"ends its line in schema.sql): {', '.join(missing['table']) or 'none'}; {len(missing['view'])} of views "
        f"(a `-- Columns:` line in the view's sql/ file): {', '.join(missing['view']) or 'none'}")


def test_comments_are_written_once(tmp_path):
    """A warehouse described already gets no COMMENT ON statement: a rerun writes nothing."""
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    create_schema(con)
    assert comment_statements(con, SCHEMA, VIEWS) == []
    (count,), = catalog(con, "SELECT count(*) FROM duckdb_columns() WHERE schema_name = 'main' AND comment IS NOT NULL")
    assert count > 50
    con.close()


def test_describe_lists_tables_and_views_with_rows_and_columns(tiny_rope_db):
    listed = api.describe(tiny_rope_db)
    with duckdb.connect(str(tiny_rope_db), read_only=True) as con:
        for row in listed.iter_rows(named=True):
            (rows,), = catalog(con, f'SELECT count(*) FROM "{row["name"]}"')
            names = [c for (c,) in catalog(con, "SELECT column_name FROM duckdb_columns() WHERE table_name = ? "
                                                "ORDER BY column_index", [row["name"]])]
            assert row["rows"] == rows and row["columns"] == ", ".join(names) and row["description"]
    assert {"heads", "eigenvalues", "fits", "models"} <= set(listed.filter(pl.col("kind") == "table")["name"])
    assert {f.stem for f in VIEWS.glob("*.sql")} <= set(listed.filter(pl.col("kind") == "view")["name"])
    heads = api.describe(tiny_rope_db, "heads")
    assert heads.columns == ["column", "type", "description"]
    assert heads.filter(pl.col("column") == "symmetric_energy")["type"].to_list() == ["DOUBLE"]


def test_describe_on_the_command_line(tiny_rope_db):
    run = CliRunner().invoke(cli.main, ["describe", "--db", str(tiny_rope_db)])
    assert run.exit_code == 0 and "parity_by_model" in run.output and "shape:" not in run.output
    one = CliRunner().invoke(cli.main, ["describe", "parity_by_model", "--db", str(tiny_rope_db), "--format", "csv"])
    assert one.exit_code == 0 and one.output.splitlines()[0] == "column,type,description"
    missing = CliRunner().invoke(cli.main, ["describe", "head", "--db", str(tiny_rope_db)])
    assert missing.exit_code == 1 and missing.output == (
        "Error: no table or view 'head' in the warehouse: `headforms describe` lists them\n")
