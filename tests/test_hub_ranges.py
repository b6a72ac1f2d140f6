"""A hub file read by range (`extract/transport/hub.py`) against the local hub: the requests it sends, each fault's
retry, wait and message, spans coalesced and cached bytes never fetched twice (checked byte by byte against sets of
offsets), a seekable reader that behaves as `io.BytesIO`, and the range cache's accounting against the files on disk."""
from __future__ import annotations

import importlib
import io
import mmap
import os
import types

import numpy as np
import pytest

from headforms.extract.checkpoint import ExtractError
from headforms.extract.transport import hub as hub_module, pages
from headforms.extract.transport.hub import FetchError, HubRepo
from tests.bench import resident_bytes
from tests.test_buffers import address as array_address
from tests.hub_server import serve_hub

SIZE = 100_000


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The local hub serving org/r (random bytes as blob.bin, an empty file) and org/s; sleeps recorded, not slept."""
    server = serve_hub(monkeypatch, tmp_path, hf_home=False)
    rng = np.random.default_rng(7)
    server.repos["org/r"] = {"blob.bin": rng.bytes(SIZE), ".gitattributes": b""}
    server.repos["org/s"] = {"other.bin": rng.bytes(3000)}
    server.waits = []
    monkeypatch.setattr(hub_module, "time", types.SimpleNamespace(sleep=server.waits.append))
    monkeypatch.setattr(hub_module, "BACKOFF", 0.5)
    yield server
    server.close()


def remote(name: str = "blob.bin", repo: str = "org/r"):
    return HubRepo.resolve(repo, None).file(name)


def ranges(server) -> list[str]:
    """The Range header of each file request, in order."""
    return [r for method, path, r in server.requests if "/resolve/" in path]


def fetched(server, start: int, end: int) -> bytes:
    return bytes(server.repos["org/r"]["blob.bin"][start:end])


# One range, its requests and its faults ------------------------------------------------------------------------

def test_a_range_is_asked_for_exactly_and_uncompressed(hub):
    """Range names the span's first and last byte, Accept-Encoding asks for the bytes as stored (a compressed body's
    length would not be the range's), and the meter counts what came."""
    file = remote()
    assert file.read_at(1000, 5000) == fetched(hub, 1000, 6000)
    file_request = [h for (_, path, _), h in zip(hub.requests, hub.request_headers) if "/resolve/" in path]
    (headers,) = file_request
    headers = {k.lower(): v for k, v in headers.items()}
    assert (headers["range"], headers["accept-encoding"].lower()) == ("bytes=1000-5999", "identity")
    assert file.repo.meter.bytes == 5000 and hub.waits == [0.0]


def test_a_file_served_from_disk_gives_the_same_ranges_and_counts(hub, tmp_path):
    """A repo file given as a path (as the bench serves checkpoints: sendfile, no copy in the server) answers ranges
    and their counts as one held in memory does."""
    path = tmp_path / "blob.bin"
    path.write_bytes(hub.repos["org/r"]["blob.bin"])
    hub.repos["org/d"] = {"blob.bin": path}
    spans = [(0, 10), (4096, 70_000), (SIZE - 7, SIZE)]
    got = remote(repo="org/d").read_many(spans)
    assert {span: bytes(view) for span, view in got.items()} == {(a, b): fetched(hub, a, b) for a, b in spans}
    assert hub.served == {"blob.bin": 10 + (70_000 - 4096) + 7}


@pytest.mark.parametrize("fault, why", [
    ("503", r"HTTP 503"),
    ("500", r"HTTP 500"),
    ("range", r"Content-Range 'bytes 1001-6000/100000', expected bytes 1000-5999/\.\.\."),
    ("norange", r"Content-Range None, expected bytes 1000-5999/\.\.\."),
    ("stall", r"no byte came for 0\.2 s"),
])
def test_a_failing_range_waits_backoff_doubling_and_then_says_what_failed(hub, monkeypatch, fault, why):
    """Every try fails without progress: waits 0, BACKOFF, 2 BACKOFF between tries, then one FetchError naming the
    range, the tries and the last failure."""
    monkeypatch.setattr(hub_module, "RETRIES", 3)
    monkeypatch.setattr(hub_module, "TIMEOUT", 0.2)
    hub.stall = 0.6
    hub.faults = [fault] * 3
    with pytest.raises(FetchError, match=rf"^cannot fetch bytes 1000-6000 of org/r/blob\.bin from the Hugging Face hub "
                                         rf"after 3 tries \({why}\); committed layers are kept: run the same command "
                                         r"to resume$"):
        remote().read_at(1000, 5000)
    assert hub.waits == [0.0, 0.5, 1.0] and ranges(hub) == ["bytes=1000-5999"] * 3


