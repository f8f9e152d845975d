"""Queued resources and pod slices end to end: real submits through the CLI on the two emulators (the real
google-cloud-tpu client against the Cloud TPU API emulator, the real bootstrap on every worker of the emulated
slice), timings from FAST_TIMINGS."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from faults.scenario import STARTED
from runner.cli import app
from runner.storage import open_storage
from tests.cloudjobs import IMAGE, UNTIL_PREEMPTED, events, job, preempt_when, run_id_of, submit
from tests.conftest import FAST_TIMINGS

QUEUED = ", provisioning: queued"
ZONES = ("us-central1-b", "us-central1-c")


def pod_job(tmp_path: Path, bucket_url: str, body: str, name: str = "pod", extra: str = "") -> Path:
    """A v4-32 (4 hosts) in us-central2-b: `provisioning: auto` makes it a queued resource."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nimage: {IMAGE}\n"
        f"accelerator: {{type: v4-32, zone: us-central2-b, project: test-project{extra}}}\n"
        f"storage: {bucket_url}\n" + body
    )
    return path


def api_calls(cloud: Any, method: str, pattern: str) -> list[Any]:
    return [r for r in cloud.requests if r.method == method and re.search(pattern, r.path) and r.status < 300]


def timeline(output: str) -> list[str]:
    """What the runner said about its queued resources, one line each."""
    lines = [line.removeprefix("runner: ") for line in output.splitlines()]
    return [line for line in lines if line.startswith(("queued resource", "queueing"))]


