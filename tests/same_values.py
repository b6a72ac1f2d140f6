"""Two warehouses compared value for value (`python tests/same_values.py A.duckdb B.duckdb [--tolerance T]`).

Every table and view present in both, rows sorted on all columns: it prints, per relation, the row counts and
the largest absolute difference of its numeric columns (other columns must be equal), and exits 1 when a
relation differs beyond the tolerance (default 0: bit for bit). Timing and provenance columns are left out.
"""
from __future__ import annotations

import argparse
import sys

import duckdb
import numpy as np
import polars as pl

# Columns that say when or how fast a run happened, not what it computed.
VOLATILE = {"seconds", "elapsed", "wall_seconds", "heads_per_second", "forward_seconds", "headforms_version"}


def relations(con) -> dict[str, list[str]]:
    rows = con.execute("SELECT table_name, column_name FROM information_schema.columns "
                       "ORDER BY table_name, ordinal_position").fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        if column not in VOLATILE and not column.endswith("_at"):
            out.setdefault(table, []).append(column)
    return out


def compare(a: str, b: str, tolerance: float) -> int:
    con = duckdb.connect(a, read_only=True)
    con.execute(f"ATTACH '{b}' AS other (READ_ONLY)")
    left, right = relations(con), relations(duckdb.connect(b, read_only=True))
    bad = 0
    for name in sorted(set(left) | set(right)):
        if name not in left or name not in right:
            print(f"{name}: only in {'A' if name in left else 'B'}")
            bad += 1
            continue
        columns = [c for c in left[name] if c in right[name]]
        select = ", ".join(f'"{c}"' for c in columns)
        x = con.sql(f'SELECT {select} FROM "{name}" ORDER BY ALL').pl()
        y = con.sql(f'SELECT {select} FROM other."{name}" ORDER BY ALL').pl()
        if len(x) != len(y):
            print(f"{name}: {len(x)} rows against {len(y)}")
            bad += 1
            continue
        worst, mismatched = 0.0, []
        for c in columns:
            if x[c].dtype.is_numeric() and y[c].dtype.is_numeric():
                u, v = x[c].cast(float).fill_null(np.nan).to_numpy(), y[c].cast(float).fill_null(np.nan).to_numpy()
                same_nan = np.isnan(u) == np.isnan(v)
                if not same_nan.all():
                    mismatched.append(c)
                    continue
                d = np.abs(u - v)[~np.isnan(u)]
                if d.size:
                    worst = max(worst, float(d.max()))
            elif not x[c].equals(y[c]):
                mismatched.append(c)
        verdict = "ok" if not mismatched and worst <= tolerance else "DIFFERS"
        bad += verdict != "ok"
        print(f"{name}: {len(x)} rows, largest difference {worst:.3g}"
              + (f", columns differ: {', '.join(mismatched)}" if mismatched else "") + f"  {verdict}")
    return 1 if bad else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--tolerance", type=float, default=0.0)
    args = parser.parse_args()
    sys.exit(compare(args.a, args.b, args.tolerance))
