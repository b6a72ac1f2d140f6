"""The interactive report: a static site that works offline, checked in a real browser (headless Chromium)."""
import base64
import json
import re
import shutil
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from headforms import cli
from headforms.warehouse.publishing.report import layer_page, model_page, simplex_points, VERTICES
from tests.reviewed import reviewed_file

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = ROOT / "build" / "report-screenshots"  # for a person to look at after `make test`


@pytest.fixture(scope="module")
def report(demo_db, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "site"
    result = CliRunner().invoke(cli.main, ["report", "--db", str(demo_db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(demo_db), read_only=True) as con:
        models = con.execute("SELECT model, n_layers, (SELECT count(*) FROM heads h WHERE h.model = m.model "
                             "AND h.a IS NOT NULL) FROM models m ORDER BY model").fetchall()
    return out, models


def test_site_has_every_page_and_no_outside_resource(report):
    out, models = report
    pages = {p.name for p in out.glob("*.html")}
    expected = {"index.html"} | {model_page(m) for m, _, _ in models} | {
        layer_page(m, i) for m, layers, _ in models for i in range(layers)}
    assert pages == expected
    assert (out / "plotly.min.js").stat().st_size > 1_000_000  # the library itself, bundled
    for page in out.glob("*.html"):
        text = page.read_text()
        assert re.findall(r'<script src="([^"]+)"', text) == ["plotly.min.js"], page.name
        assert not re.search(r'(src|href)="(https?:)?//', text), page.name
    index = (out / "index.html").read_text()
    for model, _, _ in models:
        assert f'href="{model_page(model)}"' in index


def test_simplex_coordinates_are_barycentric():
    """Vertex profiles land on the tetrahedron's vertices, the midpoint (1/2, 1/2, 0, 0) between a and b."""
    import numpy as np
    import polars as pl

    profiles = pl.DataFrame({"a": [1.0, 0., 0., 0., 0.5], "b": [0., 1.0, 0., 0., 0.5], "c": [0., 0., 1.0, 0., 0.],
                             "d": [0., 0., 0., 1.0, 0.]})
    points = simplex_points(profiles)
    np.testing.assert_allclose(points[:4], VERTICES)
    np.testing.assert_allclose(points[4], (VERTICES[0] + VERTICES[1]) / 2)
    edges = np.linalg.norm(VERTICES[:, None] - VERTICES[None], axis=2)[np.triu_indices(4, 1)]
    np.testing.assert_allclose(edges, edges[0])  # regular: every edge the same length


def _browser():
    if CHROMIUM is None:
        pytest.fail("no Chromium on this machine: `make test` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    return sync_playwright()


def test_every_page_loads_in_chromium_without_errors(report):
    out, models = report
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with _browser() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
            "--disable-background-networking", "--disable-component-update", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        errors, requests = [], []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        points = {}
        for html in sorted(out.glob("*.html")):
            page.goto(html.as_uri())
            page.wait_for_load_state("load")
            counts = page.evaluate(
                "() => Object.fromEntries(Array.from(document.querySelectorAll('.js-plotly-plot')).map("
                "gd => [gd.id, gd.data.filter(t => t.meta === 'heads').reduce((s, t) => s + t.x.length, 0)]))")
            if "simplex" in counts:
                points[html.name] = counts["simplex"]
                # plotly draws the 3-D scene on a WebGL canvas: the scene must exist and be drawn
                assert page.locator("#simplex .gl-container canvas").count() >= 1, html.name
            assert page.locator(".js-plotly-plot").count() >= (0 if html.name == "index.html" else 1), html.name
            page.screenshot(path=str(SCREENSHOTS / f"{html.stem}.png"))
        browser.close()
    assert errors == []
    assert all(url.startswith("file://") for url in requests), [u for u in requests if not u.startswith("file:")]
    assert points == {model_page(m): heads for m, _, heads in models}  # one point per head


def test_index_shows_the_layer_bootstrap_interval_beside_a_figure(demo_db, tmp_path):
    from headforms.warehouse.publishing.report import write_report
    from headforms.warehouse.storing.store import connect

    path = tmp_path / "intervals.duckdb"
    shutil.copy(demo_db, path)
    with duckdb.connect(str(path)) as con:
        con.execute("DELETE FROM intervals")
        con.execute("INSERT INTO intervals VALUES "
                    "('SmolLM2-135M', 'whole', 'model_medians', 'median_pairing', 'layer', NULL, 0.8125, 0.875, 10, "
                    "0), ('SmolLM2-135M', 'whole', 'model_medians', 'median_pairing', 'head', NULL, 0.5, 0.75, 10, 0)")
    con = connect(path, read_only=True)
    try:
        (median,), = con.execute("SELECT median_pairing FROM model_medians WHERE model = 'SmolLM2-135M'").fetchall()
        write_report(con, tmp_path / "site")
    finally:
        con.close()
    index = (tmp_path / "site" / "index.html").read_text()
    table = index.split("<table>", 1)[1].split("</table>", 1)[0]
    assert f"<td>{median:.3f} [0.812, 0.875]</td>" in table  # the layer interval, not the head one
    assert table.count("[") == 1


def test_index_keeps_the_digits_that_tell_values_apart_and_draws_every_model(demo_db, demo_con, tmp_path):
    """Observation 7's mode ratios near 1 print with the digits that tell a value from its interval's ends and
    the models apart (not `1 [1, 1.01]`), each rounding from the warehouse's; and a figure shows every model."""
    from headforms.warehouse.publishing.report import write_report

    write_report(demo_con, tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text()
    table = index.split("<table>", 1)[1].split("</table>", 1)[0]
    header = re.findall(r"<th>([^<]*)</th>", table)
    rows = [re.findall(r"<td>(?:<a [^>]*>)?([^<]*)", row) for row in table.split("<tr>")[2:]]
    column = header.index("mode ratio")
    truth = dict(demo_con.execute("SELECT model, median_mode_ratio FROM fit_ratios_by_model").fetchall())
    ends = {m: (lo, hi) for m, lo, hi in demo_con.execute(
        "SELECT model, layer_low, layer_high FROM model_intervals WHERE figure = 'median_mode_ratio'").fetchall()}
    printed = {}
    for row in rows:
        texts = re.findall(r"\d+\.\d+", row[column])
        exact = (truth[row[0]], *ends[row[0]])
        assert len(texts) == 3 and len(set(texts)) == 3, row[column]
        for text, real in zip(texts, exact):
            assert abs(float(text) - real) <= 0.5 * 10 ** -len(text.partition(".")[2]) + 1e-12, (text, real)
        printed[row[0]] = texts[0]
    assert len(set(printed.values())) == len(truth) == 2
    call, = re.finditer(r'Plotly\.newPlot\(\s*"models",\s*', index)
    figure, _ = json.JSONDecoder().raw_decode(index, call.end())
    assert {tuple(trace["x"]) for trace in figure} == {tuple(sorted(truth))}
    assert {trace["name"] for trace in figure} >= {"parity I+", "parity II", "parity I-", "median pairing"}


def _page_figures(db, model: str, layer: int | None = None):
    """The plotly figures the report draws on `model`'s page (and on its `layer`'s page), by div id, and its heads."""
    from headforms.warehouse.publishing import report
    from headforms.warehouse.storing.store import connect, query

    drawn = {}
    con = connect(db, read_only=True)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(report, "_figure_html", lambda fig, div_id: drawn.setdefault(div_id, fig) and "")
            row = query(con, "SELECT * FROM models WHERE model = ?", [model]).row(0, named=True)
            heads = query(con, "SELECT * FROM heads WHERE model = ? ORDER BY layer, head", [model])
            report._model_body(con, row, heads)
            if layer is not None:
                report._layer_body(con, row, layer, heads.filter(pl.col("layer") == layer))
    finally:
        con.close()
    return drawn, heads


@pytest.fixture(scope="module")
def figures(demo_db):
    """The plotly figures of SmolLM2-135M's model page and of its layer 3's page, by div id, with that model's heads."""
    drawn, heads = _page_figures(demo_db, "SmolLM2-135M", layer=3)
    with duckdb.connect(str(demo_db), read_only=True) as con:
        fits = con.sql("SELECT head, sample, shape, scale FROM fits WHERE model = 'SmolLM2-135M' AND layer = 3 "
                       "AND family = 'gamma'").pl()
    return drawn, heads, fits


def test_layer_page_draws_each_lobe_with_its_fitted_gamma_density(figures):
    """Per head and sample: a blue histogram of the stored values and, over 0 to 1.05 x their maximum, the red
    density of the stored gamma fit, named by its shape."""
    from scipy import stats

    drawn, heads, fits = figures
    fig = drawn["spectra"]
    assert fig.layout.title.text == "Histograms (blue) and fitted gamma densities (red)"
    histograms = {t.name: t for t in fig.data if t.type == "histogram"}
    curves = [t for t in fig.data if t.type == "scatter"]
    assert len(histograms) == 3 * 9 and len(curves) == 3 * 9  # SmolLM2: 9 heads, every fit ok
    for t in histograms.values():
        assert t.marker.color == "#9ecae1" and t.histnorm == "probability density"
    for curve, (name, histogram) in zip(curves, histograms.items()):
        head, spectrum = int(name.split()[1]), name.split()[2]
        shape, scale = fits.filter((pl.col("head") == head) & (pl.col("sample") == spectrum.replace("_sigma", ""))
                                   ).select("shape", "scale").row(0)
        np.testing.assert_allclose(curve.x, np.linspace(0, max(histogram.x) * 1.05, 120))
        np.testing.assert_allclose(curve.y, stats.gamma.pdf(curve.x, shape, scale=scale))
        assert curve.line.color == "#d62728" and curve.name == f"gamma fit k={shape:.3g}"


def test_model_page_draws_the_warehouse_numbers(figures):
    """The simplex (axes hidden), parity by layer with its title, and each per-head map as layers x heads in head
    order, equal to the stored column."""
    from headforms.warehouse.publishing.report import PARITY_COLOURS

    drawn, heads, _ = figures
    simplex = drawn["simplex"]
    scene = simplex.layout.scene
    assert (scene.xaxis.visible, scene.yaxis.visible, scene.zaxis.visible) == (False, False, False)
    labels = next(t for t in simplex.data if t.mode == "text")
    np.testing.assert_array_equal(np.c_[labels.x, labels.y, labels.z], VERTICES)
    assert list(labels.text) == ["a", "b", "c", "d"]
    points = [t for t in simplex.data if t.meta == "heads"]
    assert sum(len(t.x) for t in points) == heads.filter(pl.col("a").is_not_null()).height
    for trace in points:  # each parity's heads at their profile's barycentric point, in its colour
        parity = trace.name.removeprefix("parity ")
        group = heads.filter(pl.col("parity").eq_missing(None if parity == "undefined" else parity)
                             & pl.col("a").is_not_null())
        np.testing.assert_allclose(np.c_[trace.x, trace.y, trace.z], simplex_points(group))
        assert trace.marker.color == PARITY_COLOURS[None if parity == "undefined" else parity]
    assert drawn["parity-by-layer"].layout.title.text == "Parity by layer (percent of heads)"
    maps = drawn["maps"]
    assert [a.text for a in maps.layout.annotations] == ["pairing", "random baseline pairing", "symmetric energy",
                                                         "random baseline symmetric energy"]
    for trace, column in zip(maps.data, ("pairing", "random_pairing", "symmetric_energy", "random_symmetric_energy")):
        assert list(trace.x) == list(range(9))
        np.testing.assert_array_equal(np.array(trace.z, dtype=float),
                                      heads[column].to_numpy().reshape(30, 9))


def test_table_cells_show_numbers_to_three_figures_and_nulls_as_empty():
    from headforms.warehouse.publishing.report import _number

    assert [_number(v) for v in (None, 0.123456, 1234.5, 3, "I+")] == ["", "0.123", "1.23e+03", "3", "I+"]


def _as_reviewed(page: str) -> str:
    """A page as a person reviews it: its HTML, with each plotly figure's data and layout pretty-printed, plotly's own
    theme left out, and each array of numbers counted rather than listed (the numbers are the warehouse's, checked
    against it above)."""
    def readable(value):
        if isinstance(value, dict) and {"dtype", "bdata"} <= value.keys():  # a numpy array, base64-encoded
            return f"<{np.frombuffer(base64.b64decode(value['bdata']), dtype=value['dtype']).size} numbers>"
        if isinstance(value, dict):
            return {k: readable(v) for k, v in value.items() if k != "template"}
        if isinstance(value, list) and len(value) > 1 and all(isinstance(v, (int, float)) for v in value):
            return f"<{len(value)} numbers>"
        if isinstance(value, list):
            return [readable(v) for v in value]
        return float(f"{value:.6g}") if isinstance(value, float) else value

    decoder, out, at = json.JSONDecoder(), [], 0
    for call in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        if call.start() < at:
            continue
        data, end = decoder.raw_decode(page, call.end())
        layout, end = decoder.raw_decode(page, re.compile(r",\s*").match(page, end).end())
        out += [page[at:call.start()], f"figure {call.group(1)}:\n",
                json.dumps({"data": readable(data), "layout": readable(layout)}, indent=1, sort_keys=True,
                           ensure_ascii=False), "\n"]
        at = end
    return "".join(out) + page[at:]


def test_pages_read_as_reviewed(tiny_rope_db, tmp_path):
    """Every page of the one-model report, its words, labels, hover texts and figure layout, as reviewed in
    tests/reviewed/report/ (see tests/reviewed.py): prose, a label's case or a scene setting changed fails here."""
    from headforms.warehouse.publishing.report import write_report
    from headforms.warehouse.storing.store import connect

    con = connect(tiny_rope_db, read_only=True)
    try:
        write_report(con, tmp_path / "site")
        (source,), = con.execute("SELECT source FROM models").fetchall()  # a temporary folder of this run
    finally:
        con.close()
    pages = sorted((tmp_path / "site").glob("*.html"))
    assert [p.name for p in pages] == ["index.html", *(layer_page("tiny", i) for i in range(3)), model_page("tiny")]
    for page in pages:
        made = tmp_path / f"{page.stem}.txt"
        made.write_text(_as_reviewed(page.read_text()).replace(source, "<source>/tiny.gguf"))
        reviewed = reviewed_file("report", made.name, made)
        assert made.read_text() == reviewed.read_text(), f"{page.name} differs from {reviewed}"


def test_the_simplex_is_drawn_with_every_edge_of_the_tetrahedron(tiny_rope_db):
    """The model page's simplex: its line trace walks vertices of the regular tetrahedron only, along all six edges."""
    import itertools

    drawn, _ = _page_figures(tiny_rope_db, "tiny")
    line = next(trace for trace in drawn["simplex"].data if trace.mode == "lines")
    points = np.column_stack([line.x, line.y, line.z])
    near = np.isclose(points[:, None, :], VERTICES[None], atol=1e-12).all(axis=2)  # point x vertex
    assert (near.sum(axis=1) == 1).all(), points
    walk = near.argmax(axis=1)
    assert {frozenset(step) for step in zip(walk, walk[1:])} == {frozenset(e) for e in itertools.combinations(range(4), 2)}
