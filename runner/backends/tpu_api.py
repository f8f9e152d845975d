"""The one seam every Cloud TPU API call passes through: client construction, retries, and errors in words.

The client is google-cloud-tpu's TpuClient over REST. $RUNNER_TPU_ENDPOINT (e.g. http://127.0.0.1:8470, the TPU
API emulator) points it at another server with anonymous credentials, the same way STORAGE_EMULATOR_HOST does for
Cloud Storage. TPU RPCs have no default retry: transient answers (429 rate limits, 5xx, dropped connections) are
retried here with backoff. Every RPC goes through `TpuApi.call`, long-running operations included: they are read
with operations.get like any other resource, never through the SDK's operation future, whose polling raises SDK
errors outside this seam.

Errors are classified from what the API says in structure, not in prose (cloud.google.com/apis/design/errors):
the canonical status code, and the google.rpc details of the error or the failed operation: ErrorInfo.reason
(RATE_LIMIT_EXCEEDED is a rate limit that passes; RESOURCE_QUOTA_EXCEEDED an allocation quota that does not,
per google/api/error_reason.proto), QuotaFailure violations, BadRequest field violations. A failed create
operation with code 8 (RESOURCE_EXHAUSTED) and no quota detail is a stockout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from runner.errors import AlreadyExists, BackendError, NoCapacity, QuotaExceeded
from runner.timings import Timings

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
ENDPOINT_ENV = "RUNNER_TPU_ENDPOINT"
DEBUG_ENV = "RUNNER_DEBUG"
T = TypeVar("T")

_TYPE = "type.googleapis.com/google.rpc."
# google/api/error_reason.proto: which ErrorInfo reasons mean what for us.
_RATE_REASONS = {"RATE_LIMIT_EXCEEDED"}
_QUOTA_REASONS = {"RESOURCE_QUOTA_EXCEEDED"}
_TRANSIENT_CODES = {"UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "UNKNOWN", "ABORTED"}
# api-core formats REST errors as "<METHOD> <URL>: <message>"; the URL is noise to a user (RUNNER_DEBUG keeps it).
_REST_PREFIX = re.compile(r"^(?:GET|POST|PUT|PATCH|DELETE|HEAD) \S+: ")


@dataclass(frozen=True)
class ApiFailure:
    """An error answer or a failed operation, reduced to what the API states: code, message, details."""

    code: str  # canonical status name: RESOURCE_EXHAUSTED, PERMISSION_DENIED, ...
    message: str  # the server's own words, without our request's method and URL
    details: tuple[dict[str, Any], ...] = ()
    http_status: int | None = None
    request: str | None = None  # "POST http://...": shown only with RUNNER_DEBUG
    from_operation: bool = False  # a long-running operation ended with this error

    def _detail(self, kind: str) -> dict[str, Any] | None:
        return next((d for d in self.details if d.get("@type") == _TYPE + kind), None)

    @property
    def reason(self) -> str | None:
        info = self._detail("ErrorInfo")
        return str(info["reason"]) if info and info.get("reason") else None

    @property
    def metadata(self) -> dict[str, str]:
        info = self._detail("ErrorInfo") or {}
        return {str(k): str(v) for k, v in (info.get("metadata") or {}).items()}

    @property
    def quota_violations(self) -> list[str]:
        failure = self._detail("QuotaFailure") or {}
        return [
            " ".join(str(v.get(k)) for k in ("subject", "description") if v.get(k))
            for v in failure.get("violations") or []
        ]

    @property
    def field_violations(self) -> list[str]:
        bad = self._detail("BadRequest") or {}
        return [f"{v.get('field')}: {v.get('description')}" for v in bad.get("fieldViolations") or []]

    @property
    def is_quota(self) -> bool:
        return self._detail("QuotaFailure") is not None or self.reason in _QUOTA_REASONS

    @property
    def is_rate_limit(self) -> bool:
        return self.code == "RESOURCE_EXHAUSTED" and not self.is_quota and not self.from_operation

    @property
    def transient(self) -> bool:
        return self.is_rate_limit or self.code in _TRANSIENT_CODES

    def said(self) -> str:
        text = self.message
        if os.environ.get(DEBUG_ENV) and self.request:
            text += f" [{self.request}]"
        return text


def failure_of(exc: BaseException) -> ApiFailure | None:
    """An api-core exception as an ApiFailure; None for anything else (a bug is not an API answer)."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.RetryError) and exc.cause is not None:
        return failure_of(exc.cause)
    if not isinstance(exc, gexc.GoogleAPICallError):
        return None
    code = _canonical_code(exc)
    message = exc.message or str(exc)
    request = None
    if m := _REST_PREFIX.match(message):
        request, message = m.group(0)[:-2], message[m.end() :]
    details = tuple(d for d in (exc.details or ()) if isinstance(d, dict))
    return ApiFailure(code, message, details, exc.code if isinstance(exc.code, int) else None, request)


