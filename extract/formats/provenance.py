"""A checkpoint's Provenance, built once by its opener: a hub checkpoint's commit; a local one's revision as given,
else the commit of the Hugging Face cache snapshot it is in, else a Digest of its files."""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Callable

from headforms.extract.checkpoint import Provenance
from headforms.extract.transport.caches import cache_root

DIGEST_FORMAT = b"headforms revision digest 1\n"  # changes when what the digest covers changes


def hub_provenance(repo, *, name: str, source: str, checkpoint_bytes: int) -> Provenance:
    """A hub checkpoint's: the commit its HubRepo resolved the revision to, and the repo's meter of bytes fetched."""
    return Provenance(name, source, repo.commit, "hub", checkpoint_bytes=checkpoint_bytes, meter=repo.meter)


def local_provenance(path: Path, *, name: str, source: str, revision: str | None, checkpoint_bytes: int,
                     digest: Callable[[], Digest]) -> Provenance:
    """A local checkpoint's: the revision given, else the commit of the Hugging Face cache snapshot holding `path`,
    else digest(), the Digest of its files (made only then)."""
    commit = None if revision else hf_cache_commit(Path(path).absolute())
    if revision or commit:
        return Provenance(name, source, revision or commit, "given" if revision else "hf-cache",
                          checkpoint_bytes=checkpoint_bytes)
    return Provenance(name, source, None, "digest", digest=digest(), checkpoint_bytes=checkpoint_bytes)


def hf_cache_commit(path: Path) -> str | None:
    """The commit of a Hugging Face cache snapshot holding `path` (.../models--org--name/snapshots/<commit>/...)."""
    for folder in [path, *path.parents]:
        if (folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--")
                and re.fullmatch(r"[0-9a-f]{40}", folder.name)):
            return folder.name
    return None


class Digest:
    """The revision of local weights without a commit: sha256 over the checkpoint's headers (config, each weight
    file's tensor table) and the bytes of every tensor the run reads (Q/K, folded gains), by file and name.

    Hashed while the layers are read, so the first extraction reads each byte once: its models row carries
    `pending` (a digest of the headers and of each file's size and mtime) until the last layer is read, then
    the digest. Each tensor's sha256 is cached per file, keyed by path, size and mtime, so an up-to-date
    rerun hashes nothing; a file whose size or mtime changed is hashed again, and is the same revision if and
    only if its bytes are the same. Compared with hashing before reading, this saves a second pass over the
    Q/K bytes; compared with whole-file sha256, it never reads the tensors a survey does not use."""

    def __init__(self, headers: dict[Path, bytes], preamble: bytes = b""):
        self.headers = headers     # weight file -> its tensor table as bytes (what it says each tensor is and where)
        self.preamble = preamble   # config.json's bytes (folders)
        self.stats = {path: _stat_key(path) for path in headers}
        self.layers: dict[int, list[tuple[Path, str]]] = {}  # layer index -> the (file, tensor) its reader reads
        self.read_layer: Callable[[int], object] = lambda layer: None  # the checkpoint's own reader
        self.tensors: dict[tuple[Path, str], str] = {}  # sha256 of each tensor hashed so far (or cached)
        self.covered: set[tuple[Path, str]] = set()  # the (file, tensor) of every layer
        self.deferred = False
        self._lock = threading.Lock()
        for path in headers:
            cached = _read_cache(path)
            if cached.get("stat") == list(self.stats[path]):
                self.tensors |= {(path, name): hexdigest for name, hexdigest in cached.get("tensors", {}).items()}

    def expect(self, layers: dict[int, list[tuple[Path, str]]], read_layer: Callable[[int], object]) -> None:
        """The tensors each layer's reader reads (what the digest covers: the Q/K circuit's, so a model's revision
        does not depend on the circuits read), and that reader (it hashes them)."""
        self.layers, self.read_layer = layers, read_layer
        self.covered = {key for layer in layers.values() for key in layer}

    def settle(self) -> str:
        """Hash the tensors not hashed yet by reading their layers, cache them; the digest."""
        for layer in self.missing_layers():
            self.read_layer(layer)
        self.save()
        return self.value

    def update(self, path: Path, name: str, data) -> None:
        """A tensor's bytes as the reader read them (hashed unless already known for this size and mtime, or not
        covered by the digest: V, O and the embeddings)."""
        if (path, name) not in self.tensors and (path, name) in self.covered:
            hexdigest = hashlib.sha256(data).hexdigest()
            with self._lock:
                self.tensors[(path, name)] = hexdigest

    def missing_layers(self) -> list[int]:
        return [i for i, layer in self.layers.items() if any(key not in self.tensors for key in layer)]

    @property
    def known(self) -> bool:
        return not self.missing_layers()

    @property
    def value(self) -> str:
        """"sha256:<hex>" over the headers and every expected tensor's digest (files by name, so a moved
        folder keeps its revision)."""
        lines = sorted(f"{path.name}\t{name}\t{self.tensors[path, name]}" for layer in self.layers.values()
                       for path, name in layer)
        return "sha256:" + self._hash(("\n".join(lines)).encode()).hexdigest()

    @property
    def pending(self) -> str:
        """A models row's revision until the digest is known: the headers, sizes and mtimes (a resumed run of
        unchanged files matches it; the digest replaces it once every layer is read)."""
        stats = "\n".join(f"{path.name}\t{size}\t{mtime}" for path, (size, mtime) in sorted(self.stats.items()))
        return "pending:" + self._hash(stats.encode()).hexdigest()[:32]

    def defer(self) -> None:
        """Let `Checkpoint.revision` be `pending` instead of hashing now (the caller records the digest later)."""
        self.deferred = True

    def save(self) -> None:
        """Cache the tensors' digests of each file under its path, size and mtime (best effort: a cache that
        cannot be written only means hashing again)."""
        with self._lock:
            known = dict(self.tensors)
        for path, stat in self.stats.items():
            tensors = {name: hexdigest for (p, name), hexdigest in known.items() if p == path}
            if tensors:
                cached = _read_cache(path)
                if cached.get("stat") == list(stat):
                    tensors = cached.get("tensors", {}) | tensors
                try:
                    _write_cache(path, {"path": str(path), "stat": list(stat), "tensors": tensors})
                except OSError:
                    pass

    def _hash(self, tail: bytes):
        h = hashlib.sha256(DIGEST_FORMAT)
        h.update(hashlib.sha256(self.preamble).digest())
        for path in sorted(self.headers):
            h.update(f"{path.name}\t".encode() + hashlib.sha256(self.headers[path]).digest())
        h.update(tail)
        return h


def _stat_key(path: Path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def _cache_file(path: Path) -> Path:
    key = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:32]
    return cache_root() / "digests" / f"{key}.json"


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(_cache_file(path).read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, entry: dict) -> None:
    target = _cache_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, target)
