"""A fault-injecting HTTP proxy for a Cloud Storage emulator: the next N uploads of matching objects get a 5xx.

Put it in front of gcp-storage-emulator and hand its `url` to whoever should see the faults (e.g. the TPU API
emulator's `gcs_endpoint`, so that only the emulated VMs talk through it):

    with FlakyProxy("http://127.0.0.1:9023") as proxy:
        proxy.fail_uploads(r"/checkpoints/", count=3)          # 503 to the next 3 checkpoint uploads
        emulator = TpuEmulator(workdir=..., gcs_endpoint=proxy.url)

An upload is a POST or PUT under /upload/storage/v1/; its object name comes from the `name` query parameter
(simple and resumable uploads) or from the JSON metadata part of a multipart upload (what google-cloud-storage
sends for small files). A resumable session's later PUTs carry no name: they are matched by the session they
belong to. Everything else is forwarded unchanged, Location headers rewritten so a client stays on the proxy.
Every request is recorded (time, method, path, object name, status, whether it was injected).
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}
_MULTIPART_NAME = re.compile(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ProxiedRequest:
    time: float
    method: str
    path: str
    object_name: str | None  # the object an upload writes; None for anything else
    status: int
    injected: bool


@dataclass
class UploadFault:
    pattern: str  # regular expression searched in the object name
    count: int  # how many more matching uploads get `status`
    status: int = 503
    fired: int = 0


def upload_object_name(method: str, target: str, body: bytes, content_type: str = "") -> str | None:
    """The object name an upload request writes, or None when the request is not the start of an upload."""
    if method not in ("POST", "PUT"):
        return None
    url = urlsplit(target)
    if not url.path.startswith("/upload/storage/v1/"):
        return None
    query = parse_qs(url.query)
    if "name" in query:
        return query["name"][-1]
    kind = (query.get("uploadType") or [""])[-1]
    if kind == "resumable" and body:
        try:
            meta = json.loads(body)
            return str(meta["name"]) if isinstance(meta, dict) and "name" in meta else None
        except ValueError:
            return None
    if kind == "multipart" or "multipart/" in content_type:
        match = _MULTIPART_NAME.search(body[:65536])
        if match:
            try:
                return json.loads(b'"' + match.group(1) + b'"')
            except ValueError:
                return match.group(1).decode(errors="replace")
    return None


class FlakyProxy:
    """An HTTP proxy on loopback in front of `upstream` (http://host:port) that can fail chosen uploads."""

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self._up_host, self._up_port = parts.hostname, parts.port or 80
        self._lock = threading.Lock()
        self._faults: list[UploadFault] = []
        self._sessions: dict[str, str] = {}  # resumable upload_id -> object name
        self._requests: list[ProxiedRequest] = []
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FlakyProxy:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="flaky-proxy", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FlakyProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- faults and records -------------------------------------------------------------------------------------

    def fail_uploads(self, pattern: str, count: int, status: int = 503) -> UploadFault:
        """The next `count` uploads whose object name matches `pattern` (re.search) are answered `status`."""
        re.compile(pattern)
        if not 500 <= status <= 599:
            raise ValueError("status must be a 5xx")
        fault = UploadFault(pattern, count, status)
        with self._lock:
            self._faults.append(fault)
        return fault

    @property
    def requests(self) -> list[ProxiedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def injected(self) -> list[ProxiedRequest]:
        return [r for r in self.requests if r.injected]

    def _take(self, name: str | None) -> UploadFault | None:
        if name is None:
            return None
        with self._lock:
            for fault in self._faults:
                if fault.count > 0 and re.search(fault.pattern, name):
                    fault.count -= 1
                    fault.fired += 1
                    return fault
        return None

    def _record(self, request: ProxiedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    # -- forwarding ---------------------------------------------------------------------------------------------

    def _name_of(self, method: str, target: str, body: bytes, content_type: str) -> str | None:
        name = upload_object_name(method, target, body, content_type)
        if name is None and method in ("PUT", "POST"):
            upload_id = (parse_qs(urlsplit(target).query).get("upload_id") or [None])[-1]
            if upload_id:
                with self._lock:
                    name = self._sessions.get(upload_id)
        return name

    def _remember_session(self, name: str | None, headers: list[tuple[str, str]]) -> None:
        for key, value in headers:
            if key.lower() == "location" and name:
                upload_id = (parse_qs(urlsplit(value).query).get("upload_id") or [None])[-1]
                if upload_id:
                    with self._lock:
                        self._sessions[upload_id] = name

    def _rewrite_location(self, value: str) -> str:
        for prefix in (self.upstream, f"http://localhost:{self._up_port}", f"http://0.0.0.0:{self._up_port}"):
            if value.startswith(prefix):
                return self.url + value[len(prefix) :]
        return value

    def _forward(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, Any, bytes]:
        conn = http.client.HTTPConnection(self._up_host, self._up_port, timeout=120)
        try:
            out = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
            out["Host"] = f"{self._up_host}:{self._up_port}"
            if body or method in ("POST", "PUT", "PATCH"):
                out["Content-Length"] = str(len(body))
            conn.request(method, target, body=body or None, headers=out)
            response = conn.getresponse()
            data = response.read()
            return response.status, response.getheaders(), data
        finally:
            conn.close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "flaky-proxy/1"

            def log_message(self, format: str, *args: Any) -> None:  # recorded instead
                pass

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            break
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    return b"".join(chunks)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length > 0 else b""

            def _serve(self) -> None:
                arrived = time.time()
                body = self._read_body()
                headers = dict(self.headers.items())
                name = proxy._name_of(self.command, self.path, body, self.headers.get("Content-Type", ""))
                fault = proxy._take(name)
                if fault is not None:
                    payload = json.dumps(
                        {
                            "error": {
                                "code": fault.status,
                                "message": f"Injected {fault.status} for {name} (flaky proxy)",
                                "errors": [{"reason": "backendError", "message": "injected"}],
                            }
                        }
                    ).encode()
                    proxy._record(ProxiedRequest(arrived, self.command, self.path, name, fault.status, True))
                    self._answer(fault.status, [("Content-Type", "application/json")], payload)
                    return
                try:
                    status, up_headers, data = proxy._forward(self.command, self.path, headers, body)
                except OSError as exc:
                    payload = json.dumps({"error": {"code": 502, "message": f"upstream unreachable: {exc}"}}).encode()
                    proxy._record(ProxiedRequest(arrived, self.command, self.path, name, 502, False))
                    self._answer(502, [("Content-Type", "application/json")], payload)
                    return
                proxy._remember_session(name, up_headers)
                proxy._record(ProxiedRequest(arrived, self.command, self.path, name, status, False))
                kept = [
                    (k, proxy._rewrite_location(v) if k.lower() == "location" else v)
                    for k, v in up_headers
                    if k.lower() not in _HOP_BY_HOP
                ]
                self._answer(status, kept, data, head=self.command == "HEAD")

            def _answer(self, status: int, headers: list[tuple[str, str]], data: bytes, head: bool = False) -> None:
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head and data:
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

        return Handler
