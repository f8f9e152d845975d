"""The JobSet controller, played: what kubernetes-sigs/jobset's controller does for jobset.x-k8s.io/v1alpha2, as far
as a TPU job needs it, against the real API server (whose Job controller and garbage collector are real).

- Each replicatedJob becomes `replicas` Jobs named `<jobset>-<replicatedJob>-<index>`, owned by the JobSet
  (controller, blockOwnerDeletion: a foreground delete of the JobSet waits for them, and they for their pods),
  labelled and annotated as JobSet does (jobset-name, jobset-uid, replicatedjob-name, replicatedjob-replicas,
  job-index, job-global-index, global-replicas, restart-attempt), with the pod template's subdomain set to the
  JobSet's (network.subdomain, default its name) and a headless Service of that name.
- `completionMode: Indexed` is taken off the Job (1.20 would prune it silently) and recorded as the Job annotation
  tpu_emulator.kube.webhook.COMPLETION_MODE, which the pod webhook plays.
- A Job whose condition Failed is True fails the attempt: with restarts < failurePolicy.maxRestarts the JobSet is
  restarted (status.restarts + 1, every Job of the old attempt deleted in the foreground, then made anew with the
  new restart-attempt), else the JobSet gets Failed (reason FailedJobs, or ReachedMaxRestarts) and terminalState.
- Every Job of the successPolicy's targets Complete (operator All; Any: one) gives Completed (AllJobsCompleted).
- status.replicatedJobsStatus counts the current attempt's Jobs (active, ready, succeeded, failed).

Not played: suspend, startupPolicy, failurePolicy.rules, coordinator, exclusive placement, volumeClaimPolicies,
managedBy (the runner's JobSets use none of them; the manifest validator still checks them against the CRD).
Status is written through the status subresource with the resourceVersion read (a conflict is read again); any
other failed reconcile is tried again after a doubling backoff, as the controller's work queue does.
"""

from __future__ import annotations

import copy
import hashlib
import queue
import threading
from datetime import datetime, timezone
from typing import Any

from tpu_emulator.kube.watching import Follower
from tpu_emulator.kube.webhook import COMPLETION_MODE
from tpu_emulator.stderr import note

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
PREFIX = "jobset.sigs.k8s.io/"
NAME = PREFIX + "jobset-name"
UID = PREFIX + "jobset-uid"
REPLICATED_JOB = PREFIX + "replicatedjob-name"
REPLICAS = PREFIX + "replicatedjob-replicas"
JOB_INDEX = PREFIX + "job-index"
GLOBAL_INDEX = PREFIX + "job-global-index"
GLOBAL_REPLICAS = PREFIX + "global-replicas"
JOB_KEY = PREFIX + "job-key"
RESTARTS = PREFIX + "restart-attempt"
# A failed reconcile's next try: the first after MIN_BACKOFF_S, each one after twice the last, at most MAX_BACKOFF_S.
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.05, 10.0


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(obj: Any, kind: str) -> bool:
    conditions = obj.status.conditions if obj.status is not None else None
    return any(c.type == kind and c.status == "True" for c in conditions or [])


def _ready(job: Any) -> bool:
    """Every pod of the Job running or done (1.20's Job status has no `ready`)."""
    want = job.spec.parallelism or 1
    return (job.status.active or 0) + (job.status.succeeded or 0) >= want


def subdomain(js: dict[str, Any]) -> str | None:
    network = js["spec"].get("network") or {}
    if network.get("enableDNSHostnames") is False:
        return None
    return str(network.get("subdomain") or js["metadata"]["name"])


def job_name(js: dict[str, Any], rjob: dict[str, Any], index: int) -> str:
    return f"{js['metadata']['name']}-{rjob['name']}-{index}"


def build_job(js: dict[str, Any], rjob: dict[str, Any], index: int, global_index: int) -> dict[str, Any]:
    """The Job for replica `index` of `rjob`, as JobSet's constructJob makes it (for this attempt)."""
    meta = js["metadata"]
    template = copy.deepcopy(rjob["template"])
    name = job_name(js, rjob, index)
    total = sum(int(r.get("replicas", 1)) for r in _replicated(js))
    marks = {
        NAME: meta["name"],
        UID: meta["uid"],
        REPLICATED_JOB: rjob["name"],
        REPLICAS: str(rjob.get("replicas", 1)),
        JOB_INDEX: str(index),
        GLOBAL_INDEX: str(global_index),
        GLOBAL_REPLICAS: str(total),
        JOB_KEY: hashlib.sha1(f"{meta['namespace']}/{name}".encode()).hexdigest(),
        RESTARTS: str((js.get("status") or {}).get("restarts", 0)),
    }
    spec = template.get("spec") or {}
    pod = spec.setdefault("template", {})
    annotations = {**(template.get("metadata") or {}).get("annotations", {}), **marks}
    if spec.pop("completionMode", "Indexed") == "Indexed":  # JobSet's default is Indexed
        annotations[COMPLETION_MODE] = "Indexed"
    for obj in (pod,):
        obj.setdefault("metadata", {})
        obj["metadata"]["labels"] = {**(obj["metadata"].get("labels") or {}), **marks}
        obj["metadata"]["annotations"] = {**(obj["metadata"].get("annotations") or {}), **marks}
    if (sub := subdomain(js)) is not None:
        pod.setdefault("spec", {})["subdomain"] = sub
    _quantities_as_strings(pod.get("spec") or {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {**(template.get("metadata") or {}).get("labels", {}), **marks},
            "annotations": annotations,
            "ownerReferences": [_owner(js)],
        },
        "spec": spec,
    }


