"""Edges a user meets (issue 18): models of one, two, three heads and of zero forms through every per-model
summary, export and report; a step after the layers that fails keeps them; any failure is one Error line
with its place, its traceback in the log (and on the terminal with --debug)."""
from __future__ import annotations

import re
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from headforms import cli
from headforms.extract import sources
from headforms.extract.checkpoint import Checkpoint
from headforms.warehouse.publishing import export, figures, report
from headforms.warehouse.running import layers, load, summaries
from tests import tiny_models as tm

HEAD_DIM = 6


def tiny(folder: Path, heads: int, layers: int = 1, zero: bool = False, width: int = 2 * HEAD_DIM):
    """A llama of `layers` layers x `heads` heads, n = 6 and N = `width` (default 2n), saved to folder; `zero`:
    W_Q = 0, so every form (and S) is zero. Returns the model."""
    model = tm.build("llama", num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                     hidden_size=width, head_dim=HEAD_DIM, intermediate_size=16)
    if zero:
        with torch.no_grad():
            for attention in model.model.layers:
                attention.self_attn.q_proj.weight.zero_()
    tm.save(model, folder)
    return model


def invoke(*args, env: dict | None = None):
    return CliRunner().invoke(cli.main, [str(a) for a in args], env=env)


def rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def dense_forms(model) -> list[np.ndarray]:
    """Each head's L = W_K^T W_Q formed densely (N x N), in layer and head order."""
    forms = []
    for layer in model.model.layers:
        width = layer.self_attn.q_proj.weight.shape[1]
        wq = layer.self_attn.q_proj.weight.detach().double().numpy().reshape(-1, HEAD_DIM, width)
        wk = layer.self_attn.k_proj.weight.detach().double().numpy().reshape(-1, HEAD_DIM, width)
        forms += [k.T @ q for q, k in zip(wq, wk)]
    return forms


def dense_unit_spectra(model) -> np.ndarray:
    """Each head's eigenvalues of S = (L + L^T)/2 from the dense L, sorted decreasing and divided by their norm:
    the points of Figure 5 (N = 2n, so no ambient zeros are dropped)."""
    eig = np.array([np.sort(np.linalg.eigvalsh((form + form.T) / 2))[::-1] for form in dense_forms(model)])
    return eig / np.linalg.norm(eig, axis=1, keepdims=True)


# 1. Any head count --------------------------------------------------------------------------------------

HEAD_COUNTS = (1, 2, 3)


@pytest.fixture(scope="module")
def few_heads(tmp_path_factory):
    """A warehouse of three one-layer models, h1, h2, h3 (1, 2, 3 heads), extracted by one command; and each
    model's dense unit spectra."""
    root = tmp_path_factory.mktemp("few")
    points = {f"h{heads}": dense_unit_spectra(tiny(root / f"h{heads}", heads)) for heads in HEAD_COUNTS}
    forms = {"wide": dense_forms(tiny(root / "wide", 1, width=HEAD_DIM))}
    db = root / "w.duckdb"
    result = invoke("extract", *(root / model for model in [*points, *forms]), "--db", db, "--resamples", 50)
    assert result.exit_code == 0, result.output
    assert "h1: extracted; 1 layer, 1 head in " in result.output and "h2: extracted; 1 layer, 2 heads in " in result.output
    return db, points | forms


