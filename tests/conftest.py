"""Shared fixtures: the demo warehouse, built once per test session from the real models."""
import os
import shutil

import pytest
from click.testing import CliRunner

from headforms import cli
from headforms.warehouse.store import connect


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory):
    """Path of a warehouse holding the demo set (SmolLM2-135M and all-MiniLM-L6-v2). Do not modify it.

    $HEADFORMS_TEST_DEMO_DB names a prebuilt one to copy instead (tests/mutate.py reuses one that way)."""
    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    if os.environ.get("HEADFORMS_TEST_DEMO_DB"):
        shutil.copy(os.environ["HEADFORMS_TEST_DEMO_DB"], path)
        return path
    result = CliRunner().invoke(cli.main, ["extract", "demo", "--db", str(path)])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture
def demo_con(demo_db):
    """A read-only connection to the demo warehouse, with this checkout's views of sql/."""
    con = connect(demo_db, read_only=True)
    yield con
    con.close()
