"""Figure 5's head types: the projection against the eigenvectors of the Gram matrix, silhouette and the
adjusted Rand index against their pair-by-pair definitions, k-means against scipy on separated blobs, and
the head_types table and head_types_by_model view of the demo warehouse against the same references."""
from itertools import combinations

import numpy as np
import polars as pl
import pytest
from scipy.spatial.distance import cdist

from headforms.compute.head_types import adjusted_rand_index, head_types, kmeans, projection, silhouette, unit_spectra


def silhouette_reference(points, labels):
    """Rousseeuw's silhouette point by point (scipy distances); 0 for a point alone in its cluster."""
    d = cdist(points, points)
    out = []
    for i, own in enumerate(labels):
        mates = (labels == own) & (np.arange(len(labels)) != i)
        if not mates.any():
            out.append(0.0)
            continue
        a = d[i, mates].mean()
        b = min(d[i, labels == other].mean() for other in set(labels) - {own})
        out.append((b - a) / max(a, b))
    return np.array(out)


def ari_reference(first, second):
    """Adjusted Rand index from the four pair counts (Steinley 2004): 2(ad - bc) / ((a+b)(b+d) + (a+c)(c+d))."""
    a = b = c = d = 0
    for i, j in combinations(range(len(first)), 2):
        same_first, same_second = first[i] == first[j], second[i] == second[j]
        a += same_first and same_second
        b += same_first and not same_second
        c += same_second and not same_first
        d += not same_first and not same_second
    denominator = (a + b) * (b + d) + (a + c) * (c + d)
    return 1.0 if denominator == 0 else 2 * (a * d - b * c) / denominator


def blobs(seed=0, sizes=(40, 25, 12)):
    rng = np.random.default_rng(seed)
    centres = np.array([[0, 0, 0], [4, 0, 0], [0, 4, 1]])
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return centres[labels] + 0.3 * rng.standard_normal((len(labels), 3)), labels


def test_silhouette_is_the_definition():
    points, labels = blobs()
    rng = np.random.default_rng(1)
    noisy = rng.integers(0, 4, len(labels))
    noisy[0] = 9                                    # a one-point cluster
    for lab in (labels, noisy):
        np.testing.assert_allclose(silhouette(points, lab), silhouette_reference(points, lab), atol=1e-12)


def test_adjusted_rand_index_is_the_pair_count_formula():
    rng = np.random.default_rng(2)
    for _ in range(20):
        first, second = rng.integers(0, 4, 30), rng.integers(0, 3, 30)
        second[:15] = first[:15]
        assert adjusted_rand_index(first, second) == pytest.approx(ari_reference(first, second), abs=1e-12)
    # by hand: [0,0,1,1] vs [0,0,1,2] has a=1, b=1, c=0, d=4 pairs: 2*4 / (2*5 + 1*4) = 4/7
    assert adjusted_rand_index(np.array([0, 0, 1, 1]), np.array([0, 0, 1, 2])) == pytest.approx(4 / 7)
    assert adjusted_rand_index(np.array([0, 0, 1, 1]), np.array(["b", "b", "a", "a"])) == 1.0
    # the degenerate partitions (one cluster, or every item its own) agree perfectly, as sklearn defines it, while
    # the formula's 0/0 would be NaN
    assert adjusted_rand_index(np.zeros(5, int), np.full(5, 7)) == 1.0
    assert adjusted_rand_index(np.arange(5), np.arange(5)[::-1]) == 1.0


def test_kmeans_finds_separated_blobs_and_k():
    points, labels = blobs()
    types, scores = head_types(points, seed=3)
    assert len(np.unique(types)) == 3
    assert adjusted_rand_index(types, labels) == 1.0
    assert np.bincount(types).tolist() == [40, 25, 12]           # type 0 the largest
    np.testing.assert_allclose(scores, silhouette_reference(points, types), atol=1e-12)
    np.testing.assert_array_equal(kmeans(points, 3, seed=3), types)  # seeded: the same types again


def leading_directions(x, count=3):
    """The leading eigenvectors of X^T X, each signed so that its largest-magnitude entry is positive (the
    convention of docs/statistics.md: LAPACK's signs are arbitrary)."""
    _, vectors = np.linalg.eigh(x.T @ x)
    lead = vectors[:, ::-1][:, :count]
    return lead * np.sign(lead[np.abs(lead).argmax(axis=0), np.arange(lead.shape[1])])


