"""Re-derive the warehouse's invariants in SQL and report every place that breaks one.

First every stored value of every table is read (DuckDB verifies each block's checksum as it
reads it), so a damaged block is reported by table, even where no invariant looks. Then each
check is one query returning (model, layer, head, detail) rows, one per offending place.
A finding is a `violation` (rows missing, extra or contradicting each other: the warehouse is
wrong) or a `warning` (an incomplete model: an interrupted extraction, which is consistent as
far as it goes and which rerunning `extract` resumes).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from string import Template

import duckdb

from headforms.compute.analysis import SAMPLES
from headforms.compute.fits import FAMILIES, LIMIT_LAWS, N_PARAMS, STATUSES
from headforms.extract.checkpoint import first_line
from headforms.warehouse.storing.store import cut_short

# Rows per head of each spectrum (as warehouse/running/load.py writes them), in terms of the head's
# n_pos, n_neg and the model's r = min(N, 2n) and n = head_dim.
SPECTRUM_ROWS = {
    "S": "r", "S_pos": "n_pos", "S_neg": "n_neg", "T_sv": "r", "T_sigma": "(r + 1) // 2",
    "L": "least(head_dim, r)", "L_sv": "least(head_dim, r)",
}
PROFILE_TOLERANCE = 1e-9
# Tables whose rows belong to a model: a row of a model not in `models` is an orphan.
MODEL_ROW_TABLES = ("layers", "heads", "eigenvalues", "fits", "intervals", "head_types",
                    "ov_heads", "ov_eigenvalues", "ov_fits", "copying_intervals")
ORDER_TOLERANCE = 1e-12  # relative: a value may exceed its predecessor by rounding only
# The key of each per-head detail table beyond (model, layer, head): schema.sql declares none (no index to keep up
# while loading), so a row's key is checked here. The QK circuit's tables hold a row per part of a head (heads.part);
# the output-value circuit's have no part (they belong to whole heads).
DETAIL_KEYS = {"eigenvalues": ("part", "spectrum", "idx"), "fits": ("part", "sample", "family"),
               "distance_profiles": ("part", "delta"),
               "ov_eigenvalues": ("spectrum", "idx"), "ov_fits": ("sample", "family")}


def _values(name: str, items) -> str:
    """A one-column VALUES table, e.g. (VALUES ('a'), ('b')) AS name_list(name)."""
    return "(VALUES " + ", ".join(f"('{item}')" for item in items) + f") AS {name}_list({name})"


def placeholders() -> dict[str, object]:
    """What the queries' $placeholders stand for: the codes the loader writes, and the tolerances."""
    return {
        "spectrum_rows": " ".join(f"WHEN '{code}' THEN {rows}" for code, rows in SPECTRUM_ROWS.items()),
        "spectra": _values("spectrum", SPECTRUM_ROWS),
        "samples": _values("sample", SAMPLES),
        "families": _values("family", FAMILIES),
        "statuses": ", ".join(f"'{status}'" for status in STATUSES),
        "limit_laws": ", ".join(f"'{law}'" for law in LIMIT_LAWS),
        "n_params": " ".join(f"WHEN '{family}' THEN {k}" for family, k in N_PARAMS.items()),
        "model_orphans": " UNION ALL ".join(
            f"SELECT model, NULL, NULL, format('{{}} {table} rows of a model not in models', count(*)) "
            f"FROM {table} ANTI JOIN models USING (model) GROUP BY model" for table in MODEL_ROW_TABLES),
        "duplicates": " UNION ALL ".join(
            f"SELECT model, layer, head, format('{{}} {table} rows share the key {', '.join(f'{c} {{}}' for c in key)}', "
            f"count(*), {', '.join(key)}) FROM {table} GROUP BY model, layer, head, {', '.join(key)} HAVING count(*) > 1"
            for table, key in DETAIL_KEYS.items()),
        "profile_tolerance": PROFILE_TOLERANCE,
        "order_tolerance": ORDER_TOLERANCE,
    }


