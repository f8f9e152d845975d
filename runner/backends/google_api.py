"""What every Google API seam of the runner shares (the Cloud TPU API's, Compute Engine's): errors reduced to what
the API states, which of them are worth a retry, the retry itself, and the API's own clock.

Errors are classified from what the API says in structure, not in prose (cloud.google.com/apis/design/errors):
the canonical status code, and the google.rpc details of the error: ErrorInfo.reason (RATE_LIMIT_EXCEEDED is a
rate limit that passes; RESOURCE_QUOTA_EXCEEDED an allocation quota that does not, per
google/api/error_reason.proto), QuotaFailure violations, BadRequest field violations. Google's RPCs over REST have
no default retry here: transient answers (429 rate limits, 5xx, dropped connections) are retried with backoff.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runner.errors import BackendError

DEBUG_ENV = "RUNNER_DEBUG"

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


def clocked(interceptor: type, clock: ApiClock, *methods: str) -> Any:
    """An instance of a client library's REST interceptor class (its documented hook on every answer) whose
    `post_<method>_with_metadata` hooks hand the answers' headers to `clock`."""

    def note(self: Any, response: Any, metadata: Any) -> Any:
        clock.note(metadata)
        return response, metadata

    hooks = {f"post_{method}_with_metadata": note for method in methods}
    return type(f"Clocked{interceptor.__name__}", (interceptor,), hooks)()


def plain_failure(failure: ApiFailure, action: str, *, project: str, zone: str) -> BackendError:
    """What each API's `explain` says last, alike for every Google API: a missing resource, missing credentials, and
    anything else with its code."""
    said, code = failure.said(), failure.code
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


def quoted_after(message: str, marker: str) -> str | None:
    """The 'quoted' word after `marker` in an API's message (Permission 'tpu.nodes.create' ...), or None."""
    start = message.find(marker + "'")
    if start < 0:
        return None
    rest = message[start + len(marker) + 1 :]
    end = rest.find("'")
    return rest[:end] if end > 0 else None