@pytest.mark.parametrize("fault", ["503", "500", "range", "norange", "stall"])
def test_a_range_that_fails_then_succeeds_has_its_bytes(hub, monkeypatch, fault):
    """One failure, then the same range again after BACKOFF (a stall is a timeout only when the client gives up)."""
    monkeypatch.setattr(hub_module, "TIMEOUT", 0.2)
    hub.stall = 0.6
    hub.faults = [fault]
    assert remote().read_at(1000, 5000) == fetched(hub, 1000, 6000)
    assert hub.waits == [0.0, 0.5] and ranges(hub) == ["bytes=1000-5999"] * 2


@pytest.mark.parametrize("retry_after, wait", [(7, 7.0), (1000, 60.0)])
def test_retry_after_is_honoured_up_to_a_minute(hub, retry_after, wait):
    hub.faults, hub.retry_after = ["429"], retry_after
    assert remote().read_at(0, 10) == fetched(hub, 0, 10)
    assert hub.waits == [0.0, wait]


def test_a_drop_resumes_at_once_where_it_stopped(hub, monkeypatch):
    """Each drop sends half the rest: every try makes progress, so none counts against RETRIES and none waits; no byte
    comes twice."""
    monkeypatch.setattr(hub_module, "RETRIES", 2)
    hub.faults = ["drop"] * 4
    assert remote().read_at(0, SIZE) == fetched(hub, 0, SIZE)
    starts = [int(r.removeprefix("bytes=").split("-")[0]) for r in ranges(hub)]
    assert len(starts) == 5 and starts[0] == 0 and all(a < b for a, b in zip(starts, starts[1:]))
    assert hub.waits == [0.0] * 5 and hub.served["blob.bin"] == SIZE


def test_a_short_body_resumes_until_nothing_comes_then_says_so(hub, monkeypatch):
    """Each short body is half of what was asked: the range resumes at once while bytes come; a try that brings
    none (half of the last byte) counts, and RETRIES of them end it."""
    monkeypatch.setattr(hub_module, "RETRIES", 3)
    hub.faults = ["short"] * 40
    with pytest.raises(FetchError, match=r"^cannot fetch bytes 1000-5096 of org/r/blob\.bin .* after 3 tries "
                                         r"\(short body: 0 bytes of 1\);"):
        remote().read_at(1000, 4096)
    halves = [f"bytes={5096 - (4096 >> k)}-5095" for k in range(13)]  # 4096, 2048, ..., 1 bytes left
    assert ranges(hub) == halves + halves[-1:] * 2
    assert hub.waits == [0.0] * 13 + [0.5, 1.0] and hub.served["blob.bin"] == 4095


@pytest.mark.parametrize("fault, message", [
    ("whole", r"the hub answered a range request for org/r/blob\.bin with HTTP 200, not 206 Partial Content"),
    ("long", r"the hub sent more than bytes 1000-6000 of org/r/blob\.bin"),
    ("403", r"cannot fetch org/r/blob\.bin from the Hugging Face hub: HTTP 403 Forbidden: log in with `hf auth login`, "
            r"with a token that may read it$"),
    ("404", r"cannot fetch org/r/blob\.bin from the Hugging Face hub: HTTP 404 Not Found$"),
])
def test_a_wrong_answer_is_refused_at_once(hub, fault, message):
    hub.faults = [fault]
    with pytest.raises(FetchError, match=f"^{message}"):
        remote().read_at(1000, 5000)
    assert len(ranges(hub)) == 1 and hub.waits == [0.0]


def test_offline_a_range_comes_from_the_cache_or_the_error_says_it_is_not_there(hub, monkeypatch):
    file = remote()
    file.read_at(0, 100)
    monkeypatch.setattr(importlib.import_module("huggingface_hub.constants"), "HF_HUB_OFFLINE", True)
    hub.requests.clear()
    offline = remote()
    assert offline.read_at(10, 50) == fetched(hub, 10, 60) and hub.requests == []
    with pytest.raises(FetchError, match=r"^bytes 100-110 of org/r/blob\.bin are not in the headforms cache and "
                                         r"HF_HUB_OFFLINE is set$"):
        offline.read_at(90, 20)


def test_a_span_outside_the_file_is_refused(hub):
    with pytest.raises(ExtractError, match=r"^cannot read org/r/blob\.bin: bytes 99995-100005 lie outside its "
                                           r"100000 bytes$"):
        remote().read_at(SIZE - 5, 10)