@pytest.mark.parametrize("heads", HEAD_COUNTS)
def test_few_heads_get_every_summary(heads, few_heads):
    """Figure 5's coordinates are the projections on the leading eigenvectors of X^T X (X the dense unit
    spectra), 0 beyond the min(H, 3) directions that exist; one type and silhouette 0 below three heads; no
    Rand index for one head; no interval from one layer (nor from one head), estimates the views' values."""
    db, points = few_heads
    model, points = f"h{heads}", points[f"h{heads}"]
    _, vectors = np.linalg.eigh(points.T @ points)
    found = min(heads, 3)
    expected = np.zeros((heads, 3))
    expected[:, :found] = points @ vectors[:, ::-1][:, :found]
    stored = np.array(rows(db, f"SELECT x, y, z FROM head_types WHERE model = '{model}' ORDER BY layer, head"))
    np.testing.assert_allclose(np.abs(stored), np.abs(expected), atol=1e-9)

    view = invoke("sql", f"SELECT k, silhouette, ari_parity FROM head_types_by_model WHERE model = '{model}'",
                  "--db", db, "--format", "csv").output.splitlines()[1].split(",")
    assert view[0] == ("1" if heads < 3 else "2") and (view[1] == "0.0" or heads == 3)
    assert (view[2] == "") == (heads == 1)

    bounds = {method: (low, high) for method, low, high in rows(
        db, f"SELECT method, low, high FROM intervals WHERE model = '{model}' AND figure = 'median_pairing'")}
    assert bounds["layer"] == (None, None)
    assert bounds["head"] == (None, None) if heads == 1 else None not in bounds["head"]
    [(estimate, median)] = rows(db, f"SELECT i.estimate, (SELECT median(pairing) FROM heads WHERE model = '{model}') "
                                    f"FROM intervals i WHERE model = '{model}' AND figure = 'median_pairing' "
                                    f"AND method = 'layer'")
    assert estimate == pytest.approx(median, rel=1e-12)
    shown = invoke("sql", f"SELECT shown FROM model_intervals WHERE model = '{model}' AND figure = 'median_pairing'",
                   "--db", db, "--format", "csv")
    assert shown.output.splitlines()[1] == f"{median:.4g}"


def test_one_head_as_wide_as_the_model(few_heads):
    """One head with n = N (so N < 2n: sigma(T) has N/2 < n values; the analysis failed on it): spectra of S and
    sigma(T) equal the dense ones, and each sample has its four fits, sigma(T)'s on N/2 values."""
    db, forms = few_heads
    [form] = forms["wide"]
    stored = dict(rows(db, "SELECT spectrum, list(value ORDER BY idx) FROM eigenvalues WHERE model = 'wide' "
                           "AND spectrum IN ('S', 'T_sigma') GROUP BY spectrum"))
    np.testing.assert_allclose(stored["S"], np.sort(np.linalg.eigvalsh((form + form.T) / 2))[::-1], atol=1e-12)
    sigma = np.linalg.eigvals((form - form.T) / 2).imag
    np.testing.assert_allclose(stored["T_sigma"], np.sort(sigma[sigma > 0])[::-1], atol=1e-12)
    assert len(stored["T_sigma"]) == HEAD_DIM // 2
    assert rows(db, "SELECT sample, count(*), max(n) FROM fits WHERE model = 'wide' GROUP BY ALL ORDER BY ALL") == [
        ("L_abs", 4, HEAD_DIM), ("S_neg", 4, HEAD_DIM // 2), ("S_pos", 4, HEAD_DIM // 2), ("T", 4, HEAD_DIM // 2)]


def _not_drawn(db) -> set[str]:
    """The figures export leaves out of this warehouse for want of their data (figures.missing)."""
    from headforms.warehouse.storing.store import connect

    con = connect(db, read_only=True)
    try:
        return set(figures.missing(con))
    finally:
        con.close()


def test_few_heads_export_and_report(few_heads, tmp_path):
    """export writes every table and figure, report every page, for the warehouse of 1-, 2- and 3-head models
    and the one head as wide as its model."""
    db, points = few_heads
    result = invoke("export", "--db", db, "--out", tmp_path / "export")
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "export").glob("*.png")} == set(figures.FIGURES) - _not_drawn(db)
    result = invoke("report", "--db", db, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "report").glob("layer-*.html")} == {f"layer-{m}-0.html" for m in points}


