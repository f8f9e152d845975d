"""Fake TPU nodes, made through the API as GKE's node pools make them: the real scheduler binds pods to them by
nodeSelector, taint and the `google.com/tpu` resource, and the played kubelet (tpu_emulator.kube.kubelet) runs what
it binds.

A node is created with GKE's TPU labels (cloud.google.com/gke-tpu-accelerator, gke-tpu-topology, gke-nodepool,
machine type, zone; gke-spot / gke-flex-start where they apply) and the `google.com/tpu=present:NoSchedule` taint;
its status then says Ready with `google.com/tpu` capacity and allocatable, and the `node.kubernetes.io/not-ready`
taint the API server adds to every new node (TaintNodesByCondition) is removed, as a node's lifecycle controller
does once its kubelet reports Ready. Every node made here carries PLAYED_LABEL: the nodes the kubelet plays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

PLAYED_LABEL = "tpu-emulator.kube/kubelet"
ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY = "cloud.google.com/gke-tpu-topology"
NODE_POOL = "cloud.google.com/gke-nodepool"
SPOT = "cloud.google.com/gke-spot"
FLEX_START = "cloud.google.com/gke-flex-start"
TPU_RESOURCE = "google.com/tpu"
TPU_TAINT = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
NOT_READY = "node.kubernetes.io/not-ready"


@dataclass(frozen=True)
class TpuNode:
    """One TPU VM of a node pool, as a Kubernetes node."""

    name: str
    accelerator: str  # tpu-v5p-slice, tpu-v6e-slice, tpu7x, ...
    topology: str  # the slice's: 2x2x2
    chips: int  # google.com/tpu on this VM
    node_pool: str = "tpu-pool"
    machine_type: str = "ct5p-hightpu-4t"
    zone: str = "us-central1-a"
    spot: bool = False
    flex_start: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()  # besides the TPU taint

    def manifest(self) -> dict[str, Any]:
        region = self.zone.rsplit("-", 1)[0]
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": self.machine_type,
            "topology.kubernetes.io/zone": self.zone,
            "topology.kubernetes.io/region": region,
            "cloud.google.com/machine-family": self.machine_type.split("-", 1)[0],
            NODE_POOL: self.node_pool,
            ACCELERATOR: self.accelerator,
            TOPOLOGY: self.topology,
            PLAYED_LABEL: "played",
            **({SPOT: "true"} if self.spot else {}),
            **({FLEX_START: "true"} if self.flex_start else {}),
            **self.labels,
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {"taints": [TPU_TAINT, *self.taints]},
        }

    def status(self) -> dict[str, Any]:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        resources = {
            "cpu": "208",
            "memory": "448Gi",
            "pods": "110",
            "ephemeral-storage": "100Gi",
            TPU_RESOURCE: str(self.chips),
        }
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                },
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.name}],
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "Container-Optimized OS",
                "containerRuntimeVersion": "emulated://",
                "kubeletVersion": "v1.20.2",
                "kubeProxyVersion": "v1.20.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }


def make(core: Any, node: TpuNode) -> None:
    """Create `node` Ready, as GKE's node pool would have it (see the module's doc)."""
    from kubernetes.client.rest import ApiException

    try:
        core.create_node(node.manifest())
    except ApiException as exc:
        if exc.status != 409:
            raise
    _retry(lambda: _set_status(core, node))
    _retry(lambda: _untaint(core, node.name))


def remove(core: Any, name: str) -> None:
    from kubernetes.client.rest import ApiException

    try:
        core.delete_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _set_status(core: Any, node: TpuNode) -> None:
    current = core.api_client.sanitize_for_serialization(core.read_node(node.name))
    current["status"] = {**(current.get("status") or {}), **node.status()}
    core.replace_node_status(node.name, current)


def _untaint(core: Any, name: str) -> None:
    current = core.api_client.sanitize_for_serialization(core.read_node(name))
    taints = current["spec"].get("taints") or []
    current["spec"]["taints"] = [t for t in taints if t["key"] != NOT_READY]
    core.replace_node(name, current)


def _retry(step: Any, attempts: int = 10) -> None:
    from kubernetes.client.rest import ApiException

    for attempt in range(attempts):
        try:
            step()
            return
        except ApiException as exc:
            if exc.status != 409 or attempt == attempts - 1:
                raise
