"""The gke backend's faults, on the Kubernetes rehearsal (a real API server, etcd, scheduler and garbage collector;
the JobSet controller, GKE's TPU webhook and the kubelet played: faults/cluster.py) with node pools from the GKE API
emulator: a node taken away mid-epoch, a pod killed, the API server restarted mid-run, a 409 while another operation
changes the cluster, a watch whose resourceVersion expires, a stockout in the first zone, the runner SIGKILLed (then
`runner gc`), and deletes that fail.

Every case creates its node pool (a v5p-8: one ct5p-hightpu-4t node) in a namespace of its own, and is held to what
every case is: the state and exit code expected, nothing of the run left on the cluster (node pools, JobSet, pods),
and the node pool deleted within the idle goal of the job's end."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from faults import actions, checks
from faults import cluster as gke
from faults.scenario import Command, Scenario, Train

TYPE = "v5p-8"
ZONES = ("us-central1-a", "us-central1-b")  # v5p's zones in the runner's catalog


def _ticks(n: int) -> Command:
    """Prints every second for `n` seconds: a job that outlasts what is done to the cluster under it."""
    return Command(
        ("python", "-c", f"import time\nfor i in range({n}):\n    print('tick', i, flush=True); time.sleep(1)")
    )


def _case(*args: Any, **kwargs: Any) -> Scenario:
    """A gke case: a v5p-8 node pool the run creates, in ZONES."""
    return replace(Scenario(*args, **kwargs), accelerator=TYPE, backend="gke", zones=ZONES)


# Waits for the job to be seen started, then SIGKILLs its supervisor (the pod's main process): the container ends 137.
KILL_SUPERVISOR = "import os, signal, time\ntime.sleep(3)\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(60)"

# Epochs of 3120 steps at batch 16 (several seconds each, longer than a sync interval), as the TPU VM's
# preempt-mid-epoch: the bucket's progress.json, up to a sync behind, still shows the epoch the trainer is in.
MID_EPOCH = Train(epochs=3, examples=49920, batch_size=16, test_examples=10000)

CASES = (
    _case(
        "gke-node-taken-mid-epoch",
        "GKE: a Spot node taken away mid-epoch (v5p-8 pool)",
        "succeeded",
        0,
        job=MID_EPOCH,
        spot=True,
        during=(gke.take_node_mid_epoch,),
        checks=(checks.preemptions(1), gke.restarted(2), gke.steps_redone(0), checks.lost_work),
    ),
    # The job's process killed once a checkpoint is in the bucket: a failure, not a preemption (retries.failures),
    # which the JobSet restarts too; the job resumes from its newest checkpoint.
    _case(
        "gke-pod-killed",
        "GKE: the job's pod killed (SIGKILL) after its first checkpoint",
        "succeeded",
        0,
        job=MID_EPOCH,
        retries={"failures": 1},
        during=(gke.kill_pod_after_first_checkpoint,),
        checks=(gke.restarted(2), gke.said("the job resumes from its newest checkpoint")),
    ),
    # The same without retries.failures (the default, 0), at a command's size: the container killed outright (its
    # supervisor SIGKILLed: no exit record of its own). The runner records the end from the pod's status and ends
    # the run failed, deleting the JobSet: the JobSet's own restarts must not run the job again behind its back.
    _case(
        "gke-container-killed",
        "GKE: the job's container killed outright, no retries.failures",
        "failed",
        6,
        job=Command(("python", "-c", KILL_SUPERVISOR)),
        checks=(
            gke.said("worker 0: its container ended", "(137) before the job wrote its exit record"),
            gke.restarted(0),
        ),
        fast=True,
    ),
    _case(
        "gke-api-server-restart",
        "GKE: the API server restarted mid-run (watches expired first)",
        "succeeded",
        0,
        job=_ticks(12),
        during=(gke.restart_api_server_while_running,),
        checks=(gke.said("tick 11", "was resumed after"),),
        fast=True,
    ),
    # The first create is answered 409 ABORTED (a concurrent change); then, while a control-plane upgrade runs,
    # GKE refuses node pool changes (FAILED_PRECONDITION): the runner asks again, in the same zone, once it is done.
    _case(
        "gke-409-cluster-busy",
        "GKE: 409 on the node pool create, then the cluster busy with an upgrade",
        "succeeded",
        0,
        setup=(gke.busy_cluster(4.0),),
        checks=(gke.pool_creates(ZONES[:1]), gke.said("incompatible operation", "asking again when it is done")),
        fast=True,
    ),
    # The watch is renewed every 2 s (cluster_watch_s); etcd compacted under it while the job runs: a renewal is
    # 410 Gone and the watch lists again.
    _case(
        "gke-watch-expired",
        "GKE: the watch's resourceVersion expires (410 Gone) mid-run",
        "succeeded",
        0,
        job=_ticks(12),
        timings="cluster_watch_s=2",
        during=(gke.expire_watches_while_running,),
        checks=(gke.said("tick 11", "after 410 Gone"),),
        fast=True,
    ),
    _case(
        "gke-stockout-first-zone",
        "GKE: node pool stockout in the first zone",
        "succeeded",
        0,
        setup=(gke.stockout_in(ZONES[0]),),
        checks=(gke.pool_creates(ZONES), gke.said("GCE_STOCKOUT", f"{ZONES[0]}: no capacity for {TYPE}")),
        fast=True,
    ),
    # The runner dies while the job runs; the job goes on to its end on the cluster, then `runner gc` deletes the
    # JobSet and the node pool (their run is over: its exit record is in the run directory).
    _case(
        "gke-runner-kill",
        "GKE: runner SIGKILL while the job runs, then `runner gc`",
        "succeeded",
        -9,
        job=_ticks(8),
        during=(actions.kill_runner_after("the job's pod Running", gke.job_pod_running),),
        after=(gke.gc_once_over,),
        checks=(gke.gc_swept,),
        idle_goal=False,  # the pool bills until `runner gc`: a person's time, reported
        fast=True,
    ),
    # The JobSet's first delete is refused (an admission webhook) and every node pool delete fails: the run says
    # what bills and how to delete it, and `runner down` deletes it once the fault is lifted.
    _case(
        "gke-delete-fails",
        "GKE: the JobSet's delete refused once, every node pool delete failing",
        "succeeded",
        5,
        setup=(gke.every_delete_refused,),
        after=(gke.lift_then_down,),
        checks=(gke.left_and_how_to_delete, gke.said("refused once", "asking again")),
        idle_goal=False,  # the pool bills until `runner down` once the refusal is lifted: a person's time
        fast=True,
    ),
)
