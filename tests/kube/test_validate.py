"""The manifest validator on the vendored JobSet CRD (no server needed): unknown fields refused at any depth, types,
enums and required fields, as a strict API server would; and the same on a small OpenAPI v2 document."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.kubecluster import jobset_manifest
from tpu_emulator.kube.cluster import JOBSET_CRD
from tpu_emulator.kube.validate import ManifestError, Schemas


@pytest.fixture(scope="module")
def schemas() -> Schemas:
    return Schemas.load(crds=[JOBSET_CRD])


def _pod_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_a_tpu_jobset_is_valid(schemas: Schemas) -> None:
    assert schemas.check(jobset_manifest("ok", "pool")) == []


def test_a_misspelled_field_is_refused_with_its_path(schemas: Schemas) -> None:
    manifest = jobset_manifest("typo", "pool")
    manifest["spec"]["replicatedJob"] = manifest["spec"].pop("replicatedJobs")
    assert schemas.check(manifest) == [(".spec.replicatedJob", "field not declared in schema")]
    with pytest.raises(ManifestError, match=r"JobSet typo: \.spec\.replicatedJob: field not declared in schema"):
        schemas.require(manifest)


def test_deep_problems_are_all_named(schemas: Schemas) -> None:
    manifest = jobset_manifest("deep", "pool")
    manifest["spec"]["replicatedJobs"][0]["replicas"] = "two"
    pod = _pod_spec(manifest)
    pod["containers"][0]["comand"] = ["python"]
    del pod["containers"][0]["name"]
    prefix = ".spec.replicatedJobs[0].template.spec.template.spec.containers[0]"
    assert sorted(schemas.check(manifest)) == [
        (".spec.replicatedJobs[0].replicas", "must be an integer, not string"),
        (f"{prefix}.comand", "field not declared in schema"),
        (f"{prefix}.name", "Required value"),
    ]


def test_quantities_and_int_or_string(schemas: Schemas) -> None:
    manifest = jobset_manifest("q", "pool")
    limits = _pod_spec(manifest)["containers"][0]["resources"]["limits"]
    limits.update({"google.com/tpu": "4", "memory": "16Gi", "cpu": "500m"})
    assert schemas.check(manifest) == []
    limits.update({"memory": [16], "cpu": 0.5, "ephemeral-storage": "lots"})
    where = ".spec.replicatedJobs[0].template.spec.template.spec.containers[0].resources.limits"
    assert sorted(p for p, _ in schemas.check(manifest)) == [
        f"{where}.{k}" for k in ("cpu", "ephemeral-storage", "memory")
    ]


def test_enums_are_checked(schemas: Schemas) -> None:
    manifest = jobset_manifest("e", "pool")
    manifest["spec"]["startupPolicy"] = {"startupPolicyOrder": "Sequential"}
    problems = schemas.check(manifest)
    assert [p for p, _ in problems] == [".spec.startupPolicy.startupPolicyOrder"]
    assert "supported values" in problems[0][1]


def test_an_unserved_kind_is_refused(schemas: Schemas) -> None:
    assert schemas.check({"apiVersion": "jobset.x-k8s.io/v1", "kind": "JobSet"})[0][1].startswith("no schema")


def test_a_swagger_document_checks_built_in_objects() -> None:
    openapi = {
        "definitions": {
            "io.k8s.api.core.v1.ConfigMap": {
                "type": "object",
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
                    "data": {"type": "object", "additionalProperties": {"type": "string"}},
                },
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "ConfigMap"}],
            },
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
        }
    }
    schemas = Schemas.load(openapi=openapi)
    good = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}}
    assert schemas.check(good) == []
    bad = copy.deepcopy(good)
    bad["metadata"]["lables"] = {}
    bad["data"]["n"] = 1
    assert sorted(schemas.check(bad)) == [
        (".data.n", "must be a string, not integer"),
        (".metadata.lables", "field not declared in schema"),
    ]
