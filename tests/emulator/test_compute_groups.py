"""Multi-host TPU slices on the Compute Engine emulator: a managed instance group whose workload policy names the
slice's topology, created all at once or not at all, and flex-start through resize requests; through the real
google-cloud-compute client (REST)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from tests.emulator.compute import (
    PROJECT,
    REGION,
    ZONE,
    Clients,
    properties,
    quick_emulator,
    scheduling,
    spot,
)
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator

SLICE_SCRIPT = (
    'curl -s -H "Metadata-Flavor: Google" "$RUNNER_METADATA_URL/instance/attributes/agent-worker-number"; echo;'
    'curl -s -H "Metadata-Flavor: Google" "$RUNNER_METADATA_URL/instance/attributes/created-by"; echo; sleep 60'
)


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[TpuEmulator]:
    with quick_emulator(tmp_path) as emu:
        yield emu


@pytest.fixture
def gce(emulator: TpuEmulator) -> Clients:
    return Clients(emulator.endpoint)


def workload_policy(gce: Clients, name: str, topology: str = "2x2x2") -> str:
    policy = compute_v1.ResourcePolicy(
        name=name,
        workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology=topology),
    )
    gce.wait(gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=policy))
    return f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/{name}"


def template(gce: Clients, name: str, **kwargs: object) -> str:
    body = compute_v1.InstanceTemplate(
        name=name, properties=compute_v1.InstanceProperties(**properties(zone=None, **kwargs))
    )  # type: ignore[arg-type]
    gce.wait(gce.templates.insert(project=PROJECT, instance_template_resource=body))
    return f"projects/{PROJECT}/global/instanceTemplates/{name}"


def group(gce: Clients, name: str, template_link: str, policy_link: str | None, size: int) -> compute_v1.Operation:
    policies = compute_v1.InstanceGroupManagerResourcePolicies(workload_policy=policy_link) if policy_link else None
    body = compute_v1.InstanceGroupManager(
        name=name,
        base_instance_name=name,
        instance_template=template_link,
        target_size=size,
        resource_policies=policies,
    )
    return gce.groups.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=body)


def managed(gce: Clients, name: str) -> list[compute_v1.ManagedInstance]:
    return list(gce.groups.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager=name))


def test_a_slice_is_created_all_at_once_and_each_vm_knows_its_place(emulator: TpuEmulator, gce: Clients) -> None:
    policy = workload_policy(gce, "slice-2x2x2")
    got = gce.policies.get(project=PROJECT, region=REGION, resource_policy="slice-2x2x2")
    assert (got.workload_policy.type_, got.workload_policy.accelerator_topology) == ("HIGH_THROUGHPUT", "2x2x2")
    tpl = template(gce, "slice-tpl", script=SLICE_SCRIPT)
    emulator.compute.slow_create(600, zone=ZONE)  # its VMs' creation lasts, however slow this machine is
    gce.wait(group(gce, "slice", tpl, policy, 2))  # the group exists; its VMs come with time
    first = managed(gce, "slice")
    assert first and all(m.current_action == "CREATING" for m in first)
    emulator.advance(600)
    wait_for(lambda: [m.instance_status for m in managed(gce, "slice")] == ["RUNNING", "RUNNING"])
    mig = gce.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="slice")
    assert mig.status.is_stable and mig.target_size == 2
    assert mig.status.applied_accelerator_topologies[0].state == "ACTIVE"
    vms = sorted(emulator.compute.instances(), key=lambda i: i.worker)
    assert [i.worker for i in vms] == [0, 1] and all(i.group and i.group.endswith("/slice") for i in vms)
    for vm in vms:
        wait_for(lambda vm=vm: "instanceGroupManagers/slice" in vm.console_log.read_text())
        assert vm.console_log.read_text().splitlines()[1] == str(vm.worker)
    # The group's VMs go with it; its operation is DONE once they are gone.
    gce.wait(gce.groups.delete(project=PROJECT, zone=ZONE, instance_group_manager="slice"))
    assert not emulator.compute.instances()
    with pytest.raises(gexc.NotFound):
        gce.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="slice")
    gce.wait(gce.templates.delete(project=PROJECT, instance_template=tpl.rsplit("/", 1)[-1]))
    gce.wait(gce.policies.delete(project=PROJECT, region=REGION, resource_policy="slice-2x2x2"))


def test_a_stockout_fails_the_whole_slice_and_the_group_retries(emulator: TpuEmulator, gce: Clients) -> None:
    emulator.compute.stockout(ZONE)  # until cleared
    gce.wait(group(gce, "gang", template(gce, "gang-tpl"), workload_policy(gce, "gang-policy"), 2))
    errors = wait_for(
        lambda: (
            len(items := list(gce.groups.list_errors(project=PROJECT, zone=ZONE, instance_group_manager="gang"))) >= 2
            and items
        )
    )
    assert all("Atomic resize failed with [GCE_STOCKOUT]" in e.error.message for e in errors)
    assert not emulator.compute.instances()  # none of the slice, never a part of it
    planned = managed(gce, "gang")
    assert len(planned) == 2 and all(m.current_action == "CREATING" and not m.instance_status for m in planned)
    assert "GCE_STOCKOUT" in planned[0].last_attempt.errors.errors[0].message
    mig = gce.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="gang")
    assert not mig.status.is_stable
    emulator.compute.faults.clear("stockout")  # the stockout is over: both VMs come at once
    wait_for(lambda: [m.instance_status for m in managed(gce, "gang")] == ["RUNNING", "RUNNING"])


def test_gang_size_and_compact_placement_are_refused(gce: Clients) -> None:
    tpl = template(gce, "tpl")
    with pytest.raises(gexc.BadRequest, match=r"in the gang mode of size '2'\. Should be equal to the gang size"):
        group(gce, "wrong-size", tpl, workload_policy(gce, "p-2x2x2"), 3)
    with pytest.raises(gexc.BadRequest, match="acceleratorTopology"):
        gce.policies.insert(
            project=PROJECT,
            region=REGION,
            resource_policy_resource=compute_v1.ResourcePolicy(
                name="no-topology", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT")
            ),
        )
    compact = compute_v1.ResourcePolicy(
        name="compact", group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(collocation="COLLOCATED")
    )
    gce.wait(gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=compact))
    with pytest.raises(gexc.BadRequest, match="Use workload policy instead"):
        group(gce, "compact", tpl, f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/compact", 2)
    gce.wait(group(gce, "uses-tpl", tpl, None, 0))
    with pytest.raises(gexc.BadRequest, match="is already being used by"):
        gce.templates.delete(project=PROJECT, instance_template="tpl")


def test_a_preempted_spot_member_is_recreated_under_its_name(emulator: TpuEmulator, gce: Clients) -> None:
    gce.wait(group(gce, "spot", template(gce, "spot-tpl", sched=spot()), workload_policy(gce, "spot-policy"), 2))
    wait_for(lambda: [m.instance_status for m in managed(gce, "spot")] == ["RUNNING", "RUNNING"])
    victim = managed(gce, "spot")[1].name
    emulator.compute.preempt(victim)
    wait_for(lambda: {m.name: m.instance_status for m in managed(gce, "spot")}[victim] == "TERMINATED")
    wait_for(lambda: [m.instance_status for m in managed(gce, "spot")] == ["RUNNING", "RUNNING"])
    assert victim in {m.name for m in managed(gce, "spot")}


def test_a_flex_start_resize_request_creates_the_slice_for_its_run_duration(
    emulator: TpuEmulator, gce: Clients
) -> None:
    flex = scheduling("FLEX_START", instance_termination_action="DELETE")
    gce.wait(group(gce, "flex", template(gce, "flex-tpl", sched=flex), workload_policy(gce, "flex-policy"), 0))
    request = compute_v1.InstanceGroupManagerResizeRequest(
        name="run-1", resize_by=2, requested_run_duration=compute_v1.Duration(seconds=3600)
    )

    def state() -> str:
        return str(
            gce.resize_requests.get(
                project=PROJECT, zone=ZONE, instance_group_manager="flex", resize_request="run-1"
            ).state
        )

    with emulator.frozen():  # CREATING lasts the emulator's create delay: held while it is read
        op = gce.resize_requests.insert(
            project=PROJECT,
            zone=ZONE,
            instance_group_manager="flex",
            instance_group_manager_resize_request_resource=request,
        )
        assert state() == "CREATING"
    gce.wait(op)
    wait_for(lambda: state() == "SUCCEEDED")
    assert [m.instance_status for m in managed(gce, "flex")] == ["RUNNING", "RUNNING"]
    assert gce.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="flex").target_size == 2
    emulator.compute.advance(3600)  # the run duration is over: the MIG deletes what the request created
    wait_for(lambda: not managed(gce, "flex"))
    assert gce.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="flex").target_size == 0
    gce.wait(
        gce.resize_requests.delete(project=PROJECT, zone=ZONE, instance_group_manager="flex", resize_request="run-1")
    )


def test_resize_requests_are_checked_wait_out_stockouts_and_can_be_cancelled(
    emulator: TpuEmulator, gce: Clients
) -> None:
    flex = scheduling("FLEX_START", instance_termination_action="DELETE")
    gce.wait(group(gce, "q", template(gce, "q-tpl", sched=flex), workload_policy(gce, "q-policy"), 0))

    def ask(name: str, by: int, seconds: int) -> compute_v1.Operation:
        body = compute_v1.InstanceGroupManagerResizeRequest(
            name=name, resize_by=by, requested_run_duration=compute_v1.Duration(seconds=seconds)
        )
        return gce.resize_requests.insert(
            project=PROJECT, zone=ZONE, instance_group_manager="q", instance_group_manager_resize_request_resource=body
        )

    with pytest.raises(gexc.BadRequest, match="Must be from 600 to 604800"):
        ask("too-short", 2, 300)
    with pytest.raises(gexc.BadRequest, match="gang size"):
        ask("wrong-size", 4, 3600)
    emulator.compute.stockout(ZONE)  # until cleared: the request waits ACCEPTED
    gce.wait(ask("waits", 2, 3600))
    get = {"project": PROJECT, "zone": ZONE, "instance_group_manager": "q", "resize_request": "waits"}
    waiting = wait_for(lambda: (r := gce.resize_requests.get(**get)).status.last_attempt.error.errors and r)
    assert waiting.state == "ACCEPTED" and "GCE_STOCKOUT" in waiting.status.last_attempt.error.errors[0].message
    with pytest.raises(gexc.BadRequest, match="cancel it before deleting it"):
        gce.resize_requests.delete(**get)
    gce.wait(gce.resize_requests.cancel(**get))
    assert gce.resize_requests.get(**get).state == "CANCELLED"
    gce.wait(gce.resize_requests.delete(**get))
    assert not managed(gce, "q")
