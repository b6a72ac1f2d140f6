"""What unit tests of single functions cannot see: stored columns equal a recomputation from stored
inputs (the loader passes the right layer and seed), thresholds at their exact boundary, and the
structure of the reduced form that the spectra rely on for speed."""
import re
import threading

import numpy as np
import polars as pl
import pytest

from headforms.compute.baseline import random_forms
from headforms.compute.reduction import reduce_forms
from headforms.compute.spectra import Spectra, spectra
from headforms.compute.statistics import ZERO_TOLERANCE, head_statistics, parity
from headforms.compute.threads import single_threaded
from tests.dense import dense_reference


def test_stored_random_baseline_is_each_layers_own(demo_con):
    """random_symmetric_energy and random_pairing of every stored head equal a dense recomputation of the
    baseline head drawn for (baseline_seed, layer): a loader passing layer 0 everywhere, or another formula, fails."""
    heads = demo_con.sql("SELECT h.model, layer, head, random_symmetric_energy, random_pairing, n_heads, head_dim, "
                         "d_model, baseline_seed FROM heads h JOIN models USING (model) ORDER BY ALL").pl()
    for (model, layer), group in heads.group_by("model", "layer", maintain_order=True):
        row = group.row(0, named=True)
        forms = random_forms(row["baseline_seed"], layer, row["n_heads"], row["head_dim"], row["d_model"])
        with single_threaded():  # BLAS teams thrash on a loaded 2-core machine
            refs = [dense_reference(forms[h], row["head_dim"]) for h in group["head"]]
        np.testing.assert_allclose(group["random_symmetric_energy"], [r["symmetric_energy"] for r in refs], rtol=1e-9,
                                   err_msg=f"{model} layer {layer}")
        np.testing.assert_allclose(group["random_pairing"], [r["pairing"] for r in refs], rtol=1e-9,
                                   err_msg=f"{model} layer {layer}")
    # and the baseline differs between layers (otherwise the check above could not tell layers apart)
    per_layer = heads.group_by("model", "layer").agg(pl.col("random_pairing").first())
    assert per_layer.group_by("model").agg(pl.col("random_pairing").n_unique())["random_pairing"].min() > 1


def test_reduced_form_rows_below_n_are_exactly_zero():
    """l = R_K R_Q^T: R_K's rows from n on vanish, so l's do; spectra take the cheap block route only then."""
    rng = np.random.default_rng(3)
    n, N = 4, 20
    wq, wk = rng.normal(size=(3, n, N)), rng.normal(size=(1, n, N))
    l = np.asarray(reduce_forms(wq, wk, np.zeros(3, dtype=int)))
    assert l.shape == (3, 2 * n, 2 * n)
    assert (l[:, n:, :] == 0).all() and (l[:, :n, :] != 0).any(axis=(1, 2)).all()
    for h in range(3):  # and it is the form: same nonzero spectrum as the dense N x N L = W_K^T W_Q
        dense = np.linalg.svd(wk[0].T @ wq[h], compute_uv=False)[:n]
        np.testing.assert_allclose(np.linalg.svd(l[h], compute_uv=False)[:n], dense, rtol=1e-10)


def test_parity_at_its_tolerance_is_type_II():
    """Type II is c_sym + d_sym <= tolerance: a head exactly at the tolerance is Type II, just above it is not."""
    rng = np.random.default_rng(5)
    wq, wk = rng.normal(size=(4, 3, 12)), rng.normal(size=(4, 3, 12))
    sp = spectra(reduce_forms(wq, wk, np.arange(4)))
    stats = head_statistics(sp, 12)
    total = stats["c_sym"] + stats["d_sym"]
    at = head_statistics(sp, 12, parity_tolerance=float(total[2]))["parity"]
    assert at[2] == "II"
    below = head_statistics(sp, 12, parity_tolerance=float(np.nextafter(total[2], 0)))["parity"]
    assert below[2] == ("I+" if stats["c_sym"][2] > stats["d_sym"][2] else "I-")
    assert list(parity(np.array([0.25, 0.25]), np.array([0.125, 0.25]), 0.375)) == ["II", "I-"]


