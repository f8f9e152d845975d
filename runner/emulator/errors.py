"""Google API errors as the emulator answers them: an HTTP status, a canonical status name, a message, details.

Over REST, Google APIs answer errors as `{"error": {"code": <http>, "message", "status": <canonical name>,
"details": [...]}}`; a failed long-running operation carries a google.rpc.Status instead, whose `code` is the
gRPC number (8 for RESOURCE_EXHAUSTED). Both are built from one ApiError.
"""

from __future__ import annotations

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


class ApiError(Exception):
    """An error answer. `http` overrides the status's usual HTTP code (an injected 502, say)."""

    def __init__(self, status: str, message: str, details: list[dict[str, Any]] | None = None, http: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details or []
        self.http = http or HTTP_STATUS.get(status, 500)

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


def already_exists(name: str) -> ApiError:
    return ApiError(
        "ALREADY_EXISTS",
        f"Resource '{name}' already exists",
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
