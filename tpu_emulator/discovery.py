"""Google's discovery documents as the schema of both emulated APIs: one validator for requests and answers.

The PyPI package google-api-python-client ships Google's own discovery documents
(googleapiclient/discovery_cache/documents/tpu.v2.json, compute.v1.json). They are the machine-readable contract
of each REST API: every method's HTTP verb, path template and parameters, and every schema's properties with
their types, formats and enums. Checking against them anchors the emulators to what Google publishes rather than
to our reading of the docs. The package is a test (dev) dependency: `load` returns None where it is not installed,
and the emulators then keep only their own checks. The runner never imports this module.

What is checked, for a method named by its discovery id (compute.instances.insert, tpu.projects.locations.nodes.create):
- path parameters: present, and matching the parameter's `pattern` (whole value);
- query parameters: known to the method or one of the document's standard parameters (alt, fields, key,
  prettyPrint, quotaUser, ...; also with the `$` prefix Google's system parameters allow, as `$alt`, which the Python
  clients send as `$alt=json;enum-encoding=int`); typed (integer, boolean, enum); `required` ones present;
- the body, at any depth: unknown fields, JSON types, formats (int64/uint64 as strings of digits, int32/uint32 in
  range, google-duration "3.5s", google-datetime RFC 3339, byte as base64), enums, property patterns, maps
  (additionalProperties), arrays, and required fields. Discovery documents mark required body fields two ways:
  Compute Engine's `annotations.required` lists the method ids that need the field; documents generated from
  protos (tpu.v2) start the field's description with "Required." (google.api.field_behavior REQUIRED);
- answers: the same walk over a method's response schema, stricter on ourselves (int64 must be a string, no nulls,
  no request-only leniency), without required fields.

Request leniency is proto3 JSON's (developers.google.com/protocol-buffers/docs/proto3#json), which Google's front
ends apply: int64 as a string or a number, int32 as a number or a numeric string, null for "not set", enum numbers
when the request asked for `enum-encoding=int`. Output-only fields in a request are accepted (and ignored by the
emulators), as the real APIs do.

A problem is a (field, description) pair, the shape of google.rpc.BadRequest.FieldViolation; the descriptions
follow the wording of Google's JSON front end ("Invalid JSON payload received. Unknown name ..."); they are the
emulator's words, the status and details are Google's.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib.util
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Violations = list[tuple[str, str]]
Mode = Literal["request", "response"]

_DOCUMENTS = ("discovery_cache", "documents")
_INT_RANGE = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}
_DURATION = re.compile(r"^-?\d{1,12}(\.\d{1,9})?s$")
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
_DIGITS = re.compile(r"^-?\d+$")
_TEMPLATE_VAR = re.compile(r"\{(\+?)([A-Za-z0-9_]+)\}")
_REQUIRED_PREFIX = "Required."


def documents_dir() -> Path | None:
    """Where google-api-python-client keeps its discovery documents; None when it is not installed. The package
    is found without being imported (its import pulls in httplib2 and more)."""
    spec = importlib.util.find_spec("googleapiclient")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location).joinpath(*_DOCUMENTS)
        if folder.is_dir():
            return folder
    return None


@functools.cache
def load(filename: str) -> Discovery | None:
    """The discovery document `filename` (tpu.v2.json, compute.v1.json), parsed once; None when unavailable."""
    folder = documents_dir()
    if folder is None or not (folder / filename).is_file():
        return None
    return Discovery(json.loads((folder / filename).read_text()))


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclass(frozen=True)
class Method:
    id: str
    http_method: str
    path: str  # the template relative to the service path: v2/{+parent}/nodes, projects/{project}/zones/{zone}/...
    parameters: Mapping[str, Any]
    request: str | None  # the body's schema name
    response: str | None

    def template(self) -> re.Pattern[str]:
        """The path template as a regular expression: {x} is one segment, {+x} (reserved expansion) any path."""
        out, last = [], 0
        for m in _TEMPLATE_VAR.finditer(self.path):
            out.append(re.escape(self.path[last : m.start()]))
            out.append(f"(?P<{m[2]}>.+)" if m[1] else f"(?P<{m[2]}>[^/]+)")
            last = m.end()
        out.append(re.escape(self.path[last:]))
        return re.compile("^" + "".join(out) + "$")


class Discovery:
    """One discovery document: its methods by id, its schemas, and the checks."""

    def __init__(self, doc: dict[str, Any], *, snake_case_fields: bool | None = None) -> None:
        self.doc = doc
        self.name: str = doc["name"]
        self.version: str = doc["version"]
        self.revision: str = doc.get("revision", "")
        self.service_path: str = doc.get("servicePath", "")
        self.schemas: dict[str, Any] = doc["schemas"]
        self.standard: dict[str, Any] = doc.get("parameters", {})
        self.methods: dict[str, Method] = {}
        self._collect(doc.get("resources", {}))
        # Field paths in violations: proto-generated APIs (tpu) name fields as the proto does (snake_case);
        # Compute Engine's messages name them as its JSON does (camelCase).
        self.snake = snake_case_fields if snake_case_fields is not None else self.name != "compute"

    def _collect(self, resources: dict[str, Any]) -> None:
        for resource in resources.values():
            for m in resource.get("methods", {}).values():
                self.methods[m["id"]] = Method(
                    m["id"],
                    m["httpMethod"],
                    m["path"],
                    m.get("parameters", {}),
                    (m.get("request") or {}).get("$ref"),
                    (m.get("response") or {}).get("$ref"),
                )
            self._collect(resource.get("resources", {}))

    def __repr__(self) -> str:
        return f"<Discovery {self.name}.{self.version} rev {self.revision}>"

    def method(self, method_id: str) -> Method:
        try:
            return self.methods[method_id]
        except KeyError:
            raise KeyError(f"{self.name}.{self.version} has no method {method_id}") from None

    # -- paths ------------------------------------------------------------------------------------------------

    def relative(self, url_path: str) -> str:
        """A request's URL path relative to the service path (/compute/v1/projects/... -> projects/...)."""
        return url_path.lstrip("/").removeprefix(self.service_path)

    def path_params(self, method_id: str, url_path: str) -> dict[str, str] | None:
        """The path parameters of `url_path` by the method's template; None when it does not match."""
        found = self.method(method_id).template().match(self.relative(url_path))
        return found.groupdict() if found else None

    # -- requests ---------------------------------------------------------------------------------------------

    def check_request(
        self,
        method_id: str,
        url_path: str,
        query: Mapping[str, str],
        body: Any,
        *,
        body_name: str = "resource",
    ) -> Violations:
        """Every problem of one request to `method_id`: path, query and body (`body`: parsed JSON, or None when
        the request had none). `body_name` is how violations name the body ("node", "resource")."""
        method = self.method(method_id)
        problems: Violations = []
        params = self.path_params(method_id, url_path)
        if params is None:
            return [("", f"The path {url_path} does not match {method.id}'s template {method.path}.")]
        numeric = False
        for name, spec in method.parameters.items():
            if spec.get("location") == "path":
                value = params.get(name)
                if not value:
                    problems.append((name, f"Required path parameter '{name}' is missing."))
                elif spec.get("pattern") and not re.fullmatch(spec["pattern"], value):
                    problems.append(
                        (name, f"Invalid value for path parameter '{name}': '{value}' (must match {spec['pattern']}).")
                    )
            elif spec.get("required") and name not in query:
                problems.append((name, f"Required query parameter '{name}' is missing."))
        for key, value in query.items():
            spec = method.parameters.get(key)
            if spec is not None and spec.get("location") == "query":
                problems += self._param(key, spec, value)
                continue
            standard = self.standard.get(key.removeprefix("$"))
            if standard is None:
                problems.append(
                    (
                        key,
                        f'Invalid JSON payload received. Unknown name "{key}": Cannot bind query parameter. '
                        f"Field '{key}' could not be found in request message.",
                    )
                )
            elif key.removeprefix("$") == "alt":
                base, _, options = value.partition(";")
                numeric = options == "enum-encoding=int"
                problems += self._param(key, standard, base)
                if options and not numeric:
                    problems.append((key, f"Invalid system parameter {key}={value}: unknown option '{options}'."))
            else:
                problems += self._param(key, standard, value)
        if method.request is None:
            if body not in (None, {}):
                problems.append((body_name, f"{method.id} takes no request body."))
            return problems
        walker = _Walk(self, "request", method.id, numeric)
        walker.value({"$ref": method.request}, {} if body is None else body, body_name)
        return problems + walker.problems

    def _param(self, key: str, spec: Mapping[str, Any], value: str) -> Violations:
        kind = spec.get("type")
        bad = f"Invalid value for query parameter '{key}': '{value}'"
        if kind == "integer":
            if not _DIGITS.match(value):
                return [(key, f"{bad} (an integer is expected).")]
            low, high = _INT_RANGE.get(spec.get("format", "int32"), _INT_RANGE["int64"])
            if "minimum" in spec:
                low = max(low, int(spec["minimum"]))
            if "maximum" in spec:
                high = min(high, int(spec["maximum"]))
            if not low <= int(value) <= high:
                return [(key, f"{bad} (out of range {low}..{high}).")]
        elif kind == "boolean" and value not in ("true", "false"):
            return [(key, f"{bad} (true or false is expected).")]
        elif "enum" in spec and value not in spec["enum"]:
            return [(key, f"{bad} (one of {', '.join(spec['enum'])} is expected).")]
        return []

    # -- answers ----------------------------------------------------------------------------------------------

    def check_response(self, method_id: str, body: Any, *, numeric_enums: bool = False) -> Violations:
        """Every way an answer of `method_id` departs from its response schema (nothing for a method without one)."""
        method = self.method(method_id)
        if method.response is None:
            return []
        walker = _Walk(self, "response", method.id, numeric_enums)
        walker.value({"$ref": method.response}, body, "response")
        return walker.problems

    def check_schema(self, schema: str, value: Any, *, mode: Mode = "response", where: str = "") -> Violations:
        """`value` against the named schema (a nested answer such as an Operation's error), outside any method."""
        walker = _Walk(self, mode, "", False)
        walker.value({"$ref": schema}, value, where or schema)
        return walker.problems


