"""A fault-injecting HTTP proxy for a Cloud Storage emulator: the next N matching uploads (or requests) get a 5xx.

Put it in front of gcp-storage-emulator and hand its `url` to whoever should see the faults (e.g. the TPU API
emulator's `gcs_endpoint`, so that only the emulated VMs talk through it):

    with FlakyProxy("http://127.0.0.1:9023") as proxy:
        proxy.fail_uploads(r"/checkpoints/", count=3)             # 503 to the next 3 checkpoint uploads
        proxy.fail_uploads(r"/checkpoints/", 2, per_object=True)  # ... or to the first 2 of each checkpoint
        proxy.fail_requests(r"/o/.*/exit/", 1, method="GET")      # 503 to the next read of an exit record
        proxy.slow_answers(r"prefix=[^&]*/exit/", 3.0)            # listings of exit/ answered 3 s late
        proxy.outage("blackhole", seconds=150)                      # nothing answered for 150 s (a black hole)
        proxy.outage("reset")                                       # every connection reset, until heal()
        emulator = TpuEmulator(workdir=..., gcs_endpoint=proxy.url)

An upload is a POST or PUT under /upload/storage/v1/; its object name comes from the `name` query parameter
(simple and resumable uploads) or from the JSON metadata part of a multipart upload (what google-cloud-storage
sends for small files). A resumable session's later PUTs carry no name: they are matched by the session they
belong to. `fail_requests` fails any request, by method and path; `slow_answers` holds answers back; `outage` makes
Cloud Storage unreachable: a black hole holds every request without an answer (the client waits for its own
timeout), a reset closes each connection at once; `heal` ends every outage. Everything else is forwarded unchanged,
Location headers rewritten so that a client stays on the proxy. Every request is recorded (time, method, path,
object name, bytes sent and received, status, whether it was injected; status 0 for a request that got no answer).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

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
    status: int  # 0: no answer (an outage)
    injected: bool
    size: int = 0  # bytes of the request's body: what a client sent to Cloud Storage
    received: int = 0  # bytes of the answer's body: what a client read from Cloud Storage


@dataclass
class UploadFault:
    pattern: str  # regular expression searched in the object name
    count: int  # how many more matching uploads get `status` (per object name when per_object)
    status: int = 503
    per_object: bool = False
    fired: int = 0
    _per_name: dict[str, int] = field(default_factory=dict)

    def take(self, name: str) -> bool:
        if not re.search(self.pattern, name):
            return False
        if self.per_object:
            used = self._per_name.get(name, 0)
            if used >= self.count:
                return False
            self._per_name[name] = used + 1
        else:
            if self.count <= 0:
                return False
            self.count -= 1
        self.fired += 1
        return True


@dataclass
class RequestFault:
    pattern: str  # regular expression searched in the URL-decoded request path and query
    count: int  # how many more matching requests get `status`
    method: str | None = None  # only requests with this method
    status: int = 503
    fired: int = 0

    def take(self, method: str, target: str) -> bool:
        if self.count <= 0 or not _request_matches(self.pattern, self.method, method, target):
            return False
        self.count -= 1
        self.fired += 1
        return True


@dataclass
class Latency:
    pattern: str  # regular expression searched in the URL-decoded request path and query
    seconds: float  # how long the answer is held back, after the upstream has answered
    method: str | None = None

    def matches(self, method: str, target: str) -> bool:
        return _request_matches(self.pattern, self.method, method, target)


@dataclass
class Outage:
    """Cloud Storage unreachable for requests matching `pattern` (as for fail_requests): `blackhole` holds them
    without an answer until the outage ends (then drops the connection), `reset` resets each connection at once."""

    mode: Literal["blackhole", "reset"]
    pattern: str = ".*"
    until: float | None = None  # time.monotonic() at which it ends by itself; None: until heal()
    method: str | None = None
    hits: int = 0

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until


def _request_matches(pattern: str, wanted_method: str | None, method: str, target: str) -> bool:
    """The request's method is `wanted_method` (any when None) and its URL-decoded path and query match `pattern`."""
    if wanted_method and wanted_method.upper() != method.upper():
        return False
    return re.search(pattern, unquote(target)) is not None


