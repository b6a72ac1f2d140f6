"""Observation 2's theta_distance and theta_position against a numerical minimisation, the closed forms of
statistics.md sections 5 and 7, dense profiles of the random baseline heads, and the theta_accumulation view."""
import duckdb
import numpy as np
import polars as pl
import pytest
from scipy.optimize import minimize_scalar

from headforms.compute.analysis import analyse_layer
from headforms.compute.baseline import random_forms
from headforms.compute.statistics import theta
from headforms.warehouse.storing.store import connect

MIDPOINT = np.array([0.5, 0.5, 0.0, 0.0])
SEGMENTS = (np.array([1.0, 1.0, -2.0, 0.0]), np.array([1.0, 1.0, 0.0, -2.0]))


def theta_reference(p: np.ndarray) -> tuple[float, float]:
    """Distance to Theta by bounded scalar minimisation over each segment m + t v, t in [-1/2, 0]."""
    best = None
    for v in SEGMENTS:
        res = minimize_scalar(lambda t: np.linalg.norm(p - MIDPOINT - t * v), bounds=(-0.5, 0.0), method="bounded",
                              options={"xatol": 1e-12})
        if best is None or res.fun < best[0]:
            best = (res.fun, np.linalg.norm(res.x * v))
    return best


def dense_profile(L: np.ndarray) -> np.ndarray:
    """(a, b, c, d) of a dense square form from numpy's eigvalsh (statistics.md section 3)."""
    S, T = (L + L.T) / 2, (L - L.T) / 2
    eig = np.linalg.eigvalsh(S)
    plus = np.sort(eig[eig > 0])[::-1]
    minus = np.sort(-eig[eig < 0])[::-1]
    size = max(len(plus), len(minus))
    plus, minus = np.pad(plus, (0, size - len(plus))), np.pad(minus, (0, size - len(minus)))
    u, l2 = plus - minus, (L**2).sum()
    return np.array([(T**2).sum(), 2 * plus @ minus, (u[u > 0] ** 2).sum(), (u[u < 0] ** 2).sum()]) / l2


def test_theta_matches_minimisation_over_the_simplex():
    rng = np.random.default_rng(1)
    profiles = np.vstack([rng.dirichlet(np.full(4, 0.5), size=300), rng.dirichlet([5, 5, 0.3, 0.3], size=100)])
    distance, position = theta(profiles)
    expected = np.array([theta_reference(p) for p in profiles])
    np.testing.assert_allclose(distance, expected[:, 0], atol=1e-7)
    np.testing.assert_allclose(position, expected[:, 1], atol=1e-6)


def test_theta_closed_forms():
    """Corners of the simplex and the midpoint; NaN (an undefined profile) stays NaN."""
    profiles = np.array([[0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0], [np.nan] * 4])
    distance, position = theta(profiles)
    # PSD / NSD corners are Theta's ends (s = 0): distance 0, position |t| |v| = sqrt(6)/2. The antisymmetric
    # corner and b = 1 project onto m itself (t = 0): distance ||p - m|| = sqrt(1/2), position 0.
    np.testing.assert_allclose(distance[:5], [0, 0, 0, np.sqrt(0.5), np.sqrt(0.5)], atol=1e-15)
    np.testing.assert_allclose(position[:5], [0, np.sqrt(6) / 2, np.sqrt(6) / 2, 0, 0], atol=1e-15)
    assert np.isnan(distance[5]) and np.isnan(position[5])


def test_rank_one_forms_lie_on_theta():
    """L = W_K^T W_Q with n = 1 is h v u^T: theta_distance 0 and theta_position t^2 sqrt(3/2), t the cosine."""
    rng = np.random.default_rng(2)
    H, N = 40, 24
    wq, wk = rng.standard_normal((H, 1, N)), rng.standard_normal((H, 1, N))
    wk[:10] = np.abs(wk[:10]) * np.sign(wq[:10])   # some strongly aligned (t near 1), the rest random
    stats = analyse_layer(wq, wk, np.arange(H), layer=0, seed=0).statistics
    cosine = (wq[:, 0] * wk[:, 0]).sum(axis=1) / np.linalg.norm(wq[:, 0], axis=1) / np.linalg.norm(wk[:, 0], axis=1)
    np.testing.assert_allclose(stats["theta_distance"], 0, atol=1e-12)
    np.testing.assert_allclose(stats["theta_position"], cosine**2 * np.sqrt(1.5), atol=1e-12)