# Many spans: coalesced, split, cached ---------------------------------------------------------------------------

def test_spans_fetch_each_missing_byte_once_in_as_few_requests_as_they_allow(hub, monkeypatch):
    """Rounds of random spans (empty, touching, overlapping, inside cached ones) on one file, long ranges split in
    pieces: each span's bytes are the file's; each round fetches exactly the bytes no earlier round fetched, in one
    request per maximal run of them split at PIECE; spans within one fetched run share its memory."""
    piece = 700
    monkeypatch.setattr(hub_module, "PIECE", piece)
    rng = np.random.default_rng(0)
    file, have, chunks = remote(), np.zeros(SIZE, bool), 0
    data = np.frombuffer(hub.repos["org/r"]["blob.bin"], np.uint8)
    for round_ in range(12):
        starts = rng.integers(0, SIZE, 6)
        spans = [(int(a), int(min(SIZE, a + rng.integers(0, 3000)))) for a in starts]
        spans += [(spans[0][1], min(SIZE, spans[0][1] + 50)), (spans[1][0], spans[1][0]), (SIZE, SIZE)]  # touching, empty
        want = np.zeros(SIZE, bool)
        for a, b in spans:
            want[a:b] = True
        new = want & ~have
        edges = np.flatnonzero(np.diff(np.concatenate([[0], new.astype(np.int8), [0]])))
        runs = list(zip(edges[::2], edges[1::2]))
        served_before, requests_before = hub.served.get("blob.bin", 0), len(ranges(hub))
        got = file.read_many(spans)
        for a, b in spans:
            np.testing.assert_array_equal(np.frombuffer(got[a, b], np.uint8), data[a:b])
        assert hub.served.get("blob.bin", 0) - served_before == new.sum()
        expected = sorted(f"bytes={p}-{min(p + piece, b) - 1}" for a, b in runs for p in range(a, b, piece))
        assert sorted(ranges(hub)[requests_before:]) == expected, round_
        have, chunks = have | want, chunks + len(runs)
    assert len(os.listdir(file.chunks)) == chunks  # one cached chunk per fetched run


def test_two_spans_of_one_fetched_range_are_views_of_one_buffer(hub):
    """Adjacent and nested spans are one request whose buffer every span views (each byte held once), including
    the span that ends where the range ends."""
    spans = [(100, 300), (300, 500), (250, 500)]
    got = remote().read_many(spans)
    assert ranges(hub) == ["bytes=100-499"] and [bytes(got[s]) for s in spans] == [fetched(hub, *s) for s in spans]
    a, b, c = (np.frombuffer(got[s], np.uint8).__array_interface__["data"][0] for s in spans)
    assert (b - a, c - a) == (200, 150)  # where they lie in the range's buffer


def test_a_range_s_buffer_serves_the_next_range_of_its_size_once_nothing_views_it(hub):
    """A fetched range's memory goes back to the repo's pool when its spans are freed, and the next range of that
    size is fetched into it (malloc would have given it to other arrays); a span still viewed keeps its bytes."""
    def address(view) -> int:
        return array_address(np.frombuffer(view, np.uint8))

    file = remote()
    first = file.read_many([(0, 20_000)])[(0, 20_000)]
    second = file.read_many([(20_000, 40_000)])[(20_000, 40_000)]  # the first still viewed: memory of its own
    where = {address(first), address(second)}
    assert len(where) == 2 and bytes(first) == fetched(hub, 0, 20_000)
    del first, second
    others = [np.empty(20_000, np.uint8) for _ in where]
    third = file.read_many([(40_000, 60_000)])[(40_000, 60_000)]
    assert address(third) in where and not where & {address(a) for a in others}
    assert bytes(third) == fetched(hub, 40_000, 60_000)


def test_a_range_fetched_ahead_is_held_until_asked_for_then_read_from_the_cache(hub, monkeypatch):
    """A range fetched ahead (`hold`) serves the next call that asks for its bytes from the fetch's buffer, reading
    nothing back from the cache, and is let go; later calls, and a new reader, read the cached chunks (one chunk or
    two end to end); every span is the file's bytes."""
    file = remote()
    file.read_many([(1000, 9000)], hold=True)
    file.read_many([(9000, 30_000)])  # two cached chunks, end to end; the second not held
    chunk_reads, read_chunk = [], file._read_chunk
    monkeypatch.setattr(file, "_read_chunk", lambda a, b, *rest: chunk_reads.append((a, b)) or read_chunk(a, b, *rest))
    ahead = [(1500, 8000), (1000, 9000)]
    got = file.read_many(ahead)
    assert [bytes(got[s]) for s in ahead] == [fetched(hub, *s) for s in ahead] and chunk_reads == []
    spans = [(1500, 8000), (18_000, 25_000), (8000, 25_000)]
    for reader in (file, remote()):  # the held range let go; a new reader has fetched nothing
        got = reader.read_many(spans)
        assert [bytes(got[s]) for s in spans] == [fetched(hub, *s) for s in spans]
    assert chunk_reads == [(1000, 9000), (9000, 30_000), (1000, 9000), (9000, 30_000)]
    assert ranges(hub) == ["bytes=1000-8999", "bytes=9000-29999"]  # nothing fetched twice


