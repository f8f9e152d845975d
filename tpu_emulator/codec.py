"""JSON in and out through the API's own protobuf types, so every answer parses the way the client parses it.

Requests are parsed strictly (an unknown field is a 400, as on the real API) and kept as canonical camelCase
JSON. Answers are rendered through the same types: defaults are omitted as proto3 JSON does, int64 values are
strings, and enums are names, or numbers when the request asked for `$alt=json;enum-encoding=int` (which the
Python client always sends).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from google.cloud.tpu_v2.types import cloud_tpu
from google.longrunning import operations_pb2
from google.protobuf import json_format
from google.protobuf.message import Message

from tpu_emulator.errors import TYPE_PREFIX, ApiError

NODE = cloud_tpu.Node.pb()
QUEUED_RESOURCE = cloud_tpu.QueuedResource.pb()
OPERATION = operations_pb2.Operation
NODE_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.Node"
QUEUED_RESOURCE_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.QueuedResource"
OPERATION_METADATA_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.OperationMetadata"
EMPTY_TYPE = TYPE_PREFIX + "google.protobuf.Empty"


def parse_body(raw: bytes, message: type[Message], field: str) -> dict[str, Any]:
    """The request body as canonical JSON of `message`; 400 INVALID_ARGUMENT when it is not one."""
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. {exc}.") from None
    if not isinstance(data, dict):
        raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. '{field}' must be a JSON object.")
    try:
        parsed = json_format.ParseDict(data, message(), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        text = str(exc)
        if "has no field named" in text:
            name = text.split('has no field named "', 1)[-1].split('"', 1)[0]
            text = f"Invalid JSON payload received. Unknown name \"{name}\" at '{field}': Cannot find field."
        else:
            text = f"Invalid JSON payload received at '{field}': {text}"
        raise ApiError("INVALID_ARGUMENT", text) from None
    return json_format.MessageToDict(parsed)


def render(data: dict[str, Any], message: type[Message], *, numeric_enums: bool) -> dict[str, Any]:
    """`data` (camelCase JSON) as the API's JSON answer for `message`."""
    parsed = json_format.ParseDict(data, message(), ignore_unknown_fields=False)
    return json_format.MessageToDict(parsed, use_integers_for_enums=numeric_enums)


def timestamp(t: float) -> str:
    """RFC 3339 UTC with microseconds, as Google APIs write times."""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
