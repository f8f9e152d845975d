"""Every kind of answer both emulators give is one the real APIs could give: checked against Google's discovery
documents (tpu.v2.json, compute.v1.json).

Each emulator checks each successful answer against its method's response schema, and answers 500 instead of one
that breaks it (tpu_emulator.server.SchemaCheck). So a scenario that makes every route answer, including the
answers that carry failures (failed operations, a FAILED queued resource or resize request, a group's errors, a
preemption's system event), and finds no 500 and every route checked, shows every shape valid. Requests are checked
on the way in too: every recorded request names the method it was checked against.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from pathlib import Path

from google.api_core import exceptions as gexc
from google.cloud import compute_v1, tpu_v2

from tests.emulator.api import FAST, PARENT, RUNTIME, tpu_client
from tests.emulator.api import ZONE as TPU_ZONE
from tests.emulator.compute import (
    PROJECT,
    REGION,
    ZONE,
    Clients,
    instance,
    properties,
    quick_emulator,
    scheduling,
    spot,
)
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator


def checked_methods(emulator: TpuEmulator, api_prefix: str) -> dict[str, set[int]]:
    """Method id -> the statuses its requests were answered with, over every request to one API."""
    out: dict[str, set[int]] = {}
    for r in emulator.requests:
        if r.path.startswith(api_prefix):
            assert r.checked is not None, f"{r.method} {r.path} was not checked against the discovery document"
            assert r.status != 500, f"{r.method} {r.path}: the emulator's answer broke the schema"
            out.setdefault(r.checked.split()[-1], set()).add(r.status)
    return out


def tpu_scenario(emulator: TpuEmulator) -> None:
    client = tpu_client(emulator)
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version=RUNTIME, labels={"a": "b"}, metadata={"k": "v"})
    client.create_node(parent=PARENT, node_id="n1", node=node).result(polling=FAST)
    client.get_node(name=f"{PARENT}/nodes/n1")
    list(client.list_nodes(parent=PARENT))
    client.list_operations(request={"name": PARENT})
    emulator.stockout(TPU_ZONE, count=1)
    failed = client.create_node(parent=PARENT, node_id="n2", node=node)
    with contextlib.suppress(gexc.GoogleAPICallError):  # a failed operation is an answer too: read again below
        failed.result(polling=FAST)
    client.get_operation(request={"name": failed.operation.name})
    client.delete_operation(request={"name": failed.operation.name})
    emulator.preempt("n1")
    client.get_node(name=f"{PARENT}/nodes/n1")  # PREEMPTED
    client.delete_node(name=f"{PARENT}/nodes/n1").result(polling=FAST)
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id="qn", node=node)
    queued = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), spot={})
    client.create_queued_resource(parent=PARENT, queued_resource_id="q1", queued_resource=queued).result(polling=FAST)
    # The fault goes to whichever waiting request is tried next: q1 is tried a moment after its create is done, and
    # must have been before the fault is there for q2.
    q1 = f"{PARENT}/queuedResources/q1"
    wait_for(lambda: client.get_queued_resource(name=q1).state.state.name in ("PROVISIONING", "ACTIVE"), "q1's try")
    emulator.queued_fails(TPU_ZONE, count=1, status="RESOURCE_EXHAUSTED")
    spec2 = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id="qn2", node=node)
    queued2 = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec2]), guaranteed={})
    client.create_queued_resource(parent=PARENT, queued_resource_id="q2", queued_resource=queued2).result(polling=FAST)
    q2 = f"{PARENT}/queuedResources/q2"
    wait_for(lambda: client.get_queued_resource(name=q2).state.state.name == "FAILED", "q2 FAILED")
    list(client.list_queued_resources(parent=PARENT))
    client.delete_queued_resource(request={"name": q1, "force": True}).result(polling=FAST)
    list(client.list_accelerator_types(parent=PARENT))
    client.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v4-8")
    client.get_location(request={"name": PARENT})
    client.list_locations(request={"name": f"projects/{PROJECT}"})


def test_every_tpu_route_answers_in_tpu_v2_shapes(tmp_path: Path) -> None:
    with TpuEmulator(workdir=tmp_path / "emu", create_delay_s=0.2, delete_delay_s=0.1, vm_grace_s=0.5) as emulator:
        tpu_scenario(emulator)
        answered = checked_methods(emulator, "/v2/projects/")
        routes = {method_id for *_, method_id in emulator.api.routes}
    assert routes == {m for m, statuses in answered.items() if any(200 <= s < 300 for s in statuses)}


def compute_scenario(emulator: TpuEmulator) -> None:
    gce = Clients(emulator.endpoint)
    where = {"project": PROJECT, "zone": ZONE}
    gce.wait(gce.instances.insert(**where, instance_resource=instance("vm", sched=spot())))
    gce.instances.get(**where, instance="vm")
    list(gce.instances.list(**where))
    emulator.compute.preempt("vm")
    wait_for(lambda: gce.instances.get(**where, instance="vm").status == "TERMINATED")
    ops = list(gce.zone_ops.list(**where))
    gce.zone_ops.get(**where, operation=ops[0].name)
    gce.wait(gce.instances.stop(**where, instance="vm"))
    gce.wait(gce.instances.delete(**where, instance="vm"))
    emulator.compute.stockout(ZONE, count=1)
    stocked = gce.wait(gce.instances.insert(**where, instance_resource=instance("out")))
    assert stocked.error.errors
    emulator.compute.quota_exceeded(ZONE, count=1, in_operation=True)
    assert gce.wait(gce.instances.insert(**where, instance_resource=instance("quota"))).error.errors
    gce.zone_ops.delete(**where, operation=stocked.name)
    list(gce.machine_types.list(**where))
    gce.machine_types.get(**where, machine_type="tpu7x-standard-4t")

    workload = compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology="2x2x2")
    policy = compute_v1.ResourcePolicy(name="wp", workload_policy=workload)
    policy_op = gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=policy)
    gce.region_ops.get(project=PROJECT, region=REGION, operation=policy_op.name)
    gce.wait(policy_op)
    list(gce.region_ops.list(project=PROJECT, region=REGION))
    gce.policies.get(project=PROJECT, region=REGION, resource_policy="wp")
    list(gce.policies.list(project=PROJECT, region=REGION))
    flex = scheduling("FLEX_START", instance_termination_action="DELETE")
    tpl = compute_v1.InstanceTemplate(
        name="tpl", properties=compute_v1.InstanceProperties(**properties(zone=None, sched=flex))
    )  # type: ignore[arg-type]
    tpl_op = gce.templates.insert(project=PROJECT, instance_template_resource=tpl)
    gce.global_ops.get(project=PROJECT, operation=tpl_op.name)
    gce.wait(tpl_op)
    list(gce.global_ops.list(project=PROJECT))
    gce.templates.get(project=PROJECT, instance_template="tpl")
    list(gce.templates.list(project=PROJECT))

    links = {"instance_template": f"projects/{PROJECT}/global/instanceTemplates/tpl"}
    rp = compute_v1.InstanceGroupManagerResourcePolicies(
        workload_policy=f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/wp"
    )
    mig = compute_v1.InstanceGroupManager(name="mig", target_size=2, resource_policies=rp, **links)
    emulator.compute.stockout(ZONE, count=1)
    gce.wait(gce.groups.insert(**where, instance_group_manager_resource=mig))
    wait_for(lambda: list(gce.groups.list_errors(**where, instance_group_manager="mig")))
    list(gce.groups.list_managed_instances(**where, instance_group_manager="mig"))  # planned, with lastAttempt
    wait_for(lambda: gce.groups.get(**where, instance_group_manager="mig").status.is_stable)
    list(gce.groups.list(**where))
    gce.wait(gce.groups.resize(**where, instance_group_manager="mig", size=0))
    body = compute_v1.InstanceGroupManagerResizeRequest(
        name="rr", resize_by=2, requested_run_duration=compute_v1.Duration(seconds=600)
    )
    at = {**where, "instance_group_manager": "mig"}
    emulator.compute.resize_fails(ZONE, count=1)
    gce.wait(gce.resize_requests.insert(**at, instance_group_manager_resize_request_resource=body))
    wait_for(lambda: gce.resize_requests.get(**at, resize_request="rr").state == "FAILED")
    list(gce.resize_requests.list(**at))
    gce.wait(gce.resize_requests.delete(**at, resize_request="rr"))
    emulator.compute.stockout(ZONE)
    gce.wait(gce.resize_requests.insert(**at, instance_group_manager_resize_request_resource=body))
    gce.wait(gce.resize_requests.cancel(**at, resize_request="rr"))
    emulator.compute.faults.clear()
    gce.wait(gce.groups.delete(**where, instance_group_manager="mig"))
    gce.wait(gce.templates.delete(project=PROJECT, instance_template="tpl"))
    gce.wait(gce.policies.delete(project=PROJECT, region=REGION, resource_policy="wp"))


def test_every_compute_route_answers_in_compute_v1_shapes(tmp_path: Path) -> None:
    with quick_emulator(tmp_path) as emulator:
        compute_scenario(emulator)
        answered = checked_methods(emulator, "/compute/v1/")
        routes = {method_id for *_, method_id, _ in emulator.compute.api.routes}
    refused_always = {"compute.instances.suspend"}  # TPU VMs cannot be suspended: an error is its only answer
    assert routes - refused_always == {m for m, statuses in answered.items() if any(200 <= s < 300 for s in statuses)}


def test_the_tpu_api_refuses_what_tpu_v2_json_refuses(tmp_path: Path) -> None:
    with TpuEmulator(workdir=tmp_path / "emu") as emulator:
        url = f"{emulator.endpoint}/v2/{PARENT}/nodes?nodeID=typo"  # the query parameter is nodeId
        body = {"acceleratorType": "v4-8", "runtimeVersion": RUNTIME, "schedulingConfig": {"spot": "yes"}}
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("accepted")
        except urllib.error.HTTPError as refused:
            assert refused.code == 400
            error = json.loads(refused.read())["error"]
        assert not emulator.nodes()
    assert error["status"] == "INVALID_ARGUMENT"
    (detail,) = error["details"]
    assert detail["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    assert [v["field"] for v in detail["fieldViolations"]] == ["nodeID", "node.scheduling_config.spot"]
    assert "Cannot bind query parameter" in detail["fieldViolations"][0]["description"]