@pytest.mark.parametrize("top", [1.0, 1e6, 0.25])
def test_eigenvalues_at_the_zero_tolerance_count_as_zero(top):
    """An eigenvalue of S exactly at ZERO_TOLERANCE x max|eig| is a zero, one just above it is not (the tolerance
    scales with the largest eigenvalue: checked at three scales)."""
    at, above = ZERO_TOLERANCE * top, np.nextafter(ZERO_TOLERANCE * top, 1)
    eig_S = np.array([[top, at, 0.0, -at, -top / 2, -top / 4], [top, above, 0.0, -above, -top / 2, -top / 4]])
    sp = Spectra(eig_S=eig_S, sv_T=np.zeros((2, 6)), sigma_T=np.zeros((2, 3)),
                 eig_L=np.zeros((2, 6), complex), sv_L=np.tile([1.0, 0.5, 0, 0, 0, 0], (2, 1)))
    stats = head_statistics(sp, 6)
    assert stats["n_pos"].tolist() == [1, 2] and stats["n_neg"].tolist() == [2, 3]
    assert stats["n_zero"].tolist() == [3, 1]


def test_analyse_layer_classifies_at_the_tolerance_it_is_given():
    """analyse_layer hands its parity_tolerance to the statistics and to the distance profiles: at a tolerance
    above every head's c_sym + d_sym all heads are Type II, at zero none is, each as parity() says of the same
    c_sym and d_sym, and the profiles at delta 0 agree."""
    from headforms.compute.analysis import analyse_layer
    from headforms.compute.rotary import Rotation

    rng = np.random.default_rng(5)
    wq, wk = rng.standard_normal((4, 8, 32)), rng.standard_normal((2, 8, 32))
    kv = np.array([0, 0, 1, 1])
    rotation = Rotation.of("split-half", 10000.0 ** (-np.arange(4) / 4))
    for tolerance in (0.0, 0.3, 2.0):
        result = analyse_layer(wq, wk, kv, layer=0, seed=0, parity_tolerance=tolerance, rotation=rotation,
                               deltas=(0, 3))
        stats = result.statistics
        assert stats["parity"].tolist() == parity(stats["c_sym"], stats["d_sym"], tolerance).tolist()
        assert result.distances["parity"][0].tolist() == stats["parity"].tolist()  # delta 0: the heads themselves
    assert set(analyse_layer(wq, wk, kv, layer=0, seed=0, parity_tolerance=2.0).statistics["parity"]) == {"II"}
    assert "II" not in set(analyse_layer(wq, wk, kv, layer=0, seed=0, parity_tolerance=0.0).statistics["parity"])


@pytest.mark.parametrize("norm", [1e6, 0.5])
def test_fit_samples_drop_values_within_the_zero_tolerance_of_the_norm(norm):
    """A sample's value is missing when it is at most ZERO_TOLERANCE ||L||_2 (statistics.md section 4; exactly at
    it included), kept above: for a large ||L||_2 (where an absolute tolerance would keep noise) and one below 1."""
    from headforms.compute.statistics import fit_samples

    tol = ZERO_TOLERANCE * norm
    sp = Spectra(eig_S=np.array([[norm, norm / 2, -norm / 2, -norm]]), sv_T=np.array([[norm, norm, tol, tol]]),
                 sigma_T=np.array([[norm / 2, 0.5 * tol]]),
                 eig_L=np.array([[norm, 0.5 * tol, 2 * tol, tol]], dtype=complex),
                 sv_L=np.array([[norm, norm / 2, 2 * tol, 0.0]]))
    samples = fit_samples(sp, head_dim=4)
    np.testing.assert_array_equal(samples["L_abs"], [[norm, np.nan, 2 * tol, np.nan]])
    # two values of sigma(T) for n = 4 (as where N < 2n): the sample is n wide, the values it lacks missing
    np.testing.assert_array_equal(samples["T"], [[norm / 2, np.nan, np.nan, np.nan]])


