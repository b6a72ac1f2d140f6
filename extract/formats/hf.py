"""Open a Hugging Face checkpoint folder (config.json + safetensors or .bin weights) without transformers.

Only a layer's query/key tensors (and QK-norm gains when folding) are ever read, and with the ov circuit its
value/output tensors and the model's embeddings. Safetensors headers
are validated by the safetensors library; tensor bytes are then read with positioned reads at the
header's offsets, readahead off, so exactly those bytes come off the disk (a mapping's page faults
would read the device's readahead window around each page: 977 MB for 419 MB of Q/K measured with
an 8 MB window), and decoded with numpy (torch is not imported). `.bin` files go through torch's
weights-only unpickler over mmap, so a pickle that would run code is refused, not run.
"""
from __future__ import annotations

import io
import json
import math
import os
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import ml_dtypes
import numpy as np
from safetensors import safe_open

from headforms.extract.checkpoint import Checkpoint, ExtractError, Provenance, ReadOptions, first_line, row_blocks
from headforms.extract.formats.provenance import Digest, local_provenance
from headforms.extract.formats.torch_pickle import RecordingUnpickler, TensorRef
from headforms.extract.formats.unreadable import (IncompleteFile, extent_problem, header_cut, refuse_foreign,
                                                  size_mismatch)
from headforms.extract.layouts import quantized
from headforms.extract.layouts.norms import HF_NORMS, norm_for
from headforms.extract.layouts.spec import model_spec
from headforms.extract.transport import pages
from headforms.extract.transport.buffers import BufferPool

BF16_BLOCK = 1 << 17  # bfloat16 values decoded at a time (a 512 kB float32 block)
_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",  # safetensors -> torch names
           "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I32": "int32", "I8": "int8", "U8": "uint8"}
_FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})  # dense weights'; quantized: layouts.quantized
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,  # bytes per value of each torch dtype name
             "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
             "float8_e4m3fn": 1, "float8_e5m2": 1}
_NUMPY_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8",  # BF16: see span_array; quantized values and scales:
                 "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "I32": "<i4", "I8": "i1", "U8": "u1"}


def _safetensors_open(path: Path, framework: str = "numpy"):
    try:
        return safe_open(str(path), framework=framework)
    except Exception as e:  # SafetensorError, OSError: a truncated or foreign file
        raise ExtractError(f"cannot read {path}: {first_line(e)}") from None


_HEADER_LIMIT = 100_000_000  # safetensors' own cap on the JSON header


def _read_at(f, offset: int, size: int, path: Path, empty=np.empty) -> np.ndarray:
    """Exactly `size` bytes (uint8) of a raw file from `offset` (positioned reads, no extra copy) into a buffer from
    `empty` (np.empty, or a BufferPool's)."""
    buf = empty(size, np.uint8)
    done = pages.read_into(f.fileno(), memoryview(buf), offset)
    if done < size:
        raise ExtractError(f"cannot read {path}: the file ends at byte {offset + done}, before byte {offset + size}")
    return buf


def _safetensors_spans(path: Path) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """name -> (dtype, shape, start, end) of a local safetensors file (see safetensors_spans)."""
    with pages.open_unbuffered(path) as f:
        return safetensors_spans(lambda offset, size: _read_at(f, offset, size, path),
                                 os.fstat(f.fileno()).st_size, str(path))


def safetensors_spans(read_at: Callable[[int, int], bytes], size: int,
                      label: str) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """name -> (dtype, shape, start, end) with absolute byte offsets, from a safetensors header (an
    8-byte little-endian length, then JSON) read through `read_at(offset, size)`, each span checked
    against its shape; `label` names the file in errors. A file cut short, or longer than its last tensor,
    raises IncompleteFile carrying the header's (meta, spans)."""
    length = int.from_bytes(read_at(0, 8), "little") if size >= 8 else -1
    if size - 8 < length <= _HEADER_LIMIT:
        raise header_cut(label, size, "safetensors header")
    if not 0 < length <= min(size - 8, _HEADER_LIMIT):
        raise ExtractError(f"cannot read {label}: not a safetensors file (header length {length}, file size {size})")
    try:
        header = json.loads(bytes(read_at(8, length)))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExtractError(f"cannot read {label}: bad safetensors header: {first_line(e)}") from None
    if not isinstance(header, dict):
        raise ExtractError(f"cannot read {label}: bad safetensors header")
    base, spans = 8 + length, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
            ok = isinstance(start, int) and isinstance(end, int) and 0 <= start <= end
        except (TypeError, KeyError, ValueError):
            ok = False
        itemsize = _ITEMSIZE.get(_DTYPES.get(dtype)) if ok else None
        if not ok or (itemsize is not None and end - start != math.prod(shape) * itemsize):
            raise ExtractError(f"cannot read {label}: tensor '{name}' has a bad extent in the safetensors header")
        spans[name] = (dtype, shape, base + start, base + end)
    problem = extent_problem(label, size, [(name, start, end) for name, (_, _, start, end) in spans.items()], end=base)
    if problem is not None:
        problem.header = (spans_meta(spans), spans)
        raise problem
    return spans


