"""`headforms architectures`: generated from the layout tables, equal to docs/architectures.md's table, and every
Hugging Face family it lists proven by a tiny model in the logit test."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from click.testing import CliRunner

from headforms import cli
from headforms.extract.layouts import gguf_table, latent
from headforms.extract.layouts.architectures import architectures, markdown, table_block
from headforms.extract.layouts.table import LAYOUTS, REFUSED, layout_key
from tests import test_llama4 as llama4, tiny_models as tm


DOC = Path(__file__).resolve().parent.parent / "docs" / "architectures.md"


def test_docs_table_is_the_generated_one():
    assert table_block(DOC.read_text()) == markdown(discovered=False), (
        "docs/architectures.md's table is stale: regenerate it with python -m headforms.extract.layouts.architectures --write")


def test_every_listed_family_is_proven_by_a_tiny_model():
    proven = set()
    for tiny in tm.TINY.values():
        config = getattr(transformers, tiny.config_class)(**tiny.kwargs).to_dict()
        proven.add(layout_key(config, tiny.tower))
    proven |= set(latent.FAMILIES)  # their two parts per head: proven by their logits in tests/test_latent.py
    proven |= set(llama4.FAMILIES)  # RoPE and NoPE layers, their per-token factors: tests/test_llama4.py
    listed = {row["family"] for row in architectures() if row["format"] == "hf" and row["family"] not in REFUSED}
    assert listed == set(LAYOUTS) and listed <= proven
    assert len({family.partition(".")[0] for family in proven}) >= 35


def test_rows_follow_the_tables():
    rows = {(row["format"], row["family"]): row for row in architectures()}
    falcon = rows["hf", "falcon"]
    assert falcon["packing"].split("; ") == [
        "fused, per head (q,k,v)", "multi_query: fused [Q|K|V] blocks",
        "new_decoder_architecture: fused, per group (q..q,k,v)"]
    assert rows["hf", "granite"]["score_scale"] == "attention_multiplier"
    assert rows["hf", "gpt_neo"]["score_scale"] == "1 (unscaled)"
    assert "--qk-norm fold" in rows["hf", "qwen3"]["notes"]
    assert "tower vision" in rows["hf", "clip.vision"]["notes"]
    assert rows["hf", "deepseek_v3"]["notes"] == latent.TREATMENT
    assert rows["hf", "diffllama"]["notes"] == f"refused: {REFUSED['diffllama']}"
    gguf = {family for fmt, family in rows if fmt == "gguf"}
    assert gguf == set(gguf_table.GGUF_ARCHITECTURES)


@pytest.mark.parametrize("fmt", ["json", "markdown"])
def test_cli_lists_the_architectures(fmt):
    result = CliRunner().invoke(cli.main, ["architectures", "--format", fmt])
    assert result.exit_code == 0, result.output
    if fmt == "markdown":
        assert result.output == markdown()
    else:
        assert json.loads(result.output) == architectures()


def test_extract_a_tower(tmp_path):
    folder = tm.save(tm.build("whisper_decoder"), tmp_path / "tiny-whisper")
    db = tmp_path / "w.duckdb"
    runner = CliRunner()
    result = runner.invoke(cli.main, ["extract", str(folder), "--db", str(db), "--tower", "decoder"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli.main, ["sql", "select model, architecture, n_heads, head_dim from models",
                                      "--db", str(db), "--format", "json"])
    assert json.loads(result.output) == [{"model": "tiny-whisper-decoder", "architecture": "whisper.decoder",
                                          "n_heads": 2, "head_dim": 16}]
    result = runner.invoke(cli.main, ["extract", str(folder), "--db", str(db), "--tower", "vision"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: whisper has no tower 'vision'; towers: encoder, decoder"
