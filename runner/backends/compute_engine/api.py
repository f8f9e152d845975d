"""The one seam every Compute Engine call of the runner passes through: clients, retries, operations, errors in words.

The clients are google-cloud-compute's, over REST. $RUNNER_COMPUTE_ENDPOINT (e.g. http://127.0.0.1:8470, the
emulator) points them at another server with anonymous credentials, as $RUNNER_TPU_ENDPOINT does for the Cloud TPU
API. Every RPC goes through `ComputeApi.call` (retries and classification: runner.backends.google_api). Operations
are read with this seam's own Zone/Region/GlobalOperationsClient: the SDK's ExtendedOperation.result() polls with a
client it makes itself, on the default endpoint (docs/emulator.md, "Compute Engine"), and raises outside this seam.
An operation is named here by its scope and name, "zones/Z/operations/N" (or regions/R/..., global/...).

Compute Engine states what went wrong in the operation (error.errors[].code: ZONE_RESOURCE_POOL_EXHAUSTED,
QUOTA_EXCEEDED, ...) or, answered at once, in the error's `errors[].reason` (quotaExceeded, notFound, ...).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from runner.backends.google_api import ApiClock, ApiFailure, clocked, default_retry, failure_of, plain_failure
from runner.credentials import anonymous, default_credentials
from runner.errors import AlreadyExists, BackendError, NoCapacity, QuotaExceeded
from runner.timings import Timings

ENDPOINT_ENV = "RUNNER_COMPUTE_ENDPOINT"
T = TypeVar("T")
# Compute Engine's operation error codes for a zone without capacity (cloud.google.com/compute/docs/resource-error).
STOCKOUT_CODES = {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}
GANG_STOCKOUT = "GCE_STOCKOUT"  # "Atomic resize failed with [GCE_STOCKOUT]": a slice's VMs cannot all be made
_TRANSIENT_OP_CODES = {"INTERNAL", "UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED", "UNKNOWN"}
_CLIENTS = {
    "instances": "InstancesClient",
    "templates": "InstanceTemplatesClient",
    "policies": "ResourcePoliciesClient",
    "groups": "InstanceGroupManagersClient",
    "resize_requests": "InstanceGroupManagerResizeRequestsClient",
    "zone_ops": "ZoneOperationsClient",
    "region_ops": "RegionOperationsClient",
    "global_ops": "GlobalOperationsClient",
}


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def make_client(kind: str, clock: ApiClock | None = None) -> Any:
    """One google-cloud-compute client over REST, on $RUNNER_COMPUTE_ENDPOINT (anonymous) or Google's (ADC)."""
    from google.cloud import compute_v1

    cls = getattr(compute_v1, _CLIENTS[kind])
    endpoint = os.environ.get(ENDPOINT_ENV)
    options: dict[str, Any] = {"transport": "rest"}
    if kind == "instances" and clock is not None:
        from google.cloud.compute_v1.services.instances.transports.rest import (
            InstancesRestInterceptor,
            InstancesRestTransport,
        )

        # The list and get answers carry the API's own time, for runner gc's ages.
        transport = InstancesRestTransport(
            host=endpoint or "compute.googleapis.com",
            credentials=anonymous() if endpoint else default_credentials(),
            interceptor=clocked(InstancesRestInterceptor, clock, "list", "get"),
        )
        return cls(transport=transport)
    if endpoint:
        return cls(**options, credentials=anonymous(), client_options={"api_endpoint": endpoint})
    return cls(**options, credentials=default_credentials())


def _reason(exc: BaseException) -> str | None:
    """Compute Engine's own reason of an error answered at once (errors[0].reason: quotaExceeded, notFound, ...)."""
    errors = getattr(exc, "errors", None) or []
    first = errors[0] if errors else None
    return str(first.get("reason")) if isinstance(first, dict) and first.get("reason") else None


