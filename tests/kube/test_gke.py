"""The GKE API emulator driven by the real google-cloud-container client: node pools whose creation makes fake TPU
nodes in the real API server and whose deletion takes them away, capacity faults in the API's words, and every
request and answer checked against Google's container.v1 discovery document."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.kubecluster import CLUSTER, GROUP
from tests.waiting import wait_for
from tpu_emulator.faults import Fault

KUBE = GROUP  # the tests that make nodes in the rehearsal's API server


def _done(client: Any, op: Any) -> Any:
    from google.cloud import container_v1

    def poll() -> Any:
        found = client.get_operation(name=f"projects/proj/locations/us-central1/operations/{op.name}")
        return found if found.status == container_v1.Operation.Status.DONE else None

    return wait_for(poll, f"operation {op.name} DONE", poll_s=0.2)


def _pool(name: str, *, topology: str = "2x2x2", count: int = 2, machine: str = "ct5p-hightpu-4t") -> Any:
    from google.cloud import container_v1
    from google.protobuf import duration_pb2

    return container_v1.NodePool(
        name=name,
        initial_node_count=count,
        locations=["us-central1-a"],
        config=container_v1.NodeConfig(
            machine_type=machine,
            spot=True,
            labels={"managed-by": "tpu-runner"},
            resource_labels={"tpu-runner-run": "r1"},
            max_run_duration=duration_pb2.Duration(seconds=3600),
        ),
        placement_policy=container_v1.NodePool.PlacementPolicy(tpu_topology=topology),
    )


@KUBE
def test_a_tpu_node_pool_makes_ready_tpu_nodes_and_its_delete_takes_them(
    gke_kube: Any, gke_client: Any, kube_api: Any
) -> None:
    from google.cloud import container_v1
    from kubernetes import client

    name = f"tpu-{uuid.uuid4().hex[:6]}"
    op = gke_client.create_node_pool(parent=CLUSTER, node_pool=_pool(name))
    assert op.operation_type == container_v1.Operation.Type.CREATE_NODE_POOL
    assert _done(gke_client, op).error.code == 0

    pool = gke_client.get_node_pool(name=f"{CLUSTER}/nodePools/{name}")
    assert pool.status == container_v1.NodePool.Status.RUNNING
    core = client.CoreV1Api(kube_api)
    nodes = core.list_node(label_selector=f"cloud.google.com/gke-nodepool={name}").items
    assert len(nodes) == 2
    for node in nodes:
        labels = node.metadata.labels
        assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5p-slice"
        assert labels["cloud.google.com/gke-tpu-topology"] == "2x2x2"
        assert labels["cloud.google.com/gke-spot"] == "true"
        assert labels["managed-by"] == "tpu-runner"  # the pool's node labels
        assert node.status.allocatable["google.com/tpu"] == "4"
        assert [(t.key, t.effect) for t in node.spec.taints] == [("google.com/tpu", "NoSchedule")]
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)

    assert _done(gke_client, gke_client.delete_node_pool(name=f"{CLUSTER}/nodePools/{name}")).error.code == 0
    assert core.list_node(label_selector=f"cloud.google.com/gke-nodepool={name}").items == []
    assert name not in [p.name for p in gke_client.list_node_pools(parent=CLUSTER).node_pools]

    checked = [r for r in gke_kube.requests if r.path.startswith("/v1/")]
    assert checked and all(r.checked and r.checked.startswith("container.v1 ") for r in checked)
    assert all(r.status == 200 for r in checked)


@KUBE
def test_a_stockout_fails_the_operation_and_leaves_the_pool_in_error(
    gke_kube: Any, gke_client: Any, kube_api: Any
) -> None:
    from google.cloud import container_v1
    from kubernetes import client

    gke_kube.faults.add(Fault("stockout", zone="us-central1-a", count=1))
    name = f"tpu-{uuid.uuid4().hex[:6]}"
    done = _done(gke_client, gke_client.create_node_pool(parent=CLUSTER, node_pool=_pool(name)))
    assert done.error.code == 8
    assert "[GCE_STOCKOUT]" in done.error.message
    assert "'projects/proj/zones/us-central1-a' does not have enough resources available" in done.error.message
    pool = gke_client.get_node_pool(name=f"{CLUSTER}/nodePools/{name}")
    assert pool.status == container_v1.NodePool.Status.ERROR  # it exists, and must be deleted
    assert client.CoreV1Api(kube_api).list_node(label_selector=f"cloud.google.com/gke-nodepool={name}").items == []
    assert _done(gke_client, gke_client.delete_node_pool(name=f"{CLUSTER}/nodePools/{name}")).error.code == 0


def test_a_quota_fault_names_the_quota(gke: Any, gke_client: Any) -> None:
    gke.faults.add(Fault("quota", quota="TPU_V5P_PREEMPTIBLE", limit=0, count=1))
    done = _done(gke_client, gke_client.create_node_pool(parent=CLUSTER, node_pool=_pool(f"q-{uuid.uuid4().hex[:6]}")))
    assert done.error.code == 8
    assert "[QUOTA_EXCEEDED]" in done.error.message and "Quota 'TPU_V5P_PREEMPTIBLE' exceeded" in done.error.message


def test_a_cluster_busy_with_another_operation_refuses_pool_changes_until_it_is_done(gke: Any, gke_client: Any) -> None:
    """The upgrade ends a set time after its last counted refusal, not after it began: before that it refuses every
    change however long the client took to come (no test of it may hang on the machine's speed)."""
    from google.api_core import exceptions
    from google.cloud import container_v1

    upgrade = gke.busy("proj", "us-central1", "tpu-cluster", 0.1, refusals=2)
    operation = f"projects/proj/locations/us-central1/operations/{upgrade}"
    for refusal in range(2):
        with pytest.raises(exceptions.GoogleAPICallError) as refused:
            gke_client.create_node_pool(parent=CLUSTER, node_pool=_pool(f"b-{uuid.uuid4().hex[:6]}"))
        assert f"Cluster is running incompatible operation {upgrade}." in refused.value.message
        if refusal == 0:  # its end is not set before the last counted refusal, whatever the time
            assert gke_client.get_operation(name=operation).status == container_v1.Operation.Status.RUNNING
    _done(gke_client, gke_client.get_operation(name=operation))
    name = f"b-{uuid.uuid4().hex[:6]}"
    assert _done(gke_client, gke_client.create_node_pool(parent=CLUSTER, node_pool=_pool(name))).error.code == 0
    assert _done(gke_client, gke_client.delete_node_pool(name=f"{CLUSTER}/nodePools/{name}")).error.code == 0


@pytest.mark.parametrize(
    ("pool", "words"),
    [
        ({"count": 3}, "does not match TPU topology 2x2x2"),
        ({"topology": "4x4"}, "Invalid TPU topology"),
        ({"machine": "tpu7x-standard-4t"}, "needs a workload policy"),
    ],
)
def test_a_tpu_node_pool_gke_would_refuse_is_refused(gke_client: Any, pool: dict[str, Any], words: str) -> None:
    from google.api_core import exceptions

    with pytest.raises(exceptions.BadRequest) as refused:
        gke_client.create_node_pool(parent=CLUSTER, node_pool=_pool(f"bad-{uuid.uuid4().hex[:6]}", **pool))
    assert words in refused.value.message


def test_a_request_the_discovery_document_refuses_is_400(gke: Any) -> None:
    import json
    import urllib.error
    import urllib.request

    body = json.dumps({"nodePool": {"name": "x", "config": {"machineTyp": "ct5p-hightpu-4t"}}}).encode()
    request = urllib.request.Request(f"{gke.endpoint}/v1/{CLUSTER}/nodePools", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    error = json.loads(refused.value.read())["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert """Unknown name "machineTyp" at 'node_pool.config'""" in error["message"]


@KUBE
def test_max_run_duration_takes_the_nodes_away(gke_kube: Any, gke_client: Any, kube_api: Any) -> None:
    from google.protobuf import duration_pb2
    from kubernetes import client

    name = f"tpu-{uuid.uuid4().hex[:6]}"
    pool = _pool(name)
    pool.config.max_run_duration = duration_pb2.Duration(seconds=2)
    _done(gke_client, gke_client.create_node_pool(parent=CLUSTER, node_pool=pool))
    core = client.CoreV1Api(kube_api)
    assert len(core.list_node(label_selector=f"cloud.google.com/gke-nodepool={name}").items) == 2
    wait_for(
        lambda: core.list_node(label_selector=f"cloud.google.com/gke-nodepool={name}").items == [],
        "the nodes taken away at maxRunDuration",
    )
    _done(gke_client, gke_client.delete_node_pool(name=f"{CLUSTER}/nodePools/{name}"))
