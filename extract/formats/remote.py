"""Hub checkpoints opened by range: safetensors, torch zip `.bin` and GGUF, parsed by the local readers.

Only headers and the Q/K tensors (with QK-norm gains when folding) are fetched. A `.bin` torch zip
is located through its zip directory and `data.pkl`, unpickled by a recording unpickler that
resolves a handful of names to functions here (nothing in the file executes); a legacy non-zip
pickle is downloaded whole and read by torch's weights-only loader.
"""
from __future__ import annotations

import json
import pickle
import struct
import sys
import zipfile
from functools import partial

import numpy as np

from headforms.extract.checkpoint import Checkpoint, ExtractError, ReadOptions, first_line
from headforms.extract.formats.gguf_file import _Cut, _HeaderReader, gguf_checkpoint
from headforms.extract.formats.hf import (Weights, float64_array, hf_checkpoint, parse_config, read_header,
                                          safetensors_spans, span_array, span_rows, spans_meta, torch_state_dict,
                                          torch_zip_extent)
from headforms.extract.formats.provenance import hub_provenance
from headforms.extract.formats.torch_pickle import RecordingUnpickler, TensorRef
from headforms.extract.formats.unreadable import header_cut
from headforms.extract.layouts.spec import model_spec
from headforms.extract.transport.hub import HubRepo, RangeReader, RemoteFile

# Layers fetched in the background while one is analysed: AHEAD, fewer where their bytes (held in memory until
# read) would pass AHEAD_BYTES, at least one (a 24B model's 52 MB layer alone).
AHEAD, AHEAD_BYTES = 2, 64 << 20
# Hub weight layouts in order of preference: (single file, shard index); safetensors before .bin.
HUB_LAYOUTS = (("model.safetensors", "model.safetensors.index.json"),
               ("pytorch_model.bin", "pytorch_model.bin.index.json"))


def open_hub(repo_id: str, *, name: str, options: ReadOptions = ReadOptions()) -> Checkpoint:
    """A hub model (config.json + safetensors or .bin weights) read by range at its resolved commit."""
    repo = HubRepo.resolve(repo_id, options.revision)
    if "config.json" not in repo.files:
        raise ExtractError(f"'{repo_id}' on the Hugging Face hub has no config.json")
    config_file = repo.file("config.json")
    config = parse_config(config_file.read_at(0, config_file.size), str(config_file))
    model_spec(config, options)  # an unsupported config is refused before any header is fetched
    weights = _hub_weights(repo)
    provenance = hub_provenance(repo, name=name, source=repo_id,
                                checkpoint_bytes=repo.checkpoint_bytes(f.path for f in weights.files))
    return hf_checkpoint(config, weights, provenance, options)


def open_hub_gguf(repo_id: str, filename: str, *, name: str, source: str,
                  options: ReadOptions = ReadOptions()) -> Checkpoint:
    """A .gguf file of a hub repo: header, metadata and the Q/K tensors read by range."""
    repo = HubRepo.resolve(repo_id, options.revision)
    remote = repo.file(filename)
    return gguf_checkpoint(_remote_gguf_reader(remote), partial(_gguf_data, remote), remote,
                           hub_provenance(repo, name=name, source=source, checkpoint_bytes=remote.size), options)


def _hub_weights(repo: HubRepo) -> Weights:
    """The preferred weight layout of a repo; shard headers are read only for shards holding needed tensors."""
    for single, index in HUB_LAYOUTS:
        header, fetch = (_safetensors_header, _safetensors_fetch) if single.endswith(".safetensors") \
            else (_zip_header, _zip_fetch)
        if single in repo.files:
            remote = repo.file(single)
            incomplete = []
            meta, spans = read_header(header, remote, incomplete)
            return Weights(files=[remote], where=dict.fromkeys(meta, remote), meta=meta, fetch=fetch, spans=spans,
                           origin=repo.repo_id, ahead=AHEAD, ahead_bytes=AHEAD_BYTES, buffers=repo.buffers,
                           incomplete=incomplete)
        if index in repo.files:
            index_file = repo.file(index)
            try:
                weight_map = json.loads(index_file.read_at(0, index_file.size))["weight_map"]
                shards = {shard: repo.file(shard) for shard in sorted(set(weight_map.values()))}
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise ExtractError(f"unreadable {index} of '{repo.repo_id}': {type(e).__name__}: {e}") from None
            return Weights(files=list(shards.values()), where={n: shards[s] for n, s in weight_map.items()},
                           meta={}, fetch=fetch, origin=repo.repo_id, header=header, unread=set(shards.values()),
                           ahead=AHEAD, ahead_bytes=AHEAD_BYTES, buffers=repo.buffers)
    raise ExtractError(f"'{repo.repo_id}' on the Hugging Face hub has no model.safetensors or "
                       "pytorch_model.bin weights (sharded or not)")


