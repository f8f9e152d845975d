"""Queued resources on the Cloud TPU API emulator (tpu_emulator.queued), through the real google-cloud-tpu client:
the queue's states (WAITING_FOR_RESOURCES, or ACCEPTED with the older API), provisioning, suspension, failure,
multislice node specs and deletion with force.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import tpu_v2

from tests.emulator.api import FAST, OP_NAME, PARENT, PROJECT, RUNTIME, ZONE, quick_api_emulator, tpu_client
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator


@pytest.fixture
def tpu_emulator(tmp_path: Path) -> Iterator[TpuEmulator]:
    with quick_api_emulator(tmp_path) as emulator:
        yield emulator


@pytest.fixture
def client(tpu_emulator: TpuEmulator) -> tpu_v2.TpuClient:
    return tpu_client(tpu_emulator)


def node_spec() -> tpu_v2.Node:
    return tpu_v2.Node(accelerator_type="v4-8", runtime_version=RUNTIME)


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """A plain HTTP call, as curl would make it (what the client cannot express)."""
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


def queued_resource(node_id: str, **fields: Any) -> tpu_v2.QueuedResource:
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id=node_id, node=node_spec())
    return tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), **fields)


def qr_state(client: tpu_v2.TpuClient, name: str) -> str:
    return client.get_queued_resource(name=name).state.state.name


def test_queued_resource_lifecycle_and_force_delete(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    tpu_emulator.stockout(ZONE, count=2)  # a queued resource waits a stockout out
    op = client.create_queued_resource(parent=PARENT, queued_resource_id="qr1", queued_resource=queued_resource("qn1"))
    assert OP_NAME.match(op.operation.name)
    name = f"{PARENT}/queuedResources/qr1"
    assert op.result(polling=FAST).name == name
    seen = set()
    wait_for(lambda: seen.add(qr_state(client, name)) or "ACTIVE" in seen)
    assert "WAITING_FOR_RESOURCES" in seen
    node = client.get_node(name=f"{PARENT}/nodes/qn1")
    assert node.state == tpu_v2.Node.State.READY and node.queued_resource == name
    assert [q.name for q in client.list_queued_resources(parent=PARENT)] == [name]
    with pytest.raises(gexc.BadRequest) as caught:
        client.delete_queued_resource(name=name)
    assert error_status(caught.value) == "FAILED_PRECONDITION" and "force" in caught.value.message
    client.delete_queued_resource(request={"name": name, "force": True}).result(polling=FAST)
    with pytest.raises(gexc.NotFound):
        client.get_queued_resource(name=name)
    with pytest.raises(gexc.NotFound):
        client.get_node(name=f"{PARENT}/nodes/qn1")
    assert [r.query.get("force") for r in tpu_emulator.requests if r.method == "DELETE"] == [None, "true"]


def test_queued_resource_waits_for_resources_while_stocked_out(
    client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator
) -> None:
    tpu_emulator.stockout(ZONE)  # until cleared
    op = client.create_queued_resource(parent=PARENT, queued_resource_id="qw", queued_resource=queued_resource("qwn"))
    name = f"{PARENT}/queuedResources/qw"
    assert op.result(polling=FAST).state.state.name == "WAITING_FOR_RESOURCES"  # the create is done: it is queued
    time.sleep(0.4)  # several tries later (one every 0.08 s here), still waiting, and no node yet
    assert qr_state(client, name) == "WAITING_FOR_RESOURCES"
    assert list(client.list_nodes(parent=PARENT)) == []
    tpu_emulator.clear_faults()
    seen: list[str] = []
    wait_for(lambda: seen.append(qr_state(client, name)) or seen[-1] == "ACTIVE")
    assert "PROVISIONING" in seen and "ACCEPTED" not in seen
    assert client.get_node(name=f"{PARENT}/nodes/qwn").state == tpu_v2.Node.State.READY


def test_the_older_api_queues_in_accepted(tmp_path: Path) -> None:
    with TpuEmulator(workdir=tmp_path, create_delay_s=0.2, queue_style="accepted") as emulator:
        client = tpu_client(emulator)
        emulator.stockout(ZONE, count=3)
        op = client.create_queued_resource(
            parent=PARENT, queued_resource_id="qa", queued_resource=queued_resource("qan")
        )
        assert op.result(polling=FAST).state.state.name == "ACCEPTED"
        seen: list[str] = []
        wait_for(lambda: seen.append(qr_state(client, f"{PARENT}/queuedResources/qa")) or seen[-1] == "ACTIVE")
        assert "WAITING_FOR_RESOURCES" not in seen


def test_multislice_queued_resource_and_preemption(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    multi = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(node_count=2, node_id_prefix="slice")
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, multislice_params=multi, node=node_spec())
    body = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), spot={})
    client.create_queued_resource(parent=PARENT, queued_resource_id="qm", queued_resource=body).result(polling=FAST)
    name = f"{PARENT}/queuedResources/qm"
    wait_for(lambda: qr_state(client, name) == "ACTIVE")
    nodes = {n.name.rsplit("/", 1)[1]: n for n in client.list_nodes(parent=PARENT)}
    assert sorted(nodes) == ["slice-0", "slice-1"] and all(n.multislice_node for n in nodes.values())
    # Each slice's VMs learn from tpu-env which slice they are and where slice 0's first host coordinates.
    for slice_id in range(2):
        url = f"{tpu_emulator.endpoint}/_vm/{PROJECT}/{ZONE}/slice-{slice_id}/0/computeMetadata/v1/"
        request = urllib.request.Request(url + "instance/attributes/tpu-env", headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            env = dict(line.split(": ", 1) for line in answer.read().decode().splitlines())
        assert env["MEGASCALE_SLICE_ID"] == f"'{slice_id}'" and env["MEGASCALE_NUM_SLICES"] == "'2'"
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "'10.130.0.2:8080'" and env["MEGASCALE_PORT"] == "'8080'"
        assert env["NODE_ID"] == f"'slice-{slice_id}'"
    assert nodes["slice-1"].network_endpoints[0].ip_address != nodes["slice-0"].network_endpoints[0].ip_address
    with tpu_emulator.frozen():  # SUSPENDING lasts this module's delete delay: held while it is read
        tpu_emulator.preempt("slice-1")
        assert qr_state(client, name) == "SUSPENDING"
    wait_for(lambda: qr_state(client, name) == "SUSPENDED")  # the service deletes every slice...
    assert list(client.list_nodes(parent=PARENT)) == []
    state = client.get_queued_resource(name=name).state
    assert state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
    time.sleep(0.3)
    assert qr_state(client, name) == "SUSPENDED"  # ...and the queued resource stays until deleted
    client.delete_queued_resource(name=name).result(polling=FAST)
    # nodeId and multisliceParams are a oneof: the client cannot send both, curl can, and is refused.
    both = {"parent": PARENT, "nodeId": "x", "multisliceParams": {"nodeCount": 2}, "node": {"runtimeVersion": RUNTIME}}
    url = f"{tpu_emulator.endpoint}/v2/{PARENT}/queuedResources?queuedResourceId=qx"
    status, answer = http("POST", url, {"tpu": {"nodeSpec": [both]}})
    assert status == 400 and 'multiple "name_strategy" oneof fields' in answer["error"]["message"]


def test_queued_resource_suspended_when_its_node_goes(client: tpu_v2.TpuClient) -> None:
    op = client.create_queued_resource(
        parent=PARENT, queued_resource_id="qr2", queued_resource=queued_resource("qn2", spot={})
    )
    op.result(polling=FAST)
    name = f"{PARENT}/queuedResources/qr2"
    wait_for(lambda: qr_state(client, name) == "ACTIVE")
    assert client.get_node(name=f"{PARENT}/nodes/qn2").scheduling_config.spot
    client.delete_node(name=f"{PARENT}/nodes/qn2").result(polling=FAST)
    assert qr_state(client, name) == "SUSPENDED"
    client.delete_queued_resource(name=name).result(polling=FAST)  # no nodes left: no force needed


def test_queued_resource_fails_when_valid_until_passes(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    tpu_emulator.stockout(ZONE)  # until cleared
    policy = tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration={"seconds": 1})
    op = client.create_queued_resource(
        parent=PARENT, queued_resource_id="qr3", queued_resource=queued_resource("qn3", queueing_policy=policy)
    )
    op.result(polling=FAST)
    name = f"{PARENT}/queuedResources/qr3"
    wait_for(lambda: qr_state(client, name) == "FAILED")
    state = client.get_queued_resource(name=name).state
    assert state.failed_data.error.code == 8 and "valid-until" in state.failed_data.error.message
    with pytest.raises(gexc.Conflict):
        client.create_queued_resource(parent=PARENT, queued_resource_id="qr3", queued_resource=queued_resource("x"))
    with pytest.raises(gexc.BadRequest, match="parent"):
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent="projects/p/locations/other", node_id="x", node=node_spec())
        client.create_queued_resource(
            parent=PARENT, queued_resource_id="qr4", queued_resource={"tpu": {"node_spec": [spec]}}
        )


def test_the_queued_fails_fault_fails_a_waiting_request_with_its_reason(
    client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator
) -> None:
    tpu_emulator.queued_fails(ZONE, count=1, status="FAILED_PRECONDITION", message="Reservation r has no room.")
    op = client.create_queued_resource(parent=PARENT, queued_resource_id="qf", queued_resource=queued_resource("qfn"))
    name = f"{PARENT}/queuedResources/qf"
    assert op.result(polling=FAST).state.state.name == "WAITING_FOR_RESOURCES"  # it fails later, with time
    wait_for(lambda: qr_state(client, name) == "FAILED")
    state = client.get_queued_resource(name=name).state
    assert state.failed_data.error.code == 9 and state.failed_data.error.message == "Reservation r has no room."
    assert state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
    assert list(client.list_nodes(parent=PARENT)) == []
    time.sleep(0.3)
    assert qr_state(client, name) == "FAILED"  # it stays until deleted
    client.delete_queued_resource(name=name).result(polling=FAST)
    # The fault was used up: the next request provisions.
    client.create_queued_resource(parent=PARENT, queued_resource_id="qg", queued_resource=queued_resource("qgn"))
    wait_for(lambda: qr_state(client, f"{PARENT}/queuedResources/qg") == "ACTIVE")
    # The capacity tier is a oneof: spot and guaranteed at once are refused, as the real API's parser does.
    url = f"{tpu_emulator.endpoint}/v2/{PARENT}/queuedResources?queuedResourceId=qt"
    spec = {"parent": PARENT, "nodeId": "qtn", "node": {"acceleratorType": "v4-8", "runtimeVersion": RUNTIME}}
    status, answer = http("POST", url, {"tpu": {"nodeSpec": [spec]}, "spot": {}, "guaranteed": {}})
    assert status == 400 and "oneof" in answer["error"]["message"], answer
