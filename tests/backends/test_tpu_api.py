"""The Cloud TPU API seam's error classification: from status codes and google.rpc details, never from our words.

The errors are built the way google-api-core builds them from a REST answer (format_http_response_error on a real
requests.Response) and the way a failed long-running operation carries them (a google.rpc.Status with packed
details); the end-to-end paths run the real client against the emulator in test_tpu_vm.py and test_teardown.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from runner.backends.tpu_vm.api import explain, failure_of, failure_of_status
from runner.errors import AlreadyExists, BackendError, NoCapacity, QuotaExceeded

URL = "http://127.0.0.1:9/v2/projects/p/locations/us-central1-b/nodes?nodeId=n&%24alt=json%3Benum-encoding%3Dint"
T = "type.googleapis.com/google.rpc."


def rest_error(http: int, status: str, message: str, details: list[dict[str, Any]] | None = None) -> Exception:
    payload = {"error": {"code": http, "message": message, "status": status, "details": details or []}}
    response = requests.Response()
    response.status_code = http
    response._content = json.dumps(payload).encode()
    return gexc.format_http_response_error(response, "POST", URL, payload)


def op_error(code: int, message: str, *details: Any) -> status_pb2.Status:
    status = status_pb2.Status(code=code, message=message)
    for detail in details:
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    return status


def classify(exc_or_status: Any) -> BackendError:
    failure = (
        failure_of_status(exc_or_status) if isinstance(exc_or_status, status_pb2.Status) else failure_of(exc_or_status)
    )
    assert failure is not None
    return explain(failure, "create TPU node n", project="p", zone="us-central1-b")


RATE = {"@type": T + "ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED", "domain": "googleapis.com"}
QUOTA = {"@type": T + "QuotaFailure", "violations": [{"subject": "TPUV2sPerProjectPerZone", "description": "0 of 8"}]}


def test_the_request_url_stays_out_of_messages_unless_debugging(monkeypatch: pytest.MonkeyPatch) -> None:
    failure = failure_of(rest_error(400, "INVALID_ARGUMENT", "bad runtime"))
    assert failure is not None and failure.message == "bad runtime" and "%24alt" not in failure.said()
    monkeypatch.setenv("RUNNER_DEBUG", "1")
    assert URL in failure.said()


@pytest.mark.parametrize(
    ("error", "kind", "words", "transient"),
    [
        # A rate limit that says "Quota" in prose is still a rate limit: the ErrorInfo reason decides.
        (rest_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for reads", [RATE]), BackendError, "rate-limited", True),
        # An exhausted quota whose message never says so: the QuotaFailure detail decides.
        (
            rest_error(429, "RESOURCE_EXHAUSTED", "Limit reached.", [QUOTA]),
            QuotaExceeded,
            "TPUV2sPerProjectPerZone",
            False,
        ),
        (
            rest_error(
                429,
                "RESOURCE_EXHAUSTED",
                "Request denied.",
                [{"@type": T + "ErrorInfo", "reason": "RESOURCE_QUOTA_EXCEEDED", "domain": "googleapis.com"}],
            ),
            QuotaExceeded,
            "quota exhausted",
            False,
        ),
        (
            rest_error(
                403,
                "PERMISSION_DENIED",
                "The caller does not have permission",
                [
                    {
                        "@type": T + "ErrorInfo",
                        "reason": "IAM_PERMISSION_DENIED",
                        "metadata": {"permission": "tpu.nodes.create"},
                    }
                ],
            ),
            BackendError,
            "tpu.nodes.create",
            False,
        ),
        (
            rest_error(403, "PERMISSION_DENIED", "API off", [{"@type": T + "ErrorInfo", "reason": "SERVICE_DISABLED"}]),
            BackendError,
            "gcloud services enable tpu.googleapis.com",
            False,
        ),
        (rest_error(409, "ALREADY_EXISTS", "Resource exists"), AlreadyExists, "exists already", False),
        (rest_error(409, "ABORTED", "Concurrent change"), BackendError, "ABORTED", True),
        (rest_error(503, "UNAVAILABLE", "Try later"), BackendError, "unavailable", True),
        (
            rest_error(
                400,
                "INVALID_ARGUMENT",
                "Invalid node",
                [
                    {
                        "@type": T + "BadRequest",
                        "fieldViolations": [{"field": "node.runtime_version", "description": "unknown"}],
                    }
                ],
            ),
            BackendError,
            "node.runtime_version: unknown",
            False,
        ),
        # Failed operations: code 8 without a quota detail is a stockout; with one, a quota.
        (op_error(8, "There is no more room here."), NoCapacity, "stockout", False),
        (
            op_error(
                8,
                "Denied.",
                error_details_pb2.QuotaFailure(
                    violations=[error_details_pb2.QuotaFailure.Violation(subject="TPUV4PodPerProjectPerRegion")]
                ),
            ),
            QuotaExceeded,
            "TPUV4PodPerProjectPerRegion",
            False,
        ),
    ],
)
def test_errors_are_classified_from_codes_and_details(error: Any, kind: type, words: str, transient: bool) -> None:
    failure = failure_of_status(error) if isinstance(error, status_pb2.Status) else failure_of(error)
    assert failure is not None and failure.transient is transient
    explained = classify(error)
    assert type(explained) is kind, explained
    assert words in f"{explained.message} {explained.hint or ''}"
    assert "%24alt" not in explained.message


def test_a_retry_that_gave_up_is_classified_by_its_cause() -> None:
    cause = rest_error(503, "UNAVAILABLE", "backend down")
    explained = classify(gexc.RetryError("Timeout of 120.0s exceeded", cause))
    assert "stayed unavailable" in explained.message and "status.cloud.google.com" in (explained.hint or "")
