"""Manifests checked before they are sent, with unknown fields refused: the API server of Kubernetes 1.20 prunes a
field it does not know without a word (a misspelled `replicatedJob` simply vanishes), which a newer server does
only when asked not to be strict. So every manifest is checked against the schema its server publishes:

- a custom resource (a JobSet) against its CRD's openAPIV3Schema: the vendored JobSet CRD, unmodified;
- a built-in object (core/v1, batch/v1, ...) against the API server's own OpenAPI document (GET /openapi/v2), by
  the definition whose x-kubernetes-group-version-kind names it;
- `metadata` against ObjectMeta from the same document (a CRD's schema leaves it open).

Checked at any depth: unknown fields (the path and "field not declared in schema", as a strict server answers),
JSON types (integer, number, string, boolean, array, object), int-or-string and quantities, enums, patterns,
minimum/maximum, maxLength, maxItems, and required fields. Not checked: the CRD's CEL rules
(x-kubernetes-validations, 1.25+), and what only the server's own validation knows (names as DNS labels, selector
matches); the real server does those.

    schemas = Schemas.load(crds=[JOBSET_CRD], openapi=cluster.get("/openapi/v2"))
    problems = schemas.check(manifest)        # [(".spec.replicatedJob", 'field not declared in schema'), ...]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Violations = list[tuple[str, str]]
_QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+|[KMGTPE]i?|[numkMGTPE])?$")
_SPECIAL = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": "quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": "int-or-string",
    "io.k8s.apimachinery.pkg.runtime.RawExtension": "any",
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1": "any",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": "string",
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime": "string",
}
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


class ManifestError(ValueError):
    """A manifest its schema refuses; `problems` names each (path, problem)."""

    def __init__(self, kind: str, name: str, problems: Violations) -> None:
        self.problems = problems
        lines = "; ".join(f"{path or '.'}: {text}" for path, text in problems)
        super().__init__(f"{kind} {name}: {lines}")


@dataclass
class Schemas:
    """Schemas by (apiVersion, kind): CRDs' openAPIV3Schema and the API server's OpenAPI v2 definitions."""

    crds: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    definitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    builtin: dict[tuple[str, str], str] = field(default_factory=dict)  # (apiVersion, kind) -> definition name

    @classmethod
    def load(cls, *, crds: list[Path | dict[str, Any]] = (), openapi: dict[str, Any] | None = None) -> Schemas:  # type: ignore[assignment]
        import yaml

        out = cls()
        for crd in crds:
            doc = yaml.safe_load(crd.read_text()) if isinstance(crd, Path) else crd
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for version in doc["spec"]["versions"]:
                if version.get("served", True):
                    out.crds[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
        if openapi is not None:
            out.definitions = openapi.get("definitions", {})
            for name, definition in out.definitions.items():
                for gvk in definition.get("x-kubernetes-group-version-kind", []):
                    api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                    out.builtin.setdefault((api_version, gvk["kind"]), name)
        return out

    def check(self, manifest: dict[str, Any]) -> Violations:
        """Every problem of `manifest`; [] when its schema takes it whole."""
        if not isinstance(manifest, dict):
            return [("", "a manifest is a JSON object")]
        key = (str(manifest.get("apiVersion", "")), str(manifest.get("kind", "")))
        if key in self.crds:
            walk = _Walk(self, crd=True)
            walk.value(self.crds[key], manifest, "", root=True)
            return walk.problems
        if key in self.builtin:
            walk = _Walk(self, crd=False)
            walk.value({"$ref": f"#/definitions/{self.builtin[key]}"}, manifest, "")
            return walk.problems
        return [("", f"no schema for apiVersion {key[0]!r} kind {key[1]!r}: the server does not serve it")]

    def require(self, manifest: dict[str, Any]) -> None:
        """Raise ManifestError naming every problem of `manifest`."""
        problems = self.check(manifest)
        if problems:
            name = (manifest.get("metadata") or {}).get("name") or (manifest.get("metadata") or {}).get("generateName")
            raise ManifestError(str(manifest.get("kind")), str(name), problems)


class _Walk:
    def __init__(self, schemas: Schemas, *, crd: bool) -> None:
        self.schemas = schemas
        self.crd = crd  # OpenAPI v3 structural schema (a CRD's) or the server's Swagger 2.0 definitions
        self.problems: Violations = []

    def fail(self, where: str, text: str) -> None:
        self.problems.append((where, text))

    def value(self, spec: dict[str, Any], value: Any, where: str, *, root: bool = False) -> None:
        special = None
        if "$ref" in spec:
            name = spec["$ref"].rsplit("/", 1)[-1]
            special = _SPECIAL.get(name)
            spec = self.schemas.definitions.get(name, {})
        if special == "any" or (spec.get("x-kubernetes-preserve-unknown-fields") and "properties" not in spec):
            return
        if value is None:
            if not spec.get("nullable") and self.crd:
                self.fail(where, "must not be null")
            return
        if (
            special == "int-or-string"
            or spec.get("x-kubernetes-int-or-string")
            or spec.get("format") == "int-or-string"
        ):
            if not (isinstance(value, str) or _is_int(value)):
                self.fail(where, f"must be an integer or a string, not {_kind(value)}")
            elif isinstance(value, str) and "pattern" in spec and not re.search(spec["pattern"], value):
                self.fail(where, f"should match '{spec['pattern']}'")
            return
        if special == "quantity":
            if _is_int(value) or isinstance(value, float) or (isinstance(value, str) and _QUANTITY.match(value)):
                return
            self.fail(where, f"quantities must match the regular expression {_QUANTITY.pattern}: {value!r}")
            return
        kind = (
            special
            or spec.get("type")
            or ("object" if "properties" in spec or "additionalProperties" in spec else None)
        )
        if kind == "object":
            self._object(spec, value, where, root=root)
        elif kind == "array":
            if not isinstance(value, list):
                self.fail(where, f"must be an array, not {_kind(value)}")
                return
            if "maxItems" in spec and len(value) > spec["maxItems"]:
                self.fail(where, f"must have at most {spec['maxItems']} items")
            for i, item in enumerate(value):
                self.value(spec.get("items", {}), item, f"{where}[{i}]")
        elif kind == "string":
            if not isinstance(value, str):
                self.fail(where, f"must be a string, not {_kind(value)}")
                return
            if "maxLength" in spec and len(value) > spec["maxLength"]:
                self.fail(where, f"may not be longer than {spec['maxLength']}")
            if "pattern" in spec and not re.search(spec["pattern"], value):
                self.fail(where, f"should match '{spec['pattern']}'")
        elif kind == "integer":
            if not _is_int(value):
                self.fail(where, f"must be an integer, not {_kind(value)}")
                return
            self._range(spec, value, where)
        elif kind == "number":
            if not (_is_int(value) or isinstance(value, float)):
                self.fail(where, f"must be a number, not {_kind(value)}")
                return
            self._range(spec, value, where)
        elif kind == "boolean" and not isinstance(value, bool):
            self.fail(where, f"must be a boolean, not {_kind(value)}")
        if "enum" in spec and value not in spec["enum"]:
            self.fail(where, f"Unsupported value: {value!r}: supported values: {', '.join(map(repr, spec['enum']))}")

    def _range(self, spec: dict[str, Any], value: float, where: str) -> None:
        if "minimum" in spec and value < spec["minimum"]:
            self.fail(where, f"should be greater than or equal to {spec['minimum']}")
        if "maximum" in spec and value > spec["maximum"]:
            self.fail(where, f"should be less than or equal to {spec['maximum']}")

    def _object(self, spec: dict[str, Any], value: Any, where: str, *, root: bool) -> None:
        if not isinstance(value, dict):
            self.fail(where, f"must be an object, not {_kind(value)}")
            return
        props: dict[str, Any] = dict(spec.get("properties") or {})
        extra = spec.get("additionalProperties")
        open_object = not props and extra is None and not self.crd  # Swagger's bare `type: object`: anything
        if root or (where == ".metadata" and not self.crd):
            meta = f"#/definitions/{_OBJECT_META}"
            if _OBJECT_META in self.schemas.definitions:
                props["metadata"] = {"$ref": meta}
        for key, item in value.items():
            path = f"{where}.{key}"
            if key in props:
                if root and key == "metadata" and _OBJECT_META not in self.schemas.definitions:
                    continue  # no server document to check ObjectMeta against
                self.value(props[key], item, path)
            elif isinstance(extra, dict):
                self.value(extra, item, path)
            elif extra is True or open_object:
                continue
            else:
                self.fail(path, "field not declared in schema")
        for key in spec.get("required", []):
            if key not in value:
                self.fail(f"{where}.{key}", "Required value")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )
