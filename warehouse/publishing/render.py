"""A result frame as the command line shows it: a table of whole column names with a row limit and a footer saying
what was left out, or CSV, JSON, Markdown and Parquet with nested columns (lists, structs) kept whole."""
from __future__ import annotations

import json
from pathlib import Path

FORMATS = ("table", "csv", "json", "markdown", "parquet")
LIMIT = 40  # rows a table shows unless told otherwise (--limit N, --all)

# polars' own rendering, told to show what a DuckDB user expects: every column, names whole, no shape or dtype rows.
# (polars is imported by the functions: the API imports this module's names, and a worker process never needs it.)
_SHOWN = dict(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=200, fmt_table_cell_list_len=8, tbl_width_chars=65535,
              tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True, tbl_hide_dtype_separator=True)


def render(frame, fmt: str = "table", limit: int | None = LIMIT) -> str:
    """`frame` as text in `fmt` (not parquet: see write_parquet). Only a table is limited: the first `limit` rows
    (None: all), then a footer naming the rows left out."""
    if fmt == "csv":
        return flat(frame).write_csv()
    if fmt == "json":
        return frame.write_json() + "\n"
    import polars as pl

    shown = frame if limit is None else frame.head(limit)
    with pl.Config(tbl_formatting="MARKDOWN" if fmt == "markdown" else None, **_SHOWN):
        text = str(shown) + "\n"
    left = frame.height - shown.height
    if left:
        text += (f"{frame.height} rows, the first {shown.height} shown ({left} left out: --limit N shows more, "
                 "--all every row)\n")
    elif fmt == "table":
        text += f"{frame.height} row{'s' * (frame.height != 1)}\n"
    return text


def flat(frame):
    """Nested columns (lists, arrays, structs) as JSON text, one value a cell: what a CSV file can hold."""
    import polars as pl

    nested = [name for name, dtype in frame.schema.items() if dtype.is_nested()]
    return frame.with_columns(pl.Series(name, [None if v is None else json.dumps(v) for v in frame[name].to_list()],
                                        dtype=pl.String) for name in nested)


def write_parquet(frame, out: str | Path) -> Path:
    """`frame` as a Parquet file at `out` (nested columns as Parquet's own nested types)."""
    frame.write_parquet(out)
    return Path(out)