# (name, level, query). Every query returns model, layer, head (NULL where not applicable) and detail.
# heads, eigenvalues, fits and distance_profiles hold a row per part of a head (heads.part: 'whole', or a
# latent-attention head's 'nope' and 'rope'): rows meet their own part's. The checks of a head's shape (kv_head,
# signature, balanced, eigenvalue_rows) read models' n_kv_heads and head_dim, which are a whole head's: they check
# 'whole' heads only (a part's own head size and key heads are not in models).
CHECKS: tuple[tuple[str, str, str], ...] = (
    ("incomplete", "warning", """
        SELECT m.model, NULL, NULL,
               format('{} of {} layers committed; run the same extract command to resume',
                      count(l.layer), len(coalesce(m.attention_layers, range(m.n_layers))))
        FROM models m LEFT JOIN layers l USING (model) WHERE NOT m.complete
        GROUP BY m.model, m.n_layers, m.attention_layers"""),
    ("summaries", "warning", """
        SELECT model, NULL, NULL, 'complete model without bootstrap intervals (built before them): extract with '
                                  'force=True recomputes them'
        FROM models ANTI JOIN intervals USING (model) WHERE complete"""),
    ("missing_layer", "violation", """
        SELECT model, layer, NULL, 'layer of a complete model missing from layers'
        FROM (SELECT model, unnest(coalesce(attention_layers, range(n_layers))) AS layer FROM models WHERE complete)
        ANTI JOIN layers USING (model, layer)"""),
    ("layer_record", "violation", """
        SELECT model, layer, NULL, format('layers row with {} heads; the model has {} layers of {} heads',
                                          l.heads, m.n_layers, m.n_heads)
        FROM layers l JOIN models m USING (model)
        WHERE l.heads <> m.n_heads OR NOT list_contains(coalesce(m.attention_layers, range(m.n_layers)), l.layer)"""),
    ("missing_head", "violation", """
        SELECT model, layer, head, 'head row missing from a committed layer'
        FROM (SELECT l.model, l.layer, unnest(range(m.n_heads)) AS head FROM layers l JOIN models m USING (model))
        ANTI JOIN heads USING (model, layer, head)"""),
    ("uncommitted_rows", "violation", """
        SELECT model, layer, NULL, format('{} heads rows in a layer not committed in layers', count(*))
        FROM heads SEMI JOIN models USING (model) ANTI JOIN layers USING (model, layer)
        GROUP BY model, layer
        UNION ALL
        SELECT h.model, h.layer, h.head, format('head index outside 0..{}', m.n_heads - 1)
        FROM heads h JOIN models m USING (model) WHERE h.head NOT BETWEEN 0 AND m.n_heads - 1"""),
    ("orphan_rows", "violation", """
        $model_orphans
        UNION ALL
        SELECT model, layer, head, format('{} eigenvalues rows without a heads row', count(*))
        FROM eigenvalues SEMI JOIN models USING (model) ANTI JOIN heads USING (model, layer, head, part)
        GROUP BY model, layer, head
        UNION ALL
        SELECT model, layer, head, format('{} fits rows without a heads row', count(*))
        FROM fits SEMI JOIN models USING (model) ANTI JOIN heads USING (model, layer, head, part)
        GROUP BY model, layer, head"""),
    ("duplicate_rows", "violation", "$duplicates"),
    ("kv_head", "violation", """
        SELECT h.model, h.layer, h.head, format('kv_head {}, expected {}', h.kv_head,
                                                h.head // (m.n_heads // m.n_kv_heads))
        FROM heads h JOIN models m USING (model)
        WHERE h.part = 'whole' AND h.kv_head IS DISTINCT FROM h.head // (m.n_heads // m.n_kv_heads)"""),
    ("signature", "violation", """
        SELECT h.model, h.layer, h.head,
               format('n_pos {} + n_neg {} + n_zero {} <> min(N, 2n) = {}, or n_zero_ambient {} <> N - n_pos - n_neg = {}',
                      n_pos, n_neg, n_zero, least(d_model, 2 * head_dim), n_zero_ambient, d_model - n_pos - n_neg)
        FROM heads h JOIN models m USING (model)
        WHERE h.part = 'whole'
          AND (n_pos + n_neg + n_zero <> least(d_model, 2 * head_dim) OR n_zero_ambient <> d_model - n_pos - n_neg
               OR least(n_pos, n_neg, n_zero) < 0)"""),
    ("balanced", "violation", """
        SELECT h.model, h.layer, h.head, format('balanced is {} with n_pos {}, n_neg {}, n = {}',
                                                balanced, n_pos, n_neg, head_dim)
        FROM heads h JOIN models m USING (model)
        WHERE h.part = 'whole' AND balanced IS DISTINCT FROM (n_pos = head_dim AND n_neg = head_dim)"""),
    ("profile", "violation", """
        SELECT model, layer, head,
               format('a + b + c + d = {}, b_sym + c_sym + d_sym = {}, symmetric_energy + a = {}; each must be 1',
                      a + b + c + d, b_sym + c_sym + d_sym, symmetric_energy + a)
        FROM heads
        WHERE abs(a + b + c + d - 1) > $profile_tolerance OR abs(b_sym + c_sym + d_sym - 1) > $profile_tolerance
           OR abs(symmetric_energy + a - 1) > $profile_tolerance"""),
    ("eigenvalue_rows", "violation", """
        WITH whole AS (SELECT * FROM heads WHERE part = 'whole'),
        expected AS (
            SELECT h.model, h.layer, h.head, h.part, spectrum,
                   CASE spectrum $spectrum_rows END AS rows
            FROM (SELECT h.*, least(m.d_model, 2 * m.head_dim) AS r, m.head_dim
                  FROM whole h JOIN models m USING (model)) h, $spectra),
        actual AS (
            SELECT model, layer, head, part, spectrum, count(*) AS rows, min(idx) AS lo, max(idx) AS hi
            FROM eigenvalues SEMI JOIN models USING (model) SEMI JOIN whole USING (model, layer, head, part)
            GROUP BY ALL)
        SELECT model, layer, head,
               format('spectrum {} has {} rows (idx {}..{}), expected {} (idx 0..{})', spectrum,
                      coalesce(a.rows, 0), a.lo, a.hi, coalesce(e.rows, 0), coalesce(e.rows, 0) - 1)
        FROM expected e FULL JOIN actual a USING (model, layer, head, part, spectrum)
        WHERE coalesce(a.rows, 0) <> coalesce(e.rows, 0) OR a.lo <> 0 OR a.hi <> a.rows - 1"""),
    ("eigenvalue_order", "violation", """
        SELECT model, layer, head, format('spectrum {} idx {}: {} after {} (values decrease with idx, '
                                          'by magnitude for L; lobes and singular values are not negative)',
                                          spectrum, idx, key, previous)
        FROM (SELECT *, lag(key) OVER (PARTITION BY model, layer, head, part, spectrum ORDER BY idx) AS previous
              FROM (SELECT model, layer, head, part, spectrum, idx,
                           CASE spectrum WHEN 'L' THEN sqrt(value * value + imag * imag) ELSE value END AS key
                    FROM eigenvalues))
        WHERE key > previous + $order_tolerance * abs(previous) OR (spectrum <> 'S' AND key < 0)"""),
    ("fits", "violation", """
        WITH expected AS (SELECT model, layer, head, part, sample, family
                          FROM (SELECT model, layer, head, part FROM heads SEMI JOIN models USING (model)),
                               $samples, $families),
        actual AS (SELECT model, layer, head, part, sample, family
                   FROM fits SEMI JOIN models USING (model) SEMI JOIN heads USING (model, layer, head, part))
        SELECT model, layer, head, format('fit {} / {} missing', sample, family)
        FROM expected ANTI JOIN actual USING (model, layer, head, part, sample, family)
        UNION ALL
        SELECT model, layer, head, format('fit of unknown sample / family {} / {}', sample, family)
        FROM actual ANTI JOIN expected USING (model, layer, head, part, sample, family)"""),
    ("distance_profiles", "violation", """
        WITH expected AS (  -- every delta of every whole head, and of every part of a model with profiles of that
                            -- part (a latent-attention head's part without RoPE has none)
            SELECT h.model, h.layer, h.head, h.part, unnest(m.distances) AS delta
            FROM heads h JOIN models m USING (model)
            WHERE h.part = 'whole' OR (h.model, h.part) IN (SELECT DISTINCT model, part FROM distance_profiles))
        SELECT coalesce(e.model, a.model), coalesce(e.layer, a.layer), coalesce(e.head, a.head),
               format('distance_profiles row for delta {} {}', coalesce(e.delta, a.delta),
                      CASE WHEN a.model IS NULL THEN 'missing'
                           ELSE 'without a heads row or a delta in models.distances' END)
        FROM expected e FULL JOIN distance_profiles a
          ON e.model = a.model AND e.layer = a.layer AND e.head = a.head AND e.part = a.part AND e.delta = a.delta
        WHERE e.model IS NULL OR a.model IS NULL
        UNION ALL
        SELECT model, layer, head, format('delta {}: a + b + c + d = {}, symmetric_energy + a = {}; each must be 1',
                                          delta, a + b + c + d, symmetric_energy + a)
        FROM distance_profiles
        WHERE abs(a + b + c + d - 1) > $profile_tolerance OR abs(symmetric_energy + a - 1) > $profile_tolerance"""),
    ("fit_status", "violation", """
        SELECT model, layer, head, format('fit {} / {}: {}', sample, family, problem)
        FROM (SELECT *, CASE
                  WHEN status NOT IN ($statuses) THEN format('unknown status {}', status)
                  WHEN status = 'boundary' AND family <> 'gengamma' THEN 'boundary, but its maxima are interior'
                  WHEN status = 'boundary' AND (shape IS NOT NULL OR shape2 IS NOT NULL OR scale IS NOT NULL
                                                OR mode IS NOT NULL OR prentice_mu IS NOT NULL OR prentice_sigma IS NOT NULL
                                                OR prentice_q IS NOT NULL) THEN 'boundary, with parameters'
                  WHEN status = 'boundary' AND (limit_law IS NULL OR limit_law NOT IN ($limit_laws))
                      THEN format('boundary, with limit law {} (not a known one)', coalesce(limit_law, 'NULL'))
                  WHEN status <> 'boundary' AND limit_law IS NOT NULL THEN format('{}, with a limit law', status)
                  WHEN status = 'failed' AND loglik IS NOT NULL THEN 'failed, with a likelihood'
                  WHEN status = 'ok' AND (loglik IS NULL OR prentice_mu IS NULL OR prentice_sigma IS NULL
                                          OR prentice_q IS NULL OR family <> 'gengamma' AND (shape IS NULL OR scale IS NULL))
                      THEN 'ok, without its likelihood or parameters (a warehouse from before Prentice''s: rebuild it)'
                  WHEN family = 'gengamma' AND (abs(shape * prentice_q * prentice_q - 1) > $profile_tolerance
                                                OR abs(shape2 * prentice_sigma - prentice_q) > $profile_tolerance * abs(prentice_q))
                      THEN 'natural a, c and Prentice q, sigma disagree (a = q^-2, c = q / sigma)'
                  WHEN status = 'boundary' AND loglik IS NULL THEN 'boundary, without its likelihood'
                  WHEN abs(aic - (2 * k - 2 * loglik)) > $profile_tolerance * (1 + abs(aic))
                    OR abs(bic - (k * ln(n) - 2 * loglik)) > $profile_tolerance * (1 + abs(bic))
                      THEN 'aic or bic do not follow from loglik, n and its free parameters' END AS problem
              FROM (SELECT *, CASE family $n_params END AS k FROM fits SEMI JOIN models USING (model)))
        WHERE problem IS NOT NULL"""),
)

