"""The views of sql/ on heads stored as parts (heads.part): a hand-built warehouse of one model of whole heads
('dense') and one whose heads are each two forms, 'nope' and 'rope' (a latent-attention model, 'latent'), with
different, known values in each part, a zero form among the nope part's heads (every statistic and fit NULL). Every
view reports a row per (model, part) with that part's answer alone: a join or a grouping that leaves part out mixes
the two parts (or multiplies their rows) and changes the answers asserted here."""
from __future__ import annotations

import shutil

import duckdb
import polars as pl
import pytest

from headforms.warehouse.storing.store import connect, create_schema

N = 16  # d_model of both models
WHOLE_N, NOPE_N, ROPE_N = 4, 4, 2  # head sizes: the dense model's, and the latent model's parts'
# (model, part) -> per head (layer, head) in order (0, 0), (0, 1), (1, 0), (1, 1): symmetric_energy, pairing,
# parity, participation_ratio, theta_distance, theta_position, sigma_lambda_correlation; None: a zero form
HEADS = {
    ("dense", "whole"): [(0.6, 0.8, "I+", 3.0, 0.1, 0.5, 0.9), (0.7, 0.9, "II", 1.5, 0.2, 0.1, 0.8),
                         (0.8, 0.7, "I-", 3.0, 0.3, 0.6, 0.7), (0.9, 0.6, "I+", 3.0, 0.4, 0.7, 0.6)],
    ("latent", "nope"): [(0.1, 0.2, "I-", 1.2, 0.5, 0.1, 0.1), (0.2, 0.3, "I-", 1.4, 0.6, 0.1, 0.2),
                         (0.3, 0.4, "II", 2.5, 0.7, 0.8, 0.3), None],
    ("latent", "rope"): [(0.95, 0.1, "I+", 1.1, 0.01, 0.9, -0.1), (0.85, 0.15, "I+", 1.1, 0.02, 0.9, -0.2),
                         (0.75, 0.2, "I+", 1.1, 0.03, 0.9, -0.3), (0.65, 0.25, "II", 1.1, 0.04, 0.9, -0.4)],
}
PLACES = [(0, 0), (0, 1), (1, 0), (1, 1)]
SIZE = {"whole": WHOLE_N, "nope": NOPE_N, "rope": ROPE_N}
# The profile of S each parity is given (c_sym, d_sym): parity_sensitivity classifies them alike at every tolerance.
PROFILE = {"I+": (0.5, 0.1), "II": (0.004, 0.004), "I-": (0.1, 0.5)}
# Unbalanced heads, (model, part, layer, head) -> (n_pos, n_neg, n_zero): the nope part's zero form and a head of
# rank 1, and a rope head whose W_Q and W_K rows share a direction (rank(L) = n = 2, one zero eigenvalue of S).
UNBALANCED = {("latent", "nope", 1, 1): (0, 0, 2 * NOPE_N), ("latent", "nope", 0, 1): (3, 4, 1),
              ("latent", "rope", 0, 1): (2, 1, 1)}
# L_sv values per head (else n, n - 1, ..., 1): the zero form's are zero; the nope head (0, 1) has one far above
# the others (rank 1 at the 1e-9 tolerance) and the rope head (0, 1) of the same place 2 and 1: a rank counted over
# both parts' L_sv (or a part's n taken as models.head_dim = 6) changes the reasons.
L_SV = {("latent", "nope", 1, 1): [0.0] * NOPE_N, ("latent", "nope", 0, 1): [1e10, 4.0, 3.0, 0.0]}
# Gamma fits per (model, part): modes of S_pos, S_neg, T and shapes k_plus, k_minus, k_T; every head the same, but
# the zero form's (failed). mode_ratio = tau / sqrt(|mu| nu), shape_ratio = k_T / sqrt(k_plus k_minus).
GAMMA = {("dense", "whole"): ((1.0, 1.0, 1.0), (2.0, 2.0, 2.0)),    # ratios 1, 1
         ("latent", "nope"): ((1.0, 4.0, 4.0), (2.0, 8.0, 8.0)),    # ratios 2, 2
         ("latent", "rope"): ((4.0, 1.0, 1.0), (8.0, 2.0, 2.0))}    # ratios 0.5, 0.5
