"""GkeEmulator: the GKE API (container.v1) on loopback for the real google-cloud-container client, whose node pools
make and take away nodes in a real Kubernetes API server (tpu_emulator.kube.KubeRehearsal).

    with KubeRehearsal(workdir) as kube, GkeEmulator() as gke:
        gke.add_cluster("proj", "us-central1", "tpu-cluster", kube)
        client = container_v1.ClusterManagerClient(transport="rest", credentials=AnonymousCredentials(),
                                                   client_options={"api_endpoint": gke.endpoint})
        gke.faults.add(Fault("stockout", zone="us-central1-a", count=1))   # the next create there fails

Faults (tpu_emulator.faults.Fault; zone and node = the node pool's name pattern): stockout, quota (quota = its
name, limit), slow_create (seconds), delete_fails (message), http (status, method, path), permission (permission,
e.g. container.clusters.update). Beside them, `busy` (another operation changing the cluster) and `preempt_node`.
"""

from __future__ import annotations

import base64
import threading
from types import TracebackType
from typing import Any

from tpu_emulator.faults import Faults
from tpu_emulator.gke.api import GkeApi
from tpu_emulator.gke.state import Cluster, GkeCloud, NodeSink
from tpu_emulator.server import HttpServer, RecordedRequest


class GkeEmulator:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, create_delay_s: float = 0.5, delete_delay_s: float = 0.3
    ) -> None:
        self.faults = Faults()
        self.cloud = GkeCloud(self.faults, create_delay_s=create_delay_s, delete_delay_s=delete_delay_s)
        self.api = GkeApi(self.cloud, self.faults)
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server = HttpServer(host, port, self.api.handle, self._record)
        self.endpoint = f"http://{host}:{self._server.port}"

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def start(self) -> GkeEmulator:
        self.cloud.start()
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()
        self.cloud.stop()

    def __enter__(self) -> GkeEmulator:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def add_cluster(self, project: str, location: str, name: str, kube: Any | None = None) -> Cluster:
        """A cluster that exists already (the runner never creates clusters); its node pools' nodes go to `kube`
        (a KubeRehearsal), whose API server is the cluster's endpoint."""
        sink: NodeSink | None = None
        endpoint, ca = "", ""
        if kube is not None:
            sink = _Sink(kube)
            endpoint = kube.endpoint.removeprefix("https://")
            ca = base64.b64encode(kube.cluster.ca_file.read_bytes()).decode()
        cluster = Cluster(project, location, name, sink, endpoint, ca)
        with self.cloud.lock:
            self.cloud.clusters[cluster.path] = cluster
        return cluster

    def preempt_node(self, name: str, *, grace_s: float = 0.0) -> str:
        """The VM under node `name` reclaimed (a Spot VM's preemption): its pods stopped, the Node gone, the VM made
        again by its pool after the create delay; the pool's path."""
        return self.cloud.preempt(name, grace_s)

    def busy(self, project: str, location: str, name: str, seconds: float, *, refusals: int = 0) -> str:
        """Another operation changes the cluster until `seconds` after it has refused `refusals` node pool creates
        or deletes (FAILED_PRECONDITION); the operation's name."""
        with self.cloud.lock:
            cluster = self.cloud.cluster(project, location, name)
        return self.cloud.busy(cluster, seconds, refusals=refusals).name

    def node_pools(self) -> dict[str, dict[str, Any]]:
        """Every node pool by path, as the API shows it."""
        with self.cloud.lock:
            return {path: pool.to_json() for path, pool in self.cloud.pools.items()}


class _Sink:
    """A KubeRehearsal as a node pool's home: nodes made Ready through its API; taken away through its kubelet."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube

    def add_nodes(self, *nodes: Any) -> None:
        self.kube.add_nodes(*nodes)

    def take_node(self, name: str, grace_s: float = 0.0) -> None:
        if self.kube.kubelet is not None:
            self.kube.kubelet.take_node(name, grace_s=grace_s)
        else:
            self.kube.remove_nodes(name)