def _checked(pattern: str, status: int = 503) -> None:
    re.compile(pattern)  # a bad pattern fails here, not in the proxy's thread
    if not 500 <= status <= 599:
        raise ValueError("status must be a 5xx")


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


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closes its keep-alive connection is not an error worth a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


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
        self._request_faults: list[RequestFault] = []
        self._latencies: list[Latency] = []
        self._outages: list[Outage] = []
        self._healed = threading.Event()
        self._sessions: dict[str, str] = {}  # resumable upload_id -> object name
        self._requests: list[ProxiedRequest] = []
        self._server = _Server((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> FlakyProxy:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="flaky-proxy", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self.heal()  # nothing held in a black hole keeps a handler thread (and the shutdown) waiting
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

    def fail_uploads(self, pattern: str, count: int, status: int = 503, *, per_object: bool = False) -> UploadFault:
        """The next `count` uploads whose object name matches `pattern` (re.search) are answered `status`; with
        `per_object`, the first `count` uploads of every matching object are."""
        _checked(pattern, status)
        fault = UploadFault(pattern, count, status, per_object)
        with self._lock:
            self._faults.append(fault)
        return fault

    def fail_requests(self, pattern: str, count: int, *, method: str | None = None, status: int = 503) -> RequestFault:
        """The next `count` requests (of `method`, if given) whose URL-decoded path and query match `pattern`
        (re.search) are answered `status`: reads, metadata checks, deletes, anything."""
        _checked(pattern, status)
        fault = RequestFault(pattern, count, method, status)
        with self._lock:
            self._request_faults.append(fault)
        return fault

    def slow_answers(self, pattern: str, seconds: float, *, method: str | None = None) -> Latency:
        """Requests matching `pattern` (as for fail_requests) are forwarded at once, and their answer is held back
        `seconds`: the caller learns late what was true when it asked."""
        _checked(pattern)
        latency = Latency(pattern, float(seconds), method)
        with self._lock:
            self._latencies.append(latency)
        return latency

    def outage(
        self,
        mode: Literal["blackhole", "reset"],
        *,
        seconds: float | None = None,
        pattern: str = ".*",
        method: str | None = None,
    ) -> Outage:
        """From now on, for `seconds` (None: until `heal`), requests matching `pattern` reach nothing: a black hole
        (`blackhole`: no answer, the connection dropped when the outage ends) or a connection reset (`reset`)."""
        _checked(pattern)
        if mode not in ("blackhole", "reset"):
            raise ValueError("mode must be 'blackhole' or 'reset'")
        until = None if seconds is None else time.monotonic() + float(seconds)
        outage = Outage(mode, pattern, until, method)
        with self._lock:
            self._healed.clear()
            self._outages.append(outage)
        return outage

    def heal(self) -> None:
        """End every outage now; requests held in a black hole lose their connection."""
        with self._lock:
            self._outages.clear()
            self._healed.set()

    def _outage(self, method: str, target: str) -> Outage | None:
        now = time.monotonic()
        with self._lock:
            self._outages = [o for o in self._outages if o.active(now)]
            for outage in self._outages:
                if _request_matches(outage.pattern, outage.method, method, target):
                    outage.hits += 1
                    return outage
        return None

    def _hold(self, outage: Outage) -> None:
        """A black hole: nothing comes back until the outage ends (or the proxy stops)."""
        wait = None if outage.until is None else max(0.0, outage.until - time.monotonic())
        self._healed.wait(wait)

    def _latency(self, method: str, target: str) -> float:
        with self._lock:
            return sum(x.seconds for x in self._latencies if x.matches(method, target))

    @property
    def requests(self) -> list[ProxiedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def injected(self) -> list[ProxiedRequest]:
        return [r for r in self.requests if r.injected]

    def _take(self, method: str, target: str, name: str | None) -> UploadFault | RequestFault | None:
        with self._lock:
            for fault in self._faults:
                if name is not None and fault.take(name):
                    return fault
            for request_fault in self._request_faults:
                if request_fault.take(method, target):
                    return request_fault
        return None

    def _record(self, request: ProxiedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    # -- forwarding ---------------------------------------------------------------------------------------------

    def _name_of(self, method: str, target: str, body: bytes, content_type: str) -> str | None:
        name = upload_object_name(method, target, body, content_type)
        if name is None and method in ("PUT", "POST"):
            upload_id = (parse_qs(urlsplit(target).query).get("upload_id") or [""])[-1]
            if upload_id:
                with self._lock:
                    name = self._sessions.get(upload_id)
        return name

    def _remember_session(self, name: str | None, headers: list[tuple[str, str]]) -> None:
        for key, value in headers:
            if key.lower() == "location" and name:
                upload_id = (parse_qs(urlsplit(value).query).get("upload_id") or [""])[-1]
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
                outage = proxy._outage(self.command, self.path)
                if outage is not None:
                    proxy._record(ProxiedRequest(arrived, self.command, self.path, name, 0, True, len(body)))
                    if outage.mode == "blackhole":
                        proxy._hold(outage)
                    # No answer: a linger of 0 makes the close a reset (RST), as from a dead middlebox.
                    with contextlib.suppress(OSError):
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                fault = proxy._take(self.command, self.path, name)
                if fault is not None:
                    payload = json.dumps(
                        {
                            "error": {
                                "code": fault.status,
                                "message": f"Injected {fault.status} for {name or self.path} (flaky proxy)",
                                "errors": [{"reason": "backendError", "message": "injected"}],
                            }
                        }
                    ).encode()
                    proxy._record(ProxiedRequest(arrived, self.command, self.path, name, fault.status, True, len(body)))
                    self._answer(fault.status, [("Content-Type", "application/json")], payload)
                    return
                try:
                    status, up_headers, data = proxy._forward(self.command, self.path, headers, body)
                except OSError as exc:
                    payload = json.dumps({"error": {"code": 502, "message": f"upstream unreachable: {exc}"}}).encode()
                    proxy._record(ProxiedRequest(arrived, self.command, self.path, name, 502, False, len(body)))
                    self._answer(502, [("Content-Type", "application/json")], payload)
                    return
                if (hold := proxy._latency(self.command, self.path)) > 0:
                    time.sleep(hold)
                proxy._remember_session(name, up_headers)
                proxy._record(
                    ProxiedRequest(arrived, self.command, self.path, name, status, False, len(body), len(data))
                )
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
