"""`runner gc` and `runner down` against the Cloud TPU API emulator: only orphans go, attached or foreign stay."""

from __future__ import annotations

import json
import re
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner.backends.tpu_api import TpuApi
from runner.cli import app
from runner.storage import open_storage
from tests.conftest import FAST_TIMINGS

PROJECT, ZONE = "test-project", "us-central1-b"
IMAGE = "us-central1-docker.pkg.dev/test-project/runner/trainer:test"


@pytest.fixture
def api(tpu_emulator, gcs: str, monkeypatch: pytest.MonkeyPatch) -> TpuApi:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RUNNER_TPU_ENDPOINT", tpu_emulator.endpoint)
    monkeypatch.setenv("RUNNER_REGISTRY_ENDPOINT", tpu_emulator.endpoint)
    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent")
    monkeypatch.setenv("RUNNER_TIMINGS", FAST_TIMINGS)
    return TpuApi()


def make_node(api: TpuApi, node_id: str, *, labels: dict[str, str], run_dir: str | None = None) -> None:
    body = {
        "acceleratorType": "v2-8",
        "runtimeVersion": "tpu-ubuntu2204-base",
        "labels": labels,
        "metadata": {"tpu-runner-run-dir": run_dir} if run_dir else {},
    }
    api.create_node(PROJECT, ZONE, node_id, body)
    deadline = time.monotonic() + 30
    while (node := api.get_node(PROJECT, ZONE, node_id)) is None or node.state.name != "READY":
        assert time.monotonic() < deadline, f"{node_id} never became READY"
        time.sleep(0.1)


def run_dir_with(state: dict[str, bytes]) -> str:
    url = f"gs://runner-test/{uuid.uuid4().hex[:8]}/runs/r"
    store = open_storage(url)
    for key, data in state.items():
        store.write_bytes(key, data)
    return url


def gc(*args: str) -> object:
    return CliRunner().invoke(app, ["gc", "--project", PROJECT, "--zone", ZONE, *args], catch_exceptions=False)


def test_gc_deletes_only_orphans(api: TpuApi, tpu_emulator) -> None:  # type: ignore[no-untyped-def]
    managed = {"managed-by": "tpu-runner"}
    now = int(time.time())
    finished = run_dir_with({"run.json": b'{"num_workers": 1}', "exit/worker-0.json": b'{"state": "succeeded"}'})
    busy = run_dir_with({"run.json": b'{"num_workers": 1}', "heartbeat": json.dumps({"time": now}).encode()})
    stale = run_dir_with({"run.json": b'{"num_workers": 1}', "heartbeat": json.dumps({"time": now - 3600}).encode()})
    make_node(api, "past-deadline", labels={**managed, "tpu-runner-run": "a", "tpu-runner-deadline": str(now - 60)})
    make_node(api, "run-finished", labels={**managed, "tpu-runner-run": "b"}, run_dir=finished)
    make_node(api, "still-training", labels={**managed, "tpu-runner-run": "c"}, run_dir=busy)
    make_node(api, "lost-job", labels={**managed, "tpu-runner-run": "d"}, run_dir=stale)
    make_node(api, "preempted", labels={**managed, "tpu-runner-run": "e"})
    make_node(api, "someone-elses", labels={"team": "research"})
    tpu_emulator.preempt("preempted")

    listing = gc("--dry-run")
    assert listing.exit_code == 0, listing.output
    verdicts = {m.group(1): m.group(2) for m in re.finditer(r"node (\S+)\s+.*?(ORPHANED|in use)", listing.output)}
    assert verdicts == {
        "past-deadline": "ORPHANED",
        "run-finished": "ORPHANED",
        "still-training": "in use",
        "lost-job": "ORPHANED",
        "preempted": "ORPHANED",
    }
    assert "someone-elses" not in listing.output
    assert "4 orphaned; run without --dry-run" in listing.output
    assert len(tpu_emulator.nodes()) == 6  # a dry run deletes nothing

    swept = gc()
    assert swept.exit_code == 0, swept.output
    deadline = time.monotonic() + 20
    while len(tpu_emulator.nodes()) > 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sorted(n.node_id for n in tpu_emulator.nodes()) == ["someone-elses", "still-training"]


