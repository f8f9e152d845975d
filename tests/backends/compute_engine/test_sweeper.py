"""`runner gc` on Compute Engine (the emulator): the runner-labelled instances and groups a killed runner left, with
the group's template and workload policy following it; a zone that cannot be listed is reported and skipped."""

from __future__ import annotations

from google.cloud import compute_v1

from runner.backends.compute_engine import sweep
from runner.backends.compute_engine.backend import ComputeEngineBackend
from runner.backends.compute_engine.handles import GroupHandle
from runner.teardown.sweeper import Sweeper
from tests.backends.compute_engine.conftest import QUICK
from tests.backends.compute_engine.plans import PROJECT, plan
from tests.emulator.compute import Clients, instance
from tpu_emulator import TpuEmulator


def test_the_sweep_finds_and_deletes_what_a_killed_runner_left(
    backend: ComputeEngineBackend, emulator: TpuEmulator, gce: Clients
) -> None:
    single = backend.provision(plan("type: tpu7x-2, zone: us-central1-c"), lambda h: None)
    sliced = backend.provision(plan("type: v5p-16, zone: us-central1-a", name="ce2"), lambda h: None)
    assert isinstance(sliced, GroupHandle)
    # Someone else's VM in the same zone: never listed, never touched.
    gce.wait(
        gce.instances.insert(
            project=PROJECT, zone="us-central1-c", instance_resource=instance("theirs", labels={"team": "x"})
        )
    )
    # A zone the project may not use: its lists are refused (not retried), and the other zones are swept.
    emulator.compute.add_fault("http", status=403, path="/zones/us-east5-a/")
    said: list[str] = []
    runs = {single.name: "failed", sliced.name: "succeeded"}  # this machine's run records say both ended
    sweeper = Sweeper(
        [sweep(QUICK)],
        PROJECT,
        ["us-central1-c", "us-central1-a", "us-east5-a"],
        say=said.append,
        ended_runs=runs,
        poll_s=0.1,
    )
    found = {(left.kind, left.short_name): left for left in sweeper.scan()}
    assert set(found) == {
        ("instance", single.name),
        ("instance group", sliced.name),
        ("instance template", sliced.template),
        ("workload policy", sliced.policy),
    }
    assert all(left.orphaned_because for left in found.values())
    assert found[("instance template", sliced.template)].found.follows == (
        f"projects/{PROJECT}/zones/us-central1-a/instanceGroupManagers/{sliced.name}"
    )
    assert "us-east5-a" in sweeper.skipped  # the API's reason, and the other zones swept
    swept = sweeper.delete(list(found.values()), confirm_s=30)
    assert {s.outcome for s in swept} == {"deleted"}, [(s.leftover.name, s.outcome, s.error) for s in swept]
    assert [i.name for i in emulator.compute.instances()] == ["theirs"]
    assert not list(gce.templates.list(project=PROJECT)) and not list(
        gce.policies.list(project=PROJECT, region="us-central1")
    )


def test_a_live_run_is_kept_and_a_terminated_vm_is_not(backend: ComputeEngineBackend, gce: Clients) -> None:
    live = backend.provision(plan("type: tpu7x-2, zone: us-central1-c"), lambda h: None)
    stopped = backend.provision(plan("type: tpu7x-2, zone: us-central1-c", name="ce2"), lambda h: None)
    gce.wait(gce.instances.stop(project=PROJECT, zone="us-central1-c", instance=stopped.name))
    sweeper = Sweeper([sweep(QUICK)], PROJECT, ["us-central1-c"], say=lambda s: None, poll_s=0.1)
    found = {left.short_name: left for left in sweeper.scan()}
    assert found[stopped.name].orphaned_because == "it is TERMINATED and can never run the job again"
    assert found[live.name].orphaned_because is None  # its run directory cannot be read here: kept, and said
    assert found[live.name].unknown
    request = compute_v1.ListInstancesRequest(project=PROJECT, zone="us-central1-c")
    assert len(list(gce.instances.list(request=request))) == 2