# S_pos's histogram errors of the gamma and lognormal fits, and the log-likelihoods of gamma and gengamma (gengamma
# 'boundary' where None): dense gamma best, nope lognormal best, rope a tie; gengamma better at 1% in dense only.
HIST = {("dense", "whole"): (0.1, 0.2), ("latent", "nope"): (0.3, 0.2), ("latent", "rope"): (0.5, 0.5)}
LOGLIK = {("dense", "whole"): (0.0, 10.0), ("latent", "nope"): (0.0, 1.0), ("latent", "rope"): (0.0, None)}
# head_types per (model, part): (type, silhouette) per head, the zero form has none
TYPES = {("dense", "whole"): [(0, 0.5), (0, 0.5), (1, 0.5), (1, 0.5)],
         ("latent", "nope"): [(0, 0.1), (1, 0.2), (2, 0.3), None],
         ("latent", "rope"): [(0, 0.0), (0, 0.0), (0, 0.0), (0, 0.0)]}
# distance_profiles: the dense model's (RoPE) and the rope part's, at deltas 0 and 1 (parity, pairing); none of nope
PROFILES = {("dense", "whole"): {0: ("I+", 0.8), 1: ("II", 0.6)}, ("latent", "rope"): {0: ("I-", 0.3), 1: ("I-", 0.1)}}
# layer-bootstrap intervals of parity_by_model's pct_type_I_plus, per (model, part)
INTERVALS = {("dense", "whole"): (40.0, 60.0), ("latent", "nope"): (0.0, 10.0), ("latent", "rope"): (70.0, 80.0)}


def model_row(model: str, head_dim: int) -> str:
    return (f"('{model}', 'pkg:{model}', 'r1', 'tiny', 'rope', 2, 2, 2, {N}, {head_dim}, 0.5, NULL, NULL, 0.02, 0, "
            f"'0.1.0', TIMESTAMP '2026-01-01', true)")


