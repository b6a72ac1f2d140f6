"""headforms: spectra, statistics and fits of attention heads' query-key forms L = W_K^T W_Q, in DuckDB.

The Python API (see the README): `connect`, `extract`, `heads`, `spectra`, `table`, `analyse`, `report`, `plan`, `cache`,
`behaviour`.
Subpackages: `headforms.extract` (checkpoints and layouts), `headforms.compute` (the math),
`headforms.warehouse` (schema, loading, export).
"""
import importlib

from headforms.api import Analysis, Progress, analyse, behaviour, cache, connect, heads, plan, report, spectra, table

__all__ = ["Analysis", "Progress", "analyse", "behaviour", "cache", "connect", "extract", "heads", "plan", "report",
           "spectra", "table"]


def __getattr__(name: str):
    """Subpackages load on first use. `headforms.extract` is the subpackage and, called, the API's extract."""
    if name in ("extract", "compute", "warehouse", "cli"):
        return importlib.import_module(f"headforms.{name}")
    raise AttributeError(f"module 'headforms' has no attribute '{name}'")
