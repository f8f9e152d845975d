"""Compute Engine's errors, as its REST API answers them and as its operations report them.

An error answered at once keeps the shape Compute Engine has always had, plus the canonical fields Google's front
end adds:
    {"error": {"code": 404, "message": "The resource 'projects/p/zones/z/instances/x' was not found",
               "errors": [{"message": ..., "domain": "global", "reason": "notFound"}]}}
Requests refused by the schema (tpu_emulator.discovery) also carry "status": "INVALID_ARGUMENT" and a
google.rpc.BadRequest detail, as the JSON front end answers them. google-api-core turns either into its exception by
HTTP status (NotFound, BadRequest, Forbidden, Conflict) with `.errors` the list above.

A failed operation answers 200 with status DONE and
    "error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": ...}]},
    "httpErrorStatusCode": 503, "httpErrorMessage": "SERVICE UNAVAILABLE"
and google-api-core's ExtendedOperation raises from httpErrorStatusCode with `.errors` = error.errors. The codes are
the contract (ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED, ...); the words are not. Sources:
- stockout: "ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'projects/P/zones/Z' does not have enough resources available
  to fulfill the request.  Try a different zone, or try again later." in a create operation
  (googlefonts/fontbakery-dashboard#81, GoogleCloudPlatform/DataflowTemplates#2263); "503 SERVICE UNAVAILABLE
  ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" (scylladb/scylla-cluster-tests#12477); errorDetails with help links
  (https://cloud.google.com/compute/docs/resource-error) and a localizedMessage (google/go-tpm-tools#578); the
  instance of a stocked-out insert is gone (404) once the operation fails (googleapis/nodejs-compute#377).
- quota: the operation's QUOTA_EXCEEDED with a quotaInfo errorDetail (compute.v1.json, Operation.error: "For
  example, QuotaExceededInfo will have details when the error code is QUOTA_EXCEEDED"); the 403 answer's reason
  quotaExceeded and its "Quota 'X' exceeded. Limit: L in region R." wording: unconfirmed.
- a gang (all-or-nothing) group that cannot get its VMs: "Atomic resize failed with [GCE_STOCKOUT]" (the project's
  notes, /work/shared/DESIGN.md, from cloud.google.com/tpu/docs/tpus-and-migs); the rest of that message and where
  exactly Compute Engine shows it (here: the group's listErrors and each planned instance's lastAttempt): unconfirmed.
- permission denied: "Required 'compute.instances.delete' permission for 'projects/...'" with reason forbidden:
  Compute Engine's long-standing wording; unconfirmed in detail.
"""

from __future__ import annotations

from typing import Any

from tpu_emulator.errors import HTTP_STATUS, TYPE_PREFIX, ApiError

HELP_URL = "https://cloud.google.com/compute/docs/resource-error"
HTTP_MESSAGE = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND", 409: "CONFLICT", 429: "TOO MANY REQUESTS"}
HTTP_MESSAGE |= {500: "INTERNAL SERVER ERROR", 503: "SERVICE UNAVAILABLE"}


class ComputeError(ApiError):
    """An error answered at once, in Compute Engine's shape. `reason` goes into errors[0].reason; `canonical`
    adds the front end's status and details (schema violations)."""

    def __init__(
        self,
        status: str,
        message: str,
        reason: str,
        *,
        canonical: bool = False,
        details: list[dict[str, Any]] | None = None,
        http: int | None = None,
    ) -> None:
        super().__init__(status, message, details, http)
        self.reason = reason
        self.canonical = canonical

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "code": self.http,
            "message": self.message,
            "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
        }
        if self.canonical:
            error["status"] = self.status
            if self.details:
                error["details"] = self.details
        return {"error": error}


def schema_invalid(violations: list[tuple[str, str]]) -> ComputeError:
    detail = {
        "@type": TYPE_PREFIX + "google.rpc.BadRequest",
        "fieldViolations": [{"field": field, "description": text} for field, text in violations],
    }
    message = "; ".join(text for _, text in violations)
    return ComputeError("INVALID_ARGUMENT", message, "badRequest", canonical=True, details=[detail])


def invalid(message: str) -> ComputeError:
    return ComputeError("INVALID_ARGUMENT", message, "invalid")


