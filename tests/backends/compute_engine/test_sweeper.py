"""`runner gc` on Compute Engine (the emulator): the runner-labelled instances and groups a killed runner left, with
the group's template and workload policy following it; a zone that cannot be listed is reported and skipped."""

from __future__ import annotations

from google.cloud import compute_v1

from runner.backends.compute_engine import sweep
from runner.backends.compute_engine.backend import ComputeEngineBackend
from runner.backends.compute_engine.handles import GroupHandle
from runner.backends.sweep import ZONE
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
        {ZONE: ["us-central1-c", "us-central1-a", "us-east5-a"]},
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
    sweeper = Sweeper([sweep(QUICK)], PROJECT, {ZONE: ["us-central1-c"]}, say=lambda s: None, poll_s=0.1)
    found = {left.short_name: left for left in sweeper.scan()}
    assert found[stopped.name].orphaned_because == "it is TERMINATED and can never run the job again"
    assert found[live.name].orphaned_because is None  # its run directory cannot be read here: kept, and said
    assert found[live.name].unknown
    request = compute_v1.ListInstancesRequest(project=PROJECT, zone="us-central1-c")
    assert len(list(gce.instances.list(request=request))) == 2


def test_a_template_and_policy_whose_group_was_never_made_are_judged_by_their_runs_state(
    gce: Clients, gcs: str
) -> None:
    """A runner killed between the slice's inserts: its workload policy and instance template exist, its group
    never did. They are judged like a machine, by the run directory the template names: kept while the run may
    still make its group (within the startup grace), orphaned once it started no job in that time."""
    import json
    import uuid

    from runner.backends.compute_engine.requests import slice_requests
    from runner.storage import open_storage
    from runner.teardown.sweeper import Limits
    from tests.waiting import wait_for

    run_dir = f"gs://runner-test/{uuid.uuid4().hex[:8]}/runs/ce"
    open_storage(run_dir).write_bytes("run.json", json.dumps({"num_workers": 2}).encode())
    p = plan("type: tpu7x-16, zone: us-central1-c", storage=run_dir.removesuffix("/runs/ce"))
    bodies = {what: body for what, _, body in slice_requests(p, "us-central1-c", p.run_id)}
    policy = compute_v1.ResourcePolicy.from_json(json.dumps(bodies["policy"]))
    gce.wait(gce.policies.insert(project=PROJECT, region="us-central1", resource_policy_resource=policy))
    template = compute_v1.InstanceTemplate.from_json(json.dumps(bodies["template"]))
    gce.wait(gce.templates.insert(project=PROJECT, instance_template_resource=template))

    def scan(grace_s: float) -> dict[str, object]:
        limits = Limits(startup_grace_s=grace_s, storage_patience_s=5)
        sweeper = Sweeper([sweep(QUICK)], PROJECT, {ZONE: ["us-central1-c"]}, say=lambda s: None, limits=limits)
        return {left.kind: left.orphaned_because for left in sweeper.scan()}

    def orphaned() -> dict[str, object] | None:
        # One scan's verdicts, judged and returned together: each scan reads the API's clock from a Date header
        # (whole seconds), so a second scan can find the younger resource a second younger than the first did.
        verdicts = scan(1)
        return verdicts if all(verdicts.values()) else None

    assert scan(3600) == {"instance template": None, "workload policy": None}  # young: its group may yet come
    judged = wait_for(orphaned, "the API's clock past the startup grace")
    assert set(judged) == {"instance template", "workload policy"}
    assert all("no job started on it" in str(why) for why in judged.values()), judged