def explain(failure: ApiFailure, action: str, *, project: str, zone: str, reason: str | None = None) -> BackendError:
    """A Compute Engine failure (an error answered at once, or a failed operation's first error) as something a
    user can act on."""
    said, code = failure.said(), failure.code
    if code in STOCKOUT_CODES or GANG_STOCKOUT in failure.message:
        return NoCapacity(
            f"no capacity in {zone} (stockout): {said}",
            hint="list more zones under accelerator.zones, set retries.capacity_wait, or try flex-start "
            "(accelerator.provisioning: queued) or Spot",
        )
    if code == "QUOTA_EXCEEDED" or reason == "quotaExceeded":
        return QuotaExceeded(
            f"quota exhausted in {zone} (trying to {action}): {said}",
            hint="request more TPU quota for Compute Engine (IAM & Admin > Quotas), use a smaller type, or another "
            "region",
        )
    if code == "ALREADY_EXISTS" or reason == "alreadyExists":
        return AlreadyExists(f"cannot {action}: it exists already ({said})")
    if code == "PERMISSION_DENIED" or reason == "forbidden":
        return BackendError(
            f"permission denied to {action}: {said}",
            hint=f"grant the account roles/compute.instanceAdmin.v1 on project {project} (and "
            "roles/iam.serviceAccountUser on the VM's service account), and check that the Compute Engine API is "
            "enabled: `gcloud services enable compute.googleapis.com`",
        )
    if failure.transient or code in _TRANSIENT_OP_CODES:
        return BackendError(
            f"Compute Engine stayed unavailable ({code}) while trying to {action}, through every retry: {said}",
            hint="try again in a few minutes (status.cloud.google.com shows Compute Engine incidents)",
        )
    if code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "CONDITION_NOT_MET"):
        fields = "; ".join(failure.field_violations)
        return BackendError(f"Compute Engine refused to {action}: {said}" + (f" ({fields})" if fields else ""))
    return plain_failure(failure, action, project=project, zone=zone)


@dataclass(frozen=True)
class OperationState:
    """A Compute Engine operation as last read."""

    name: str  # zones/Z/operations/N, regions/R/operations/N or global/operations/N
    done: bool
    failure: ApiFailure | None = None  # its first error, when it ended with one
    ended_at: float | None = None  # endTime, by the API's clock


def failure_of_operation(op: Any) -> ApiFailure | None:
    """A DONE operation's error (error.errors[0]: its code and message), or None when it succeeded."""
    errors = list(op.error.errors) if op.error else []
    if not errors:
        return None
    first = errors[0]
    transient = first.code in _TRANSIENT_OP_CODES or op.http_error_status_code >= 500
    code = first.code if not (transient and first.code not in _TRANSIENT_OP_CODES) else "UNAVAILABLE"
    if first.code in STOCKOUT_CODES:
        code = first.code  # a 503 in the operation, but a stockout: the next zone, not a retry
    return ApiFailure(code, first.message or first.code, (), op.http_error_status_code or None, from_operation=True)


