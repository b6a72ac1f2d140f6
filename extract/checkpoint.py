"""The contract between extract/ and the rest: a model's shape and a per-layer reader of its heads' circuits."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np


class ExtractError(Exception):
    """A checkpoint that cannot be read as asked; the message is one line for the user."""


def first_line(error: BaseException, typed: bool = False) -> str:
    """A library's exception as one line of an `Error:` message: its message's first line (after its type's name
    when `typed`), or the type's name alone when it has no message."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    return f"{type(error).__name__}: {lines[0]}" if typed else lines[0]


@dataclass(frozen=True)
class FormPart:
    """One of the bilinear forms a head's score is the sum of, where it is more than one (multi-head latent
    attention's 'nope' and 'rope': extract.layouts.latent): its head size, the key head of each query head, whether RoPE
    rotates it, and the positive per-token factor on x_j^T L x_i besides score_scale."""

    name: str
    head_dim: int
    kv_index: tuple[int, ...]
    rotary: bool
    factor: str


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
    rope: object = None        # RoPE's conventions, a Rope (extract.layouts.rope), when positional == "rope"
    fold_norm: str | None = None  # None, or "gain" / "center" when the preceding norm was folded in
    softcap: float | None = None  # the logit is softcap * tanh(s / softcap) of the score s the form gives
    parts: tuple[FormPart, ...] | None = None  # a head's score as several forms (heads.part); None: one, 'whole'
    form: object = field(default=None, compare=False, repr=False)  # the parts' builder's spec (extract.layouts.latent)
    attention_layers: tuple[int, ...] | None = None  # a hybrid's softmax-attention layers in its stack; None: all

    @property
    def layers(self) -> tuple[int, ...]:
        """The indices in the stack of the layers whose heads are read: every layer, or a hybrid's attention layers."""
        return self.attention_layers if self.attention_layers is not None else tuple(range(self.n_layers))

    @property
    def kv_index(self) -> np.ndarray:
        """Key head used by each query head (the usual repeat_kv order)."""
        return np.arange(self.n_heads) // (self.n_heads // self.n_kv_heads)

    @property
    def forms(self) -> tuple[FormPart, ...]:
        """The forms each head is stored as: its parts, or its one 'whole' form."""
        return self.parts or (FormPart(WHOLE, self.head_dim, tuple(int(g) for g in self.kv_index),
                                       self.rope is not None, "1"),)


@dataclass(frozen=True)
class ReadOptions:
    """How a checkpoint is read, built once by the API and passed whole to every opener: a new reading option
    is a field here, the API's argument and the one reader that uses it."""

    revision: str | None = None  # hub revision (branch, tag or commit) or a local checkpoint's given name for it
    qk_norm: str = "refuse"      # "refuse" QK-norm models, or "fold" their gains into W_Q, W_K
    tower: str | None = None     # which tower of a multi-tower model (clip, siglip, whisper); None: the first
    fold_norm: str = "none"      # "none", "gain" or "center": fold the pre-attention norm in (extract.layouts.norms)
    circuits: tuple[str, ...] = ("qk",)  # the circuits read per layer: "qk" (W_Q, W_K) and/or "ov" (W_V, W_O)

    def __post_init__(self):
        circuits = (self.circuits,) if isinstance(self.circuits, str) else tuple(self.circuits)
        if not circuits or not set(circuits) <= set(CIRCUITS):
            raise ValueError(f"circuits must be a non-empty subset of {', '.join(CIRCUITS)}; got {circuits!r}")
        object.__setattr__(self, "circuits", tuple(c for c in CIRCUITS if c in circuits))


WHOLE = "whole"  # heads.part of a head whose score is one form
CIRCUITS = ("qk", "ov")  # a head's query-key form L = W_K^T W_Q and output-value map OV = W_O W_V


@dataclass(frozen=True)
class Provenance:
    """Where a checkpoint comes from, built once by its opener (extract.formats.provenance) and passed whole: the
    model's name, the source asked for, its revision and what kind that is, its size, a training checkpoint's step."""

    name: str                  # default model name in the warehouse
    source: str                # what the user asked for
    pinned: str | None         # the revision when it needs no hashing: hub or HF-cache commit, or given; else None
    revision_kind: str         # 'hub', 'hf-cache', 'digest' or 'given' (models.revision_kind)
    digest: object = field(default=None, repr=False)  # local files without a pinned revision: their Digest
    checkpoint_bytes: int | None = None  # bytes of the weight files
    meter: object = field(default=None, repr=False)  # hub sources: a Meter of the bytes fetched over the network
    base_model: str | None = None     # a training checkpoint: the model it is a revision of
    training_step: int | None = None  # a training checkpoint's step, from its revision's name

    @property
    def revision(self) -> str:
        """The pinned revision, else the digest: from its cache, pending while deferred, or hashed now."""
        if self.digest is None:
            return self.pinned
        if not self.digest.known and not self.digest.deferred:
            self.digest.settle()
        return self.digest.value if self.digest.known else self.digest.pending

    @property
    def bytes_fetched(self) -> int | None:
        """Bytes this checkpoint fetched over the network so far (None for local files)."""
        return None if self.meter is None else self.meter.bytes


