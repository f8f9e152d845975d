"""The Compute Engine emulator's instances over real HTTP, through the real google-cloud-compute client (REST).

Operations progress only with time and tell failures only to whoever reads them; a stockout fails the insert
operation with ZONE_RESOURCE_POOL_EXHAUSTED and the instance vanishes; a Spot VM's preemption is its own status plus
a compute.instances.preempted zone operation; the VM runs the startup script with a metadata server that answers as
Compute Engine's does. Groups and resize requests are in test_compute_groups.py.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from tests.emulator.compute import PROJECT, ZONE, Clients, instance, quick_emulator, scheduling, spot
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator
from tpu_emulator.errors import ApiError


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[TpuEmulator]:
    with quick_emulator(tmp_path) as emu:
        yield emu


@pytest.fixture
def gce(emulator: TpuEmulator) -> Clients:
    return Clients(emulator.endpoint)


def status_of(gce: Clients, name: str) -> str | None:
    try:
        return str(gce.instances.get(project=PROJECT, zone=ZONE, instance=name).status)
    except gexc.NotFound:
        return None


def test_spot_instance_with_max_run_duration_is_created_read_and_deleted(emulator: TpuEmulator, gce: Clients) -> None:
    sched = spot(instance_termination_action="DELETE", max_run_duration=compute_v1.Duration(seconds=3600))
    op = gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("run-1", sched=sched))
    assert op.status != compute_v1.Operation.Status.DONE  # never DONE in the answer that starts it
    assert op.operation_type == "insert" and op.target_link.endswith(f"/zones/{ZONE}/instances/run-1")
    done = gce.wait(op)
    assert not done.error.errors and done.progress == 100
    got = gce.instances.get(project=PROJECT, zone=ZONE, instance="run-1")
    assert got.status == "RUNNING"
    assert got.machine_type.endswith(f"/zones/{ZONE}/machineTypes/tpu7x-standard-4t")
    assert (got.scheduling.provisioning_model, got.scheduling.instance_termination_action) == ("SPOT", "DELETE")
    assert got.scheduling.max_run_duration.seconds == 3600 and got.scheduling.automatic_restart is False
    assert got.labels["managed-by"] == "tpu-runner"
    assert got.service_accounts[0].email.endswith("-compute@developer.gserviceaccount.com")
    query = compute_v1.ListInstancesRequest(project=PROJECT, zone=ZONE, filter='labels.managed-by = "tpu-runner"')
    listed = gce.instances.list(request=query)
    assert [i.name for i in listed] == ["run-1"]

    with emulator.frozen():  # STOPPING lasts the emulator's delete delay: held while it is read
        delete = gce.instances.delete(project=PROJECT, zone=ZONE, instance="run-1")
        assert status_of(gce, "run-1") == "STOPPING"
    gce.wait(delete)
    assert status_of(gce, "run-1") is None


def test_an_operation_finishes_only_with_time(emulator: TpuEmulator, gce: Clients) -> None:
    emulator.compute.slow_create(1.5, zone=ZONE)
    t0 = time.monotonic()
    op = gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("slow"))
    seen = []
    while True:
        current = gce.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name)  # returns after wait_s at most
        seen.append((current.status.name, status_of(gce, "slow")))
        if current.status == compute_v1.Operation.Status.DONE:
            break
    assert time.monotonic() - t0 >= 1.5
    assert ("RUNNING", "PROVISIONING") in seen and ("RUNNING", "STAGING") in seen and seen[-1] == ("DONE", "RUNNING")
    assert current.start_time and current.end_time and current.insert_time


def test_a_stockout_fails_the_operation_with_zone_resource_pool_exhausted(emulator: TpuEmulator, gce: Clients) -> None:
    emulator.compute.stockout(ZONE, count=1)
    with emulator.frozen():
        op = gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("stocked-out"))
        assert status_of(gce, "stocked-out") == "PROVISIONING"  # accepted: the answer says nothing of capacity
    done = gce.wait(op)
    assert [e.code for e in done.error.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    assert (done.http_error_status_code, done.http_error_message) == (503, "SERVICE UNAVAILABLE")
    assert f"'projects/{PROJECT}/zones/{ZONE}' does not have enough resources" in done.error.errors[0].message
    assert done.error.errors[0].error_details[0].help.links[0].url.startswith("https://cloud.google.com/compute/")
    assert status_of(gce, "stocked-out") is None  # the instance is gone; only the operation says why
    # The fault is used up: the next insert gets its VM.
    assert not gce.wait(
        gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("next"))
    ).error.errors


def test_quota_is_refused_at_once_or_in_the_operation(emulator: TpuEmulator, gce: Clients) -> None:
    emulator.compute.quota_exceeded(ZONE, count=1, quota="TPU7X_CHIPS", limit=0)
    with pytest.raises(gexc.Forbidden) as refused:
        gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("q1"))
    assert refused.value.errors[0]["reason"] == "quotaExceeded" and "TPU7X_CHIPS" in refused.value.message
    emulator.compute.quota_exceeded(ZONE, count=1, in_operation=True)
    done = gce.wait(gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("q2")))
    assert [e.code for e in done.error.errors] == ["QUOTA_EXCEEDED"] and done.http_error_status_code == 403
    assert done.error.errors[0].error_details[0].quota_info.limit_name


def test_an_unknown_field_is_refused_with_400_like_the_real_api(emulator: TpuEmulator) -> None:
    body = {"name": "typo", "machineType": f"zones/{ZONE}/machineTypes/tpu7x-standard-4t"}
    body["scheduling"] = {"provisioningModel": "SPOT", "instanceTerminationActon": "DELETE"}
    url = f"{emulator.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances"
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    error = json.loads(caught.value.read())["error"]
    assert (caught.value.code, error["status"]) == (400, "INVALID_ARGUMENT")
    violation = error["details"][0]["fieldViolations"][0]
    assert violation["field"] == "resource.scheduling"
    assert 'Unknown name "instanceTerminationActon"' in violation["description"]
    assert error["errors"][0]["reason"] == "badRequest"
    assert not emulator.compute.instances()  # nothing was created


def test_the_schema_refuses_bad_enums_and_the_emulator_its_own_rules(gce: Clients) -> None:
    bad_enum = instance("enum", sched=scheduling("CHEAP"))
    with pytest.raises(gexc.BadRequest, match="provisioningModel"):
        gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=bad_enum)
    v5e = instance("v5e", machine="ct5lp-hightpu-4t")
    with pytest.raises(gexc.BadRequest, match="not offered on Compute Engine"):
        gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=v5e)
    elsewhere = instance("v6e", machine="ct6e-standard-4t")  # offered, but not in us-central1-c
    with pytest.raises(gexc.BadRequest, match="does not exist in zone 'us-central1-c'"):
        gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=elsewhere)
    migrating = instance("migrate", sched=compute_v1.Scheduling(on_host_maintenance="MIGRATE"))
    with pytest.raises(gexc.BadRequest, match="cannot live-migrate"):
        gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=migrating)
    flex = instance("flex", sched=scheduling("FLEX_START", instance_termination_action="DELETE"))
    with pytest.raises(gexc.BadRequest, match="maxRunDuration"):
        gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=flex)


def test_preempting_a_spot_vm_terminates_it_and_leaves_a_preempted_operation(
    emulator: TpuEmulator, gce: Clients
) -> None:
    script = 'trap "echo got SIGTERM; exit 0" TERM; echo booted; while sleep 0.1; do :; done'
    gce.wait(
        gce.instances.insert(
            project=PROJECT, zone=ZONE, instance_resource=instance("spot", sched=spot(), script=script)
        )
    )
    info = emulator.compute.instance("spot")
    assert info is not None and info.vm is not None
    wait_for(lambda: "booted" in info.console_log.read_text())
    with emulator.frozen():
        emulator.compute.preempt("spot")
        assert status_of(gce, "spot") == "STOPPING"
    wait_for(lambda: status_of(gce, "spot") == "TERMINATED")  # instanceTerminationAction STOP, the default
    assert "got SIGTERM" in info.console_log.read_text()
    query = compute_v1.ListZoneOperationsRequest(
        project=PROJECT, zone=ZONE, filter='operationType = "compute.instances.preempted"'
    )
    preempted = list(gce.zone_ops.list(request=query))
    assert len(preempted) == 1 and preempted[0].target_link.endswith("/instances/spot")
    assert preempted[0].status == compute_v1.Operation.Status.DONE and preempted[0].name.startswith("systemevent-")
    # A Spot VM that deletes itself on preemption is simply gone.
    deleting = spot(instance_termination_action="DELETE")
    gce.wait(gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("spot-2", sched=deleting)))
    emulator.compute.preempt("spot-2")
    wait_for(lambda: status_of(gce, "spot-2") is None)
    gce.wait(gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("standard")))
    with pytest.raises(ApiError, match="only Spot VMs are preempted"):
        emulator.compute.preempt("standard")


def test_max_run_duration_ends_the_vm_by_its_termination_action(emulator: TpuEmulator, gce: Clients) -> None:
    hour = compute_v1.Duration(seconds=3600)
    deleted = spot(instance_termination_action="DELETE", max_run_duration=hour)
    stopped = scheduling("STANDARD", instance_termination_action="STOP", max_run_duration=hour)
    for name, sched in (("deleted", deleted), ("stopped", stopped)):
        gce.wait(gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance(name, sched=sched)))
    emulator.compute.advance(3000)  # 50 minutes pass
    assert (status_of(gce, "deleted"), status_of(gce, "stopped")) == ("RUNNING", "RUNNING")
    emulator.compute.advance(600)  # the hour is over: each VM's own termination action
    wait_for(lambda: status_of(gce, "deleted") is None and status_of(gce, "stopped") == "TERMINATED")


def test_the_vm_runs_the_startup_script_with_a_compute_engine_metadata_server(
    emulator: TpuEmulator, gce: Clients
) -> None:
    script = (
        'curl -s -H "Metadata-Flavor: Google" "$RUNNER_METADATA_URL/instance/name"; echo;'
        'curl -s -H "Metadata-Flavor: Google" "$RUNNER_METADATA_URL/instance/scheduling/provisioning-model"; echo;'
        'curl -s -H "Metadata-Flavor: Google" "$RUNNER_METADATA_URL/instance/preempted"; echo;'
        'curl -s -H "Metadata-Flavor: Google" "$RUNNER_METADATA_URL/instance/maintenance-event"; echo;'
        'curl -s -H "Metadata-Flavor: Google" "$RUNNER_METADATA_URL/instance/attributes/?recursive=true"; echo;'
        'curl -s -o /dev/null -w "%{http_code}\\n" "$RUNNER_METADATA_URL/instance/name"; echo "api=$RUNNER_COMPUTE_API"'
    )
    gce.wait(
        gce.instances.insert(
            project=PROJECT, zone=ZONE, instance_resource=instance("meta", sched=spot(), script=script)
        )
    )
    info = emulator.compute.instance("meta")
    assert info is not None and info.vm is not None
    wait_for(lambda: f"api={emulator.endpoint}" in info.console_log.read_text())
    lines = info.console_log.read_text().splitlines()
    assert lines[1:5] == ["meta", "SPOT", "FALSE", "NONE"]
    attributes = json.loads(lines[5])
    assert attributes["startup-script"] == script and attributes["agent-worker-number"] == "0"
    assert lines[6] == "403"  # without Metadata-Flavor: Google, as the real server answers


def test_a_vm_deletes_its_own_instance_through_the_api(emulator: TpuEmulator, gce: Clients) -> None:
    script = (
        # It waits for the test to have seen it running (a file `go` in its directory): a VM that deleted itself at
        # once was STOPPING, with no VM left to look at, before the test could read it.
        "while [ ! -e go ]; do sleep 0.05; done;"
        'M="$RUNNER_METADATA_URL"; H="Metadata-Flavor: Google";'
        'ZONE=$(curl -s -H "$H" "$M/instance/zone" | sed "s|.*/||"); NAME=$(curl -s -H "$H" "$M/instance/name");'
        # The shutdown's SIGTERM follows the answer at once: the curl that asked ignores it, so that what it read
        # reaches answer.json (stdio's buffer, lost to a process ended by a signal; a loaded machine saw it empty).
        "(trap '' TERM;"
        ' curl -s -X DELETE "$RUNNER_COMPUTE_API/compute/v1/projects/$(curl -s -H "$H" "$M/project/project-id")'
        '/zones/$ZONE/instances/$NAME" > answer.json); echo asked; sleep 60'
    )
    # The VM is gone once that curl has ended: the grace before SIGKILL only bounds how long that may take.
    emulator.vm_grace_s = 60.0
    gce.wait(gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("self", script=script)))
    info = emulator.compute.instance("self")
    assert info is not None and info.vm is not None
    (info.vm.directory / "go").touch()
    wait_for(lambda: status_of(gce, "self") is None)  # answered first, then the VM (the caller) is stopped
    answer = json.loads((info.vm.directory / "answer.json").read_text())
    assert answer["operationType"] == "delete" and answer["status"] != "DONE"
    assert not info.vm.alive or not emulator.compute.instance("self")


def test_denied_and_failing_deletes_leave_the_vm_running(emulator: TpuEmulator, gce: Clients) -> None:
    gce.wait(gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("kept")))
    emulator.compute.deny("compute.instances.delete", count=1)
    with pytest.raises(gexc.Forbidden) as denied:
        gce.instances.delete(project=PROJECT, zone=ZONE, instance="kept")
    assert "Required 'compute.instances.delete' permission" in denied.value.message
    emulator.compute.delete_fails(ZONE, count=1, status="INTERNAL")
    failed = gce.wait(gce.instances.delete(project=PROJECT, zone=ZONE, instance="kept"))
    assert failed.error.errors[0].code == "INTERNAL" and failed.http_error_status_code == 500
    assert status_of(gce, "kept") == "RUNNING"
    gce.wait(gce.instances.delete(project=PROJECT, zone=ZONE, instance="kept"))
    assert status_of(gce, "kept") is None


def test_a_flex_start_vm_waits_pending_for_capacity(emulator: TpuEmulator, gce: Clients) -> None:
    emulator.compute.stockout(ZONE)  # until cleared
    flex = scheduling(
        "FLEX_START", instance_termination_action="DELETE", max_run_duration=compute_v1.Duration(seconds=7200)
    )
    op = gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance("flex", sched=flex))
    assert not gce.wait(op).error.errors  # accepted: it waits for capacity instead of failing
    assert status_of(gce, "flex") == "PENDING"
    emulator.compute.faults.clear("stockout")
    wait_for(lambda: status_of(gce, "flex") == "RUNNING")
    with pytest.raises(gexc.BadRequest, match="cannot be stopped"):
        gce.instances.stop(project=PROJECT, zone=ZONE, instance="flex")


def test_a_host_error_repairs_a_standard_vm_and_ends_a_spot_vm(emulator: TpuEmulator, gce: Clients) -> None:
    script = 'echo boot >> "../$HOSTNAME.boots"; sleep 60'  # beside the VM's directory, which each boot makes anew
    for name, sched in (("std", scheduling()), ("spotty", spot())):
        gce.wait(
            gce.instances.insert(
                project=PROJECT, zone=ZONE, instance_resource=instance(name, sched=sched, script=script)
            )
        )
    with emulator.frozen():  # REPAIRING lasts 0.5 s: held while it is read
        emulator.compute.host_error("std", seconds=0.5)
        emulator.compute.host_error("spotty", seconds=0.5)
        assert (status_of(gce, "std"), status_of(gce, "spotty")) == ("REPAIRING", "REPAIRING")
    wait_for(lambda: (status_of(gce, "std"), status_of(gce, "spotty")) == ("RUNNING", "TERMINATED"))
    info = emulator.compute.instance("std")
    assert info is not None and info.vm is not None
    boots = info.vm.directory.parent / "std.boots"
    wait_for(lambda: boots.exists() and boots.read_text().count("boot") == 2)  # rebooted: the startup script ran again
    events = [op.operation_type for op in gce.zone_ops.list(project=PROJECT, zone=ZONE)]
    assert events.count("compute.instances.hostError") == 2