class _Walk:
    """One walk of a JSON value against a schema, collecting problems."""

    def __init__(self, doc: Discovery, mode: Mode, method_id: str, numeric_enums: bool) -> None:
        self.doc = doc
        self.mode = mode
        self.method_id = method_id
        self.numeric_enums = numeric_enums
        self.problems: Violations = []

    def _name(self, field: str) -> str:
        return _snake(field) if self.doc.snake else field

    def _fail(self, where: str, description: str) -> None:
        self.problems.append((where, description))

    def _required(self, spec: Mapping[str, Any]) -> bool:
        if self.mode != "request" or spec.get("readOnly"):
            return False
        if self.method_id in (spec.get("annotations") or {}).get("required", ()):
            return True
        return str(spec.get("description", "")).startswith(_REQUIRED_PREFIX)

    def value(self, spec: Mapping[str, Any], value: Any, where: str) -> None:
        if "$ref" in spec:
            ref = spec["$ref"]
            if ref not in self.doc.schemas:
                self._fail(where, f"the discovery document has no schema {ref}")
                return
            spec = {**self.doc.schemas[ref], **{k: v for k, v in spec.items() if k != "$ref"}}
        if value is None:
            if self.mode == "response":
                self._fail(where, f"Invalid value at '{where}': null (an answer omits what is not set)")
            return  # proto3 JSON: null is "not set"
        kind = spec.get("type")
        if kind == "any":
            return
        if kind == "object" or "properties" in spec or "additionalProperties" in spec:
            self._object(spec, value, where)
        elif kind == "array":
            if not isinstance(value, list):
                self._fail(where, f"Invalid value at '{where}' (TYPE_LIST), {_short(value)}: a JSON array is expected")
                return
            for i, item in enumerate(value):
                self.value(spec.get("items", {}), item, f"{where}[{i}]")
        elif kind == "string":
            self._string(spec, value, where)
        elif kind == "integer":
            self._integer(spec, value, where)
        elif kind == "number":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if self.mode == "request" and isinstance(value, str):
                ok = value in ("NaN", "Infinity", "-Infinity") or _is_float(value)
            if not ok:
                self._fail(where, f"Invalid value at '{where}' (TYPE_DOUBLE), {_short(value)}")
        elif kind == "boolean":
            if not isinstance(value, bool):
                self._fail(where, f"Invalid value at '{where}' (TYPE_BOOL), {_short(value)}")
        else:
            self._fail(where, f"the discovery document gives {where} an unknown type {kind!r}")

    def _object(self, spec: Mapping[str, Any], value: Any, where: str) -> None:
        if not isinstance(value, dict):
            self._fail(where, f"Invalid value at '{where}' (TYPE_MESSAGE), {_short(value)}: a JSON object is expected")
            return
        props: Mapping[str, Any] = spec.get("properties", {})
        extra = spec.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                self.value(props[key], item, f"{where}.{self._name(key)}" if where else self._name(key))
            elif extra is not None:
                self.value(extra, item, f"{where}[{key}]")
            elif key == "@type" and spec.get("format") == "google.protobuf.Any":
                continue
            else:
                self._fail(
                    where, f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}': Cannot find field."
                )
        for key, prop in props.items():
            if key not in value and self._required(prop):
                field = f"{where}.{self._name(key)}" if where else self._name(key)
                self._fail(field, f"Required field '{field}' not specified")

    def _string(self, spec: Mapping[str, Any], value: Any, where: str) -> None:
        fmt = spec.get("format")
        if fmt in _INT_RANGE:  # int64/uint64: a string of digits (proto3 JSON also takes a number in requests)
            number_ok = self.mode == "request" and isinstance(value, int) and not isinstance(value, bool)
            if not (number_ok or (isinstance(value, str) and _DIGITS.match(value))):
                self._fail(where, f"Invalid value at '{where}' (TYPE_{fmt.upper()}), {_short(value)}")
                return
            low, high = _INT_RANGE[fmt]
            if not low <= int(value) <= high:
                self._fail(where, f"Invalid value at '{where}' (TYPE_{fmt.upper()}), {value}: out of range")
            return
        if not isinstance(value, str):
            if "enum" in spec and self.numeric_enums and isinstance(value, int) and not isinstance(value, bool):
                if value < 0:
                    self._fail(where, f"Invalid value at '{where}' (TYPE_ENUM), {value}")
                return
            self._fail(where, f"Invalid value at '{where}' (TYPE_STRING), {_short(value)}")
            return
        if "enum" in spec and value not in spec["enum"]:
            self._fail(where, f"Invalid value at '{where}' (TYPE_ENUM), \"{value}\": one of {', '.join(spec['enum'])}")
        elif fmt == "google-duration" and not _DURATION.match(value):
            self._fail(where, f"Invalid value at '{where}' (type.googleapis.com/google.protobuf.Duration), \"{value}\"")
        elif fmt == "google-datetime" and not _DATETIME.match(value):
            self._fail(
                where, f"Invalid value at '{where}' (type.googleapis.com/google.protobuf.Timestamp), \"{value}\""
            )
        elif fmt == "byte" and not _is_base64(value):
            self._fail(where, f"Invalid value at '{where}' (TYPE_BYTES), \"{_short(value)}\": not base64")
        elif spec.get("pattern") and self.mode == "request" and not re.fullmatch(spec["pattern"], value):
            self._fail(
                where, f"Invalid value for field '{where}': '{value}'. Must be a match of regex '{spec['pattern']}'"
            )

    def _integer(self, spec: Mapping[str, Any], value: Any, where: str) -> None:
        fmt = spec.get("format", "int32")
        number = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(value, float) and value.is_integer() and self.mode == "request":
            number, value = True, int(value)
        if not number and not (self.mode == "request" and isinstance(value, str) and _DIGITS.match(value)):
            self._fail(where, f"Invalid value at '{where}' (TYPE_{fmt.upper()}), {_short(value)}")
            return
        low, high = _INT_RANGE.get(fmt, _INT_RANGE["int32"])
        if "minimum" in spec:
            low = max(low, int(spec["minimum"]))
        if not low <= int(value) <= high:
            self._fail(where, f"Invalid value at '{where}' (TYPE_{fmt.upper()}), {value}: out of range")


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _is_float(text: str) -> bool:
    try:
        return not math.isnan(float(text)) or text == "NaN"
    except ValueError:
        return False


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True