@dataclass
class Checkpoint:
    """A resolved checkpoint: its provenance plus a reader of one layer's circuits at a time."""

    provenance: Provenance
    spec: ModelSpec
    reader: Callable[[int], dict[str, tuple[np.ndarray, np.ndarray]]] = field(repr=False)  # see read_circuits
    close: Callable[[], None] = field(default=lambda: None, repr=False)
    qk_bytes: int | None = None          # bytes of the tensors the reader reads (Q/K, V/O with "ov", gains)
    options: ReadOptions = ReadOptions()  # how it was opened (a worker reopens it with the same)
    quantization: str | None = None  # a quantized checkpoint's scheme(s) of Q/K (models.quantization), else None
    # the ov circuit's: (W_E, W_U) by blocks of the given number of vocabulary rows, in order (None: one block)
    embeddings: Callable[[int | None], Iterator[tuple[np.ndarray | None, np.ndarray | None]]] | None = field(
        default=None, repr=False)
    unembedding: bool = False  # whether read_embeddings' W_U is there (a linear unembedding of the residual stream)

    # The provenance's fields, read as the checkpoint's own.
    name = property(lambda self: self.provenance.name)
    source = property(lambda self: self.provenance.source)
    revision = property(lambda self: self.provenance.revision)
    revision_kind = property(lambda self: self.provenance.revision_kind)
    digest = property(lambda self: self.provenance.digest)
    checkpoint_bytes = property(lambda self: self.provenance.checkpoint_bytes)
    meter = property(lambda self: self.provenance.meter)
    bytes_fetched = property(lambda self: self.provenance.bytes_fetched)
    base_model = property(lambda self: self.provenance.base_model)
    training_step = property(lambda self: self.provenance.training_step)

    def read_circuits(self, layer: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The circuits of options.circuits of a layer, every tensor read in one go, as float64 arrays:
        "qk": (W_Q (n_heads, n, N), W_K (n_kv_heads, n, N)), or where spec.parts is set a dict part name -> its
        (W_Q, W_K) (their width may be a smaller span's, extract.layouts.latent); "ov": (W_V (n_kv_heads, n, N),
        W_O (n_heads, N, n)), so head h adds W_O[h] @ W_V[kv_index[h]] @ sum_j A_ij x_j to the attention output (before
        its bias); and with "qk", "sinks": (n_heads,) the heads' sink logits where the family has them (gpt-oss).

        Biases are not read: a V bias adds the constant W_O[h] b_V to a head's output (each row of A sums to 1),
        an O bias one constant per layer. Raises ExtractError naming the layer and tensor if a weight is not finite.
        """
        return self.reader(layer)

    def read_layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(W_Q, W_K) of a layer: float64 arrays of shape (n_heads, n, N) and (n_kv_heads, n, N).

        Raises ExtractError naming the layer and tensor if a weight is not finite.
        """
        circuits = self.reader(layer)
        if "qk" not in circuits:
            raise ExtractError(f"{self.name} was opened for the circuits {', '.join(self.options.circuits)}: "
                               "its W_Q, W_K are not read")
        return circuits["qk"]

    def read_embeddings(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(W_E (vocab, N), W_U (vocab, N) or None) as float64, whole: the token embedding and the
        unembedding (the LM head, or W_E where the embeddings are tied) with the final norm's gain folded in,
        W_U diag(offset + g) (Gemma's offset 1). The final norm's bias, LayerNorm's centring and its per-token
        1/rms are not folded, nor a family's scalar logit multipliers. W_U is None where the checkpoint has no
        linear unembedding of the residual stream (a sentence encoder, an MLM head's transform, a tower), and
        W_E is None too where the model reads no tokens (vision and audio towers)."""
        (whole,) = self._embeddings(None)
        return whole

    def embedding_blocks(self) -> Iterator[tuple[np.ndarray | None, np.ndarray | None]]:
        """read_embeddings' (W_E, W_U) by blocks of vocabulary rows, in order, each read when asked for: a block
        of each is EMBEDDING_BLOCK_BYTES of float64, which bounds the memory of W_E^T W_U, not the vocabulary."""
        return self._embeddings(max(1, EMBEDDING_BLOCK_BYTES // (8 * self.spec.d_model)))

    def _embeddings(self, rows: int | None) -> Iterator[tuple[np.ndarray | None, np.ndarray | None]]:
        """The reader's blocks of `rows` vocabulary rows (None: one block), refused where the ov circuit is not read."""
        if self.embeddings is None:
            raise ExtractError(f"{self.name} was opened without the ov circuit: its embeddings are not read")
        return self.embeddings(rows)


EMBEDDING_BLOCK_BYTES = 64 << 20  # float64 bytes of one block of W_E (and of W_U) that embedding_blocks reads


def row_blocks(total: int, rows: int | None) -> list[slice]:
    """range(total) as consecutive slices of `rows` (None: one slice of all of it; one empty slice where total is 0),
    the blocks an embeddings reader yields."""
    step = rows or max(total, 1)
    return [slice(start, min(start + step, total)) for start in range(0, max(total, 1), step)]
