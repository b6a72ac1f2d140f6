"""Files headforms cannot read, named in the user's words.

Foreign formats (CTranslate2, ONNX, MLX, GGML, TensorFlow, Flax, GPTQ/AWQ without a quantization_config) are one table, `FOREIGN`: the
files that carry each, the bytes such a file starts with, or what its config.json or tensor names say.
A file whose size is not the size its header describes (a download that stopped early, or bytes after
its last tensor) is refused with both sizes and the first missing tensor (`check_extent`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from headforms.extract.checkpoint import ExtractError

HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ORIGINAL = ("the original Hugging Face checkpoint (a folder or hub id with config.json and model.safetensors "
            "or pytorch_model.bin)")
_HEAD = 64  # bytes read from the start of a file to recognise it


def _ends(names: Iterable[str], *suffixes: str) -> bool:
    """Whether some tensor name ends in each suffix."""
    names = list(names)
    return all(any(n.endswith(s) for n in names) for s in suffixes)


@dataclass(frozen=True)
class Foreign:
    """A checkpoint format headforms does not read, and how to recognise it."""

    name: str
    article: str = "a"
    files: tuple[str, ...] = ()
    """Glob patterns (in a folder, or the name of a file given alone) of the files that carry the format."""
    magic: re.Pattern | None = None
    """What such a file starts with; None: its name alone says it."""
    config: Callable[[dict], bool] | None = None
    """A config.json that says it."""
    tensors: Callable[[list[str]], bool] | None = None
    """Tensor names that say it."""
    instead: str = ORIGINAL
    """What to give instead."""

    def refusal(self, label) -> ExtractError:
        """The one line refusing `label` in this format."""
        return ExtractError(f"{label} is {self.article} {self.name} model, which headforms does not read: "
                            f"give {self.instead}")


_TF_OR_FLAX = ("the PyTorch weights of the same model (model.safetensors or pytorch_model.bin beside config.json; "
               "transformers converts them: from_pretrained(..., from_tf=True or from_flax=True), "
               "then save_pretrained)")

_QUANT_CONFIG = ("its config.json with the quantization_config it was saved with (quant_method, bits, group_size), "
                 "or the unquantized model it was made from (its model card names the base model)")

FOREIGN: tuple[Foreign, ...] = (
    # CTranslate2 (faster-whisper): model.bin starts with a uint32 format version, then the spec's name
    Foreign("CTranslate2", files=("model.bin",),
            magic=re.compile(rb"[\x01-\x3f]\x00\x00\x00[\x02-\xff]\x00\w+Spec\x00"),
            instead="the Hugging Face checkpoint it was converted from (for faster-whisper: openai/whisper-*), "
                    "with config.json and model.safetensors or pytorch_model.bin"),
    # ONNX: a protobuf ModelProto, field 1 (ir_version) first
    Foreign("ONNX", "an", files=("*.onnx", "onnx/*.onnx"), magic=re.compile(rb"\x08[\x01-\x7f]")),
    # MLX: mlx-examples' weights.npz (a zip of .npy), or mlx_lm's quantized safetensors (weight, scales, biases)
    Foreign("MLX", "an", files=("weights.npz", "weights.*.npz"), magic=re.compile(rb"PK\x03\x04"),
            config=lambda c: isinstance(c.get("quantization"), dict) and "bits" in c["quantization"],
            tensors=lambda names: _ends(names, ".scales", ".biases"),
            instead="the Hugging Face checkpoint it was converted from (an mlx-community model card names it), "
                    "with config.json and model.safetensors or pytorch_model.bin"),
    # GGML before GGUF: whisper.cpp's ggml-*.bin ('ggml' as a little-endian uint32), llama.cpp's ggmf / ggjt / ggla
    Foreign("GGML (whisper.cpp or pre-GGUF llama.cpp)", files=("*.bin", "*.ggml", "*.gguf"),
            magic=re.compile(rb"lmgg|ggml|fmgg|ggmf|tjgg|ggjt|algg|ggla"),
            instead="a GGUF file of the model (llama.cpp's convert scripts), or " + ORIGINAL),
    # TensorFlow: Keras HDF5 weights, or a SavedModel's protobuf
    Foreign("TensorFlow", files=("tf_model.h5", "*.h5", "saved_model.pb", "*/saved_model.pb"),
            magic=re.compile(rb"\x89HDF\r\n\x1a\n|\x08\x01\x12"), instead=_TF_OR_FLAX),
    # Flax: msgpack (a map first), or its shard index
    Foreign("Flax", files=("flax_model.msgpack", "flax_model-*.msgpack", "flax_model.msgpack.index.json"),
            magic=re.compile(rb"[\x80-\x8f\xde\xdf{]"), instead=_TF_OR_FLAX),
    # packed GPTQ/AWQ tensors under a config.json without the quantization_config that says their bits and groups
    # (with one, extract.layouts.quantized reads them; GPTQ has g_idx, AWQ does not)
    Foreign("GPTQ-quantized", tensors=lambda names: _ends(names, ".qweight", ".qzeros", ".g_idx"),
            instead=_QUANT_CONFIG),
    Foreign("AWQ-quantized", "an", tensors=lambda names: _ends(names, ".qweight", ".qzeros"), instead=_QUANT_CONFIG),
)


def _head(path: Path) -> bytes:
    """The first bytes of a file (none if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD)
    except OSError:
        return b""


