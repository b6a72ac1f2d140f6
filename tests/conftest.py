"""Shared fixtures: the demo warehouse, built once per test session from the real models."""
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from headforms import cli
from headforms.warehouse.storing.store import connect

if os.environ.get("MUTANT_UNDER_TEST") == "stats":
    # tests/mutate.py: mutmut's stats run records in this process which tests reach which function (it keeps
    # that setting in-process as well); CLI subprocesses could not record, so they do not inherit it.
    del os.environ["MUTANT_UNDER_TEST"]

# The tracebacks of the suite's own failing CLI runs go to a temporary log, not the user's state folder; its folder
# goes when the session ends.
LOG_FOLDER = None if "HEADFORMS_LOG" in os.environ else Path(tempfile.mkdtemp(prefix="headforms-tests-"))
if LOG_FOLDER is not None:
    os.environ["HEADFORMS_LOG"] = str(LOG_FOLDER / "errors.log")


# Likewise the caches a run writes (hub ranges, discovery's verdicts on new families) go to a temporary folder, not
# the user's Hugging Face cache.
CACHE_FOLDER = None if "HEADFORMS_CACHE" in os.environ else Path(tempfile.mkdtemp(prefix="headforms-cache-"))
if CACHE_FOLDER is not None:
    os.environ["HEADFORMS_CACHE"] = str(CACHE_FOLDER)


def pytest_sessionfinish(session, exitstatus):
    """The session's temporary log and cache folders go with it."""
    for folder in (LOG_FOLDER, CACHE_FOLDER):
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(items):
    """Under a mutant (tests/mutate.py), the cheapest test files first and each file's cheapest tests first, by
    the durations mutmut's stats run recorded: a killed mutant stops at its first failure (-x), so sooner."""
    stats = Path("mutmut-stats.json")
    if os.environ.get("MUTANT_UNDER_TEST", "stats") in ("stats", "fail") or not stats.exists():
        return
    duration = json.loads(stats.read_text())["duration_by_test"]
    per_file = Counter()
    for item in items:
        per_file[item.nodeid.split("::")[0]] += duration.get(item.nodeid, 0.0)
    items.sort(key=lambda item: (per_file[item.nodeid.split("::")[0]], duration.get(item.nodeid, 0.0)))


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory):
    """Path of a warehouse holding the demo set (SmolLM2-135M and all-MiniLM-L6-v2), both circuits, as `make
    warehouse` builds it. Do not modify it.

    $HEADFORMS_TEST_DEMO_DB names a prebuilt one to copy instead (tests/mutate.py reuses one that way)."""
    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    if os.environ.get("HEADFORMS_TEST_DEMO_DB"):
        shutil.copy(os.environ["HEADFORMS_TEST_DEMO_DB"], path)
        return path
    result = CliRunner().invoke(cli.main, ["extract", "demo", "--circuits", "qk,ov", "--db", str(path)])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture(scope="session")
def tiny_rope_db(tmp_path_factory):
    """A warehouse of one small RoPE model, a GGUF of 3 layers x 6 heads (3 key/value groups), N = 24, n = 4: every
    figure and report page has data (but training dynamics and behaviour). Do not modify it."""
    from tests.test_gguf import write_gguf

    folder = tmp_path_factory.mktemp("tiny-rope")
    write_gguf(folder / "tiny.gguf", n_layers=3, n_heads=6, n_kv_heads=3, d_model=24, head_dim=4)
    db = folder / "tiny.duckdb"
    result = CliRunner().invoke(cli.main, ["extract", str(folder / "tiny.gguf"), "--db", str(db), "--resamples", "5"])
    assert result.exit_code == 0, result.output
    return db


@pytest.fixture
def demo_con(demo_db):
    """A read-only connection to the demo warehouse, with this checkout's views of sql/."""
    con = connect(demo_db, read_only=True)
    yield con
    con.close()


