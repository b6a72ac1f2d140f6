"""The output-value circuit: every layout's W_V, W_O reproduce its tiny model's own attention output, head by head
(transformers' forward pass, the attention pattern A as the model computed it), and read_embeddings gives the model's
own embedding, unembedding and final norm gain."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch

from safetensors.torch import load_file

from headforms.extract.checkpoint import ExtractError, ReadOptions
from headforms.extract.hf import open_hf_folder
from headforms.extract.layouts import LAYOUTS
from tests import tiny_models as tm

LAYOUT_MODELS = [name for name, tiny in tm.TINY.items() if not tiny.discovered]
DISCOVERED = [name for name, tiny in tm.TINY.items() if tiny.discovered]


def open_folder(folder, name: str, **options):
    options = {"qk_norm": "fold", "tower": tm.TINY[name].tower, "circuits": ("qk", "ov")} | options
    return open_hf_folder(folder, name="tiny", source=str(folder), options=ReadOptions(**options))


def out_projection(model, folder, ckpt, layer: int) -> torch.nn.Module:
    """The model's module whose weight is the layer's output projection as the file stores it under the layout's name
    (found by its values: transformers may rename modules from the names its files keep)."""
    layout = LAYOUTS[ckpt.spec.architecture]
    stored = load_file(folder / "model.safetensors")
    template = layout.tensors["o"].format(i=layer)
    name = next(p + template for p in layout.prefixes if p + template in stored)
    found = [m for m in model.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
             and m.weight.shape == stored[name].shape and torch.equal(m.weight, stored[name])]
    assert len(found) == 1, f"{len(found)} modules hold {name}"
    return found[0]


@contextmanager
def outputs_of(modules):
    """A list each module's forward output is appended to while the block runs."""
    outputs = []
    hooks = [m.register_forward_hook(lambda m, a, out: outputs.append(out.detach().double().numpy())) for m in modules]
    try:
        yield outputs
    finally:
        for hook in hooks:
            hook.remove()


def predicted_output(w_v, w_o, kv_index, probs, x) -> np.ndarray:
    """sum_h W_O[h] W_V[kv(h)] sum_j A^h_ij x_j, (B, T, N): each head's OV map applied to its attention average."""
    values = np.einsum("kva,bja->bkjv", w_v, x)[:, kv_index]
    return np.einsum("hnv,bhij,bhjv->bin", w_o, probs, values)


def ov_error(model, folder, ckpt, name: str) -> float:
    """Largest |model's attention output - predicted| relative to its largest entry, over the layers."""
    spec = ckpt.spec
    with outputs_of([out_projection(model, folder, ckpt, layer) for layer in range(spec.n_layers)]) as outs:
        trace = tm.trace(name, model)
    assert len(outs) == spec.n_layers
    worst = 0.0
    for layer in range(spec.n_layers):
        w_v, w_o = ckpt.read_circuits(layer)["ov"]
        assert w_v.dtype == w_o.dtype == np.float64
        assert w_v.shape == (spec.n_kv_heads, spec.head_dim, spec.d_model)
        assert w_o.shape == (spec.n_heads, spec.d_model, spec.head_dim)
        predicted = predicted_output(w_v, w_o, spec.kv_index, trace.probs[layer], trace.inputs[layer])
        scale = np.abs(outs[layer]).max()
        assert scale > 0.1, "the attention output should be O(1) for a meaningful comparison"
        worst = max(worst, np.abs(outs[layer] - predicted).max() / scale)
    return worst


@pytest.mark.parametrize("name", LAYOUT_MODELS)
def test_ov_reproduces_attention_output(name, tmp_path):
    model = tm.build(name)  # float64, biases zero: the output projection's output is the heads' sum
    ckpt = open_folder(tm.save(model, tmp_path), name)
    assert ckpt.spec.architecture in LAYOUTS
    assert ov_error(model, tmp_path, ckpt, name) < 1e-10
    qk_only = open_folder(tmp_path, name, circuits=("qk",))
    for layer in range(ckpt.spec.n_layers):  # the qk circuit is read_layer's pair, with or without ov
        for read, alone in zip(ckpt.read_circuits(layer)["qk"], qk_only.read_layer(layer)):
            np.testing.assert_array_equal(read, alone)
    assert set(qk_only.read_circuits(0)) == {"qk"} and ckpt.revision == qk_only.revision