def invalid_field(field: str, value: Any, why: str) -> ComputeError:
    return invalid(f"Invalid value for field '{field}': '{value}'. {why}")


def not_found(resource: str) -> ComputeError:
    return ComputeError("NOT_FOUND", f"The resource '{resource}' was not found", "notFound")


def already_exists(resource: str) -> ComputeError:
    return ComputeError("ALREADY_EXISTS", f"The resource '{resource}' already exists", "alreadyExists")


def in_use(resource: str, user: str) -> ComputeError:
    return ComputeError(
        "FAILED_PRECONDITION",
        f"The resource '{resource}' is already being used by '{user}'",
        "resourceInUseByAnotherResource",
        http=400,
    )


def precondition(message: str) -> ComputeError:
    return ComputeError("FAILED_PRECONDITION", message, "conditionNotMet", http=400)


def permission_denied(permission: str, resource: str, message: str | None = None) -> ComputeError:
    text = message or f"Required '{permission}' permission for '{resource}'"
    return ComputeError("PERMISSION_DENIED", text, "forbidden")


def quota_answer(quota: str, limit: float, region: str, message: str | None = None) -> ComputeError:
    text = message or f"Quota '{quota}' exceeded.  Limit: {float(limit)} in region {region}."
    return ComputeError("PERMISSION_DENIED", text, "quotaExceeded", http=403)


def of_http(code: int, message: str | None) -> ComputeError:
    """An injected HTTP error (the http and rate_limit faults) in Compute Engine's shape."""
    base = ApiError.for_http(code, message)
    reason = {429: "rateLimitExceeded", 503: "backendError", 500: "backendError"}.get(code, "backendError")
    return ComputeError(base.status, base.message, reason, http=code)


# -- what an operation's error holds ---------------------------------------------------------------------------


def op_error(code: str, message: str, http: int, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The fields a failed operation adds: error.errors[] plus httpErrorStatusCode and httpErrorMessage."""
    entry: dict[str, Any] = {"code": code, "message": message}
    if details:
        entry["errorDetails"] = details
    return {
        "error": {"errors": [entry]},
        "httpErrorStatusCode": http,
        "httpErrorMessage": HTTP_MESSAGE.get(http, "ERROR"),
    }


def _help(description: str) -> dict[str, Any]:
    return {"help": {"links": [{"description": description, "url": HELP_URL}]}}


def stockout(project: str, zone: str, what: str, message: str | None = None) -> dict[str, Any]:
    text = message or (
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill the "
        "request.  Try a different zone, or try again later."
    )
    localized = {
        "localizedMessage": {"locale": "en-US", "message": f"{what} is currently unavailable in the {zone} zone."}
    }
    return op_error("ZONE_RESOURCE_POOL_EXHAUSTED", text, 503, [_help("Troubleshooting documentation"), localized])


def quota_in_operation(
    project: str, region: str, metric: str, limit: float, message: str | None = None
) -> dict[str, Any]:
    text = message or f"Quota '{metric}' exceeded.  Limit: {float(limit)} in region {region}."
    info = {
        "quotaInfo": {
            "metricName": f"compute.googleapis.com/{metric.lower()}",
            "limitName": f"{metric}-per-project-region",
            "dimensions": {"region": region},
            "limit": float(limit),
        }
    }
    return op_error("QUOTA_EXCEEDED", text, 403, [info])


def gang_stockout(project: str, zone: str, size: int, message: str | None = None) -> tuple[str, str]:
    """(code, message) of an all-or-nothing group that could not get all of its VMs at once."""
    text = message or (
        f"Atomic resize failed with [GCE_STOCKOUT]: the zone 'projects/{project}/zones/{zone}' does not have "
        f"enough resources to create all {size} instances of the group at once."
    )
    return "ZONE_RESOURCE_POOL_EXHAUSTED", text


def failed(status: str | int, message: str, reason: str | None = None) -> dict[str, Any]:
    """An operation failed with a canonical status (a fault's delete_fails or queued_fails)."""
    error = ApiError.of(status, message)
    return op_error(reason or error.status, message, HTTP_STATUS.get(error.status, 500))
