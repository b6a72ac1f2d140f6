"""GGUF files (llama.cpp): a layer's Q/K maps dequantized with the `gguf` package on demand."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
from gguf import GGUFValueType

from headforms.extract.checkpoint import Checkpoint, ExtractError, ModelSpec, sha256_files

# RoPE pairing of the rows of each head as the file stores them. llama.cpp's converter permutes
# the Q and K rows of llama-family models (Mistral is stored as `llama` too) within each head,
# from Hugging Face's split-half order to adjacent pairs (its "normal" rope); qwen2 and gemma are
# stored unpermuted and rotate split halves ("neox"). The permutation P is the same for Q and K,
# so L = (P W_K)^T (P W_Q) = W_K^T W_Q at d = 0; only L_d at d != 0 depends on the pairing.
ROPE_PAIRING = {"llama": "interleaved", "qwen2": "split-half", "gemma": "split-half"}


class _HeaderReader(gguf.GGUFReader):
    """GGUFReader that steps over metadata arrays instead of parsing them element by element.

    The stock reader spends ~1.7 s on SmolLM2's tokenizer arrays (~100k strings); stepping over
    them takes ~0.03 s. Skipped arrays come out empty: nothing here reads them.
    """

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        item_type = GGUFValueType(int(self._get(orig_offs, np.uint32)[0]))
        count = int(self._get(orig_offs + 4, np.uint64)[0])
        offs = orig_offs + 12
        if item_type == GGUFValueType.STRING:
            buf = memoryview(self.data)
            order = "little" if self.endianess == gguf.GGUFEndian.LITTLE else "big"
            for _ in range(count):
                if offs + 8 > len(buf):
                    raise ValueError("metadata runs past the end of the file")
                offs += 8 + int.from_bytes(buf[offs:offs + 8], order)
        elif item_type in self.gguf_scalar_to_np:
            offs += count * np.dtype(self.gguf_scalar_to_np[item_type]).itemsize
        else:  # arrays of arrays: rare and short, the stock parser handles them
            return super()._get_field_parts(orig_offs, raw_type)
        return offs - orig_offs, [], [], [GGUFValueType.ARRAY]


def _open_reader(path: Path) -> _HeaderReader:
    """Parse the header and tensor table; any malformation becomes one ExtractError line."""
    try:
        return _HeaderReader(path)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, OSError) as e:
        detail = (str(e).splitlines() or [type(e).__name__])[0]
        raise ExtractError(f"corrupt or truncated GGUF file {path}: {detail}") from None


def _weight(tensor, data: np.ndarray, layer: int) -> np.ndarray:
    """One tensor's data dequantized to float64 (out, in); refuses unknown types and non-finite values."""
    try:
        w = gguf.quants.dequantize(data, tensor.tensor_type)
    except NotImplementedError:
        raise ExtractError(
            f"cannot dequantize tensor {tensor.name}: the gguf package does not support "
            f"type {tensor.tensor_type.name}") from None
    w = np.asarray(w, dtype=np.float64)
    if not np.isfinite(w).all():
        raise ExtractError(f"layer {layer}: tensor {tensor.name} has non-finite values")
    return w


def open_gguf(path: Path, *, name: str, source: str, revision: str | None) -> Checkpoint:
    """Open a llama.cpp GGUF file; revision None records the file's sha256."""
    path = Path(path)
    return gguf_checkpoint(_open_reader(path), lambda tensors: [t.data for t in tensors], path, name=name,
                           source=source, revision=revision or sha256_files([path]),
                           checkpoint_bytes=path.stat().st_size)


def gguf_checkpoint(reader: gguf.GGUFReader, data_of, path, *, name: str, source: str, revision: str,
                    checkpoint_bytes: int, meter=None) -> Checkpoint:
    """A Checkpoint over a parsed GGUF header; data_of(tensors) gives those tensors' raw data arrays
    (local: views of the mapped file; hub: fetched by range). `path` names the file in errors."""
    meta = {key: field.contents() for key, field in reader.fields.items()
            if field.types and field.types[0] != GGUFValueType.ARRAY
            and not key.startswith("tokenizer.")}
    arch = meta.get("general.architecture")
    if arch not in ROPE_PAIRING:
        raise ExtractError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(ROPE_PAIRING)}")

    def key(suffix, default=None):
        value = meta.get(f"{arch}.{suffix}", default)
        if value is None:
            raise ExtractError(f"GGUF file {path} lacks the scalar metadata {arch}.{suffix}")
        return value

    n_layers, n_heads, d_model = key("block_count"), key("attention.head_count"), key("embedding_length")
    n_kv_heads = key("attention.head_count_kv", n_heads)
    head_dim = key("attention.key_length", d_model // n_heads)
    if n_heads % n_kv_heads:
        raise ExtractError(f"GGUF file {path}: {n_heads} query heads do not group over {n_kv_heads} kv heads")

    tensors = {t.name: t for t in reader.tensors}
    layers = []
    for i in range(n_layers):
        pair = []
        for kind, heads in (("q", n_heads), ("k", n_kv_heads)):
            tensor = tensors.get(f"blk.{i}.attn_{kind}.weight")
            if tensor is None:
                raise ExtractError(f"GGUF file {path} has no tensor blk.{i}.attn_{kind}.weight")
            shape = tuple(int(d) for d in tensor.shape[::-1])  # GGUF lists dims innermost first
            if shape != (heads * head_dim, d_model):
                raise ExtractError(f"GGUF tensor {tensor.name} has shape {shape}, "
                                   f"expected ({heads * head_dim}, {d_model})")
            pair.append(tensor)
        layers.append(pair)

    spec = ModelSpec(
        architecture=arch, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
        d_model=d_model, head_dim=head_dim, score_scale=1.0 / math.sqrt(head_dim), positional="rope",
        config={**meta, "rope_pairing": ROPE_PAIRING[arch],
                "rope_theta": key("rope.freq_base", 10000.0),
                "rope_dims": key("rope.dimension_count", head_dim)})

    def read(layer: int) -> tuple[np.ndarray, np.ndarray]:
        q, k = layers[layer]
        q_data, k_data = data_of([q, k])
        return (_weight(q, q_data, layer).reshape(n_heads, head_dim, d_model),
                _weight(k, k_data, layer).reshape(n_kv_heads, head_dim, d_model))

    return Checkpoint(name=name, source=source, revision=revision, spec=spec, reader=read, close=layers.clear,
                      qk_bytes=sum(int(t.n_bytes) for pair in layers for t in pair),
                      checkpoint_bytes=checkpoint_bytes, meter=meter)
