"""The warehouse file: opening it (single writer), schema and views, transactions, revisions, checks, and the
one-line failures every room raises. Imports nothing from `running/` or `publishing/`.

Where the file is by default and how long a reader waits for it live here, not in `store`, so that naming them (the
command line's options, the API's defaults) imports neither DuckDB nor polars."""
import os

DEFAULT_DB = "warehouse.duckdb"
DB_ENV = "HEADFORMS_DB"
# A reader's default wait: an extraction holds the file only while it commits (well under a second),
# so a reader started mid-run gets in between two commits.
READ_WAIT = 10.0


def default_db() -> str:
    """The warehouse path: $HEADFORMS_DB, else warehouse.duckdb in the current folder."""
    return os.environ.get(DB_ENV, DEFAULT_DB)
