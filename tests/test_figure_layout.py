"""Every figure of warehouse/publishing/figures.py, for a warehouse of one model and of twenty, keeps its text on the
canvas (titles, suptitle, axis and tick labels, colour bar labels and legends, as drawn, constrained layout done), its
data inside its axes, and names every series in its legend; and looks, pixel for pixel, as its reviewed image."""
import re
import shutil
from pathlib import Path

import duckdb
import numpy as np
import matplotlib.legend
import matplotlib.patches
import matplotlib.text
import pytest
from matplotlib.testing.compare import compare_images

from headforms.warehouse.publishing import figures
from headforms.warehouse.storing.store import connect
from tests.reviewed import reviewed_file

# The tiny warehouse has no behaviour: its figure is not drawn (tests/test_behaviour.py draws it from behaviour rows);
# nor the output-value circuit (tests/test_ov_views.py draws its figures from ov_heads rows).
WITHOUT_DATA = {"behaviour_self_score.png", "ov_figure09_profiles.png", "ov_figure12_parity_by_layer.png",
                "ov_copying_scores.png"}
DRAWN = [name for name in figures.FIGURES if name not in WITHOUT_DATA]
# Long names, as the hub's are: a title must wrap or make room, not run off the canvas.
NAMES = {1: ["Qwen2.5-Coder-7B-Instruct"],
         20: [f"{'Meta-Llama-3.1-8B-Instruct' if i % 3 else 'tiny'}-{i:02d}" for i in range(20)]}


@pytest.fixture(scope="module", params=sorted(NAMES))
def warehouse(request, tiny_rope_db, tmp_path_factory):
    """The tiny model's rows copied under each name of NAMES[n], as training checkpoints of bases of two each."""
    return request.param, _renamed(tiny_rope_db, request.param, tmp_path_factory.mktemp("models"))


def _renamed(tiny_rope_db, n: int, folder) -> Path:
    """A copy of the tiny model's warehouse whose rows are those of NAMES[n]."""
    path = folder / f"{n}.duckdb"
    shutil.copy(tiny_rope_db, path)
    names = NAMES[n]
    with duckdb.connect(str(path)) as con:
        tables = [table for (table,) in con.execute(
            "SELECT table_name FROM duckdb_columns() c JOIN duckdb_tables() t USING (database_name, table_name) "
            "WHERE column_name = 'model' AND t.database_name = current_database()").fetchall()]
        for table in tables:
            con.execute(f"CREATE TEMP TABLE original AS SELECT * FROM {table}")
            con.execute(f"DELETE FROM {table}")
            con.execute(f"INSERT INTO {table} SELECT original.* REPLACE (name AS model) "
                        f"FROM original, unnest(?) AS n(name)", [names])
            con.execute("DROP TABLE original")
        con.execute("UPDATE models SET base_model = concat('base-', (list_position(?, model) - 1) // 2), "
                    "training_step = 1000 * ((list_position(?, model) - 1) % 2)", [names, names])
    return path


def _drawn_text(fig) -> list:
    """(artist, window extent) of every text and legend a draw of `fig` draws (constrained layout first)."""
    drawn = []
    real = {cls: cls.draw for cls in (matplotlib.text.Text, matplotlib.legend.Legend)}

    def recording(cls):
        def draw(self, renderer):
            real[cls](self, renderer)
            if self.get_visible() and (cls is matplotlib.legend.Legend or self.get_text()):
                drawn.append((self, self.get_window_extent(renderer)))
        return draw

    try:
        for cls in real:
            cls.draw = recording(cls)
        fig.draw_without_rendering()  # as savefig draws: the layout first, then every artist where it put it
    finally:
        for cls, draw in real.items():
            cls.draw = draw
    return drawn


@pytest.fixture(scope="module")
def built(warehouse, tmp_path_factory):
    """(models, {name: matplotlib figure}): every figure as figures.py builds it from the warehouse (not saved),
    built once for the tests below to share."""
    models, db = warehouse
    out, drawn = tmp_path_factory.mktemp("figures"), []
    con = connect(db, read_only=True)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(figures, "_save", lambda fig, path: drawn.append(fig) or path)
            assert set(figures.draw_all(con, out)) == {out / name for name in DRAWN}
    finally:
        con.close()
    assert len(drawn) == len(DRAWN)
    return models, dict(zip(DRAWN, drawn))


@pytest.mark.parametrize("name", DRAWN)
def test_text_stays_on_the_canvas(name, built):
    models, fig = built[0], built[1][name]
    canvas = fig.bbox
    drawn = _drawn_text(fig)
    assert fig.get_suptitle() in [artist.get_text() for artist, _ in drawn if isinstance(artist, matplotlib.text.Text)]
    outside = [(getattr(artist, "get_text", lambda: "legend")()[:60], [round(v) for v in extent.extents])
               for artist, extent in drawn
               if extent.x0 < canvas.x0 - 1 or extent.y0 < canvas.y0 - 1
               or extent.x1 > canvas.x1 + 1 or extent.y1 > canvas.y1 + 1]
    assert not outside, f"{models} models, canvas {[round(v) for v in canvas.extents]}: {outside}"


def _data_points(ax) -> np.ndarray:
    """(x, y) of every point an axes plots in its data coordinates: line vertices, scatter offsets, bar corners."""
    points = [np.c_[line.get_xdata(), line.get_ydata()] for line in ax.get_lines()
              if line.get_transform() == ax.transData]
    points += [np.asarray(c.get_offsets()) for c in ax.collections
               if c.get_offset_transform() == ax.transData and len(c.get_offsets())]
    points += [np.asarray(p.get_bbox().get_points()) for p in ax.patches
               if isinstance(p, matplotlib.patches.Rectangle) and p.get_data_transform() == ax.transData]
    return np.concatenate([np.asarray(p, dtype=float).reshape(-1, 2) for p in points]) if points else np.zeros((0, 2))


@pytest.mark.parametrize("name", DRAWN)
def test_data_stays_inside_the_axes(name, built):
    """Every point a figure plots lies within its axes' limits (layout done): no limit or scale hides data. (A 3-D
    axes holds its points projected, not in data coordinates: left out.)"""
    models, fig = built[0], built[1][name]
    fig.draw_without_rendering()
    for ax in (ax for ax in fig.axes if ax.name != "3d"):
        xy = _data_points(ax)
        xy = xy[np.isfinite(xy).all(axis=1)]
        for points, limits, axis in ((xy[:, 0], ax.get_xlim(), "x"), (xy[:, 1], ax.get_ylim(), "y")):
            low, high = sorted(limits)
            slack = 1e-9 * max(high - low, 1e-300)
            hidden = points[(points < low - slack) | (points > high + slack)]
            assert not hidden.size, f"{models} models, {ax.get_title()!r}: {axis} {hidden[:5]} outside {low, high}"


@pytest.mark.parametrize("name", DRAWN)
def test_a_legend_names_every_series_it_covers(name, built):
    """Every line and scatter plotted in data coordinates is named in its legend (its axes' or twin's legend, or the
    figure's legend, which covers every axes), or is a guide line (figures.GUIDE): a series drawn without its name
    fails."""
    models, fig = built[0], built[1][name]
    covered = {id(ax): ax.get_legend() for ax in fig.axes if ax.get_legend() is not None}
    for ax in fig.axes:  # a twin shares its axes' legend; a figure legend covers every axes
        twin = next((covered[id(o)] for o in fig.axes if id(o) in covered and o.bbox.bounds == ax.bbox.bounds), None)
        if twin is not None or fig.legends:
            covered.setdefault(id(ax), twin)
    named = {t.get_text() for legend in [*filter(None, covered.values()), *fig.legends] for t in legend.get_texts()}
    for ax in (ax for ax in fig.axes if id(ax) in covered):
        series = [line for line in ax.get_lines() if line.get_transform() == ax.transData and len(line.get_xdata()) > 1]
        series += [c for c in ax.collections if c.get_offset_transform() == ax.transData and len(c.get_offsets())]
        unnamed = [type(s).__name__ for s in series if s.get_label() not in named | {figures.GUIDE}]
        assert not unnamed, f"{models} models, {ax.get_title()!r}: {unnamed} not in the legend {sorted(named)}"


# How a figure looks (sizes, offsets, colours, words) is judged by eye: each figure of the one-model warehouse, as
# reviewed, is a PNG in tests/reviewed/figures/ (see tests/reviewed.py).
@pytest.fixture(scope="module")
def one_model_db(tiny_rope_db, tmp_path_factory) -> Path:
    return _renamed(tiny_rope_db, 1, tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize("name", DRAWN)
def test_each_figure_looks_as_reviewed(name, one_model_db, tmp_path):
    """Pixel for pixel (matplotlib's own image comparison; same pinned matplotlib and fonts): a changed font size,
    offset, colour bar, word or case fails here, with a difference image beside the new one. Each test draws its
    own figure, saved as export saves it."""
    draw, _ = figures.FIGURES[name]
    con = connect(one_model_db, read_only=True)
    try:
        draw(con, tmp_path / name)
    finally:
        con.close()
    reviewed = reviewed_file("figures", name, tmp_path / name)
    difference = compare_images(str(reviewed), str(tmp_path / name), tol=0)
    assert difference is None, difference


def test_a_figure_without_its_data_is_not_drawn(one_model_db, tmp_path):
    """No placeholder image: a warehouse without behaviour rows gets no behaviour figure, and says why."""
    con = connect(one_model_db, read_only=True)
    try:
        absent = figures.missing(con)
        drawn = figures.draw_all(con, tmp_path)
    finally:
        con.close()
    assert set(absent) == WITHOUT_DATA and "headforms behaviour" in absent["behaviour_self_score.png"]
    assert {p.name for p in tmp_path.iterdir()} == {p.name for p in drawn} == set(DRAWN)


@pytest.mark.parametrize("name", DRAWN)
def test_titles_carry_no_paper_number_and_three_figure_numbers(name, built):
    """The paper's figure numbers stay in the file name, out of the titles; a number in a title has 3 significant
    digits (a 4th or 5th only where 3 would print a value and its interval's end alike)."""
    fig = built[1][name]
    titles = [fig.get_suptitle(), *(ax.get_title(loc) for ax in fig.axes for loc in ("left", "center"))]
    for title in titles:
        assert not re.search(r"(Figure|Observation) \d", title), title
        for number in re.findall(r"\d+\.\d+", title):
            assert len(number.replace(".", "").lstrip("0")) <= 3 or "[" in title, (title, number)
