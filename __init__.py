"""headforms: spectra, statistics and fits of attention heads' query-key forms L = W_K^T W_Q, in DuckDB.

The Python API (see the README): `connect`, `extract`, `heads`, `spectra`, `table`, `analyse`, `report`, `plan`, `cache`,
`behaviour`, and what the command line's other commands do (`sql`, `status`, `export`, `check`, ...).
Subpackages: `headforms.extract` (checkpoints and layouts), `headforms.compute` (the math),
`headforms.warehouse` (storing, running, publishing).
"""
import importlib
import sys
import types

from headforms import api
from headforms.api import Analysis, Progress, analyse, behaviour, cache, connect, heads, plan, report, spectra, table

__all__ = ["Analysis", "Progress", "analyse", "behaviour", "cache", "connect", "extract", "heads", "plan", "report",
           "spectra", "table"]


class _CallableExtract(types.ModuleType):
    """`headforms.extract(sources, db=...)` is the API's extract; `headforms.extract.sources` etc. stay modules.
    Made callable here, at the top, so that the subpackage never imports the API above it."""

    def __call__(self, *args, **kwargs):
        return api.extract(*args, **kwargs)


sys.modules["headforms.extract"].__class__ = _CallableExtract  # imported by the API


def __getattr__(name: str):
    """Subpackages load on first use."""
    if name in ("compute", "warehouse", "cli"):
        return importlib.import_module(f"headforms.{name}")
    raise AttributeError(f"module 'headforms' has no attribute '{name}'")
