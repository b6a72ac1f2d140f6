"""Hub files read by HTTP range: only the byte ranges a survey needs come over the network.

A `HubRepo` is a repository resolved to a commit with its file table (name -> size, blob id),
from the hub or, offline or unreachable, from the cache (through huggingface_hub's API client). A
`RemoteFile` reads byte ranges of one file at huggingface_hub's URLs with its headers (token,
HF_ENDPOINT) through urllib3 (proxies from HTTP_PROXY, HTTPS_PROXY and NO_PROXY, as huggingface_hub's
client takes them), each body read into its buffer 4 MB a call (huggingface_hub's httpx client hands a
body over in 64 kB pieces, copied several times on the way: 2.0 s of CPU per GB against 0.5 s, measured),
adjacent ranges coalesced and several requests in flight; drops, timeouts, 429 and 5xx are retried with
backoff, resuming a range where it stopped, and a wrong-length body is refused.
Every range fetched is kept in the cache (keyed by repo, commit and blob id), so a repeated or
interrupted extraction refetches nothing and HF_HUB_OFFLINE=1 works from it.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit
from urllib.request import getproxies, proxy_bypass

import numpy as np
import urllib3

from headforms.extract.checkpoint import ExtractError, first_line
from headforms.extract.transport import pages
from headforms.extract.transport.buffers import BufferPool
from headforms.extract.transport.caches import cache_root

RETRIES = 6            # tries of one range in a row without progress before giving up
BACKOFF = 0.5          # seconds before the first retry, doubling after each (a try that made progress resumes at once)
RETRY_AFTER_CAP = 60.0  # longest Retry-After honoured, seconds
TIMEOUT = 30.0         # seconds without a byte before a request counts as dropped
IN_FLIGHT = 8          # concurrent range requests
PIECE = 16 << 20       # a longer range is fetched as pieces of this size, in parallel
STEP = 4 << 20         # a body is read into its buffer this many bytes a call (64 kB a call costs 2.5x the CPU)


class FetchError(ExtractError):
    """A transfer that failed after its retries: resumable, so committed layers are kept."""


class RepoNotFound(ExtractError):
    """The repo is not on the hub, or the hub cannot tell (offline, unreachable) and the cache does not hold it."""


class Meter:
    """Bytes fetched over the network (not from the cache), shared by a checkpoint's files."""

    def __init__(self):
        self.bytes = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes += n


def _repo_dir(repo_id: str) -> Path:
    return cache_root() / ("models--" + repo_id.replace("/", "--"))


def _write_atomic(path: Path, data, once: bool = False) -> None:
    """A cache file appears whole or not at all (a killed run leaves no torn chunk; a full disk, not even a part).
    Bytes written `once` (a range, not read again in this run) are flushed and their pages given back (pages.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        if once:
            pages.write_once(tmp, data)
        else:
            with open(tmp, "wb") as f:
                f.write(data)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write names no file: say which
            exc.filename = str(path)
        raise
    os.replace(tmp, path)


def _session_and_errors():
    """huggingface_hub's shared HTTP client and the transport errors it raises (its httpx's TransportError:
    drops, timeouts, refused connections)."""
    import importlib

    from huggingface_hub.utils import get_session

    session = get_session()
    return session, (importlib.import_module(type(session).__module__.split(".")[0]).TransportError,)


@functools.cache
def _pool(proxy: str | None) -> urllib3.PoolManager:
    """The process's connections for range requests, through `proxy` when one is named."""
    return urllib3.ProxyManager(proxy, maxsize=IN_FLIGHT) if proxy else urllib3.PoolManager(maxsize=IN_FLIGHT)


if hasattr(os, "register_at_fork"):  # a forked process opens connections of its own
    os.register_at_fork(after_in_child=_pool.cache_clear)