# The output-value circuit (ov_heads, ov_eigenvalues, ov_fits hold heads', eigenvalues' and fits' columns for OV, but
# part: they belong to whole heads): the per-head checks above again on those tables (named ov_<check>, read with
# part 'whole'), and its rows against heads' whole rows and models.circuits.
OV_CHECKED = ("kv_head", "signature", "balanced", "profile", "eigenvalue_rows", "eigenvalue_order", "fits", "fit_status")
CHECKS += tuple((f"ov_{name}", level,
                 re.sub(r"\b(heads|eigenvalues|fits)\b", r"(SELECT *, 'whole' AS part FROM ov_\1)", sql))
                for name, level, sql in CHECKS if name in OV_CHECKED) + ((
    "ov_rows", "violation", """
        SELECT model, layer, head, 'ov_heads row missing from a complete model extracted with the OV circuit'
        FROM heads SEMI JOIN (SELECT model FROM models WHERE complete AND contains(circuits, 'ov')) USING (model)
        ANTI JOIN ov_heads USING (model, layer, head)
        WHERE part = 'whole'
        UNION ALL
        SELECT model, NULL, NULL, format('{} ov_heads rows of a model extracted without the OV circuit (circuits {})',
                                         count(*), coalesce(any_value(circuits), 'NULL'))
        FROM ov_heads JOIN models USING (model) WHERE NOT coalesce(contains(circuits, 'ov'), false) GROUP BY model
        UNION ALL
        SELECT model, layer, head, 'ov_heads row without a heads row'
        FROM ov_heads SEMI JOIN models USING (model)
        ANTI JOIN (SELECT model, layer, head FROM heads WHERE part = 'whole') USING (model, layer, head)
        UNION ALL
        SELECT model, layer, head, format('{} ov_eigenvalues rows without an ov_heads row', count(*))
        FROM ov_eigenvalues SEMI JOIN models USING (model) ANTI JOIN ov_heads USING (model, layer, head)
        GROUP BY model, layer, head
        UNION ALL
        SELECT model, layer, head, format('{} ov_fits rows without an ov_heads row', count(*))
        FROM ov_fits SEMI JOIN models USING (model) ANTI JOIN ov_heads USING (model, layer, head)
        GROUP BY model, layer, head"""),)


