"""The GKE rehearsal's fixtures: a real Kubernetes API server (with its scheduler, garbage collector and Job
controller) and the played parts (tpu_emulator.kube.KubeRehearsal), once per test session, and a GKE API emulator
whose cluster is that API server (tpu_emulator.gke).

The control plane is built once per machine by `make kube` (`make test` runs it). Where it is not built, the tests
that need it skip, naming why; with CI=true, where `make kube` must have built it, they fail. They share one
xdist group ("kube"): one API server per run, on one worker.

    def test_x(kube: KubeRehearsal, kube_api: ApiClient, kube_namespace: str, tpu_pool: str) -> None: ...
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tpu_emulator.kube import binaries

GROUP = pytest.mark.xdist_group("kube")
CLUSTER = "projects/proj/locations/us-central1/clusters/tpu-cluster"


def unavailable(why: str) -> None:
    import os

    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, and the Kubernetes rehearsal cannot run: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real control plane with the played JobSet controller, pod webhook and kubelet (process mode)."""
    found = binaries.find()
    if isinstance(found, str):
        unavailable(found)
    from tpu_emulator.kube.rehearsal import KubeRehearsal

    with KubeRehearsal(tmp_path_factory.mktemp("kube"), max_grace_s=5.0) as rehearsal:
        yield rehearsal


@pytest.fixture(scope="session")
def kube_api(kube: Any) -> Iterator[Any]:
    """The official client (kubernetes.client.ApiClient), configured from the rehearsal's kubeconfig."""
    with kube.client() as api:
        yield api


@pytest.fixture
def kube_namespace(kube_api: Any) -> str:
    """A namespace of this test's own (namespaces stay: no namespace controller runs)."""
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(kube_api).create_namespace({"metadata": {"name": name}})
    return name


@pytest.fixture
def tpu_pool(kube: Any) -> Iterator[str]:
    """Two fake v5p hosts (a 2x2x2 slice, 4 chips each) in a node pool of this test's own; its name is the
    `cloud.google.com/gke-nodepool` a test's pods select, so no other test's pod lands there. Removed after."""
    from tpu_emulator.kube.nodes import TpuNode

    pool = f"pool-{uuid.uuid4().hex[:8]}"
    nodes = [TpuNode(f"{pool}-{i}", "tpu-v5p-slice", "2x2x2", 4, node_pool=pool) for i in range(2)]
    kube.add_nodes(*nodes)
    yield pool
    kube.remove_nodes(*(n.name for n in nodes))


@pytest.fixture
def gke() -> Iterator[Any]:
    """The GKE API emulator with one cluster, projects/proj/locations/us-central1/clusters/tpu-cluster, whose node
    pools make no nodes (`gke_kube` gives it the rehearsal's API server)."""
    from tpu_emulator.gke.emulator import GkeEmulator

    with GkeEmulator() as emulator:
        emulator.add_cluster("proj", "us-central1", "tpu-cluster")
        yield emulator


@pytest.fixture
def gke_kube(gke: Any, kube: Any) -> Any:
    """`gke` whose cluster is the rehearsal's API server: node pools make and take away its nodes."""
    gke.add_cluster("proj", "us-central1", "tpu-cluster", kube)
    return gke


@pytest.fixture
def gke_client(gke: Any) -> Any:
    """google-cloud-container's ClusterManagerClient on the emulator (REST, anonymous credentials)."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import container_v1

    return container_v1.ClusterManagerClient(
        transport="rest", credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=gke.endpoint)
    )


def jobset_manifest(
    name: str, pool: str, *, hosts: int = 2, command: list[str] | None = None, max_restarts: int = 0, chips: int = 4
) -> dict[str, Any]:
    """A JobSet as a TPU job is written: one slice of `hosts` Indexed pods selecting the pool's TPU nodes."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"managed-by": "tpu-runner"}},
        "spec": {
            "failurePolicy": {"maxRestarts": max_restarts},
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": hosts,
                            "completions": hosts,
                            "backoffLimit": 0,
                            "completionMode": "Indexed",
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "terminationGracePeriodSeconds": 5,
                                    "nodeSelector": {
                                        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                        "cloud.google.com/gke-tpu-topology": "2x2x2",
                                        "cloud.google.com/gke-nodepool": pool,
                                    },
                                    "tolerations": [
                                        {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
                                    ],
                                    "containers": [
                                        {
                                            "name": "worker",
                                            "image": "trainer:test",
                                            "command": command or ["python", "-c", "print('ok')"],
                                            "resources": {"limits": {"google.com/tpu": chips}},
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
