"""GGUF files (llama.cpp): a layer's Q/K maps (and V/O maps) dequantized with the `gguf` package on demand.

What each architecture's file holds is data, extract.layouts.gguf_table. The ov circuit reads attn_v (or the V rows of
attn_qkv; llama.cpp permutes Q and K rows only) and attn_output, and the model's token_embd, output (else token_embd:
tied) and output_norm (its gain, stored as llama.cpp applies it: Gemma's 1 + w).
"""
from __future__ import annotations

import struct
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from headforms.extract.checkpoint import (Checkpoint, ExtractError, ModelSpec, Provenance, ReadOptions, first_line,
                                          row_blocks)
from headforms.extract.formats.provenance import Digest, local_provenance
from headforms.extract.formats.unreadable import extent_problem, header_cut, refuse_foreign
from headforms.extract.layouts import latent
from headforms.extract.layouts.gguf_table import (GGUF_ARCHITECTURES, SCALE_RULES, SUPPORTED_GGUF, file_refusal,
                                                  latent_roles, qk_norm_refusal)
from headforms.extract.layouts.norms import GGUF_NORMS, norm_for
from headforms.extract.layouts.rope import gguf_rope
from headforms.extract.layouts.table import SEPARATE, Layout


class _Cut(ValueError):
    """The header (metadata or tensor table) runs past the end of the bytes at hand."""


class PlainReader(gguf.GGUFReader):
    """gguf's reader, every piece of the header sliced from a plain array over the file's map instead of the map itself:
    the same fields, parts and tensors (tested against the stock reader), a third of the time, since every slice of a
    numpy memmap is a memmap made anew and SmolLM2's tokenizer arrays are some 200,000 slices (1.8 s against 0.6 s).
    transformers' GGUF loads parse with it (behaviour); headforms' own header reader below builds on it."""

    def _get(self, offset, dtype, count=1, override_order=None):
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        values = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
        return values.view(values.dtype.newbyteorder(self.byte_order if override_order is None else override_order))


class _HeaderReader(PlainReader):
    """PlainReader that takes metadata arrays whole instead of parsing them element by element, and reads
    the header of a file whose tensor data is cut short.

    The stock reader spends ~1.7 s on SmolLM2's tokenizer arrays (~100k strings); this one 0.014 s:
    an array of strings is stepped over and comes out empty (nothing here reads them), an array of
    numbers is one array, the field's only data part (`gguf_array`). Tensor data past the end of the
    bytes at hand (a truncated file, or a hub file's prefix) gets a zero-stride placeholder, so the
    header describes the whole file and the extent check names what is missing; a header that runs
    past the end raises _Cut.
    """

    def __init__(self, path):
        self._table_read = False
        super().__init__(path)

    def _build_tensors(self, start_offs, fields):
        self._table_read = True
        super()._build_tensors(start_offs, fields)

    def _get(self, offset, dtype, count=1, override_order=None):
        if offset + np.dtype(dtype).itemsize * int(count) > len(self.data):
            if self._table_read:
                return np.broadcast_to(np.zeros((), dtype), (int(count),))
            raise _Cut(f"the header runs past byte {len(self.data)}")
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        item_type = GGUFValueType(int(self._get(orig_offs, np.uint32)[0]))
        count = int(self._get(orig_offs + 4, np.uint64)[0])
        offs = orig_offs + 12
        if item_type == GGUFValueType.STRING:
            buf, end = memoryview(self.data), len(self.data) - 8
            length = struct.Struct("<Q" if self.endianess == gguf.GGUFEndian.LITTLE else ">Q").unpack_from
            for _ in range(count):
                if offs > end:
                    raise _Cut("metadata runs past the end of the file")
                offs += 8 + length(buf, offs)[0]
        elif item_type in self.gguf_scalar_to_np:  # its values as one array, the field's only data part
            values = self._get(offs, self.gguf_scalar_to_np[item_type], count)
            return 12 + values.nbytes, [np.array([item_type], np.uint32), np.array([count], np.uint64), values], \
                [2], [GGUFValueType.ARRAY, item_type]
        else:  # arrays of arrays: rare and short, the stock parser handles them
            return super()._get_field_parts(orig_offs, raw_type)
        return offs - orig_offs, [], [], [GGUFValueType.ARRAY]


