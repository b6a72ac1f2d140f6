"""The contract between extract/ and the rest: a model's shape and a per-layer Q/K reader."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from headforms.extract.rope import Rope


class ExtractError(Exception):
    """A checkpoint that cannot be read as asked; the message is one line for the user."""


@dataclass(frozen=True)
class ModelSpec:
    """Shape and attention conventions of a model, normalised across architectures."""

    architecture: str          # the config's model_type (GGUF: general.architecture)
    n_layers: int
    n_heads: int               # query heads
    n_kv_heads: int            # key heads (grouped-query attention when < n_heads)
    d_model: int               # N, the width the heads read
    head_dim: int              # n
    score_scale: float         # the factor applied to q.k before the softmax (not to L)
    positional: str            # "learned", "absolute", "rope", "alibi"
    qk_norm: str | None = None  # None, or "folded" when norm gains were folded into W_Q, W_K
    config: dict = field(default_factory=dict, compare=False)  # the raw config / metadata
    rope: "Rope | None" = None  # RoPE's conventions (extract.rope) when positional == "rope"
    fold_norm: str | None = None  # None, or "gain" / "center" when the preceding norm was folded in

    @property
    def kv_index(self) -> np.ndarray:
        """Key head used by each query head (the usual repeat_kv order)."""
        return np.arange(self.n_heads) // (self.n_heads // self.n_kv_heads)


@dataclass
class Checkpoint:
    """A resolved checkpoint: provenance plus a reader of one layer's Q/K maps at a time."""

    name: str                  # default model name in the warehouse
    source: str                # what the user asked for
    revision: str              # hub commit, or "sha256:<hex>" of the local weight files
    spec: ModelSpec
    reader: Callable[[int], tuple[np.ndarray, np.ndarray]] = field(repr=False)
    close: Callable[[], None] = field(default=lambda: None, repr=False)
    base_model: str | None = None     # a training checkpoint: the model it is a revision of
    training_step: int | None = None  # a training checkpoint's step, from its revision's name
    qk_bytes: int | None = None          # bytes of the Q/K tensors (and gains) the reader reads
    checkpoint_bytes: int | None = None  # bytes of the weight files
    meter: object = field(default=None, repr=False)  # hub sources: a Meter of the bytes fetched over the network

    @property
    def bytes_fetched(self) -> int | None:
        """Bytes this checkpoint fetched over the network so far (None for local files)."""
        return None if self.meter is None else self.meter.bytes

    def read_layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(W_Q, W_K) of a layer: float64 arrays of shape (n_heads, n, N) and (n_kv_heads, n, N).

        Raises ExtractError naming the layer and tensor if a weight is not finite.
        """
        return self.reader(layer)


def sha256_files(paths) -> str:
    """Provenance of local weights: "sha256:<hex>" of one file, or of the sorted files' digests."""
    import hashlib
    from pathlib import Path

    digests = []
    for path in sorted(Path(p) for p in paths):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
        digests.append(h.hexdigest())
    if len(digests) == 1:
        return "sha256:" + digests[0]
    return "sha256:" + hashlib.sha256("\n".join(digests).encode()).hexdigest()