def _quantities_as_strings(pod_spec: dict[str, Any]) -> None:
    """The CRD takes a quantity as a number (`google.com/tpu: 4`); the typed client that sends the Job takes
    strings only (kubernetes 37 validates bodies), so numbers become the same quantity as a string."""
    for key in ("containers", "initContainers"):
        for c in pod_spec.get(key) or []:
            for part in ("limits", "requests"):
                values = (c.get("resources") or {}).get(part) or {}
                for name, value in values.items():
                    values[name] = str(value)


def _replicated(js: dict[str, Any]) -> list[dict[str, Any]]:
    """The JobSet's replicatedJobs; none where the field is missing (the API server prunes a misspelled one), as the
    controller's Go code ranges over a nil list."""
    return list(js["spec"].get("replicatedJobs") or [])


def _owner(js: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "name": js["metadata"]["name"],
        "uid": js["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


class JobSetController:
    """Follows JobSets and their Jobs (list + watch, 410 relisted) and reconciles one JobSet at a time."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api_client = api_client
        # Typed Any: the client's models are Optional everywhere; the API server fills what is read here.
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.batch: Any = client.BatchV1Api(api_client)
        self.core: Any = client.CoreV1Api(api_client)
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="jobset-controller", daemon=True)
        self.followers = [
            Follower(
                "jobsets",
                self.custom.list_cluster_custom_object,
                self._on_jobset,
                self._sync_jobsets,
                {"group": GROUP, "version": VERSION, "plural": PLURAL},
            ),
            Follower(
                "jobset-jobs",
                self.batch.list_job_for_all_namespaces,
                self._on_job,
                self._sync_jobs,
                {"label_selector": NAME},
            ),
        ]
        self.reconciles = 0
        self._before: dict[str, Any] = {}
        self._services: set[tuple[str, str]] = set()
        self.errors: list[str] = []
        self._backoff: dict[tuple[str, str], float] = {}  # a failing JobSet -> its next try's delay

    def start(self) -> None:
        self._thread.start()
        for follower in self.followers:
            follower.start()
        for follower in self.followers:
            follower.synced.wait(60)

    def stop(self) -> None:
        for follower in self.followers:
            follower.stop.set()
        self._queue.put(None)
        self._thread.join(10)
        for follower in self.followers:
            follower.close()

    def nudge(self, namespace: str, name: str) -> None:
        self._queue.put((namespace, name))

    # -- events -------------------------------------------------------------------------------------------------

    def _on_jobset(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self.nudge(obj["metadata"]["namespace"], obj["metadata"]["name"])

    def _sync_jobsets(self, items: list[dict[str, Any]]) -> None:
        for obj in items:
            self._on_jobset("ADDED", obj)

    def _on_job(self, kind: str, job: Any) -> None:
        owner = (job.metadata.labels or {}).get(NAME)
        if owner:
            self.nudge(job.metadata.namespace, owner)

    def _sync_jobs(self, items: list[Any]) -> None:
        for job in items:
            self._on_job("ADDED", job)

    def _work(self) -> None:
        from kubernetes.client.rest import ApiException

        while (key := self._queue.get()) is not None:
            try:
                self.reconcile(*key)
            except ApiException as exc:
                if exc.status == 409:  # written meanwhile: read it again
                    self.nudge(*key)
                elif exc.status != 404:  # 404: the JobSet is gone, nothing to try again
                    self._error(key, exc)
                    continue
            except Exception as exc:
                self._error(key, exc)
                continue
            self._backoff.pop(key, None)  # its run of failures, if any, is over

    def _error(self, key: tuple[str, str], exc: BaseException) -> None:
        """A reconcile that failed is tried again after a backoff that doubles up to MAX_BACKOFF_S, as the real
        controller's work queue does: a passing fault (the API server away, a connection reset) must not leave a
        JobSet without its Jobs until some other change to it comes."""
        self.errors.append(f"{key[0]}/{key[1]}: {exc!r}"[:500])
        if key not in self._backoff:  # said once for each run of failures, not at every try
            note(f"[kube] jobset controller, {key[0]}/{key[1]}: {exc!r} (tried again until it passes)"[:500])
        delay = self._backoff[key] = min(MAX_BACKOFF_S, 2 * self._backoff.get(key, MIN_BACKOFF_S / 2))
        timer = threading.Timer(delay, self.nudge, key)
        timer.daemon = True
        timer.start()

    # -- reconcile ----------------------------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> None:
        from kubernetes.client.rest import ApiException

        self.reconciles += 1
        js: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        if js["metadata"].get("deletionTimestamp"):
            return
        status = js.setdefault("status", {})
        self._before = copy.deepcopy(status)
        if any(c["type"] in ("Completed", "Failed") and c["status"] == "True" for c in status.get("conditions", [])):
            return
        restarts = int(status.get("restarts", 0))
        jobs = self.batch.list_namespaced_job(namespace, label_selector=f"{NAME}={name}").items
        self._ensure_service(js)
        current, names = [], {j.metadata.name for j in jobs}
        for job in jobs:
            if int((job.metadata.labels or {}).get(RESTARTS, "0")) < restarts:
                if job.metadata.deletion_timestamp is None:
                    self.batch.delete_namespaced_job(job.metadata.name, namespace, propagation_policy="Foreground")
            else:
                current.append(job)
        failed = [j for j in current if _condition(j, "Failed")]
        if failed:
            max_restarts = int((js["spec"].get("failurePolicy") or {}).get("maxRestarts", 0))
            if restarts < max_restarts:
                status["restarts"] = restarts + 1
                status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax", 0)) + 1
                self._write_status(js, current)
                return
            reason, message = "FailedJobs", "jobset failed due to one or more job failures"
            if max_restarts > 0:
                reason, message = "ReachedMaxRestarts", "jobset failed due to reaching max number of restarts"
            self._finish(js, current, "Failed", reason, message)
            return
        if self._succeeded(js, current):
            self._finish(js, current, "Completed", "AllJobsCompleted", "jobset completed successfully")
            return
        global_index = 0
        for rjob in _replicated(js):
            for index in range(int(rjob.get("replicas", 1))):
                if job_name(js, rjob, index) not in names:  # an old attempt's Job of this name: wait for it to go
                    try:
                        self.batch.create_namespaced_job(namespace, build_job(js, rjob, index, global_index))
                    except ApiException as exc:
                        if exc.status != 409:
                            raise
                global_index += 1
        self._write_status(js, current)

    def _succeeded(self, js: dict[str, Any], current: list[Any]) -> bool:
        policy = js["spec"].get("successPolicy") or {}
        targets = set(policy.get("targetReplicatedJobs") or [r["name"] for r in _replicated(js)])
        expected = {
            job_name(js, r, i)
            for r in _replicated(js)
            if r["name"] in targets
            for i in range(int(r.get("replicas", 1)))
        }
        done = {j.metadata.name for j in current if _condition(j, "Complete")} & expected
        if policy.get("operator", "All") == "Any":
            return bool(done)
        return bool(expected) and done == expected

    def _finish(self, js: dict[str, Any], current: list[Any], kind: str, reason: str, message: str) -> None:
        status = js["status"]
        conditions = [c for c in status.get("conditions", []) if c["type"] != kind]
        now = _now()
        conditions.append(
            {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now}
        )
        status["conditions"] = conditions
        status["terminalState"] = kind
        self._write_status(js, current)

    def _write_status(self, js: dict[str, Any], current: list[Any]) -> None:
        rows = []
        for rjob in _replicated(js):
            mine = [j for j in current if (j.metadata.labels or {}).get(REPLICATED_JOB) == rjob["name"]]
            rows.append(
                {
                    "name": rjob["name"],
                    "ready": sum(1 for j in mine if _ready(j)),
                    "succeeded": sum(1 for j in mine if _condition(j, "Complete")),
                    "failed": sum(1 for j in mine if _condition(j, "Failed")),
                    "active": sum(1 for j in mine if (j.status.active or 0) > 0),
                    "suspended": 0,
                }
            )
        status = js["status"]
        status["replicatedJobsStatus"] = rows
        status.setdefault("restarts", 0)
        if status == self._before:
            return  # written only when it changed: each write is an event that reconciles again
        meta = js["metadata"]
        self.custom.replace_namespaced_custom_object_status(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], js)

    def _ensure_service(self, js: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        sub = subdomain(js)
        if sub is None:
            return
        meta = js["metadata"]
        if (meta["uid"], sub) in self._services:
            return
        body = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": sub, "namespace": meta["namespace"], "ownerReferences": [_owner(js)]},
            "spec": {"clusterIP": "None", "selector": {NAME: meta["name"]}, "publishNotReadyAddresses": True},
        }
        try:
            self.core.create_namespaced_service(meta["namespace"], body)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self._services.add((meta["uid"], sub))