def test_a_file_written_once_is_on_the_disk_and_out_of_the_page_cache(tmp_path):
    path, data = tmp_path / "w.bin", np.random.default_rng(2).bytes(16 * mmap.PAGESIZE)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        assert resident_bytes(path) == len(data)  # written pages are cached until given back
        pages.written(f.fileno())
    assert resident_bytes(path) == 0 and path.read_bytes() == data


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
def test_a_range_s_whole_blocks_go_to_the_disk_straight_from_a_pooled_buffer(tmp_path, monkeypatch, size):
    """pages.write_once: the file holds the bytes whole. From a pooled buffer (it starts on a page) its whole blocks
    are written with O_DIRECT, the rest through the page cache; from memory off a block, all of it through the page
    cache; and where the file system refuses O_DIRECT, all of it through the page cache too."""
    import errno

    from headforms.extract.transport.buffers import BufferPool

    direct, real = [], pages._direct_write
    monkeypatch.setattr(pages, "_direct_write", lambda fd, data: direct.append(len(data)) or real(fd, data))
    data = np.random.default_rng(size).bytes(size)
    pooled = BufferPool().empty(size, np.uint8)
    pooled[:] = np.frombuffer(data, np.uint8)
    pages.write_once(tmp_path / "pooled", memoryview(pooled))
    assert (tmp_path / "pooled").read_bytes() == data
    assert direct == ([size // pages.BLOCK * pages.BLOCK] if size >= pages.BLOCK else [])
    off = bytearray(size + 1)
    off[1:] = data
    pages.write_once(tmp_path / "off", memoryview(off)[1:])
    assert (tmp_path / "off").read_bytes() == data and len(direct) == (size >= pages.BLOCK)

    def refused(*args):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(pages.os, "pwrite", refused)
    pages.write_once(tmp_path / "refused", memoryview(pooled))
    assert (tmp_path / "refused").read_bytes() == data


def test_a_fetched_range_is_cached_on_the_disk_out_of_the_page_cache(hub):
    """A range is written to the cache once, not read back in the run: its chunk file holds its bytes, flushed, and
    none of its pages stay in the page cache (pages.written)."""
    file = remote()
    file.read_many([(0, 90_000)])
    chunk = file.chunks / "0-90000"
    assert resident_bytes(chunk) == 0 and chunk.read_bytes() == fetched(hub, 0, 90_000)


def test_a_prefix_is_a_cached_chunk_grown_without_refetching_or_rewriting(hub, monkeypatch):
    """A prefix is the chunk its fetch wrote; a shorter or equal one reads and writes nothing; a longer one fetches
    only the bytes past it and is written whole."""
    file, writes, write = remote(), [], hub_module._write_atomic
    monkeypatch.setattr(hub_module, "_write_atomic",
                        lambda path, data, **kw: writes.append(path.name) or write(path, data, **kw))
    first = file.prefix_path(100)
    assert first.read_bytes() == fetched(hub, 0, 100) and hub.served["blob.bin"] == 100 and writes == ["0-100"]
    reads = []
    with monkeypatch.context() as m:
        m.setattr(file, "read_many", lambda spans, **kw: reads.append(spans))
        assert file.prefix_path(60) == first and file.prefix_path(100) == first
    assert reads == [] and writes == ["0-100"]
    again = HubRepo("org/r", file.repo.commit, file.repo.files).file("blob.bin")  # lists the cache afresh
    grown = again.prefix_path(300)
    assert grown.read_bytes() == fetched(hub, 0, 300) and hub.served["blob.bin"] == 300  # only bytes 100-300 came
    assert writes == ["0-100", "100-300", "0-300"] and again.prefix_path(250) == grown == first.with_name("0-300")


# The seekable reader zipfile uses ------------------------------------------------------------------------------

def test_the_range_reader_reads_and_seeks_as_bytesio_does(hub):
    reader, reference = hub_module.RangeReader(remote()), io.BytesIO(fetched(hub, 0, SIZE))
    assert reader.seekable() and reader.tell() == reference.tell() == 0
    assert reader.read(5) == reference.read(5)
    rng = np.random.default_rng(3)
    for _ in range(80):
        whence = int(rng.integers(3))
        offset = (int(rng.integers(0, SIZE + 50)), int(rng.integers(-min(400, reference.tell()), 400)),
                  int(rng.integers(-400, 50)))[whence]
        assert reader.seek(offset, whence) == reference.seek(offset, whence)
        n = (None, -1, 0, int(rng.integers(1, 900)))[int(rng.integers(4))]
        assert reader.read(n) == reference.read(n) and reader.tell() == reference.tell()
    reader.seek(SIZE + 10)
    assert reader.read() == b"" and reader.read(3) == b""


# The resolved repo and the cache ------------------------------------------------------------------------------

def test_a_resolved_repo_lists_every_file_with_its_size_and_blob_even_an_empty_one(hub):
    """A file's size and blob id (an LFS file's SHA-256) from the hub's table; its ranges are cached under the id."""
    repo = HubRepo.resolve("org/r", None)
    data = hub.repos["org/r"]["blob.bin"]
    assert repo.files == {"blob.bin": (SIZE, hub.sha256(data)), ".gitattributes": (0, hub.blob_id(b""))}
    assert repo.file(".gitattributes").read_at(0, 0) == b""
    assert repo.file("blob.bin").chunks == repo.folder / "blobs" / hub.sha256(data)


def test_a_gated_repo_says_how_to_get_in(hub):
    hub.gated.add("org/r")
    with pytest.raises(ExtractError, match=r"^'org/r' is gated on the Hugging Face hub: accept its terms on the model "
                                           r"page and log in \(`hf auth login`\)$"):
        HubRepo.resolve("org/r", None)


def test_a_hub_that_does_not_answer_in_time_falls_back_to_the_cache(hub, monkeypatch):
    """Model info that takes longer than TIMEOUT: the cached table when there is one, else the timeout, named."""
    monkeypatch.setattr(hub_module, "TIMEOUT", 0.2)
    hub.api_stall = 0.6
    with pytest.raises(ExtractError, match=r"^'org/r' is not in the headforms cache \(.+\) and the hub cannot be "
                                           r"reached \(ReadTimeout: .+\)$"):
        HubRepo.resolve("org/r", None)
    hub.api_stall = 0.0
    online = HubRepo.resolve("org/r", None)
    hub.api_stall = 0.6
    cached = HubRepo.resolve("org/r", None)
    assert (cached.commit, cached.files) == (online.commit, online.files)


def test_the_cache_without_a_file_table_or_revision_says_what_is_missing(hub, monkeypatch):
    repo = HubRepo.resolve("org/r", None)
    monkeypatch.setattr(importlib.import_module("huggingface_hub.constants"), "HF_HUB_OFFLINE", True)
    cached = HubRepo.resolve("org/r", None)
    assert (cached.commit, cached.files) == (repo.commit, repo.files)
    with pytest.raises(ExtractError, match=r"^'org/r' at v2 is in neither the Hugging Face cache \(.+\) nor the "
                                           r"headforms cache \(.+\) and HF_HUB_OFFLINE "
                                           r"is set$"):
        HubRepo.resolve("org/r", "v2")
    (repo.folder / "files.json").unlink()  # the ref names a commit whose table is gone
    with pytest.raises(ExtractError, match=r"^'org/r' is in neither the Hugging Face cache"):
        HubRepo.resolve("org/r", None)


def disk_bytes(folder) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(folder) for f in names)


def test_cache_usage_and_clearing_count_the_bytes_on_disk(hub):
    r, s = remote(), remote("other.bin", "org/s")
    r.read_many([(0, 500), (900, 1000)])
    s.read_at(0, 3000)
    usage = {row["repo"]: row for row in hub_module.cache_usage()}
    assert {k: (v["commit"], v["files"], v["bytes"]) for k, v in usage.items()} == {
        "org/r": (r.repo.commit, 1, 600), "org/s": (s.repo.commit, 1, 3000)}
    r_folder, s_folder = hub_module._repo_dir("org/r"), hub_module._repo_dir("org/s")
    expected = disk_bytes(r_folder)
    assert hub_module.clear_cache("org/r") == expected and not r_folder.exists() and s_folder.is_dir()
    assert hub_module.clear_cache("org/r") == 0
    remote().read_at(0, 700)
    expected = disk_bytes(r_folder) + disk_bytes(s_folder)
    assert hub_module.clear_cache() == expected and not r_folder.exists() and not s_folder.exists()
    assert hub_module.cache_usage() == []
