"""A Cloud Storage emulator that honours generation preconditions: gcp-storage-emulator's own handlers, routed
through checks as strict as Cloud Storage's, on a threaded server with hooks that make races happen on purpose.

gcp-storage-emulator ignores `ifGenerationMatch` and its kin: a write that Cloud Storage refuses with 412 goes
through there, so a lease taken "only if nobody else has" would be taken twice and a test of it would pass only
because the emulator is kind. Here every object request is checked first, the way Cloud Storage documents it
(cloud.google.com/storage/docs/request-preconditions, json_api/v1/objects/insert):

    ifGenerationMatch=0        the object must not exist (create only if absent)
    ifGenerationMatch=N        its live generation is N
    ifGenerationNotMatch=N     its live generation is not N (a read that fails it: 304 Not Modified)
    ifMetagenerationMatch=N    its metageneration is N      (and ifMetagenerationNotMatch)
    ifSourceGenerationMatch=N  copy/rewrite: the source's generation is N (and the other ifSource*)

A condition that does not hold is answered 412 Precondition Failed with Cloud Storage's body (reason
conditionNotMet), which google-cloud-storage raises as google.api_core.exceptions.PreconditionFailed. A write with
a generation condition on an object that does not exist fails it, a read or delete of one is a 404 as without the
condition. A resumable upload is checked when it starts and again when it completes (its session keeps the query
of its start). Each request's check and effect happen under one lock, so two writers conditioned on the same
generation cannot both succeed, however their requests interleave.

    server = StorageServer("127.0.0.1", port, bucket="runner-test").start()
    hold = server.hold_writes(r"runs/.*/owner\\.json", parties=2)   # the next 2 conditional writes wait for each other
    ...                                                             # both writers read, both send: one gets 412
    server.stop()

`hold_writes` is the barrier that makes a race happen by construction: matching conditional writes wait (before
the lock) until `parties` of them have arrived, then go on together. `StorageServer` is what the test suite, the
fault table and `python -m tpu_emulator --with-gcs` start.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from typing import Any

from gcp_storage_emulator import server as gcs_server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets, objects
from gcp_storage_emulator.storage import Storage

Handler = Callable[[Any, Any, Any], Any]

# Cloud Storage's own answer to a precondition that does not hold (the JSON API's error format).
_NOT_MET = "At least one of the pre-conditions you specified did not hold."
_CONDITIONS = ("ifGenerationMatch", "ifGenerationNotMatch", "ifMetagenerationMatch", "ifMetagenerationNotMatch")
_SOURCE_CONDITIONS = tuple(c.replace("if", "ifSource", 1) for c in _CONDITIONS)
_WRITES = {objects.insert, objects.upload_partial, objects.compose, objects.copy, objects.rewrite, objects.xml_upload}
_READS = {objects.get, objects.download}


class _Refused(Exception):
    def __init__(self, status: HTTPStatus, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


@dataclass
class Hold:
    """A barrier for conditional writes of objects whose name matches `pattern`: each waits until `parties` have
    arrived (or `timeout_s`, a ceiling, passed), then they go on together. `arrived` counts them."""

    pattern: str
    parties: int
    timeout_s: float = 120.0
    arrived: int = 0
    released: threading.Event = field(default_factory=threading.Event)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def wait(self) -> None:
        with self._cond:
            self.arrived += 1
            if self.arrived >= self.parties:
                self.released.set()
                self._cond.notify_all()
            else:
                self._cond.wait_for(self.released.is_set, timeout=self.timeout_s)


def _number(query: dict[str, list[str]], name: str) -> int | None:
    if name not in query:
        return None
    raw = query[name][0]
    if not re.fullmatch(r"-?\d+", raw):
        raise _Refused(HTTPStatus.BAD_REQUEST, f"Invalid argument for {name}: {raw!r}", "invalid")
    return int(raw)


def _check(
    query: dict[str, list[str]], names: tuple[str, ...], found: dict[str, Any] | None, *, write: bool, read: bool
) -> None:
    """_Refused when one of the conditions `names` (in Cloud Storage's order) does not hold for `found` (the
    object's resource, None when it does not exist)."""
    generation_match, generation_not, meta_match, meta_not = (_number(query, n) for n in names)
    if all(v is None for v in (generation_match, generation_not, meta_match, meta_not)):
        return
    if found is None:
        if generation_match == 0 or not write:  # absent, as asked; or a read/delete: a plain 404 follows
            return
        if generation_match is not None or meta_match is not None:
            raise _Refused(HTTPStatus.PRECONDITION_FAILED, _NOT_MET, "conditionNotMet")
        return
    generation, metageneration = int(found["generation"]), int(found.get("metageneration") or 1)
    if generation_match is not None and generation_match != generation:
        raise _Refused(HTTPStatus.PRECONDITION_FAILED, _NOT_MET, "conditionNotMet")
    if meta_match is not None and meta_match != metageneration:
        raise _Refused(HTTPStatus.PRECONDITION_FAILED, _NOT_MET, "conditionNotMet")
    not_modified = (generation_not is not None and generation_not == generation) or (
        meta_not is not None and meta_not == metageneration
    )
    if not_modified:
        if read:
            raise _Refused(HTTPStatus.NOT_MODIFIED, "Not Modified", "notModified")
        raise _Refused(HTTPStatus.PRECONDITION_FAILED, _NOT_MET, "conditionNotMet")


def _target(fn: Handler, request: Any, storage: Storage) -> tuple[str, str] | None:
    """(bucket, object name) the request acts on: an upload's from its query, its metadata or its session."""
    params = request.params or {}
    query = request.query
    if fn in (objects.copy, objects.rewrite):
        return params["dest_bucket_name"], params["dest_object_id"]
    if fn in (objects.insert, objects.upload_partial):
        if "upload_id" in query:
            try:
                session = storage.get_resumable_file_obj(query["upload_id"][0])
            except NotFound:
                return None
            return session["bucket"], session["name"]
        if "name" in query:
            return params["bucket_name"], query["name"][0]
        data = request.data
        if isinstance(data, dict):
            meta = data.get("meta") if "meta" in data else data
            if isinstance(meta, dict) and meta.get("name"):
                return params["bucket_name"], str(meta["name"])
        return None
    if "object_id" in params:
        return params["bucket_name"], params["object_id"]
    return None


def _live(storage: Storage, bucket: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(storage.get_file_obj(bucket, name))
    except NotFound:
        return None


class _MemoryStorage(Storage):
    """gcp-storage-emulator's in-memory storage without its metadata file. After every change the library writes
    the metadata of every object it holds as one indented JSON file, which only its constructor reads back: under
    this server's lock each write then cost time in proportion to all the objects the server had stored (6 ms a
    write at 1,500 objects; a test session's server holds many more), slowing every request of later tests."""

    def _write_config_to_file(self) -> None:
        pass


class StorageServer:
    """gcp-storage-emulator's storage and handlers, with generation preconditions and write barriers."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, bucket: str | None = None) -> None:
        self.storage = _MemoryStorage(use_memory_fs=True)
        if bucket:
            buckets.create_bucket(bucket, self.storage)
        self.lock = threading.RLock()  # one request's check and effect at a time, as one object sees them
        self.holds: list[Hold] = []
        self.refused = 0  # requests answered 412 or 304 by a precondition
        self._routes = [
            (re.compile(regex), {method: self._wrap(fn) for method, fn in handlers.items()})
            for regex, handlers in gcs_server.HANDLERS
        ]
        self._httpd = ThreadingHTTPServer((host, port), partial(_RequestHandler, self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True, name="gcs-emulator")

    @property
    def endpoint(self) -> str:
        host, port = str(self._httpd.server_address[0]), self._httpd.server_address[1]
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"

    def start(self) -> StorageServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        for hold in self.holds:
            hold.released.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def hold_writes(self, pattern: str, parties: int = 2, timeout_s: float = 120.0) -> Hold:
        """The next `parties` conditional writes of an object whose name matches `pattern` wait for each other."""
        hold = Hold(pattern, parties, timeout_s)
        with self.lock:
            self.holds.append(hold)
        return hold

    def _hold_for(self, name: str) -> Hold | None:
        with self.lock:
            for hold in self.holds:
                if re.search(hold.pattern, name) and hold.arrived < hold.parties:
                    return hold
        return None

    # -- routing ----------------------------------------------------------------------------------------------------

    def _wrap(self, fn: Handler) -> Handler:
        if fn not in (*_WRITES, *_READS, objects.delete, objects.patch):
            return self._locked(fn)
        return partial(self._guarded, fn)

    def _locked(self, fn: Handler) -> Handler:
        def handler(request: Any, response: Any, storage: Any) -> Any:
            with self.lock:
                return fn(request, response, storage)

        return handler

    def _guarded(self, fn: Handler, request: Any, response: Any, storage: Storage) -> Any:
        with self.lock:
            target = _target(fn, request, storage)  # reads the body (cached for the handler)
        conditional = any(name in request.query for name in _CONDITIONS)
        if target is not None and conditional and fn in _WRITES and (hold := self._hold_for(target[1])):
            hold.wait()  # outside the lock: the other parties must get here too
        with self.lock:
            if target is not None:
                try:
                    write = fn in _WRITES
                    _check(request.query, _CONDITIONS, _live(storage, *target), write=write, read=fn in _READS)
                    if fn in (objects.copy, objects.rewrite):
                        source = _live(storage, request.params["bucket_name"], request.params["object_id"])
                        _check(request.query, _SOURCE_CONDITIONS, source, write=True, read=False)
                except _Refused as refused:
                    self.refused += 1
                    response.status = refused.status
                    if refused.status != HTTPStatus.NOT_MODIFIED:
                        body = {"code": refused.status.value, "message": refused.message}
                        item = {"message": refused.message, "domain": "global", "reason": refused.reason}
                        response.json({"error": {**body, "errors": [item]}})
                    return None
            answer = fn(request, response, storage)
            media = fn is objects.download or (fn is objects.get and request.query.get("alt") == ["media"])
            if media and target is not None and (found := _live(storage, *target)) is not None:
                # Cloud Storage says which generation it sent (google-cloud-storage reads these into the blob;
                # TensorStore, Orbax's writer, conditions its next write of the object on it).
                response["x-goog-generation"] = str(found["generation"])
                response["x-goog-metageneration"] = str(found.get("metageneration") or 1)
            return answer

    def route(self, handler: _RequestHandler, method: str) -> None:
        """gcp-storage-emulator's Router.handle, over this server's wrapped routes."""
        method = handler.headers.get("x-http-method-override") or method
        request = gcs_server.Request(handler, method)
        response = gcs_server.Response(handler)
        for pattern, handlers in self._routes:
            match = pattern.fullmatch(request.path)
            if not match:
                continue
            request.set_match(match)
            chosen = handlers.get(method)
            if chosen is None and method == "POST" and request.query.get("uploadType") and request.path.endswith("/o"):
                chosen = self._wrap(objects.insert)  # an upload POSTed without the /upload prefix, as some do
            if chosen is None:
                response.status = HTTPStatus.NOT_IMPLEMENTED
            else:
                chosen(request, response, self.storage)
            break
        else:
            response.status = HTTPStatus.NOT_IMPLEMENTED
        response.close()


class _RequestHandler(gcs_server.RequestHandler):
    def __init__(self, owner: StorageServer, *args: Any, **kwargs: Any) -> None:
        self.owner = owner
        super().__init__(owner.storage, *args, **kwargs)

    def do_GET(self) -> None:
        self.owner.route(self, "GET")

    def do_POST(self) -> None:
        self.owner.route(self, "POST")

    def do_PUT(self) -> None:
        self.owner.route(self, "PUT")

    def do_DELETE(self) -> None:
        self.owner.route(self, "DELETE")

    def do_PATCH(self) -> None:
        self.owner.route(self, "PATCH")

    def log_message(self, format: str, *args: Any) -> None:
        pass
