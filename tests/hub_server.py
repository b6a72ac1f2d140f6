"""A local stand-in for the Hugging Face hub's HTTP API (HF_ENDPOINT): model info (file metadata only when
asked, `?blobs=true`, as the hub does), file resolve with Range support, gated repos, per-file byte counts,
fault injection and a bandwidth cap; over plain HTTP, or over TLS as the hub and its CDN are."""
from __future__ import annotations

import hashlib
import json
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubHandler(BaseHTTPRequestHandler):
    """GET /api/models/REPO[/revision/REV], GET/HEAD /REPO/resolve/REV/PATH (Range: bytes=a-b); with a CDN, an LFS
    file's resolve answers 302 to the CDN's /cdn/REPO/COMMIT/PATH, served alike. A request a client sends to a
    proxy (its target a whole URL) is served as the one for that URL's path: a server can stand for a proxy too."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: without this each reply waits for an ACK
    server: HubServer

    def log_message(self, *args):
        pass

    def _head(self, status: int, headers: dict, length: int) -> None:
        """The status line and headers of a reply whose body is `length` bytes."""
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _reply(self, status: int, body: bytes = b"", headers: dict | None = None):
        self._head(status, headers or {}, len(body))
        if self.command == "GET":
            self.wfile.write(body)

    def do_GET(self):
        hub = self.server
        hub.targets.append(self.path)
        path, _, query = re.sub(r"^https?://[^/]+", "", self.path).partition("?")
        hub.requests.append((self.command, path, self.headers.get("Range")))
        hub.request_headers.append(dict(self.headers))
        info = re.fullmatch(r"/api/models/(.+?)(?:/revision/([^/]+))?", path)
        if info:
            repo_id, revision = info[1], info[2] and unquote(info[2])
            time.sleep(hub.api_stall)
            if repo_id not in hub.repos and repo_id not in hub.revisions:
                return self._reply(404, b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound"})
            if repo_id in hub.gated:
                return self._reply(403, b'{"error": "gated"}', {"X-Error-Code": "GatedRepo"})
            found = hub.checkout(repo_id, revision)
            if found is None:
                return self._reply(404, b'{"error": "no revision"}', {"X-Error-Code": "RevisionNotFound"})
            commit, files = found
            blobs = parse_qs(query).get("blobs", [""])[0].lower() == "true"
            siblings = [{"rfilename": name} | ({"size": hub.size(data), "blobId": hub.blob_id(data)} | (
                {"lfs": {"size": hub.size(data), "sha256": hub.sha256(data), "pointerSize": 134}} if hub.is_lfs(name)
                else {}) if blobs else {}) for name, data in files.items()]
            body = json.dumps({"id": repo_id, "sha": commit, "siblings": siblings}).encode()
            return self._reply(200, body, {"Content-Type": "application/json"})
        resolve = re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", path) or re.fullmatch(r"/cdn/(.+?)/([0-9a-f]{40})/(.+)",
                                                                                     path)
        found = resolve and hub.checkout(resolve[1], resolve[2])
        if not found or resolve[3] not in found[1]:
            return self._reply(404, b"not found", {"X-Error-Code": "EntryNotFound"})
        name = resolve[3]
        commit, data = found[0], found[1][name]
        if hub.cdn is not None and hub.is_lfs(name):  # the hub sends LFS files from its CDN, another origin
            return self._reply(302, b"", {
                "Location": f"{hub.cdn.endpoint}/cdn/{resolve[1]}/{commit}/{name}?X-Amz-Signature=local",
                "X-Repo-Commit": commit, "X-Linked-Size": str(hub.size(data)),
                "X-Linked-Etag": f'"{hub.sha256(data)}"'})
        fault = hub.faults.pop(0) if hub.faults and self.command == "GET" else None
        if fault and fault.isdigit():
            return self._reply(int(fault), b"busy", {"Retry-After": str(hub.retry_after)} if fault == "429" else {})
        if fault == "stall":  # nothing for longer than the client waits
            time.sleep(hub.stall)
        size = hub.size(data)
        start, end, status = 0, size, 200
        if self.headers.get("Range") and fault != "whole":
            a, b = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers["Range"]).groups()
            start, end, status = int(a), min(size, int(b) + 1 if b else size), 206
        if hub.refuse is not None and hub.refuse(name, start, end):
            return self._reply(503, b"unavailable")
        headers = {"X-Repo-Commit": commit, "ETag": f'"{hub.blob_id(data)}"', "Accept-Ranges": "bytes"}
        if status == 206 and fault != "norange":
            shift = fault == "range"  # the range after the one asked for
            headers["Content-Range"] = f"bytes {start + shift}-{end - 1 + shift}/{size}"
        if isinstance(data, Path) and fault is None and hub.bandwidth is None:
            return self._send_file(status, headers, name, data, start, end)
        body = hub.read(data, start, end)
        if fault == "short":  # a body that ends early but says so in its length: the client must notice
            body = body[:len(body) // 2]
        if fault == "long":  # more bytes than the range holds
            body = bytes(body) + bytes(16)
        self._head(status, headers, len(body) if fault != "drop" else end - start)
        if self.command != "GET":
            return
        if fault == "drop":  # half the body, then the connection goes
            body = body[:len(body) // 2]
        hub.send(self.wfile, name, body)
        if fault == "drop":
            self.close_connection = True
            self.wfile.flush()
            self.connection.shutdown(2)

    def _send_file(self, status: int, headers: dict, name: str, path: Path, start: int, end: int) -> None:
        """A file's range by sendfile: the kernel copies it from the page cache to the socket, so that the server,
        sharing the machine with the client it serves, spends little of its CPU (a remote hub spends none of it)."""
        self._head(status, headers, end - start)
        if self.command != "GET":
            return
        with open(path, "rb") as f:
            self.server.count(name, end - start)  # before the client can have them (see HubServer.send)
            sent = 0
            try:
                sent = self.connection.sendfile(f, start, end - start)
            finally:
                self.server.count(name, sent - (end - start))

    do_HEAD = do_GET


class HubServer(ThreadingHTTPServer):
    """The hub on a local port: fill .repos (repo -> file -> bytes or Path, main at COMMIT) or .revisions
    (repo -> revision -> (commit, files)), read .served (file -> body bytes)."""

    daemon_threads = True

    def __init__(self, bandwidth: float | None = None, tls: ssl.SSLContext | None = None):
        """`tls`: a server context holding the certificate it answers with (https://), else plain HTTP."""
        super().__init__(("127.0.0.1", 0), HubHandler)
        if tls is not None:  # each connection's handshake is made as it is accepted
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.scheme = "http" if tls is None else "https"
        self.repos: dict[str, dict[str, bytes | Path]] = {}
        self.revisions: dict[str, dict[str, tuple[str, dict[str, bytes | Path]]]] = {}
        self.served: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.targets: list[str] = []  # each request's target as sent: a path, or a whole URL when sent to a proxy
        # applied to the next file GETs, in order: "drop" (half the body, then the connection goes), "short" (half the
        # body, its length saying so), "long" (16 bytes too many), "range" (a Content-Range one byte on), "norange" (none), "whole" (the
        # Range ignored: 200 and the whole file), "stall" (.stall seconds before replying), or an HTTP status ("503")
        self.faults: list[str] = []
        self.retry_after = 1          # the Retry-After of a 429, seconds
        self.stall = 0.0
        self.api_stall = 0.0          # seconds every model-info request waits before its reply
        self.gated: set[str] = set()  # repos whose model info answers 403 GatedRepo
        self.request_headers: list[dict[str, str]] = []
        self.refuse = None            # (file, start, end) -> True: that request gets a 503, every time
        # another HubServer sharing .repos (and so another origin, as the hub's CDN is): LFS files are redirected to it
        self.cdn: HubServer | None = None
        self.bandwidth = bandwidth    # bytes per second over all connections, None: unlimited
        self._lock = threading.Lock()
        self._next_free = 0.0
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def handle_error(self, request, client_address):
        """A client that hangs up mid-reply (retries, injected drops) is routine here, not worth a traceback."""

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_port}"

    def checkout(self, repo_id: str, revision: str | None) -> tuple[str, dict[str, bytes | Path]] | None:
        """(commit, files) of a repo at a revision, named or by its commit (None: main); None when unknown."""
        revisions = self.revisions.get(repo_id, {})
        if repo_id in self.repos:
            revisions = revisions | {"main": (COMMIT, self.repos[repo_id])}
        return next((found for name, found in revisions.items() if (revision or "main") in (name, found[0])), None)

    @staticmethod
    def size(data: bytes | Path) -> int:
        return data.stat().st_size if isinstance(data, Path) else len(data)

    @staticmethod
    def blob_id(data: bytes | Path) -> str:
        return hashlib.sha1(str(data).encode() if isinstance(data, Path) else data).hexdigest()

    @staticmethod
    def is_lfs(name: str) -> bool:
        """Weight files are stored with Git LFS (their sibling entry has an `lfs` object), small text files are not."""
        return name.endswith((".safetensors", ".bin", ".gguf"))

    @staticmethod
    def sha256(data: bytes | Path) -> str:
        return hashlib.sha256(str(data).encode() if isinstance(data, Path) else data).hexdigest()

    @staticmethod
    def read(data: bytes | Path, start: int, end: int) -> bytes | memoryview:
        """A body: a view of bytes held in memory (no copy, so the server adds nothing to a client's traced
        memory), or the range read from a file."""
        if not isinstance(data, Path):
            return memoryview(data)[start:end]
        with open(data, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def send(self, out, name: str, body: bytes, block: int = 1 << 20) -> None:
        """Write a body in blocks, counting the bytes per file and keeping to the bandwidth cap."""
        for i in range(0, len(body), block):
            part = body[i:i + block]
            if self.bandwidth:
                with self._lock:  # this block's slot ends when the link has carried it after those before
                    now = time.monotonic()
                    self._next_free = max(self._next_free, now) + len(part) / self.bandwidth
                    delay = self._next_free - now
                time.sleep(delay)
            self.count(name, len(part))  # before the client can have them: a test that reads .served once its read
            try:                         # returned sees them, whenever this thread runs again (a loaded machine)
                out.write(part)
            except BaseException:
                self.count(name, -len(part))
                raise

    def count(self, name: str, sent: int) -> None:
        """Add bytes of a file's body sent to .served."""
        with self._lock:
            self.served[name] = self.served.get(name, 0) + sent

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def serve_hub(monkeypatch, tmp_path, *, hf_home: bool = True, tls: ssl.SSLContext | None = None) -> HubServer:
    """A HubServer on a local port that huggingface_hub and headforms use (online, fast retries), with the
    headforms range cache (and, with hf_home, HF_HOME and HF_HUB_CACHE) in tmp_path; the caller closes it."""
    import importlib

    from headforms.extract.transport import hub as hub_module

    server = HubServer(tls=tls)
    constants = importlib.import_module("huggingface_hub.constants")
    monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HEADFORMS_CACHE", str(tmp_path / "cache"))
    if hf_home:
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setattr(hub_module, "BACKOFF", 0.01)
    return server
