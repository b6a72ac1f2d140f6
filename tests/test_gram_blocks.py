"""W_E^T W_U by blocks of vocabulary rows (issue 54): every reader's blocks, in order, hold exactly its whole
embeddings (a tied tensor read once a block), and the Gram summed over them is the whole product to 1e-12."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import gguf
import numpy as np
import pytest

from headforms.compute.copying import unembedding_gram
from headforms.compute.threads import Pool
from headforms.extract import checkpoint as checkpoint_module
from headforms.extract.checkpoint import ReadOptions, row_blocks
from headforms.extract.formats import hf
from headforms.extract.formats.gguf_file import open_gguf
from headforms.extract.sources import open_checkpoint
from headforms.extract.transport.hub import RemoteFile
from headforms.warehouse.running import layers
from tests import tiny_models as tm
from tests.hub_server import serve_hub
from tests.test_gguf import write_gguf

OV = ReadOptions(circuits=("qk", "ov"))
ROWS = 5  # vocabulary rows a block in these tests: neither tm.VOCAB (64) nor GGUF_VOCAB is a multiple of it
GGUF_VOCAB, GGUF_WIDTH = 37, 256  # 256: one Q6_K block a row


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The hub on a local port (online), an empty headforms cache in tmp."""
    server = serve_hub(monkeypatch, tmp_path, hf_home=False)
    yield server
    server.close()


