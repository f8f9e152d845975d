"""Multi-host slices as managed instance groups on the emulator: a 2x2x2 slice (2 VMs) made at once with its
workload policy and template, a gang stockout moving zones, flex-start through a resize request, a preempted VM
making the slice PREEMPTED, and teardown taking the group, then its template and policy."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from runner.backends.base import MachineState
from runner.backends.compute_engine.backend import ComputeEngineBackend
from runner.backends.compute_engine.handles import ComputeHandle, GroupHandle
from tests.backends.compute_engine.plans import PROJECT, plan
from tests.emulator.compute import REGION, Clients
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator

ZONE = "us-central1-c"


def _gone(gce: Clients, handle: GroupHandle) -> None:
    with pytest.raises(gexc.NotFound):
        gce.groups.get(project=PROJECT, zone=handle.zone, instance_group_manager=handle.name)
    with pytest.raises(gexc.NotFound):
        gce.templates.get(project=PROJECT, instance_template=handle.template)
    with pytest.raises(gexc.NotFound):
        gce.policies.get(project=PROJECT, region=handle.region, resource_policy=handle.policy)


def test_a_2x2x2_slice_is_one_group_of_two_vms_with_its_workload_policy(
    backend: ComputeEngineBackend, emulator: TpuEmulator, gce: Clients
) -> None:
    handles: list[ComputeHandle] = []
    p = plan("type: tpu7x-16, zone: us-central1-c")
    handle = backend.provision(p, handles.append)
    assert handles == [handle] and isinstance(handle, GroupHandle) and handle.resize_request is None
    assert backend.observe(handle) == (MachineState.RUNNING, "2/2 RUNNING")
    policy = gce.policies.get(project=PROJECT, region=REGION, resource_policy=handle.policy)
    assert (policy.workload_policy.type_, policy.workload_policy.accelerator_topology) == ("HIGH_THROUGHPUT", "2x2x2")
    group = gce.groups.get(project=PROJECT, zone=ZONE, instance_group_manager=handle.name)
    assert group.resource_policies.workload_policy.endswith(f"/resourcePolicies/{handle.policy}")
    assert group.instance_template.endswith(f"/instanceTemplates/{handle.template}")
    vms = sorted(emulator.compute.instances(), key=lambda i: i.worker)
    assert [v.worker for v in vms] == [0, 1] and {v.machine_type for v in vms} == {"tpu7x-standard-4t"}
    assert all(v.labels["tpu-runner-run"] == p.run_id for v in vms)  # the template's labels are its VMs'
    assert backend.handle_from_dict(handle.to_dict()) == handle
    assert backend.teardown(handle, wait_s=20) is True
    assert not emulator.compute.instances()
    _gone(gce, handle)
    assert backend.status(handle) == MachineState.GONE


def test_a_gang_stockout_moves_the_slice_to_the_next_zone(
    backend: ComputeEngineBackend, emulator: TpuEmulator, gce: Clients, said: list[str]
) -> None:
    emulator.compute.stockout("us-central1-a")  # every attempt there: the group would keep trying forever
    handles: list[ComputeHandle] = []
    handle = backend.provision(plan("type: v5p-16, zones: [us-central1-a, us-east5-a]"), handles.append)
    assert [h.zone for h in handles] == ["us-central1-a", "us-east5-a"] and isinstance(handle, GroupHandle)
    assert handle.zone == "us-east5-a" and backend.status(handle) == MachineState.RUNNING
    assert any("GCE_STOCKOUT" in line for line in said)
    # The stocked-out zone's group and policy were deleted before moving on; the template (global, one name) was
    # too, and made again for the next zone: its startup script names that zone.
    with pytest.raises(gexc.NotFound):
        gce.groups.get(project=PROJECT, zone="us-central1-a", instance_group_manager=handle.name)
    with pytest.raises(gexc.NotFound):
        gce.policies.get(project=PROJECT, region="us-central1", resource_policy=handle.policy)
    template = gce.templates.get(project=PROJECT, instance_template=handle.template)
    assert "tpu-runner-zone=us-east5-a" in template.description
    backend.teardown(handle, wait_s=20)
    _gone(gce, handle)


def test_flex_start_asks_for_the_whole_slice_with_a_resize_request(
    backend: ComputeEngineBackend, emulator: TpuEmulator, gce: Clients
) -> None:
    emulator.compute.stockout(ZONE, count=2)  # the request waits ACCEPTED through two attempts, then gets its VMs
    p = plan("type: tpu7x-16, zone: us-central1-c, provisioning: queued, max_wait: 10m")
    handle = backend.provision(p, lambda h: None)
    assert isinstance(handle, GroupHandle) and handle.resize_request
    request = gce.resize_requests.get(
        project=PROJECT, zone=ZONE, instance_group_manager=handle.name, resize_request=handle.resize_request
    )
    assert request.state == "SUCCEEDED" and request.resize_by == 2
    assert request.requested_run_duration.seconds == p.spec.teardown.max_runtime + 15 * 60
    vm = emulator.compute.instances()[0]
    assert vm.json["scheduling"]["provisioningModel"] == "FLEX_START"
    backend.teardown(handle, wait_s=20)
    _gone(gce, handle)


def test_a_preempted_vm_makes_the_slice_preempted(backend: ComputeEngineBackend, emulator: TpuEmulator) -> None:
    handle = backend.provision(plan("type: tpu7x-16, zone: us-central1-c, spot: true"), lambda h: None)
    assert backend.status(handle) == MachineState.RUNNING
    emulator.compute.preempt(emulator.compute.instances()[1].name)
    state, native = wait_for(lambda: (s := backend.observe(handle))[0] != MachineState.RUNNING and s)
    assert state == MachineState.PREEMPTED and "preempted" in (native or "")
    # The group recreates the VM by itself; the slice stays PREEMPTED (its job lost a host all the same).
    wait_for(lambda: [i.status for i in emulator.compute.instances()] == ["RUNNING", "RUNNING"])
    assert backend.status(handle) == MachineState.PREEMPTED
    assert backend.teardown(handle, wait_s=20) is True
