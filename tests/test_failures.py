"""warehouse/storing/failures.py: a failure is named by the innermost stage it happened in."""
import duckdb
import pytest
from click.testing import CliRunner

from headforms import cli
from headforms.warehouse.running import summaries
from headforms.warehouse.storing.failures import one_line, place_of, stage
from tests import tiny_models


def test_nested_stages_name_the_inner_one():
    with pytest.raises(ValueError) as raised, stage("outer", "m"), stage("inner", "m", 3):
        raise ValueError("bad")
    assert (place_of(raised.value).step, place_of(raised.value).layer) == ("inner", 3)
    assert one_line(raised.value) == ("model 'm', layer 3, step inner: ValueError: bad", True)


def test_a_failure_in_an_inner_stage_is_named_by_it_in_the_error_and_in_failed_step(tmp_path, monkeypatch):
    """The head types' step given an inner stage of its own that fails: the Error line and models.failed_step say
    the inner step, not 'summaries (head types)' around it."""
    real = summaries.model_head_types

    def clustering(con, model, seed, part):
        with stage("summaries (head types: k-means)", model):
            raise FloatingPointError("no centroids")

    monkeypatch.setattr(summaries, "model_head_types", clustering)
    folder, db = tiny_models.save(tiny_models.build("llama"), tmp_path / "m"), tmp_path / "w.duckdb"
    result = CliRunner().invoke(cli.main, ["extract", str(folder), "--db", str(db), "--name", "m"])
    assert result.exit_code != 0
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "summaries (head types: k-means) failed" in error[0], result.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT failed_step, complete FROM models").fetchall() == [
            ("summaries (head types: k-means)", False)]
    monkeypatch.setattr(summaries, "model_head_types", real)
    assert CliRunner().invoke(cli.main, ["extract", str(folder), "--db", str(db), "--name", "m"]).exit_code == 0