def test_random_heads_sit_near_the_midpoint():
    """Gaussian heads, and the stored random baseline, have both theta statistics near 0."""
    rng = np.random.default_rng(3)
    H, n, N = 12, 32, 1024
    stats = analyse_layer(rng.standard_normal((H, n, N)), rng.standard_normal((H, n, N)), np.arange(H),
                          layer=0, seed=5).statistics
    for prefix in ("", "random_"):
        assert np.all(stats[f"{prefix}theta_distance"] < 0.02)
        assert np.all(stats[f"{prefix}theta_position"] < 0.02)


def test_random_baseline_theta_equals_dense_profiles(demo_con):
    """The stored random_theta_* of a layer against dense profiles of the same seeded Gaussian heads."""
    model, layer = "SmolLM2-135M", 4
    seed, n_heads, n, N = demo_con.sql(
        f"select baseline_seed, n_heads, head_dim, d_model from models where model = '{model}'").fetchall()[0]
    forms = random_forms(seed, layer, n_heads, n, N)
    expected = np.array([theta_reference(dense_profile(L)) for L in forms])
    stored = demo_con.sql(f"""select random_theta_distance, random_theta_position from heads
                              where model = '{model}' and layer = {layer} order by head""").fetchnumpy()
    np.testing.assert_allclose(stored["random_theta_distance"], expected[:, 0], atol=1e-7)
    np.testing.assert_allclose(stored["random_theta_position"], expected[:, 1], atol=1e-6)


def test_stored_theta_of_every_head(demo_con):
    heads = demo_con.sql("select a, b, c, d, theta_distance, theta_position from heads").pl()
    expected = np.array([theta_reference(p) for p in heads.select("a", "b", "c", "d").to_numpy()])
    np.testing.assert_allclose(heads["theta_distance"].to_numpy(), expected[:, 0], atol=1e-7)
    np.testing.assert_allclose(heads["theta_position"].to_numpy(), expected[:, 1], atol=1e-6)


@pytest.mark.parametrize("copy", [None, "nulls_db", "ties_db"],
                         ids=["demo", "with NULL statistics", "with ties at the thresholds"])
def test_theta_accumulation_view(demo_con, request, copy):
    """The view against polars: on the demo, on its copy where some heads are zero forms (NULL statistics: they
    count in `heads`), and on its copy with theta_distance = theta_position for some heads (not closer)."""
    con = connect(request.getfixturevalue(copy), read_only=True) if copy else demo_con
    heads = con.sql("select * from heads").pl()
    if copy == "ties_db":
        assert heads.filter(pl.col("theta_distance") == pl.col("theta_position")).height >= 4
    if copy == "nulls_db":
        assert heads["theta_distance"].null_count() == 4
    expected = heads.group_by("model", "part").agg(
        heads=pl.len(),
        **{f"median_{c}": pl.col(c).median() for c in
           ("theta_distance", "theta_position", "random_theta_distance", "random_theta_position")},
        share_closer_to_theta=(pl.col("theta_distance") < pl.col("theta_position")).mean(),
        random_share_closer_to_theta=(pl.col("random_theta_distance") < pl.col("random_theta_position")).mean(),
    ).sort("model", "part")
    actual = con.sql("select * from theta_accumulation order by model, part").pl()
    assert actual.columns == expected.columns
    for column in expected.columns[2:]:
        np.testing.assert_allclose(actual[column].to_numpy(), expected[column].to_numpy(), rtol=1e-12, atol=0)
    # Observation 2 on the demo: trained heads lie farther along Theta than their random baseline heads
    assert (actual["median_theta_position"] > 10 * actual["median_random_theta_position"]).all()


def test_old_warehouses_gain_the_columns(tmp_path):
    """A heads table created without the theta columns gets them (NULL) when the schema is applied."""
    from headforms.warehouse.storing.store import SCHEMA, create_schema

    columns = ["theta_distance", "theta_position", "random_theta_distance", "random_theta_position"]
    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    old_heads = SCHEMA.read_text().split("CREATE TABLE IF NOT EXISTS heads")[1].split(");")[0]
    old_heads = "\n".join(line for line in old_heads.splitlines() if "theta" not in line)
    con.execute(f"CREATE TABLE heads {old_heads});")
    con.execute("INSERT INTO heads (model, layer, head, kv_head, n_pos, n_neg, n_zero, n_zero_ambient, balanced) "
                "VALUES ('m', 0, 0, 0, 1, 1, 0, 2, true)")
    assert not set(columns) & set(con.sql("select * from heads").columns)
    create_schema(con)
    assert con.sql(f"select {', '.join(columns)} from heads").fetchall() == [(None,) * 4]
