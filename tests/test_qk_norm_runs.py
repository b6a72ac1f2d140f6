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


def gemma3_with_zero_gains(tmp_path):
    """A tiny gemma3 whose layer-0 q_norm stores -1 in 3 of its 16 entries: gemma3 multiplies by 1 + weight, so those
    gains are 0 and the folded W_Q of every head of layer 0 loses 3 rows."""
    model = tm.build("gemma3_text", dtype=torch.float32, seed=1)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_norm.weight[:3] = -1.0
    return tm.save(model, tmp_path / "gemma3")


def test_signature_check_says_why_folded_gemma3_heads_are_not_balanced(tmp_path):
    import numpy as np

    from headforms.extract import ReadOptions, open_checkpoint

    folder, db = gemma3_with_zero_gains(tmp_path), tmp_path / "w.duckdb"
    api.extract(str(folder), db=db, qk_norm="fold", resamples=20)
    ckpt = open_checkpoint(str(folder), ReadOptions(qk_norm="fold"))
    expected = 0
    for layer in range(ckpt.spec.n_layers):  # the reason by definition: rank of L = W_K^T W_Q below n
        w_q, w_k = ckpt.read_layer(layer)
        for h in range(w_q.shape[0]):
            form = w_k[ckpt.spec.kv_index[h]].T @ w_q[h]
            expected += np.linalg.matrix_rank(form) < ckpt.spec.head_dim
    ckpt.close()
    con = api.connect(db)
    try:
        (row,) = con.sql("SELECT exceptions, exception_heads, reason FROM signature_check").fetchall()
    finally:
        con.close()
    assert expected == 4 and row[0] == 4 and all(": 13+/13-" in head for head in row[1])
    assert row[2] == "zero gains after folding (4 heads)"


def test_balanced_models_have_no_reason_and_a_rank_deficient_w_q_has_its_own(tmp_path):
    folder, db = saved(tmp_path, "llama"), tmp_path / "w.duckdb"
    api.extract(str(folder), db=db, resamples=20)
    model = tm.build("llama", dtype=torch.float32)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():  # head 1 of layer 1: two of its query rows zero, so rank W_Q = n - 2 (no QK-norm)
        model.model.layers[1].self_attn.q_proj.weight[head_dim:head_dim + 2] = 0.0
    api.extract(str(tm.save(model, tmp_path / "deficient")), db=db, resamples=20)
    con = api.connect(db)
    try:
        rows = con.sql("SELECT model, exceptions, exception_heads, reason FROM signature_check").fetchall()
        (described,), = con.sql("SELECT comment FROM duckdb_columns() WHERE table_name = 'signature_check' "
                                "AND column_name = 'reason'").fetchall()
    finally:
        con.close()
    n = head_dim
    assert rows == [("deficient", 1, [f"L1.H1: {n - 2}+/{n - 2}-"], "rank-deficient W_Q or W_K (1 head)"),
                    ("llama", 0, [], None)]
    assert described.startswith("why the model's exceptions are not n+/n-") and "eigenvalues at the zero" in described
