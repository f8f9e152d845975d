"""The requests the compute-engine backend sends, rendered from the plan as Compute Engine's REST JSON
(compute.v1.json): an Instance for a single-host TPU VM; for a multi-host slice a ResourcePolicy (workload policy:
HIGH_THROUGHPUT on the slice's acceleratorTopology), an InstanceTemplate, an InstanceGroupManager that names both,
and for flex-start an InstanceGroupManagerResizeRequest that asks for all of its VMs at once. What `submit
--dry-run` prints is exactly what is sent (tests/backends/compute_engine/test_requests.py checks every variant
against the schema).

Compute Engine's instance templates, groups, resource policies and resize requests have no `labels` field: the
run's labels go into their description (runner.backends.labels.in_description); the VMs carry them as labels.
"""

from __future__ import annotations

import json
from typing import Any

from runner import contract
from runner.backends import labels
from runner.backends.compute_engine.target import ComputeTarget
from runner.credentials import CLOUD_PLATFORM
from runner.launch import bootstrap
from runner.plan.planner import Plan

API_ROOT = "/compute/v1"
MAX_NAME = 63  # instances, templates, groups, policies: [a-z]([-a-z0-9]{0,61}[a-z0-9])?
MIG_SUFFIX = 5  # a group's VMs are named <base instance name>-xxxx
# In a template's or workload policy's description beside the run's labels: the group it was made for, and the
# group's zone (how `runner gc` finds it from that zone, and judges it with its group).
GROUP = "tpu-runner-group"
GROUP_ZONE = "tpu-runner-zone"


def target_of(plan: Plan) -> ComputeTarget:
    """The plan's target, which the registry gave this backend to plan (runner.backends)."""
    if not isinstance(plan.cloud, ComputeTarget):
        raise TypeError(f"plan {plan.run_id} is not a Compute Engine plan (backend {plan.backend})")
    return plan.cloud


def derived(name: str, suffix: str, limit: int = MAX_NAME) -> str:
    """`name`-`suffix` within `limit` characters (the name cut, never the suffix)."""
    return f"{name[: limit - len(suffix) - 1].rstrip('-')}-{suffix}"


def names(group: str) -> tuple[str, str, str]:
    """(template, workload policy, flex-start resize request) of a slice's group."""
    return derived(group, "tpl"), derived(group, "policy"), derived(group, "flex")


def base_instance_name(group: str) -> str:
    return group[: MAX_NAME - MIG_SUFFIX].rstrip("-")


def _description(plan: Plan, what: str) -> str:
    return f"tpu-runner run {plan.run_id} (job {plan.spec.name}): {what}"


def scheduling(target: ComputeTarget) -> dict[str, Any]:
    """Scheduling: the provisioning model, no live migration (TPU VMs have none), and the cloud's own deadline."""
    body: dict[str, Any] = {"provisioningModel": target.provisioning_model, "onHostMaintenance": "TERMINATE"}
    if target.provisioning_model == "SPOT":
        body["automaticRestart"] = False  # a preempted Spot VM is recreated by the runner, not restarted
    body["instanceTerminationAction"] = target.termination_action
    body["maxRunDuration"] = {"seconds": str(target.max_run_duration_s)}
    return body


def reservation_affinity(target: ComputeTarget) -> dict[str, Any] | None:
    if target.reservation:
        return {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [target.reservation],
        }
    if target.reserved:
        return {"consumeReservationType": "ANY_RESERVATION"}
    return None


def properties(plan: Plan, zone: str, machine: str, *, template: bool) -> dict[str, Any]:
    """What an instance and a template's instances share: machine type, boot disk, network, scheduling, the startup
    script as metadata, labels and service account. An instance names its machine and disk types by zonal URL, a
    template by name."""
    target = target_of(plan)
    acc = plan.spec.accelerator
    disk_type = target.disk_type if template else f"zones/{zone}/diskTypes/{target.disk_type}"
    body: dict[str, Any] = {
        "machineType": target.machine_type if template else f"zones/{zone}/machineTypes/{target.machine_type}",
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {
                    "sourceImage": target.image,
                    "diskSizeGb": str(target.disk_size_gb),
                    "diskType": disk_type,
                },
            }
        ],
        # An external address, as `gcloud compute instances create` gives by default: the VM reaches Artifact
        # Registry and Cloud Storage without Cloud NAT.
        "networkInterfaces": [
            {
                "network": "global/networks/default",
                "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}],
            }
        ],
        "scheduling": scheduling(target),
        "metadata": {
            "items": [
                {"key": "startup-script", "value": bootstrap.render(plan, zone, machine)},
                {"key": contract.RUN_DIR_METADATA, "value": plan.run_dir},
            ]
        },
        "labels": labels.run_labels(plan.run_id, plan.spec.name, plan.deadline, plan.nonce),
        # The bucket, Artifact Registry and the VM's own self-delete need the cloud-platform scope.
        "serviceAccounts": [{"email": acc.service_account or "default", "scopes": [CLOUD_PLATFORM]}],
    }
    if (affinity := reservation_affinity(target)) is not None:
        body["reservationAffinity"] = affinity
    return body


def instance_request(plan: Plan, zone: str, name: str) -> dict[str, Any]:
    """The Instance of a single-host TPU VM."""
    return {
        "name": name,
        "description": _description(plan, "its TPU VM"),
        **properties(plan, zone, name, template=False),
    }