def test_gc_without_a_zone_sweeps_every_catalog_zone(api: TpuApi, tpu_emulator) -> None:  # type: ignore[no-untyped-def]
    make_node(api, "old-run", labels={"managed-by": "tpu-runner", "tpu-runner-deadline": str(int(time.time()) - 5)})
    result = CliRunner().invoke(app, ["gc", "--project", PROJECT], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "deleted node old-run in us-central1-b" in result.output
    listed = {r.path.split("/")[5] for r in tpu_emulator.requests if r.method == "GET" and r.path.endswith("/nodes")}
    assert {"us-central1-b", "europe-west4-a", "us-east1-d"} <= listed


def test_down_stops_a_detached_run_and_deletes_its_node(api: TpuApi, tpu_emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "long.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: long
        image: {IMAGE}
        command: [python, -c, "import time; print('working', flush=True); time.sleep(300)"]
        accelerator: {{type: v2-8, zone: {ZONE}, project: {PROJECT}}}
        storage: gs://runner-test/{uuid.uuid4().hex[:8]}
        """)
    )
    started = CliRunner().invoke(app, ["submit", str(spec), "--detach"], catch_exceptions=False)
    assert started.exit_code == 0, started.output
    run_id = re.search(r"started (\S+) in the background", started.output).group(1)  # type: ignore[union-attr]
    assert [n.node_id for n in tpu_emulator.nodes()] == [run_id]
    down = CliRunner().invoke(app, ["down", run_id], catch_exceptions=False)
    assert down.exit_code == 0, down.output
    assert f"TPU node {run_id} is gone" in down.output
    assert not tpu_emulator.nodes()
    status = CliRunner().invoke(app, ["status", run_id, "--json"], catch_exceptions=False)
    assert json.loads(status.output)["state"] == "cancelled"
    again = CliRunner().invoke(app, ["down", run_id], catch_exceptions=False)
    assert again.exit_code == 0  # idempotent


def make_queued(api: TpuApi, qr_id: str, *, labels: dict[str, str], run_dir: str | None = None) -> str:
    node = {
        "acceleratorType": "v2-8",
        "runtimeVersion": "tpu-ubuntu2204-base",
        "labels": labels,
        "metadata": {"tpu-runner-run-dir": run_dir} if run_dir else {},
    }
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    body = {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": qr_id, "node": node}]}, "guaranteed": {}}
    api.create_queued_resource(PROJECT, ZONE, qr_id, body)
    return f"{parent}/queuedResources/{qr_id}"


def wait_state(api: TpuApi, name: str, state: str) -> None:
    deadline = time.monotonic() + 30
    while (qr := api.get_queued_resource(name, project=PROJECT, zone=ZONE)) is None or qr.state.state.name != state:
        assert time.monotonic() < deadline, f"{name} never became {state}"
        time.sleep(0.1)


def test_gc_deletes_leftover_queued_resources_with_force_and_never_their_nodes_alone(api: TpuApi, tpu_emulator) -> None:  # type: ignore[no-untyped-def]
    managed = {"managed-by": "tpu-runner"}
    now = int(time.time())
    busy = run_dir_with({"run.json": b'{"num_workers": 1}', "heartbeat": json.dumps({"time": now}).encode()})
    finished = run_dir_with({"run.json": b'{"num_workers": 1}', "exit/worker-0.json": b'{"state": "succeeded"}'})
    tpu_emulator.queued_fails(ZONE, count=1, status="RESOURCE_EXHAUSTED", message="No capacity for v2-8.")
    failed = make_queued(api, "qr-failed", labels={**managed, "tpu-runner-run": "a"})
    wait_state(api, failed, "FAILED")
    done = make_queued(api, "qr-done", labels={**managed, "tpu-runner-run": "b"}, run_dir=finished)
    in_use = make_queued(api, "qr-in-use", labels={**managed, "tpu-runner-run": "c"}, run_dir=busy)
    for name in (done, in_use):
        wait_state(api, name, "ACTIVE")
    tpu_emulator.stockout(ZONE)  # these two wait in the queue
    waiting = make_queued(api, "qr-waiting", labels={**managed, "tpu-runner-deadline": str(now + 3600)})
    expired = make_queued(api, "qr-expired", labels={**managed, "tpu-runner-deadline": str(now - 60)})
    make_queued(api, "qr-someone-elses", labels={"team": "research"})
    for name in (waiting, expired):
        wait_state(api, name, "WAITING_FOR_RESOURCES")

    listing = gc("--dry-run")
    assert listing.exit_code == 0, listing.output
    verdicts = dict(re.findall(r"queued resource (\S+)\s+.*?(ORPHANED|in use)", listing.output))
    assert verdicts == {
        "qr-failed": "ORPHANED",
        "qr-done": "ORPHANED",
        "qr-in-use": "in use",
        "qr-waiting": "in use",
        "qr-expired": "ORPHANED",
    }
    assert "node qr-" not in listing.output  # a queued resource's node is judged with it, never on its own
    assert "someone-elses" not in listing.output
    assert "it is FAILED: it will never provision" in listing.output

    swept = gc()
    assert swept.exit_code == 0, swept.output
    assert swept.output.count("deleted queued resource") == 3, swept.output
    left = sorted(q.name.rsplit("/", 1)[1] for q in api.list_queued_resources(PROJECT, ZONE))
    assert left == ["qr-in-use", "qr-someone-elses", "qr-waiting"]
    assert sorted(n.node_id for n in tpu_emulator.nodes()) == ["qr-in-use"]
    deletes = [r for r in tpu_emulator.requests if r.method == "DELETE"]
    assert sorted(r.path.rsplit("/", 1)[1] for r in deletes) == ["qr-done", "qr-expired", "qr-failed"]
    assert all("/queuedResources/" in r.path and r.query.get("force") == "true" for r in deletes)


def test_down_deletes_a_queued_runs_queued_resource_with_force_once(api: TpuApi, tpu_emulator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "queued.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: queued
        image: {IMAGE}
        command: [python, -c, "import time; print('working', flush=True); time.sleep(300)"]
        accelerator: {{type: v2-8, zone: {ZONE}, project: {PROJECT}, provisioning: queued}}
        storage: gs://runner-test/{uuid.uuid4().hex[:8]}
        """)
    )
    started = CliRunner().invoke(app, ["submit", str(spec), "--detach"], catch_exceptions=False)
    assert started.exit_code == 0, started.output
    run_id = re.search(r"started (\S+) in the background", started.output).group(1)  # type: ignore[union-attr]
    assert [q["name"].rsplit("/", 1)[1] for q in tpu_emulator.queued_resources()] == [run_id]
    down = CliRunner().invoke(app, ["down", run_id], catch_exceptions=False)
    assert down.exit_code == 0, down.output
    assert f"queued resource {run_id} (and any node it holds) is gone" in down.output
    assert not tpu_emulator.queued_resources() and not tpu_emulator.nodes()
    deletes = [r for r in tpu_emulator.requests if r.method == "DELETE" and r.status < 300]
    assert [(r.path.rsplit("/", 1)[1], r.query.get("force")) for r in deletes] == [(run_id, "true")]
    again = CliRunner().invoke(app, ["down", run_id], catch_exceptions=False)
    assert again.exit_code == 0  # idempotent
