"""Following a run's JobSet and its pods: the official client's watch (list, remember the resourceVersion, watch from
it; a 410 Gone lists again; a watch that ends, or an API server that went away, is resumed from the last
resourceVersion seen), and one verdict over every pod of the JobSet (`judge`).

What the verdict says, as the runner's MachineState and the cluster's own words:

    JobSet gone, or Completed / Failed          GONE       nothing of the job runs (its pods are done)
    JobSet being deleted                        DELETING
    a pod of the attempt followed disrupted     PREEMPTED  taken away with its node (shutdown, preemption,
      (DisruptionTarget, Evicted, Terminated),             eviction): the JobSet restarts, the job resumes
      or the JobSet restarted after one
    every pod of the attempt Running            RUNNING
    otherwise                                   CREATING   pods pending (unschedulable: the scheduler's words)

A JobSet that restarted after a failure of the job itself (no pod of that attempt was disrupted) is not a
preemption: the runner's own retries.failures decides about it. A pod whose container ended Failed without the
supervisor's exit record (killed outright: the OOM killer, SIGKILL) is kept as `ended` (its exit code and reason),
for the backend to record on its worker's behalf, as a TPU VM's bootstrap does for its container.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner.backends.base import MachineState
from runner.backends.gke.api import GROUP, PLURAL, VERSION, KubeApi

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"  # on every pod: its slice
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # on every pod of an Indexed Job: its host
DISRUPTION = "DisruptionTarget"  # the condition a kubelet or the taint manager sets before it ends a pod
# A pod's status.reason when its node took it down rather than its job: eviction, node shutdown, a lost node.
DISRUPTION_REASONS = {"Evicted", "Terminated", "Shutdown", "NodeShutdown", "NodeLost", "Preempting"}


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    phase: str
    node: str | None
    attempt: int
    disrupted: str | None = None  # why its node took it down, in the cluster's words
    unschedulable: str | None = None  # the scheduler's words
    deleting: bool = False
    place: tuple[int, int] | None = None  # (slice, host) from its JobSet and Job indexes
    exit_code: int | None = None  # a Failed pod's container: how it ended, in the kubelet's words
    exit_reason: str | None = None


@dataclass(frozen=True)
class Ended:
    """A pod's container that ended Failed, not for its node (a crash, the OOM killer): what the kubelet saw."""

    slice: int
    host: int
    exit_code: int
    reason: str