def test_lobes_drop_eigenvalues_within_each_heads_own_tolerance():
    """lobes() keeps an eigenvalue of S only beyond ZERO_TOLERANCE x that head's max |eig| (exactly at it: dropped),
    with heads of very different scales in one batch (a batch-wide tolerance would drop the small head's)."""
    from headforms.compute.statistics import lobes

    big, small = 1e6, 0.25
    eig_S = np.array([
        [big, ZERO_TOLERANCE * big, 1e-7, -ZERO_TOLERANCE * big, -big / 2, -big],
        [small, small * 1e-3, ZERO_TOLERANCE * small, -ZERO_TOLERANCE * small, -small * 1e-3, -small],
    ])
    plus, minus = lobes(eig_S)
    np.testing.assert_array_equal(plus, [[big, 0, 0, 0, 0, 0], [small, small * 1e-3, 0, 0, 0, 0]])
    np.testing.assert_array_equal(minus, [[big, big / 2, 0, 0, 0, 0], [small, small * 1e-3, 0, 0, 0, 0]])


def test_ratio_divides_by_denominators_below_one():
    """The NaN-safe ratio behind every normalised statistic: NaN for a zero denominator, plain division otherwise
    (denominators below 1 included)."""
    from headforms.compute.statistics import _ratio

    np.testing.assert_array_equal(_ratio(np.array([1.0, 1.0, 0.3, 0.0]), np.array([0.5, 0.0, 2.0, 0.25])),
                                  [2.0, np.nan, 0.15, 0.0])


def test_layer_rows_count_the_bytes_their_read_fetched(tmp_path):
    """A layer's bytes_fetched (summed into the run's progress for `headforms status`) is what reading it added to
    the checkpoint's meter, as a hub source's ranged reads do; a local checkpoint has no meter and fetches 0."""
    from dataclasses import replace
    from types import SimpleNamespace

    from headforms.extract import open_checkpoint
    from headforms.warehouse.running.layers import LoadOptions, layer_rows
    from tests import tiny_models as tm

    local = open_checkpoint(str(tm.save(tm.build("llama"), tmp_path / "m")), name="m")
    assert layer_rows(local, LoadOptions(), 0).bytes_fetched == 0
    meter = SimpleNamespace(bytes=5000)  # the header, fetched before any layer

    def reader(layer):
        meter.bytes += 100 * (layer + 1)
        return local.reader(layer)

    remote = replace(local, reader=reader, provenance=replace(local.provenance, meter=meter))
    assert [layer_rows(remote, LoadOptions(), layer).bytes_fetched for layer in (1, 0)] == [200, 100]