@dataclass(frozen=True)
class Finding:
    """One place where the warehouse breaks an invariant (or, as a warning, a model still incomplete)."""

    level: str          # "violation" or "warning"
    check: str          # the name of the check in CHECKS
    model: str | None
    layer: int | None
    head: int | None
    detail: str

    def __str__(self) -> str:
        where = " ".join(w for w in [f"model '{self.model}'" if self.model is not None else "",
                                     f"layer {self.layer}" if self.layer is not None else "",
                                     f"head {self.head}" if self.head is not None else ""] if w)
        return f"{self.level}: {self.check}: {where + ': ' if where else ''}{self.detail}"


def check_warehouse(con: duckdb.DuckDBPyConnection, full: bool = True) -> list[Finding]:
    """Every finding: unreadable tables (when `full`), then every check's warnings and violations, ordered
    by check and then location. A check that cannot run on a damaged file is itself a violation."""
    findings = _cut_short(con) + (scan_tables(con) if full else [])
    values = placeholders()
    for name, level, sql in CHECKS:
        sql = Template(sql).substitute(values)
        try:
            rows = con.sql(f"SELECT * FROM ({sql}) AS found(model, layer, head, detail) ORDER BY ALL").fetchall()
        except (duckdb.CatalogException, duckdb.BinderException):  # a warehouse of an earlier version: its tables lack what this reads
            rows = [(None, None, None, "the warehouse predates this check's tables or columns; "
                                       "an extract run (opening it for writing) adds them")]
            level = "warning"
        except duckdb.Error as exc:
            findings.append(Finding("violation", name, None, None, None, f"cannot run: {first_line(exc)}"))
            continue
        findings += [Finding(level, name, *row) for row in rows]
    return findings


