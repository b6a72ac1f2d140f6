"""Shared fixtures: the demo warehouse, built once per test session from the real models."""
import duckdb
import pytest
from click.testing import CliRunner

from headforms import cli


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory):
    """Path of a warehouse holding the demo set (SmolLM2-135M and all-MiniLM-L6-v2). Do not modify it."""
    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    result = CliRunner().invoke(cli.main, ["extract", "demo", "--db", str(path)])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture
def demo_con(demo_db):
    """A read-only connection to the demo warehouse."""
    con = duckdb.connect(str(demo_db), read_only=True)
    yield con
    con.close()
