"""QK-norm runs (issue 55): --plan names the source it refuses and plans the rest; a rerun reads a folded model
folded again; signature_check says why a head is not n+/n-."""
from __future__ import annotations

import duckdb
import torch
from click.testing import CliRunner

import tests.tiny_models as tm
from headforms import api, cli


def saved(tmp_path, family: str, **kw):
    return tm.save(tm.build(family, dtype=torch.float32, **kw), tmp_path / family)


def test_plan_names_the_refused_source_and_plans_the_rest(tmp_path):
    llama, qwen3 = saved(tmp_path, "llama"), saved(tmp_path, "qwen3")
    frame = api.plan([str(qwen3), str(llama)])
    assert frame["source"].to_list() == [str(qwen3), str(llama)]
    refused, planned = frame.row(0, named=True), frame.row(1, named=True)
    assert refused["heads"] is None and refused["warning"].startswith(f"{qwen3} is refused: ")
    assert "QK-norm" in refused["warning"] and "qk_norm='fold'" in refused["warning"]
    assert planned["heads"] == 8 and planned["warning"] is None and planned["qk_bytes"] > 0
    assert api.plan([str(qwen3), str(llama)], qk_norm="fold")["warning"].null_count() == 2
    result = CliRunner().invoke(cli.main, ["extract", "--plan", str(qwen3), str(llama)])
    assert result.exit_code == 0, result.output
    assert f"Warning: {qwen3} is refused: " in result.stderr and "pass --qk-norm fold" in result.stderr
    assert "qk_norm=" not in result.stderr


def test_a_rerun_reads_a_folded_model_folded_again(tmp_path):
    qwen3, db = saved(tmp_path, "qwen3"), tmp_path / "w.duckdb"
    first = api.extract(str(qwen3), db=db, qk_norm="fold", resamples=20)
    assert first["status"].to_list() == ["extracted"]
    assert api.extract(str(qwen3), db=db, resamples=20)["status"].to_list() == ["up to date"]
    result = CliRunner().invoke(cli.main, ["extract", str(qwen3), "--db", str(db), "--force"])
    assert result.exit_code == 0 and "qwen3: replaced" in result.output, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT qk_norm FROM models").fetchall() == [("folded",)]
    refused = CliRunner().invoke(cli.main, ["extract", str(qwen3), "--db", str(db), "--qk-norm", "refuse"])
    assert refused.exit_code == 1 and "pass --qk-norm fold" in refused.output, refused.output
