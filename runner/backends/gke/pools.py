"""The node pools a GKE run creates (one per slice): made in the first zone with capacity, waited for until RUNNING,
deleted and confirmed gone. A stockout or a quota shows in the create operation (GKE passes Compute Engine's reason
on: [GCE_STOCKOUT], [QUOTA_EXCEEDED]) and leaves the pool in ERROR, which is deleted before the next zone is tried;
a stockout moves to the next zone the spec allows (runner.backends.locations), a quota stops at once. While another
operation changes the cluster (ClusterBusy: a teammate's pool, an upgrade), a create or a delete is asked again
until it is done, up to delete_timeout_s."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from runner.backends import labels
from runner.backends.deletion import Deletion, OpResult, delete_and_confirm
from runner.backends.gke import requests
from runner.backends.gke.api import ClusterBusy, GkeApi, explain
from runner.backends.locations import first_with_capacity
from runner.errors import AlreadyExists, BackendError, NoCapacity, QuotaExceeded
from runner.plan.planner import Plan

T = TypeVar("T")


@dataclass
class Pools:
    api: GkeApi
    say: Callable[[str], None]
    poll_s: float
    backoff_s: float
    delete_timeout_s: float = 600.0
    delete_retries: int = 3

    def create(self, plan: Plan, name: str) -> str:
        """The slice's node pool `name`, RUNNING, in the first zone with capacity; its path."""
        target = requests.target_of(plan)
        cluster = target.cluster_path
        assert cluster is not None  # the spec's validator: a created pool needs the GKE cluster
        what = f"{target.accelerator.name} ({target.machine_type} x {target.hosts}, {target.topology})"

        def attempt(zone: str, pool: str) -> str:
            return self._create_in(plan, cluster, zone, pool)

        return first_with_capacity(
            target.zones,
            attempt,
            name=name,
            what=what,
            kind="node pool",
            capacity_wait_s=plan.spec.retries.capacity_wait,
            backoff_s=self.backoff_s,
            say=self.say,
        )

    def _create_in(self, plan: Plan, cluster: str, zone: str, name: str) -> str:
        path = f"{cluster}/nodePools/{name}"
        body = requests.node_pool(plan, name, zone)
        self.say(f"creating node pool {name} in {zone} ({body['config']['machineType']} x {body['initialNodeCount']})")
        try:
            operation: str | None = self._when_not_busy(lambda: self.api.create_pool(cluster, body))
        except AlreadyExists:
            found = self.api.pool(path)
            if found is None or not labels.owned(dict(found.config.resource_labels), plan.nonce):
                raise AlreadyExists(
                    f"node pool {name} exists already in {cluster}, and it is not this run's",
                    hint="submit again (a new run id names a new pool)",
                ) from None
            operation = None  # this submit's own, from a retried request: waited for
        except BaseException:
            self.delete(path, announce=False)  # the request may have gone through before the answer was lost
            raise
        try:
            self._wait(cluster, path, operation, zone)
        except BaseException:
            self.delete(path, announce=False)
            raise
        return path

    def _wait(self, cluster: str, path: str, operation: str | None, zone: str) -> None:
        """Until the pool is RUNNING; its create operation's failure in words (a stockout: NoCapacity)."""
        while True:
            if operation is not None:
                state = self.api.operation(cluster, operation)
                if state.failure is not None:
                    error = explain(
                        state.failure, f"create node pool {path.rsplit('/', 1)[1]}", project=cluster, zone=zone
                    )
                    if isinstance(error, NoCapacity | QuotaExceeded):  # said as such, before the next zone or the end
                        self.say(error.message)
                    raise error
                if state.done:
                    operation = None
            pool = self.api.pool(path)
            if pool is None:
                raise BackendError(f"node pool {path} went away while it was being created")
            status = pool.status.name
            if status == "RUNNING" and operation is None:
                return
            if status == "ERROR" and operation is None:
                raise BackendError(f"node pool {path} is in ERROR: {pool.status_message}")
            time.sleep(min(self.poll_s, 2.0))

    def state(self, path: str) -> str | None:
        pool = self.api.pool(path)
        return None if pool is None else str(pool.status.name)

    def deletion(self, path: str) -> Deletion:
        name = path.rsplit("/", 1)[1]
        cluster, location = path.split("/nodePools/")[0], path.split("/")[3]
        cluster_name = cluster.rsplit("/", 1)[1]
        project = path.split("/")[1]

        def outcome(operation: str) -> OpResult:
            state = self.api.operation(cluster, operation)
            if state.failure is None:
                return OpResult(state.done)
            error = explain(state.failure, f"delete node pool {name}", project=project, zone=location)
            return OpResult(True, error, state.failure.transient, state.failure.code)

        return Deletion(
            what=f"node pool {name}",
            zone=cluster,
            hint=f"gcloud container node-pools delete {name} --cluster={cluster_name} --location={location} "
            f"--project={project}",
            check=f"gcloud container node-pools describe {name} --cluster={cluster_name} --location={location}",
            read_state=lambda: self.state(path),
            request=lambda: self._request_delete(path),
            outcome=outcome,
            going=("STOPPING",),
        )

    def _request_delete(self, path: str) -> str | None:
        """The delete; while GKE is still creating the pool, or another operation changes the cluster, it refuses
        (ClusterBusy): asked again then."""
        return self._when_not_busy(lambda: self.api.delete_pool(path))

    def _when_not_busy(self, request: Callable[[], T]) -> T:
        """`request`, asked again while another operation changes the cluster (said once), up to delete_timeout_s."""
        deadline = time.monotonic() + self.delete_timeout_s
        said = False
        while True:
            try:
                return request()
            except ClusterBusy as exc:
                if time.monotonic() > deadline:
                    raise
                if not said:
                    self.say(f"{exc.message}; asking again when it is done")
                    said = True
            time.sleep(min(self.poll_s, 2.0))

    def delete(self, path: str, *, announce: bool = True, wait_s: float | None = None) -> bool:
        return delete_and_confirm(
            self.deletion(path),
            say=self.say,
            poll_s=self.poll_s,
            wait_s=self.delete_timeout_s if wait_s is None else wait_s,
            retries=self.delete_retries,
            announce=announce,
        )
