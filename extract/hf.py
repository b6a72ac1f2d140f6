"""Open a Hugging Face checkpoint folder (config.json + safetensors or .bin weights) without transformers.

Only a layer's query/key tensors (and QK-norm gains when folding) are ever read. `.bin` files go
through torch's weights-only unpickler over mmap, so a pickle that would run code is refused, not run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors import safe_open

from extract.checkpoint import Checkpoint, ExtractError, ModelSpec, sha256_files
from extract.layouts import Layout, model_spec

_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}  # safetensors -> torch names
_FLOAT_DTYPES = frozenset(_DTYPES.values())


def _one_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _safetensors_open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # SafetensorError, OSError: a truncated or foreign file
        raise ExtractError(f"cannot read {path}: {_one_line(e)}") from None


def _safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    with _safetensors_open(path) as f:
        slices = {name: f.get_slice(name) for name in f.keys()}
        return {name: (tuple(s.get_shape()), _DTYPES.get(s.get_dtype(), s.get_dtype())) for name, s in slices.items()}


def _safetensors_fetch(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    with _safetensors_open(path) as f:
        try:
            return {name: f.get_tensor(name) for name in names}
        except Exception as e:
            raise ExtractError(f"cannot read {path}: {_one_line(e)}") from None


def _torch_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A .bin state dict, mmapped (tensor data is paged in only when touched), never running pickled code."""
    try:
        state = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as e:
        raise ExtractError(f"cannot read {path} (weights-only load refused or failed): {_one_line(e)}") from None
    if not isinstance(state, dict):
        raise ExtractError(f"{path} does not hold a state dict")
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _torch_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in _torch_state_dict(path).items()}


def _torch_fetch(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    state = _torch_state_dict(path)
    return {name: state[name] for name in names}


# (single file, shard index, header reader, tensor reader) per format, in order of preference.
_WEIGHT_FORMATS = (("model.safetensors", "model.safetensors.index.json", _safetensors_header, _safetensors_fetch),
                   ("pytorch_model.bin", "pytorch_model.bin.index.json", _torch_header, _torch_fetch))


@dataclass
class _Weights:
    """The weight files of a folder: which file holds each tensor, its header shape/dtype, and a reader."""

    files: list[Path]
    where: dict[str, Path]
    meta: dict[str, tuple[tuple[int, ...], str]]
    fetch: Callable[[Path, list[str]], dict[str, torch.Tensor]]

    def read(self, names: list[str]) -> dict[str, np.ndarray]:
        """Named tensors as float64 arrays, opening each file that holds some of them once."""
        out = {}
        for path in dict.fromkeys(self.where[n] for n in names):
            tensors = self.fetch(path, [n for n in names if self.where[n] == path])
            out |= {n: t.to(torch.float64, copy=True).numpy() for n, t in tensors.items()}
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
        where, meta = {}, {}
        for path in files:
            header_of_file = header(path)
            meta |= header_of_file
            where |= dict.fromkeys(header_of_file, path)
        return _Weights(files=files, where=where, meta=meta, fetch=fetch)
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
            if not np.isfinite(array).all():
                raise ExtractError(f"layer {layer}: tensor '{tensor}' has non-finite values")
        return layout.qk_maps({role: arrays[tensor] for role, tensor in roles.items()}, spec)

    return Checkpoint(name=name, source=source, revision=revision or sha256_files(weights.files),
                      spec=spec, reader=reader)
