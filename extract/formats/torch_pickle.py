"""PyTorch's zip checkpoints (.bin) read without torch: their data.pkl unpickled into references (storage, offset,
shape, strides) that say where each tensor's bytes are, resolving only torch's rebuild functions and storage types."""
from __future__ import annotations

import pickle
from collections import OrderedDict
from typing import NamedTuple


# torch's storage types by the dtype each holds, named: torch is imported only when a .bin tensor is read
# (importing it adds ~190 MB to a run's memory, which a safetensors or GGUF run never needs).
STORAGE_DTYPES = {"DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
                  "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
                  "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool"}


class StorageType(str):
    """A pickled storage type, as the name of its torch dtype."""


class Storage(NamedTuple):
    key: str
    dtype: str  # a torch dtype's name


class TensorRef(NamedTuple):
    """Where a pickled tensor's elements are: its storage record, element offset, shape and strides."""

    storage: Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def extent(self) -> tuple[int, int]:
        """The storage elements the tensor touches, [first, last + 1)."""
        if 0 in self.shape:
            return self.offset, self.offset
        return self.offset, self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) + 1


def _rebuild_tensor(storage, offset, shape, stride, *_):
    return TensorRef(storage, int(offset), tuple(shape), tuple(stride))


def _rebuild_parameter(data, *_):
    return data


class RecordingUnpickler(pickle.Unpickler):
    """Unpickles data.pkl into TensorRefs: the only names it resolves are the dict types and torch's
    tensor/parameter rebuilders and storage types, each to a recorder here; anything else is refused."""

    _NAMES = {("collections", "OrderedDict"): OrderedDict, ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
              ("torch._utils", "_rebuild_parameter"): _rebuild_parameter}

    def find_class(self, module, name):
        if (module, name) in self._NAMES:
            return self._NAMES[module, name]
        if module == "torch" and name in STORAGE_DTYPES:
            return StorageType(STORAGE_DTYPES[name])
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], StorageType)):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r:.80}")
        return Storage(str(pid[2]), pid[1])