def failure_of_status(status: Any) -> ApiFailure:
    """A failed operation's google.rpc.Status (protobuf) as an ApiFailure, details decoded to JSON dicts."""
    from google.protobuf import json_format
    from google.rpc import code_pb2, error_details_pb2  # noqa: F401  (registers the detail types for decoding)

    details = []
    for any_detail in status.details:
        try:
            details.append(json_format.MessageToDict(any_detail))
        except (json_format.Error, TypeError, KeyError):
            details.append({"@type": any_detail.type_url})
    try:
        code = code_pb2.Code.Name(status.code)
    except ValueError:
        code = "UNKNOWN"
    return ApiFailure(code, status.message or code, tuple(details), from_operation=True)


def _canonical_code(exc: Any) -> str:
    """The canonical status name: from the REST body's `error.status` (api-core maps several statuses onto one HTTP
    class: 409 is ALREADY_EXISTS or ABORTED), else the exception's gRPC code, else the HTTP status's usual one."""
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            status = response.json()["error"]["status"]
            if isinstance(status, str) and status:
                return status
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    if exc.grpc_status_code is not None:
        return str(exc.grpc_status_code.name)
    by_http = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}
    by_http |= {409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE"}
    by_http |= {502: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
    return by_http.get(exc.code, "UNKNOWN") if isinstance(exc.code, int) else "UNKNOWN"


def _transient(exc: BaseException) -> bool:
    import requests

    if isinstance(exc, requests.ConnectionError | requests.Timeout):
        return True  # a dropped connection: the request is retried like a 503
    failure = failure_of(exc)
    return failure is not None and failure.transient


def default_retry(deadline_s: float = 120.0, initial_s: float = 1.0) -> Any:
    from google.api_core import retry

    return retry.Retry(predicate=_transient, initial=initial_s, maximum=20.0, multiplier=2.0, timeout=deadline_s)


class ApiClock:
    """The API's own time: the Date header of its last answer, plus how long ago that came (this machine's
    monotonic clock measures only the interval). Durations against the API's timestamps (a node's createTime,
    an object's `updated` on Google's side) are then on one clock, whatever this machine's says."""

    def __init__(self) -> None:
        self._seen: tuple[float, float] | None = None  # (API time, time.monotonic() when it came)

    def note(self, headers: Sequence[tuple[str, Any]]) -> None:
        from email.utils import parsedate_to_datetime

        for key, value in headers:
            if key.lower() == "date":
                with contextlib.suppress(TypeError, ValueError):  # a Date that is not one says no time
                    self._seen = (parsedate_to_datetime(str(value)).timestamp(), time.monotonic())

    def now(self) -> float | None:
        """Now by the API's clock (to the second: a Date header's resolution); None before any answer had one."""
        if self._seen is None:
            return None
        stamp, at = self._seen
        return stamp + (time.monotonic() - at)


def _clocked(clock: ApiClock) -> Any:
    """google-cloud-tpu's REST interceptor (its documented hook on every answer) that hands the reads' headers to
    `clock`."""
    from google.cloud.tpu_v2.services.tpu.transports.rest import TpuRestInterceptor

    class Clocked(TpuRestInterceptor):
        def post_list_nodes_with_metadata(self, response: Any, metadata: Any) -> Any:
            clock.note(metadata)
            return response, metadata

        def post_get_node_with_metadata(self, response: Any, metadata: Any) -> Any:
            clock.note(metadata)
            return response, metadata

        def post_list_queued_resources_with_metadata(self, response: Any, metadata: Any) -> Any:
            clock.note(metadata)
            return response, metadata

    return Clocked()


def make_client(clock: ApiClock | None = None) -> Any:
    from google.cloud import tpu_v2
    from google.cloud.tpu_v2.services.tpu.transports.rest import TpuRestTransport

    interceptor = _clocked(clock) if clock is not None else None
    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        transport = TpuRestTransport(host=endpoint, credentials=AnonymousCredentials(), interceptor=interceptor)
        return tpu_v2.TpuClient(transport=transport)
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
    except DefaultCredentialsError as exc:
        raise BackendError(
            "no Google Cloud credentials found",
            hint="run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
            "to a service-account key)",
        ) from exc
    return tpu_v2.TpuClient(transport=TpuRestTransport(credentials=credentials, interceptor=interceptor))


def explain(failure: ApiFailure, action: str, *, project: str, zone: str) -> BackendError:
    """An API failure as something a user can act on: what failed, in words, and what to do."""
    said = failure.said()
    code = failure.code
    if code == "PERMISSION_DENIED":
        if failure.reason == "SERVICE_DISABLED":
            return BackendError(
                f"the Cloud TPU API is not enabled in project {project} (trying to {action}): {said}",
                hint=f"`gcloud services enable tpu.googleapis.com --project {project}`",
            )
        permission = failure.metadata.get("permission") or _quoted_after(failure.message, "Permission ")
        return BackendError(
            f"permission denied to {action}: {said}",
            hint=(f"the account lacks {permission}; " if permission else "")
            + f"grant it roles/tpu.admin on project {project} (roles/tpu.viewer is enough to read), and check "
            "that the Cloud TPU API is enabled: `gcloud services enable tpu.googleapis.com`",
        )
    if code == "RESOURCE_EXHAUSTED" and failure.is_quota:
        violations = "; ".join(failure.quota_violations)
        return QuotaExceeded(
            f"quota exhausted in {zone} (trying to {action}): {said}" + (f" ({violations})" if violations else ""),
            hint="request more TPU quota (IAM & Admin > Quotas), use a smaller type, or another region",
        )
    if code == "RESOURCE_EXHAUSTED" and failure.from_operation:
        return NoCapacity(
            f"no capacity in {zone} (stockout): {said}",
            hint="list more zones under accelerator.zones, set retries.capacity_wait, or try Spot "
            "(accelerator.spot: true)",
        )
    if code == "RESOURCE_EXHAUSTED" or failure.transient:
        what = "rate-limited" if code == "RESOURCE_EXHAUSTED" else f"unavailable ({code})"
        return BackendError(
            f"the Cloud TPU API stayed {what} while trying to {action}, through every retry: {said}",
            hint="try again in a few minutes (status.cloud.google.com shows Cloud TPU incidents); a rate limit "
            "that never clears can be raised in IAM & Admin > Quotas",
        )
    if code == "ALREADY_EXISTS":
        return AlreadyExists(f"cannot {action}: it exists already ({said})")
    if code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"):
        fields = "; ".join(failure.field_violations)
        return BackendError(f"the TPU API refused to {action}: {said}" + (f" ({fields})" if fields else ""))
    if code == "NOT_FOUND":
        return BackendError(
            f"not found while trying to {action}: {said}",
            hint=f"check that project {project} exists and zone {zone} is right",
        )
    if code == "UNAUTHENTICATED":
        return BackendError(
            f"not authenticated to {action}: {said}", hint="run `gcloud auth application-default login`"
        )
    return BackendError(f"could not {action}: {said} ({code})")


def _quoted_after(message: str, marker: str) -> str | None:
    start = message.find(marker + "'")
    if start < 0:
        return None
    rest = message[start + len(marker) + 1 :]
    end = rest.find("'")
    return rest[:end] if end > 0 else None


@dataclass(frozen=True)
class OperationState:
    """A long-running operation as last read."""

    name: str
    done: bool
    failure: ApiFailure | None = None  # set when done with an error
    metadata: dict[str, Any] = field(default_factory=dict)
    ended_at: float | None = None  # metadata.endTime: when it ended, by the API's clock (no VM's, no runner's)


class TpuApi:
    """Nodes, queued resources and operations in one project, through an injected or default TpuClient."""

    def __init__(self, client: Any | None = None, *, retry: Any | None = None, timings: Timings | None = None) -> None:
        self._client = client
        t = timings or Timings()
        self.retry = retry if retry is not None else default_retry(t.api_retry_deadline_s, t.api_retry_initial_s)
        self.clock = ApiClock()  # the API's time, from the answers of the client made here (not an injected one)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = make_client(self.clock)
        return self._client

    def call(self, fn: Callable[..., T], action: str, *, project: str, zone: str, **kwargs: Any) -> T:
        """One RPC with retries; any failure comes out as a classified BackendError, the SDK's as its cause."""
        import requests

        try:
            return fn(retry=self.retry, **kwargs)
        except requests.RequestException as exc:
            raise BackendError(
                f"cannot reach the Cloud TPU API to {action}: {type(exc).__name__}",
                hint="check the network (and $RUNNER_TPU_ENDPOINT if it is set)",
            ) from exc
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            raise explain(failure, action, project=project, zone=zone) from exc

    def _unless_missing(self, fn: Callable[..., T], action: str, *, project: str, zone: str, **kwargs: Any) -> T | None:
        """`call`, with None for a resource that does not exist (never retried: NotFound is not transient)."""
        try:
            return self.call(fn, action, project=project, zone=zone, **kwargs)
        except BackendError as exc:
            failure = failure_of(exc.__cause__) if exc.__cause__ is not None else None
            if failure is not None and failure.code == "NOT_FOUND":
                return None
            raise

    # -- nodes ------------------------------------------------------------------------------------------------

    def create_node(self, project: str, zone: str, node_id: str, body: dict[str, Any]) -> str:
        """Send the create request; returns the name of its long-running operation."""
        from google.cloud import tpu_v2

        node = tpu_v2.Node.from_json(json.dumps(body))
        operation = self.call(
            self.client.create_node,
            f"create TPU node {node_id}",
            project=project,
            zone=zone,
            parent=f"projects/{project}/locations/{zone}",
            node_id=node_id,
            node=node,
        )
        return str(operation.operation.name)

    def get_node(self, project: str, zone: str, node_id: str) -> Any | None:
        """The node, or None if it does not exist."""
        return self._unless_missing(
            self.client.get_node,
            f"read TPU node {node_id}",
            project=project,
            zone=zone,
            name=node_name(project, zone, node_id),
        )

    def delete_node(self, project: str, zone: str, node_id: str) -> str | None:
        """Ask for the node's deletion; the operation's name, or None if the node was already gone."""
        operation = self._unless_missing(
            self.client.delete_node,
            f"delete TPU node {node_id}",
            project=project,
            zone=zone,
            name=node_name(project, zone, node_id),
        )
        return None if operation is None else str(operation.operation.name)

    def list_nodes(self, project: str, zone: str) -> list[Any]:
        return self._list(self.client.list_nodes, "TPU nodes", project, zone)

    # -- queued resources -------------------------------------------------------------------------------------

    def create_queued_resource(self, project: str, zone: str, qr_id: str, body: dict[str, Any]) -> str:
        """Send the create request of a queued resource; returns the name of its long-running operation."""
        from google.cloud import tpu_v2

        queued = tpu_v2.QueuedResource.from_json(json.dumps(body))
        operation = self.call(
            self.client.create_queued_resource,
            f"create queued resource {qr_id}",
            project=project,
            zone=zone,
            parent=f"projects/{project}/locations/{zone}",
            queued_resource_id=qr_id,
            queued_resource=queued,
        )
        return str(operation.operation.name)

    def delete_queued_resource(self, name: str, *, project: str, zone: str) -> str | None:
        """Delete a queued resource and, with force, the nodes it holds; the operation, or None if already gone."""
        from google.cloud import tpu_v2

        operation = self._unless_missing(
            self.client.delete_queued_resource,
            f"delete queued resource {name.rsplit('/', 1)[-1]}",
            project=project,
            zone=zone,
            request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True),
        )
        return None if operation is None else str(operation.operation.name)

    def get_queued_resource(self, name: str, *, project: str, zone: str) -> Any | None:
        return self._unless_missing(
            self.client.get_queued_resource,
            f"read queued resource {name.rsplit('/', 1)[-1]}",
            project=project,
            zone=zone,
            name=name,
        )

    def list_queued_resources(self, project: str, zone: str) -> list[Any]:
        return self._list(self.client.list_queued_resources, "queued resources", project, zone)

    # -- operations -------------------------------------------------------------------------------------------

    def get_operation(self, name: str, *, project: str, zone: str) -> OperationState:
        """Read a long-running operation; a failed one carries its classified failure."""
        from google.longrunning import operations_pb2

        op = self.call(
            self.client.get_operation,
            f"read operation {name.rsplit('/', 1)[-1]}",
            project=project,
            zone=zone,
            request=operations_pb2.GetOperationRequest(name=name),
        )
        failure = failure_of_status(op.error) if op.done and op.HasField("error") else None
        return OperationState(str(op.name), bool(op.done), failure, ended_at=_end_time(op))

    def _list(self, fn: Callable[..., Any], what: str, project: str, zone: str) -> list[Any]:
        pages = self.call(
            fn, f"list {what} in {zone}", project=project, zone=zone, parent=f"projects/{project}/locations/{zone}"
        )
        try:
            return list(pages)  # later pages are fetched while iterating: errors there come through the seam too
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            raise explain(failure, f"list {what} in {zone}", project=project, zone=zone) from exc


def _end_time(op: Any) -> float | None:
    """The operation's metadata.endTime (tpu.v2 OperationMetadata), as seconds since the epoch; None without one."""
    from google.cloud import tpu_v2

    if not op.HasField("metadata") or not op.metadata.type_url.endswith("/google.cloud.tpu.v2.OperationMetadata"):
        return None
    try:
        meta = tpu_v2.OperationMetadata.deserialize(op.metadata.value)
    except Exception:  # a metadata the client cannot decode is no answer about the time, not an error of the call
        return None
    return meta.end_time.timestamp() if meta.end_time else None


def node_name(project: str, zone: str, node_id: str) -> str:
    return f"projects/{project}/locations/{zone}/nodes/{node_id}"
