"""The GKE rehearsal's Kubernetes: a real control plane built from Debian's packages (etcd, kube-apiserver,
kube-scheduler, kube-controller-manager 1.20.2; `make kube` builds them once), with what it cannot run played
beside it (the JobSet controller, Indexed completion and GKE's TPU webhook at pod admission, the kubelet of fake TPU
nodes), and a manifest validator that refuses unknown fields (1.20 prunes them silently). See docs/emulator.md.

    with KubeRehearsal(workdir) as kube:
        kube.add_nodes(TpuNode("gke-tpu-0", "tpu-v5p-slice", "2x2x2", chips=4))
        api = kube.client()          # kubernetes.client.ApiClient from kube.kubeconfig

Importing this package is cheap: the kubernetes client loads when a part starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpu_emulator.kube.cluster import KubeCluster
    from tpu_emulator.kube.nodes import TpuNode
    from tpu_emulator.kube.rehearsal import KubeRehearsal
    from tpu_emulator.kube.validate import Schemas

__all__ = ["KubeCluster", "KubeRehearsal", "Schemas", "TpuNode"]
_HOMES = {
    "KubeCluster": "tpu_emulator.kube.cluster",
    "KubeRehearsal": "tpu_emulator.kube.rehearsal",
    "Schemas": "tpu_emulator.kube.validate",
    "TpuNode": "tpu_emulator.kube.nodes",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'tpu_emulator.kube' has no attribute {name!r}")
