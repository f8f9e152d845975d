"""The Cloud TPU API emulator over real HTTP, driven through the real google-cloud-tpu client (REST transport).

Faults go in through the emulator's Python API or its admin HTTP API; everything about the TPU API itself goes
through tpu_v2.TpuClient, exactly as the runner's TPU VM backend talks to Cloud TPU. The emulator must be at least
as strict as Cloud TPU: operations that take time, failures told only to whoever reads the operation, errors whose
meaning is in their details. Queued resources are in test_emulator_queued.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from google.cloud import tpu_v2
from google.protobuf.message import Message
from google.rpc import error_details_pb2

from tests.emulator.api import FAST, OP_NAME, PARENT, PROJECT, RUNTIME, ZONE, quick_api_emulator, tpu_client
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator
from tpu_emulator.errors import ApiError


@pytest.fixture
def tpu_emulator(tmp_path: Path) -> Iterator[TpuEmulator]:
    with quick_api_emulator(tmp_path) as emulator:
        yield emulator


@pytest.fixture
def client(tpu_emulator: TpuEmulator) -> tpu_v2.TpuClient:
    return tpu_client(tpu_emulator)


def node_spec(accelerator: str = "v4-8", runtime: str = RUNTIME, **fields: Any) -> tpu_v2.Node:
    return tpu_v2.Node(accelerator_type=accelerator, runtime_version=runtime, **fields)


def create(client: tpu_v2.TpuClient, node_id: str, *, parent: str = PARENT, **fields: Any) -> Any:
    return client.create_node(parent=parent, node_id=node_id, node=node_spec(**fields))


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """A plain HTTP call, as curl would make it (the admin API, or what the client cannot express)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def error_status(exc: gexc.GoogleAPICallError) -> str:
    assert exc.response is not None
    return exc.response.json()["error"]["status"]


# -- nodes ------------------------------------------------------------------------------------------------------


def test_create_returns_an_operation_and_the_node_becomes_ready(
    client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator
) -> None:
    with tpu_emulator.frozen():  # CREATING lasts this module's create_delay_s: held while it is read
        op = create(client, "n1", labels={"managed-by": "tpu-runner"}, scheduling_config={"spot": True})
        assert OP_NAME.match(op.operation.name)
        assert op.metadata.verb == "create" and op.metadata.target == f"{PARENT}/nodes/n1"
        assert client.get_node(name=f"{PARENT}/nodes/n1").state == tpu_v2.Node.State.CREATING
    node = op.result(polling=FAST)
    assert node.name == f"{PARENT}/nodes/n1"
    assert node.state == tpu_v2.Node.State.READY
    assert node.health == tpu_v2.Node.Health.HEALTHY
    assert node.api_version == tpu_v2.Node.ApiVersion.V2
    assert (node.accelerator_type, node.runtime_version) == ("v4-8", RUNTIME)
    assert dict(node.labels) == {"managed-by": "tpu-runner"} and node.scheduling_config.spot
    assert [(e.ip_address, e.port) for e in node.network_endpoints] == [("10.130.0.2", 8470)]
    assert node.id > 0 and node.create_time.timestamp() > 0
    assert node.service_account.email.endswith("-compute@developer.gserviceaccount.com")
    again = client.get_node(name=node.name)
    assert again.state == tpu_v2.Node.State.READY and again.id == node.id
    done = client.get_operation({"name": op.operation.name})
    assert done.done and done.response.type_url == "type.googleapis.com/google.cloud.tpu.v2.Node"