def test_distances_of_a_rope_refused_beyond_zero_are_zero_only():
    """deltas(): a RoPE model gets the asked-for distances (sorted, unique) or the defaults; one whose RoPE scaling
    is not implemented gets (0,), asked for or not, and asking for more is refused; no RoPE, no distances."""
    from headforms.compute.rotary import DEFAULT_DISTANCES
    from headforms.extract import ExtractError
    from headforms.extract.layouts.spec import model_spec
    from headforms.warehouse.running.layers import AnalysisOptions, deltas

    base = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32}
    _, plain = model_spec(base)
    _, dynamic = model_spec(base | {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    _, bert = model_spec(base | {"model_type": "bert"})
    assert deltas(plain, AnalysisOptions()) == DEFAULT_DISTANCES
    assert deltas(plain, AnalysisOptions(distances=(4, 0, 4))) == (0, 4)
    assert deltas(dynamic, AnalysisOptions()) == deltas(dynamic, AnalysisOptions(distances=(0,))) == (0,)
    with pytest.raises(ExtractError, match=r"^RoPE beyond distance 0 is not computed for this llama checkpoint: .*"
                                           r"; pass distances=\(0,\)$"):
        deltas(dynamic, AnalysisOptions(distances=(0, 4)))
    assert deltas(bert, AnalysisOptions(distances=(0, 4))) is None


@pytest.mark.parametrize("distances", [(), (-1, 4)])
def test_distances_must_be_non_negative_and_at_least_one(distances):
    from headforms.warehouse.running.layers import AnalysisOptions

    with pytest.raises(ValueError, match=rf"^distances must be non-negative integers, at least one; got "
                                         rf"{re.escape(repr(distances))}$"):
        AnalysisOptions(distances=distances)



def test_what_the_numbers_depend_on_stands_apart_from_how_a_run_runs(tmp_path):
    """AnalysisOptions: what the stored numbers depend on (its tolerance, seed and distances are part of a model's
    identity, load.IDENTITY; resamples each interval records); LoadOptions: how the run runs, beside it."""
    from dataclasses import fields

    from headforms.extract import open_checkpoint
    from headforms.warehouse.running.layers import AnalysisOptions, LoadOptions
    from headforms.warehouse.running.load import IDENTITY, _model_record
    from tests import tiny_models as tm

    assert [f.name for f in fields(AnalysisOptions)] == ["parity_tolerance", "seed", "resamples", "distances"]
    assert [f.name for f in fields(LoadOptions)] == ["analysis", "device", "force"]
    ckpt = open_checkpoint(str(tm.save(tm.build("llama"), tmp_path / "m")), name="m")
    record = _model_record(ckpt, AnalysisOptions(parity_tolerance=0.1, seed=5, distances=(0, 2)))
    assert (record["parity_tolerance"], record["baseline_seed"], record["distances"]) == (0.1, 5, [0, 2])
    assert {"parity_tolerance", "baseline_seed", "distances"} <= set(IDENTITY)


@pytest.mark.parametrize("family, option", [("clip_text", {"tower": "vision"}), ("llama", {"fold_norm": "gain"})])
def test_a_worker_reopens_a_checkpoint_with_the_options_it_was_read_with(family, option, tmp_path):
    """--jobs and Ray workers reopen each checkpoint from its CheckpointRef: the same tower, the same folded norm,
    at the pinned revision, so a worker reads the very maps the driver planned (a ref that kept only qk_norm read
    the first tower, unfolded)."""
    from dataclasses import replace

    from headforms.extract import ReadOptions, open_checkpoint
    from headforms.warehouse.running.executors import CheckpointRef
    from tests import tiny_models as tm

    folder = tm.save(tm.build(family), tmp_path / family)
    read = ReadOptions(**option)
    ckpt = open_checkpoint(str(folder), read)
    worker = CheckpointRef.of(ckpt).open()
    assert worker.options == replace(read, revision=ckpt.revision)
    assert (worker.name, worker.revision, worker.spec) == (ckpt.name, ckpt.revision, ckpt.spec)
    planned, read_by_worker = ckpt.read_layer(1), worker.read_layer(1)
    for ours, theirs in zip(planned, read_by_worker):
        np.testing.assert_array_equal(ours, theirs)
    default = open_checkpoint(str(folder)).read_layer(1)  # the options matter: without them, other maps
    assert any(a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(default, planned))


def test_progress_of_a_live_run_is_seen_and_a_dead_runs_file_is_not(tmp_path):
    """The side file that `status` reads: each commit's counts while this process runs, nothing once it closes, and
    nothing for a file whose process is gone (a killed run's) or that is not a progress record."""
    import json
    import os
    import subprocess
    import sys

    from headforms.warehouse.running.progress import RunProgress, progress_path, running

    db = tmp_path / "w.duckdb"
    RunProgress(db, models=1).close()  # a run that ends before writing anything: nothing to remove
    first = RunProgress(db, models=2)  # a first model that was up to date: done before any layer of the run
    first.model_done()
    assert {k: running(db)[k] for k in ("models_done", "model", "n_layers", "layers_done", "heads_done")} == {
        "models_done": 1, "model": None, "n_layers": 0, "layers_done": 0, "heads_done": 0}
    first.close()
    run = RunProgress(db, models=2)
    run.model("m", n_layers=4, layers_done=1, stack_layers=4)
    run.layers(count=2, heads=24, bytes_fetched=100)
    state = running(db)
    assert progress_path(db) == tmp_path / "w.duckdb.progress.json"
    assert {k: state[k] for k in ("pid", "models", "models_done", "model", "n_layers", "layers_done", "heads_done",
                                  "bytes_fetched")} == {"pid": os.getpid(), "models": 2, "models_done": 0, "model": "m",
                                                        "n_layers": 4, "layers_done": 3, "heads_done": 24,
                                                        "bytes_fetched": 100}
    assert state["heads_per_second"] > 0 and state["updated"] >= state["started"]
    run.model_done()
    assert running(db)["models_done"] == 1
    run.close()
    assert running(db) is None and not progress_path(db).exists()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for stale in ({**state, "pid": int(gone.stdout)}, {"models": 1}, [1, 2]):
        progress_path(db).write_text(json.dumps(stale))
        assert running(db) is None, stale
    progress_path(db).write_text("{")
    assert running(db) is None


def test_progress_counts_add_up_and_its_rate_is_heads_over_seconds(tmp_path, monkeypatch):
    """Layers, heads and bytes add over commits, models over models done; heads_per_second is the heads over the
    seconds since the run started (a run of under a second too); a run without a warehouse path writes no file."""
    from headforms.warehouse.running import progress

    clock = iter([100.0, 100.5, 100.5, 102.0, 102.0])  # started; then (elapsed, updated) per write; then 104.0
    monkeypatch.setattr(progress.time, "time", lambda: next(clock, 104.0))
    db = tmp_path / "w.duckdb"
    run = progress.RunProgress(db, models=3)
    run.layers(count=1, heads=10, bytes_fetched=7)
    assert progress.running(db)["heads_per_second"] == 10 / 0.5
    run.layers(count=2, heads=20, bytes_fetched=5)
    state = progress.running(db)
    assert (state["layers_done"], state["heads_done"], state["bytes_fetched"]) == (3, 30, 12)
    assert state["heads_per_second"] == 30 / 2.0 and state["updated"] == 102.0
    run.model_done()
    run.model_done()
    assert progress.running(db)["models_done"] == 2
    monkeypatch.chdir(tmp_path)
    quiet = progress.RunProgress(None, models=1)
    quiet.model("m", n_layers=1, layers_done=0, stack_layers=1)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["w.duckdb.progress.json"]
    quiet.close()


def test_a_failure_in_words():
    """One line per failure: an OS error's reason with its path when it has one, else the exception's type and its
    message's first line (only the type for an empty message)."""
    from headforms.warehouse.storing.failures import words

    assert words(FileNotFoundError(2, "No such file or directory", "/x/y")) == "No such file or directory: /x/y"
    assert words(PermissionError(13, "Permission denied")) == "Permission denied"
    assert words(ValueError("first\nsecond")) == "ValueError: first"
    assert words(RuntimeError()) == "RuntimeError"


def test_a_library_error_in_one_line():
    """The one helper every `Error:` line quotes a library with: the message's first line, stripped (after the type
    when `typed`), or the type alone for an empty or blank message."""
    from headforms.extract.checkpoint import first_line

    assert first_line(ValueError("\n  bad header\nat byte 8\n")) == "bad header"
    assert first_line(KeyError("q"), typed=True) == "KeyError: 'q'"
    assert first_line(OSError()) == "OSError"
    assert first_line(RuntimeError(" \n ")) == "RuntimeError"
    assert first_line(RuntimeError(" \n "), typed=True) == "RuntimeError"


def test_a_failure_in_one_line_says_where_when_known():
    """The tool's refusals stand alone; anything else is its words, after the place a stage labelled it with."""
    from headforms.extract.checkpoint import ExtractError
    from headforms.warehouse.storing.failures import one_line, stage

    assert one_line(ExtractError("no config.json in x\nmore")) == ("no config.json in x", False)
    assert one_line(ExtractError()) == ("ExtractError", False)  # a refusal without words still makes a line
    assert one_line(KeyError("q")) == ("KeyError: 'q'", True)
    with pytest.raises(ValueError) as raised, stage("compute", "m", (2, 3)):
        raise ValueError("bad\nworse")
    assert one_line(raised.value) == ("model 'm', layers 2-3, step compute: ValueError: bad", True)


def test_a_worker_leaves_ctrl_c_to_the_writer_and_runs_single_threaded(monkeypatch):
    """A --jobs worker ignores SIGINT (the writer stops it) and computes on one thread (its siblings have the other
    cores); run here on this process, its settings restored afterwards."""
    import os
    import signal

    from headforms.compute import threads
    from headforms.warehouse.running.executors import _worker_setup

    monkeypatch.setattr(threads, "WORKERS", threads.WORKERS)
    previous = signal.getsignal(signal.SIGINT)
    try:
        _worker_setup(os.getpid())
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threads.WORKERS == 1
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ray_executor_without_ray_says_what_to_install(monkeypatch):
    import sys

    from headforms.warehouse.running.executors import Ray
    from headforms.warehouse.storing.failures import WarehouseError

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(WarehouseError, match=r"^executor='ray' needs Ray: pip install 'headforms\[ray\]'$"):
        Ray()


def test_ray_started_here_keeps_worker_output_off_the_terminal(monkeypatch):
    """A cluster started by the run has no dashboard and sends no worker output to the terminal; a given cluster
    (address or RAY_ADDRESS) is joined as it is; the window is a few tasks per cluster CPU, and one task per CPU
    imports the layer's modules as soon as the executor is made."""
    from types import SimpleNamespace

    import ray

    from headforms.warehouse.running import executors
    from headforms.warehouse.running.executors import WINDOW, Ray

    calls, submitted = [], []

    def remote(**options):
        return lambda fn: SimpleNamespace(remote=lambda *args: submitted.append((fn, options, args)))

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 3.0})
    monkeypatch.setattr(ray, "remote", remote)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert Ray().window == 3 * WINDOW
    assert calls.pop() == {"address": None, "log_to_driver": False, "include_dashboard": False}
    assert submitted == [(executors._import_work, {"num_cpus": 1, "max_retries": 0}, ())] * 3
    Ray(address="ray://head:10001")
    assert calls.pop() == {"address": "ray://head:10001", "log_to_driver": False}
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    Ray()
    assert calls.pop() == {"address": None, "log_to_driver": False}


