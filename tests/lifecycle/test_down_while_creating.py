"""`runner down` from another shell while the submitting runner waits for its machine to be created: the wait ends
at once, the run is `cancelled` with the reason its record gives (stopped by runner down), and nothing is left.

The submitter is the real `runner submit` in a subprocess; `runner down` runs once the submitter has said that its
machine is being created (an event, not a time), and the emulator keeps that machine creating until it is deleted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO

from typer.testing import CliRunner

from runner.cli import app
from runner.watch import runs
from tests.cloudjobs import IMAGE, job
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator


def _start(spec: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "submit", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _read_until(out: IO[str], marker: str) -> str:
    seen = ""
    for line in out:
        seen += line
        if marker in line:
            return seen
    raise AssertionError(f"the submitter ended without saying {marker!r}:\n{seen}")


def _down_and_finish(proc: subprocess.Popen[str], said: str) -> tuple[str, str, int]:
    assert proc.stdout is not None
    run_id = runs.list_records()[0].run_id
    down = CliRunner().invoke(app, ["down", run_id], catch_exceptions=False)
    assert down.exit_code == 0, down.output
    out = said + proc.stdout.read()
    return run_id, out, proc.wait(120)


def test_down_while_a_tpu_node_is_creating_cancels_the_run_at_once(
    cloud: TpuEmulator, bucket_url: str, tmp_path: Path
) -> None:
    cloud.slow_create(3600, count=1)  # CREATING until someone deletes it
    proc = _start(job(tmp_path, bucket_url, "command: [python, -c, \"print('never runs')\"]\n"))
    assert proc.stdout is not None
    said = _read_until(proc.stdout, ": CREATING")
    run_id, out, code = _down_and_finish(proc, said)
    assert code == 130, out
    assert "stopped by runner down" in out
    assert "stayed unavailable" not in out and "through every retry" not in out  # not blamed on the API
    status = json.loads(CliRunner().invoke(app, ["status", run_id, "--json"], catch_exceptions=False).output)
    assert status["state"] == "cancelled" and status["still_billing"] is None
    assert runs.load(run_id).reason == "stopped by runner down"
    assert not cloud.nodes()
    creates = [r for r in cloud.requests if r.method == "POST" and r.path.endswith("/nodes")]
    assert len(creates) == 1  # a deleted create is never taken for a preemption and made again


def test_down_while_a_slice_group_is_being_created_ends_the_wait_at_once(
    cloud: TpuEmulator, bucket_url: str, tmp_path: Path
) -> None:
    """The submitter waits for the group's VMs; `runner down` deletes the group, its template and its policy. The
    wait asks whether the group still exists: it ends now, not at max_runtime (24 h by default)."""
    cloud.compute.slow_create(3600)  # the slice's VMs stay PROVISIONING
    spec = job(tmp_path, bucket_url, "command: [python, -c, \"print('never runs')\"]\n")
    spec.write_text(
        spec.read_text().replace(
            "accelerator: {type: v2-8, zones: [us-central1-b, us-central1-c], project: test-project}",
            "accelerator: {type: tpu7x-16, zone: us-central1-c, project: test-project}",
        )
    )
    assert "tpu7x-16" in spec.read_text() and IMAGE in spec.read_text()
    proc = _start(spec)
    assert proc.stdout is not None
    said = _read_until(proc.stdout, "0/2 RUNNING")
    run_id, out, code = _down_and_finish(proc, said)
    assert code == 130, out
    assert "stopped by runner down" in out
    assert runs.load(run_id).state == "cancelled"
    wait_for(lambda: not cloud.compute.instances(), "the slice's VMs gone", timeout=60)
    cloud_state = cloud.compute.cloud
    with cloud_state.lock:
        left = [*cloud_state.groups.items, *cloud_state.templates, *cloud_state.policies]
    assert [p for p in left if run_id in p] == []


def _with_accelerator(spec: Path, accelerator: str) -> Path:
    text = spec.read_text()
    old = "accelerator: {type: v2-8, zones: [us-central1-b, us-central1-c], project: test-project}"
    assert old in text
    spec.write_text(text.replace(old, f"accelerator: {{{accelerator}, project: test-project}}"))
    return spec


def test_down_while_a_queued_resource_waits_for_capacity_cancels_the_run_at_once(
    cloud: TpuEmulator, bucket_url: str, tmp_path: Path
) -> None:
    cloud.stockout("us-central1-b")  # it waits in the queue
    spec = job(tmp_path, bucket_url, "command: [python, -c, \"print('never runs')\"]\n")
    proc = _start(_with_accelerator(spec, "type: v2-8, zone: us-central1-b, provisioning: queued"))
    assert proc.stdout is not None
    said = _read_until(proc.stdout, "WAITING_FOR_RESOURCES")
    run_id, out, code = _down_and_finish(proc, said)
    assert code == 130, out
    assert "stopped by runner down" in out and "provisioned" not in out
    assert runs.load(run_id).state == "cancelled"
    assert not cloud.queued_resources() and not cloud.nodes()


def test_down_while_a_compute_engine_instance_is_provisioning_cancels_the_run_at_once(
    cloud: TpuEmulator, bucket_url: str, tmp_path: Path
) -> None:
    cloud.compute.slow_create(3600)
    spec = job(tmp_path, bucket_url, "command: [python, -c, \"print('never runs')\"]\n")
    proc = _start(_with_accelerator(spec, "type: tpu7x-2, zone: us-central1-c"))
    assert proc.stdout is not None
    said = _read_until(proc.stdout, ": PROVISIONING")
    run_id, out, code = _down_and_finish(proc, said)
    assert code == 130, out
    assert "stopped by runner down" in out
    assert runs.load(run_id).state == "cancelled"
    wait_for(lambda: not cloud.compute.instances(), "the instance gone", timeout=60)


def test_a_node_deleted_in_the_console_while_creating_fails_the_run_saying_so(
    cloud: TpuEmulator, bucket_url: str, tmp_path: Path
) -> None:
    """Not `runner down` (the run's record says nothing of a stop): the run fails with the true reason, at once,
    not after the API's retries, and is not taken for a preemption."""
    from runner.backends.tpu_vm.api import TpuApi

    cloud.slow_create(3600, count=1)
    proc = _start(job(tmp_path, bucket_url, "command: [python, -c, \"print('never runs')\"]\n"))
    assert proc.stdout is not None
    said = _read_until(proc.stdout, ": CREATING")
    run_id = runs.list_records()[0].run_id
    TpuApi().delete_node("test-project", "us-central1-b", run_id)  # someone, in the console
    out = said + proc.stdout.read()
    assert proc.wait(120) == 5, out
    assert f"TPU node {run_id} was deleted while it was being created" in out
    assert "through every retry" not in out
    record = runs.load(run_id)
    assert record.state == "failed" and "deleted while it was being created" in (record.reason or "")
    assert not cloud.nodes()