def _request(url: str, headers: dict[str, str]) -> urllib3.BaseHTTPResponse:
    """GET `url`, its body left to read: through the proxy the environment names for its host (as huggingface_hub's
    client takes it), redirects followed (the hub sends weight files from its CDN) and the token dropped when one
    leads to another host; no retries of its own (the caller's resume where a try stopped)."""
    parts = urlsplit(url)
    proxy = None if proxy_bypass(parts.hostname or "") else getproxies().get(parts.scheme)
    return _pool(proxy).request("GET", url, headers=headers, preload_content=False, decode_content=False,
                                retries=urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=5),
                                timeout=urllib3.Timeout(connect=TIMEOUT, read=TIMEOUT))


@dataclass
class HubRepo:
    """A hub repository at a commit: its files' sizes and blob ids, and where their ranges are cached."""

    repo_id: str
    commit: str
    files: dict[str, tuple[int, str]]   # path -> (size, blob id)
    meter: Meter = field(default_factory=Meter)
    buffers: BufferPool = field(default_factory=BufferPool, repr=False, compare=False)  # ranges' and arrays' memory

    @classmethod
    def resolve(cls, repo_id: str, revision: str | None) -> HubRepo:
        """The repo's commit and file table: from the hub, else (offline, unreachable) from the cache."""
        from huggingface_hub import HfApi, constants, errors
        from huggingface_hub.utils import validate_repo_id

        try:
            validate_repo_id(repo_id)
        except errors.HFValidationError:
            raise ExtractError(f"not a file, folder, pkg: reference or hub id ('name' or 'org/name'): {repo_id}") from None
        refs = _repo_dir(repo_id) / "refs" / quote(revision or "main", safe="")
        if constants.is_offline_mode():
            return cls._cached(repo_id, revision, refs, "HF_HUB_OFFLINE is set")
        try:
            info = HfApi().model_info(repo_id, revision=revision or "main", files_metadata=True, timeout=TIMEOUT)
        except errors.RevisionNotFoundError:
            raise ExtractError(f"no revision '{revision}' of '{repo_id}' on the Hugging Face hub") from None
        except errors.GatedRepoError:
            raise ExtractError(f"'{repo_id}' is gated on the Hugging Face hub: accept its terms on the "
                               "model page and log in (`hf auth login`)") from None
        except errors.RepositoryNotFoundError:
            raise RepoNotFound(f"no model '{repo_id}' on the Hugging Face hub "
                               "(or it is private: log in with `hf auth login`)") from None
        except (errors.HfHubHTTPError, *_session_and_errors()[1], OSError) as e:
            return cls._cached(repo_id, revision, refs, f"the hub cannot be reached ({first_line(e, typed=True)})")
        files = {s.rfilename: (int(s.lfs.size if s.lfs else s.size or 0), s.lfs.sha256 if s.lfs else s.blob_id or "")
                 for s in info.siblings or []}
        repo = cls(repo_id, info.sha, files)
        _write_atomic(repo.folder / "files.json", json.dumps(files).encode())
        _write_atomic(refs, info.sha.encode())
        return repo

    @classmethod
    def _cached(cls, repo_id: str, revision: str | None, refs: Path, why: str) -> HubRepo:
        from huggingface_hub import constants

        commit = revision if revision and re.fullmatch(r"[0-9a-f]{40}", revision) else None
        if commit is None and refs.is_file():
            commit = refs.read_text().strip()
        table = _repo_dir(repo_id) / (commit or "-") / "files.json"
        if commit is None or not table.is_file():
            looked = (f"in neither the Hugging Face cache ({constants.HF_HUB_CACHE}) nor the headforms cache "
                      f"({cache_root()})" if constants.is_offline_mode() else f"not in the headforms cache ({cache_root()})")
            raise RepoNotFound(f"'{repo_id}'{f' at {revision}' if revision else ''} is {looked} and {why}")
        return cls(repo_id, commit, {k: tuple(v) for k, v in json.loads(table.read_text()).items()})

    @functools.cached_property
    def headers(self) -> dict[str, str]:
        """huggingface_hub's request headers (user agent, the token when logged in), built once."""
        from huggingface_hub.utils import build_hf_headers

        return build_hf_headers()

    @property
    def folder(self) -> Path:
        return _repo_dir(self.repo_id) / self.commit

    def file(self, path: str) -> RemoteFile:
        """A file of the repo, read by range."""
        if path not in self.files:
            raise ExtractError(f"'{self.repo_id}' on the Hugging Face hub has no file {path}")
        size, blob = self.files[path]
        return RemoteFile(self, path, size, blob)

    def checkpoint_bytes(self, paths) -> int:
        return sum(self.files[p][0] for p in paths)