class _Starting:
    """An executor (executors._Windowed) whose workers are this thread: a task submitted is done at once; `ping`
    answers when the test sets `answer`; `submit` refuses layer `refused`."""

    def __init__(self, refused: int | None = None):
        from concurrent.futures import Future

        from headforms.warehouse.running import executors

        class Starting(executors._Windowed):
            window = 2

            def ping(inner):
                return self.answer

            def submit(inner, ref, opts, layer):
                if layer == refused:
                    raise RuntimeError(f"cannot submit layer {layer}")
                self.submitted.append(layer)
                done = Future()
                done.set_result(("worker", layer))
                return done

            def result(inner, future):
                return future.result()

            def done(inner, future):
                return future.done()

        self.answer, self.submitted = Future(), []
        self.executor = Starting(starts=True)
        self.executor.work = lambda ref, opts, layer: ("here", layer)

    def map(self, layers: int):
        from types import SimpleNamespace

        from headforms.extract import ReadOptions

        ckpt = SimpleNamespace(source="m", name="m", options=ReadOptions(), revision="r")
        return self.executor.map((ckpt, None, layer) for layer in range(layers))


def _until(condition) -> None:
    import time

    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_writer_computes_layers_until_the_workers_are_up():
    """While the workers start, the writer computes one layer at a time itself (not `ready`: not computed yet);
    once they answer, the layers waiting are submitted at once, up to the window, and results keep their order."""
    starting = _Starting()
    results = starting.map(6)
    assert next(results) == ("here", 0)
    assert not results.ready()  # layer 1 waits to be computed here
    assert starting.submitted == []
    starting.answer.set_result(1)
    _until(lambda: starting.submitted == [2])  # submitted by the thread that saw the answer, not by the writer
    assert next(results) == ("here", 1)
    assert results.ready()
    assert list(results) == [("worker", layer) for layer in range(2, 6)]
    assert starting.submitted == [2, 3, 4, 5]


def test_workers_that_cannot_start_fail_in_the_writers_order():
    """A start that fails (the ping raises) sends the layers to the workers anyway, whose failure is the run's;
    a layer that cannot be submitted raises where its result would have been, after the layers before it."""
    starting = _Starting(refused=3)
    starting.answer.set_exception(OSError("no fork server"))
    results = starting.map(6)
    assert starting.executor.up.wait(60)
    assert [next(results) for _ in range(3)] == [("worker", 0), ("worker", 1), ("worker", 2)]
    with pytest.raises(RuntimeError, match="^cannot submit layer 3$"):
        next(results)


def test_a_closed_executor_submits_nothing_more():
    """Once closed (a run stopped), the workers' answer submits no layer."""
    starting = _Starting()
    results = starting.map(4)
    assert next(results) == ("here", 0)
    starting.executor._close_here()
    starting.answer.set_result(1)
    for thread in threading.enumerate():
        if thread.name == "headforms-workers-up":
            thread.join(60)
    assert starting.executor.up.is_set() and starting.submitted == []