def build(path) -> None:
    """The hand-built warehouse at path."""
    con = duckdb.connect(str(path))
    create_schema(con)
    con.execute("INSERT INTO models (model, source, revision, architecture, positional_encoding, n_layers, n_heads, "
                "n_kv_heads, d_model, head_dim, score_scale, qk_norm, config, parity_tolerance, baseline_seed, "
                f"tool_version, extracted_at, complete) VALUES {model_row('dense', WHOLE_N)}, "
                f"{model_row('latent', NOPE_N + ROPE_N)}")
    con.execute("UPDATE models SET distances = [0, 1], circuits = 'qk,ov'")
    heads, fits, eigen, types, profiles, behaviour, ov = [], [], [], [], [], [], []
    for (model, part), rows in HEADS.items():
        n = SIZE[part]
        for (layer, head), values in zip(PLACES, rows):
            n_pos, n_neg, n_zero = UNBALANCED.get((model, part, layer, head), (n, n, 0))
            if values is None:  # a zero form: every statistic NULL
                stats = "NULL, " * 7 + "NULL, NULL, NULL, NULL, NULL, NULL, NULL"
            else:
                se, pairing, parity, pr, theta_d, theta_p, corr = values
                c_sym, d_sym = PROFILE[parity]
                stats = (f"{se}, {pairing}, '{parity}', {pr}, {theta_d}, {theta_p}, {corr}, {c_sym}, {d_sym}, "
                         f"{0.5 + 0.01 * layer}, {0.9 - se}, {theta_d / 2}, {theta_p / 4}, {0.1 * (head + 1)}")
            heads.append(f"('{model}', {layer}, {head}, '{part}', {head}, {n_pos}, {n_neg}, {n_zero}, "
                         f"{N - n_pos - n_neg}, {n_pos == n == n_neg}, {stats})")
            for idx, value in enumerate(L_SV.get((model, part, layer, head), [float(n - i) for i in range(n)])):
                eigen.append(f"('{model}', {layer}, {head}, '{part}', 'L_sv', {idx}, {value}, 0)")
            (nu, mode_minus, tau), (k_plus, k_minus, k_t) = GAMMA[(model, part)]
            gamma_hist, lognormal_hist = HIST[(model, part)]
            ll_gamma, ll_gengamma = LOGLIK[(model, part)]
            failed = values is None
            for sample, mode, shape in (("S_pos", nu, k_plus), ("S_neg", mode_minus, k_minus), ("T", tau, k_t)):
                hist = gamma_hist if sample == "S_pos" else 0.3
                fits.append(f"('{model}', {layer}, {head}, '{part}', '{sample}', 'gamma', "
                            + ("NULL, NULL, NULL, NULL, 0, 'failed')" if failed else
                               f"{shape}, {mode}, {ll_gamma}, {hist}, {n}, 'ok')"))
            fits.append(f"('{model}', {layer}, {head}, '{part}', 'S_pos', 'lognormal', "
                        + ("NULL, NULL, NULL, NULL, 0, 'failed')" if failed else
                           f"1.0, NULL, 0.0, {lognormal_hist}, {n}, 'ok')"))
            fits.append(f"('{model}', {layer}, {head}, '{part}', 'S_pos', 'gengamma', "
                        + ("NULL, NULL, NULL, NULL, 0, 'failed')" if failed else
                           f"NULL, NULL, 0.0, 0.9, {n}, 'boundary')" if ll_gengamma is None else
                           f"1.0, NULL, {ll_gengamma}, 0.95, {n}, 'ok')"))
            typed = TYPES[(model, part)][PLACES.index((layer, head))]
            if typed is not None:
                types.append(f"('{model}', {layer}, {head}, '{part}', {layer}, {head}, 0, {typed[0]}, {typed[1]})")
            for delta, (parity, pairing) in PROFILES.get((model, part), {}).items():
                profiles.append(f"('{model}', {layer}, {head}, '{part}', {delta}, 1.0, 0.5, 0.5, 0.5, 0, 0, "
                                f"'{parity}', {pairing + 0.01 * head})")
        for layer, head in PLACES:
            if part != "rope":  # behaviour and OV rows have no part: one per (model, layer, head)
                behaviour.append(f"('{model}', {layer}, {head}, {0.1 * (layer * 2 + head + 1)}, 0.1, 0.1, 1.0, 1.0, "
                                 f"0.0, 0.0, 8, 2, 0)")
                ov.append(f"('{model}', {layer}, {head}, {head}, {n}, {n}, 0, {N - 2 * n}, true, 'I+', 0.5, 0.5)")
    con.execute("INSERT INTO heads (model, layer, head, part, kv_head, n_pos, n_neg, n_zero, n_zero_ambient, "
                "balanced, symmetric_energy, pairing, parity, participation_ratio, theta_distance, theta_position, "
                "sigma_lambda_correlation, c_sym, d_sym, random_symmetric_energy, random_pairing, "
                "random_theta_distance, random_theta_position, geometric_mean_error) VALUES " + ", ".join(heads))
    con.execute("INSERT INTO eigenvalues VALUES " + ", ".join(eigen))
    con.execute("INSERT INTO fits (model, layer, head, part, sample, family, shape, mode, loglik, hist_error, n, "
                "status) VALUES " + ", ".join(fits))
    con.execute("INSERT INTO head_types VALUES " + ", ".join(types))
    con.execute("INSERT INTO distance_profiles VALUES " + ", ".join(profiles))
    con.execute("INSERT INTO head_behaviour VALUES " + ", ".join(behaviour))
    # ov rows of the latent model too (extraction writes none for it): they must meet no part of its heads
    con.execute("INSERT INTO ov_heads (model, layer, head, kv_head, n_pos, n_neg, n_zero, n_zero_ambient, balanced, "
                "parity, copying_score, residual_copying_score) VALUES " + ", ".join(ov))
    for (model, part), (low, high) in INTERVALS.items():
        con.execute("INSERT INTO intervals VALUES (?, ?, 'parity_by_model', 'pct_type_I_plus', 'layer', NULL, ?, ?, "
                    "20, 0)", [model, part, low, high])
    con.close()


@pytest.fixture(scope="module")
def parts_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("parts") / "parts.duckdb"
    build(path)
    return path


@pytest.fixture
def con(parts_db):
    with connect(parts_db, read_only=True) as con:
        yield con


def rows(con, view: str, columns: str = "*", where: str = "true") -> list[tuple]:
    """The view's rows (its own order), of the columns asked for."""
    return con.sql(f"SELECT {columns} FROM {view} WHERE {where}").fetchall()


KEYS = [("dense", "whole"), ("latent", "nope"), ("latent", "rope")]
PER_PART = ["model_medians", "parity_by_model", "theta_accumulation", "signature_check", "fit_ratios_by_model",
            "head_types_by_model"]


@pytest.mark.parametrize("view", PER_PART)
def test_per_model_views_have_a_row_per_part_with_part_after_model(con, view):
    assert con.sql(f"SELECT * FROM {view}").columns[:2] == ["model", "part"]
    assert rows(con, view, "model, part") == KEYS