def test_projection_is_the_gram_eigenvectors():
    """Coordinates on the right singular vectors = projections on the leading eigenvectors of X^T X, signed by the
    convention, whatever LAPACK's signs (the same points with a reversed row order give the same coordinates)."""
    rng = np.random.default_rng(4)
    x = unit_spectra(rng.standard_normal((50, 16)) + np.linspace(2, -2, 16))
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1)
    assert (np.diff(x, axis=1) <= 0).all()
    coords = projection(x)
    np.testing.assert_allclose(coords, x @ leading_directions(x), atol=1e-10)
    np.testing.assert_allclose(projection(x[::-1])[::-1], coords, atol=1e-10)


def test_zero_spectrum_is_undefined():
    assert np.isnan(unit_spectra(np.zeros((1, 4)))).all()


def test_stored_head_types(demo_con):
    """Coordinates from the stored eigenvalues of S via X^T X, with the sign convention, silhouettes by definition,
    every head typed."""
    eig = demo_con.sql("""select model, layer, head, value from eigenvalues where spectrum = 'S'
                          order by model, layer, head, idx""").pl()
    stored = demo_con.sql("select * from head_types order by model, layer, head").pl()
    for model in ("SmolLM2-135M", "all-MiniLM-L6-v2"):
        rows = eig.filter(pl.col("model") == model)
        n_heads = rows.select("layer", "head").unique().height
        x = rows["value"].to_numpy().reshape(n_heads, -1)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        expected = x @ leading_directions(x)
        mine = stored.filter(pl.col("model") == model)
        assert mine.height == n_heads
        np.testing.assert_allclose(mine.select("x", "y", "z").to_numpy(), expected, atol=1e-9)  # signed
        types = mine["type"].to_numpy()
        np.testing.assert_allclose(mine["silhouette"].to_numpy(),
                                   silhouette_reference(mine.select("x", "y", "z").to_numpy(), types), atol=1e-12)


def test_head_types_by_model_view(demo_con):
    view = demo_con.sql("select * from head_types_by_model order by model").pl()
    typed = demo_con.sql("select * from head_types join heads using (model, layer, head) order by model").pl()
    assert view["model"].to_list() == ["SmolLM2-135M", "all-MiniLM-L6-v2"]
    for row in view.iter_rows(named=True):
        mine = typed.filter(pl.col("model") == row["model"])
        assert row["heads"] == mine.height
        assert row["k"] == mine["type"].n_unique()
        assert row["silhouette"] == pytest.approx(mine["silhouette"].mean(), rel=1e-12)
        assert row["ari_parity"] == pytest.approx(ari_reference(mine["type"].to_list(), mine["parity"].to_list()),
                                                  abs=1e-12)
        # k is the candidate with the best mean silhouette
        points = mine.select("x", "y", "z").to_numpy()
        for k in range(2, 9):
            other = kmeans(points, k, seed=0)
            assert silhouette_reference(points, other).mean() <= row["silhouette"] + 1e-12


def test_kmeans_keeps_the_restart_with_the_least_within_type_sum_of_squares():
    """On structureless points the seeded k-means++ restarts end in different partitions; kmeans returns the one
    whose within-type sum of squares is least, recomputed here from scipy's runs with the same seeds."""
    import warnings

    from scipy.cluster.vq import kmeans2

    from headforms.compute.head_types import RESTARTS

    points, k, seed = np.random.default_rng(5).uniform(size=(60, 3)), 5, 11
    runs = []
    for restart in range(RESTARTS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            centres, labels = kmeans2(points, k, minit="++", seed=np.random.default_rng([seed, k, restart]))
        runs.append((((points - centres[labels]) ** 2).sum(), labels))
    assert len({round(inertia, 9) for inertia, _ in runs}) > 1, "the restarts should disagree"
    best = min(runs, key=lambda run: run[0])[1]
    assert adjusted_rand_index(kmeans(points, k, seed), best) == 1.0


@pytest.mark.parametrize("points", [np.ones((5, 3)), np.eye(3)[:2]])
def test_too_few_distinct_points_are_one_type(points):
    """Coinciding points (k-means finds one type) or too few points for two types: all type 0, silhouette 0."""
    types, scores = head_types(points, seed=0)
    assert types.tolist() == [0] * len(points) and types.dtype.kind == "i"
    assert scores.tolist() == [0.0] * len(points)
