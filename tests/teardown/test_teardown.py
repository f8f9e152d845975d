"""`runner gc` and `runner down` against the Cloud TPU API emulator: only orphans go, attached or foreign stay."""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner.backends.tpu_vm.api import TpuApi
from runner.cli import app
from runner.storage import open_storage
from tests.conftest import FAST_TIMINGS, REPO
from tests.waiting import wait_for
from tpu_emulator.flaky_proxy import FlakyProxy

PROJECT, ZONE = "test-project", "us-central1-b"
IMAGE = "us-central1-docker.pkg.dev/test-project/runner/trainer:test"


@pytest.fixture
def api(tpu_emulator, gcs: str, monkeypatch: pytest.MonkeyPatch) -> TpuApi:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RUNNER_TPU_ENDPOINT", tpu_emulator.endpoint)
    monkeypatch.setenv("RUNNER_COMPUTE_ENDPOINT", tpu_emulator.endpoint)  # runner gc sweeps Compute Engine too
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


def test_gc_deletes_only_orphans(api: TpuApi, tpu_emulator, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    managed = {"managed-by": "tpu-runner"}
    now = int(time.time())
    # A job is lost when Cloud Storage has stored no heartbeat of it for sweep_stale_heartbeat_s by the API's clock
    # (8 s here): whatever time the VM wrote into it (an hour ahead, for the busy one) says nothing.
    monkeypatch.setenv("RUNNER_TIMINGS", FAST_TIMINGS + ",sweep_stale_heartbeat_s=8")
    finished = run_dir_with({"run.json": b'{"num_workers": 1}', "exit/worker-0.json": b'{"state": "succeeded"}'})
    stale = run_dir_with({"run.json": b'{"num_workers": 1}', "heartbeat": json.dumps({"time": now}).encode()})
    stored = time.monotonic()
    busy = run_dir_with({"run.json": b'{"num_workers": 1}'})
    make_node(api, "past-deadline", labels={**managed, "tpu-runner-run": "a", "tpu-runner-deadline": str(now - 60)})
    make_node(api, "run-finished", labels={**managed, "tpu-runner-run": "b"}, run_dir=finished)
    make_node(api, "still-training", labels={**managed, "tpu-runner-run": "c"}, run_dir=busy)
    make_node(api, "lost-job", labels={**managed, "tpu-runner-run": "d"}, run_dir=stale)
    make_node(api, "preempted", labels={**managed, "tpu-runner-run": "e"})
    make_node(api, "someone-elses", labels={"team": "research"})
    time.sleep(max(0.0, stored + 10 - time.monotonic()))
    # The busy job beats on while gc looks (as a live job does, every few seconds), however long each gc takes.
    beating = threading.Event()

    def beat() -> None:
        while not beating.is_set():
            open_storage(busy).write_bytes("heartbeat", json.dumps({"time": now + 3600}).encode())
            beating.wait(0.5)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        wait_for(lambda: open_storage(busy).read_bytes("heartbeat"), "the busy job's first heartbeat")
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
    finally:
        beating.set()
        beater.join(10)
    wait_for(lambda: len(tpu_emulator.nodes()) <= 2, "the orphans to go", 20)
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


def detached(tmp_path: Path, seconds: int = 300) -> str:
    """A run started with --detach whose job works for `seconds`; its run id."""
    spec = tmp_path / "long.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: long
        image: {IMAGE}
        command: [python, -c, "import time; print('working', flush=True); time.sleep({seconds})"]
        accelerator: {{type: v2-8, zone: {ZONE}, project: {PROJECT}}}
        storage: gs://runner-test/{uuid.uuid4().hex[:8]}
        """)
    )
    started = CliRunner().invoke(app, ["submit", str(spec), "--detach"], catch_exceptions=False)
    assert started.exit_code == 0, started.output
    return re.search(r"started (\S+) in the background", started.output).group(1)  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["reset", "blackhole"])
def test_down_deletes_from_the_run_record_alone_when_storage_is_out_of_reach(  # type: ignore[no-untyped-def]
    api: TpuApi, tpu_emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gcs: str, mode: str
) -> None:
    """Nothing but the API and the local record: the DELETE goes first, and the run directory that cannot be told
    is said after it (exit 4), never instead of it."""
    with FlakyProxy(gcs) as proxy:  # the runner's way to Cloud Storage; the VM's is its own
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        monkeypatch.setenv("RUNNER_TIMINGS", FAST_TIMINGS + ",storage_patience_s=3")
        run_id = detached(tmp_path)
        proxy.outage(mode)  # type: ignore[arg-type]
        t0 = time.time()
        down = CliRunner().invoke(app, ["down", run_id], catch_exceptions=False)
        deletes = [r.time for r in tpu_emulator.requests if r.method == "DELETE" and r.time >= t0]
        reads = [r.time for r in proxy.requests if r.time >= t0]  # what `down` asked of Cloud Storage
        assert down.exit_code == 4, down.output
        assert deletes and all(deletes[0] < t for t in reads), (deletes, reads)  # before any storage access
        assert f"TPU node {run_id} is gone" in down.output
        assert f"{run_id} is down, but its run directory could not be told so" in down.output
        assert not tpu_emulator.nodes()
        proxy.heal()
        status = CliRunner().invoke(app, ["status", run_id, "--json"], catch_exceptions=False)
        assert json.loads(status.output)["state"] == "cancelled"


def test_down_exits_non_zero_while_the_node_is_not_confirmed_gone(  # type: ignore[no-untyped-def]
    api: TpuApi, tpu_emulator, tmp_path: Path
) -> None:
    """A node stuck DELETING and the wait interrupted: `down` says it may still bill and exits 5; the run is marked
    as still billing (`+`, the node, the retry) until a later `down` confirms it gone."""
    import os
    import signal
    import subprocess
    import sys

    run_id = detached(tmp_path)
    tpu_emulator.slow_delete(30)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "down", run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "deleting TPU node" in line:
            proc.send_signal(signal.SIGINT)
            break
    out = proc.stdout.read()
    assert proc.wait(60) == 5, out
    assert "may still bill" in out and "is down" not in out
    listed = json.loads(CliRunner().invoke(app, ["list", "--json"], catch_exceptions=False).output)["runs"][0]
    assert listed["cost_cell"].endswith("+") and run_id in listed["still_billing"]
    assert f"runner down {run_id}" in listed["still_billing"]
    tpu_emulator.advance(30)  # the slow deletion's time has come
    wait_for(lambda: not tpu_emulator.nodes(), "the node to be gone")
    again = CliRunner().invoke(app, ["down", run_id], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    listed = json.loads(CliRunner().invoke(app, ["list", "--json"], catch_exceptions=False).output)["runs"][0]
    assert listed["still_billing"] is None


def test_gc_sweeps_every_zone_it_can_and_reports_the_one_it_cannot(api: TpuApi, tpu_emulator, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A 500 that never clears is retried for the whole deadline (120 s by default) before the zone is skipped.
    monkeypatch.setenv("RUNNER_TIMINGS", FAST_TIMINGS + ",api_retry_deadline_s=3")
    old = {"managed-by": "tpu-runner", "tpu-runner-deadline": str(int(time.time()) - 60)}
    zones = ["us-central1-b", "us-central1-c", "europe-west4-a"]
    for i, zone in enumerate(zones):
        tpu_emulator.create_node_direct(PROJECT, zone, f"old-{i}", labels=old)
    for status in (500, 404):  # a zone the project may not use, a server error: the others are swept all the same
        tpu_emulator.http_errors(status, None, method="GET", path=r"/locations/us-central1-c/")
        swept = CliRunner().invoke(app, ["gc", "--project", PROJECT, *(f"--zone={z}" for z in zones)])
        tpu_emulator.clear_faults("http")
        assert swept.exit_code == 5, swept.output
        assert re.search(r"could not list us-central1-c: .*; skipped it, swept the others", swept.output)
        assert "1 zone(s) could not be listed (us-central1-c)" in swept.output
    assert sorted(n.node_id for n in tpu_emulator.nodes()) == ["old-1"]


def test_gc_judges_liveness_on_the_apis_clock_not_its_own(api: TpuApi, tpu_emulator) -> None:  # type: ignore[no-untyped-def]
    """A runner whose clock is 15 minutes ahead: a job that stored its heartbeat a moment ago is in use."""
    import os
    import subprocess
    import sys

    from tpu_emulator.vm import CLOCK_SKEW

    busy = run_dir_with({"run.json": b'{"num_workers": 1}', "heartbeat": json.dumps({"time": time.time()}).encode()})
    make_node(api, "busy", labels={"managed-by": "tpu-runner", "tpu-runner-run": "c"}, run_dir=busy)
    ahead = {  # this machine's Python, its clock 15 min ahead (the emulator's skewed-VM sitecustomize)
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tpu_emulator.launcher.python_dir), str(REPO)]),
        CLOCK_SKEW: "900",
    }
    done = subprocess.run(
        [sys.executable, "-m", "runner.cli", "gc", "--project", PROJECT, "--zone", ZONE, "--dry-run"],
        env=ahead,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"node busy\s+.*in use: kept", done.stdout), done.stdout
    skewed = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"], env=ahead, capture_output=True, text=True
    )
    assert float(skewed.stdout) - time.time() > 890  # the clock really was ahead