def test_zero_forms_get_no_types_and_still_export(tmp_path):
    """Every S zero: no head has a Figure 5 point (no head_types row, no head_types_by_model row), medians of
    undefined statistics are NULL with NULL bounds, and export and report still write every file."""
    db = tmp_path / "w.duckdb"
    tiny(tmp_path / "m", 2, zero=True)
    assert invoke("extract", tmp_path / "m", "--db", db, "--resamples", 50).exit_code == 0
    assert rows(db, "SELECT count(*) FROM head_types") == [(0,)]
    assert rows(db, "SELECT estimate, low, high FROM intervals WHERE figure = 'median_pairing'") == [(None,) * 3] * 2
    result = invoke("export", "--db", db, "--out", tmp_path / "export")
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "export").glob("*.png")} == set(figures.FIGURES) - _not_drawn(db)
    assert "figure05_head_types.png" in _not_drawn(db)  # no head types: no placeholder image
    assert invoke("report", "--db", db, "--out", tmp_path / "report").exit_code == 0


# 2. Computed work is never discarded by a later step; 3. one Error line, the traceback in the log -----------

def one_error(result, pattern: str) -> str:
    """A failed CliRunner result: exit 1, no traceback, exactly one `Error: ` line, the last, matching pattern."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output, result.output
    assert sum("Error:" in line for line in lines) == 1 and lines[-1].startswith("Error: "), result.output
    assert re.search(pattern, lines[-1]), lines[-1]
    return lines[-1]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A llama folder of 2 layers x 2 heads, and a complete warehouse of it (model 'm')."""
    root = tmp_path_factory.mktemp("small")
    tiny(root / "m", 2, layers=2)
    db = root / "complete.duckdb"
    assert invoke("extract", root / "m", "--db", db, "--resamples", 20).exit_code == 0
    return root / "m", db


def table(db: Path, name: str) -> list[tuple]:
    return rows(db, f"SELECT * FROM {name} ORDER BY ALL")


def fail(*args, **kwargs):
    raise RuntimeError("injected")


@pytest.mark.parametrize("force", [False, True])
def test_failed_summary_keeps_the_layers_and_the_same_command_finishes(force, small, tmp_path, monkeypatch):
    """Head types fail after every layer is in: the layers stay (a --force replacement's new ones too), the model
    is incomplete with the step in models.failed_step and no summary rows; the same command then computes the
    summaries alone (no layer is read again) and the model is complete, equal to an uninterrupted build."""
    folder, complete = small
    db = tmp_path / "w.duckdb"
    log = tmp_path / "errors.log"
    if force:
        assert invoke("extract", folder, "--db", db, "--resamples", 20).exit_code == 0
    monkeypatch.setattr(summaries, "model_head_types", fail)
    one_error(invoke("extract", folder, "--db", db, "--resamples", 20, *(["--force"] * force),
                     env={"HEADFORMS_LOG": str(log)}),
              rf"^Error: model 'm': summaries \(head types\) failed \(RuntimeError: injected\); its 2 layers are "
              rf"kept, marked incomplete \(models.failed_step\): run the same command to finish it "
              rf"\(traceback in {re.escape(str(log))}\)$")
    assert "RuntimeError: injected" in log.read_text()
    assert rows(db, "SELECT complete, failed_step FROM models") == [(False, "summaries (head types)")]
    assert rows(db, "SELECT count(*) FROM intervals") == rows(db, "SELECT count(*) FROM head_types") == [(0,)]
    layers = table(db, "layers")
    assert [row[1] for row in layers] == [0, 1]
    if force:  # the replacement's layers, not the old ones
        assert [row[4] for row in layers] > [row[4] for row in table(complete, "layers")]

    monkeypatch.undo()
    monkeypatch.setattr(Checkpoint, "read_layer", fail)  # a layer read again would fail the run
    result = invoke("extract", folder, "--db", db, "--resamples", 20)
    assert result.exit_code == 0 and "m: resumed; 0 layers, 0 heads" in result.output, result.output
    assert rows(db, "SELECT complete, failed_step FROM models") == [(True, None)]
    assert table(db, "layers") == layers
    for name in ("heads", "eigenvalues", "fits", "head_types", "intervals"):
        assert table(db, name) == table(complete, name), name
    assert invoke("check", "--db", db).exit_code == 0