def test_medians_and_shares_are_each_parts_own(con):
    got = {(m, p): rest for m, p, *rest in rows(
        con, "model_medians", "model, part, heads, median_symmetric_energy, median_pairing, "
                              "median_participation_ratio, share_participation_below_2, share_above_random")}
    assert got[("dense", "whole")] == pytest.approx([4, 0.75, 0.75, 3.0, 0.25, 1.0])
    # the zero form counts in heads, in no median and in no share
    assert got[("latent", "nope")] == pytest.approx([4, 0.2, 0.3, 1.4, 2 / 3, 0.0])
    assert got[("latent", "rope")] == pytest.approx([4, 0.8, 0.175, 1.1, 1.0, 1.0])


def test_parity_shares_are_each_parts_own(con):
    assert rows(con, "parity_by_model") == [("dense", "whole", 4, 50.0, 25.0, 25.0),
                                            ("latent", "nope", 4, 0.0, 25.0, 50.0),  # the zero form: no type
                                            ("latent", "rope", 4, 75.0, 25.0, 0.0)]
    assert rows(con, "parity_by_layer", "model, part, layer, heads, pct_type_I_plus, pct_type_I_minus") == [
        ("dense", "whole", 0, 2, 50.0, 0.0), ("dense", "whole", 1, 2, 50.0, 50.0),
        ("latent", "nope", 0, 2, 0.0, 100.0), ("latent", "nope", 1, 2, 0.0, 0.0),
        ("latent", "rope", 0, 2, 100.0, 0.0), ("latent", "rope", 1, 2, 50.0, 0.0)]
    # each tolerance classifies the profiles as their parity: Table 2 at every tolerance, per part
    sensitivity = rows(con, "parity_sensitivity", "model, part, heads, pct_type_I_plus, pct_type_II, pct_type_I_minus")
    assert len(sensitivity) == 3 * 5 and set(sensitivity) == set(rows(con, "parity_by_model"))
    assert con.sql("SELECT * FROM parity_sensitivity").columns[:3] == ["model", "part", "tolerance"]


def test_signature_check_counts_and_explains_each_part_with_its_own_head_size(con):
    assert rows(con, "signature_check") == [
        ("dense", "whole", 4, 4, 0, [], None),
        ("latent", "nope", 4, 2, 2, ["L0.H1: 3+/4-", "L1.H1: 0+/0-"], "rank-deficient W_Q or W_K (2 heads)"),
        ("latent", "rope", 4, 3, 1, ["L0.H1: 2+/1-"], "W_Q and W_K rows share directions (1 head)")]


def test_spectral_geometry_and_fit_ratios_are_each_parts_own(con):
    geometry = con.sql("SELECT * FROM spectral_geometry").pl()
    assert geometry.columns[:4] == ["model", "part", "layer", "head"] and geometry.height == 12  # one per heads row
    assert geometry.select("model", "part", "layer", "head").rows() == [
        (m, p, layer, head) for m, p in KEYS for layer, head in PLACES]
    ratios = {(m, p): (mode, shape) for m, p, mode, shape in geometry.filter(pl.col("retained"))
              .select("model", "part", "mode_ratio", "shape_ratio").unique().rows()}
    assert ratios == {("dense", "whole"): (1.0, 1.0), ("latent", "nope"): (2.0, 2.0), ("latent", "rope"): (0.5, 0.5)}
    assert rows(con, "fit_ratios_by_model", "model, part, retained, excluded, median_mode_ratio, median_shape_ratio, "
                                            "median_correlation") == [
        ("dense", "whole", 4, 0, 1.0, 1.0, pytest.approx(0.75)),
        ("latent", "nope", 3, 1, 2.0, 2.0, pytest.approx(0.2)),  # the zero form's fits failed: not retained
        ("latent", "rope", 4, 0, 0.5, 0.5, pytest.approx(-0.25))]
    # the paper's per-head file holds whole heads only
    assert rows(con, "paper_spectral_geometry", "DISTINCT model") == [("dense",)]
    assert len(rows(con, "paper_spectral_geometry")) == 4


