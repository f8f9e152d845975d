"""Every request body the compute-engine backend renders validates against Google's own schema (compute.v1.json,
through tpu_emulator.discovery): each variant of instance, workload policy, template, group and resize request. A
body that would not validate fails here, before any server sees it. Also the plan-time checks of its catalog slice."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from runner.backends.compute_engine import findings
from runner.backends.compute_engine.backend import ComputeEngineBackend
from runner.backends.compute_engine.requests import API_ROOT, instance_request, slice_requests
from runner.backends.compute_engine.target import ComputeTarget
from runner.errors import PlanError
from runner.plan.planner import Plan
from runner.spec.loader import load_spec_text
from tests.backends.compute_engine.plans import PROJECT, plan, spec_text
from tpu_emulator import discovery

COMPUTE = discovery.load("compute.v1.json")
pytestmark = pytest.mark.skipif(COMPUTE is None, reason="google-api-python-client (a dev dependency) is not installed")
METHODS = {
    "instance": "compute.instances.insert",
    "policy": "compute.resourcePolicies.insert",
    "template": "compute.instanceTemplates.insert",
    "group": "compute.instanceGroupManagers.insert",
    "resize request": "compute.instanceGroupManagerResizeRequests.insert",
}
SINGLE = {
    "tpu7x-8 on demand": "type: tpu7x-8, zone: us-central1-c",
    "tpu7x-2 spot": "type: tpu7x-2, zone: us-central1-c, spot: true",
    "tpu7x-8 flex-start": "type: tpu7x-8, zone: us-central1-c, provisioning: queued, max_wait: 1h",
    "v6e-8 any reservation": "type: v6e-8, zone: us-east5-a, reserved: true",
    "v5p-8 service account": "type: v5p-8, zone: us-east5-a, service_account: t@rehearsal.iam.gserviceaccount.com",
}
SLICES = {
    "tpu7x 2x2x2": "type: tpu7x-16, zone: us-central1-c",
    "tpu7x 2x2x2 spot": "type: tpu7x-16, zone: us-central1-c, spot: true",
    "tpu7x 4x4x4 flex-start": "type: tpu7x-128, zone: us-central1-c, provisioning: queued",
    "v6e 4x4": "type: v6e-16, zone: us-east5-b",
    "v5p 2x2x2": "type: v5p-16, zone: us-central1-a",
}


def requests_of(p: Plan) -> list[tuple[str, str, dict[str, Any]]]:
    target = p.cloud
    assert target is not None
    zone, name = target.zones[0], target.machine_id
    if p.spec.accelerator.type in ("tpu7x-16", "tpu7x-128", "v6e-16", "v5p-16"):
        return slice_requests(p, zone, name)
    path = f"{API_ROOT}/projects/{PROJECT}/zones/{zone}/instances"
    return [("instance", path, instance_request(p, zone, name))]


def violations(p: Plan) -> list[tuple[str, list[tuple[str, str]]]]:
    assert COMPUTE is not None
    return [(what, COMPUTE.check_request(METHODS[what], path, {}, body)) for what, path, body in requests_of(p)]


@pytest.mark.parametrize("variant", [*SINGLE, *SLICES])
def test_every_request_validates_against_compute_v1_json(variant: str) -> None:
    p = plan(SINGLE.get(variant) or SLICES[variant])
    checked = violations(p)
    assert [what for what, _ in checked] == (
        ["instance"]
        if variant in SINGLE
        else ["policy", "template", "group"] + (["resize request"] * ("flex" in variant))
    )
    assert all(not problems for _, problems in checked), checked


def test_a_reservation_bound_vm_names_its_reservation() -> None:
    p = plan("type: tpu7x-8, zone: us-central1-c, reserved: true")
    assert isinstance(p.cloud, ComputeTarget)
    bound = replace(p, cloud=replace(p.cloud, provisioning_model="RESERVATION_BOUND", reservation="ironwood-r1"))
    body = instance_request(bound, "us-central1-c", "vm")
    assert body["reservationAffinity"]["values"] == ["ironwood-r1"]
    assert body["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    assert all(not problems for _, problems in violations(bound))


def test_the_check_fails_a_body_that_would_not_validate() -> None:
    assert COMPUTE is not None
    body = instance_request(plan(), "us-central1-c", "vm")
    body["scheduling"]["provisioningModel"] = "PREEMPTIBLE"  # not in the enum
    body["machineTypes"] = body.pop("machineType")  # no such field
    problems = COMPUTE.check_request(METHODS["instance"], f"{API_ROOT}/projects/p/zones/z/instances", {}, body)
    fields = [field for field, _ in problems]
    assert "resource.scheduling.provisioningModel" in fields
    assert any('Unknown name "machineTypes"' in text for _, text in problems)


def test_the_dry_run_prints_exactly_the_bodies_sent() -> None:
    p = plan("type: tpu7x-16, zone: us-central1-c")
    text = ComputeEngineBackend(say=lambda s: None).dry_run(p)
    assert text.count("Request: POST /compute/v1/projects/rehearsal/") == 3
    assert '"acceleratorTopology": "2x2x2"' in text and '"targetSize": 2' in text
    assert "startup-script (runs as root on every VM at boot" in text


@pytest.mark.parametrize(
    ("accelerator", "body", "said"),
    [
        ("type: tpu7x-8, zone: us-central1-c", "training: {framework: tensorflow}\n", "TensorFlow is not supported"),
        ("type: v5litepod-8, zone: us-central1-a", None, "Compute Engine offers TPU7x, v6e and v5p"),
        ("type: tpu7x-8, zone: us-east5-a", None, "not offered on Compute Engine in us-east5-a"),
        ("type: tpu7x-24, zone: us-central1-c", None, "comes as tpu7x-2, tpu7x-8, tpu7x-16"),
        ("type: tpu7x-8, zone: us-central1-c, spot: true, provisioning: queued", None, "flex-start"),
    ],
)
def test_plan_time_refusals(accelerator: str, body: str | None, said: str) -> None:
    spec = load_spec_text(spec_text(accelerator, body=body) if body else spec_text(accelerator))
    _, found = findings(spec)
    assert any(f.error and said in f.message for f in found), found
    with pytest.raises(PlanError):
        plan(accelerator, **({"body": body} if body else {}))