def small_blocks(monkeypatch, width: int) -> None:
    """Blocks of ROWS rows at this width (embedding_blocks sizes them by their float64 bytes)."""
    monkeypatch.setattr(checkpoint_module, "EMBEDDING_BLOCK_BYTES", ROWS * 8 * width)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest entry of |got - want| over the largest of |want|."""
    return float(np.abs(got - want).max() / np.abs(want).max())


def assert_blocked(ckpt, whole: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """The checkpoint's blocks are ROWS rows each (the last fewer), and together exactly the whole embeddings (its
    read_embeddings', or `whole`: another reader's); the Gram over them, on the pool as a run forms it, is the whole
    W_E^T W_U to 1e-12 relative."""
    w_e, w_u = whole or ckpt.read_embeddings()
    blocks = list(ckpt.embedding_blocks())
    assert [len(e) for e, _ in blocks] == [len(u) for _, u in blocks] == [
        block.stop - block.start for block in row_blocks(len(w_e), ROWS)]
    assert len(blocks) > 1 and len(w_e) % ROWS
    np.testing.assert_array_equal(np.concatenate([e for e, _ in blocks]), w_e)
    np.testing.assert_array_equal(np.concatenate([u for _, u in blocks]), w_u)
    with Pool() as pool:
        gram = layers.unembedding_gram(ckpt, pool)
    assert relative_error(gram, w_e.T @ w_u) <= 1e-12


def test_row_blocks_cover_the_range_once_in_order():
    assert row_blocks(12, 5) == [slice(0, 5), slice(5, 10), slice(10, 12)]
    assert row_blocks(10, 5) == [slice(0, 5), slice(5, 10)]
    assert row_blocks(3, None) == [slice(0, 3)] and row_blocks(3, 7) == [slice(0, 3)]
    assert row_blocks(0, None) == [slice(0, 0)]


@pytest.mark.parametrize("rows", [1, 4, 36, 37, 100])
@pytest.mark.parametrize("workers", [1, 2])
def test_the_gram_summed_over_row_blocks_is_the_whole_product(rows, workers):
    """Blocks of any size (one row, not dividing the vocabulary, all of it, more than it) on one thread or two give
    W_E^T W_U (columns fewer than GRAM_BLOCKS); a block left out or counted twice does not."""
    rng = np.random.default_rng(2)
    w_e, w_u = rng.normal(size=(37, 10)), rng.normal(size=(37, 10))
    blocks = [(w_e[block], w_u[block]) for block in row_blocks(37, rows)]
    with ThreadPoolExecutor(workers) as executor:
        gram = unembedding_gram(iter(blocks), executor.submit)
        assert relative_error(gram, w_e.T @ w_u) <= 1e-12
        if len(blocks) > 1:
            for wrong in (blocks[1:], blocks + blocks[-1:]):
                assert relative_error(unembedding_gram(iter(wrong), executor.submit), w_e.T @ w_u) > 1e-3


def test_no_two_products_add_to_the_same_columns_at_once():
    """A column block's product of one row block starts only once the row block before has added to those columns
    (they share G's memory), whatever order the pool's threads run in; every other product may run beside it."""
    import threading
    import time

    rng = np.random.default_rng(3)
    w_e, w_u = rng.normal(size=(40, 32)), rng.normal(size=(40, 32))
    adding, overlaps, lock = set(), [], threading.Lock()

    def watched(fn, into, *args):
        with lock:
            overlaps.append(into.ctypes.data in adding)
            adding.add(into.ctypes.data)
        time.sleep(0.002 * rng.random())
        fn(into, *args)
        with lock:
            adding.discard(into.ctypes.data)

    with ThreadPoolExecutor(8) as executor:
        gram = unembedding_gram(((w_e[block], w_u[block]) for block in row_blocks(40, 4)),
                                lambda fn, *args: executor.submit(watched, fn, *args))
    assert len(overlaps) == 10 * 16 and not any(overlaps)
    assert relative_error(gram, w_e.T @ w_u) <= 1e-12


@pytest.mark.parametrize(("name", "fmt"), [("llama_gqa", "safetensors"), ("llama_gqa", "bin"),
                                           ("distilgpt2", "sharded"), ("gpt2", "safetensors")],
                         ids=["untied", "untied-bin", "tied-sharded", "tied-no-head"])
def test_a_folders_blocks_are_its_embeddings(name, fmt, tmp_path, monkeypatch):
    """Safetensors (one file or shards) and .bin folders, tied (distilgpt2; GPT2Model with no head at all, its ln_f
    folded) and untied (llama's final norm folded into the LM head)."""
    ckpt = open_checkpoint(str(tm.save(tm.build(name), tmp_path / name, fmt)), OV)
    small_blocks(monkeypatch, ckpt.spec.d_model)
    assert ckpt.unembedding
    assert_blocked(ckpt)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_safetensors_embedding_is_read_once_a_block(tied, tmp_path, monkeypatch):
    """Each block reads its rows of the token embedding and of the LM head once each, a tied one once for both:
    positioned reads of consecutive byte ranges that cover each tensor once."""
    folder = tm.save(tm.build("distilgpt2" if tied else "llama_gqa"), tmp_path / "m")
    ckpt = open_checkpoint(str(folder), OV)
    small_blocks(monkeypatch, ckpt.spec.d_model)
    spans = hf._safetensors_spans(folder / "model.safetensors")
    tensors = {name: spans[name][2:] for name in spans if name.endswith(("wte.weight", "embed_tokens.weight",
                                                                         "lm_head.weight"))}
    assert len(tensors) == (1 if tied else 2)
    reads, read_at = [], hf._read_at
    monkeypatch.setattr(hf, "_read_at", lambda f, offset, size, *rest: reads.append((offset, size))
                        or read_at(f, offset, size, *rest))
    blocks = list(ckpt.embedding_blocks())
    for start, end in tensors.values():
        inside = [(offset, size) for offset, size in reads if start <= offset < end]
        assert len(inside) == len(blocks)
        assert [offset for offset, _ in inside] == list(np.cumsum([start] + [size for _, size in inside])[:-1])
        assert sum(size for _, size in inside) == end - start


def gguf_embeddings(path, qtype, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """A one-layer llama GGUF file with the ov circuit's tensors (F32) and a token embedding (and, untied, an output)
    of type `qtype`, GGUF_VOCAB x GGUF_WIDTH: Q8_0 quantized from floats, Q6_K random blocks (scale bytes below 0x3c,
    finite) as gguf cannot quantize it; returns the dequantized W_E and W_U the file holds, the final norm folded."""
    rng = np.random.default_rng(seed)
    heads, n = 2, 8
    weights = {f"blk.0.{stem}.weight": rng.standard_normal(shape).astype(np.float32) for stem, shape in (
        ("attn_q", (heads * n, GGUF_WIDTH)), ("attn_k", (n, GGUF_WIDTH)), ("attn_v", (n, GGUF_WIDTH)),
        ("attn_output", (GGUF_WIDTH, heads * n)))}
    gain = rng.uniform(0.5, 1.5, GGUF_WIDTH).astype(np.float32)
    weights["output_norm.weight"] = gain
    stored = {}
    for name in ["token_embd.weight"] + ([] if tied else ["output.weight"]):
        if qtype == gguf.GGMLQuantizationType.Q8_0:
            raw = gguf.quants.quantize(rng.standard_normal((GGUF_VOCAB, GGUF_WIDTH)).astype(np.float32), qtype)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 0x3c, (GGUF_VOCAB, GGUF_WIDTH // block * size), np.uint8)
        weights[name] = (raw, qtype)
        stored[name] = gguf.quants.dequantize(raw, qtype).astype(np.float64)
    write_gguf(path, n_layers=1, n_heads=heads, n_kv_heads=1, d_model=GGUF_WIDTH, head_dim=n, weights=weights)
    w_e = stored["token_embd.weight"]
    return {"w_e": w_e, "w_u": stored.get("output.weight", w_e) * gain.astype(np.float64)}


QTYPES = [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q6_K]


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("qtype", QTYPES, ids=[q.name for q in QTYPES])
def test_a_quantized_gguf_embeddings_blocks_are_whole_ggml_blocks_dequantized(qtype, tied, tmp_path, monkeypatch):
    """A GGUF token_embd (and output) of Q8_0 or Q6_K read by blocks of rows: each block's rows are whole GGML blocks,
    dequantized on their own to what the whole tensor dequantizes to, output_norm's gain folded into each."""
    path = tmp_path / "m.gguf"
    want = gguf_embeddings(path, qtype, tied)
    ckpt = open_gguf(path, name="m", source=str(path), options=OV)
    small_blocks(monkeypatch, GGUF_WIDTH)
    w_e, w_u = ckpt.read_embeddings()
    np.testing.assert_allclose(w_e, want["w_e"], rtol=1e-7, atol=0)
    np.testing.assert_allclose(w_u, want["w_u"], rtol=1e-6, atol=0)
    assert_blocked(ckpt)


@pytest.mark.parametrize("fmt", ["sharded", "bin"])
def test_hub_blocks_are_the_folders_embeddings(fmt, hub, tmp_path, monkeypatch):
    """By range from the hub: safetensors shards (untied, each block one range of each tensor) and a torch zip (tied:
    each block one range of its storage) give the folder's embeddings, and the same Gram."""
    folder = tm.save(tm.build("llama_gqa" if fmt == "sharded" else "opt"), tmp_path / fmt, fmt)
    hub.repos["org/tiny"] = {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}
    local, remote = open_checkpoint(str(folder), OV), open_checkpoint("org/tiny", OV)
    small_blocks(monkeypatch, remote.spec.d_model)
    assert_blocked(remote, local.read_embeddings())
    remote.close()


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_hub_gguf_blocks_are_the_files_and_a_tied_tensor_is_one_range_a_block(tied, hub, tmp_path, monkeypatch):
    """A Q6_K token_embd read by range: each block fetches one range of it (and one of output where untied), the
    rows' whole GGML blocks, and the blocks are the local file's embeddings."""
    path = tmp_path / "m.gguf"
    gguf_embeddings(path, gguf.GGMLQuantizationType.Q6_K, tied)
    hub.repos["org/gguf"] = {"m.gguf": path.read_bytes()}
    local, remote = (open_gguf(path, name="m", source=str(path), options=OV),
                     open_checkpoint("org/gguf/m.gguf", OV))
    small_blocks(monkeypatch, GGUF_WIDTH)
    calls, read_many = [], RemoteFile.read_many
    monkeypatch.setattr(RemoteFile, "read_many", lambda self, spans, **kw: calls.append(list(spans))
                        or read_many(self, spans, **kw))
    blocks = list(remote.embedding_blocks())
    row = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q6_K][1] * GGUF_WIDTH // 256
    assert [len(spans) for spans in calls] == [1] + [1 if tied else 2] * len(blocks)  # output_norm, then the blocks
    assert all(end - start == row * (block.stop - block.start) for spans, block in zip(calls[1:], row_blocks(
        GGUF_VOCAB, ROWS)) for start, end in spans)
    assert_blocked(remote, local.read_embeddings())


def test_opt_projections_fold_into_each_block(tmp_path, monkeypatch):
    """OPT-350m's shape (embeddings of width 16 projected in and out of the width-32 residual stream): each block's
    W_E P_in^T and W_U P_out."""
    monkeypatch.setitem(tm.TINY, "opt_350m", tm.Tiny("OPTForCausalLM", "OPTConfig", dict(
        num_hidden_layers=2, num_attention_heads=4, hidden_size=32, ffn_dim=64, vocab_size=tm.VOCAB,
        max_position_embeddings=32, word_embed_proj_dim=16, do_layer_norm_before=False)))
    ckpt = open_checkpoint(str(tm.save(tm.build("opt_350m"), tmp_path / "opt")), OV)
    small_blocks(monkeypatch, ckpt.spec.d_model)
    assert_blocked(ckpt)
