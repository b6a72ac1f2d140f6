"""headforms: spectra, statistics and fits of attention heads' query-key forms L = W_K^T W_Q, in DuckDB.

The Python API (see the README): `connect`, `extract_models` (the command line's extract: `headforms.api.extract`),
`heads`, `spectra`, `table`, `analyse`, `report`, `plan`, `cache`, `behaviour`, and what the command line's other
commands do (`sql`, `status`, `export`, `check`, ...).
Subpackages: `headforms.extract` (checkpoints and layouts), `headforms.compute` (the math),
`headforms.warehouse` (storing, running, publishing).
"""
import importlib

# The API's names, loaded with the API on first use: a process that needs only the math and the checkpoints (a
# `--jobs` or Ray worker, `headforms.compute` in a notebook) never imports DuckDB or polars.
_API = ("Analysis", "Progress", "analyse", "behaviour", "cache", "connect", "describe", "extract_models", "heads",
        "plan", "report", "spectra", "sql", "table")
_SUBPACKAGES = ("api", "cli", "compute", "extract", "warehouse")
# Top-level names of API functions whose own name is a subpackage's: headforms.extract is the subpackage.
_RENAMED = {"extract_models": "extract"}
__all__ = sorted(_API + ("__version__",))


def _version() -> str:
    """The installed distribution's version (importlib.metadata), or 0+unknown for a checkout that is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("headforms")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()


def __getattr__(name: str):
    """The API's names and the subpackages load on first use."""
    if name in _API:
        return getattr(importlib.import_module("headforms.api"), _RENAMED.get(name, name))
    if name in _SUBPACKAGES:
        return importlib.import_module(f"headforms.{name}")
    raise AttributeError(f"module 'headforms' has no attribute '{name}'")


def __dir__():
    """The names a notebook completes: the API's and the subpackages."""
    return sorted(set(globals()) | set(_API) | set(_SUBPACKAGES))
