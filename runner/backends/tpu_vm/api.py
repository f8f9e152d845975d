"""The one seam every Cloud TPU API call passes through: client construction, retries, and errors in words.

The client is google-cloud-tpu's TpuClient over REST. $RUNNER_TPU_ENDPOINT (e.g. http://127.0.0.1:8470, the TPU
API emulator) points it at another server with anonymous credentials, the same way STORAGE_EMULATOR_HOST does for
Cloud Storage. Every RPC goes through `TpuApi.call` (retries and classification: runner.backends.google_api),
long-running operations included: they are read with operations.get like any other resource, never through the
SDK's operation future, whose polling raises SDK errors outside this seam. A failed create operation with code 8
(RESOURCE_EXHAUSTED) and no quota detail is a stockout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from runner.backends.google_api import (
    ApiClock,
    ApiFailure,
    clocked,
    default_retry,
    failure_of,
    plain_failure,
    quoted_after,
)
from runner.credentials import anonymous, default_credentials
from runner.errors import AlreadyExists, BackendError, NoCapacity, QuotaExceeded
from runner.timings import Timings

ENDPOINT_ENV = "RUNNER_TPU_ENDPOINT"
T = TypeVar("T")


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


def make_client(clock: ApiClock | None = None) -> Any:
    from google.cloud import tpu_v2
    from google.cloud.tpu_v2.services.tpu.transports.rest import TpuRestInterceptor, TpuRestTransport

    # The reads' answers carry the API's clock (runner gc's ages).
    reads = ("list_nodes", "get_node", "list_queued_resources")
    interceptor = clocked(TpuRestInterceptor, clock, *reads) if clock is not None else None
    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        transport = TpuRestTransport(host=endpoint, credentials=anonymous(), interceptor=interceptor)
        return tpu_v2.TpuClient(transport=transport)
    transport = TpuRestTransport(credentials=default_credentials(), interceptor=interceptor)
    return tpu_v2.TpuClient(transport=transport)


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
        permission = failure.metadata.get("permission") or quoted_after(failure.message, "Permission ")
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
    return plain_failure(failure, action, project=project, zone=zone)


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
