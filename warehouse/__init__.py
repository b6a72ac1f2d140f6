"""Everything after extraction, in three rooms that import one way (running and publishing use storing):

- `storing/`: the DuckDB file itself: schema, views, transactions, revisions, invariant checks, one-line failures;
- `running/`: putting models in: loading layers, the executors that schedule them, progress, per-model summaries,
  behaviour rows;
- `publishing/`: taking results out: CSV/Parquet export, the paper's figures, the HTML report.

Nothing here reads a checkpoint's bytes (that is `extract/`) or does linear algebra of its own (that is `compute/`).
"""