def _json(path: Path) -> dict | None:
    """A JSON object file, or None (absent or unreadable: the reader of the folder says why, if it matters)."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _carries(form: Foreign, path: Path) -> bool:
    """Whether a file is in the format by its bytes (or by its name where the format has no magic)."""
    return form.magic is None or bool(form.magic.match(_head(path)))


def recognise(path: Path, *, config: dict | None = None, tensors: Iterable[str] = ()) -> Foreign | None:
    """The foreign format of a file or folder, if its files, config or tensor names show one.

    A folder's files count only where no Hugging Face weights sit beside them (many hub repos hold
    tf_model.h5 or an onnx/ folder next to model.safetensors); its config.json is read unless given."""
    path, tensors = Path(path), list(tensors)
    if path.is_dir() and config is None:
        config = _json(path / "config.json")
    if path.is_dir():
        beside = any((path / name).is_file() for name in HF_WEIGHTS)
        files = [] if beside else [f for form in FOREIGN for pattern in form.files for f in sorted(path.glob(pattern))]
    else:
        files = [path] if path.is_file() else []
    for form in FOREIGN:
        if any(f.match(pattern) and f.is_file() and _carries(form, f) for f in files for pattern in form.files):
            return form
        if config is not None and form.config is not None and form.config(config):
            return form
        if tensors and form.tensors is not None and form.tensors(tensors):
            return form
    return None


def refuse_foreign(path: Path, label=None, *, config: dict | None = None, tensors: Iterable[str] = ()) -> None:
    """Raise the one line naming the foreign format of a file or folder (see recognise), if it has one."""
    form = recognise(path, config=config, tensors=tensors)
    if form is not None:
        raise form.refusal(label or path)


def human_size(n: int) -> str:
    """A byte count as a person reads it: 812 bytes, 12.35 MB, 199.0 MB, 4.68 GB."""
    if n < 1000:
        return f"{n} byte" if n == 1 else f"{n} bytes"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000
        if n < 999.95 or unit == "TB":
            return f"{n:.1f} {unit}" if n >= 100 else f"{n:.2f} {unit}"


def _two_sizes(a: int, b: int) -> tuple[str, str]:
    """Two byte counts in words, exact where the rounded words would read the same."""
    ha, hb = human_size(a), human_size(b)
    return (ha, hb) if ha != hb else (f"{a:,} bytes", f"{b:,} bytes")


class IncompleteFile(ExtractError):
    """A file whose size is not the size its header describes. `warning` says it for --plan, which shows
    `checkpoint` (what the header alone gives) where the opener could build it; `header` is a weight
    file's (meta, spans), so its opener can go on to build that checkpoint."""

    def __init__(self, label, reason: str):
        super().__init__(f"cannot read {label}: it {reason}")
        self.warning = f"{label} {reason}"
        self.checkpoint = None
        self.header = None


def header_cut(label, size: int, what: str = "header") -> IncompleteFile:
    """A file that ends inside its own header: nothing but its size can be said."""
    return IncompleteFile(label, f"is {human_size(size)} and ends inside its {what}: the download is incomplete; "
                                 "download it again")


def size_mismatch(label, size: int, implied: int, missing: str | None = None, at_least: bool = False) -> IncompleteFile:
    """A file of `size` bytes whose header describes `implied` (`at_least` that): cut short (naming the first missing
    tensor), or with bytes after its last tensor."""
    actual, described = _two_sizes(size, implied)
    described = f"at least {described}" if at_least else described
    if size < implied:
        why = "the download is incomplete" + (f" (first missing tensor: {missing})" if missing else "")
    else:
        why = (f"its last tensor is followed by {human_size(size - implied)}, so it is not the file its header "
               "describes (a resumed download appended twice, or files joined)")
    return IncompleteFile(label, f"is {actual} but its header describes {described}: {why}; download it again")


def extent_problem(label, size: int, tensors: Iterable[tuple[str, int, int]], *, end: int | None = None,
                   align: int = 1) -> IncompleteFile | None:
    """The IncompleteFile of a file of `size` bytes whose header places (name, start, end) tensors, if it is one:
    a tensor (or the header's `end` of data) past the file's end, or more bytes after the last tensor than
    padding to `align` explains. A file without tensors is not judged by its end."""
    tensors = sorted(tensors, key=lambda t: (t[1], t[2]))
    implied = max([end or 0, *(stop for _, _, stop in tensors)])
    if implied > size:
        return size_mismatch(label, size, implied, next((name for name, _, stop in tensors if stop > size), None))
    padded = -(-implied // align) * align
    if tensors and size > padded:
        return size_mismatch(label, size, implied)
    return None
