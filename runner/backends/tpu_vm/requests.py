"""The requests the TPU VM backend sends, rendered from the plan: the Node and the QueuedResource, as JSON in the
Cloud TPU API's v2 shape (tpu.v2.json). What `submit --dry-run` prints is exactly what is sent
(tests/plan/golden/*.txt hold it; tests/emulator/test_runner_requests.py checks every variant against the schema).
"""

from __future__ import annotations

import json
from typing import Any

from runner import contract
from runner.backends import labels
from runner.backends.tpu_vm.target import TpuVmTarget
from runner.credentials import CLOUD_PLATFORM
from runner.launch import bootstrap
from runner.plan.planner import Plan


def target_of(plan: Plan) -> TpuVmTarget:
    """The plan's target, which the registry gave this backend to plan (runner.backends)."""
    if not isinstance(plan.cloud, TpuVmTarget):
        raise TypeError(f"plan {plan.run_id} is not a TPU VM plan (backend {plan.backend})")
    return plan.cloud


def node_request(plan: Plan, zone: str, node_id: str | None = None) -> dict[str, Any]:
    """The Node resource to create, as JSON."""
    target = target_of(plan)
    node_id = node_id or target.machine_id
    acc = plan.spec.accelerator
    scheduling: dict[str, bool] = {}
    if acc.spot:
        scheduling["spot"] = True
    if acc.reserved:
        scheduling["reserved"] = True
    service_account: dict[str, Any] = {"scope": [CLOUD_PLATFORM]}  # the resolver and the bucket need it
    if acc.service_account:
        service_account["email"] = acc.service_account
    return {
        "description": f"tpu-runner run {plan.run_id} (job {plan.spec.name})",
        "acceleratorType": target.accelerator.name,
        "runtimeVersion": target.runtime_version,
        "labels": labels.run_labels(plan.run_id, plan.spec.name, plan.deadline, plan.nonce),
        "metadata": {"startup-script": bootstrap.render(plan, zone, node_id), contract.RUN_DIR_METADATA: plan.run_dir},
        "schedulingConfig": scheduling,
        "serviceAccount": service_account,
        # As gcloud does by default: the VM reaches Artifact Registry and Cloud Storage without Cloud NAT.
        "networkConfig": {"enableExternalIps": True},
    }


def slice_prefix(node_id: str, slices: int) -> str:
    """The nodeIdPrefix of a multislice: the API names its nodes <prefix>-0 ... <prefix>-<N-1> (MultisliceParams,
    cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources), and a node id has at most 63
    characters."""
    return node_id[: 63 - len(f"-{slices - 1}")].rstrip("-")


def slice_nodes(node_id: str, slices: int) -> list[str]:
    """The node ids a queued resource holds: its one node, or each slice's."""
    if slices <= 1:
        return [node_id]
    prefix = slice_prefix(node_id, slices)
    return [f"{prefix}-{s}" for s in range(slices)]


def queued_request(plan: Plan, zone: str, node_id: str) -> dict[str, Any]:
    """The QueuedResource to create, as JSON: one node spec (the same Node a direct create sends), the capacity
    tier, and the queueing policy; with accelerator.slices > 1, multisliceParams {nodeCount, nodeIdPrefix} in place
    of the nodeId (the two are a oneof)."""
    target = target_of(plan)
    acc = plan.spec.accelerator
    node = node_request(plan, zone, node_id)
    node["schedulingConfig"] = {"reserved": True} if acc.reserved else {}
    spec: dict[str, Any] = {"parent": f"projects/{target.project}/locations/{zone}"}
    if target.slices > 1:
        spec["multisliceParams"] = {"nodeCount": target.slices, "nodeIdPrefix": slice_prefix(node_id, target.slices)}
    else:
        spec["nodeId"] = node_id
    spec["node"] = node
    body: dict[str, Any] = {
        "tpu": {"nodeSpec": [spec]},
        "queueingPolicy": {"validUntilDuration": f"{target.max_wait_s}s"},
    }
    if acc.spot:
        body["spot"] = {}
    elif not acc.reserved:
        body["guaranteed"] = {}
    return body


def shown(body: dict[str, Any], metadata: dict[str, Any]) -> str:
    """A request body for display, its startup script (in `metadata`, a part of `body`) said by its size: the
    script is shown whole after it."""
    script = metadata["startup-script"]
    metadata["startup-script"] = f"<{len(script)} bytes, shown below>"
    try:
        return json.dumps(body, indent=2)
    finally:
        metadata["startup-script"] = script


def request_text(plan: Plan) -> tuple[list[str], str]:
    """The create request as `submit --dry-run` prints it, and the startup script it carries."""
    target = target_of(plan)
    zone = target.zones[0]
    if target.provisioning == "queued":
        body = queued_request(plan, zone, target.machine_id)
        metadata = body["tpu"]["nodeSpec"][0]["node"]["metadata"]
        path = f"/v2/projects/{target.project}/locations/{zone}/queuedResources?queuedResourceId={target.machine_id}"
    else:
        body = node_request(plan, zone)
        metadata = body["metadata"]
        path = f"/v2/projects/{target.project}/locations/{zone}/nodes?nodeId={target.machine_id}"
    return [f"Request: POST {path}", shown(body, metadata)], str(metadata["startup-script"])


def machine_metadata(plan: Plan) -> tuple[str, dict[str, str], dict[str, str]]:
    """What the node will be called in a message, its metadata and its labels, as the create sends them (each
    zone's script differs only by its zone), for the platform's limits (runner.plan.limits)."""
    target = target_of(plan)
    node = node_request(plan, target.zones[0])
    return f"TPU node {target.machine_id}", dict(node["metadata"]), dict(node["labels"])