def _follower_labels(plan: Plan, zone: str, group: str) -> dict[str, str]:
    return {**labels.run_labels(plan.run_id, plan.spec.name, plan.deadline, plan.nonce), GROUP: group, GROUP_ZONE: zone}


def policy_request(plan: Plan, zone: str, group: str) -> dict[str, Any]:
    """The workload policy of a slice: its VMs placed as one slice of the topology (required for TPU7x; a compact
    placement policy is refused: "Use workload policy instead")."""
    target = target_of(plan)
    assert target.topology is not None
    marks = _follower_labels(plan, zone, group)
    return {
        "name": names(group)[1],
        "description": labels.in_description(_description(plan, f"the workload policy of group {group}"), marks),
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": target.topology},
    }


def template_request(plan: Plan, zone: str, group: str) -> dict[str, Any]:
    marks = _follower_labels(plan, zone, group)
    return {
        "name": names(group)[0],
        "description": labels.in_description(_description(plan, f"the VMs of group {group}"), marks),
        "properties": properties(plan, zone, group, template=True),
    }


def group_request(plan: Plan, zone: str, group: str) -> dict[str, Any]:
    """The managed instance group of a slice: all of its VMs at once (the workload policy makes it a gang), or,
    flex-start, none until its resize request is granted."""
    target = target_of(plan)
    template, policy, _ = names(group)
    region = zone.rsplit("-", 1)[0]
    run_labels = labels.run_labels(plan.run_id, plan.spec.name, plan.deadline, plan.nonce)
    return {
        "name": group,
        "description": labels.in_description(_description(plan, f"its {target.accelerator.name} slice"), run_labels),
        "baseInstanceName": base_instance_name(group),
        "instanceTemplate": f"projects/{target.project}/global/instanceTemplates/{template}",
        "targetSize": 0 if target.provisioning_model == "FLEX_START" else target.hosts,
        "resourcePolicies": {"workloadPolicy": f"projects/{target.project}/regions/{region}/resourcePolicies/{policy}"},
    }


def resize_request(plan: Plan, group: str) -> dict[str, Any]:
    """Flex-start: every VM of the slice at once, for the run's duration (10 minutes to 7 days)."""
    target = target_of(plan)
    run_labels = labels.run_labels(plan.run_id, plan.spec.name, plan.deadline, plan.nonce)
    return {
        "name": names(group)[2],
        "description": labels.in_description(_description(plan, f"the VMs of group {group}"), run_labels),
        "resizeBy": target.hosts,
        "requestedRunDuration": {"seconds": str(target.max_run_duration_s)},
    }


def slice_requests(plan: Plan, zone: str, group: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(what, path, body) of each request that creates a slice, in the order they are sent."""
    target = target_of(plan)
    project, region = target.project, zone.rsplit("-", 1)[0]
    out = [
        (
            "policy",
            f"{API_ROOT}/projects/{project}/regions/{region}/resourcePolicies",
            policy_request(plan, zone, group),
        ),
        ("template", f"{API_ROOT}/projects/{project}/global/instanceTemplates", template_request(plan, zone, group)),
        (
            "group",
            f"{API_ROOT}/projects/{project}/zones/{zone}/instanceGroupManagers",
            group_request(plan, zone, group),
        ),
    ]
    if target.provisioning_model == "FLEX_START":
        path = f"{API_ROOT}/projects/{project}/zones/{zone}/instanceGroupManagers/{group}/resizeRequests"
        out.append(("resize request", path, resize_request(plan, group)))
    return out


def _shown(body: dict[str, Any]) -> tuple[str, str]:
    """A body for display with its startup script said by its size (shown whole after it), and the script."""
    shown = json.loads(json.dumps(body))
    items = (shown.get("properties") or shown).get("metadata", {}).get("items", [])
    script = ""
    for item in items:
        if item["key"] == "startup-script":
            script = item["value"]
            item["value"] = f"<{len(script)} bytes, shown below>"
    return json.dumps(shown, indent=2), script


def request_text(plan: Plan) -> tuple[list[str], str]:
    """The create requests as `submit --dry-run` prints them, and the startup script they carry."""
    target = target_of(plan)
    zone, name = target.zones[0], target.machine_id
    if target.topology is None:
        text, script = _shown(instance_request(plan, zone, name))
        return [f"Request: POST {API_ROOT}/projects/{target.project}/zones/{zone}/instances", text], script
    parts: list[str] = []
    script = ""
    for _, path, body in slice_requests(plan, zone, name):
        text, found = _shown(body)
        script = script or found
        parts += [f"Request: POST {path}", text]
    return parts, script


def machine_metadata(plan: Plan) -> tuple[str, dict[str, str], dict[str, str]]:
    """What the machine will be called in a message, its metadata and its labels (an instance's, or the slice's
    template's, which every VM of the group gets), for the platform's limits (runner.plan.limits)."""
    target = target_of(plan)
    zone, name = target.zones[0], target.machine_id
    slice_ = target.topology is not None
    body = properties(plan, zone, name, template=slice_)
    items = {item["key"]: item["value"] for item in body["metadata"]["items"]}
    return (f"instance template {names(name)[0]}" if slice_ else f"instance {name}"), items, dict(body["labels"])