# (stage, where the failure is injected, the command, what the Error line says before the log path)
STAGES = {
    "open": (sources, "open_target", "extract", r"step open \(/.*/m\): RuntimeError: injected"),
    "read": (Checkpoint, "read_circuits", "extract", r"model 'm', layer 1, step read: RuntimeError: injected"),
    "compute": (layers, "start_layer", "extract", r"model 'm', layer 1, step compute: RuntimeError: injected"),
    "write": (load, "_insert_layers", "extract", r"model 'm', layer 0, step write: RuntimeError: injected"),
    "summaries": (summaries, "later_intervals", "extract",
                  r"model 'm': summaries \(intervals\) failed \(RuntimeError: injected\); its 2 layers are kept, "
                  r"marked incomplete \(models.failed_step\): run the same command to finish it"),
    "export": (figures, "draw_all", "export", r"step export \(figures\): RuntimeError: injected"),
    "report": (report, "_layer_body", "report", r"model 'm', layer 0, step report \(layer-m-0.html\): "
                                                r"RuntimeError: injected"),
}


@pytest.mark.parametrize("stage", STAGES)
def test_a_failure_in_any_stage_is_one_line_with_its_place(stage, small, tmp_path, monkeypatch):
    """An unexpected exception in each stage: one Error line naming model, layer and step, exit 1, the traceback
    appended to $HEADFORMS_LOG (and printed too with --debug); a failed first extraction leaves no file."""
    owner, name, command, said = STAGES[stage]
    folder, complete = small
    monkeypatch.setattr(load, "COMMIT_SECONDS", 0)  # one layer per commit: the write fails at layer 0
    original = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **k: fail() if stage not in ("read", "compute") or (
        a[1] if stage == "read" else k["layer"]) == 1 else original(*a, **k))
    log = tmp_path / "state" / "errors.log"
    db = tmp_path / "w.duckdb" if command == "extract" else complete
    args = [command, *([folder] * (command == "extract")), "--db", db, *(["--out", tmp_path / "out"] *
                                                                          (command != "extract"))]
    for debug in ([], ["--debug"]):
        result = invoke(*debug, *args, env={"HEADFORMS_LOG": str(log)})
        if debug:
            assert result.exit_code == 1 and "Traceback (most recent call last)" in result.output
            assert result.output.rstrip().splitlines()[-1] == line
        else:
            line = one_error(result, rf"^Error: {said} \(traceback in {re.escape(str(log))}\)$")
            assert db.exists() == (stage == "summaries" or command != "extract")
    entries = log.read_text()
    assert entries.count(" UTC, headforms ") == 2  # one entry per failed run, each a whole traceback
    assert entries.count("Traceback (most recent call last)") >= 2 and entries.count("RuntimeError: injected") >= 2
    for entry in re.split(r"^--- .* UTC, headforms .*$", entries, flags=re.M)[1:]:  # each a traceback as Python prints it
        lines = entry.splitlines()
        assert lines[1] == "Traceback (most recent call last):" and lines[2].startswith('  File "'), entry


def test_the_log_goes_under_xdg_state_home_and_an_unwritable_log_is_said(small, tmp_path, monkeypatch):
    """Without $HEADFORMS_LOG the log is $XDG_STATE_HOME/headforms/errors.log; one that cannot be written is said."""
    _, complete = small
    monkeypatch.setattr(export, "_csv_select", fail)
    state = tmp_path / "state"
    result = invoke("export", "--db", complete, "--out", tmp_path / "out",
                    env={"HEADFORMS_LOG": None, "XDG_STATE_HOME": str(state)})
    one_error(result, re.escape(f"(traceback in {state / 'headforms' / 'errors.log'})") + "$")
    assert "RuntimeError: injected" in (state / "headforms" / "errors.log").read_text()
    (tmp_path / "file").write_text("")
    result = invoke("export", "--db", complete, "--out", tmp_path / "out",
                    env={"HEADFORMS_LOG": str(tmp_path / "file" / "errors.log")})
    one_error(result, r"RuntimeError: injected \(the traceback could not be saved to .*errors.log \(File exists\): "
                      r"rerun with --debug to see it\)$")