class ComputeApi:
    """Instances, instance templates, resource policies, managed instance groups, resize requests and operations in
    one project, through injected or default google-cloud-compute clients."""

    def __init__(self, clients: dict[str, Any] | None = None, *, timings: Timings | None = None) -> None:
        self._clients: dict[str, Any] = dict(clients or {})
        t = timings or Timings()
        self.retry = default_retry(t.api_retry_deadline_s, t.api_retry_initial_s)
        self.clock = ApiClock()

    def client(self, kind: str) -> Any:
        if kind not in self._clients:
            self._clients[kind] = make_client(kind, self.clock)
        return self._clients[kind]

    def call(self, kind: str, method: str, action: str, at: tuple[str, str], **kwargs: Any) -> Any:
        """One RPC with retries; any failure comes out as a classified BackendError, the SDK's as its cause.
        `at` (project, zone) says where, for the messages; the RPC's own arguments are in kwargs."""
        import requests

        project, zone = at
        fn: Callable[..., Any] = getattr(self.client(kind), method)
        try:
            return fn(retry=self.retry, **kwargs)
        except requests.RequestException as exc:
            raise BackendError(
                f"cannot reach Compute Engine to {action}: {type(exc).__name__}",
                hint=f"check the network (and ${ENDPOINT_ENV} if it is set)",
            ) from exc
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            raise explain(failure, action, project=project, zone=zone, reason=_reason(exc)) from exc

    def unless_missing(self, kind: str, method: str, action: str, at: tuple[str, str], **kwargs: Any) -> Any:
        """`call`, with None for a resource that does not exist."""
        try:
            return self.call(kind, method, action, at, **kwargs)
        except BackendError as exc:
            cause = exc.__cause__
            failure = failure_of(cause) if cause is not None else None
            if failure is not None and failure.code == "NOT_FOUND":
                return None
            raise

    def listed(self, kind: str, method: str, what: str, at: tuple[str, str], **kwargs: Any) -> list[Any]:
        project, zone = at
        pages = self.call(kind, method, f"list {what} in {zone}", at, **kwargs)
        try:
            return list(pages)  # later pages are fetched while iterating: errors there come through the seam too
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            raise explain(failure, f"list {what} in {zone}", project=project, zone=zone, reason=_reason(exc)) from exc

    @staticmethod
    def message(cls_name: str, body: dict[str, Any]) -> Any:
        """A request body (Compute Engine's JSON, as requests.py renders it) as the client's message."""
        from google.cloud import compute_v1

        return getattr(compute_v1, cls_name).from_json(json.dumps(body))

    # -- creating ----------------------------------------------------------------------------------------------

    def insert(self, what: str, body: dict[str, Any], *, project: str, zone: str, group: str | None = None) -> str:
        """Send the insert of an instance, template, policy, group or resize request; its operation's name."""
        region = region_of(zone)
        table: dict[str, tuple[str, str, str, dict[str, Any]]] = {
            "instance": ("instances", "Instance", "instance_resource", {"zone": zone}),
            "template": ("templates", "InstanceTemplate", "instance_template_resource", {}),
            "policy": ("policies", "ResourcePolicy", "resource_policy_resource", {"region": region}),
            "group": ("groups", "InstanceGroupManager", "instance_group_manager_resource", {"zone": zone}),
            "resize request": (
                "resize_requests",
                "InstanceGroupManagerResizeRequest",
                "instance_group_manager_resize_request_resource",
                {"zone": zone, "instance_group_manager": group},
            ),
        }
        kind, cls_name, field, where = table[what]
        op = self.call(
            kind,
            "insert_unary",
            f"create {what} {body['name']}",
            (project, zone),
            **where,
            project=project,
            **{field: self.message(cls_name, body)},
        )
        return operation_ref(op)

    # -- operations --------------------------------------------------------------------------------------------

    def get_operation(self, ref: str, *, project: str, zone: str) -> OperationState:
        scope, _, name = ref.partition("/operations/")
        kind, where = "global_ops", {}
        if scope.startswith("zones/"):
            kind, where = "zone_ops", {"zone": scope.removeprefix("zones/")}
        elif scope.startswith("regions/"):
            kind, where = "region_ops", {"region": scope.removeprefix("regions/")}
        op = self.call(kind, "get", f"read operation {name}", (project, zone), project=project, operation=name, **where)
        done = op.status == op.Status.DONE
        ended = timestamp(op.end_time) if done and op.end_time else None
        return OperationState(ref, done, failure_of_operation(op) if done else None, ended)

    def preempted_since(self, project: str, zone: str, target: str, since: float | None) -> bool:
        """Whether Compute Engine preempted `target` (an instance name, or a group's members as NAME-*) at or after
        `since` (its creation time): a compute.instances.preempted system event, as the docs say to detect one
        (cloud.google.com/compute/docs/instances/create-use-spot#detect-preemption)."""
        from google.cloud import compute_v1

        request = compute_v1.ListZoneOperationsRequest(
            project=project,
            zone=zone,
            filter=f'operationType = "compute.instances.preempted" AND targetLink = "*/instances/{target}"',
        )
        found = self.listed("zone_ops", "list", "operations", (project, zone), request=request)
        # A recreated VM has the name of the one preempted before it: only its own preemptions count.
        return any(since is None or (timestamp(op.insert_time) or 0.0) >= since - 1 for op in found)


def operation_ref(op: Any) -> str:
    """zones/Z/operations/N (regions/R/..., global/...) of an operation answer."""
    if op.zone:
        return f"zones/{op.zone.rsplit('/', 1)[-1]}/operations/{op.name}"
    if op.region:
        return f"regions/{op.region.rsplit('/', 1)[-1]}/operations/{op.name}"
    return f"global/operations/{op.name}"


def timestamp(text: str) -> float | None:
    """An RFC 3339 time of Compute Engine's (creationTimestamp, insertTime) as seconds; None for none."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None
    except ValueError:
        return None
