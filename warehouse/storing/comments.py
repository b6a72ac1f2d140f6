"""The warehouse describes itself: a comment on every table, view and column (DuckDB's COMMENT ON), so that
`duckdb_tables()`, `duckdb_views()`, `duckdb_columns()`, any DuckDB client and `headforms describe` show them.

One source for each: a table's comment is the comment block above its CREATE TABLE in schema.sql, a column's the
comment at the end of its line there (or of its ALTER TABLE ... ADD COLUMN line); a view's comment is its file's
header in sql/, its columns' are the header's `Columns:` lines (`--   name: what it is`), and a column a view
passes through from a table under the same name has that table column's comment.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \(")
_COLUMN = re.compile(r"^\s+(\w+)\s+[A-Z][A-Z0-9\[\]]*.*?(?:--\s*(.*))?$")
_ADDED = re.compile(r"^ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+) [^-]*(?:--\s*(.*))?$")
_VIEW_COLUMN = re.compile(r"^--\s+(\w+):\s+(.*)$")
_NOT_COLUMNS = {"PRIMARY", "UNIQUE", "CHECK", "FOREIGN"}


def _clean(text: str) -> str:
    """A comment without the key notes of the schema's own bookkeeping (`key: (...)`), one line."""
    return re.sub(r";?\s*key: \(.*?\)\s*$", "", " ".join(text.split())).strip()


@lru_cache(maxsize=4)
def table_comments(schema: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """{table: (its comment, {column: comment})} from schema.sql."""
    tables: dict[str, tuple[str, dict[str, str]]] = {}
    block: list[str] = []  # the comment lines just above the statement at hand
    current = None
    for line in schema.read_text().splitlines():
        if current is not None:
            if line.startswith(")"):
                current = None
            elif (match := _COLUMN.match(line)) and match[1] not in _NOT_COLUMNS:
                tables[current][1].setdefault(match[1], _clean(match[2] or ""))
        elif match := _TABLE.match(line):
            current, tables[match[1]] = match[1], (_clean(" ".join(block)), {})
        elif match := _ADDED.match(line):
            columns = tables[match[1]][1]
            if not columns.get(match[2]):
                columns[match[2]] = _clean(match[3] or "")
        block = block + [line.lstrip("-").strip()] if line.startswith("--") else []
    return tables


def view_comments(file: Path) -> tuple[str, dict[str, str]]:
    """A view's (comment, {column: comment}) from its file's header: the prose, then `Columns:` lines."""
    prose, columns, listing = [], {}, False
    for line in file.read_text().splitlines():
        if not line.startswith("--"):
            break
        if line.strip("- ").rstrip(":") == "Columns":
            listing = True
        elif listing and (match := _VIEW_COLUMN.match(line)):
            columns[match[1]] = _clean(match[2])
        elif listing and columns and line.startswith("--      "):  # a column's description goes on
            last = next(reversed(columns))
            columns[last] = f"{columns[last]} {line.lstrip('-').strip()}"
        elif not listing:
            prose.append(line.lstrip("-").strip())
    return _clean(" ".join(prose)), columns


def described(schema: Path, views: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """Every table's and view's (comment, {column: comment}); a view's columns may still lack some (see
    comment_statements, which fills those from the tables)."""
    found = dict(table_comments(schema))
    for file in sorted(views.glob("*.sql")):
        found[file.stem] = view_comments(file)
    return found


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def comment_statements(con, schema: Path, views: Path, temporary_only: bool = False) -> list[str]:
    """The COMMENT ON statements that make the connection's tables and views (stored, or with `temporary_only` the
    temporary views of a read-only connection) carry their comments: only those whose comment differs from what
    is there, so a warehouse already described is not written to."""
    docs = described(schema, views)
    by_name = {}  # a table column's comment, for view columns passed through under the same name
    for table, (_, columns) in table_comments(schema).items():
        for column, text in columns.items():
            by_name.setdefault(column, text)
    where = "schema_name = 'main' AND database_name = " + ("'temp'" if temporary_only else "current_database()")
    objects = con.execute(f"SELECT table_name, comment, 'TABLE' FROM duckdb_tables() WHERE {where} "
                          f"UNION ALL SELECT view_name, comment, 'VIEW' FROM duckdb_views() "
                          f"WHERE NOT internal AND {where}").fetchall()
    columns = con.execute(f"SELECT table_name, column_name, comment FROM duckdb_columns() WHERE {where}").fetchall()
    statements = []
    for name, comment, kind in objects:
        if name in docs and docs[name][0] and comment != docs[name][0]:
            statements.append(f"COMMENT ON {kind} {name} IS {_quote(docs[name][0])}")
    for name, column, comment in columns:
        if name not in docs:
            continue
        text = docs[name][1].get(column) or by_name.get(column)
        if text and comment != text:
            statements.append(f"COMMENT ON COLUMN {name}.{column} IS {_quote(text)}")
    return statements


def describe(con, name: str | None = None):
    """The warehouse's tables and views (kind, description, rows, columns), or with `name` that one's columns
    (type, description), as polars frames: what the COMMENT ON statements put in DuckDB's catalog."""
    import polars as pl

    objects = con.execute(
        "SELECT table_name AS name, 'table' AS kind, comment FROM duckdb_tables() WHERE schema_name = 'main' "
        "UNION SELECT view_name, 'view', comment FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' "
        "ORDER BY kind, name").fetchall()
    columns = con.execute("SELECT table_name, column_name, data_type, comment FROM duckdb_columns() "
                          "WHERE schema_name = 'main' ORDER BY table_name, column_index").fetchall()
    if name is not None:
        if name not in {n for n, _, _ in objects}:
            raise LookupError(name)
        return pl.DataFrame([(c, t, d) for n, c, t, d in columns if n == name],
                            schema=["column", "type", "description"], orient="row")
    names = {}
    for table, column, _, _ in columns:
        names.setdefault(table, []).append(column)
    rows = [con.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n, _, _ in objects]
    return pl.DataFrame({"name": [n for n, _, _ in objects], "kind": [k for _, k, _ in objects],
                         "rows": rows, "description": [c for _, _, c in objects],
                         "columns": [", ".join(names.get(n, [])) for n, _, _ in objects]})
