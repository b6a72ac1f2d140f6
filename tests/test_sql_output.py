"""What `headforms sql` (and status, cache, --plan) print: a table of whole column names with a row limit and a
footer, CSV with nested columns as JSON text, JSON, Markdown and Parquet; DuckDB's words whole; one statement at
a time; a --db that is no DuckDB file refused before anything is made beside it."""
import csv
import io
import json

import duckdb
import polars as pl
from click.testing import CliRunner

from headforms import cli


def sql(db, query, *options):
    return CliRunner().invoke(cli.main, ["sql", query, "--db", str(db), *options])


def test_a_table_shows_whole_column_names_the_first_rows_and_says_how_many_were_left_out(tiny_rope_db):
    with duckdb.connect(str(tiny_rope_db), read_only=True) as con:
        (total,), = con.execute("select count(*) from eigenvalues").fetchall()
    result = sql(tiny_rope_db, "select model, layer, head, spectrum, idx, value from eigenvalues")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "shape:" not in result.output and "f64" not in result.output  # no polars debug rows
    header = lines[1].split("┆")
    assert [h.strip(" │") for h in header] == ["model", "layer", "head", "spectrum", "idx", "value"]
    rows = [line for line in lines if line.startswith("│")][1:]
    assert len(rows) == 40
    assert lines[-1] == (f"{total} rows, the first 40 shown ({total - 40} left out: --limit N shows more, --all "
                         "every row)")
    assert len([l for l in sql(tiny_rope_db, "select * from eigenvalues", "--limit", "5").output.splitlines()
                if l.startswith("│")]) == 6
    every = sql(tiny_rope_db, "select value from eigenvalues", "--all").output.splitlines()
    assert len([l for l in every if l.startswith("│")]) == total + 1 and every[-1] == f"{total} rows"


def test_csv_writes_nested_columns_as_json_text(tiny_rope_db):
    result = sql(tiny_rope_db, "select * from signature_check", "--format", "csv")
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(tiny_rope_db), read_only=True) as con:
        expected = con.sql("select * from signature_check").pl()
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert len(rows) == expected.height > 0
    nested = [name for name, dtype in expected.schema.items() if dtype.is_nested()]
    assert nested
    for row, want in zip(rows, expected.iter_rows(named=True)):
        for name in nested:
            assert json.loads(row[name]) == want[name]


def test_json_markdown_and_parquet_hold_the_same_rows(tiny_rope_db, tmp_path):
    query = "select model, layer, head, parity, pairing from heads order by layer, head"
    with duckdb.connect(str(tiny_rope_db), read_only=True) as con:
        expected = con.sql(query).pl()
    assert pl.DataFrame(json.loads(sql(tiny_rope_db, query, "--format", "json").output)).equals(expected)
    markdown = sql(tiny_rope_db, query, "--format", "markdown", "--all").output.splitlines()
    assert markdown[0].replace(" ", "") == "|model|layer|head|parity|pairing|" and len(markdown) == expected.height + 2
    out = tmp_path / "heads.parquet"
    result = sql(tiny_rope_db, query, "--format", "parquet", "--out", str(out))
    assert result.exit_code == 0 and result.output == f"{expected.height} rows written to {out}\n"
    assert pl.read_parquet(out).equals(expected)
    refused = sql(tiny_rope_db, query, "--format", "parquet")
    assert refused.exit_code == 2 and "--out FILE" in refused.output


def test_duckdb_s_words_come_whole_on_one_line(tiny_rope_db):
    result = sql(tiny_rope_db, "select * from head")
    assert result.exit_code == 1
    assert result.output == ('Error: Catalog Error: Table with name head does not exist! Did you mean "heads"?\n')


def test_several_statements_are_refused_not_dropped(tiny_rope_db):
    result = sql(tiny_rope_db, "select 1 as a; select 2 as b")
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith("Error: the query holds 2 statements") and "traceback" not in result.output
    assert sql(tiny_rope_db, "select 1 as a;").exit_code == 0  # a closing semicolon is one statement


def test_a_db_that_is_not_a_duckdb_file_is_refused_before_a_lock_is_made(tmp_path):
    table = tmp_path / "t.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(table)
    text = tmp_path / "notes.csv"
    text.write_text("a,b\n1,2\n")
    before = sorted(tmp_path.iterdir())
    for path, kind in ((table, "is a Parquet file"), (text, "is not a DuckDB database")):
        for command in (["sql", "select 1"], ["status"], ["extract", "demo"]):
            result = CliRunner().invoke(cli.main, [*command, "--db", str(path)])
            assert result.exit_code == 1 and result.output.startswith(f"Error: {path} {kind}"), result.output
            assert result.output.count("\n") == 1
    assert sorted(tmp_path.iterdir()) == before  # no .lock, .readers or .wal beside them
    assert pl.read_parquet(table)["a"].to_list() == [1]


def test_status_and_cache_print_the_same_tables(tiny_rope_db):
    status = CliRunner().invoke(cli.main, ["status", "--db", str(tiny_rope_db)])
    assert status.exit_code == 0 and "shape:" not in status.output and status.output.splitlines()[-1] == "1 row"
    assert "architecture" in status.output.splitlines()[1]
    as_csv = CliRunner().invoke(cli.main, ["status", "--db", str(tiny_rope_db), "--format", "csv"]).output
    assert list(csv.DictReader(io.StringIO(as_csv)))[0]["heads"] == "18"
    cache = CliRunner().invoke(cli.main, ["cache"])
    assert cache.exit_code == 0 and "shape:" not in cache.output