def test_survey_ranges_range_each_part_apart(con):
    got = rows(con, "survey_ranges")
    assert [(s, p) for s, p, *_ in got] == [(s, p) for s in ("mode_ratio", "shape_ratio", "sigma_lambda_correlation")
                                            for p in ("nope", "rope", "whole")]
    by = {(s, p): rest for s, p, *rest in got}
    assert by[("mode_ratio", "nope")] == [2.0, 2.0, 1, 3, 1]
    assert by[("mode_ratio", "whole")] == [1.0, 1.0, 1, 4, 0]
    assert by[("sigma_lambda_correlation", "rope")] == [pytest.approx(-0.25), pytest.approx(-0.25), 1, 4, 0]


def test_theta_accumulation_is_each_parts_own(con):
    got = {(m, p): tuple(rest) for m, p, *rest in rows(
        con, "theta_accumulation", "model, part, heads, median_theta_distance, share_closer_to_theta")}
    assert got == {("dense", "whole"): (4, pytest.approx(0.25), 0.75),
                   ("latent", "nope"): (4, pytest.approx(0.6), pytest.approx(1 / 3)),
                   ("latent", "rope"): (4, pytest.approx(0.025), 1.0)}


def test_fit_errors_and_nested_tests_compare_a_parts_own_fits(con):
    best = {(m, p, f): (heads, share) for m, p, f, heads, share in rows(
        con, "fit_errors_by_model", "model, part, family, heads, share_best_hist_error", "sample = 'S_pos'")}
    assert best[("dense", "whole", "gamma")] == (4, 1.0)
    assert best[("latent", "nope", "lognormal")] == (4, 0.75)  # the zero form's failed fits win nothing
    assert best[("latent", "rope", "gamma")] == (4, 0.5) and best[("latent", "rope", "lognormal")] == (4, 0.5)
    assert rows(con, "nested_fit_tests", "model, part, heads, gengamma_boundary, tested_vs_gamma, "
                                         "share_better_than_gamma", "sample = 'S_pos'") == [
        ("dense", "whole", 4, 0, 4, 1.0), ("latent", "nope", 4, 0, 3, 0.0), ("latent", "rope", 4, 4, 0, None)]


def test_head_types_are_compared_with_their_own_parts_parity(con):
    assert rows(con, "head_types_by_model") == [
        ("dense", "whole", 4, 2, 0.5, pytest.approx(-2 / 7)),
        ("latent", "nope", 3, 3, pytest.approx(0.2), 0.0),
        ("latent", "rope", 4, 1, 0.0, 0.0)]


def test_parity_by_distance_has_the_rotary_parts_alone(con):
    assert rows(con, "parity_by_distance", "model, part, delta, heads, pct_type_I_plus, pct_type_I_minus, "
                                           "median_pairing") == [
        ("dense", "whole", 0, 4, 100.0, 0.0, pytest.approx(0.805)),
        ("dense", "whole", 1, 4, 0.0, 0.0, pytest.approx(0.605)),
        ("latent", "rope", 0, 4, 0.0, 100.0, pytest.approx(0.305)),
        ("latent", "rope", 1, 4, 0.0, 100.0, pytest.approx(0.105))]


def test_model_intervals_meet_their_own_parts_interval(con):
    got = rows(con, "model_intervals", "model, part, estimate, layer_low, layer_high",
               "view = 'parity_by_model' AND figure = 'pct_type_I_plus'")
    assert got == [("dense", "whole", 50.0, 40.0, 60.0), ("latent", "nope", 0.0, 0.0, 10.0),
                   ("latent", "rope", 75.0, 70.0, 80.0)]
    (count,), = rows(con, "model_intervals", "count(*)")
    # per (model, part) the four views' figures, each once (but the medians of rho, lobe_departure and stable_rank,
    # NULL here, which the UNPIVOT leaves out)
    assert count == 3 * (3 + 11 - 3 + 4 + 6)