class RemoteFile:
    """One file of a hub repo at a commit, read by byte range with retries and a range cache."""

    def __init__(self, repo: HubRepo, path: str, size: int, blob: str):
        self.repo, self.path, self.size = repo, path, size
        self.chunks = repo.folder / "blobs" / (re.sub(r"[^0-9A-Za-z._-]", "_", blob or path))
        self._listing: list[tuple[int, int]] | None = None
        self._held: dict[tuple[int, int], memoryview] = {}  # ranges fetched ahead (read_many's `hold`)
        self._holding = threading.Lock()  # the layer ahead is fetched in a thread of its own

    def __str__(self) -> str:
        return f"{self.repo.repo_id}/{self.path}"

    # -- the cache: chunk files named START-END (absolute byte offsets, end exclusive)

    def _cached_chunks(self) -> list[tuple[int, int]]:
        if self._listing is None:
            names = os.listdir(self.chunks) if self.chunks.is_dir() else []
            self._listing = [tuple(map(int, n.split("-"))) for n in names if re.fullmatch(r"\d+-\d+", n)]
        return self._listing

    def _uncovered(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of start..end that no cached chunk holds."""
        gaps, at = [], start
        for a, b in sorted(self._cached_chunks()):
            if a >= end:
                break
            if b > at:
                if a > at:
                    gaps.append((at, a))
                at = b
        return gaps + ([(at, end)] if at < end else [])

    def _from_cache(self, start: int, end: int) -> memoryview:
        """start..end-1 from the cached chunks covering it, read into one buffer."""
        buf, at = self.repo.buffers.empty(end - start, np.uint8), start
        for a, b in sorted(self._cached_chunks()):
            if a <= at < b:
                self._read_chunk(a, b, memoryview(buf)[at - start:min(b, end) - start], at - a)
                at = min(b, end)
                if at == end:
                    break
        return memoryview(buf)

    def _read_chunk(self, a: int, b: int, into: memoryview, offset: int) -> None:
        """Bytes of the cached chunk of bytes a..b-1, from `offset` in it, into `into`; refused if the chunk does not
        hold b - a bytes (a cache damaged outside headforms)."""
        with pages.open_unbuffered(self.chunks / f"{a}-{b}") as f:
            size = os.fstat(f.fileno()).st_size
            if size != b - a or pages.read_into(f.fileno(), into, offset) < len(into):
                raise ExtractError(f"the cached bytes {a}-{b} of {self} are damaged ({size} bytes where {b - a} "
                                   f"belong): run `headforms cache --clear --repo {self.repo.repo_id}` and extract "
                                   "again")

    def prefix_path(self, size: int) -> Path:
        """A cached chunk holding the file's first `size` bytes (for readers that want a path): only the bytes
        no chunk holds are fetched, and a prefix grown from a shorter one is written whole."""
        if not any(a == 0 and b >= size for a, b in self._cached_chunks()):
            data = self.read_at(0, size)
            if not any(a == 0 and b >= size for a, b in self._cached_chunks()):
                _write_atomic(self.chunks / f"0-{size}", data)
                self._cached_chunks().append((0, size))
        return self.chunks / "{}-{}".format(*min(c for c in self._cached_chunks() if c[0] == 0 and c[1] >= size))

    # -- reading

    def read_at(self, offset: int, size: int) -> bytes:
        """Exactly `size` bytes from `offset`, from the cache or the hub."""
        return bytes(self.read_many([(offset, offset + size)])[(offset, offset + size)])

    def read_many(self, spans: list[tuple[int, int]], hold: bool = False) -> dict[tuple[int, int], memoryview]:
        """The bytes of each (start, end) span: what the cache holds read locally, the rest fetched with
        adjacent spans coalesced, long ranges split into pieces, several requests in flight; each range
        cached. Every byte is held once: a range is fetched into one buffer, and spans are views of it.
        `hold` (a layer fetched ahead): the ranges fetched are also kept for the next call that asks for their
        bytes, which then reads none of them back from the cache."""
        for start, end in spans:
            if not 0 <= start <= end <= self.size:
                raise ExtractError(f"cannot read {self}: bytes {start}-{end} lie outside its {self.size} bytes")
        gaps = sorted(gap for start, end in set(spans) if end > start for gap in self._uncovered(start, end))
        ranges: list[list[int]] = []
        for start, end in gaps:
            if ranges and start <= ranges[-1][1]:
                ranges[-1][1] = max(ranges[-1][1], end)
            else:
                ranges.append([start, end])
        fresh = {(start, end): memoryview(self.repo.buffers.empty(end - start, np.uint8)) for start, end in ranges}
        pieces = [(a, min(a + PIECE, end), fresh[start, end][a - start:min(a + PIECE, end) - start])
                  for start, end in fresh for a in range(start, end, PIECE)]
        if pieces:
            with ThreadPoolExecutor(min(IN_FLIGHT, len(pieces))) as pool:
                list(pool.map(lambda piece: self._fetch(*piece), pieces))
            for (start, end), data in fresh.items():
                _write_atomic(self.chunks / f"{start}-{end}", data, once=True)
                self._cached_chunks().append((start, end))
        with self._holding:
            if hold:
                self._held |= fresh
            else:
                fresh |= {r: self._held.pop(r) for r in list(self._held)
                          if any(r[0] <= a and b <= r[1] for a, b in spans)}
        out = {}
        for start, end in spans:
            holder = next(((a, b) for a, b in fresh if a <= start and end <= b), None)
            out[start, end] = fresh[holder][start - holder[0]:end - holder[0]] if holder else self._from_cache(start, end)
        return out

    def _fetch(self, start: int, end: int, into: memoryview) -> None:
        """Bytes start..end-1 from the hub, into `into`; a drop or short body resumes where it stopped, 429/5xx retry."""
        from huggingface_hub import constants, hf_hub_url

        if constants.is_offline_mode():
            raise FetchError(f"bytes {start}-{end} of {self} are not in the headforms cache and HF_HUB_OFFLINE is set")
        url = hf_hub_url(self.repo.repo_id, self.path, revision=self.repo.commit)
        got, tries, why, wait = 0, 0, "", 0.0
        while got < end - start:
            if tries == RETRIES:
                raise FetchError(f"cannot fetch bytes {start}-{end} of {self} from the Hugging Face hub after "
                                 f"{RETRIES} tries ({why}); committed layers are kept: run the same command to resume")
            time.sleep(wait)
            at, tries = start + got, tries + 1
            wait = BACKOFF * 2 ** (tries - 1)  # before the next try, should this one make no progress
            headers = self.repo.headers | {"Range": f"bytes={at}-{end - 1}", "Accept-Encoding": "identity"}
            try:
                response = _request(url, headers)
            except urllib3.exceptions.HTTPError as e:
                if (unverified := _unverified_certificate(e)) is not None:  # no retry changes a certificate
                    raise FetchError(
                        f"cannot fetch bytes {start}-{end} of {self}: the certificate of {urlsplit(url).hostname} or "
                        f"of a host it redirected to was not verified ({unverified.verify_message}): where a proxy or "
                        "a private certificate authority stands between, point SSL_CERT_FILE at its certificates; "
                        "committed layers are kept") from None
                why = _transport_failure(e)
                continue
            try:
                if response.status == 429 or response.status >= 500:
                    why = f"HTTP {response.status}"
                    retry_after = response.headers.get("Retry-After", "")
                    wait = min(float(retry_after), RETRY_AFTER_CAP) if retry_after.isdigit() else wait
                    continue
                if response.status >= 400:
                    said = response.headers.get("X-Error-Message")
                    raise FetchError(f"cannot fetch {self} from the Hugging Face hub: HTTP {response.status} "
                                     f"{response.reason}{f' ({said})' if said else ''}" + (
                                         ": log in with `hf auth login`, with a token that may read it"
                                         if response.status in (401, 403) else ""))
                if response.status != 206:
                    raise FetchError(f"the hub answered a range request for {self} with HTTP {response.status}, "
                                     "not 206 Partial Content")
                expected = f"bytes {at}-{end - 1}/"
                if not response.headers.get("Content-Range", "").startswith(expected):
                    why = f"Content-Range {response.headers.get('Content-Range')!r}, expected {expected}..."
                    continue
                while got < end - start and (n := response.readinto(into[got:got + STEP])):
                    self.repo.meter.add(n)
                    got += n
                if got == end - start and response.read(1):
                    raise FetchError(f"the hub sent more than bytes {start}-{end} of {self}")
                if got < end - start:
                    why = f"short body: {start + got - at} bytes of {end - at}"
            except (urllib3.exceptions.HTTPError, OSError) as e:
                why = _transport_failure(e)
            finally:
                if response.length_remaining != 0:  # a body not read to its end: its connection serves no other
                    response.close()
                response.release_conn()
            if start + got > at:  # progress made: the next try resumes at once, it is no new failure
                tries, wait = 0, 0.0


def _unverified_certificate(error: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate that failed verification behind a failed connection (urllib3 wraps it twice), or None."""
    reason = getattr(error, "reason", None)
    cause = reason.args[0] if isinstance(reason, urllib3.exceptions.SSLError) and reason.args else None
    return cause if isinstance(cause, ssl.SSLCertVerificationError) else None


def _transport_failure(error: BaseException) -> str:
    """A failed try in a few words: a timeout as the wait it outlasted, else the error's first line."""
    error = getattr(error, "reason", None) or error  # urllib3's MaxRetryError: what ended the one try
    if isinstance(error, urllib3.exceptions.TimeoutError):
        return f"no byte came for {TIMEOUT:g} s"
    return first_line(error, typed=True)


class RangeReader:
    """A read-only, seekable file object over a RemoteFile (for zipfile)."""

    def __init__(self, remote: RemoteFile):
        self.remote, self.pos = remote, 0

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (offset, self.pos + offset, self.remote.size + offset)[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.remote.size if n is None or n < 0 else min(self.remote.size, self.pos + n)
        data = self.remote.read_at(self.pos, end - self.pos) if end > self.pos else b""
        self.pos += len(data)
        return data


def hf_cache_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The snapshot folder of a hub repo at `revision` in the Hugging Face cache, as huggingface_hub finds it
    offline (its own lookup: the revision's ref, or a commit), else None. Offline, hub ids are read from it first."""
    from huggingface_hub import errors, snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (errors.LocalEntryNotFoundError, errors.HFValidationError):
        return None


def hf_cache_file(repo_id: str, filename: str, revision: str | None) -> Path | None:
    """A file of a hub repo at `revision` in the Hugging Face cache (huggingface_hub's try_to_load_from_cache), else
    None."""
    from huggingface_hub import errors, try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except (errors.HFValidationError, ValueError):
        return None
    return Path(found) if isinstance(found, str) else None


def cache_usage():
    """Rows (repo, commit, files, bytes) of the cache, one per repo and commit."""
    rows = []
    root = cache_root()
    for repo in sorted(root.glob("models--*")):
        for commit in sorted(p for p in repo.iterdir() if p.is_dir() and p.name != "refs"):
            chunks = [f for f in (commit / "blobs").rglob("*") if f.is_file()]
            rows.append({"repo": repo.name.removeprefix("models--").replace("--", "/"), "commit": commit.name,
                         "files": len({c.parent for c in chunks}), "bytes": sum(c.stat().st_size for c in chunks)})
    return rows


def clear_cache(repo_id: str | None = None) -> int:
    """Delete the cache of one repo (all when None); returns the bytes freed."""
    targets = [_repo_dir(repo_id)] if repo_id else sorted(cache_root().glob("models--*"))
    freed = 0
    for target in targets:
        if target.is_dir():
            freed += sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
            shutil.rmtree(target)
    return freed