def _open_reader(path: Path) -> _HeaderReader:
    """Parse the header and tensor table; a file of another format is named, one cut inside its header is said
    to be incomplete, any other malformation becomes one ExtractError line."""
    refuse_foreign(path)
    try:
        return _HeaderReader(path)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, OSError) as e:
        if isinstance(e, _Cut) or (path.is_file() and path.stat().st_size == 0):
            raise header_cut(path, path.stat().st_size, "GGUF header (metadata and tensor table)") from None
        raise ExtractError(f"corrupt or truncated GGUF file {path}: {first_line(e)}") from None


def gguf_array(path: Path, key: str) -> np.ndarray | None:
    """A metadata array of numbers (tokenizer.ggml.token_type, say) read from the file's header alone; None when the
    file has no such key."""
    field = _open_reader(path).fields.get(key)
    if field is None:
        return None
    if field.types[:1] != [GGUFValueType.ARRAY] or len(field.data) != 1:
        raise ExtractError(f"{path}: {key} is not an array of numbers")
    return np.array(field.parts[field.data[0]])


@lru_cache(maxsize=None)
def dequantizable(qtype: GGMLQuantizationType) -> bool:
    """Whether the gguf package dequantizes this tensor type (F64 needs no dequantizing)."""
    if qtype == GGMLQuantizationType.F64:
        return True
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    try:
        gguf.quants.dequantize(np.zeros((1, size), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _weight(tensor, data: np.ndarray, layer: int | None, rows: int | None = None) -> np.ndarray:
    """The first `rows` rows (all by default) of a tensor's raw data dequantized to float64 (rows, in);
    refuses non-finite values (naming the layer, unless None: the embeddings). GGML blocks never span rows, so a
    fused attn_qkv's V rows are left undecoded when only Q/K are asked for.
    """
    shape = tuple(int(d) for d in tensor.shape[::-1])
    data = np.asarray(data if rows is None else data[:rows])  # a plain view of a memmap: its slices cost no Python
    if tensor.tensor_type == GGMLQuantizationType.F64:
        w = np.asarray(data, dtype=np.float64)
    else:
        w = np.asarray(gguf.quants.dequantize(data, tensor.tensor_type), dtype=np.float64)
    if not np.isfinite(w).all():
        raise ExtractError(("" if layer is None else f"layer {layer}: ") + f"tensor '{tensor.name}' has non-finite values")
    return w.reshape((rows or shape[0],) + shape[1:])


def _norm_tensor(tensors: dict, name: str, d_model: int, path: Path):
    """A norm gain tensor of shape (d_model,), for fold_norm."""
    tensor = tensors.get(name)
    if tensor is None:
        raise ExtractError(f"GGUF file {path} has no tensor {name} (needed by `fold_norm`)")
    if tuple(int(d) for d in tensor.shape) != (d_model,):
        raise ExtractError(f"GGUF tensor {name} has shape {tuple(tensor.shape)}, expected ({d_model},)")
    return tensor


def _embeddings(tensors: dict, d_model: int, path) -> dict:
    """role -> tensor of the model's embeddings (token_embd; output, else token_embd; output_norm when present),
    checked: (vocab, N) and a gain (N,)."""
    if "token_embd.weight" not in tensors:
        raise ExtractError(f"GGUF file {path} has no tensor token_embd.weight (read for the ov circuit)")
    found = {"token": tensors["token_embd.weight"], "unembedding": tensors.get("output.weight",
                                                                              tensors["token_embd.weight"])}
    if "output_norm.weight" in tensors:
        found["final_norm"] = tensors["output_norm.weight"]
    vocab = int(found["token"].shape[-1])
    for role, tensor in found.items():
        actual, shape = tuple(int(d) for d in tensor.shape[::-1]), (d_model,) if role == "final_norm" else (vocab, d_model)
        if actual != shape:
            raise ExtractError(f"GGUF tensor {tensor.name} has shape {actual}, expected {shape}")
        if not dequantizable(tensor.tensor_type):
            raise ExtractError(f"cannot dequantize tensor {tensor.name}: the gguf package does not support "
                               f"type {tensor.tensor_type.name}")
    return found


def open_gguf(path: Path, *, name: str, source: str, options: ReadOptions = ReadOptions()) -> Checkpoint:
    """Open a llama.cpp GGUF file; options.revision None: a Hugging Face cache snapshot's commit, else a Digest
    of the header and the tensors read. The other options: see gguf_checkpoint."""
    path = Path(path)
    reader = _open_reader(path)
    provenance = local_provenance(path, name=name, source=source, revision=options.revision,
                                  checkpoint_bytes=path.stat().st_size,
                                  digest=lambda: Digest({path: bytes(reader.data[:reader.data_offset])}))
    digest = provenance.digest

    def data_of(tensors, rows: slice | None = None) -> list[np.ndarray]:
        """The tensors' views of the mapped file (`rows` of each: None, all), whole ones hashed as they are first
        read when a digest is the revision."""
        if rows is not None:
            return [t.data[rows] for t in tensors]
        if digest is not None:
            for t in tensors:
                digest.update(path, t.name, t.data)
        return [t.data for t in tensors]

    return gguf_checkpoint(reader, data_of, path, provenance, options)


def gguf_checkpoint(reader: gguf.GGUFReader, data_of, path, provenance: Provenance,
                    options: ReadOptions) -> Checkpoint:
    """A Checkpoint over a parsed GGUF header; data_of(tensors, rows=None) gives those tensors' raw data arrays, or
    a slice `rows` of each (local: views of the mapped file; hub: fetched by range). `path` names the file in errors.

    options.qk_norm="refuse" rejects files with RMS QK-norm gains; "fold" folds attn_q_norm / attn_k_norm into W_Q,
    W_K and marks the spec qk_norm="folded". options.fold_norm as in extract.layouts.norms. (A GGUF file holds one
    tower: options.tower is refused before this.)
    """
    qk_norm, fold_norm = options.qk_norm, options.fold_norm
    if qk_norm not in ("refuse", "fold"):
        raise ExtractError(f"unknown qk_norm={qk_norm!r}; expected 'refuse' or 'fold'")
    meta = {key: field.contents() for key, field in reader.fields.items()
            if field.types and field.types[0] != GGUFValueType.ARRAY
            and not key.startswith("tokenizer.")}
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ExtractError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_GGUF)}")
    layout = GGUF_ARCHITECTURES[arch]
    reason = layout.refusal or file_refusal(meta, arch)
    if reason:
        raise ExtractError(f"GGUF {arch} is refused: {reason}")

    def key(suffix, default=None):
        value = meta.get(f"{arch}.{suffix}", default)
        if value is None:
            raise ExtractError(f"GGUF file {path} lacks the scalar metadata {arch}.{suffix}")
        return value

    n_layers, n_heads, d_model = key("block_count"), key("attention.head_count"), key("embedding_length")
    n_kv_heads = key("attention.head_count_kv", n_heads)
    head_dim = key("attention.key_length", d_model // n_heads)
    value_dim = key("attention.value_length", head_dim)
    if n_heads % n_kv_heads:
        raise ExtractError(f"GGUF file {path}: {n_heads} query heads do not group over {n_kv_heads} kv heads")

    tensors = {t.name: t for t in reader.tensors}
    first = {"separate": "blk.0.attn_q.weight", "fused": "blk.0.attn_qkv.weight", "latent": "blk.0.attn_kv_a_mqa.weight"}
    packing = next((p for p in layout.packings if first[p] in tensors), layout.packings[0])
    form = None  # a latent-attention file's LatentSpec: each head read as its two parts (extract.layouts.latent)
    q_rows, k_rows = n_heads * head_dim, n_kv_heads * head_dim
    circuits = options.circuits
    roles = ({"q": ("attn_q", (q_rows, d_model)), "k": ("attn_k", (k_rows, d_model))} if packing == "separate"
             else {"qkv": ("attn_qkv", (q_rows + k_rows + n_kv_heads * value_dim, d_model))})
    ov_roles = ({"v": ("attn_v", (n_kv_heads * value_dim, d_model))} if packing == "separate" else {}) | {
        "o": ("attn_output", (d_model, n_heads * value_dim))}
    if packing == "latent":
        if fold_norm != "none":
            raise ExtractError(f"GGUF {arch}: fold_norm='{fold_norm}' is not built for multi-head latent attention")
        if "ov" in circuits:
            raise ExtractError(f"GGUF {arch}: the ov circuit is refused: multi-head latent attention's values are "
                               "read through the kv latent's RMSNorm; its OV maps are not built yet")
        form, roles = latent_roles(meta, set(tensors), path, qk_norm)
        ov_roles = {}
    elif layout.qk_norm and "blk.0.attn_q_norm.weight" in tensors:
        if qk_norm == "refuse" or layout.qk_norm == "layer":
            raise ExtractError(qk_norm_refusal(arch, layout))
        per_head = layout.qk_norm == "head"
        roles |= {"q_norm": ("attn_q_norm", (head_dim if per_head else q_rows,)),
                  "k_norm": ("attn_k_norm", (head_dim if per_head else k_rows,))}

    qk_roles = list(roles)
    roles = (roles if "qk" in circuits else {role: roles[role] for role in ("qkv",) if role in roles}) | (
        ov_roles if "ov" in circuits else {})  # the tensors read (a fused attn_qkv once for both circuits)
    layers = []
    for i in range(n_layers):
        layer = {}
        for role, (stem, shape) in roles.items():
            tensor = tensors.get(f"blk.{i}.{stem}.weight")
            if tensor is None:
                raise ExtractError(f"GGUF file {path} has no tensor blk.{i}.{stem}.weight (layer {i})")
            actual = tuple(int(d) for d in tensor.shape[::-1])  # GGUF lists dims innermost first
            if actual != shape:
                raise ExtractError(f"GGUF tensor {tensor.name} has shape {actual}, expected {shape} from the file's "
                                   "metadata")
            if not dequantizable(tensor.tensor_type):
                raise ExtractError(f"cannot dequantize tensor {tensor.name}: the gguf package does not support "
                                   f"type {tensor.tensor_type.name}")
            layer[role] = tensor
        layers.append(layer)

    shape = {"n_layers": n_layers, "n_heads": n_heads, "d_model": d_model, "head_dim": head_dim}
    rope = {"rope_pairing": layout.rope_pairing, "rope_theta": key("rope.freq_base", 10000.0),
            "rope_dims": key("rope.dimension_count", head_dim)} if layout.positional == "rope" else {}
    spec = replace(latent.model_spec(form), config={**meta, "parts": latent.model_spec(form).config["parts"]}) \
        if form is not None else ModelSpec(
        architecture=arch, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=d_model,
        head_dim=head_dim, score_scale=SCALE_RULES[layout.score_scale](meta, arch, shape),
        positional=layout.positional,
        qk_norm="folded" if "q_norm" in roles else None, config={**meta, **rope, "gguf_packing": packing},
        rope=gguf_rope(meta, arch, head_dim, layout.rope_pairing, tensors) if layout.positional == "rope" else None,
        softcap=float(meta.get(f"{arch}.attn_logit_softcapping") or layout.softcap) if layout.softcap else None)
    norm = norm_for(spec, fold_norm, GGUF_NORMS)
    gains = [_norm_tensor(tensors, norm.tensor(i), d_model, path) for i in range(n_layers)] if norm else []
    if norm is not None:
        spec = replace(spec, fold_norm=fold_norm)
    fold = Layout(positional=layout.positional, prefixes=("",), tensors={}, packing=SEPARATE,
                  qk_norm=layout.qk_norm, norm_offset=layout.norm_offset)

    def read(layer: int, circuits: tuple[str, ...] = circuits) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The layer's circuits (Checkpoint.read_circuits), every tensor fetched in one go."""
        if not 0 <= layer < n_layers:
            raise ExtractError(f"layer {layer} out of range: {provenance.name} has {n_layers} layers")
        tensors = {role: t for role, t in layers[layer].items()
                   if role in ({*qk_roles} if "qk" in circuits else set()) | ({"qkv", *ov_roles} if "ov" in circuits
                                                                             else set())}
        fetched = data_of([*tensors.values(), *([gains[layer]] if norm is not None else [])])
        arrays = {role: _weight(tensor, data, layer, q_rows + k_rows if role == "qkv" and "ov" not in circuits
                                else None) for (role, tensor), data in zip(tensors.items(), fetched)}
        if "qkv" in arrays:
            qkv = arrays.pop("qkv")
            arrays |= {"q": qkv[:q_rows], "k": qkv[q_rows:q_rows + k_rows], "v": qkv[q_rows + k_rows:]}
        gain = _weight(gains[layer], fetched[-1], layer) if norm is not None else None
        out = {}
        if "qk" in circuits and form is not None:
            out["qk"] = latent.latent_parts(arrays, form)
        elif "qk" in circuits:
            w_q, w_k = fold.qk_maps(arrays, spec)
            out["qk"] = (w_q, w_k) if norm is None else norm.fold(w_q, w_k, gain, fold_norm)
        if "ov" in circuits:
            w_v = arrays["v"].reshape(n_kv_heads, value_dim, d_model)
            w_o = np.ascontiguousarray(arrays["o"].reshape(d_model, n_heads, value_dim).transpose(1, 0, 2))
            out["ov"] = (w_v if norm is None else norm.fold_map(w_v, gain, fold_norm), w_o)
        return out

    embeddings = _embeddings(tensors, d_model, path) if "ov" in circuits else {}

    def read_embeddings(rows: int | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """W_E, and W_U diag(g) of the output (or tied token_embd) and output_norm, by blocks of `rows` vocabulary
        rows (Checkpoint.embeddings): each block's tensors dequantized on their own, a tied one read once."""
        final = embeddings.get("final_norm")
        gain = _weight(final, data_of([final])[0], None) if final is not None else None
        token, output = embeddings["token"], embeddings["unembedding"]
        unique = list({t.name: t for t in (token, output)}.values())
        for block in row_blocks(int(token.shape[-1]), rows):
            arrays = {t.name: _weight(t, data, None, block.stop - block.start)
                      for t, data in zip(unique, data_of(unique, block))}
            w_u = arrays[output.name]
            yield arrays[token.name], w_u if gain is None else w_u * gain

    digest = provenance.digest
    if digest is not None:  # the Q/K circuit's tensors only, so a model's revision does not depend on the circuits
        digest.expect({i: [(path, t.name) for role, t in layer.items() if role in qk_roles] + [
            (path, t.name) for t in gains[i:i + 1]] for i, layer in enumerate(layers)},
            lambda layer: read(layer, ("qk",)))

    def close() -> None:
        if digest is not None:
            digest.save()
        layers.clear()

    checkpoint = Checkpoint(provenance, spec, reader=read, close=close,
                            embeddings=read_embeddings if "ov" in circuits else None, unembedding="ov" in circuits,
                            qk_bytes=sum(int(t.n_bytes) for layer in layers for t in [*layer.values()])
                            + sum(int(t.n_bytes) for t in gains), options=options)
    _check_extent(reader, path, provenance.checkpoint_bytes, checkpoint)
    return checkpoint


def _check_extent(reader: gguf.GGUFReader, path, size: int, checkpoint: Checkpoint) -> None:
    """Refuse a file cut short or running on past its last tensor (beyond alignment padding); the refusal
    carries the checkpoint its header describes, for --plan."""
    problem = extent_problem(path, size, [(t.name, int(t.data_offset), int(t.data_offset) + int(t.n_bytes))
                                          for t in reader.tensors], align=int(reader.alignment))
    if problem is not None:
        problem.checkpoint = checkpoint
        raise problem