def pod_view(pod: Any) -> PodView:
    meta, status = pod.metadata, pod.status
    conditions = (status.conditions if status is not None else None) or []
    disrupted = next(
        (
            f"{c.reason or DISRUPTION}: {c.message or ''}".strip(": ")
            for c in conditions
            if c.type == DISRUPTION and c.status == "True"
        ),
        None,
    )
    reason = status.reason if status is not None else None
    if disrupted is None and reason in DISRUPTION_REASONS:
        disrupted = f"{reason}: {status.message or ''}".strip(": ")
    unschedulable = next(
        (c.message or c.reason for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"), None
    )
    annotations = meta.annotations or {}
    place = None
    with contextlib.suppress(KeyError, TypeError, ValueError):
        place = (int(annotations[JOB_INDEX]), int(annotations[COMPLETION_INDEX]))
    containers = (status.container_statuses if status is not None else None) or []
    terminated = next((c.state.terminated for c in containers if c.state and c.state.terminated), None)
    return PodView(
        name=meta.name,
        uid=meta.uid,
        phase=(status.phase if status is not None else None) or "Pending",
        node=pod.spec.node_name if pod.spec is not None else None,
        attempt=int((meta.labels or {}).get(RESTART_ATTEMPT, "0") or 0),
        disrupted=disrupted,
        unschedulable=unschedulable,
        deleting=meta.deletion_timestamp is not None,
        place=place,
        exit_code=terminated.exit_code if terminated is not None else None,
        exit_reason=(terminated.reason or terminated.message) if terminated is not None else None,
    )


def _condition(js: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (js.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def expected_pods(js: dict[str, Any]) -> int:
    total = 0
    for rjob in js.get("spec", {}).get("replicatedJobs") or []:
        spec = (rjob.get("template") or {}).get("spec") or {}
        total += int(rjob.get("replicas", 1)) * int(spec.get("parallelism") or 1)
    return total


def hosts_per_slice(js: dict[str, Any]) -> int:
    """The hosts of one slice: its Indexed Job's parallelism (every slice is alike)."""
    jobs = js.get("spec", {}).get("replicatedJobs") or [{}]
    return int(((jobs[0].get("template") or {}).get("spec") or {}).get("parallelism") or 1)


def judge(
    js: dict[str, Any] | None, pods: list[PodView], followed: int, disrupted: dict[int, str]
) -> tuple[MachineState, str]:
    """One verdict over the JobSet and every pod of it (the module's table); `followed`: the restart attempt the
    runner follows, `disrupted`: the attempts known to have lost a pod to its node, and why."""
    if js is None:
        return MachineState.GONE, "DELETED"
    if js["metadata"].get("deletionTimestamp"):
        return MachineState.DELETING, "DELETING"
    status = js.get("status") or {}
    for kind in ("Completed", "Failed"):
        if (found := _condition(js, kind)) is not None and found.get("status") == "True":
            why = f": {found.get('message')}" if kind == "Failed" and found.get("message") else ""
            return MachineState.GONE, f"{kind.upper()}{why}"
    restarts = int(status.get("restarts") or 0)
    mine = [p for p in pods if p.attempt == followed]
    lost = disrupted.get(followed) or next((p.disrupted for p in mine if p.disrupted), None)
    if lost is not None:
        return MachineState.PREEMPTED, f"POD DISRUPTED ({lost})"
    if restarts > followed:
        return MachineState.RUNNING, f"RESTARTED ({restarts}) after a failed Job"
    waiting = [p for p in mine if p.unschedulable]
    if waiting:
        return MachineState.CREATING, f"UNSCHEDULABLE (pod {waiting[0].name}: {waiting[0].unschedulable})"
    running = [p for p in mine if p.phase == "Running" and not p.deleting]
    done = [p for p in mine if p.phase == "Succeeded"]
    if mine and len(running) + len(done) >= expected_pods(js):
        return MachineState.RUNNING, "RUNNING"
    return MachineState.CREATING, "PENDING"


@dataclass
class _Stream:
    name: str
    list_fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    resource_version: str | None = None
    synced: threading.Event = field(default_factory=threading.Event)


class JobSetWatch:
    """The JobSet and its pods as the cluster last told them, kept by two watches on a thread each."""

    def __init__(self, kube: KubeApi, namespace: str, name: str, *, timeout_s: int = 60, retry_s: float = 0.5) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self.lock = threading.Lock()
        self.jobset: dict[str, Any] | None = None
        self.pods: dict[str, PodView] = {}
        self.disrupted: dict[int, str] = {}  # restart attempt -> why a pod of it was taken down with its node
        self.ended: dict[int, dict[tuple[int, int], Ended]] = {}  # restart attempt -> its Failed pods, by place
        self.on_ended: Callable[[int], None] | None = None  # called with the attempt when a pod of it ended Failed
        self.relists = 0  # lists after a 410 Gone
        self.errors = 0  # watches that broke (the API server away) and were resumed
        self._stop = threading.Event()
        self._watches: list[Any] = []
        self._threads: list[threading.Thread] = []
        self.streams = [
            _Stream(
                "jobset",
                kube.custom().list_namespaced_custom_object,
                (GROUP, VERSION, namespace, PLURAL),
                {"field_selector": f"metadata.name={name}"},
            ),
            _Stream("pods", kube.core().list_namespaced_pod, (namespace,), {"label_selector": f"{JOBSET_NAME}={name}"}),
        ]

    def start(self) -> JobSetWatch:
        for stream in self.streams:
            thread = threading.Thread(target=self._run, args=(stream,), name=f"gke-watch-{stream.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.stop()
            response = getattr(w, "_resp", None)
            if response is not None:
                with contextlib.suppress(Exception):
                    response.shutdown()  # unblocks the reading thread (urllib3 2.3+)
        for thread in self._threads:
            thread.join(5)

    @property
    def synced(self) -> bool:
        return all(s.synced.is_set() for s in self.streams)

    # -- what it holds --------------------------------------------------------------------------------------------

    def note_pods(self, pods: list[Any], *, complete: bool) -> None:
        """Pods as listed (`complete`: the whole list, so that those missing are gone) or as one event told."""
        views = [pod_view(p) for p in pods]
        with self.lock:
            if complete:
                self.pods = {}
            new = [view.attempt for view in views if self._keep(view)]
            for view in views:
                self.pods[view.uid] = view
        self._tell_ended(new)

    def _keep(self, view: PodView) -> bool:
        """What must outlive the pod's deletion (a restart deletes the attempt's pods): a disruption, a failure.
        True when it is a failure not kept before."""
        if view.disrupted:
            self.disrupted.setdefault(view.attempt, view.disrupted)
        elif view.phase == "Failed" and view.place is not None and view.exit_code is not None:
            ended = self.ended.setdefault(view.attempt, {})
            if view.place not in ended:
                ended[view.place] = Ended(*view.place, view.exit_code, view.exit_reason or "Error")
                return True
        return False

    def _tell_ended(self, attempts: list[int]) -> None:
        """`on_ended` for each attempt with a new failure, at once (off the lock): the JobSet restarts within
        seconds of a failed Job, and a job the run will not retry must not run again meanwhile."""
        if self.on_ended is not None:
            for attempt in sorted(set(attempts)):
                self.on_ended(attempt)

    def ended_in(self, attempt: int) -> list[Ended]:
        """The pods of `attempt` whose containers ended Failed, not for their nodes."""
        with self.lock:
            if attempt in self.disrupted:
                return []  # the node's doing: a preemption, not the job's failure
            return sorted((self.ended.get(attempt) or {}).values(), key=lambda e: (e.slice, e.host))

    def _note_jobset(self, kind: str, obj: dict[str, Any] | None) -> None:
        with self.lock:
            self.jobset = None if kind == "DELETED" else obj

    def view(self, followed: int) -> tuple[MachineState, str]:
        with self.lock:
            return judge(self.jobset, list(self.pods.values()), followed, dict(self.disrupted))

    def caught_up(self, resource_version: str) -> bool:
        """Whether the pods' watch has delivered everything up to `resource_version` (a list's)."""
        seen = self.streams[1].resource_version
        try:
            return seen is not None and int(seen) >= int(resource_version)
        except ValueError:
            return True  # not numbers: nothing to compare, and nothing to wait for

    # -- the watches ----------------------------------------------------------------------------------------------

    def _list(self, stream: _Stream) -> None:
        answer = stream.list_fn(*stream.args, **stream.kwargs)
        if isinstance(answer, dict):
            items, rv = list(answer.get("items") or []), str(answer["metadata"]["resourceVersion"])
            self._note_jobset("ADDED" if items else "DELETED", items[0] if items else None)
        else:
            items, rv = list(answer.items or []), str(answer.metadata.resource_version)
            self.note_pods(items, complete=True)
        stream.resource_version = rv
        stream.synced.set()

    def _event(self, stream: _Stream, kind: str, obj: Any) -> None:
        if stream.name == "jobset":
            self._note_jobset(kind, obj)
        elif kind == "DELETED":
            view = pod_view(obj)
            with self.lock:
                self.pods.pop(view.uid, None)
                new = self._keep(view)
            self._tell_ended([view.attempt] if new else [])
        else:
            self.note_pods([obj], complete=False)

    def _run(self, stream: _Stream) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        while not self._stop.is_set():
            try:
                if stream.resource_version is None:
                    self._list(stream)
                w = watch.Watch()
                self._watches.append(w)
                for event in w.stream(
                    stream.list_fn,
                    *stream.args,
                    resource_version=stream.resource_version,
                    timeout_seconds=self.timeout_s,
                    # A connection that died without a word (a control plane failed over) ends the read too.
                    _request_timeout=(10, self.timeout_s + 15),
                    **stream.kwargs,
                ):
                    if self._stop.is_set():
                        w.stop()
                        break
                    obj = event["object"]
                    rv = obj["metadata"]["resourceVersion"] if isinstance(obj, dict) else obj.metadata.resource_version
                    self._event(stream, str(event["type"]), obj)
                    stream.resource_version = str(rv)
                self._watches.remove(w)
            except ApiException as exc:
                if exc.status == 410:  # expired: what changed meanwhile is in a new list
                    self.relists += 1
                    stream.resource_version = None
                    continue
                self._pause()
            except Exception:  # the API server away (refused, reset): resumed from the last resourceVersion
                if self._stop.is_set():  # closed under it: not a break
                    break
                self._pause()

    def _pause(self) -> None:
        self.errors += 1
        self._stop.wait(self.retry_s)


def wait_caught_up(watch: JobSetWatch, resource_version: str, patience_s: float = 5.0) -> None:
    """Until the pods' watch has delivered what a list at `resource_version` showed, or patience_s."""
    deadline = time.monotonic() + patience_s
    while not watch.caught_up(resource_version) and time.monotonic() < deadline:
        time.sleep(0.05)