# Statistics moved onto the thresholds the views compare them with, where only a tie tells `<` from `<=`
# (and `>` from `>=`), plus participation ratios below 2 so that shares are neither 0 nor 1 (avg and
# median then differ). The views' tests recompute each view from the same tables, ties included.
NESTED_CRITICAL = 6.634896601021214  # chi-square(1)'s 99% quantile, as nested_fit_tests.sql writes it
TIES = """
UPDATE heads SET participation_ratio = 2.0 WHERE layer = 1 AND head IN (0, 1);
UPDATE heads SET participation_ratio = 1.5 WHERE layer = 2 AND head = 0;
UPDATE heads SET symmetric_energy = random_symmetric_energy WHERE layer = 3 AND head IN (0, 1);
UPDATE heads SET symmetric_energy = (SELECT (d_model + 1) / (2.0 * d_model) FROM models m WHERE m.model = heads.model)
    WHERE layer = 4 AND head IN (0, 1);
UPDATE heads SET theta_distance = theta_position WHERE layer = 5 AND head IN (0, 1);
UPDATE heads SET random_theta_distance = random_theta_position WHERE layer = 5 AND head IN (2, 3);
-- parity_sensitivity's tolerances; parity as the extraction's tolerance (0.02) classifies them
UPDATE heads SET c_sym = 0.03, d_sym = 0.0, parity = 'I+' WHERE layer = 1 AND head = 2;     -- on 0.03
UPDATE heads SET c_sym = 0.025, d_sym = 0.025, parity = 'I-' WHERE layer = 1 AND head = 3;  -- on 0.05, c_sym = d_sym
UPDATE heads SET c_sym = 0.2, d_sym = 0.2, parity = 'I-' WHERE layer = 1 AND head = 4;      -- c_sym = d_sym
"""


@pytest.fixture(scope="session")
def ties_db(demo_db, tmp_path_factory):
    """A copy of the demo warehouse with heads and fits on the views' thresholds (TIES), and, in each model's
    first head and sample whose nested fits are all 'ok', 2 (loglik_gengamma - loglik_nested) equal to the
    critical value for gamma, Weibull and the lognormal."""
    path = tmp_path_factory.mktemp("ties") / "ties.duckdb"
    shutil.copy(demo_db, path)
    with duckdb.connect(str(path)) as con:
        con.execute(TIES)
        chosen = con.execute("""
            SELECT model, arg_min(struct_pack(layer, head, sample), (layer, head, sample)) FROM (
                SELECT model, layer, head, sample FROM fits WHERE family IN ('gengamma', 'gamma', 'weibull', 'lognormal')
                GROUP BY ALL HAVING count(*) FILTER (WHERE status = 'ok') = 4)
            GROUP BY model""").fetchall()
        for model, where in chosen:
            for family, loglik in (("gamma", 0.0), ("weibull", 0.0), ("lognormal", 0.0), ("gengamma", NESTED_CRITICAL / 2)):
                con.execute("UPDATE fits SET loglik = ? WHERE model = ? AND layer = ? AND head = ? AND sample = ? "
                            "AND family = ?", [loglik, model, where["layer"], where["head"], where["sample"], family])
    return path


# Heads stored as a zero form is stored (every statistic and fit NULL), in the copy `with NULL statistics`:
# a view whose denominator or filter mishandles NULL differs from the recomputation there.
ZERO_HEADS = [("SmolLM2-135M", 0, 0), ("SmolLM2-135M", 7, 3), ("SmolLM2-135M", 29, 8), ("all-MiniLM-L6-v2", 2, 5)]


@pytest.fixture(scope="session")
def nulls_db(demo_db, tmp_path_factory):
    """A copy of the demo warehouse in which ZERO_HEADS look like zero heads: NULL statistics and fits."""
    path = tmp_path_factory.mktemp("nulls") / "nulls.duckdb"
    shutil.copy(demo_db, path)
    where = " OR ".join(f"(model = '{m}' AND layer = {layer} AND head = {h})" for m, layer, h in ZERO_HEADS)
    with duckdb.connect(str(path)) as con:
        doubles = [c for (c,) in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'heads' AND data_type = 'DOUBLE' "
            "AND column_name NOT IN ('frobenius', 'random_symmetric_energy', 'random_pairing')").fetchall()]
        con.execute(f"""UPDATE heads SET {', '.join(f'{c} = NULL' for c in doubles)}, parity = NULL, frobenius = 0,
                            n_pos = 0, n_neg = 0, balanced = false,
                            n_zero = (SELECT least(d_model, 2 * head_dim) FROM models m WHERE m.model = heads.model),
                            n_zero_ambient = (SELECT d_model FROM models m WHERE m.model = heads.model)
                        WHERE {where}""")
        con.execute(f"""UPDATE fits SET shape = NULL, shape2 = NULL, scale = NULL, mode = NULL, loglik = NULL,
                            ks = NULL, hist_error = NULL, aic = NULL, bic = NULL, n = 0, status = 'failed'
                        WHERE {where}""")
    return path
