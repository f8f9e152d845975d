"""KubeRehearsal: the real control plane (tpu_emulator.kube.cluster) with what it cannot run played beside it: the
JobSet controller, the pod webhook (Indexed completion, GKE's TPU variables) and the kubelet of the fake TPU nodes.

    with KubeRehearsal(workdir) as kube:
        kube.add_nodes(TpuNode("gke-tpu-0", "tpu-v5p-slice", "2x2x2", 4), ...)
        batch = kubernetes.client.BatchV1Api(kube.client())       # or the kubeconfig at kube.kubeconfig

Start order: control plane (the JobSet CRD Established) -> webhook registered -> kubelet following nodes and pods
-> JobSet controller following JobSets and Jobs. Stop is the reverse, and ends every process (the pods' too).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from runner.backends.container import Prefer
from runner.launch.engine import Engine
from tpu_emulator.kube import nodes
from tpu_emulator.kube.cluster import CONTROLLERS, KubeCluster
from tpu_emulator.kube.jobset import JobSetController
from tpu_emulator.kube.kubelet import Kubelet
from tpu_emulator.kube.nodes import TpuNode
from tpu_emulator.kube.webhook import PodWebhook


class KubeRehearsal:
    def __init__(
        self,
        workdir: Path,
        *,
        scheduler: bool = True,
        controllers: tuple[str, ...] = CONTROLLERS,
        kubelet_mode: Prefer = "process",
        engine: Engine | None = None,
        max_grace_s: float = 30.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.cluster = KubeCluster(self.workdir / "control-plane", scheduler=scheduler, controllers=controllers)
        self.kubelet_mode: Prefer = kubelet_mode
        self.engine = engine
        self.max_grace_s = max_grace_s
        self._api: Any = None
        self.webhook: PodWebhook | None = None
        self.kubelet: Kubelet | None = None
        self.jobsets: JobSetController | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def endpoint(self) -> str:
        return self.cluster.endpoint

    def client(self) -> Any:
        """A new ApiClient of the official client, from the kubeconfig."""
        return self.cluster.client()

    def __enter__(self) -> KubeRehearsal:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self.cluster.start()
            self._api = self.cluster.client()
            self.webhook = PodWebhook(self._api, self.workdir / "webhook")
            self.webhook.start()
            self.kubelet = Kubelet(
                self._api,
                self.workdir / "kubelet",
                mode=self.kubelet_mode,
                engine=self.engine,
                max_grace_s=self.max_grace_s,
            )
            self.kubelet.start()
            self.jobsets = JobSetController(self._api)
            self.jobsets.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for part in (self.jobsets, self.kubelet, self.webhook):
            if part is not None:
                part.stop()
        self.jobsets = self.kubelet = self.webhook = None
        if self._api is not None:
            self._api.close()
            self._api = None
        self.cluster.stop()

    def add_nodes(self, *tpu_nodes: TpuNode) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self._api)
        for node in tpu_nodes:
            nodes.make(core, node)

    def remove_nodes(self, *names: str) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self._api)
        for name in names:
            nodes.remove(core, name)