def test_behaviour_views_type_a_head_by_each_of_its_parts(con):
    """head_behaviour has no part: a latent head's row is typed by its nope part's parity, and again by its rope
    part's (never pooled); the copying columns meet whole heads only (the latent model's OV rows stay out). Self
    scores by place: 0.1, 0.2, 0.3, 0.4; c_sym - d_sym by parity (PROFILE): I+ 0.4, II 0, I- -0.4."""
    approx = pytest.approx
    assert rows(con, "behaviour_by_parity", "model, part, parity, heads, median_self_score, median_copying_score") == [
        ("dense", "whole", "I+", 2, approx(0.25), 0.5), ("dense", "whole", "II", 1, approx(0.2), 0.5),
        ("dense", "whole", "I-", 1, approx(0.3), 0.5), ("dense", "whole", "I+ - I-", None, approx(-0.05), 0.0),
        ("latent", "nope", "II", 1, approx(0.3), None), ("latent", "nope", "I-", 2, approx(0.15), None),
        ("latent", "rope", "I+", 3, approx(0.2), None), ("latent", "rope", "II", 1, approx(0.4), None)]
    where = "model = 'latent' AND score = 'self_score'"
    assert rows(con, "behaviour_correlations", "part, statistic, heads, spearman", where) == [
        ("nope", "c_sym_minus_d_sym", 3, approx(3 ** 0.5 / 2)), ("nope", "pairing", 3, approx(1.0)),
        ("nope", "symmetric_energy", 3, approx(1.0)), ("rope", "c_sym_minus_d_sym", 4, approx(-3 / 15 ** 0.5)),
        ("rope", "pairing", 4, approx(1.0)), ("rope", "symmetric_energy", 4, approx(-1.0))]


def test_ov_views_read_whole_heads_alone(con):
    assert rows(con, "circuit_parity", "DISTINCT model") == [("dense",)]
    assert sum(heads for heads, in rows(con, "circuit_parity", "heads")) == 4
    assert rows(con, "copying_by_parity", "parity, heads") == [("I+", 2), ("II", 1), ("I-", 1), ("I+ - I-", None)]


def test_the_paper_views_compare_whole_heads_alone(parts_db, tmp_path):
    """Named as two of the paper's models, the dense model's figures are compared and the latent model's parts stay
    out of every figure (a figure of its model has no headforms value), each paper_reference row once."""
    path = tmp_path / "paper.duckdb"
    shutil.copy(parts_db, path)
    with duckdb.connect(str(path)) as con:
        for old, new in (("dense", "gpt2"), ("latent", "distilgpt2")):
            for table in ("models", "heads", "fits", "eigenvalues", "head_types", "distance_profiles", "intervals",
                          "head_behaviour", "ov_heads"):
                con.execute(f"UPDATE {table} SET model = ? WHERE model = ?", [new, old])
    with connect(path, read_only=True) as con:
        (references,), = rows(con, "paper_reference", "count(*)")
        assert len(rows(con, "paper_comparison")) == references
        values = {(m, f): v for m, f, v in rows(con, "paper_comparison", "model, figure, headforms", "scope = 'model'")}
        assert values[("gpt2", "heads")] == 4 and values[("gpt2", "pct_type_I_plus")] == 50.0
        assert values[("distilgpt2", "heads")] is None and values[("distilgpt2", "pct_type_I_plus")] is None
        survey = dict(rows(con, "paper_comparison", "figure, headforms", "scope = 'survey'"))
        assert survey["heads"] == 4 and survey["min_median_pairing"] == survey["max_median_pairing"] == 0.75
        assert rows(con, "paper_head_statistics", "DISTINCT model") == [("gpt2",)]
        assert rows(con, "paper_gamma_goodness_of_fit", "DISTINCT model") == [("gpt2",)]
        assert rows(con, "paper_gamma_goodness_of_fit_summary", "model, component, heads") == [
            ("gpt2", "S_positive", 4)]


def test_folded_and_dynamics_views_pair_parts_with_their_own(parts_db, tmp_path):
    """A folded copy of the latent model (its rope part's pairing moved) is compared part by part; as training
    checkpoints, both models' rows carry their part."""
    path = tmp_path / "folded.duckdb"
    shutil.copy(parts_db, path)
    with duckdb.connect(str(path)) as con:
        con.execute("INSERT INTO models SELECT * REPLACE ('latent-folded' AS model, 'gain' AS fold_norm) FROM models "
                    "WHERE model = 'latent'")
        con.execute("INSERT INTO heads SELECT * REPLACE ('latent-folded' AS model) FROM heads WHERE model = 'latent'")
        con.execute("UPDATE heads SET pairing = pairing + 0.5 WHERE model = 'latent-folded' AND part = 'rope'")
        con.execute("UPDATE models SET base_model = 'run', training_step = CASE model WHEN 'dense' THEN 0 ELSE 1 END "
                    "WHERE model IN ('dense', 'latent')")
    with connect(path, read_only=True) as con:
        assert rows(con, "fold_norm_comparison", "model, part, folded_model, heads, median_pairing, "
                                                 "folded_median_pairing, pct_parity_changed") == [
            ("latent", "nope", "latent-folded", 4, 0.3, 0.3, 0.0),
            ("latent", "rope", "latent-folded", 4, pytest.approx(0.175), pytest.approx(0.675), 0.0)]
        assert rows(con, "dynamics_by_step", "training_step, model, part, heads, pct_type_I_plus, median_pairing") == [
            (0, "dense", "whole", 4, 50.0, 0.75), (1, "latent", "nope", 4, 0.0, 0.3),
            (1, "latent", "rope", 4, 75.0, pytest.approx(0.175))]