# safetensors ---------------------------------------------------------------------------------

def _safetensors_header(remote: RemoteFile):
    spans = safetensors_spans(remote.read_at, remote.size, str(remote))
    return spans_meta(spans), {name: (remote, span) for name, span in spans.items()}


def _safetensors_fetch(remote: RemoteFile, names: list[str], spans: dict, decode: bool = True,
                       empty=np.empty, rows: slice | None = None) -> dict[str, np.ndarray]:
    """Named tensors (`rows` of each: None, all; one range) as float64, in buffers from `empty` (decode=False: only
    fetched into the range cache, for a layer read ahead)."""
    if sys.byteorder != "little":
        raise ExtractError("reading safetensors from the hub needs a little-endian machine")
    wanted = {name: span_rows(spans[name][1], rows) for name in names}
    data = remote.read_many([(start, end) for _, _, start, end in wanted.values()], hold=not decode)
    if not decode:
        return {}
    return {name: span_array(data[(start, end)], dtype, shape, empty)
            for name, (dtype, shape, start, end) in wanted.items()}


# torch zip checkpoints -----------------------------------------------------------------------

def _zip_header(remote: RemoteFile):
    """Tensor shapes/dtypes of a torch checkpoint from its zip directory and data.pkl alone; a legacy
    (non-zip) pickle is downloaded whole (said in one line) and read by torch's weights-only loader."""
    reader = RangeReader(remote)
    if remote.read_at(0, 4) != b"PK\x03\x04":  # a zip starts with a local header; a legacy pickle does not
        print(f"{remote}: a legacy (non-zip) torch pickle cannot be read by range; downloading the whole "
              f"file ({remote.size / 1e6:.1f} MB)", file=sys.stderr)
        state = torch_state_dict(remote.prefix_path(remote.size))
        return ({n: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in state.items()},
                {n: (remote, ("tensor", t)) for n, t in state.items()})
    try:
        archive = zipfile.ZipFile(reader)
        pickles = [i for i in archive.infolist() if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
        if len(pickles) != 1:
            raise ExtractError(f"cannot read {remote}: not a torch checkpoint (no single <name>/data.pkl)")
        root = pickles[0].filename.removesuffix("data.pkl")
        state = RecordingUnpickler(archive.open(pickles[0])).load()
        records = {i.filename: i for i in archive.infolist()}
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        problem = torch_zip_extent(remote.read_at, remote.size, remote) if isinstance(e, zipfile.BadZipFile) else None
        if problem is not None:  # cut short: its end records are missing
            raise problem from None
        raise ExtractError(f"cannot read {remote} (refused or corrupt torch checkpoint): "
                           f"{type(e).__name__}: {e}") from None
    if not isinstance(state, dict):
        raise ExtractError(f"{remote} does not hold a state dict")
    meta, spans = {}, {}
    for name, ref in state.items():
        if not isinstance(ref, TensorRef):
            continue
        record = records.get(f"{root}data/{ref.storage.key}")
        if record is None or record.compress_type != zipfile.ZIP_STORED:
            raise ExtractError(f"cannot read {remote}: tensor '{name}' has no stored record for its storage")
        meta[name] = (ref.shape, str(ref.storage.dtype))
        spans[name] = (remote, ("zip", ref, record))
    return meta, spans


def _zip_fetch(remote: RemoteFile, names: list[str], spans: dict, decode: bool = True,
               empty=np.empty, rows: slice | None = None) -> dict[str, np.ndarray]:
    """Named tensors (`rows` of each: None, all) of a torch checkpoint as float64 in buffers from `empty`: the records'
    local headers, then only the bytes each tensor spans (decode=False: only fetched into the range cache, for a
    layer read ahead)."""
    import torch

    kinds = {name: spans[name][1] for name in names}
    whole = {name: kind[1][rows or slice(None)] for name, kind in kinds.items() if kind[0] == "tensor"}
    zipped = {name: (_ref_rows(kind[1], rows), kind[2]) for name, kind in kinds.items() if kind[0] == "zip"}
    headers = remote.read_many([(r.header_offset, r.header_offset + 30) for _, r in zipped.values()], hold=not decode)
    wanted = {}
    for name, (ref, record) in zipped.items():
        local = headers[(record.header_offset, record.header_offset + 30)]
        if local[:4] != b"PK\x03\x04":
            raise ExtractError(f"cannot read {remote}: bad local header of record {record.filename}")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        data = record.header_offset + 30 + name_len + extra_len
        itemsize = getattr(torch, ref.storage.dtype).itemsize
        first, last = ref.extent()
        if last * itemsize > record.file_size:
            raise ExtractError(f"cannot read {remote}: tensor '{name}' runs past its storage record")
        wanted[name] = (data + first * itemsize, data + last * itemsize)
    got = remote.read_many(list(wanted.values()), hold=not decode)
    if not decode:
        return {}
    out = dict(whole)
    for name, (ref, _) in zipped.items():
        raw = got[wanted[name]]
        dtype = getattr(torch, ref.storage.dtype)
        out[name] = (torch.as_strided(torch.frombuffer(bytearray(raw), dtype=dtype), ref.shape, ref.stride)
                     if raw else torch.empty(ref.shape, dtype=dtype))
    return {name: float64_array(tensor, empty) for name, tensor in out.items()}


def _ref_rows(ref: TensorRef, rows: slice | None) -> TensorRef:
    """A pickled tensor's reference cut to `rows` of its first axis (None: all)."""
    if rows is None:
        return ref
    first, stop, _ = rows.indices(ref.shape[0])
    return ref._replace(offset=ref.offset + first * ref.stride[0], shape=(stop - first, *ref.shape[1:]))


# GGUF ----------------------------------------------------------------------------------------

_GGUF_PREFIX = 1 << 16  # first read of a hub GGUF file; grown until the header and tensor table parse,
_GGUF_STEP = 1 << 20    # doubling up to this step, then by it: at most 1 MB is fetched past the header


def _remote_gguf_reader(remote: RemoteFile) -> _HeaderReader:
    """Parse the header and tensor table from a prefix of the file, doubling it until it is enough; tensor
    data beyond the prefix gets placeholders, replaced by ranged reads when a layer is read."""
    prefix = min(_GGUF_PREFIX, remote.size)
    while True:
        try:
            return _HeaderReader(remote.prefix_path(prefix))
        except (ValueError, IndexError, KeyError, TypeError, OverflowError) as e:
            if prefix == remote.size:
                if isinstance(e, _Cut) or remote.size == 0:
                    raise header_cut(remote, remote.size, "GGUF header (metadata and tensor table)") from None
                raise ExtractError(f"corrupt or truncated GGUF file {remote}: {first_line(e)}") from None
            prefix = min(prefix + min(prefix, _GGUF_STEP), remote.size)


def _gguf_data(remote: RemoteFile, tensors, rows: slice | None = None) -> list[np.ndarray]:
    """The raw data arrays of GGUF tensors (`rows` of each: None, all; whole rows are whole GGML blocks), fetched by
    range in one batch."""
    shapes, spans = [], []
    for t in tensors:
        count = t.data.shape[0]
        first, stop, _ = (rows or slice(None)).indices(count)
        row = int(t.n_bytes) // count if count else 0
        shapes.append((stop - first, *t.data.shape[1:]))
        spans.append((int(t.data_offset) + first * row, int(t.data_offset) + stop * row))
    got = remote.read_many(spans)
    return [np.frombuffer(got[span], dtype=t.data.dtype).reshape(shape)
            for span, shape, t in zip(spans, shapes, tensors)]
