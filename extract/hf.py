"""Open a Hugging Face checkpoint folder (config.json + safetensors or .bin weights) without transformers.

Only a layer's query/key tensors (and QK-norm gains when folding) are ever read. Safetensors headers
are validated by the safetensors library; tensor bytes are then read with positioned reads at the
header's offsets, readahead off, so exactly those bytes come off the disk (a mapping's page faults
would read the device's readahead window around each page: 977 MB for 419 MB of Q/K measured with
an 8 MB window), and decoded with numpy (torch is not imported). `.bin` files go through torch's
weights-only unpickler over mmap, so a pickle that would run code is refused, not run.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from safetensors import safe_open

from headforms.extract.checkpoint import Checkpoint, ExtractError, ModelSpec, sha256_files
from headforms.extract.layouts import Layout, model_spec

_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}  # safetensors -> torch names
_FLOAT_DTYPES = frozenset(_DTYPES.values())
_ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_NUMPY_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}  # BF16: see _decode


def _one_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _safetensors_open(path: Path, framework: str = "numpy"):
    try:
        return safe_open(str(path), framework=framework)
    except Exception as e:  # SafetensorError, OSError: a truncated or foreign file
        raise ExtractError(f"cannot read {path}: {_one_line(e)}") from None


_HEADER_LIMIT = 100_000_000  # safetensors' own cap on the JSON header


def _open_unbuffered(path: Path):
    """A raw file without kernel readahead: a read brings in the pages asked for and no more
    (the device's readahead window can be megabytes, a large share of a small tensor)."""
    f = open(path, "rb", buffering=0)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
    return f


def _read_at(f, offset: int, size: int, path: Path) -> bytearray:
    """Exactly `size` bytes of a raw file from `offset` (positioned reads, no extra copy)."""
    buf = bytearray(size)
    view, done = memoryview(buf), 0
    f.seek(offset)
    while done < size:
        got = f.readinto(view[done:])
        if not got:
            raise ExtractError(f"cannot read {path}: the file ends at byte {offset + done}, before byte {offset + size}")
        done += got
    return buf


def _safetensors_spans(path: Path) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """name -> (dtype, shape, start, end) with absolute byte offsets, from the file's header (an
    8-byte little-endian length, then JSON), each span checked against its shape and the file size."""
    with _open_unbuffered(path) as f:
        size = os.fstat(f.fileno()).st_size
        length = int.from_bytes(_read_at(f, 0, 8, path), "little") if size >= 8 else -1
        if not 0 < length <= min(size - 8, _HEADER_LIMIT):
            raise ExtractError(f"cannot read {path}: not a safetensors file (header length {length}, file size {size})")
        try:
            header = json.loads(bytes(_read_at(f, 8, length, path)))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ExtractError(f"cannot read {path}: bad safetensors header: {_one_line(e)}") from None
    if not isinstance(header, dict):
        raise ExtractError(f"cannot read {path}: bad safetensors header")
    base, spans = 8 + length, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
            ok = isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= size - base
        except (TypeError, KeyError, ValueError):
            ok = False
        itemsize = _ITEMSIZE.get(dtype) if ok else None
        if not ok or (itemsize is not None and end - start != math.prod(shape) * itemsize):
            raise ExtractError(f"cannot read {path}: tensor '{name}' has a bad extent in the safetensors header")
        spans[name] = (dtype, shape, base + start, base + end)
    return spans


def _safetensors_header(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict]:
    """Header shapes/dtypes (through safetensors' own reader, which validates the file) and byte spans.

    The spans are read first with plain reads: safetensors maps the file, and its first page
    fault would read a whole readahead window around the header; after our read those pages
    are cached and the mapping faults on them without I/O."""
    spans = _safetensors_spans(path)
    with _safetensors_open(path) as f:
        slices = {name: f.get_slice(name) for name in f.keys()}
        meta = {name: (tuple(s.get_shape()), _DTYPES.get(s.get_dtype(), s.get_dtype())) for name, s in slices.items()}
    if {name: (shape, _DTYPES.get(dtype, dtype)) for name, (dtype, shape, _, _) in spans.items()} != meta:
        raise ExtractError(f"cannot read {path}: its safetensors header disagrees with itself")
    return meta, spans


def _decode(raw: bytearray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Little-endian safetensors bytes as a float64 array; bfloat16 is float32's upper half (shifted into place)."""
    if dtype == "BF16":
        values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        values = np.frombuffer(raw, dtype=_NUMPY_DTYPES[dtype])
    with np.errstate(invalid="ignore"):  # a signalling NaN stays NaN (and is refused later, as non-finite)
        return values.astype(np.float64).reshape(shape)


def _safetensors_fetch(path: Path, names: list[str], spans: dict) -> dict[str, np.ndarray]:
    """Named tensors as float64, read with positioned reads of exactly their bytes (no mapping, no readahead)."""
    if sys.byteorder != "little":  # safetensors is little-endian: let the library convert
        with _safetensors_open(path, framework="pt") as f:
            try:
                return {name: _float64(f.get_tensor(name)) for name in names}
            except Exception as e:
                raise ExtractError(f"cannot read {path}: {_one_line(e)}") from None
    out = {}
    with _open_unbuffered(path) as f:
        for name in sorted(names, key=lambda n: spans[n][2]):  # in file order
            dtype, shape, start, end = spans[name]
            raw = _read_at(f, start, end - start, path) if end > start else bytearray()
            out[name] = _decode(raw, dtype, shape)
    return out


def _float64(tensor) -> np.ndarray:
    """A torch tensor as a float64 numpy array (a copy)."""
    import torch

    return tensor.to(torch.float64, copy=True).numpy()


def _torch_state_dict(path: Path) -> dict:
    """A .bin state dict, mmapped (tensor data is paged in only when touched), never running pickled code."""
    import torch  # only .bin checkpoints need torch

    try:
        state = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as e:
        raise ExtractError(f"cannot read {path} (weights-only load refused or failed): {_one_line(e)}") from None
    if not isinstance(state, dict):
        raise ExtractError(f"{path} does not hold a state dict")
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _torch_header(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict]:
    return {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in _torch_state_dict(path).items()}, {}


def _torch_fetch(path: Path, names: list[str], spans: dict) -> dict[str, np.ndarray]:
    state = _torch_state_dict(path)
    return {name: _float64(state[name]) for name in names}


# (single file, shard index, header reader, tensor reader) per format, in order of preference.
_WEIGHT_FORMATS = (("model.safetensors", "model.safetensors.index.json", _safetensors_header, _safetensors_fetch),
                   ("pytorch_model.bin", "pytorch_model.bin.index.json", _torch_header, _torch_fetch))


@dataclass
class _Weights:
    """The weight files of a folder: which file holds each tensor, its header shape/dtype, and a reader."""

    files: list[Path]
    where: dict[str, Path]
    meta: dict[str, tuple[tuple[int, ...], str]]
    fetch: Callable[[Path, list[str], dict], dict[str, np.ndarray]]
    spans: dict = field(default_factory=dict)  # safetensors: name -> (dtype, shape, start, end)

    def read(self, names: list[str]) -> dict[str, np.ndarray]:
        """Named tensors as float64 arrays, opening each file that holds some of them once."""
        out = {}
        for path in dict.fromkeys(self.where[n] for n in names):
            out |= self.fetch(path, [n for n in names if self.where[n] == path], self.spans)
        return out


def _shard_files(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except Exception as e:
        raise ExtractError(f"cannot read shard index {index}: {_one_line(e)}") from None
    for shard in shards:
        if Path(shard).name != shard or not (index.parent / shard).is_file():
            raise ExtractError(f"{index} lists shard '{shard}', which is not a file in {index.parent}")
    return [index.parent / shard for shard in shards]


def _find_weights(folder: Path) -> _Weights:
    """Locate the weight files (safetensors preferred over .bin) and read their headers."""
    for single, index, header, fetch in _WEIGHT_FORMATS:
        if (folder / single).is_file():
            files = [folder / single]
        elif (folder / index).is_file():
            files = _shard_files(folder / index)
        else:
            continue
        where, meta, spans = {}, {}, {}
        for path in files:
            header_of_file, spans_of_file = header(path)
            meta |= header_of_file
            spans |= spans_of_file
            where |= dict.fromkeys(header_of_file, path)
        return _Weights(files=files, where=where, meta=meta, fetch=fetch, spans=spans)
    names = ", ".join(name for fmt in _WEIGHT_FORMATS for name in fmt[:2])
    raise ExtractError(f"no weights in {folder}: expected one of {names}")


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise ExtractError(f"no config.json in {folder}")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExtractError(f"cannot parse {path}: {_one_line(e)}") from None
    if not isinstance(config, dict):
        raise ExtractError(f"{path} is not a JSON object")
    return config


def _check_tensors(layout: Layout, spec: ModelSpec, weights: _Weights, prefix: str) -> None:
    """Every layer's Q/K (and gain) tensors exist with the shape the config implies and a float dtype."""
    for layer in range(spec.n_layers):
        for name, shape in layout.tensors_for(spec, prefix, layer).values():
            if name not in weights.meta:
                raise ExtractError(f"missing tensor '{name}' (layer {layer}) in {weights.files[0].parent}")
            actual, dtype = weights.meta[name]
            if actual != shape:
                raise ExtractError(f"tensor '{name}' has shape {actual}, expected {shape} from config.json")
            if dtype not in _FLOAT_DTYPES:
                raise ExtractError(f"tensor '{name}' has dtype {dtype}; supported: {', '.join(sorted(_FLOAT_DTYPES))}")


def open_hf_folder(folder: Path, *, name: str, source: str, revision: str | None,
                   qk_norm: str = "refuse") -> Checkpoint:
    """A Checkpoint over a local Hugging Face folder; validates config and every layer's Q/K tensors up front.

    revision=None records "sha256:<hex>" of the weight files. qk_norm: "refuse" or "fold" (see model_spec).
    """
    folder = Path(folder)
    layout, spec = model_spec(_read_config(folder), qk_norm=qk_norm)
    weights = _find_weights(folder)
    first = next(iter(layout.tensors.values())).format(i=0)  # layer 0's Q (or fused QKV) locates the prefix
    prefix = next((p for p in layout.prefixes if p + first in weights.meta), layout.prefixes[0])
    _check_tensors(layout, spec, weights, prefix)

    def reader(layer: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= layer < spec.n_layers:
            raise ExtractError(f"layer {layer} out of range: {name} has {spec.n_layers} layers")
        roles = {role: tensor for role, (tensor, _) in layout.tensors_for(spec, prefix, layer).items()}
        arrays = weights.read(list(roles.values()))
        for tensor, array in arrays.items():
            # a finite sum means every value is finite; only an overflowing sum needs the elementwise check
            if not np.isfinite(array.sum()) and not np.isfinite(array).all():
                raise ExtractError(f"layer {layer}: tensor '{tensor}' has non-finite values")
        return layout.qk_maps({role: arrays[tensor] for role, tensor in roles.items()}, spec)

    return Checkpoint(name=name, source=source, revision=revision or sha256_files(weights.files),
                      spec=spec, reader=reader)
