"""What the gke backend sends, rendered from the plan: the run's JobSet (jobset.x-k8s.io/v1alpha2) and, for a node
pool the run creates, GKE's CreateNodePool request body (container.v1's REST JSON). `submit --dry-run` prints
exactly these (tests/backends/gke: every JobSet checked against the JobSet CRD's schema and the API server's
OpenAPI with unknown fields refused; every node pool body against container.v1.json).

The JobSet: one replicated Job per slice (replicas = slices), each an Indexed Job of one pod per host
(parallelism = completions = hosts) on the slice's TPU nodes (cloud.google.com/gke-tpu-accelerator and
gke-tpu-topology, and the run's node pool), asking `google.com/tpu` for the whole VM and tolerating the TPU taint.
Each pod runs the job's image with its supervisor (the image's entrypoint) under the run-directory contract: the
plan's environment, and its worker id computed in the pod from what Kubernetes gives it on every attempt (its
completion index, its slice's index), never copied from an earlier attempt. GKE's TPU webhook adds TPU_WORKER_ID
and TPU_WORKER_HOSTNAMES, which JAX reads. A Job that fails restarts the JobSet (failurePolicy.maxRestarts); each
Job's activeDeadlineSeconds is the run's max_runtime, the deadline the cluster keeps if the runner dies.
"""

from __future__ import annotations

import json
from typing import Any

from runner import contract
from runner.backends import labels
from runner.backends.gke.target import GRACE_S, GkeTarget
from runner.plan.planner import Plan

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "slice"
CONTAINER = "job"
RUN_DIR_ANNOTATION = "tpu-runner.dev/run-dir"  # where `runner gc` reads whether the run still needs its JobSet
ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY = "cloud.google.com/gke-tpu-topology"
NODE_POOL = "cloud.google.com/gke-nodepool"
TPU_RESOURCE = "google.com/tpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"  # the pod's slice, on every pod JobSet makes
EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"  # one slice per node pool
SLICE_ENV = "RUNNER_SLICE_INDEX"
RESERVE_S = 5  # of the pod's grace: what the supervisor keeps for its exit record and last upload


def target_of(plan: Plan) -> GkeTarget:
    if not isinstance(plan.cloud, GkeTarget):
        raise TypeError(f"plan {plan.run_id} is not a GKE plan (backend {plan.backend})")
    return plan.cloud


def run_labels(plan: Plan) -> dict[str, str]:
    return labels.run_labels(plan.run_id, plan.spec.name, plan.deadline, plan.nonce)


def worker_script(hosts: int) -> str:
    """The pod's command: its global worker id from its slice and completion index, then the supervisor."""
    return (
        f'export {contract.WORKER_ID}="$(( ${{{SLICE_ENV}:-0}} * {hosts} + ${{JOB_COMPLETION_INDEX:-0}} ))"; '
        "exec python -m runner.worker"
    )


def _literal(value: str) -> str:
    """A value Kubernetes must not expand: `$(NAME)` in an env value is a reference, `$$(` its escape."""
    return value.replace("$(", "$$(")


def pod_env(plan: Plan, target: GkeTarget) -> list[dict[str, Any]]:
    env = {k: v for k, v in plan.env.items() if k != contract.WORKER_ID}
    env[contract.GRACE_S] = str(GRACE_S - RESERVE_S)
    if target.slices > 1:
        env[contract.HOSTS_PER_SLICE] = str(target.hosts)
        env["MEGASCALE_NUM_SLICES"] = str(target.slices)
        env["MEGASCALE_COORDINATOR_ADDRESS"] = f"{target.jobset}-{REPLICATED_JOB}-0-0.{target.jobset}"
    out: list[dict[str, Any]] = [{"name": k, "value": _literal(v)} for k, v in sorted(env.items())]
    index = {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX}']"}}
    out.append({"name": SLICE_ENV, "valueFrom": index})
    if target.slices > 1:
        out.append({"name": "MEGASCALE_SLICE_ID", "valueFrom": index})
    return out


def node_selector(plan: Plan, target: GkeTarget) -> dict[str, str]:
    selector = {ACCELERATOR: target.gke_accelerator, TOPOLOGY: target.topology}
    if target.node_pool is not None:
        selector[NODE_POOL] = target.node_pool
    else:
        selector[labels.RUN] = plan.run_id  # the node label of the run's own pools
    return selector


