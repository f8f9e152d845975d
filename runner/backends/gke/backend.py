"""The gke backend: the run's job as one JobSet on a GKE cluster's TPU node pools; an existing pool, or one per slice
that the run creates and deletes. Launch is the pods' own: each runs the job's image, whose entrypoint is the
runner's supervisor, under the same run-directory contract as a TPU VM's container; the runner follows the run
directory as on every backend, and the cluster through a watch on the JobSet and its pods (watch.py).

A node taken away (a Spot VM's preemption, maintenance, an eviction) fails its pod's Job, and the JobSet restarts
every Job of the slice(s) itself (failurePolicy.maxRestarts): the runner follows that next attempt on the same
handle (next_attempt) rather than making a new JobSet, and the job resumes from its checkpoints, which the new
pods' supervisors restore. Teardown deletes the JobSet in the foreground and confirms its pods gone, and the node
pools the run created: beside the JobSet once every pod has ended (its nodes bill for nothing), else after it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.backends import describe, labels
from runner.backends.base import Backend, MachineState
from runner.backends.gke import requests
from runner.backends.gke.api import GkeApi, KubeApi
from runner.backends.gke.handles import GkeHandle, handle_of
from runner.backends.gke.pools import Pools
from runner.backends.gke.requests import RUN_DIR_ANNOTATION, target_of
from runner.backends.gke.target import GkeTarget
from runner.backends.gke.watch import JOBSET_NAME, JobSetWatch, hosts_per_slice, judge, pod_view, wait_caught_up
from runner.backends.gke.workload import Workload
from runner.errors import BackendError, PreconditionFailed, StorageError
from runner.launch import job
from runner.plan.planner import Plan
from runner.storage import open_storage
from runner.timings import Timings
from runner.watch.rundir import ExitRecord
from runner.watch.state import RunState

STATE_NOTES = {
    "PENDING": "its pods wait for the scheduler or their image",
    "DELETING": "the JobSet is being deleted",
    "COMPLETED": "every Job of the JobSet completed",
}


class GkeBackend(Backend[GkeHandle]):
    name = "gke"
    ephemeral = False
    ready_state = "RUNNING"
    stop_command = None
    stopped_states = ()

    def __init__(
        self,
        gke: GkeApi | None = None,
        *,
        say: Callable[[str], None] = print,
        timings: Timings | None = None,
        delete_timeout_s: float = 600.0,
    ) -> None:
        timings = timings or Timings()
        self.timings = timings
        self.gke = gke or GkeApi(timings)
        self.say = say
        self.delete_timeout_s = delete_timeout_s
        self.pools = Pools(self.gke, say, timings.api_poll_s, timings.api_backoff_s, delete_timeout_s)
        self.workload = Workload(say, timings.api_poll_s)
        self._lock = threading.Lock()
        self._kubes: dict[str, KubeApi] = {}
        self._watches: dict[tuple[str, str, str], JobSetWatch] = {}
        self._deleted: set[tuple[str, str, str]] = set()  # torn down here: read without a watch from then on
        self._recorded: set[tuple[str, str, str, int, int, int]] = set()  # exit records written for killed pods
        self._followed: dict[tuple[str, str, str], int] = {}  # the restart attempt the run follows, per JobSet

    # -- clusters and watches ---------------------------------------------------------------------------------------

    def kube(self, handle: GkeHandle) -> KubeApi:
        with self._lock:
            if handle.cluster not in self._kubes:
                self._kubes[handle.cluster] = KubeApi(handle.cluster, context=handle.context, gke=self.gke)
            return self._kubes[handle.cluster]

    def watch(self, handle: GkeHandle) -> JobSetWatch:
        key = (handle.cluster, handle.namespace, handle.jobset)
        with self._lock:
            found = self._watches.get(key)
        if found is None:
            kube = self.kube(handle)
            _ = kube.client  # connected here, not in the watch's threads
            renew_s = max(1, round(self.timings.cluster_watch_s))
            found = JobSetWatch(kube, handle.namespace, handle.jobset, timeout_s=renew_s)
            watched = found
            found.on_ended = lambda attempt: self._record_ended(key, watched, attempt)
            with self._lock:
                self._followed.setdefault(key, handle.restarts)
            found.start()
            with self._lock:
                self._watches[key] = found
        return found

    def _unwatch(self, handle: GkeHandle) -> None:
        with self._lock:
            found = self._watches.pop((handle.cluster, handle.namespace, handle.jobset), None)
        if found is not None:
            found.close()
            if found.relists or found.errors:  # what the cluster did to the watch, for whoever reads the run's output
                self.say(
                    f"the watch on JobSet {handle.jobset} was resumed after {found.errors} break(s) and listed again "
                    f"{found.relists} time(s) after 410 Gone (its resourceVersion had expired)"
                )

    def close(self) -> None:
        for key in list(self._watches):
            self._watches.pop(key).close()
        for kube in self._kubes.values():
            kube.close()

    # -- plan -------------------------------------------------------------------------------------------------------

    def describe(self, plan: Plan) -> list[tuple[str, str]]:
        target = target_of(plan)
        hourly = f"${target.price_per_hour * target.slices:.2f}/hour" if target.accelerator.generation.priced else None
        rows = [("cluster", target.cluster_ref), ("namespace", target.namespace)]
        if target.queue:
            rows.append(("queue", f"Kueue LocalQueue {target.queue}: the JobSet waits there for its quota"))
        rows += [
            ("accelerator", describe.shape(target, _capacity(target))),
            (
                "pods",
                f"JobSet {target.jobset}: {target.slices} x Indexed Job of {target.hosts} pod(s), each "
                f"google.com/tpu: {target.chips_per_vm} on {target.gke_accelerator} {target.topology}",
            ),
        ]
        if target.creates_pool:
            zones = " -> ".join(target.zones)
            rows.append(
                (
                    "node pools",
                    f"{', '.join(target.pool_names)}: {target.hosts} x {target.machine_type} each, created for the run "
                    f"in {zones}{'  (tried in order)' if len(target.zones) > 1 else ''}; deleted when it ends",
                )
            )
            rows.append(("idle cost", "none after the run: its node pools are deleted with it"))
        else:
            idle = f"{hourly} for {target.hosts * target.slices} VM(s)" if hourly else "the pool's VMs"
            rows.append(("node pool", f"{target.node_pool} (exists: used as it is, never created or deleted)"))
            rows.append(
                (
                    "idle cost",
                    f"a TPU node pool bills while its nodes exist, busy or not: {idle} while idle, unless its "
                    "autoscaling minimum is 0 (submit reads the pool and warns)",
                )
            )
        rows += [describe.workers_row(target), *describe.job_rows(plan)]
        if target.price_per_hour:
            rows.append(describe.cost_row(plan, target))
        rows += describe.storage_rows(target)
        rows += [
            (
                "restarts",
                f"the JobSet restarts up to {target.max_restarts} time(s) (failurePolicy.maxRestarts: "
                "retries.preemptions + retries.failures); the job resumes from its checkpoints",
            ),
            (
                "cluster deadline",
                f"each Job's activeDeadlineSeconds {target.active_deadline_s}s"
                + (f"; the node pools' maxRunDuration {target.max_run_duration_s}s" if target.creates_pool else ""),
            ),
            (
                "teardown",
                f"{plan.spec.teardown.policy}: the JobSet deleted in the foreground, its pods confirmed gone"
                + (
                    ", and its node pools (beside it once every pod has ended, else after)"
                    if target.creates_pool
                    else ""
                ),
            ),
        ]
        return rows

    def dry_run(self, plan: Plan) -> str:
        """The node pools' create requests and the exact JobSet, then what each pod runs."""
        parts = requests.request_text(plan)
        workdir = job.working_directory(plan.spec.image, process=False, cwd=Path.cwd())
        per_worker = "each pod's RUNNER_WORKER_ID: its slice's index x hosts + its completion index"
        parts.append("\n" + job.job_text(plan.spec.command, plan.env, workdir, per_worker=per_worker))
        return "\n".join(parts)

    # -- provision --------------------------------------------------------------------------------------------------

    def provision(self, plan: Plan, on_handle: Callable[[GkeHandle], None]) -> GkeHandle:
        """The node pools (when the run makes them), then the JobSet. On any failure what this call created is
        deleted before the error goes on."""
        target = target_of(plan)
        handle = GkeHandle(
            namespace=target.namespace,
            jobset=target.jobset,
            cluster=target.cluster_ref,
            project=target.project,
            context=target.context,
            pools=tuple(f"{target.cluster_path}/nodePools/{name}" for name in target.pool_names),
            nonce=plan.nonce,
        )
        on_handle(handle)
        try:
            if not target.creates_pool and target.cluster_path:
                self._warn_idle(target)
            for name in target.pool_names:
                self.pools.create(plan, name)
            kube = self.kube(handle)
            self.say(f"creating JobSet {target.jobset} in namespace {target.namespace} of {target.cluster_ref}")
            self.workload.create(kube, requests.jobset(plan), plan.nonce)
        except BaseException:
            self.teardown(handle, wait_s=self.delete_timeout_s)
            raise
        self.watch(handle)
        return handle

    def _warn_idle(self, target: GkeTarget) -> None:
        """An existing pool whose minimum keeps TPU nodes alive bills after the job: said before it runs."""
        pool = self.gke.pool(f"{target.cluster_path}/nodePools/{target.node_pool}")
        if pool is None:
            self.say(f"warning: node pool {target.node_pool} is not in {target.cluster_ref}: the pods will wait")
            return
        scaling = pool.autoscaling
        minimum = int(scaling.min_node_count or scaling.total_min_node_count) if scaling.enabled else None
        kept = pool.initial_node_count if minimum is None else minimum
        if kept:
            cost = target.accelerator.price_per_hour(spot=bool(pool.config.spot)) * kept / max(1, target.hosts)
            priced = f" (about ${cost:.2f}/hour)" if target.accelerator.generation.priced else ""
            self.say(
                f"warning: node pool {target.node_pool} keeps {kept} TPU node(s) alive after the job"
                f"{' (its autoscaling minimum)' if minimum is not None else ' (no autoscaling)'}: they bill while "
                f"idle{priced}; set its minimum to 0 to pay only while jobs run"
            )

    # -- watch ------------------------------------------------------------------------------------------------------

    def handle_from_dict(self, data: dict[str, Any]) -> GkeHandle:
        return handle_of(data)

    def observe(self, handle: GkeHandle) -> tuple[MachineState, str | None]:
        """One verdict over the JobSet and every pod (watch.judge): the JobSet as its watch last told it, its pods
        as one list reads them now (a pod the watch has not shown yet, a disruption before its pod was deleted)."""
        kube = self.kube(handle)
        if (handle.cluster, handle.namespace, handle.jobset) in self._deleted:  # asked after its teardown: no watch
            pods, _ = kube.pods(handle.namespace, f"{JOBSET_NAME}={handle.jobset}")
            return judge(kube.jobset(handle.namespace, handle.jobset), [pod_view(p) for p in pods], handle.restarts, {})
        watch = self.watch(handle)
        pods, version = kube.pods(handle.namespace, f"{JOBSET_NAME}={handle.jobset}")
        with watch.lock:
            vanished = set(watch.pods) - {p.metadata.uid for p in pods}
        watch.note_pods(pods, complete=False)
        if not watch.streams[0].synced.is_set():
            found = kube.jobset(handle.namespace, handle.jobset)
            with watch.lock:
                watch.jobset = found
        # A pod the list no longer shows may have been disrupted before it was deleted: its watch, once it has
        # delivered what the list saw, has told that (a disruption is written before the pod is stopped). Only
        # then: the list's resourceVersion is the cluster's, which other objects' writes move past any pod event.
        if vanished:
            wait_caught_up(watch, version)
        self._follow(handle)
        return watch.view(handle.restarts)

    def _record_ended(self, key: tuple[str, str, str], watch: JobSetWatch, attempt: int) -> None:
        """A pod of the followed attempt whose container ended Failed without the supervisor's exit record (killed
        outright: the OOM killer, a SIGKILL): the record written on its worker's behalf as soon as the watch shows
        it, create-only (the supervisor's own is never replaced), as a TPU VM's bootstrap does for its container.
        The run then decides as for any failure (retries.failures), and follows the JobSet's restart or ends it."""
        with self._lock:
            if self._followed.get(key) != attempt:
                return  # not the attempt the run follows: an older one's end is over, a newer one's is not yet
            # Every status read comes here: the run directory is opened only for an end not recorded yet.
            ended = [e for e in watch.ended_in(attempt) if (*key, attempt, e.slice, e.host) not in self._recorded]
        with watch.lock:
            js = watch.jobset
        run_dir = ((js or {}).get("metadata", {}).get("annotations") or {}).get(RUN_DIR_ANNOTATION)
        if not ended or js is None or not run_dir:
            return
        hosts = hosts_per_slice(js)
        store = open_storage(run_dir)
        for end in ended:
            done = (*key, attempt, end.slice, end.host)
            worker = end.slice * hosts + end.host
            why = f"its container ended {end.reason} ({end.exit_code}) before the job wrote its exit record"
            record = ExitRecord(worker, RunState.FAILED, end.exit_code, time.time(), error=why)
            try:
                store.write_if(f"exit/worker-{worker}.json", json.dumps(record.to_json()).encode(), generation=0)
                # Said too: the JobSet may have restarted already, and a later attempt's record replace this one.
                self.say(f"worker {worker}: {why}")
            except PreconditionFailed:
                pass  # the supervisor's own is there: it stands
            except StorageError as exc:
                self.say(f"could not record worker {worker}'s end ({why}): {exc.message}; trying again")
                continue
            with self._lock:
                self._recorded.add(done)

    def status(self, handle: GkeHandle) -> MachineState:
        return self.observe(handle)[0]

    def state_note(self, native: str) -> str | None:
        if native.startswith("POD DISRUPTED"):
            return "a node was taken away: the JobSet restarts, and the job resumes from its checkpoints"
        if native.startswith("UNSCHEDULABLE"):
            return "no node of the pool can take the pod yet"
        return STATE_NOTES.get(native)

    def next_attempt(self, handle: GkeHandle, *, wait_s: float) -> GkeHandle | None:
        """The JobSet restarted itself (failurePolicy): its next attempt to follow, once the last one's pods are
        gone; None when it did not restart (it ended, or reached maxRestarts)."""
        found = self.workload.next_attempt(self.kube(handle), handle, wait_s)
        if found is not None:
            self.say(f"JobSet {handle.jobset} restarted (attempt {found.restarts + 1}): following its new pods")
            self._follow(found)
        return found

    def _follow(self, handle: GkeHandle) -> None:
        """The run follows this handle's attempt from now: a failure of its pods already seen is recorded now."""
        key = (handle.cluster, handle.namespace, handle.jobset)
        with self._lock:
            self._followed[key] = handle.restarts
            watch = self._watches.get(key)
        if watch is not None:
            self._record_ended(key, watch, handle.restarts)

    def owns(self, handle: GkeHandle) -> bool:
        js = self.kube(handle).jobset(handle.namespace, handle.jobset)
        return js is None or handle.nonce is None or labels.owned(js["metadata"].get("labels") or {}, handle.nonce)

    def describe_handle(self, handle: GkeHandle) -> str:
        pools = f" and node pool(s) {', '.join(p.rsplit('/', 1)[1] for p in handle.pools)}" if handle.pools else ""
        return f"JobSet {handle.jobset}{pools} in {handle.cluster}"

    def delete_hint(self, handle: GkeHandle) -> str:
        hints = [f"kubectl delete jobset {handle.jobset} -n {handle.namespace} --cascade=foreground"]
        hints += [self.pools.deletion(p).hint for p in handle.pools]
        return "; ".join(hints)

    # -- teardown ---------------------------------------------------------------------------------------------------

    def teardown(self, handle: GkeHandle, *, grace_s: float = 30.0, wait_s: float = 300.0) -> bool:
        """The JobSet deleted in the foreground (its pods stopped within their grace) and confirmed gone with its
        pods, and every node pool the run created, confirmed gone: after the JobSet while a pod may still run, beside
        it once every pod has ended. Idempotent; an existing pool is never touched."""
        t0 = time.monotonic()
        self._deleted.add((handle.cluster, handle.namespace, handle.jobset))
        self._unwatch(handle)
        kube = self.kube(handle)

        def pools() -> bool:
            gone = True
            for path in handle.pools:
                gone = self.pools.delete(path, wait_s=max(1.0, wait_s - (time.monotonic() - t0))) and gone
            return gone

        if not handle.pools or not self._job_over(kube, handle):
            gone = self.workload.delete(kube, handle, wait_s=wait_s)
            return pools() and gone
        # Nothing of the job runs any more: its nodes bill for nothing from now, so its pools go at once, beside
        # the JobSet's deletion rather than after it.
        jobset: list[bool | BaseException] = []

        def delete_jobset() -> None:
            try:
                jobset.append(self.workload.delete(kube, handle, wait_s=wait_s))
            except BaseException as exc:  # said by the caller, after the pools' deletion
                jobset.append(exc)

        beside = threading.Thread(target=delete_jobset, name="gke-jobset-delete", daemon=True)
        beside.start()
        try:
            gone = pools()
        finally:
            beside.join()
        if isinstance(jobset[0], BaseException):
            raise jobset[0]
        return jobset[0] and gone

    def _job_over(self, kube: KubeApi, handle: GkeHandle) -> bool:
        """Every pod of the JobSet has ended (or there is none): nothing the pools' deletion could cut short."""
        try:
            pods, _ = kube.pods(handle.namespace, f"{JOBSET_NAME}={handle.jobset}")
        except BackendError:
            return False  # unknown: the JobSet first, its pods' grace kept
        return all(pod_view(p).phase in ("Succeeded", "Failed") for p in pods)


def _capacity(target: GkeTarget) -> str:
    if not target.creates_pool:
        return f"node pool {target.node_pool}'s own capacity"
    if target.spot:
        return "Spot"
    if target.flex_start:
        return "flex-start"
    if target.reserved:
        return f"reservation {target.reservation}" if target.reservation else "any matching reservation"
    return "on-demand"