def test_a_test_session_takes_its_temporary_log_folder_with_it(tmp_path):
    """The suite's own log (conftest: $HEADFORMS_LOG in a temporary folder) is gone when a pytest session ends, and a
    session given $HEADFORMS_LOG makes no folder at all: test runs leave nothing in the temporary directory."""
    import os
    import subprocess
    import sys

    from tests.test_robustness import ROOT

    one_test = ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                "tests/test_imports.py::test_the_cycle_finder_finds_a_cycle"]
    for log in (None, str(tmp_path / "given.log")):
        temporary = tmp_path / f"tmp-{'given' if log else 'own'}"
        temporary.mkdir()
        env = {key: value for key, value in os.environ.items() if key != "HEADFORMS_LOG"}
        env.update(TMPDIR=str(temporary), **({"HEADFORMS_LOG": log} if log else {}))
        run = subprocess.run([sys.executable, *one_test], cwd=ROOT, env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout[-2000:]
        assert [p.name for p in temporary.iterdir() if p.name.startswith("headforms-tests-")] == []


@pytest.mark.parametrize("command", ["export", "report"])
def test_an_output_folder_that_cannot_be_created_is_one_line(command, small, tmp_path):
    """--out under a file (was a FileNotFoundError traceback for a missing parent): one line saying what to do."""
    _, complete = small
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out"
    one_error(invoke(command, "--db", complete, "--out", out),
              rf"^Error: cannot create the output folder {re.escape(str(out))} \({re.escape(str(out))}: Not a "
              rf"directory\): choose a folder you can write with --out DIR$")


# 4. A device the run cannot use is refused before any work, in one line --------------------------------------

@pytest.mark.parametrize("device, cuda_devices, pattern", [
    ("foo", 0, r"^Error: device foo: not a torch device name \(cpu, cuda or cuda:N\)$"),
    ("mps", 0, r"^Error: device mps: headforms computes in float64 on cpu or cuda, not on mps$"),
    ("cuda", 0, r"^Error: device cuda: no cuda device here \(torch [^)]+\); the default device, cpu, needs none$"),
    ("cuda:2", 2, r"^Error: device cuda:2: this machine has 2 cuda devices \(cuda:0 to cuda:1\)$"),
    ("cuda:1", 1, r"^Error: device cuda:1: this machine has 1 cuda device \(cuda:0\)$"),
])
def test_an_unusable_device_is_one_line_and_leaves_the_warehouse(device, cuda_devices, pattern, small, tmp_path,
                                                                  monkeypatch):
    """--device names a device this machine lacks (CUDA's count stands in for the machine's): extract and behaviour
    refuse it before opening anything; the warehouse keeps every byte, and a new one is not created."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_devices)
    folder, complete = small
    db = tmp_path / "w.duckdb"
    db.write_bytes(complete.read_bytes())
    before = db.read_bytes()
    one_error(invoke("extract", folder, "--db", db, "--force", "--device", device), pattern)
    assert db.read_bytes() == before
    one_error(invoke("extract", folder, "--db", tmp_path / "new.duckdb", "--device", device), pattern)
    assert list(tmp_path.iterdir()) == [db]
    if device != "mps":  # the float32 forward pass takes mps where one is present (test_device_path.py)
        one_error(invoke("behaviour", folder, "--db", db, "--device", device), pattern)
        assert db.read_bytes() == before