def jobset(plan: Plan) -> dict[str, Any]:
    """The run's JobSet, as it is sent."""
    target = target_of(plan)
    marks = run_labels(plan)
    meta_labels = {**marks, **({QUEUE_LABEL: target.queue} if target.queue else {})}
    annotations = {RUN_DIR_ANNOTATION: plan.run_dir}
    if target.slices > 1:
        annotations[EXCLUSIVE] = NODE_POOL
    pod = {
        "metadata": {"labels": dict(marks)},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": GRACE_S,
            "nodeSelector": node_selector(plan, target),
            "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": CONTAINER,
                    "image": plan.spec.image,
                    "command": ["/bin/sh", "-c", worker_script(target.hosts)],
                    "env": pod_env(plan, target),
                    "resources": {
                        "requests": {TPU_RESOURCE: str(target.chips_per_vm)},
                        "limits": {TPU_RESOURCE: str(target.chips_per_vm)},
                    },
                }
            ],
        },
    }
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {
            "name": target.jobset,
            "namespace": target.namespace,
            "labels": meta_labels,
            "annotations": annotations,
        },
        "spec": {
            "failurePolicy": {"maxRestarts": target.max_restarts},
            "successPolicy": {"operator": "All"},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": target.slices,
                    "template": {
                        "metadata": {"labels": dict(marks)},
                        "spec": {
                            "parallelism": target.hosts,
                            "completions": target.hosts,
                            "backoffLimit": 0,
                            "completionMode": "Indexed",
                            "activeDeadlineSeconds": target.active_deadline_s,
                            "template": pod,
                        },
                    },
                }
            ],
        },
    }


def node_pool(plan: Plan, name: str, zone: str) -> dict[str, Any]:
    """A slice's node pool (container.v1 NodePool, REST JSON): its VMs labelled for the run's pods to select them,
    the run's labels on the VMs themselves (resourceLabels), and GKE's own deadline on the nodes."""
    target = target_of(plan)
    config: dict[str, Any] = {
        "machineType": target.machine_type,
        "labels": {labels.RUN: plan.run_id},
        "resourceLabels": run_labels(plan),
        "maxRunDuration": f"{target.max_run_duration_s}s",
    }
    if target.spot:
        config["spot"] = True
    if target.flex_start:
        config["flexStart"] = True
    if target.reserved:
        config["reservationAffinity"] = (
            {
                "consumeReservationType": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": [target.reservation],
            }
            if target.reservation
            else {"consumeReservationType": "ANY_RESERVATION"}
        )
    placement: dict[str, Any] = {"tpuTopology": target.topology}
    if target.workload_policy:
        placement["policyName"] = target.workload_policy
    return {
        "name": name,
        "initialNodeCount": target.hosts,
        "locations": [zone],
        "config": config,
        "placementPolicy": placement,
        "management": {"autoRepair": True, "autoUpgrade": False},
    }


def machine_metadata(plan: Plan) -> tuple[str, dict[str, str], dict[str, str]]:
    """What the platform's limits are checked on: the node pools' labels (a JobSet has no metadata items)."""
    return f"node pool of run {plan.run_id}", {}, run_labels(plan)


def request_text(plan: Plan) -> list[str]:
    """The dry run's requests: each node pool's create (in the first zone), then the JobSet, as YAML."""
    import yaml

    target = target_of(plan)
    parts = []
    for name in target.pool_names:
        body = {"nodePool": node_pool(plan, name, target.zones[0])}
        parts += [
            f"POST https://container.googleapis.com/v1/{target.cluster_path}/nodePools"
            + ("  (the next zone on a stockout: " + ", ".join(target.zones[1:]) + ")" if len(target.zones) > 1 else ""),
            json.dumps(body, indent=2),
        ]
    where = target.cluster_ref
    parts += [
        f"\nJobSet (created in namespace {target.namespace} of {where}; deleted with propagationPolicy Foreground):",
        yaml.safe_dump(jobset(plan), sort_keys=False, width=120).rstrip(),
    ]
    return parts