def test_a_part_of_null_statistics_stays_null(parts_db, tmp_path):
    """A part whose every head is a zero form (NULL statistics, failed fits) has its row, with NULL medians and
    shares and its heads counted; the other part's values are unchanged."""
    path = tmp_path / "nulls.duckdb"
    shutil.copy(parts_db, path)
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE heads SET symmetric_energy = NULL, pairing = NULL, parity = NULL, participation_ratio = "
                    "NULL, theta_distance = NULL, theta_position = NULL, sigma_lambda_correlation = NULL, "
                    "geometric_mean_error = NULL WHERE model = 'latent' AND part = 'rope'")
        con.execute("UPDATE fits SET mode = NULL, shape = NULL, loglik = NULL, hist_error = NULL, status = 'failed' "
                    "WHERE model = 'latent' AND part = 'rope'")
    with connect(path, read_only=True) as con:
        assert rows(con, "model_medians", "part, heads, median_symmetric_energy, median_pairing, "
                                          "share_participation_below_2", "model = 'latent'") == [
            ("nope", 4, pytest.approx(0.2), pytest.approx(0.3), pytest.approx(2 / 3)), ("rope", 4, None, None, None)]
        assert rows(con, "parity_by_model", where="model = 'latent'") == [
            ("latent", "nope", 4, 0.0, 25.0, 50.0), ("latent", "rope", 4, 0.0, 0.0, 0.0)]
        assert rows(con, "fit_ratios_by_model", "part, retained, excluded, median_mode_ratio, median_correlation",
                    "model = 'latent'") == [("nope", 3, 1, 2.0, pytest.approx(0.2)), ("rope", 0, 4, None, None)]
        assert rows(con, "theta_accumulation", "part, heads, median_theta_distance, share_closer_to_theta",
                    "model = 'latent'") == [("nope", 4, pytest.approx(0.6), pytest.approx(1 / 3)),
                                            ("rope", 4, None, None)]
        assert rows(con, "survey_ranges", "part, low, high, models", "statistic = 'mode_ratio'") == [
            ("nope", 2.0, 2.0, 1), ("rope", None, None, 1), ("whole", 1.0, 1.0, 1)]


def test_figures_and_report_draw_a_panel_per_part(parts_db, tmp_path):
    """Per-head figures and the report take a latent model's parts apart (a panel, an index row each) and draw a
    whole model under its own name."""
    from headforms.warehouse.publishing import figures
    from headforms.warehouse.publishing.report import write_report

    assert [name for name, _ in figures._by_model(pl.DataFrame({
        "model": ["dense", "latent", "latent"], "part": ["whole", "nope", "rope"]}))] == [
        "dense", "latent (nope)", "latent (rope)"]
    with connect(parts_db, read_only=True) as con:
        drawn = figures.draw_all(con, tmp_path)
        assert {p.name for p in drawn} >= {"figure12_parity_by_layer.png", "figure11_pairing.png"}
        pages = write_report(con, tmp_path / "report")
    index = (tmp_path / "report" / "index.html").read_text()
    assert all(f">{name}</a>" in index for name in ("dense", "latent (nope)", "latent (rope)"))
    latent = (tmp_path / "report" / "model-latent.html").read_text()
    assert 'id="simplex-nope"' in latent and 'id="simplex-rope"' in latent and 'id="simplex"' not in latent
    # the nope part's parity by layer is its own (parity_by_layer of that part: no I+ head, two layers)
    nope = latent[latent.index('Plotly.newPlot(                        "parity-by-layer-nope"'):]
    nope = nope[:nope.index("</script>")]
    assert '"name":"I+","x":[0,1],"y":[0.0,0.0]' in nope and '"name":"I-","x":[0,1],"y":[100.0,0.0]' in nope
    assert 'id="simplex"' in (tmp_path / "report" / "model-dense.html").read_text()
    assert len(pages) == 1 + 2 * (1 + 2)
