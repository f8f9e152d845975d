"""`runner submit` through the compute-engine backend, end to end on the emulators, the way a user runs it: a TPU7x
spec with `backend: auto` goes to Compute Engine (the Cloud TPU API does not serve TPU7x), the instance's VM runs the
rendered bootstrap, the job's container writes its exit record, and the instance is deleted after."""

from __future__ import annotations

import json
from pathlib import Path

from runner.storage import open_storage
from tests.cloudjobs import IMAGE, events, run_id_of, submit
from tpu_emulator import TpuEmulator


def test_submit_runs_a_command_on_a_tpu7x_instance_and_deletes_it(
    cloud: TpuEmulator, tmp_path: Path, bucket_url: str
) -> None:
    spec = tmp_path / "ironwood.yaml"
    spec.write_text(
        f"name: ironwood\nimage: {IMAGE}\n"
        "command: [python, -c, 'print(\"hi from an ironwood vm\")']\n"
        "accelerator: {type: tpu7x-8, zones: [us-central1-c], project: test-project}\n"
        f"storage: {bucket_url}\n"
    )
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    assert "hi from an ironwood vm" in result.output
    assert "not estimated: no list price of TPU7x (Ironwood) is known" in result.output  # never a $0 figure
    # The plan says where it went and why, and what it creates: one tpu7x-standard-4t instance (4 chips).
    assert "compute-engine" in result.output and "tpu7x-standard-4t" in result.output, result.output
    calls = [(r.method, r.path) for r in cloud.requests if r.path.startswith("/compute/v1/")]
    assert ("POST", "/compute/v1/projects/test-project/zones/us-central1-c/instances") in calls
    assert not [c for c in calls if "/instanceGroupManagers" in c[1]]  # one host: an instance, no group
    assert not [r for r in cloud.requests if r.path.startswith("/v2/projects/")]  # nothing asked of Cloud TPU
    run_dir = f"{bucket_url}/runs/{run_id}"
    exit_record = json.loads(open_storage(run_dir).read_bytes("exit/worker-0.json") or b"{}")
    assert exit_record["state"] == "succeeded" and exit_record["exit_code"] == 0
    seen = [e["event"] for e in events(run_dir)]
    assert seen.index("bootstrap_started") < seen.index("container_started") < seen.index("worker_exited")
    # Deleted after: by the VM itself (SELF_DELETE=compute-instance) or the runner's teardown, whichever asked
    # first; either way the run confirms it gone, and the emulator holds no instance.
    assert any(e in seen for e in ("delete_requested", "teardown_requested"))
    assert ("DELETE", f"/compute/v1/projects/test-project/zones/us-central1-c/instances/{run_id}") in calls
    assert not cloud.compute.instances(), "the emulator still holds an instance"
