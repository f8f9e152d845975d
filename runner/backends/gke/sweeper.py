"""The gke backend's part of `runner gc`: in each cluster (its locations are clusters: the GKE cluster or kubeconfig
context a run record names, and those in $RUNNER_GKE_CLUSTERS), every JobSet labelled managed-by=tpu-runner in any
namespace, judged by its run directory (its annotation) like a VM; and every node pool labelled so, which follows
its run's JobSet (orphaned or kept with it) or, when that is gone, is judged by its labels alone (its run's
deadline passed, its run ended on this machine). A node pool the runner did not create is never listed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from runner.backends import labels
from runner.backends.gke.api import GkeApi, KubeApi
from runner.backends.gke.requests import RUN_DIR_ANNOTATION
from runner.backends.gke.target import NAME
from runner.backends.gke.workload import Workload
from runner.backends.sweep import Found, Sweep
from runner.errors import BackendError
from runner.timings import Timings

CLUSTER = "cluster"  # the location kind
CLUSTERS_ENV = "RUNNER_GKE_CLUSTERS"  # more clusters to sweep: comma-separated GKE paths or context:NAME
_JOBSET = "jobset"
_POOL = "node pool"


def _stamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class GkeSweep(Sweep):
    backend = NAME
    location_kind = CLUSTER

    def __init__(self, timings: Timings | None = None) -> None:
        self.timings = timings or Timings()
        self.gke = GkeApi(self.timings)
        self.workload = Workload(print, self.timings.api_poll_s)
        self._kubes: dict[str, KubeApi] = {}

    def locations(self) -> set[str]:
        return set()  # clusters are the user's: the catalog offers none

    def recorded_location(self, handle: Mapping[str, Any]) -> str | None:
        cluster = handle.get("cluster")
        if not cluster:
            return None
        context = handle.get("context")
        return f"context:{context}" if str(cluster).startswith("context:") and context else str(cluster)

    def configured_locations(self) -> set[str]:
        return {c.strip() for c in os.environ.get(CLUSTERS_ENV, "").split(",") if c.strip()}

    def kube(self, cluster: str) -> KubeApi:
        if cluster not in self._kubes:
            context = cluster.removeprefix("context:") if cluster.startswith("context:") else None
            self._kubes[cluster] = KubeApi(cluster, context=context, gke=self.gke)
        return self._kubes[cluster]

    def scan(self, project: str, location: str) -> list[Found]:
        out: list[Found] = []
        jobsets: dict[str, str] = {}  # run id -> the Found name of its JobSet
        for js in self.kube(location).jobsets(f"{labels.MANAGED}={labels.MANAGED_BY}"):
            meta = js["metadata"]
            name = f"{location}/namespaces/{meta['namespace']}/jobsets/{meta['name']}"
            found_labels = dict(meta.get("labels") or {})
            state = (js.get("status") or {}).get("terminalState") or "Active"
            out.append(
                Found(
                    kind=_JOBSET,
                    name=name,
                    location=location,
                    state="Deleting" if meta.get("deletionTimestamp") else state,
                    labels=found_labels,
                    created_at=_stamp(meta.get("creationTimestamp")),
                    run_dir=(meta.get("annotations") or {}).get(RUN_DIR_ANNOTATION),
                    going=bool(meta.get("deletionTimestamp")),
                )
            )
            if run := found_labels.get(labels.RUN):
                jobsets[run] = name
        if location.startswith("context:"):
            return out
        for pool in self.gke.pools(location):
            pool_labels = dict(pool.config.resource_labels)
            if not labels.managed(pool_labels):
                continue
            out.append(
                Found(
                    kind=_POOL,
                    name=f"{location}/nodePools/{pool.name}",
                    location=location,
                    state=pool.status.name,
                    labels=pool_labels,
                    judge=False,
                    going=pool.status.name == "STOPPING",
                    follows=jobsets.get(pool_labels.get(labels.RUN, "")),
                )
            )
        return out

    def api_now(self) -> float | None:
        return None  # ages are not judged here: a JobSet's run directory says whether it is needed

    @staticmethod
    def _jobset_ref(found: Found) -> tuple[str, str, str]:
        cluster, _, rest = found.name.partition("/namespaces/")
        namespace, _, name = rest.partition("/jobsets/")
        return cluster, namespace, name

    def request_delete(self, project: str, found: Found) -> str | None:
        if found.kind == _POOL:
            return self.gke.delete_pool(found.name)
        cluster, namespace, name = self._jobset_ref(found)
        return f"{_JOBSET}:{name}" if self.kube(cluster).delete_jobset(namespace, name) else None

    def outcome(self, project: str, found: Found, operation: str) -> tuple[bool, str | None]:
        if found.kind == _JOBSET:
            return True, None  # a foreground delete has no operation: `exists` confirms it with its pods
        state = self.gke.operation(found.name.split("/nodePools/")[0], operation)
        if state.failure is not None:
            return True, f"{state.failure.said()} ({state.failure.code})"
        return state.done, None

    def exists(self, project: str, found: Found) -> bool:
        if found.kind == _POOL:
            return self.gke.pool(found.name) is not None
        cluster, namespace, name = self._jobset_ref(found)
        kube = self.kube(cluster)
        try:
            pods, _ = kube.pods(namespace, f"jobset.sigs.k8s.io/jobset-name={name}")
            return kube.jobset(namespace, name) is not None or bool(pods)
        except BackendError:
            return True  # unknown: not confirmed gone
