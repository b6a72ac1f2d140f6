"""The output-value circuit end to end: `extract --circuits qk,ov` stores every head's OV_h = W_O[h] W_V[g] with the
statistics, spectra and copying scores a dense computation on the model's own weights gives."""
import duckdb
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from headforms import api, cli
from tests import tiny_models
from tests.dense import dense_reference

STATISTICS = ("frobenius", "symmetric_energy", "a", "b", "c", "d", "pairing", "rho", "trace_ratio",
              "participation_ratio", "stable_rank", "leading_share")


def _dense_ov(model, name: str) -> tuple[list[np.ndarray], int, int]:
    """Per layer (H, N, N) of OV_h from the torch model's own modules, with its head_dim and kv groups."""
    config = model.config
    H, N = config.num_attention_heads, config.hidden_size
    if name == "distilgpt2":  # Conv1D: y = x W + b, c_attn's last N columns are V, c_proj maps H n -> N
        n = N // H
        layers = []
        for block in model.transformer.h:
            w_v = block.attn.c_attn.weight.detach().numpy()[:, 2 * N:].T.reshape(H, n, N)
            w_o = block.attn.c_proj.weight.detach().numpy().T.reshape(N, H, n).transpose(1, 0, 2)
            layers.append(np.einsum("hai,hij->haj", w_o, w_v))
        return layers, n, 1
    n = config.head_dim if getattr(config, "head_dim", None) else N // H
    Hkv = getattr(config, "num_key_value_heads", H)
    layers = []
    for block in model.model.layers:
        w_v = block.self_attn.v_proj.weight.detach().numpy().reshape(Hkv, n, N)
        w_o = block.self_attn.o_proj.weight.detach().numpy().reshape(N, H, n).transpose(1, 0, 2)
        layers.append(np.einsum("hai,hij->haj", w_o, w_v[np.arange(H) // (H // Hkv)]))
    return layers, n, H // Hkv


def _unembedding(model, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(W_E, W_U diag(g)): the final norm's gain on the unembedding's input, as the copying score folds it."""
    w_e = model.get_input_embeddings().weight.detach().numpy()
    w_u = model.get_output_embeddings().weight.detach().numpy()
    final = model.transformer.ln_f if name == "distilgpt2" else model.model.norm
    return w_e, w_u * final.weight.detach().numpy()


def _share(eigenvalues: np.ndarray) -> float:
    return eigenvalues.real.sum() / np.abs(eigenvalues).sum()


@pytest.fixture(scope="module", params=["llama_gqa", "distilgpt2"])
def extracted(request, tmp_path_factory):
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    model = tiny_models.build(name, seed=3)
    if name == "llama_gqa":  # untied: a distinct unembedding
        assert not model.config.tie_word_embeddings
    tiny_models.save(model, folder)
    db = folder / "w.duckdb"
    api.extract(str(folder / ""), db=db, name="m", circuits="qk,ov", resamples=20)
    return name, model, db


def test_every_heads_ov_statistics_equal_the_dense_circuits(extracted):
    name, model, db = extracted
    layers, n, _ = _dense_ov(model, name)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(f"SELECT layer, head, {', '.join(STATISTICS)}, n_pos, n_neg FROM ov_heads "
                           "ORDER BY layer, head").fetchall()
        assert con.execute("SELECT circuits FROM models").fetchone() == ("qk,ov",)
    assert len(rows) == sum(len(layer) for layer in layers)
    for layer, head, *stored in rows:
        ref = dense_reference(layers[layer][head], n)
        np.testing.assert_allclose(stored[:len(STATISTICS)], [ref[k] for k in STATISTICS], rtol=1e-9, atol=1e-12)
        assert stored[len(STATISTICS):] == [ref["n_pos"], ref["n_neg"]]


def test_ov_spectra_equal_a_dense_eigendecomposition(extracted):
    name, model, db = extracted
    layers, n, _ = _dense_ov(model, name)
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute("SELECT layer, head, spectrum, list(value ORDER BY idx), list(imag ORDER BY idx) "
                             "FROM ov_eigenvalues WHERE spectrum IN ('L', 'S') GROUP BY ALL").fetchall()
    assert len(stored) == 2 * sum(len(layer) for layer in layers)
    for layer, head, spectrum, value, imag in stored:
        ov = layers[layer][head]
        if spectrum == "S":
            dense = np.sort(np.linalg.eigvalsh((ov + ov.T) / 2))[::-1]
            dense = dense[np.argsort(-np.abs(dense), kind="stable")][:len(value)]  # the 2n nonzero ones
            np.testing.assert_allclose(np.sort(value), np.sort(dense), atol=1e-10)
        else:
            dense = np.linalg.eigvals(ov)
            dense = dense[np.argsort(-np.abs(dense))][:n]
            got = np.array(value) + 1j * np.array(imag)
            np.testing.assert_allclose(np.sort_complex(got), np.sort_complex(dense), atol=1e-10)


def test_copying_scores_equal_the_vocabulary_sized_circuit(extracted):
    name, model, db = extracted
    layers, _, _ = _dense_ov(model, name)
    w_e, w_u = _unembedding(model, name)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT layer, head, copying_score, residual_copying_score FROM ov_heads").fetchall()
    assert rows and all(score is not None for row in rows for score in row[2:])
    for layer, head, copying, residual in rows:
        ov = layers[layer][head]
        full = w_u @ ov @ w_e.T  # vocabulary x vocabulary, as a notebook would form it
        assert copying == pytest.approx(_share(np.linalg.eigvals(full)), abs=1e-9)
        assert residual == pytest.approx(_share(np.linalg.eigvals(ov)), abs=1e-9)


def test_a_model_without_unembedding_has_null_copying_scores(tmp_path):
    model = tiny_models.build("bert", seed=1)
    tiny_models.save(model, tmp_path / "bert")
    db = tmp_path / "w.duckdb"
    api.extract(str(tmp_path / "bert"), db=db, circuits=["qk", "ov"], resamples=5)
    with duckdb.connect(str(db), read_only=True) as con:
        counts = con.execute("SELECT count(*), count(copying_score), count(residual_copying_score) "
                             "FROM ov_heads").fetchone()
    heads = model.config.num_hidden_layers * model.config.num_attention_heads
    assert counts == (heads, 0, heads)


def test_qk_alone_writes_no_ov_rows_and_asking_for_ov_later_needs_force(tmp_path):
    model = tiny_models.build("llama", seed=2)
    tiny_models.save(model, tmp_path / "llama")
    db = tmp_path / "w.duckdb"
    runner = CliRunner()
    first = runner.invoke(cli.main, ["extract", str(tmp_path / "llama"), "--db", str(db), "--resamples", "5"])
    assert first.exit_code == 0, first.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM ov_heads").fetchone() == (0,)
        assert con.execute("SELECT circuits FROM models").fetchone() == ("qk",)
    again = runner.invoke(cli.main, ["extract", str(tmp_path / "llama"), "--db", str(db), "--circuits", "qk,ov"])
    assert again.exit_code != 0 and "circuits qk -> qk,ov" in again.output and "--force" in again.output
    forced = runner.invoke(cli.main, ["extract", str(tmp_path / "llama"), "--db", str(db), "--circuits", "qk,ov",
                                      "--force", "--resamples", "5"])
    assert forced.exit_code == 0, forced.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM ov_heads").fetchone() == (8,)
        assert con.execute("SELECT count(*) FROM heads").fetchone() == (8,)
        intervals = con.execute("SELECT count(*) FROM copying_intervals").fetchone()[0]
    assert intervals > 0
    # forced again with both circuits: the per-model summaries (copying_intervals too) are replaced, not added to
    again = runner.invoke(cli.main, ["extract", str(tmp_path / "llama"), "--db", str(db), "--circuits", "qk,ov",
                                     "--force", "--resamples", "5"])
    assert again.exit_code == 0, again.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM copying_intervals").fetchone() == (intervals,)


def test_an_unknown_circuit_is_one_error_line(tmp_path):
    result = CliRunner().invoke(cli.main, ["extract", "gpt2", "--db", str(tmp_path / "w.duckdb"),
                                           "--circuits", "qk,vo"])
    assert result.exit_code != 0
    assert result.output.count("\n") == 1 and "vo" in result.output and "ov" in result.output
    assert not (tmp_path / "w.duckdb").exists()


def test_the_copying_scores_of_a_layer_match_the_n_by_n_products():
    """compute.copying against the N x N circuit formed densely, on random GQA maps with a random Gram."""
    from headforms.compute.copying import copying_scores

    rng = np.random.default_rng(0)
    H, Hkv, n, N = 6, 2, 4, 20
    w_v, w_o, gram = rng.normal(size=(Hkv, n, N)), rng.normal(size=(H, N, n)), rng.normal(size=(N, N))
    kv = np.arange(H) // (H // Hkv)
    copying, residual = copying_scores(w_v, w_o, kv, gram)
    for h in range(H):
        ov = w_o[h] @ w_v[kv[h]]
        assert copying[h] == pytest.approx(_share(np.linalg.eigvals(gram @ ov)), abs=1e-12)
        assert residual[h] == pytest.approx(_share(np.linalg.eigvals(ov)), abs=1e-12)
    assert np.isnan(copying_scores(w_v, w_o, kv, None)[0]).all()


@pytest.mark.parametrize("pieces", [1, 2, 3, 5])
def test_copying_scores_in_pieces_of_groups_and_the_gram_in_blocks_equal_the_whole(pieces):
    """The pool's pieces (whole key/value groups, in any number, more than the groups too) give each head the
    scores of copying_scores on the whole layer; the Gram's column blocks give W_E^T W_U (a vocabulary not a
    multiple of anything, columns fewer than the blocks; its row blocks: tests/test_gram_blocks.py)."""
    from concurrent.futures import ThreadPoolExecutor

    from headforms.compute.copying import copying_scores, start_copying_scores, unembedding_gram

    rng = np.random.default_rng(1)
    H, Hkv, n, N = 12, 4, 3, 10
    w_v, w_o = rng.normal(size=(Hkv, n, N)), rng.normal(size=(H, N, n))
    w_e, w_u = rng.normal(size=(37, N)), rng.normal(size=(37, N))
    kv = rng.permutation(np.arange(H) % Hkv)  # heads of a group need not be adjacent
    with ThreadPoolExecutor(2) as executor:
        gram = unembedding_gram([(w_e, w_u)], executor.submit)
        np.testing.assert_allclose(gram, w_e.T @ w_u, rtol=0, atol=1e-12)
        got = start_copying_scores(executor.submit, w_v, w_o, kv, gram, pieces)()
    want = copying_scores(w_v, w_o, kv, gram)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("damage", ["missing", "malformed"])
def test_a_missing_or_malformed_value_tensor_is_one_error_line_and_the_warehouse_is_unchanged(tmp_path, damage):
    from safetensors.numpy import load_file, save_file

    model = tiny_models.build("llama", seed=4)
    folder = tiny_models.save(model, tmp_path / "llama")
    db = tmp_path / "w.duckdb"
    assert api.extract(str(folder), db=db, name="kept", resamples=5).height == 1
    before = db.read_bytes()
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.1.self_attn.v_proj.weight"
    if damage == "missing":
        del tensors[name]
    else:
        tensors[name] = tensors[name][:-1]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    result = CliRunner().invoke(cli.main, ["extract", str(folder), "--db", str(db), "--name", "other",
                                           "--circuits", "qk,ov"])
    assert result.exit_code != 0 and result.output.startswith("Error:") and result.output.count("\n") == 1
    assert name in result.output
    assert db.read_bytes() == before
