"""The gke backend's ground for fault cases: the rehearsal's real Kubernetes API server (built once by `make kube`)
with the played JobSet controller, webhook and kubelet (tpu_emulator.kube), and the GKE API emulator whose cluster
is that API server; and the verbs and checks of the gke cases (faults/scenarios/gke.py).

One ground serves every gke case of a suite (the API server takes seconds to start); each run gets its own
namespace, its own faults and its own view of what is left (`left_of`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faults.actions import at_mid_epoch, runner_down
from faults.measure import Idle
from faults.scenario import GKE_CLUSTER as CLUSTER
from faults.scenario import GKE_LOCATION as LOCATION
from faults.scenario import PROJECT, Train

if TYPE_CHECKING:
    from faults.context import Ctx
    from faults.result import RunResult
    from faults.scenario import Check, Hook

CLUSTER_PATH = f"projects/{PROJECT}/locations/{LOCATION}/clusters/{CLUSTER}"


@dataclass
class Ground:
    """The control plane, the GKE emulator (cluster CLUSTER_PATH is that control plane) and the thread that
    restarts the API server (tpu_emulator.kube.forker). `owned`: started here, stopped with the suite."""

    kube: Any  # tpu_emulator.kube.rehearsal.KubeRehearsal
    gke: Any  # tpu_emulator.gke.emulator.GkeEmulator
    forker: Any = None  # tpu_emulator.kube.forker.Forker
    owned: bool = False
    _api: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from tpu_emulator.kube.forker import Forker

        self.forker = self.forker or Forker()

    @classmethod
    def start(cls, workdir: Path) -> Ground:
        """A ground of its own; RuntimeError naming why where the control plane is not built (`make kube`)."""
        from tpu_emulator.gke.emulator import GkeEmulator
        from tpu_emulator.kube import binaries
        from tpu_emulator.kube.rehearsal import KubeRehearsal

        found = binaries.find()
        if isinstance(found, str):
            raise RuntimeError(f"the case runs on the Kubernetes rehearsal: {found}")
        kube = KubeRehearsal(workdir, max_grace_s=30.0)
        kube.start()
        gke = GkeEmulator(create_delay_s=1.0, delete_delay_s=0.5).start()
        gke.add_cluster(PROJECT, LOCATION, CLUSTER, kube)
        return cls(kube, gke, owned=True)

    @classmethod
    def beside(cls, kube: Any, forker: Any = None) -> Ground:
        """A ground on a control plane started elsewhere (a test session's): its own GKE emulator."""
        from tpu_emulator.gke.emulator import GkeEmulator

        gke = GkeEmulator(create_delay_s=1.0, delete_delay_s=0.5).start()
        gke.add_cluster(PROJECT, LOCATION, CLUSTER, kube)
        return cls(kube, gke, forker)

    def stop(self) -> None:
        if self._api is not None:
            self._api.close()
        self.gke.stop()
        if self.owned:
            self.kube.stop()
            self.forker.stop()

    @property
    def api(self) -> Any:
        """The official client's ApiClient, as the cluster's admin."""
        if self._api is None:
            self._api = self.kube.client()
        return self._api

    def env(self) -> dict[str, str]:
        """What points the runner at this GKE (runner/backends/gke/api.py)."""
        return {"RUNNER_GKE_ENDPOINT": self.gke.endpoint, "RUNNER_GKE_TOKEN": self.kube.cluster.token}

    def new_run(self) -> str:
        """A namespace of the run's own, with the faults of earlier runs cleared."""
        from kubernetes import client

        self.gke.faults.clear()
        if self.kube.webhook is not None:
            self.kube.webhook.clear()
        name = f"faults-{uuid.uuid4().hex[:8]}"
        client.CoreV1Api(self.api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        return name

    # -- what a run has on the cluster ------------------------------------------------------------------------------

    def pods(self, namespace: str) -> list[Any]:
        from kubernetes import client

        return list(client.CoreV1Api(self.api).list_namespaced_pod(namespace).items)

    def pods_described(self, namespace: str) -> list[str]:
        """Each pod as it stands: enough to tell who made a pod that outlived its run (owner, restart attempt, when
        made) and what holds it (phase, node, deletion asked)."""
        from tpu_emulator.kube.jobset import RESTARTS

        out = []
        for pod in self.pods(namespace):
            meta = pod.metadata
            owners = ", ".join(f"{o.kind} {o.name}" for o in meta.owner_references or []) or "no owner"
            attempt = (meta.labels or {}).get(RESTARTS, "?")
            deleting = f", deletion asked {meta.deletion_timestamp:%H:%M:%S}" if meta.deletion_timestamp else ""
            out.append(
                f"pod {meta.name}: {pod.status.phase}, node {pod.spec.node_name or 'none'}, owned by {owners}, "
                f"restart attempt {attempt}, made {meta.creation_timestamp:%H:%M:%S}{deleting}"
            )
        return out

    def jobsets(self, namespace: str) -> list[dict[str, Any]]:
        from kubernetes import client

        answer = client.CustomObjectsApi(self.api).list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets"
        )
        return list(dict(answer).get("items") or [])  # type: ignore[call-overload]

    def left_of(self, namespace: str, run_id: str | None) -> list[str]:
        """What of the run the cluster still holds, as 'kind name': its node pools, JobSets and pods."""
        pools = [f"node pool {p.rsplit('/', 1)[-1]}" for p in self.gke.node_pools() if run_id and run_id in p]
        jobsets = [f"jobset {j['metadata']['name']}" for j in self.jobsets(namespace)]
        return pools + jobsets + [f"pod {p.metadata.name}" for p in self.pods(namespace)]

    def running_pod(self, namespace: str) -> Any | None:
        return next((p for p in self.pods(namespace) if p.status.phase == "Running" and p.spec.node_name), None)


def ground(ctx: Ctx) -> Ground:
    assert ctx.cluster is not None, f"{ctx.case.name} is not a gke case"
    return ctx.cluster


def pool_idle(ctx: Ctx) -> list[Idle]:
    """Each node pool the run created: the job's end (the last worker_exited of the run, or exit record where a
    killed container wrote none) to the first accepted DELETE of the pool after it. A TPU node pool bills while its
    nodes exist, busy or not."""
    cluster = ground(ctx)
    ends = [float(e["time"]) for e in ctx.events if e.get("event") == "worker_exited"]
    ends += [float(r["finished_at"]) for r in ctx.exit_records if isinstance(r.get("finished_at"), int | float)]
    if not ends or ctx.run_id is None:
        return []
    end = max(ends)
    prefix = f"/v1/{CLUSTER_PATH}/nodePools/"
    pools = sorted(
        {r.path for r in cluster.gke.requests if r.path.startswith(prefix) and ctx.run_id in r.path.rsplit("/", 1)[1]}
    )
    out = []
    for path in pools:
        deletes = [r.time for r in cluster.gke.requests if r.method == "DELETE" and r.path == path and r.status < 300]
        delete_at = next((t for t in sorted(deletes) if t >= end), None)
        out.append(Idle(path.removeprefix("/v1/"), end, delete_at, False, "worker_exited", "runner"))
    return out


# -- verbs -------------------------------------------------------------------------------------------------------


def take_node_mid_epoch(ctx: Ctx) -> None:
    """A Spot VM's preemption mid-epoch: the node under the job's pod taken away (its pod stopped with 30 s of
    grace, as GKE gives a Spot node), and made again by its pool."""

    def running_pod() -> Any:
        return ground(ctx).running_pod(ctx.namespace)

    hit = ctx.wait_for(lambda: at_mid_epoch(ctx, running_pod), timeout=ctx.case.timeout_s, interval=0.2)
    if hit is None:
        ctx.problem("never saw progress.json in the middle of an epoch with the pod Running: no preemption")
        return
    pod, progress = hit
    ground(ctx).gke.preempt_node(pod.spec.node_name, grace_s=30.0)
    ctx.preemptions.append({"time": time.time(), "at_checkpoint": ctx.manifest_epoch() or 0, "progress": progress})
    ctx.note(
        f"took node {pod.spec.node_name} away at progress.json epoch {progress['epoch']} step {progress['step']}/"
        f"{progress['steps_per_epoch']} (global step {progress['global_step']})"
    )


def kill_pod_after_first_checkpoint(ctx: Ctx) -> None:
    """The job's process killed (the OOM killer, a crash) once an epoch's checkpoint is in the bucket, before the
    last: the pod ends Failed."""
    epochs = ctx.case.job.epochs if isinstance(ctx.case.job, Train) else 1

    def found() -> Any | None:
        epoch = ctx.manifest_epoch()
        return ground(ctx).running_pod(ctx.namespace) if epoch is not None and 1 <= epoch < epochs else None

    hit = ctx.wait_for(found, timeout=ctx.case.timeout_s, interval=0.2)
    if hit is None or not ground(ctx).kube.kubelet.kill_pod(ctx.namespace, hit.metadata.name):
        ctx.problem("never saw the job's pod Running with a checkpoint in the bucket: nothing killed")
        return
    ctx.numbers["killed_at_checkpoint"] = ctx.manifest_epoch()
    ctx.note(f"SIGKILLed pod {hit.metadata.name} with checkpoint epoch {ctx.manifest_epoch()} in the bucket")


def restart_api_server_while_running(ctx: Ctx) -> None:
    """Once the job runs: every watch's resourceVersion expired (etcd compacted) and the API server restarted (a
    control-plane upgrade or repair, as GKE does them)."""
    cluster = ground(ctx)
    if ctx.wait_for(lambda: cluster.running_pod(ctx.namespace), timeout=ctx.case.timeout_s) is None:
        ctx.problem("never saw the job's pod Running: the API server was not restarted")
        return
    cluster.kube.cluster.expire_watches()
    away = cluster.forker.run(cluster.kube.cluster.restart_apiserver)
    ctx.numbers["api_server_away_s"] = round(away, 2)
    ctx.note(f"the API server was away {away:.1f}s (watches expired first)")


def expire_watches_while_running(ctx: Ctx) -> None:
    """Once the job runs, etcd compacted every half second until the job ends: a watch renewed from a
    resourceVersion seen before a compaction is 410 Gone, whenever the renewal comes. (One compaction may not do: a
    write the watch sees after it, a status the JobSet controller updates, moves the watch past it.)"""
    cluster = ground(ctx)
    if ctx.wait_for(lambda: cluster.running_pod(ctx.namespace), timeout=ctx.case.timeout_s) is None:
        ctx.problem("never saw the job's pod Running: no watch expired")
        return
    store = ctx.storage()
    deadline, revisions = time.monotonic() + ctx.case.timeout_s, []
    while time.monotonic() < deadline and not ctx.done.is_set() and not (store and store.list("exit/")):
        revisions.append(cluster.kube.cluster.expire_watches())
        time.sleep(0.5)
    ctx.note(f"etcd compacted {len(revisions)} times while the job ran (revisions {revisions[:1]}..{revisions[-1:]})")


def busy_cluster(seconds: float) -> Hook:
    """Setup: the first node pool create answered 409 ABORTED (a concurrent change), and another operation (an
    upgrade) changing the cluster: GKE refuses node pool changes meanwhile (FAILED_PRECONDITION). The upgrade ends
    `seconds` after it first refused the runner, not after the setup, so a runner slow to start still meets it."""

    def setup(ctx: Ctx) -> None:
        from tpu_emulator.faults import Fault

        gke = ground(ctx).gke
        gke.faults.add(
            Fault("http", status=409, method="POST", path=r"/nodePools$", count=1,
                  message="Operation was aborted: the cluster was changed concurrently; retry.")
        )  # fmt: skip
        ctx.numbers["busy_operation"] = gke.busy(PROJECT, LOCATION, CLUSTER, seconds, refusals=1)

    return setup


def stockout_in(zone: str) -> Hook:
    """Setup: the next node pool in `zone` fails to provision for want of capacity ([GCE_STOCKOUT])."""

    def setup(ctx: Ctx) -> None:
        from tpu_emulator.faults import Fault

        ground(ctx).gke.faults.add(Fault("stockout", zone=zone, count=1))

    return setup


def job_pod_running(ctx: Ctx) -> bool:
    return ground(ctx).running_pod(ctx.namespace) is not None


def gc_once_over(ctx: Ctx) -> None:
    """After a SIGKILLed runner: the job goes on to its end on the cluster; then `runner gc`, as its user runs it
    later, deletes the JobSet and the node pool (their run is over)."""
    store = ctx.storage()
    if store is None or ctx.wait_for(lambda: store.list("exit/"), timeout=ctx.case.timeout_s, interval=1.0) is None:
        ctx.problem("the job never recorded its end after the runner was killed")
    held = ground(ctx).left_of(ctx.namespace, ctx.run_id)
    ctx.numbers["before_gc"] = held
    swept = ctx.cli("gc", "--project", PROJECT)
    ctx.numbers["gc_exit"] = swept.returncode
    ctx.numbers["gc_output"] = (swept.stdout + swept.stderr).strip().splitlines()
    ctx.note(f"before `runner gc`: {', '.join(held) or 'nothing'}; gc exit {swept.returncode}")


def every_delete_refused(ctx: Ctx) -> None:
    """Setup: the JobSet's first delete refused by an admission webhook, and every node pool delete failing."""
    from tpu_emulator.faults import Fault
    from tpu_emulator.kube.webhook import Refusal

    cluster = ground(ctx)
    cluster.kube.webhook.refuse(Refusal("jobsets", count=1, message="refused once (tpu-emulator fault)"))
    cluster.gke.faults.add(Fault("delete_fails", count=20, message="Internal error deleting the node pool."))


def lift_then_down(ctx: Ctx) -> None:
    """After: the pool bills on; what the run said is kept, the fault lifted, and `runner down RUN` deletes it."""
    ctx.numbers["left_after_run"] = ground(ctx).left_of(ctx.namespace, ctx.run_id)
    ground(ctx).gke.faults.clear()
    runner_down(ctx)


# -- checks ------------------------------------------------------------------------------------------------------


def _said(ctx: Ctx) -> str:
    return " ".join((ctx.home.parent / "runner.out").read_text(errors="replace").split())


def said(*phrases: str) -> Check:
    """The runner's output says each phrase."""

    def check(ctx: Ctx, result: RunResult) -> None:
        text = _said(ctx)
        for phrase in phrases:
            if phrase not in text:
                result.problems.append(f"the runner never said {phrase!r}")

    return check


def pool_creates(zones: tuple[str, ...]) -> Check:
    """The run's node pool creates that GKE accepted were in these zones, in this order."""

    def check(ctx: Ctx, result: RunResult) -> None:
        creates = [
            r
            for r in ground(ctx).gke.requests
            if r.method == "POST"
            and r.path.endswith("/nodePools")
            and isinstance(r.body, dict)
            and str(ctx.run_id) in str(r.body.get("nodePool", {}).get("name"))
        ]
        accepted = [r.body["nodePool"]["locations"][0] for r in creates if r.status < 300]
        if tuple(accepted) != zones:
            result.problems.append(f"node pools created in {accepted}, expected {list(zones)}")
        ctx.numbers["refused_creates"] = [r.status for r in creates if r.status >= 300]

    return check


def restarted(attempts: int) -> Check:
    """The JobSet restarted itself into attempt `attempts`, and the runner followed it (no attempt beyond; 0 or 1:
    none at all)."""

    def check(ctx: Ctx, result: RunResult) -> None:
        text = _said(ctx)
        if attempts > 1 and f"restarted (attempt {attempts})" not in text:
            result.problems.append(f"the runner never followed the JobSet's attempt {attempts}")
        if f"restarted (attempt {max(2, attempts + 1)})" in text:
            result.problems.append(f"the JobSet restarted beyond attempt {attempts}")

    return check


def gc_swept(ctx: Ctx, result: RunResult) -> None:
    """`runner gc` deleted the killed runner's JobSet and node pool, and said so."""
    before = ctx.numbers.get("before_gc") or []
    out = " ".join(ctx.numbers.get("gc_output") or [])
    if not any(x.startswith("node pool") for x in before) or not any(x.startswith("jobset") for x in before):
        result.problems.append(f"before `runner gc` the cluster held {before}: expected the JobSet and node pool")
    for kind in ("jobset", "node pool"):
        if kind not in out:
            result.problems.append(f"`runner gc` never said it deleted a {kind}: {out[-300:]}")
    if ctx.numbers.get("gc_exit") != 0:
        result.problems.append(f"`runner gc` exit {ctx.numbers.get('gc_exit')}")


def left_and_how_to_delete(ctx: Ctx, result: RunResult) -> None:
    """Every pool delete failed: the run must say what bills and the command that deletes it, then `runner down`
    (the command it named) deletes it once the fault is lifted."""
    left = ctx.numbers.get("left_after_run") or []
    if not any(x.startswith("node pool") for x in left):
        result.problems.append(f"after the run the cluster held {left}: the node pool was expected to be left")
    text = _said(ctx)
    for phrase in ("gcloud container node-pools delete", "runner down"):
        if phrase not in text:
            result.problems.append(f"the run never said {phrase!r}")


def steps_redone(most: int) -> Check:
    """At most `most` steps trained twice over the run (the trainer's own count, `runner status`'s goodput)."""

    def check(ctx: Ctx, result: RunResult) -> None:
        lost = list(result.steps_lost or [])
        exact = [int(s.steps) for s in lost if s.exact]
        if len(exact) != len(lost):
            result.problems.append(f"steps lost not known exactly for every restart: {[str(s) for s in lost]}")
        elif sum(exact) > most:
            result.problems.append(f"{sum(exact)} step(s) trained twice, at most {most} expected")

    return check
