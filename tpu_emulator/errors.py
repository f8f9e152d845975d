"""Google API errors as the emulator answers them: an HTTP status, a canonical status name, a message, details.

Over REST, Google APIs answer errors as `{"error": {"code": <http>, "message", "status": <canonical name>,
"details": [...]}}`; a failed long-running operation carries a google.rpc.Status instead, whose `code` is the
gRPC number (8 for RESOURCE_EXHAUSTED). Both are built from one ApiError.

The meaning of an error is in its status and details, not in its message: messages change and are localized, so
every builder below lets a fault choose the message (one without any keyword a client might grep for) while the
details say what happened. Sources for the shapes:
- google/rpc/error_details.proto (googleapis; ErrorInfo, QuotaFailure, PreconditionFailure, Help) and
  google/api/error_reason.proto (reasons of the "googleapis.com" domain: RATE_LIMIT_EXCEEDED,
  RESOURCE_QUOTA_EXCEEDED, IAM_PERMISSION_DENIED with metadata {permission, resource}), both shipped in
  googleapis-common-protos.
- A real rate-limit answer (github.com/GoogleCloudPlatform/marketing-analytics-jumpstart/issues/163): 429
  RESOURCE_EXHAUSTED, message "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'
  of service '...' for consumer 'project_number:N'." (a rate limit whose message says "quota"), details ErrorInfo
  {reason RATE_LIMIT_EXCEEDED, domain googleapis.com, metadata consumer, quota_limit, quota_limit_value,
  quota_location, quota_metric, service} and Help {links}.
- A real Cloud TPU quota answer (github.com/marin-community/marin/pull/1612): HTTP 429 to nodes.create, "Quota
  limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region us-east5."
- A real Cloud TPU stockout (hashicorp/terraform-provider-google#10222, #21243): the create operation fails with
  "Error code 8, message: There is no more capacity in the zone ..."; others fail with code 8 and "Insufficient
  reserved capacity ..." (skypilot-org/skypilot#4579): code 8 of a failed create is the signal, not the words.
- Permission denied (AIP-211; CrowdStrike/falcon-integration-gateway#98): "Permission 'P' denied on resource 'R'
  (or it may not exist)."; Cloud IAM also answers just "Request denied by Cloud IAM." (SimpleCSPM#1).
"""

from __future__ import annotations

import random
from typing import Any

# Canonical codes (google.rpc.Code) and the HTTP status each maps to (google/rpc/code.proto).
GRPC_CODE = {
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}
HTTP_STATUS = {
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}
# The status an injected HTTP error of a given code carries, and its default message.
STATUS_FOR_HTTP = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
DEFAULT_MESSAGE = {
    429: "Too many requests: the rate limit for this method was reached; retry with backoff.",
    500: "Internal error encountered.",
    502: "The service is currently unavailable.",
    503: "The service is currently unavailable.",
    504: "The request timed out; retry it.",
}

TYPE_PREFIX = "type.googleapis.com/"
SERVICE = "tpu.googleapis.com"
INFRA_DOMAIN = "googleapis.com"  # the domain of Service Infrastructure's reasons (google/api/error_reason.proto)
QUOTA_HELP = "https://cloud.google.com/docs/quota#requesting_higher_quota"  # as the real answer links it


class ApiError(Exception):
    """An error answer. `http` overrides the status's usual HTTP code (an injected 502, say)."""

    def __init__(self, status: str, message: str, details: list[dict[str, Any]] | None = None, http: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details or []
        self.http = http or HTTP_STATUS.get(status, 500)

    @classmethod
    def of(cls, status: str | int, message: str, details: list[dict[str, Any]] | None = None) -> ApiError:
        """An error by canonical name ("INTERNAL") or gRPC number (13)."""
        if isinstance(status, int):
            status = next((name for name, code in GRPC_CODE.items() if code == status), "UNKNOWN")
        return cls(status, message, details)

    @classmethod
    def for_http(cls, code: int, message: str | None = None) -> ApiError:
        status = STATUS_FOR_HTTP.get(code, "UNKNOWN")
        return cls(status, message or DEFAULT_MESSAGE.get(code, f"HTTP {code}"), http=code)

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.http, "message": self.message, "status": self.status}
        if self.details:
            error["details"] = self.details
        return {"error": error}

    def rpc_status(self) -> dict[str, Any]:
        """As a google.rpc.Status: what a failed operation's `error` holds."""
        status: dict[str, Any] = {"code": GRPC_CODE.get(self.status, 2), "message": self.message}
        if self.details:
            status["details"] = self.details
        return status


def not_found(name: str) -> ApiError:
    return ApiError(
        "NOT_FOUND",
        f"Resource '{name}' was not found",
        [{"@type": TYPE_PREFIX + "google.rpc.ResourceInfo", "resourceName": name}],
    )


def already_exists(name: str, message: str | None = None) -> ApiError:
    return ApiError(
        "ALREADY_EXISTS",
        message or f"Resource '{name}' already exists",
        [{"@type": TYPE_PREFIX + "google.rpc.ResourceInfo", "resourceName": name}],
    )


def invalid(violations: list[tuple[str, str]]) -> ApiError:
    """400 INVALID_ARGUMENT listing every (field, description) found, with a google.rpc.BadRequest detail."""
    message = "; ".join(description for _, description in violations)
    detail = {
        "@type": TYPE_PREFIX + "google.rpc.BadRequest",
        "fieldViolations": [{"field": field, "description": description} for field, description in violations],
    }
    return ApiError("INVALID_ARGUMENT", message, [detail])


