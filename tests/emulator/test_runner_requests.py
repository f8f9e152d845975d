"""Every request the runner's TPU VM backend sends validates against Google's own schema (tpu.v2.json).

Each variant of the Node and QueuedResource the runner renders (runner/backends/tpu_vm/requests.py node_request,
the same module's queued_request; their dry runs are tests/plan/golden/*.txt) goes through a whole
`runner submit` on the emulators: create, the polls of its operation and node, the VM's own self-delete through the
bootstrap, the runner's teardown. The emulator checks each request against the discovery document and refuses one
that breaks it with 400, so a request the real API would refuse by schema fails the run here; the recorded requests
must all name the method they were checked against.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cloudjobs import job, run_id_of, submit

COMMAND = "command: [python, -c, 'print(\"hi\")']\n"
VARIANTS = {
    "on-demand node": "",
    "spot node": ", spot: true",
    "reserved node": ", reserved: true",
    "service account": ", service_account: trainer@test-project.iam.gserviceaccount.com",
    "queued, guaranteed": ", provisioning: queued, max_wait: 10m",
    "queued spot": ", provisioning: queued, spot: true",
    "queued reserved": ", provisioning: queued, reserved: true",
    "multislice": None,  # two v4-16 slices: multisliceParams instead of a node id
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_runners_tpu_requests_validate_against_tpu_v2_json(
    cloud, tmp_path: Path, bucket_url: str, variant: str
) -> None:  # type: ignore[no-untyped-def]
    extra = VARIANTS[variant]
    if extra is None:
        spec = tmp_path / "multi.yaml"
        spec.write_text(
            "name: multi\nimage: us-central1-docker.pkg.dev/test-project/runner/trainer:test\n"
            "accelerator: {type: v4-16, slices: 2, zone: us-central2-b, project: test-project}\n"
            f"storage: {bucket_url}\n{COMMAND}"
        )
    else:
        spec = job(tmp_path, bucket_url, COMMAND, accelerator=extra)
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    calls = [r for r in cloud.requests if r.path.startswith("/v2/projects/")]
    unchecked = [f"{r.method} {r.path}" for r in calls if r.checked is None]
    assert not unchecked, f"not checked against tpu.v2.json: {unchecked}"
    refused = [(r.method, r.path, r.body) for r in calls if r.status in (400, 500)]
    assert not refused, f"refused by the schema (or answered off it): {refused}"
    methods = {r.checked.split()[-1] for r in calls if r.checked}
    created = "queuedResources.create" if "queued" in variant or extra is None else "nodes.create"
    assert f"tpu.projects.locations.{created}" in methods
    assert {"tpu.projects.locations.operations.get"} <= methods
    assert all(r.checked.startswith("tpu.v2 ") for r in calls if r.checked)
    create = next(r for r in calls if r.method == "POST")
    labels = create.body["labels"] if created == "nodes.create" else create.body["tpu"]["nodeSpec"][0]["node"]["labels"]
    assert labels["tpu-runner-run"] == run_id  # the body checked is the runner's own
