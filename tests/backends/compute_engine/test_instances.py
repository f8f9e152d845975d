"""Single-host TPU VMs as Compute Engine instances, on the emulator: created, read, preempted, moved by a stockout,
and deleted (or not, when Compute Engine fails the delete)."""

from __future__ import annotations

import pytest

from runner.backends.base import MachineState
from runner.backends.compute_engine.backend import ComputeEngineBackend
from runner.backends.compute_engine.handles import ComputeHandle, InstanceHandle
from runner.errors import BackendError, QuotaExceeded
from tests.backends.compute_engine.plans import PROJECT, plan
from tests.emulator.compute import Clients
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator

ZONE = "us-central1-c"


def test_an_instance_is_created_running_and_deleted(backend: ComputeEngineBackend, emulator: TpuEmulator) -> None:
    handles: list[ComputeHandle] = []
    p = plan("type: tpu7x-8, zone: us-central1-c")
    handle = backend.provision(p, handles.append)
    assert handles == [handle] and isinstance(handle, InstanceHandle)
    assert (handle.project, handle.zone, handle.name) == (PROJECT, ZONE, p.run_id)
    assert backend.observe(handle) == (MachineState.RUNNING, "RUNNING")
    assert backend.ready_at(handle) is not None  # the insert operation's end, by the API's clock
    vm = emulator.compute.instance(handle.name)
    assert vm is not None and vm.machine_type == "tpu7x-standard-4t"
    assert vm.labels["tpu-runner-run"] == p.run_id and vm.labels["tpu-runner-nonce"] == p.nonce
    assert vm.metadata["startup-script"].startswith("#!/bin/bash")
    scheduling = vm.json["scheduling"]
    assert scheduling["provisioningModel"] == "STANDARD" and scheduling["instanceTerminationAction"] == "DELETE"
    assert scheduling["maxRunDuration"]["seconds"] == str(p.spec.teardown.max_runtime + 15 * 60)
    assert backend.handle_from_dict(handle.to_dict()) == handle
    assert backend.teardown(handle, wait_s=20) is True
    assert backend.status(handle) == MachineState.GONE
    assert backend.teardown(handle, wait_s=20) is True  # idempotent


def test_a_stockout_moves_to_the_next_zone(
    backend: ComputeEngineBackend, emulator: TpuEmulator, said: list[str]
) -> None:
    emulator.compute.stockout("us-central1-b", count=1)
    handles: list[ComputeHandle] = []
    handle = backend.provision(plan("type: v6e-4, zones: [us-central1-b, us-east1-d]"), handles.append)
    assert [h.zone for h in handles] == ["us-central1-b", "us-east1-d"]  # recorded before each insert
    assert handle.zone == "us-east1-d" and backend.status(handle) == MachineState.RUNNING
    assert any("us-central1-b: no capacity" in line for line in said)
    assert [i.zone for i in emulator.compute.instances()] == ["us-east1-d"]  # the stocked-out one is gone
    backend.teardown(handle, wait_s=20)


def test_a_preempted_spot_vm_is_told_from_its_own_state(backend: ComputeEngineBackend, emulator: TpuEmulator) -> None:
    handle = backend.provision(plan("type: tpu7x-2, zone: us-central1-c, spot: true"), lambda h: None)
    vm = emulator.compute.instance(handle.name)
    # DELETE at its deadline or a preemption: nothing of it is left billing (its boot disk goes with it).
    assert vm is not None and vm.json["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert backend.status(handle) == MachineState.RUNNING
    emulator.compute.preempt(handle.name)
    # While it stops, its preempted operation tells the preemption; then it is gone (taken back: made again).
    state, native = wait_for(lambda: (s := backend.observe(handle))[0] != MachineState.RUNNING and s)
    assert (state, native) in ((MachineState.PREEMPTED, "TERMINATED (preempted)"), (MachineState.GONE, None))
    if native:
        assert backend.state_note(native)  # a follower is told what it means
    wait_for(lambda: backend.status(handle) == MachineState.GONE, "the preempted VM deleted by its action")
    assert emulator.compute.instance(handle.name) is None
    assert backend.teardown(handle, wait_s=20) is True


def test_a_stopped_vm_is_stopped_not_preempted(backend: ComputeEngineBackend, gce: Clients) -> None:
    handle = backend.provision(plan("type: tpu7x-2, zone: us-central1-c, spot: true"), lambda h: None)
    gce.wait(gce.instances.stop(project=PROJECT, zone=ZONE, instance=handle.name))
    assert backend.observe(handle) == (MachineState.STOPPED, "TERMINATED")
    backend.teardown(handle, wait_s=20)


def test_a_delete_that_fails_is_asked_again_then_reported(
    backend: ComputeEngineBackend, emulator: TpuEmulator, said: list[str]
) -> None:
    handle = backend.provision(plan("type: tpu7x-2, zone: us-central1-c"), lambda h: None)
    emulator.compute.delete_fails(ZONE, count=1)
    assert backend.teardown(handle, wait_s=20) is True  # INTERNAL is transient: asked again, and it went
    assert any("failed (INTERNAL); asking again" in line for line in said)
    handle = backend.provision(plan("type: tpu7x-2, zone: us-central1-c"), lambda h: None)
    emulator.compute.delete_fails(ZONE, count=10)
    with pytest.raises(BackendError) as failed:
        backend.teardown(handle, wait_s=20)
    assert "still there" in failed.value.message and "gcloud compute instances delete" in (failed.value.hint or "")
    assert backend.status(handle) == MachineState.RUNNING  # nothing claims it is gone


@pytest.mark.parametrize("in_operation", [False, True])
def test_quota_stops_at_once_in_every_zone(
    backend: ComputeEngineBackend, emulator: TpuEmulator, in_operation: bool
) -> None:
    emulator.compute.quota_exceeded("us-central1-b", in_operation=in_operation)
    handles: list[ComputeHandle] = []
    with pytest.raises(QuotaExceeded) as refused:
        backend.provision(plan("type: v6e-4, zones: [us-central1-b, us-east1-d]"), handles.append)
    assert [h.zone for h in handles] == ["us-central1-b"]  # no other zone fixes a quota
    assert "TPU" in refused.value.message and "Quotas" in (refused.value.hint or "")
    assert not emulator.compute.instances()


def test_flex_start_waits_pending_for_capacity(
    backend: ComputeEngineBackend, emulator: TpuEmulator, said: list[str]
) -> None:
    emulator.compute.stockout(ZONE, count=3)
    handle = backend.provision(plan("type: tpu7x-8, zone: us-central1-c, provisioning: queued"), lambda h: None)
    assert backend.status(handle) == MachineState.RUNNING
    assert any(": PENDING (" in line for line in said)  # waited for capacity, its insert operation DONE
    vm = emulator.compute.instance(handle.name)
    assert vm is not None and vm.json["scheduling"]["provisioningModel"] == "FLEX_START"
    backend.teardown(handle, wait_s=20)