# -- details --------------------------------------------------------------------------------------------------


def error_info(reason: str, domain: str, metadata: dict[str, str]) -> dict[str, Any]:
    return {"@type": TYPE_PREFIX + "google.rpc.ErrorInfo", "reason": reason, "domain": domain, "metadata": metadata}


def help_link(description: str, url: str) -> dict[str, Any]:
    return {"@type": TYPE_PREFIX + "google.rpc.Help", "links": [{"description": description, "url": url}]}


def eid() -> str:
    """The "[EID: 0x...]" Cloud TPU appends to some messages: it makes every message unique, as real ones are."""
    return f"[EID: 0x{random.getrandbits(60):x}]"


# -- the errors the faults inject -------------------------------------------------------------------------------


def rate_limited(project_number: str, *, message: str | None = None) -> ApiError:
    """429 for too many requests: ErrorInfo RATE_LIMIT_EXCEEDED, with the real (and misleading) "Quota exceeded"
    message by default: a client must tell a rate limit (retry) from an exhausted quota (do not) by the details."""
    metric, limit = f"{SERVICE}/default_requests", "DefaultRequestsPerMinutePerProject"
    text = message or (
        "Quota exceeded for quota metric 'Default requests' and limit 'Default requests per minute' of service "
        f"'{SERVICE}' for consumer 'project_number:{project_number}'."
    )
    meta = {
        "consumer": f"projects/{project_number}",
        "service": SERVICE,
        "quota_metric": metric,
        "quota_limit": limit,
        "quota_limit_value": "600",
        "quota_location": "global",
    }
    return ApiError(
        "RESOURCE_EXHAUSTED",
        text,
        [error_info("RATE_LIMIT_EXCEEDED", INFRA_DOMAIN, meta), help_link("Request a higher quota limit.", QUOTA_HELP)],
    )


def quota_exceeded(
    project: str, region: str, quota: str, limit: int, *, message: str | None = None, reason: str | None = None
) -> ApiError:
    """RESOURCE_EXHAUSTED for an exhausted quota: a google.rpc.QuotaFailure names the quota (subject and
    description, plus the quota id and value the newer proto has); an ErrorInfo only when `reason` is given
    (e.g. RESOURCE_QUOTA_EXCEEDED), since Cloud TPU's own answers are not known to carry one."""
    description = f"Quota limit '{quota}' has been exceeded. Limit: {limit} in region {region}."
    violation = {
        "subject": f"project:{project}",
        "description": description,
        "apiService": SERVICE,
        "quotaId": quota,
        "quotaDimensions": {"region": region},
        "quotaValue": str(limit),
    }
    details: list[dict[str, Any]] = [{"@type": TYPE_PREFIX + "google.rpc.QuotaFailure", "violations": [violation]}]
    if reason:
        details.insert(0, error_info(reason, INFRA_DOMAIN, {"service": SERVICE, "quota_limit": quota}))
    details.append(help_link("Request a higher quota limit.", QUOTA_HELP))
    return ApiError("RESOURCE_EXHAUSTED", message or description, details)


def stockout(zone: str, accelerator: str, *, message: str | None = None, reason: str | None = None) -> ApiError:
    """What a failed create operation holds when the zone has no capacity: code 8, no details (Cloud TPU's
    stockouts are not known to carry any) unless the fault gives a `reason` for an ErrorInfo."""
    text = message or (
        f'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU Nodes are '
        f"offered (see https://cloud.google.com/tpu/docs/regions) {eid()}"
    )
    details = [error_info(reason, SERVICE, {"zone": zone, "acceleratorType": accelerator})] if reason else None
    return ApiError("RESOURCE_EXHAUSTED", text, details)


def permission_denied(permission: str, resource: str, *, message: str | None = None) -> ApiError:
    """403 with ErrorInfo IAM_PERMISSION_DENIED {permission, resource}, the shape error_reason.proto documents."""
    text = message or f"Permission '{permission}' denied on resource '{resource}' (or it may not exist)."
    meta = {"permission": permission, "resource": resource}
    return ApiError("PERMISSION_DENIED", text, [error_info("IAM_PERMISSION_DENIED", INFRA_DOMAIN, meta)])


def delete_failed(name: str, status: str | int, *, message: str | None = None, reason: str | None = None) -> ApiError:
    """What a failed delete operation holds: the chosen status, an ErrorInfo naming the node, and for
    FAILED_PRECONDITION the google.rpc.PreconditionFailure that status calls for (google/rpc/code.proto)."""
    error = ApiError.of(status, "")
    if message:
        text = message
    elif error.status == "FAILED_PRECONDITION":
        text = f"The node {name} cannot be deleted in its current state; retry later."
    elif error.status == "PERMISSION_DENIED":
        text = f"Permission 'tpu.nodes.delete' denied on '{name}'"
    else:
        text = f"An internal error has occurred while deleting {name}. {eid()}"
    details = [error_info(reason or error.status, SERVICE, {"resource": name})]
    if error.status == "FAILED_PRECONDITION":
        violation = {"type": "STATE", "subject": name, "description": text}
        details.append({"@type": TYPE_PREFIX + "google.rpc.PreconditionFailure", "violations": [violation]})
    return ApiError(error.status, text, details)