def _cut_short(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """A `file_length` violation where the file is shorter than DuckDB left it (store.cut_short: its blocks' lists,
    so --quick finds it too); a catalog too damaged to list them is the scan's to report."""
    try:
        why = cut_short(con)
    except duckdb.Error:
        return []
    return [Finding("violation", "file_length", None, None, None, why)] if why else []


def scan_tables(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """Read every value of every table (a hash of all columns, row by row, folded into one number), so that
    DuckDB reads, and checksums, every block; one `unreadable` violation per table that fails."""
    findings = []
    try:
        tables = con.sql("SELECT table_name, list(column_name ORDER BY column_index) FROM duckdb_columns() "
                         "WHERE NOT internal AND schema_name = 'main' AND table_name IN "
                         "(SELECT table_name FROM duckdb_tables()) GROUP BY ALL ORDER BY 1").fetchall()
    except duckdb.Error as exc:
        return [Finding("violation", "unreadable", None, None, None, f"the catalog: {first_line(exc)}")]
    for table, columns in tables:
        quoted = ", ".join(f'"{column}"' for column in columns)
        try:
            con.sql(f'SELECT bit_xor(hash({quoted})) FROM "{table}"').fetchall()
        except duckdb.Error as exc:
            findings.append(Finding("violation", "unreadable", None, None, None, f"table {table}: {first_line(exc)}"))
    return findings
