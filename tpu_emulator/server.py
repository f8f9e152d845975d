"""The HTTP side: a threading stdlib server, requests and answers as data, and the Cloud TPU v2 REST routes.

Routes are the google-cloud-tpu REST transport's (every one under /v2/). Every request first brings the cloud's
state up to now (Cloud.settle: the state is a function of elapsed time). Before a route runs, injected HTTP
errors, rate limits and permission denials get their turn; an ApiError becomes Google's JSON error, anything else
a 500. Answers are rendered through the API's protobuf types (tpu_emulator.codec).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from runner.plan import catalog
from tpu_emulator import codec, discovery, errors
from tpu_emulator.errors import ApiError, not_found
from tpu_emulator.faults import Faults
from tpu_emulator.resources import project_number
from tpu_emulator.state import After, Cloud
from tpu_emulator.stderr import note

SEG = r"([^/:]+)"
_PROJECT = re.compile(r"^/v2/projects/([^/]+)")
PARENT = rf"/v2/projects/{SEG}/locations/{SEG}"
# Real routes the emulator does not serve (another method, or a collection it does not keep): 501, not 404.
NOT_EMULATED = re.compile(
    r"^/v2/projects/[^/]+/locations(/[^/]+(/(nodes|queuedResources|operations|acceleratorTypes|runtimeVersions)"
    r"(/[^/]+)?)?)?$"
)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    after: After | None = None  # runs once the answer is sent
    method_id: str | None = None  # the discovery method the request and this answer were checked against

    @classmethod
    def json(cls, data: Any, status: int = 200, after: After | None = None) -> Response:
        return cls(status, json.dumps(data, indent=2).encode() + b"\n", after=after)

    @classmethod
    def error(cls, exc: ApiError) -> Response:
        return cls.json(exc.body(), exc.http)


@dataclass(frozen=True)
class RecordedRequest:
    """One request the emulator answered."""

    time: float  # epoch seconds when it arrived
    method: str
    path: str
    query: Mapping[str, str]
    body: Any  # the JSON body, the text when it is not JSON, None when empty
    status: int
    authorization: str | None = None
    # "<api>.<version> <revision> <method id>" when the request was checked against Google's discovery document
    # (and its answer too, when it succeeded); None where the document is not installed or no method matched.
    checked: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "method": self.method,
            "path": self.path,
            "query": dict(self.query),
            "body": self.body,
            "status": self.status,
            "authorization": self.authorization,
            "checked": self.checked,
        }


def _decode_body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tpu-emulator/1"
    timeout = 300
    server: _HttpServer

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_DELETE = do_PATCH = do_PUT = do_HEAD = do_GET

    def log_message(self, format: str, *args: Any) -> None:  # quiet: requests are recorded instead
        pass

    def _serve(self) -> None:
        arrived = time.time()
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = Request(self.command, unquote(url.path), query, headers, raw)
        try:
            response = self.server.dispatch(request)
        except Exception as exc:  # a bug: answered as Google's 500, never a dropped connection
            traceback.print_exc(file=sys.stderr)
            response = Response.error(ApiError("INTERNAL", f"Internal error in the emulator: {exc!r}"))
        # Recorded before it is answered: whoever has the answer finds the request in `requests`.
        self.server.record(
            RecordedRequest(
                arrived,
                request.method,
                request.path,
                query,
                _decode_body(raw),
                response.status,
                headers.get("authorization"),
                response.method_id,
            )
        )
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for key, value in response.headers.items():
            self.send_header(key, value)
        self.end_headers()
        with contextlib.suppress(OSError):
            if self.command != "HEAD":  # a HEAD answer has the headers of the GET, and no body
                self.wfile.write(response.body)
            self.wfile.flush()
        if response.after is not None:
            response.after()


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        dispatch: Callable[[Request], Response],
        record: Callable[[RecordedRequest], None],
    ) -> None:
        super().__init__(address, _Handler)
        self.dispatch = dispatch
        self.record = record


class HttpServer:
    """A running ThreadingHTTPServer on its own thread."""

    def __init__(
        self, host: str, port: int, dispatch: Callable[[Request], Response], record: Callable[[RecordedRequest], None]
    ) -> None:
        self._server = _HttpServer((host, port), dispatch, record)
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="tpu-emulator-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


class SchemaCheck:
    """Requests and answers of one API against its discovery document (tpu_emulator.discovery), when installed.

    A request that breaks the schema is refused with 400 INVALID_ARGUMENT before any route sees it, as Google's
    front end does. A successful answer that breaks it is the emulator's own bug: it becomes a 500 naming every
    violation, so that no test can pass on an answer the real API could not give."""

    def __init__(self, doc: discovery.Discovery | None, bodies: Mapping[str, str]) -> None:
        self.doc = doc
        self.bodies = bodies  # method id -> how violations name its body ("node", "resource")

    def label(self, method_id: str) -> str | None:
        return f"{self.doc.name}.{self.doc.version} {self.doc.revision} {method_id}" if self.doc else None

    def request(self, method_id: str, request: Request) -> discovery.Violations:
        if self.doc is None:
            return []
        try:
            body = json.loads(request.body) if request.body else None
        except ValueError:
            return []  # not JSON at all: the route's own parser says so, in the API's words
        name = self.bodies.get(method_id, "resource")
        return self.doc.check_request(method_id, request.path, request.query, body, body_name=name)

    def answer(self, method_id: str, response: Response, numeric_enums: bool) -> Response:
        response.method_id = self.label(method_id)
        if self.doc is None or not 200 <= response.status < 300 or response.content_type != "application/json":
            return response
        problems = self.doc.check_response(method_id, json.loads(response.body), numeric_enums=numeric_enums)
        if not problems:
            return response
        text = "; ".join(f"{field}: {description}" for field, description in problems)
        note(f"[emulator] answer of {method_id} breaks {self.doc.name}.{self.doc.version}: {text}")
        error = Response.error(ApiError("INTERNAL", f"The emulator's answer to {method_id} breaks the schema: {text}"))
        error.method_id, error.after = response.method_id, response.after
        return error


def _page(items: list[Any], query: Mapping[str, str], key: str, render: Callable[[Any], Any]) -> dict[str, Any]:
    try:
        size = int(query.get("pageSize") or 0)
        start = int(base64.urlsafe_b64decode(query["pageToken"]).decode()) if query.get("pageToken") else 0
    except ValueError:
        raise ApiError("INVALID_ARGUMENT", "Invalid pageSize or pageToken.") from None
    if size < 0:
        raise ApiError("INVALID_ARGUMENT", "pageSize must not be negative.")
    end = len(items) if size == 0 else start + size
    page = [render(item) for item in items[start:end]]
    out: dict[str, Any] = {key: page} if page else {}  # proto3 JSON omits an empty list
    if end < len(items):
        out["nextPageToken"] = base64.urlsafe_b64encode(str(end).encode()).decode()
    return out


# The request body's field name in each method that has one, as the API's messages name it.
_BODIES = {
    "tpu.projects.locations.nodes.create": "node",
    "tpu.projects.locations.queuedResources.create": "queued_resource",
}


def _method_path(what: str) -> str:
    return what if what.startswith("locations.") else f"locations.{what}"


def _zones() -> list[str]:
    served = [g for g in catalog.generations().values() if g.in_tpu_api]
    return sorted({z for g in served for z in (*g.single_host_zones, *g.multi_host_zones)})


class Api:
    """The /v2/ routes over a Cloud."""

    def __init__(self, cloud: Cloud, faults: Faults) -> None:
        self.cloud = cloud
        self.faults = faults
        routes: list[tuple[str, str, Callable[..., Response], str]] = [
            ("GET", rf"/v2/projects/{SEG}/locations", self.list_locations, "locations.list"),
            ("GET", PARENT, self.get_location, "locations.get"),
            ("POST", rf"{PARENT}/nodes", self.create_node, "nodes.create"),
            ("GET", rf"{PARENT}/nodes", self.list_nodes, "nodes.list"),
            ("GET", rf"{PARENT}/nodes/{SEG}", self.get_node, "nodes.get"),
            ("DELETE", rf"{PARENT}/nodes/{SEG}", self.delete_node, "nodes.delete"),
            ("GET", rf"{PARENT}/operations", self.list_operations, "operations.list"),
            ("GET", rf"{PARENT}/operations/{SEG}", self.get_operation, "operations.get"),
            ("DELETE", rf"{PARENT}/operations/{SEG}", self.delete_operation, "operations.delete"),
            ("POST", rf"{PARENT}/queuedResources", self.create_queued, "queuedResources.create"),
            ("GET", rf"{PARENT}/queuedResources", self.list_queued, "queuedResources.list"),
            ("GET", rf"{PARENT}/queuedResources/{SEG}", self.get_queued, "queuedResources.get"),
            ("DELETE", rf"{PARENT}/queuedResources/{SEG}", self.delete_queued, "queuedResources.delete"),
            ("GET", rf"{PARENT}/acceleratorTypes", self.list_types, "acceleratorTypes.list"),
            ("GET", rf"{PARENT}/acceleratorTypes/{SEG}", self.get_type, "acceleratorTypes.get"),
        ]
        # Each route is one method of tpu.v2.json: its id is tpu.projects.locations.<what>, its IAM permission
        # tpu.<what> (tpu.nodes.create).
        self.routes = [
            (method, re.compile(path + "$"), fn, f"tpu.{what}", f"tpu.projects.{_method_path(what)}")
            for method, path, fn, what in routes
        ]
        self.schema = SchemaCheck(discovery.load("tpu.v2.json"), _BODIES)

    def handle(self, request: Request) -> Response:
        with self.cloud.lock:
            self.cloud.settle()
        checked: str | None = None  # the method the request was checked against, once it was
        try:
            burst = self.faults.take("http", method=request.method, path=request.path)
            if burst is not None:
                raise ApiError.for_http(int(burst.status or 503), burst.message)
            limited = self.faults.take("rate_limit", method=request.method, path=request.path)
            if limited is not None:
                project = _PROJECT.match(request.path)
                raise errors.rate_limited(project_number(project[1] if project else "-"), message=limited.message)
            for method, pattern, fn, permission, method_id in self.routes:
                match = pattern.match(request.path)
                if match and method == request.method:
                    denied = self.faults.take("permission", permission=permission)
                    if denied is not None:
                        resource = request.path.removeprefix("/v2/")
                        new_id = request.query.get("nodeId") or request.query.get("queuedResourceId")
                        if request.method == "POST" and new_id:
                            resource += "/" + new_id
                        raise errors.permission_denied(permission, resource, message=denied.message)
                    numeric = "enum-encoding=int" in request.query.get("$alt", "")
                    checked = self.schema.label(method_id)
                    problems = self.schema.request(method_id, request)
                    if problems:
                        raise errors.invalid(problems)
                    return self.schema.answer(method_id, fn(request, numeric, *match.groups()), numeric)
            if NOT_EMULATED.match(request.path) or ":" in request.path.rsplit("/", 1)[-1]:
                raise ApiError(
                    "UNIMPLEMENTED", f"The TPU API emulator does not implement {request.method} {request.path}"
                )
            raise ApiError("NOT_FOUND", f"The requested URL {request.path} was not found on this server.")
        except ApiError as exc:
            response = Response.error(exc)
            response.method_id = checked
            return response

    # -- rendering ----------------------------------------------------------------------------------------------

    def _node(self, node: Any, numeric: bool) -> dict[str, Any]:
        return codec.render(node.to_json(), codec.NODE, numeric_enums=numeric)

    def _op(self, op: Any, numeric: bool) -> dict[str, Any]:
        return codec.render(op.to_json(), codec.OPERATION, numeric_enums=numeric)

    def _queued(self, qr: Any, numeric: bool) -> dict[str, Any]:
        return codec.render(qr.to_json(), codec.QUEUED_RESOURCE, numeric_enums=numeric)

    # -- locations and accelerator types -----------------------------------------------------------------------

    def list_locations(self, request: Request, numeric: bool, project: str) -> Response:
        items = [{"name": f"projects/{project}/locations/{z}", "locationId": z} for z in _zones()]
        return Response.json(_page(items, request.query, "locations", lambda x: x))

    def get_location(self, request: Request, numeric: bool, project: str, zone: str) -> Response:
        if zone not in _zones():
            raise not_found(f"projects/{project}/locations/{zone}")
        return Response.json({"name": f"projects/{project}/locations/{zone}", "locationId": zone})

    def list_types(self, request: Request, numeric: bool, project: str, zone: str) -> Response:
        parent = f"projects/{project}/locations/{zone}"
        items = [
            {"name": f"{parent}/acceleratorTypes/{t.name}", "type": t.name}
            for t in catalog.all_types()
            if zone in t.zones and t.generation.in_tpu_api
        ]
        return Response.json(_page(items, request.query, "acceleratorTypes", lambda x: x))

    def get_type(self, request: Request, numeric: bool, project: str, zone: str, name: str) -> Response:
        full = f"projects/{project}/locations/{zone}/acceleratorTypes/{name}"
        try:
            accel = catalog.accelerator(name)
        except catalog.CatalogError:
            raise not_found(full) from None
        if zone not in accel.zones or not accel.generation.in_tpu_api:
            raise not_found(full)
        return Response.json({"name": full, "type": accel.name})

    # -- nodes --------------------------------------------------------------------------------------------------

    def create_node(self, request: Request, numeric: bool, project: str, zone: str) -> Response:
        spec = codec.parse_body(request.body, codec.NODE, "node")
        with self.cloud.lock:  # held until the answer is rendered: no transition can complete the operation first
            op = self.cloud.create_node(project, zone, request.query.get("nodeId"), spec)
            return Response.json(self._op(op, numeric))

    def list_nodes(self, request: Request, numeric: bool, project: str, zone: str) -> Response:
        with self.cloud.lock:
            nodes = self.cloud.list_nodes(project, zone)
            return Response.json(_page(nodes, request.query, "nodes", lambda n: self._node(n, numeric)))

    def get_node(self, request: Request, numeric: bool, project: str, zone: str, node_id: str) -> Response:
        with self.cloud.lock:
            node = self.cloud.get_node(f"projects/{project}/locations/{zone}/nodes/{node_id}")
            return Response.json(self._node(node, numeric))

    def delete_node(self, request: Request, numeric: bool, project: str, zone: str, node_id: str) -> Response:
        with self.cloud.lock:
            op, after = self.cloud.delete_node(f"projects/{project}/locations/{zone}/nodes/{node_id}")
            return Response.json(self._op(op, numeric), after=after)

    # -- operations ---------------------------------------------------------------------------------------------

    def get_operation(self, request: Request, numeric: bool, project: str, zone: str, op_id: str) -> Response:
        with self.cloud.lock:
            op = self.cloud.get_operation(f"projects/{project}/locations/{zone}/operations/{op_id}")
            return Response.json(self._op(op, numeric))

    def list_operations(self, request: Request, numeric: bool, project: str, zone: str) -> Response:
        with self.cloud.lock:
            ops = self.cloud.list_operations(project, zone)
            return Response.json(_page(ops, request.query, "operations", lambda o: self._op(o, numeric)))

    def delete_operation(self, request: Request, numeric: bool, project: str, zone: str, op_id: str) -> Response:
        self.cloud.delete_operation(f"projects/{project}/locations/{zone}/operations/{op_id}")
        return Response.json({})

    # -- queued resources ---------------------------------------------------------------------------------------

    def create_queued(self, request: Request, numeric: bool, project: str, zone: str) -> Response:
        spec = codec.parse_body(request.body, codec.QUEUED_RESOURCE, "queued_resource")
        with self.cloud.lock:
            op = self.cloud.queued.create(project, zone, request.query.get("queuedResourceId"), spec)
            return Response.json(self._op(op, numeric))

    def list_queued(self, request: Request, numeric: bool, project: str, zone: str) -> Response:
        with self.cloud.lock:
            items = self.cloud.queued.in_zone(project, zone)
            return Response.json(_page(items, request.query, "queuedResources", lambda q: self._queued(q, numeric)))

    def get_queued(self, request: Request, numeric: bool, project: str, zone: str, qr_id: str) -> Response:
        with self.cloud.lock:
            qr = self.cloud.queued.get(f"projects/{project}/locations/{zone}/queuedResources/{qr_id}")
            return Response.json(self._queued(qr, numeric))

    def delete_queued(self, request: Request, numeric: bool, project: str, zone: str, qr_id: str) -> Response:
        force = request.query.get("force", "").lower() in ("true", "1")
        with self.cloud.lock:
            name = f"projects/{project}/locations/{zone}/queuedResources/{qr_id}"
            op, after = self.cloud.queued.delete(name, force=force)
            return Response.json(self._op(op, numeric), after=after)