def test_get_list_delete(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    for node_id in ("a1", "a2"):
        create(client, node_id).result(polling=FAST)
    assert sorted(n.name.rsplit("/", 1)[1] for n in client.list_nodes(parent=PARENT)) == ["a1", "a2"]
    assert list(client.list_nodes(parent=f"projects/{PROJECT}/locations/europe-west4-a")) == []
    with tpu_emulator.frozen():
        op = client.delete_node(name=f"{PARENT}/nodes/a1")
        assert op.metadata.verb == "delete"
        assert client.get_node(name=f"{PARENT}/nodes/a1").state == tpu_v2.Node.State.DELETING
    op.result(polling=FAST)
    with pytest.raises(gexc.NotFound, match="a1"):
        client.get_node(name=f"{PARENT}/nodes/a1")
    assert [n.name for n in client.list_nodes(parent=PARENT)] == [f"{PARENT}/nodes/a2"]
    with pytest.raises(gexc.NotFound):
        client.delete_node(name=f"{PARENT}/nodes/a1")
    with pytest.raises(gexc.NotFound):
        client.get_operation({"name": f"{PARENT}/operations/operation-none"})


def test_list_pages_and_operations(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    ops = [create(client, f"p{i}") for i in range(3)]
    pager = client.list_nodes(request={"parent": PARENT, "page_size": 2})
    pages = list(pager.pages)
    assert [len(p.nodes) for p in pages] == [2, 1]
    assert sorted(n.name for p in pages for n in p.nodes) == [f"{PARENT}/nodes/p{i}" for i in range(3)]
    listed = client.list_operations({"name": PARENT})
    assert {o.name for o in listed.operations} >= {op.operation.name for op in ops}
    tokens = [r.query.get("pageToken") for r in tpu_emulator.requests if r.path.endswith("/nodes")]
    assert tokens[-2:] == [None, pages[0].next_page_token]


def test_answers_use_numeric_enums_only_when_asked(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    create(client, "e1").result(polling=FAST)
    url = f"{tpu_emulator.endpoint}/v2/{PARENT}/nodes/e1"
    assert http("GET", url)[1]["state"] == "READY"  # what curl sees
    status, numeric = http("GET", url + "?%24alt=json%3Benum-encoding%3Dint")  # what the Python client asks for
    assert (status, numeric["state"], numeric["apiVersion"]) == (200, 2, 4)


# -- time: operations progress when read, VMs boot on time -----------------------------------------------------


@pytest.fixture
def slow_emulator(tmp_path: Path) -> Iterator[TpuEmulator]:
    """Creates take a full second: a VM that boots on time boots no sooner."""
    with TpuEmulator(workdir=tmp_path / "slow", create_delay_s=1.0, delete_delay_s=0.2, vm_grace_s=0.5) as emulator:
        yield emulator


def test_an_operation_is_done_only_once_its_time_has_come(tmp_path: Path) -> None:
    # Creates that take ten minutes: "not yet" on any machine, however busy; then the emulator's clock moves on.
    with TpuEmulator(workdir=tmp_path / "slow", create_delay_s=600, delete_delay_s=0.2, vm_grace_s=0.5) as emulator:
        client = tpu_client(emulator)
        url = f"{emulator.endpoint}/v2/{PARENT}/nodes?nodeId=t1"
        status, answer = http("POST", url, {"acceleratorType": "v4-8", "runtimeVersion": RUNTIME})
        assert status == 200 and "done" not in answer  # never done in the answer that starts it
        early = client.get_operation({"name": answer["name"]})
        assert not early.done and client.get_node(name=f"{PARENT}/nodes/t1").state == tpu_v2.Node.State.CREATING
        emulator.advance(600)
        late = client.get_operation({"name": answer["name"]})  # the first read after its time finds it done
        assert late.done and late.response.type_url.endswith("google.cloud.tpu.v2.Node")
        status, deleting = http("DELETE", f"{emulator.endpoint}/v2/{PARENT}/nodes/t1")
        assert status == 200 and "done" not in deleting


def test_a_node_boots_on_time_even_if_nobody_polls(slow_emulator: TpuEmulator) -> None:
    client = tpu_client(slow_emulator)
    script = "touch booted; sleep 600\n"
    started = time.monotonic()
    create(client, "unwatched", metadata={"startup-script": script})  # as a runner that dies while CREATING
    reads = len(slow_emulator.requests)
    booted = slow_emulator.launcher.vm_dir(PROJECT, ZONE, "unwatched", 0) / "booted"
    wait_for(booted.exists, "the VM to boot", timeout=60)
    assert time.monotonic() - started >= 1.0
    assert len(slow_emulator.requests) == reads  # no request made it happen


def test_a_failure_is_only_in_the_operation(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    tpu_emulator.stockout(ZONE, count=1)
    op = create(client, "f1")
    wait_for(lambda: not any(n.node_id == "f1" for n in tpu_emulator.nodes()))
    with pytest.raises(gexc.NotFound):  # polling the node shows it gone, and not why
        client.get_node(name=f"{PARENT}/nodes/f1")
    failed = client.get_operation({"name": op.operation.name})
    assert failed.done and failed.error.code == 8


# -- deletions that fail or take long ----------------------------------------------------------------------------


def test_a_failing_delete_leaves_the_node_as_it_was(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    name = create(client, "df1").result(polling=FAST).name
    tpu_emulator.delete_fails(ZONE, node="df*", count=1, status="FAILED_PRECONDITION", message="Not now.")
    with tpu_emulator.frozen():  # it fails after this module's delete_delay_s: DELETING until then
        op = client.delete_node(name=name)
        assert client.get_node(name=name).state == tpu_v2.Node.State.DELETING
    with pytest.raises(gexc.FailedPrecondition, match="Not now") as caught:
        op.result(polling=FAST)
    status = caught.value.errors[0]
    assert status.code == 9 and op.operation.error.code == 9
    assert unpack(status.details, error_details_pb2.ErrorInfo).metadata["resource"] == name
    assert unpack(status.details, error_details_pb2.PreconditionFailure).violations[0].subject == name
    node = client.get_node(name=name)
    assert (node.state, node.health) == (tpu_v2.Node.State.READY, tpu_v2.Node.Health.HEALTHY)
    client.delete_node(name=name).result(polling=FAST)  # the fault is used up: this one goes through
    with pytest.raises(gexc.NotFound):
        client.get_node(name=name)


def test_an_internal_delete_failure_over_the_admin_api(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    name = create(client, "df2").result(polling=FAST).name
    admin = f"{tpu_emulator.endpoint}/_emulator"
    assert http("POST", f"{admin}/faults/delete-fails", {"status": 13, "count": 1})[0] == 200
    assert http("POST", f"{admin}/faults/delete-fails", {"status": "NOPE"})[0] == 400
    op = client.delete_node(name=name)
    second = client.delete_node(name=name)  # joins the deletion in progress, and shares its fate
    for each in (op, second):
        with pytest.raises(gexc.InternalServerError, match="An internal error has occurred"):
            each.result(polling=FAST)
    assert client.get_node(name=name).state == tpu_v2.Node.State.READY


def test_slow_delete(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    name = create(client, "sd1").result(polling=FAST).name
    tpu_emulator.slow_delete(600, zone=ZONE, count=1)
    op = client.delete_node(name=name)
    time.sleep(0.4)  # four times this module's delete_delay_s of 0.1
    assert client.get_node(name=name).state == tpu_v2.Node.State.DELETING
    assert not client.get_operation({"name": op.operation.name}).done
    tpu_emulator.advance(600)  # the slow deletion's time has come
    op.result(polling=FAST)
    with pytest.raises(gexc.NotFound):
        client.get_node(name=name)


# -- names already taken -----------------------------------------------------------------------------------------


def test_a_name_collision_is_409_and_the_node_is_another_runs(
    client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator
) -> None:
    tpu_emulator.collision(ZONE, node="run-*")
    with pytest.raises(gexc.Conflict) as caught:  # HTTP 409; AlreadyExists is its gRPC-only subclass
        create(client, "run-abc", labels={"managed-by": "tpu-runner", "tpu-runner-run": "mine"})
    assert error_status(caught.value) == "ALREADY_EXISTS"
    assert caught.value.details == [
        {"@type": "type.googleapis.com/google.rpc.ResourceInfo", "resourceName": f"{PARENT}/nodes/run-abc"}
    ]
    theirs = client.get_node(name=f"{PARENT}/nodes/run-abc")
    assert theirs.state == tpu_v2.Node.State.READY
    assert dict(theirs.labels) == {"managed-by": "tpu-runner", "tpu-runner-run": "another-run"}
    assert tpu_emulator.active_faults() == []  # count 1 by default
    tpu_emulator.collision(ZONE, message="Name taken.")  # in other words: the status says it
    with pytest.raises(gexc.Conflict, match="Name taken") as caught:
        create(client, "run-xyz")
    assert error_status(caught.value) == "ALREADY_EXISTS"


def test_a_node_that_is_just_there(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    info = tpu_emulator.create_node_direct(PROJECT, ZONE, "pre-existing", labels={"tpu-runner-run": "old-run"})
    assert (info.state, info.accelerator_type, info.runtime_version) == ("READY", "v4-8", RUNTIME)
    assert client.get_node(name=info.name).labels["tpu-runner-run"] == "old-run"
    with pytest.raises(gexc.Conflict):
        create(client, "pre-existing")
    url, body = f"{tpu_emulator.endpoint}/_emulator/nodes", {"project": PROJECT, "zone": ZONE, "nodeId": "by-curl"}
    status, made = http("POST", url, body)
    assert (status, made["state"], made["node_id"]) == (200, "READY", "by-curl")
    assert http("POST", url, body)[0] == 409
    assert http("POST", url, {**body, "nodeId": "x", "acceleratorType": "v5p-8"})[0] == 400  # not in this zone
    assert http("POST", url, {"zone": ZONE})[0] == 400


# -- validation -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node_id", "fields", "expected"),
    [
        ("ok", {"accelerator": "v9-8"}, "the accelerator v9-8 was not found in zone us-central2-b"),
        ("ok", {"accelerator": "v4-7"}, "v4 comes in sizes"),
        # TPU7x is in the catalog for Compute Engine; the Cloud TPU API does not serve it
        ("ok", {"accelerator": "tpu7x-8"}, "TPU7x (Ironwood) is not served by the Cloud TPU API"),
        ("ok", {"accelerator": "v5p-8"}, "v5p-8 is offered in us-central1-a"),
        ("ok", {"runtime": "tpu-vm-tf-2.16.1-pod-pjrt"}, "Invalid runtime version 'tpu-vm-tf-2.16.1-pod-pjrt'"),
        ("ok", {"runtime": "v2-alpha-tpuv5"}, "Invalid runtime version"),
        ("ok", {"runtime": ""}, "Required field 'node.runtime_version' not specified"),  # by tpu.v2.json
        ("Bad-Name", {}, "Invalid value for field 'node_id': 'Bad-Name'"),
        ("1abc", {}, "field 'node_id'"),
        ("ends-", {}, "field 'node_id'"),
        ("a" * 64, {}, "field 'node_id'"),
        ("ok", {"labels": {"Upper": "x"}}, "Invalid label key 'Upper'"),
        ("ok", {"labels": {"k": "Has Space"}}, "Invalid value for label 'k'"),
        ("ok", {"labels": {f"k{i}": "v" for i in range(65)}}, "at most 64 labels"),
        ("ok", {"scheduling_config": {"spot": True, "reserved": True}}, "spot and reserved cannot be combined"),
        ("ok", {"scheduling_config": {"spot": True, "preemptible": True}}, "spot and preemptible cannot be combined"),
        ("ok", {"metadata": {f"k{i}": "x" * 200_000 for i in range(3)}}, "at most 524288 bytes"),
        ("ok", {"metadata": {"big": "x" * 300_000}}, "a value may be at most 262144 bytes"),
    ],
)
def test_invalid_requests_are_rejected_with_400(
    client: tpu_v2.TpuClient, node_id: str, fields: dict[str, Any], expected: str
) -> None:
    with pytest.raises(gexc.BadRequest) as caught:
        create(client, node_id, **fields)
    assert expected in caught.value.message
    assert error_status(caught.value) == "INVALID_ARGUMENT"
    assert list(client.list_nodes(parent=PARENT)) == []


def test_every_problem_is_named_at_once(client: tpu_v2.TpuClient) -> None:
    with pytest.raises(gexc.BadRequest) as caught:
        create(client, "Bad", accelerator="v4-7", labels={"UP": "x"})
    details = caught.value.response.json()["error"]["details"][0]
    assert details["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    fields = [v["field"] for v in details["fieldViolations"]]
    assert fields == ["node_id", "node.accelerator_type", "node.labels"]


def test_unknown_fields_and_missing_node_id(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    url = f"{tpu_emulator.endpoint}/v2/{PARENT}/nodes"
    status, body = http("POST", url + "?nodeId=x", {"acceleratorType": "v4-8", "runtimeVersion": RUNTIME, "gpu": 1})
    assert status == 400 and 'Unknown name "gpu"' in body["error"]["message"]
    status, body = http("POST", url, {"acceleratorType": "v4-8", "runtimeVersion": RUNTIME})
    assert status == 400 and "node_id is required" in body["error"]["message"]


def test_duplicate_node_is_409_already_exists(client: tpu_v2.TpuClient) -> None:
    create(client, "dup")
    with pytest.raises(gexc.Conflict) as caught:  # HTTP 409; AlreadyExists is its gRPC-only subclass
        create(client, "dup")
    assert error_status(caught.value) == "ALREADY_EXISTS"
    assert f"Resource '{PARENT}/nodes/dup' already exists" in caught.value.message


def test_accelerator_config_names_a_catalog_type(client: tpu_v2.TpuClient) -> None:
    config = tpu_v2.AcceleratorConfig(type_=tpu_v2.AcceleratorConfig.Type.V4, topology="2x2x4")
    op = client.create_node(
        parent=PARENT, node_id="cfg", node=tpu_v2.Node(accelerator_config=config, runtime_version=RUNTIME)
    )
    assert op.result(polling=FAST).accelerator_type == "v4-32"


# -- faults -----------------------------------------------------------------------------------------------------


def test_stockout_fails_the_operation_with_resource_exhausted(
    client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator
) -> None:
    tpu_emulator.stockout(ZONE, count=1)
    op = create(client, "s1")  # accepted...
    with pytest.raises(gexc.ResourceExhausted, match='There is no more capacity in the zone "us-central2-b"'):
        op.result(polling=FAST)  # ...then the operation fails with code 8
    assert op.operation.error.code == 8
    with pytest.raises(gexc.NotFound):
        client.get_node(name=f"{PARENT}/nodes/s1")
    assert create(client, "s1").result(polling=FAST).state == tpu_v2.Node.State.READY  # count used up
    assert tpu_emulator.active_faults() == []


def test_quota_exceeded_is_an_immediate_429(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    tpu_emulator.quota_exceeded(ZONE, count=1)
    with pytest.raises(gexc.TooManyRequests) as caught:
        create(client, "q1", accelerator="v4-32", runtime="tpu-vm-tf-2.16.1-pod-pjrt", scheduling_config={"spot": True})
    assert error_status(caught.value) == "RESOURCE_EXHAUSTED"
    assert "Quota limit 'TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI' has been exceeded" in caught.value.message
    assert "in region us-central2" in caught.value.message
    create(client, "q1").result(polling=FAST)


def test_permission_denied_is_403(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    tpu_emulator.deny("tpu.nodes.create")
    with pytest.raises(gexc.Forbidden) as caught:  # HTTP 403; PermissionDenied is its gRPC-only subclass
        create(client, "d1")
    assert error_status(caught.value) == "PERMISSION_DENIED"
    assert f"Permission 'tpu.nodes.create' denied on resource '{PARENT}/nodes/d1'" in caught.value.message
    assert (caught.value.reason, caught.value.domain) == ("IAM_PERMISSION_DENIED", "googleapis.com")
    assert caught.value.metadata == {"permission": "tpu.nodes.create", "resource": f"{PARENT}/nodes/d1"}
    assert list(client.list_nodes(parent=PARENT)) == []  # tpu.nodes.list is not denied
    tpu_emulator.clear_faults()
    create(client, "d1").result(polling=FAST)
    tpu_emulator.deny("tpu.nodes.*", count=1)
    with pytest.raises(gexc.Forbidden, match=r"tpu\.nodes\.get"):
        client.get_node(name=f"{PARENT}/nodes/d1")
    client.get_node(name=f"{PARENT}/nodes/d1")


def test_503_is_service_unavailable(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    tpu_emulator.http_errors(503, count=1)
    with pytest.raises(gexc.ServiceUnavailable):
        client.list_nodes(parent=PARENT)
    assert list(client.list_nodes(parent=PARENT)) == []


def test_a_burst_of_429s_then_success(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    tpu_emulator.http_errors(429, count=3, method="POST", path=r"/nodes$")
    with pytest.raises(gexc.TooManyRequests):  # TPU RPCs have no default retry
        create(client, "b1")
    retry = gretry.Retry(predicate=gretry.if_exception_type(gexc.TooManyRequests), initial=0.01, maximum=0.05)
    op = client.create_node(parent=PARENT, node_id="b1", node=node_spec(), retry=retry)
    assert op.result(polling=FAST).state == tpu_v2.Node.State.READY
    posts = [r.status for r in tpu_emulator.requests if r.method == "POST" and r.path.endswith("/nodes")]
    assert posts == [429, 429, 429, 200]


def test_errors_carry_their_meaning_in_details_not_in_words(
    client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator
) -> None:
    # An exhausted quota, in words that do not say so: a google.rpc.QuotaFailure says it, and no ErrorInfo.
    tpu_emulator.quota_exceeded(ZONE, count=1, limit=32, message="The request cannot be fulfilled.")
    with pytest.raises(gexc.TooManyRequests) as quota:
        create(client, "w1")
    assert "quota" not in quota.value.message.lower() and quota.value.reason is None
    failure = next(d for d in quota.value.details if d["@type"] == "type.googleapis.com/google.rpc.QuotaFailure")
    violation = failure["violations"][0]
    assert violation["subject"] == f"project:{PROJECT}" and violation["quotaId"] == "TPUV4sPerProjectPerRegionForTPUAPI"
    assert "Limit: 32 in region us-central2" in violation["description"]
    # With a reason, the ErrorInfo too (api-core exposes the first one as reason, domain and metadata).
    tpu_emulator.quota_exceeded(ZONE, count=1, reason="RESOURCE_QUOTA_EXCEEDED")
    with pytest.raises(gexc.TooManyRequests) as quota:
        create(client, "w1")
    assert (quota.value.reason, quota.value.domain) == ("RESOURCE_QUOTA_EXCEEDED", "googleapis.com")
    # A rate limit: Google's own message says "Quota exceeded", the ErrorInfo says RATE_LIMIT_EXCEEDED (retry it).
    tpu_emulator.rate_limit(count=1, method="GET")
    with pytest.raises(gexc.TooManyRequests) as limited:
        client.list_nodes(parent=PARENT)
    assert "Quota exceeded for quota metric" in limited.value.message
    assert (limited.value.reason, limited.value.domain) == ("RATE_LIMIT_EXCEEDED", "googleapis.com")
    assert limited.value.metadata["service"] == "tpu.googleapis.com"
    assert not any("QuotaFailure" in d["@type"] for d in limited.value.details)
    # Permission denied in Cloud IAM's terse words: the ErrorInfo names the permission.
    tpu_emulator.deny("tpu.nodes.delete", count=1, message="Request denied by Cloud IAM.")
    with pytest.raises(gexc.Forbidden) as denied:
        client.delete_node(name=f"{PARENT}/nodes/w1")
    assert denied.value.message.endswith(": Request denied by Cloud IAM.")
    assert denied.value.metadata == {"permission": "tpu.nodes.delete", "resource": f"{PARENT}/nodes/w1"}


def test_failures_reported_in_operations_carry_details(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    # A stockout in other words: code 8 of the failed create is the signal, an ErrorInfo when a reason is given.
    tpu_emulator.stockout(ZONE, count=1, message="The request could not be completed.", reason="STOCKOUT")
    with pytest.raises(gexc.ResourceExhausted) as stockout:
        create(client, "o1").result(polling=FAST)
    status = stockout.value.errors[0]  # a failed operation: api-core gives the google.rpc.Status here...
    assert (status.code, status.message) == (8, "The request could not be completed.")
    assert stockout.value.details == [] and stockout.value.reason is None  # ...and nothing in details or reason
    assert unpack(status.details, error_details_pb2.ErrorInfo).reason == "STOCKOUT"
    # A quota reported in the operation: the same code 8, told apart by its QuotaFailure.
    tpu_emulator.quota_exceeded(ZONE, count=1, in_operation=True, message="Try again later.")
    op = create(client, "o2")
    with pytest.raises(gexc.ResourceExhausted) as quota:
        op.result(polling=FAST)
    assert op.operation.error.code == 8
    assert (
        "Quota limit" in unpack(quota.value.errors[0].details, error_details_pb2.QuotaFailure).violations[0].description
    )


def unpack(details: Any, kind: type[Message]) -> Any:
    """The first detail (a protobuf Any) of type `kind`, unpacked."""
    found = kind()
    assert any(d.Unpack(found) for d in details), f"no {kind.DESCRIPTOR.full_name} in {details}"
    return found


def test_slow_create(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    tpu_emulator.slow_create(600, zone=ZONE, count=1)
    op = create(client, "slow")
    time.sleep(0.4)  # twice this module's create_delay_s of 0.2
    assert client.get_node(name=f"{PARENT}/nodes/slow").state == tpu_v2.Node.State.CREATING
    assert not client.get_operation({"name": op.operation.name}).done
    tpu_emulator.advance(600)  # the slow create's time has come
    assert op.result(polling=FAST).state == tpu_v2.Node.State.READY


def test_preempted_node_stays_until_deleted(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    create(client, "spot1", scheduling_config={"spot": True}).result(polling=FAST)
    assert tpu_emulator.preempt("spot1") == f"{PARENT}/nodes/spot1"
    time.sleep(0.3)
    assert client.get_node(name=f"{PARENT}/nodes/spot1").state == tpu_v2.Node.State.PREEMPTED
    with pytest.raises(ApiError, match="only a READY node can be preempted"):
        tpu_emulator.preempt("spot1")
    client.delete_node(name=f"{PARENT}/nodes/spot1").result(polling=FAST)
    with pytest.raises(gexc.NotFound):
        client.get_node(name=f"{PARENT}/nodes/spot1")


def test_faults_over_the_admin_http_api(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    admin = f"{tpu_emulator.endpoint}/_emulator"
    status, fault = http("POST", f"{admin}/faults/stockout", {"zone": ZONE, "count": 1})
    assert status == 200 and fault["kind"] == "stockout"
    assert [f["id"] for f in http("GET", f"{admin}/faults")[1]["faults"]] == [fault["id"]]
    with pytest.raises(gexc.ResourceExhausted):
        create(client, "h1").result(polling=FAST)
    assert http("POST", f"{admin}/faults/http", {"status": 503, "count": 2})[0] == 200
    assert http("DELETE", f"{admin}/faults")[0] == 200
    create(client, "h1").result(polling=FAST)
    assert http("POST", f"{admin}/preempt", {"node": "h1"})[1] == {"preempted": f"{PARENT}/nodes/h1"}
    assert wait_for(lambda: client.get_node(name=f"{PARENT}/nodes/h1").state == tpu_v2.Node.State.PREEMPTED)
    assert [n["state"] for n in http("GET", f"{admin}/nodes")[1]["nodes"]] == ["PREEMPTED"]
    assert http("POST", f"{admin}/faults/bogus", {})[0] == 404
    assert http("POST", f"{admin}/faults/quota", {"zone": ZONE, "color": "red"})[0] == 400
    assert http("POST", f"{admin}/faults/http", {"status": 200})[0] == 400
    assert http("POST", f"{admin}/reset")[0] == 200
    assert list(client.list_nodes(parent=PARENT)) == []
    assert tpu_emulator.requests[-1].path == f"/v2/{PARENT}/nodes"


def test_new_fault_kinds_over_the_admin_http_api(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    admin = f"{tpu_emulator.endpoint}/_emulator/faults"
    added = {
        "rate-limit": {"method": "GET", "message": "Slow down."},
        "slow-delete": {"seconds": 5, "zone": ZONE},
        "collision": {"node": "c-*", "labels": {"tpu-runner-run": "theirs"}},
        "boot-hang": {"zone": ZONE, "count": 2},
        "quota": {"in_operation": True, "reason": "RESOURCE_QUOTA_EXCEEDED", "message": "No."},
        "stockout": {"reason": "STOCKOUT", "node": "s-*"},
        "drop-env": {"env": ["RUNNER_DEADLINE"], "image": "us-docker.pkg.dev/*"},
    }
    for kind, body in added.items():
        status, fault = http("POST", f"{admin}/{kind}", body)
        assert status == 200 and fault["kind"] == kind.replace("-", "_"), fault
    assert sorted(f["kind"] for f in http("GET", admin)[1]["faults"]) == sorted(k.replace("-", "_") for k in added)
    with pytest.raises(gexc.TooManyRequests, match="Slow down") as caught:
        client.list_nodes(parent=PARENT)
    assert caught.value.reason == "RATE_LIMIT_EXCEEDED"
    assert http("POST", f"{admin}/slow-delete", {})[0] == 400  # seconds are required
    assert http("POST", f"{admin}/stockout", {"status": 13})[0] == 400  # status is not a stockout's
    assert http("POST", f"{admin}/collision", {"labels": {"k": 1}})[0] == 400
    assert http("POST", f"{admin}/drop-env", {"env": []})[0] == 400  # which variables, then?
    assert http("POST", f"{admin}/stockout", {"env": ["X"]})[0] == 400


# -- recording and the command line -----------------------------------------------------------------------------


def test_every_request_is_recorded(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    create(client, "r1", labels={"run": "abc"}).result(polling=FAST)
    first = tpu_emulator.requests[0]
    assert (first.method, first.path, first.status) == ("POST", f"/v2/{PARENT}/nodes", 200)
    assert first.query["nodeId"] == "r1"
    assert first.body["acceleratorType"] == "v4-8" and first.body["labels"] == {"run": "abc"}
    assert first.time <= time.time()
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.status = 500  # type: ignore[misc]
    over_http = http("GET", f"{tpu_emulator.endpoint}/_emulator/requests?path=nodes$")[1]["requests"]
    assert over_http[0]["query"]["nodeId"] == "r1"


def test_command_line_serves_until_interrupted(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_emulator", "--port", "0", "--workdir", str(tmp_path), "--quiet"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        endpoint = None
        for line in proc.stdout:
            if "export RUNNER_TPU_ENDPOINT=" in line:
                endpoint = line.split("=", 1)[1].strip()
                break
        assert endpoint and endpoint.startswith("http://127.0.0.1:")
        assert http("GET", f"{endpoint}/_emulator/health")[1]["ok"] is True
        assert http("GET", f"{endpoint}/v2/{PARENT}/nodes")[1] == {}  # proto3 JSON: an empty list is omitted
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_methods_not_emulated_answer_501(client: tpu_v2.TpuClient) -> None:
    create(client, "x1").result(polling=FAST)
    with pytest.raises(gexc.MethodNotImplemented, match="does not implement"):
        client.stop_node(request={"name": f"{PARENT}/nodes/x1"})
    with pytest.raises(gexc.MethodNotImplemented):
        client.list_runtime_versions(parent=PARENT)
    types = [t.type_ for t in client.list_accelerator_types(parent=PARENT)]
    assert "v4-8" in types and "v5p-8" not in types
    assert client.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v4-32").type_ == "v4-32"