def test_a_queued_resource_waits_out_a_stockout_then_runs_the_job(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    cloud.stockout(ZONES[0], count=12)  # the queue holds it in WAITING_FOR_RESOURCES for a dozen tries
    spec = job(tmp_path, bucket_url, "command: [python, -c, 'print(\"ran after the queue\")']\n", accelerator=QUEUED)
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    print("\n".join(timeline(result.output)))
    states = [re.match(r"queued resource \S+: (\S+) \((\d+)s\)", line) for line in timeline(result.output)]
    seen = [m.group(1) for m in states if m]
    assert seen[0] in ("PENDING", "CREATING", "WAITING_FOR_RESOURCES"), seen
    assert "WAITING_FOR_RESOURCES" in seen and seen.index("WAITING_FOR_RESOURCES") < seen.index("ACTIVE"), seen
    assert "ran after the queue" in result.output
    assert f"queued resource {run_id} (and any node it holds) is gone" in result.output
    (create,) = api_calls(cloud, "POST", r"/queuedResources$")
    assert create.query["queuedResourceId"] == run_id and create.path.startswith("/v2/projects/test-project/")
    assert create.body["guaranteed"] == {} and create.body["queueingPolicy"] == {"validUntilDuration": "86400s"}
    assert create.body["tpu"]["nodeSpec"][0]["nodeId"] == run_id
    assert not api_calls(cloud, "POST", r"/nodes$"), "a queued run never creates its node itself"
    (delete,) = api_calls(cloud, "DELETE", r"/queuedResources/")  # teardown: once, with force (its node goes too)
    assert delete.path.endswith(f"/queuedResources/{run_id}") and delete.query.get("force") == "true"
    assert not cloud.nodes() and not cloud.queued_resources()
    kinds = [e["event"] for e in events(f"{bucket_url}/runs/{run_id}")]
    assert kinds.index("provisioning") < kinds.index("provisioned")  # the handle was recorded before the create


def test_the_dry_run_shows_the_exact_queued_resource_request_and_calls_nothing(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    from google.cloud import tpu_v2

    spec = pod_job(tmp_path, bucket_url, "command: [python, train.py]\n", extra=", spot: true, max_wait: 45m")
    result = submit(str(spec), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "provisioning   queued resource (spot: {}), waiting up to 2700s for capacity in each zone" in result.output
    request = re.search(r"^Request: POST (\S+)\n(\{.*?^\})$", result.output, re.M | re.S)
    assert request is not None, result.output
    run_id = re.search(r"^run\s+(\S+)$", result.output, re.M).group(1)  # type: ignore[union-attr]
    assert request.group(1) == (
        f"/v2/projects/test-project/locations/us-central2-b/queuedResources?queuedResourceId={run_id}"
    )
    body = json.loads(request.group(2))
    assert body["spot"] == {} and body["queueingPolicy"] == {"validUntilDuration": "2700s"}
    node = body["tpu"]["nodeSpec"][0]["node"]
    assert node["acceleratorType"] == "v4-32" and node["metadata"]["startup-script"].endswith("bytes, shown below>")
    assert tpu_v2.QueuedResource.from_json(request.group(2)).tpu.node_spec[0].node_id == run_id  # the client's own
    assert not [r for r in cloud.requests if r.path.startswith("/v2/")], "a dry run calls no API"


def test_a_queued_resource_past_its_valid_until_fails_and_the_next_zone_is_tried(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    cloud.stockout(ZONES[0])  # until cleared: the request can only expire there
    spec = job(
        tmp_path,
        bucket_url,
        "command: [python, -c, 'print(\"ran in the second zone\")']\n",
        accelerator=QUEUED + ", spot: true, max_wait: 10s",
    )
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    print(result.output)
    # FAILED once max_wait had passed (10 s or more, however late a loaded machine read it)
    assert re.search(r"queued resource \S+: FAILED \((1\d|[2-9]\d|\d{3,})s\)", result.output), result.output
    assert "could not be provisioned before its valid-until time" in result.output  # the API's own reason
    assert f"{ZONES[0]}: FAILED after" in result.output and f"queueing in {ZONES[1]} next" in result.output
    assert "ran in the second zone" in result.output
    creates = api_calls(cloud, "POST", r"/queuedResources$")
    assert [c.path.split("/")[5] for c in creates] == list(ZONES)
    assert all(c.body["spot"] == {} and "guaranteed" not in c.body for c in creates)
    assert all(c.body["queueingPolicy"] == {"validUntilDuration": "10s"} for c in creates)
    deletes = api_calls(cloud, "DELETE", r"/queuedResources/")
    assert [d.path.split("/")[5] for d in deletes] == list(ZONES)  # the FAILED one, then the one that ran
    assert all(d.query.get("force") == "true" for d in deletes)
    assert not cloud.nodes() and not cloud.queued_resources()


def test_a_queued_resource_suspended_before_it_is_active_moves_to_the_next_zone(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    """Its node is deleted by someone else while the queued resource is PROVISIONING: it goes SUSPENDED, is deleted
    with force, and the next zone is queued."""
    from runner.backends.tpu_vm.api import TpuApi

    cloud.slow_create(600, zone=ZONES[0], count=1)  # PROVISIONING lasts: time to take its node away
    spec = job(tmp_path, bucket_url, "command: [python, -c, 'print(\"ran after all\")']\n", accelerator=QUEUED)
    taken: list[str] = []

    def delete_while_creating() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not taken:
            creating = [n for n in cloud.nodes() if n.state == "CREATING" and n.zone == ZONES[0]]
            if creating:
                taken.append(creating[0].node_id)
                TpuApi().delete_node("test-project", ZONES[0], creating[0].node_id)
            time.sleep(0.1)

    thread = threading.Thread(target=delete_while_creating, daemon=True)
    thread.start()
    result = submit(str(spec))
    thread.join(5)
    assert taken and result.exit_code == 0, result.output
    assert re.search(r"queued resource \S+: SUSPEND(ING|ED) \(\d+s\)", result.output), result.output
    moved = rf"{ZONES[0]}: SUSPEND(ING|ED) \(by USER\) before it became ACTIVE; queueing in {ZONES[1]} next"
    assert re.search(moved, result.output), result.output
    assert "ran after all" in result.output
    deletes = api_calls(cloud, "DELETE", r"/queuedResources/")
    assert [d.path.split("/")[5] for d in deletes] == list(ZONES)
    assert all(d.query.get("force") == "true" for d in deletes)
    assert not cloud.nodes() and not cloud.queued_resources()


def test_a_queued_resource_that_fails_everywhere_reports_the_apis_reason(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    cloud.queued_fails(status="FAILED_PRECONDITION", message="Reservation my-res has no room for v2-8.")
    spec = job(tmp_path, bucket_url, "command: [python, -c, 'print(1)']\n", accelerator=QUEUED + ", reserved: true")
    result = submit(str(spec))
    assert result.exit_code == 5, result.output
    assert "no queued resource for v2-8 became ACTIVE" in result.output
    assert result.output.count("Reservation my-res has no room for v2-8. (FAILED_PRECONDITION)") >= 2
    (create, _) = api_calls(cloud, "POST", r"/queuedResources$")
    assert create.body["tpu"]["nodeSpec"][0]["node"]["schedulingConfig"] == {"reserved": True}
    assert "guaranteed" not in create.body and "spot" not in create.body
    assert not cloud.nodes() and not cloud.queued_resources()
    assert "Traceback" not in result.output


def test_ctrl_c_while_queued_deletes_the_queued_resource_once_with_force(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    cloud.stockout(None)  # every zone, until cleared: it waits in the queue
    spec = job(tmp_path, bucket_url, "command: [python, -c, 'print(1)']\n", accelerator=QUEUED)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "submit", str(spec)],
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(q["state"]["state"] == "WAITING_FOR_RESOURCES" for q in cloud.queued_resources()):
            assert time.monotonic() < deadline and proc.poll() is None, "never queued"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert "queued resource" in output and "(and any node it holds) is gone" in output, output
    assert not cloud.queued_resources() and not cloud.nodes()
    (delete,) = api_calls(cloud, "DELETE", r"/queuedResources/")
    assert delete.query.get("force") == "true"


def test_a_suspended_queued_resource_is_deleted_and_created_again(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    """Its Spot node preempted while the job runs: the queued resource goes SUSPENDING/SUSPENDED (by the service),
    which is a preemption: deleted and created again (retries.preemptions), and the job runs again."""
    spec = job(
        tmp_path, bucket_url, f'command: [python, -c, "{UNTIL_PREEMPTED}"]\n', accelerator=QUEUED + ", spot: true"
    )
    thread, preempted = preempt_when(cloud, lambda _node, store: store.read_bytes(STARTED) is not None, timeout_s=60)
    result = submit(str(spec))
    thread.join(5)
    assert preempted, "the node was never preempted"
    assert result.exit_code == 0, result.output
    assert "the machine was preempted: recreating it (1/3)" in result.output
    creates = api_calls(cloud, "POST", r"/queuedResources$")
    assert len(creates) == 2 and creates[0].query["queuedResourceId"] == creates[1].query["queuedResourceId"]
    assert "tick 5" in result.output
    assert not cloud.nodes() and not cloud.queued_resources()


def test_a_pod_slice_runs_the_command_on_every_worker_and_is_deleted_once(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    env = "os.environ['RUNNER_WORKER_ID'], 'of', os.environ['RUNNER_NUM_WORKERS']"
    script = f"import os\\nprint('hello from worker', {env})"
    result = submit(str(pod_job(tmp_path, bucket_url, f'command: [python, -c, "{script}"]\n')))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    assert "queued resource" in result.output  # auto: a multi-host slice is queued
    for w in range(4):
        assert f"[worker {w}] hello from worker {w} of 4" in result.output
        assert f"bootstrap-{w}: bootstrap started" in result.output
    run_dir = f"{bucket_url}/runs/{run_id}"
    store = open_storage(run_dir)
    exits = [json.loads(store.read_bytes(f"exit/worker-{w}.json") or b"{}") for w in range(4)]
    assert [e["state"] for e in exits] == ["succeeded"] * 4
    assert {o.key for o in store.list("heartbeats/")} == {f"heartbeats/worker-{w}.json" for w in range(4)}
    assert not cloud.nodes() and not cloud.queued_resources()
    # The slice went once: the runner deleted the queued resource once, and the node (by worker 0's bootstrap,
    # once every worker had finished, or with the queued resource) at most once.
    (delete,) = api_calls(cloud, "DELETE", r"/queuedResources/")
    assert delete.query.get("force") == "true"
    assert len(api_calls(cloud, "DELETE", r"/nodes/")) <= 1

    logs = CliRunner().invoke(app, ["logs", run_id], catch_exceptions=False)
    assert [line for line in logs.output.splitlines() if "hello" in line] == [
        f"[worker {w}] hello from worker {w} of 4" for w in range(4)
    ]
    one = CliRunner().invoke(app, ["logs", run_id, "--worker", "2"], catch_exceptions=False)
    assert one.output.strip() == "hello from worker 2 of 4"
    follow = CliRunner().invoke(app, ["logs", run_id, "-f"], catch_exceptions=False)
    assert all(f"[worker {w}] hello from worker {w} of 4" in follow.output for w in range(4))


def test_one_failing_worker_ends_the_pod_run_naming_it_and_the_slice_goes(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    script = (
        "import os, sys, time\\nw = os.environ['RUNNER_WORKER_ID']\\nprint('worker', w, 'up', flush=True)\\n"
        "if w == '2':\\n    time.sleep(1); print('worker 2 breaks', flush=True); sys.exit(3)\\ntime.sleep(300)"
    )
    t0 = time.monotonic()
    result = submit(str(pod_job(tmp_path, bucket_url, f'command: [python, -c, "{script}"]\n')))
    assert result.exit_code == 6, result.output
    assert time.monotonic() - t0 < 120  # the others' 300 s were not waited for
    run_id = run_id_of(result.output)
    assert "worker 2 failed first (exit code 3): ending the run on every worker" in result.output
    assert "last output of worker 2:" in result.output and "  worker 2 breaks" in result.output
    record = json.loads((Path(os.environ["RUNNER_HOME"]) / "runs" / f"{run_id}.json").read_text())
    assert record["state"] == "failed" and record["reason"].startswith("worker 2 failed first")
    assert not cloud.nodes() and not cloud.queued_resources()
    (delete,) = api_calls(cloud, "DELETE", r"/queuedResources/")  # the whole slice, once
    assert delete.query.get("force") == "true"
    status = CliRunner().invoke(app, ["status", run_id, "--json"], catch_exceptions=False)
    assert json.loads(status.output)["state"] == "failed"


def test_a_pod_worker_that_goes_silent_ends_the_run(
    cloud, tmp_path: Path, bucket_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Worker 1's supervisor freezes (SIGSTOP, as a hung host would): its heartbeat stops while the others' go on.
    The runner ends the run on its own clock (worker_stale_s) and deletes the slice."""
    # 10 s: twenty of the VMs' heartbeats (FAST_TIMINGS), where the default cadence gave two in 20 s
    monkeypatch.setenv("RUNNER_TIMINGS", FAST_TIMINGS + ",worker_stale_s=10")
    script = (
        "import os, signal, time\\nw = os.environ['RUNNER_WORKER_ID']\\nprint('worker', w, 'up', flush=True)\\n"
        "time.sleep(2)\\nif w == '1':\\n    os.kill(os.getppid(), signal.SIGSTOP)\\ntime.sleep(300)"
    )
    result = submit(str(pod_job(tmp_path, bucket_url, f'command: [python, -c, "{script}"]\n', name="silent")))
    assert result.exit_code == 6, result.output
    assert "worker 1's heartbeat stopped" in result.output and "ending the run" in result.output
    run_id = run_id_of(result.output)
    record = json.loads((Path(os.environ["RUNNER_HOME"]) / "runs" / f"{run_id}.json").read_text())
    assert record["state"] == "failed" and record["reason"].startswith("worker 1's heartbeat stopped")
    assert not cloud.nodes() and not cloud.queued_resources()
    (delete,) = api_calls(cloud, "DELETE", r"/queuedResources/")  # the whole slice, once
    assert delete.query.get("force") == "true"