def spans_meta(spans: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, torch dtype name) of safetensors spans."""
    return {name: (shape, _DTYPES.get(dtype, dtype)) for name, (dtype, shape, _, _) in spans.items()}


def _safetensors_header(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict]:
    """Header shapes/dtypes (through safetensors' own reader, which validates the file) and byte spans.

    The spans are read first with plain reads: safetensors maps the file, and its first page
    fault would read a whole readahead window around the header; after our read those pages
    are cached and the mapping faults on them without I/O."""
    spans = _safetensors_spans(path)
    with _safetensors_open(path) as f:
        slices = {name: f.get_slice(name) for name in f.keys()}
        meta = {name: (tuple(s.get_shape()), _DTYPES.get(s.get_dtype(), s.get_dtype())) for name, s in slices.items()}
    if spans_meta(spans) != meta:
        raise ExtractError(f"cannot read {path}: its safetensors header disagrees with itself")
    return meta, spans


def span_array(raw, dtype: str, shape: tuple[int, ...], empty=np.empty) -> np.ndarray:
    """Little-endian safetensors bytes as a float64 array, in a buffer from `empty` (np.empty, or a BufferPool's)."""
    with np.errstate(invalid="ignore"):  # a signalling NaN stays NaN (and is refused later, as non-finite)
        if dtype == "BF16":
            return _bfloat16(np.frombuffer(raw, dtype="<u2"), empty(shape))
        out = empty(shape)
        np.copyto(out, np.frombuffer(raw, dtype=_NUMPY_DTYPES[dtype]).reshape(shape))
        return out


def _bfloat16(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns into float64 `out`: each is float32's upper half, shifted into place BF16_BLOCK values
    at a time, so the float32 copy stays in cache and `out` is written in one pass (twice as fast at 24B shapes)."""
    flat = out.reshape(-1)
    wide = np.empty(min(BF16_BLOCK, bits.size), np.uint32)
    for start in range(0, bits.size, BF16_BLOCK):
        block = bits[start:start + BF16_BLOCK]
        np.left_shift(block, 16, out=wide[:len(block)], dtype=np.uint32)
        flat[start:start + len(block)] = wide[:len(block)].view(np.float32)
    return out


def span_rows(span: tuple, rows: slice | None) -> tuple[str, tuple[int, ...], int, int]:
    """A safetensors span (dtype, shape, start, end) cut to `rows` of its first axis (None: all): the rows of a
    row-major tensor are one byte range."""
    if rows is None:
        return span
    dtype, shape, start, end = span
    first, stop, _ = rows.indices(shape[0])
    row = (end - start) // shape[0] if shape[0] else 0
    return dtype, (stop - first, *shape[1:]), start + first * row, start + stop * row


def _safetensors_fetch(path: Path, names: list[str], spans: dict, digest: Digest | None = None,
                       empty=np.empty, rows: slice | None = None) -> dict[str, np.ndarray]:
    """Named tensors (`rows` of each: None, all) as float64, read with positioned reads of exactly their bytes (no
    mapping, no readahead); a digest hashes whole tensors' bytes as read; `empty` gives the arrays' buffers
    (np.empty, or a BufferPool's)."""
    if sys.byteorder != "little":  # safetensors is little-endian: let the library convert
        with _safetensors_open(path, framework="pt") as f:
            try:
                return {name: float64_array(f.get_slice(name)[rows or slice(None)], empty) for name in names}
            except Exception as e:
                raise ExtractError(f"cannot read {path}: {first_line(e)}") from None
    out = {}
    with pages.open_unbuffered(path) as f:
        for name in sorted(names, key=lambda n: spans[n][2]):  # in file order
            dtype, shape, start, end = span_rows(spans[name], rows)
            raw = _read_at(f, start, end - start, path, empty) if end > start else bytearray()
            if digest is not None and rows is None:
                digest.update(path, name, raw)
            out[name] = span_array(raw, dtype, shape, empty)
            del raw  # its buffer is idle again for the next tensor
    return out


def float64_array(tensor, empty=np.empty) -> np.ndarray:
    """A torch tensor as a float64 numpy array (a copy, into a buffer from `empty`)."""
    import torch

    out = empty(tuple(tensor.shape))
    torch.from_numpy(out).copy_(tensor)
    return out


def torch_state_dict(path: Path) -> dict:
    """A .bin state dict, mmapped (tensor data is paged in only when touched), never running pickled code."""
    import torch  # only .bin checkpoints need torch

    zipped = zipfile.is_zipfile(path)
    with open(path, "rb") as f:
        if not zipped and f.read(1) != b"\x80":  # torch.save writes a zip, or (before torch 1.6) a protocol 2+ pickle
            raise ExtractError(f"cannot read {path}: it is neither a zip archive nor a pickle, so not a PyTorch "
                               "checkpoint (the file is damaged or in another format)")
    try:
        state = torch.load(path, weights_only=True, mmap=zipped, map_location="cpu")
    except Exception as e:
        raise ExtractError(f"cannot read {path} (weights-only load refused or failed): {first_line(e)}") from None
    if not isinstance(state, dict):
        raise ExtractError(f"{path} does not hold a state dict")
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _torch_header(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict]:
    """Shapes and dtypes of a .bin state dict; a torch zip whose size is not what its records need is refused first."""
    with pages.open_unbuffered(path) as f:
        problem = torch_zip_extent(lambda offset, size: _read_at(f, offset, size, path), os.fstat(f.fileno()).st_size,
                                   path)
    if problem is not None:
        raise problem
    return {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in torch_state_dict(path).items()}, {}


_ZIP_LOCAL, _ZIP_CENTRAL, _ZIP_DESCRIPTOR = b"PK\x03\x04", b"PK\x01\x02", b"PK\x07\x08"
_ZIP_TAIL = {b"PK\x06\x06": 12, b"PK\x06\x07": 20, b"PK\x05\x06": 22}  # zip64 end record (+ its size), locator, end


def torch_zip_extent(read_at: Callable[[int, int], bytes], size: int, label) -> IncompleteFile | None:
    """A torch zip checkpoint walked from its front (None if it is no torch zip, or as long as it should be): each
    record's local header and bytes (data.pkl by unpickling it, a storage by its element count, any other by its
    data descriptor), then the central directory and end records. A file cut short names the first tensor whose
    storage is missing and the bytes its records need at least (with the header data.pkl gives, for --plan);
    one that runs on past its end record, the bytes after it."""
    def read(offset: int, n: int) -> bytes:
        return bytes(read_at(offset, min(n, size - offset))) if offset < size else b""

    if read(0, 4) != _ZIP_LOCAL:
        return None
    state, storages, pos, seen, root = None, {}, 0, [], "archive"  # storages: key -> bytes; seen: keys in file order

    def cut(end: int, key: str | None = None, rest: int = 22) -> IncompleteFile:
        """The refusal of a file that ends before `end`, in the record of storage `key` (else before the next), with
        at least `rest` bytes of end records after the storages not seen."""
        if state is None:
            return header_cut(label, size, "torch header (data.pkl)")
        unseen = [k for k in storages if k not in seen and k != key]
        need = end + sum(30 + len(f"{root}/data/{k}") + storages[k] for k in unseen) + rest
        key = key if key is not None else (unseen[0] if unseen else None)
        tensor = next((n for n, ref in state.items() if ref.storage.key == key), None)
        problem = size_mismatch(label, size, need, tensor, at_least=True)
        problem.header = ({n: (ref.shape, str(ref.storage.dtype).removeprefix("torch.")) for n, ref in state.items()},
                          {})
        return problem

    while (head := read(pos, 30))[:4] == _ZIP_LOCAL:
        if len(head) < 30:
            return cut(pos + 30)
        flags, csize, name_len, extra_len = (int.from_bytes(head[i:j], "little")
                                             for i, j in ((6, 8), (18, 22), (26, 28), (28, 30)))
        name = read(pos + 30, name_len).decode("utf-8", "replace")
        start = pos + 30 + name_len + extra_len
        parts = name.split("/")
        key = parts[2] if len(parts) == 3 and parts[1] == "data" else None
        if start > size:
            return cut(start, key)
        if parts[-1] == "data.pkl" and len(parts) == 2:
            root, (state, storages, length) = parts[0], _unpickle_prefix(read, start, size)
            if state is None:  # cut inside data.pkl (length 1), or no state dict the walk can follow (0)
                return cut(size + 1) if length else None
        elif key is not None and key in storages:
            length = storages[key]
            seen.append(key)
        elif not flags & 8:
            length = csize
        else:  # a small record (version, byteorder ...): its data descriptor holds its size
            blob = read(start, 4096)
            length = next((i for i in range(len(blob) - 11) if blob[i:i + 4] == _ZIP_DESCRIPTOR
                           and int.from_bytes(blob[i + 8:i + 12], "little") == i), None)
            if length is None:
                return cut(start + len(blob) + 1) if start + len(blob) >= size else None
        pos = start + length
        if pos > size:
            return cut(pos, key)
        if flags & 8:  # the data descriptor: 16 bytes (24 with zip64 sizes), then the next record
            pos += 16 if read(pos + 16, 2) == b"PK" else 24
    while (head := read(pos, 46))[:4] == _ZIP_CENTRAL:
        if len(head) < 46:
            return cut(pos + 46)
        pos += 46 + sum(int.from_bytes(head[i:i + 2], "little") for i in (28, 30, 32))
    while (sig := read(pos, 4)) in _ZIP_TAIL:
        head = read(pos, 22)
        length = _ZIP_TAIL[sig] + (int.from_bytes(head[4:12], "little") if sig == b"PK\x06\x06"
                                   else int.from_bytes(head[20:22], "little") if sig == b"PK\x05\x06" else 0)
        pos += length
        if pos > size:
            return cut(pos, rest=0)
        if sig == b"PK\x05\x06":
            return size_mismatch(label, size, pos) if size > pos else None
    return cut(pos + 22) if pos >= size else None


def _unpickle_prefix(read: Callable[[int, int], bytes], start: int, size: int) -> tuple[dict | None, dict, int]:
    """data.pkl read from `start` (a prefix doubled until it unpickles): its state dict of tensor references, each
    storage's bytes, and the pickle's length; (None, {}, 1) if the file ends inside it, (None, {}, 0) if it holds
    anything but a state dict (the loader then says what)."""
    import pickle


    class Sized(RecordingUnpickler):
        """Keeps each storage's size (its element count is the persistent id's last field)."""

        def persistent_load(self, pid):
            storage = super().persistent_load(pid)
            itemsize = _ITEMSIZE.get(str(storage.dtype).removeprefix("torch."))
            if itemsize:  # another dtype: its record is walked by its data descriptor, as far as that goes
                storages[storage.key] = int(pid[4]) * itemsize
            return storage

    n = 1 << 16
    while True:
        storages = {}
        blob = io.BytesIO(read(start, n))
        try:
            state = Sized(blob).load()
        except EOFError:
            if start + n >= size:
                return None, {}, 1
            n *= 2
            continue
        except pickle.UnpicklingError as e:  # the C unpickler says 'pickle data was truncated'
            if "truncated" not in str(e):
                return None, {}, 0
            if start + n >= size:
                return None, {}, 1
            n *= 2
            continue
        except (ValueError, TypeError, IndexError, AttributeError):
            return None, {}, 0
        if not isinstance(state, dict):
            return None, {}, 0
        return {name: ref for name, ref in state.items() if isinstance(ref, TensorRef)}, storages, blob.tell()


def _torch_fetch(path: Path, names: list[str], spans: dict, digest: Digest | None = None,
                 empty=np.empty, rows: slice | None = None) -> dict[str, np.ndarray]:
    """Named tensors of a .bin state dict (`rows` of each: None, all; the mapping pages in only those) as float64."""
    import torch

    state = torch_state_dict(path)
    if digest is not None and rows is None:  # the tensor's elements in order (its storage may hold more than them)
        for name in names:
            digest.update(path, name, state[name].contiguous().view(torch.uint8).numpy())
    return {name: float64_array(state[name][rows or slice(None)], empty) for name in names}


# (single file, shard index, header reader, tensor reader) per format, in order of preference.
_WEIGHT_FORMATS = (("model.safetensors", "model.safetensors.index.json", _safetensors_header, _safetensors_fetch),
                   ("pytorch_model.bin", "pytorch_model.bin.index.json", _torch_header, _torch_fetch))


@dataclass
class Weights:
    """The weight files of a checkpoint: which file holds each tensor, its header shape/dtype, and a reader."""

    files: list                # local Paths, or hub RemoteFiles
    where: dict[str, object]   # tensor name -> its file
    meta: dict[str, tuple[tuple[int, ...], str]]
    fetch: Callable[[object, list[str], dict], dict[str, np.ndarray]]  # float64 arrays
    spans: dict = field(default_factory=dict)  # safetensors: name -> (dtype, shape, start, end)
    origin: str = ""           # the folder or hub repo, for messages
    header: Callable | None = None  # file -> (meta, spans) for files whose header is read only when needed
    unread: set = field(default_factory=set)  # files whose header has not been read yet
    ahead: int = 0             # layers fetched ahead in the background (hub: the network overlaps the compute),
    ahead_bytes: int = 0       # fewer where theirs (held in memory until read) would pass this; at least one
    pending: dict = field(default_factory=dict, repr=False)  # tensor name -> its background fetch
    incomplete: list = field(default_factory=list)  # IncompleteFile of each file whose size its header contradicts
    pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    buffers: BufferPool = field(default_factory=BufferPool, repr=False)  # the decoded arrays' memory, layer to layer

    def prefetch(self, names) -> None:
        """Start fetching tensors in the background into the hub's range cache, decoding nothing (the read
        decodes them: a layer ahead holds no float64 copy); read() waits for them."""
        todo = [n for n in names if n not in self.pending]
        if todo:
            self.pool = self.pool or ThreadPoolExecutor(1, thread_name_prefix="headforms-prefetch")
            self.pending |= dict.fromkeys(todo, self.pool.submit(self._fetch, todo, False))

    def close(self) -> None:
        """Stop fetching ahead."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        self.buffers.clear()

    def describe(self, names) -> None:
        """Read the headers of the files holding `names` (a shard holding none of them is never read)."""
        files = list(dict.fromkeys(self.where[n] for n in names if n in self.where and self.where[n] in self.unread))
        if files:
            with ThreadPoolExecutor(min(8, len(files))) as pool:  # hub: the header requests in flight together
                for file, (meta, spans) in zip(files, pool.map(lambda f: read_header(self.header, f, self.incomplete),
                                                               files)):
                    self.meta |= meta
                    self.spans |= spans
                    self.unread.discard(file)

    def checked(self, checkpoint: Checkpoint) -> Checkpoint:
        """The checkpoint, unless a weight file's size is not what its header describes: then that refusal,
        carrying the checkpoint (for --plan)."""
        if self.incomplete:
            self.incomplete[0].checkpoint = checkpoint
            raise self.incomplete[0]
        return checkpoint

    def read(self, names: list[str], pooled: bool = True, rows: slice | None = None) -> dict[str, np.ndarray]:
        """Named tensors (`rows` of each, their first axis: None, all) as float64 arrays, opening each file that holds
        some of them once; not `pooled`: in memory of their own, and the pool's idle buffers freed after (tensors
        read once, such as the embeddings, whose buffers the pool would otherwise keep for sizes no layer asks for)."""
        for future in {self.pending.pop(n) for n in names if n in self.pending}:
            future.result()  # fetched ahead: now in the cache (or its error raised here)
        out = self._fetch(names, pooled=pooled, rows=rows)
        if not pooled:
            self.buffers.clear()
        return out

    def _fetch(self, names: list[str], decode: bool = True, pooled: bool = True,
               rows: slice | None = None) -> dict[str, np.ndarray]:
        out = {}
        for path in dict.fromkeys(self.where[n] for n in names):
            out |= self.fetch(path, [n for n in names if self.where[n] == path], self.spans,
                              **({"empty": self.buffers.empty} if decode and pooled else {} if decode
                                 else {"decode": False}), rows=rows)
        return out


def _shard_files(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except Exception as e:
        raise ExtractError(f"cannot read shard index {index}: {first_line(e)}") from None
    for shard in shards:
        if Path(shard).name != shard or not (index.parent / shard).is_file():
            raise ExtractError(f"{index} lists shard '{shard}', which is not a file in {index.parent}")
    return [index.parent / shard for shard in shards]


def read_header(header: Callable, file, incomplete: list) -> tuple[dict, dict]:
    """header(file); a file whose size is not the size its header describes is noted in `incomplete` and its
    header kept, so the checkpoint can be built for --plan before the refusal (Weights.checked)."""
    try:
        return header(file)
    except IncompleteFile as e:
        if e.header is None:
            raise
        incomplete.append(e)
        return e.header


def _find_weights(folder: Path) -> Weights:
    """Locate the weight files (safetensors preferred over .bin) and read their headers."""
    for single, index, header, fetch in _WEIGHT_FORMATS:
        if (folder / single).is_file():
            files = [folder / single]
        elif (folder / index).is_file():
            files = _shard_files(folder / index)
        else:
            continue
        where, meta, spans, incomplete = {}, {}, {}, []
        for path in files:
            header_of_file, spans_of_file = read_header(header, path, incomplete)
            meta |= header_of_file
            spans |= spans_of_file
            where |= dict.fromkeys(header_of_file, path)
        return Weights(files=files, where=where, meta=meta, fetch=fetch, spans=spans, origin=str(folder),
                       incomplete=incomplete)
    names = ", ".join(name for fmt in _WEIGHT_FORMATS for name in fmt[:2])
    raise ExtractError(f"no weights in {folder}: expected one of {names}")


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise ExtractError(f"no config.json in {folder}")
    try:
        return parse_config(path.read_bytes(), path)
    except OSError as e:
        raise ExtractError(f"cannot parse {path}: {first_line(e)}") from None


def parse_config(text: bytes, label) -> dict:
    """config.json's JSON object."""
    try:
        config = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExtractError(f"cannot parse {label}: {first_line(e)}") from None
    if not isinstance(config, dict):
        raise ExtractError(f"{label} is not a JSON object")
    return config


def _check_tensors(weights: Weights, wanted: list[tuple[str, tuple[int, ...], int]]) -> None:
    """Every (tensor, shape the config implies, layer) wanted exists with that shape and a float dtype."""
    weights.describe(name for name, _, _ in wanted)
    for name, shape, layer in wanted:
        if name not in weights.meta:
            raise ExtractError(f"missing tensor '{name}' (layer {layer}) in {weights.origin}")
        actual, dtype = weights.meta[name]
        if actual != shape:
            raise ExtractError(f"tensor '{name}' has shape {actual}, expected {shape} from config.json")
        if dtype not in _FLOAT_DTYPES:
            raise ExtractError(f"tensor '{name}' has dtype {dtype}; supported: {', '.join(sorted(_FLOAT_DTYPES))}")


def _check_finite(array: np.ndarray, what: str) -> None:
    """Refuse an array with a NaN or an infinity, naming it (`what`)."""
    # a finite sum means every value is finite; only an overflowing sum needs the elementwise check
    if not np.isfinite(array.sum()) and not np.isfinite(array).all():
        raise ExtractError(f"{what} has non-finite values")


def _embedding_names(layout, config: dict, prefix: str, weights: Weights, spec) -> dict[str, str]:
    """role ('token', 'unembedding', 'final_norm', 'project_in', 'project_out') -> tensor name of the model's
    embeddings (Checkpoint.read_embeddings), checked up front: W_E and W_U (vocab, N), or (vocab, m) with OPT's
    projections P_in (N, m) and P_out (m, N), and the final norm's gain (N,), each of a float dtype. The unembedding
    is the LM head when the file has one and the config does not tie it, else W_E; none where the family has no
    linear unembedding. A final norm or projection the file lacks is none (OPT with do_layer_norm_before=false has
    no final norm; only OPT with word_embed_proj_dim != hidden_size has projections)."""
    found = layout.embeddings
    names = {"token": prefix + found.token} if found.token else {}
    optional = {"final_norm": found.final_norm} if found.unembedding is not None else {}
    optional |= dict(zip(("project_in", "project_out"), found.projections or ()))
    if found.token and found.unembedding is not None:
        head = next((t for t in found.unembedding if t in weights.where), None)
        names["unembedding"] = names["token"] if head is None or config.get("tie_word_embeddings") is True else head
    names |= {role: prefix + t for role, t in optional.items() if t and found.token and prefix + t in weights.where}
    if found.unembedding is None:
        names.pop("project_out", None)
    weights.describe(names.values())
    for tensor in names.values():
        if tensor not in weights.meta:
            raise ExtractError(f"missing tensor '{tensor}' (read for the ov circuit) in {weights.origin}")
    vocab = weights.meta[names["token"]][0][:1] if names else ()
    width = (weights.meta[names["project_in"]][0][1:] if "project_in" in names else ()) or (spec.d_model,)
    expected = {"token": vocab + width, "unembedding": vocab + width, "final_norm": (spec.d_model,),
                "project_in": (spec.d_model,) + width, "project_out": width + (spec.d_model,)}
    for role, tensor in names.items():
        shape, dtype = weights.meta[tensor]
        if shape != expected[role]:
            raise ExtractError(f"tensor '{tensor}' has shape {shape}, expected {expected[role]} from config.json (its "
                               f"{role.replace('_', ' ')}, read for the ov circuit)")
        if dtype not in _FLOAT_DTYPES:
            raise ExtractError(f"tensor '{tensor}' has dtype {dtype} (its {role.replace('_', ' ')}, read for the ov "
                               f"circuit); supported: {', '.join(sorted(_FLOAT_DTYPES))}")
    return names


def open_hf_folder(folder: Path, *, name: str, source: str, options: ReadOptions = ReadOptions()) -> Checkpoint:
    """A Checkpoint over a local Hugging Face folder; validates config and every layer's Q/K tensors up front.

    options.revision None: a folder inside a Hugging Face cache snapshot is its commit; any other folder a Digest
    of config.json, the weight files' headers and the tensors read.
    """
    folder = Path(folder)
    refuse_foreign(folder)  # a CTranslate2, ONNX, GPTQ ... folder is named before its config.json can mislead
    config = _read_config(folder)
    model_spec(config, options)  # an unsupported config is refused before the weights are read
    weights = _find_weights(folder)
    # GPTQ, AWQ, MLX known by their tensors alone (a quantization_config says how to read them: layouts.quantized)
    refuse_foreign(folder, config=config, tensors=() if config.get("quantization_config") else weights.meta)
    provenance = local_provenance(folder, name=name, source=source, revision=options.revision,
                                  checkpoint_bytes=sum(os.path.getsize(f) for f in weights.files),
                                  digest=lambda: Digest({path: _header_bytes(weights, path) for path in weights.files},
                                                        preamble=(folder / "config.json").read_bytes()))
    if provenance.digest is not None:
        weights.fetch = partial(weights.fetch, digest=provenance.digest)
    return hf_checkpoint(config, weights, provenance, options)


def _header_bytes(weights: Weights, path: Path) -> bytes:
    """What a weight file's header says of each tensor in it (dtype, shape, byte span), as bytes to hash."""
    table = sorted([name, *weights.meta[name], *weights.spans.get(name, ())[2:]]
                   for name, where in weights.where.items() if where == path)
    return json.dumps(table).encode()


def hf_checkpoint(config: dict, weights: Weights, provenance: Provenance, options: ReadOptions) -> Checkpoint:
    """A Checkpoint over a config and its weight files (local or on the hub); checks every layer's Q/K up front.

    options.qk_norm, options.tower: see model_spec; options.fold_norm (extract.layouts.norms) folds the pre-norm
    feeding attention in."""
    layout, spec = model_spec(config, options)
    if quantized.refusal(config):  # accepted all the same: its attention is left unquantized (modules_to_not_convert)
        config = {key: value for key, value in config.items() if key != "quantization_config"}
    fold_norm = options.fold_norm
    norm = norm_for(spec, fold_norm, HF_NORMS)
    if norm is not None:
        spec = replace(spec, fold_norm=fold_norm)
    circuits = options.circuits
    if "ov" in circuits and layout.ov_refusal():
        raise ExtractError(f"{spec.architecture}: the ov circuit is refused: {layout.ov_refusal()}")
    first = next(iter(layout.tensors.values())).format(i=0)  # layer 0's Q (or fused QKV) locates the prefix
    prefix = next((p for p in layout.prefixes if any(t in weights.where for t in
                                                      [p + first, *quantized.candidates(config, [p + first])])),
                  layout.prefixes[0])

    def tensors(layer: int, circuits: tuple[str, ...] = circuits) -> dict[str, str]:
        """role -> tensor name of a layer's circuits, the norm gain (role 'gain') included when folding it."""
        roles = {role: tensor for role, (tensor, _) in layout.tensors_for(spec, prefix, layer, circuits).items()}
        return roles | ({"gain": prefix + norm.tensor(layer)} if norm is not None else {})

    wanted = [(name, shape, layer) for layer in spec.layers
              for name, shape in layout.tensors_for(spec, prefix, layer, circuits).values()]
    weights.describe(quantized.candidates(config, [name for name, _, _ in wanted]))
    stored = quantized.stored(config, {name: shape for name, shape, _ in wanted}, weights.meta)  # quantized weights

    def sources(names) -> list[str]:
        """The stored tensors that make `names`: a quantized weight's values, scales ... (extract.layouts.quantized)."""
        return [s for t in names for s in (stored[t].names.values() if t in stored else (t,))]

    _check_tensors(weights, [w for w in wanted if w[0] not in stored]
                   + [(tensors(layer)["gain"], (spec.d_model,), layer) for layer in spec.layers
                      if norm is not None])

    embeddings = _embedding_names(layout, config, prefix, weights, spec) if "ov" in circuits else {}
    read = set(sources(t for layer in spec.layers for t in tensors(layer).values()))
    qk_bytes = sum(math.prod(weights.meta[t][0]) * _ITEMSIZE[weights.meta[t][1]] for t in read)
    ahead = min(weights.ahead, max(1, weights.ahead_bytes * len(spec.layers) // max(qk_bytes, 1))) if weights.ahead else 0
    following = {layer: spec.layers[k + 1:] for k, layer in enumerate(spec.layers)}  # the layers read after each

    def read_circuits(layer: int, circuits: tuple[str, ...] = circuits) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The layer's circuits, all their tensors (a fused QKV once) in one read."""
        if layer not in following:
            raise ExtractError(f"layer {layer} out of range: {provenance.name} has {spec.n_layers} layers"
                               + (f", of which {list(spec.layers)} are attention" if spec.attention_layers else ""))
        roles = tensors(layer, circuits)
        arrays = weights.read(sources(roles.values()))  # before the layers ahead are asked for: a first layer has the link
        weights.prefetch(sources(t for later in following[layer][:ahead]
                                 for t in tensors(later, circuits).values()))
        arrays = {t: stored[t].dequantize(arrays) if t in stored else arrays[t] for t in roles.values()}
        for tensor, array in arrays.items():
            _check_finite(array, f"layer {layer}: tensor '{tensor}'")
        raw = {role: arrays[tensor] for role, tensor in roles.items() if role != "gain"}
        out = {}
        if "qk" in circuits:
            maps = layout.qk_maps(raw, spec)  # (W_Q, W_K), or with spec.parts a mapping part -> (W_Q, W_K)
            out["qk"] = norm.fold(*maps, arrays[roles["gain"]], fold_norm) if norm is not None else maps
        if "sinks" in raw:
            out["sinks"] = raw["sinks"]
        if "ov" in circuits:
            w_v, w_o = layout.ov_maps(raw, spec)
            out["ov"] = (norm.fold_map(w_v, arrays[roles["gain"]], fold_norm) if norm is not None else w_v, w_o)
        return out

    per_token = list(dict.fromkeys(embeddings[role] for role in ("token", "unembedding") if role in embeddings))

    def read_embeddings(rows: int | None) -> Iterator[tuple[np.ndarray | None, np.ndarray | None]]:
        """W_E and W_U diag(offset + g) by blocks of `rows` vocabulary rows (Checkpoint.embeddings): the final norm
        and projections read once, each block's W_E and W_U (a tied one once) in one read."""
        whole = weights.read([tensor for tensor in embeddings.values() if tensor not in per_token], pooled=False)
        for tensor, array in whole.items():
            _check_finite(array, f"tensor '{tensor}'")
        if not per_token:
            yield None, None
            return
        for block in row_blocks(weights.meta[embeddings["token"]][0][0], rows):
            yield embedding_rows(whole | weights.read(per_token, pooled=False, rows=block))

    def embedding_rows(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
        """A block's W_E and W_U diag(offset + g) from its rows of the token embedding and the LM head (refused if
        not finite), which are freed with it."""
        for tensor in per_token:
            _check_finite(arrays[tensor], f"tensor '{tensor}'")
        w_e = arrays[embeddings["token"]]
        if "project_in" in embeddings:  # the residual stream starts at P_in e_t
            w_e = w_e @ arrays[embeddings["project_in"]].T
        if "unembedding" not in embeddings:
            return w_e, None
        w_u = arrays[embeddings["unembedding"]]
        if "project_out" in embeddings:  # the logits read P_out of the final norm's output
            w_u = w_u @ arrays[embeddings["project_out"]]
        if "final_norm" in embeddings:
            w_u = w_u * (layout.embeddings.norm_offset + arrays[embeddings["final_norm"]])
        return w_e, w_u

    digest = provenance.digest
    if digest is not None:  # the Q/K circuit's tensors only, so a model's revision does not depend on the circuits
        digest.expect({layer: [(weights.where[t], t) for t in sources(tensors(layer, ("qk",)).values())]
                       for layer in spec.layers}, partial(read_circuits, circuits=("qk",)))

    def close() -> None:
        weights.close()
        if digest is not None:
            digest.save()

    return weights.checked(Checkpoint(provenance, spec, reader=read_circuits, close=close,
                                      embeddings=read_embeddings if "ov" in circuits else None,
                                      unembedding="unembedding" in embeddings, qk_bytes=qk_bytes, options=options,
                                      quantization="; ".join(sorted({s.scheme.describe() for s in stored.values()}))
                                      or None))
