"""The discovery-document validator (tpu_emulator.discovery) on Google's own documents, as google-api-python-client
ships them: what a request may not do, at any depth, and what an answer must be."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_emulator import discovery

INSERT = "compute.instances.insert"
INSERT_PATH = "/compute/v1/projects/p/zones/us-central1-c/instances"
CREATE = "tpu.projects.locations.nodes.create"
CREATE_PATH = "/v2/projects/p/locations/us-central2-b/nodes"


@pytest.fixture(scope="module")
def compute() -> discovery.Discovery:
    doc = discovery.load("compute.v1.json")
    assert doc is not None, "google-api-python-client (the dev extra) is not installed: the schema checks need it"
    return doc


@pytest.fixture(scope="module")
def tpu() -> discovery.Discovery:
    doc = discovery.load("tpu.v2.json")
    assert doc is not None, "google-api-python-client (the dev extra) is not installed: the schema checks need it"
    return doc


def fields(problems: list[tuple[str, str]]) -> list[str]:
    return [field for field, _ in problems]


def test_the_documents_are_googles_and_known_methods_resolve(
    compute: discovery.Discovery, tpu: discovery.Discovery
) -> None:
    assert (compute.name, compute.version, tpu.name, tpu.version) == ("compute", "v1", "tpu", "v2")
    assert compute.revision and tpu.revision
    assert compute.path_params(INSERT, INSERT_PATH) == {"project": "p", "zone": "us-central1-c"}
    name = "projects/p/locations/z/nodes/n"
    assert tpu.path_params("tpu.projects.locations.nodes.get", f"/v2/{name}") == {"name": name}
    with pytest.raises(KeyError):
        compute.method("compute.instances.teleport")


def test_a_valid_instance_passes(compute: discovery.Discovery) -> None:
    body = {
        "name": "ok",
        "machineType": "zones/us-central1-c/machineTypes/tpu7x-standard-4t",
        "scheduling": {"provisioningModel": "SPOT", "maxRunDuration": {"seconds": "3600"}},
        "metadata": {"items": [{"key": "startup-script", "value": "echo"}]},
        "labels": {"a": "b"},
        "disks": [{"boot": True, "initializeParams": {"diskSizeGb": 100}}],  # int64 as a number: proto3 JSON allows it
    }
    assert compute.check_request(INSERT, INSERT_PATH, {"requestId": "r"}, body) == []


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"name": "a", "bogus": 1}, "resource", 'Unknown name "bogus"'),
        (
            {"name": "a", "scheduling": {"provisioningModl": "SPOT"}},
            "resource.scheduling",
            'Unknown name "provisioningModl"',
        ),
        (
            {"name": "a", "disks": [{"initializeParams": {"sizeGb": 1}}]},
            "resource.disks[0].initializeParams",
            "Unknown name",
        ),
        (
            {"name": "a", "scheduling": {"provisioningModel": "CHEAP"}},
            "resource.scheduling.provisioningModel",
            "TYPE_ENUM",
        ),
        (
            {"name": "a", "scheduling": {"maxRunDuration": {"seconds": "1h"}}},
            "resource.scheduling.maxRunDuration.seconds",
            "TYPE_INT64",
        ),
        ({"name": "a", "scheduling": {"automaticRestart": "yes"}}, "resource.scheduling.automaticRestart", "TYPE_BOOL"),
        ({"name": "a", "labels": {"k": 5}}, "resource.labels[k]", "TYPE_STRING"),
        ({"name": "a", "labels": ["k"]}, "resource.labels", "TYPE_MESSAGE"),
        ({"name": "a", "disks": {"boot": True}}, "resource.disks", "TYPE_LIST"),
        (
            {"name": "a", "scheduling": {"availabilityDomain": 2**40}},
            "resource.scheduling.availabilityDomain",
            "out of range",
        ),
        ({"name": "Bad_Name"}, "resource.name", "Must be a match of regex"),
        ({"name": "a", "metadata": {"items": [{"key": "k"}]}}, "resource.metadata.items[0].value", "Required field"),
        ({}, "resource.name", "Required field 'resource.name' not specified"),
    ],
)
def test_what_compute_engine_refuses_by_schema(
    compute: discovery.Discovery, body: dict[str, Any], field: str, words: str
) -> None:
    problems = compute.check_request(INSERT, INSERT_PATH, {}, body)
    assert field in fields(problems), problems
    assert any(words in text for _, text in problems), problems


def test_labels_map_values_are_named_by_key(compute: discovery.Discovery) -> None:
    problems = compute.check_request(INSERT, INSERT_PATH, {}, {"name": "a", "labels": {"team": 5}})
    assert problems == [("resource.labels[team]", "Invalid value at 'resource.labels[team]' (TYPE_STRING), 5")]


def test_query_and_path_parameters(compute: discovery.Discovery, tpu: discovery.Discovery) -> None:
    assert fields(compute.check_request(INSERT, INSERT_PATH, {"requestID": "x"}, {"name": "a"})) == ["requestID"]
    listing = "compute.instances.list"
    assert fields(compute.check_request(listing, INSERT_PATH, {"maxResults": "many"}, None)) == ["maxResults"]
    assert compute.check_request(listing, INSERT_PATH, {"maxResults": "10", "prettyPrint": "false"}, None) == []
    bad_zone = INSERT_PATH.replace("us-central1-c", "US_CENTRAL")
    assert fields(compute.check_request(INSERT, bad_zone, {}, {"name": "a"})) == ["zone"]
    # The Python clients send $alt=json;enum-encoding=int: a system parameter, with its one known option.
    node = {"runtimeVersion": "tpu-ubuntu2204-base", "acceleratorType": "v4-8"}
    assert tpu.check_request(CREATE, CREATE_PATH, {"nodeId": "n", "$alt": "json;enum-encoding=int"}, node) == []
    assert fields(tpu.check_request(CREATE, CREATE_PATH, {"$alt": "json;colour=blue"}, node)) == ["$alt"]
    deleting = "tpu.projects.locations.queuedResources.delete"
    qr = "/v2/projects/p/locations/z/queuedResources/q"
    assert fields(tpu.check_request(deleting, qr, {"force": "yes"}, None)) == ["force"]
    assert tpu.check_request(deleting, qr, {"force": "true"}, None) == []


def test_required_fields_the_proto_way_and_enum_numbers(tpu: discovery.Discovery) -> None:
    # tpu.v2.json marks them "Required." (google.api.field_behavior), here at depth two.
    queued = {"tpu": {"nodeSpec": [{"nodeId": "n", "node": {"acceleratorType": "v4-8"}}]}}
    problems = tpu.check_request(
        "tpu.projects.locations.queuedResources.create",
        CREATE_PATH.replace("nodes", "queuedResources"),
        {},
        queued,
        body_name="queued_resource",
    )
    assert sorted(fields(problems)) == [
        "queued_resource.tpu.node_spec[0].node.runtime_version",
        "queued_resource.tpu.node_spec[0].parent",
    ]
    typed = {"runtimeVersion": "r", "acceleratorConfig": {"type": 4, "topology": "2x2x1"}}
    assert fields(tpu.check_request(CREATE, CREATE_PATH, {}, typed, body_name="node")) == [
        "node.accelerator_config.type"
    ]
    numeric = {"$alt": "json;enum-encoding=int"}
    assert tpu.check_request(CREATE, CREATE_PATH, numeric, typed, body_name="node") == []


def test_answers_are_held_to_more_than_requests(compute: discovery.Discovery) -> None:
    good = {"kind": "compute#instance", "id": "123", "name": "a", "status": "RUNNING", "labels": {"a": "b"}}
    assert compute.check_response("compute.instances.get", good) == []
    assert fields(compute.check_response("compute.instances.get", {**good, "id": 123})) == ["response.id"]
    assert fields(compute.check_response("compute.instances.get", {**good, "status": "ASLEEP"})) == ["response.status"]
    assert fields(compute.check_response("compute.instances.get", {**good, "zone": None})) == ["response.zone"]
    assert fields(compute.check_response("compute.instances.get", {**good, "extra": 1})) == ["response"]
    failed = {"status": "DONE", "error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "m"}]}}
    assert compute.check_response("compute.zoneOperations.get", {**failed, "httpErrorStatusCode": 503}) == []
    assert compute.check_schema("Operation", {**failed, "httpErrorStatusCode": "503"}) != []


def test_the_runner_never_loads_the_discovery_documents() -> None:
    """google-api-python-client is a test dependency: nothing the runner imports may need it."""
    import ast

    from tests.conftest import REPO

    offenders = {}
    for path in (REPO / "runner").rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        found = sorted(n for n in names if n.split(".")[0] == "googleapiclient" or n == "tpu_emulator.discovery")
        if found:
            offenders[str(path.relative_to(REPO))] = found
    assert offenders == {}
