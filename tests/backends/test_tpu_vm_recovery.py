"""What the runner created, against a world it did not write: name collisions, failing deletes, silent VMs, a runner
killed while creating, API errors while polling operations. The real google-cloud-tpu client and the real bootstrap
on the emulators; each test states the promise it holds the runner to."""

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

import pytest
from typer.testing import CliRunner

from runner.backends.tpu_vm.backend import TpuVmBackend
from runner.backends.tpu_vm.handles import NodeHandle
from runner.cli import app
from runner.errors import BackendError
from runner.interrupts import hurry
from runner.storage import open_storage
from runner.timings import Timings
from tests.cloudjobs import events, job, run_id_of, submit
from tests.waiting import wait_for

QUICK = "command: [python, -c, 'print(\"done on the vm\")']\n"
ZONE, OTHER_ZONE, PROJECT = "us-central1-b", "us-central1-c", "test-project"
FAST = Timings(api_poll_s=0.1, api_retry_initial_s=0.1)


def test_a_name_collision_never_deletes_the_other_runs_node(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    cloud.collision(ZONE)
    result = submit(str(job(tmp_path, bucket_url, QUICK)))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    assert f"TPU node {run_id} exists already (run another-run)" in result.output
    assert "done on the vm" in result.output
    (theirs,) = cloud.nodes()  # ours was created under a new name, ran, and is gone; theirs is untouched
    assert theirs.node_id == run_id and theirs.state == "READY" and theirs.labels["tpu-runner-run"] == "another-run"
    deletes = [r.path for r in cloud.requests if r.method == "DELETE"]
    assert deletes and all(not p.endswith(f"/nodes/{run_id}") for p in deletes), deletes


def test_a_silent_vm_is_replaced_once_then_the_run_fails_with_the_reason(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    # Two independent runs, a zone each, at the same time (each waits out boot_timeout, at least 10 s, per silent
    # VM): in us-central1-b the first VM is silent and the second runs the job; in us-central1-c every VM is silent.
    cloud.boot_hang(ZONE, count=1)
    cloud.boot_hang(OTHER_ZONE)
    body = QUICK + "teardown: {boot_timeout: 10}\n"
    spec, hopeless = job(tmp_path, bucket_url, body, name="once"), job(tmp_path, bucket_url, body, name="never")
    for path, zone in ((spec, ZONE), (hopeless, OTHER_ZONE)):
        path.write_text(path.read_text().replace(f"zones: [{ZONE}, {OTHER_ZONE}]", f"zones: [{zone}]"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "submit", str(hopeless)],
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        once = submit(str(spec))
    finally:
        twice_output, _ = proc.communicate(timeout=180)
    assert once.exit_code == 0, once.output
    assert "without a word from its startup script" in once.output and "creating it once more" in once.output
    assert "journalctl -u google-startup-scripts" in once.output  # where to look on a real VM
    assert "done on the vm" in once.output

    assert proc.returncode == 6, twice_output
    assert "reason" in twice_output and "teardown.boot_timeout" in twice_output
    assert "Traceback" not in twice_output
    assert not cloud.nodes(), "a silent VM was left billing"
    kinds = [e["event"] for e in events(f"{bucket_url}/runs/{run_id_of(twice_output)}")]
    assert kinds.count("boot_timeout") == 2 and kinds.count("provisioned") == 2


def test_delete_operations_are_read_and_retried_or_reported(cloud) -> None:  # type: ignore[no-untyped-def]
    backend = TpuVmBackend(say=lambda s: None, timings=FAST, delete_timeout_s=30)
    cloud.create_node_direct(PROJECT, ZONE, "flaky", labels={"managed-by": "tpu-runner"})
    cloud.delete_fails(ZONE, count=1, message="Internal error.")  # transient: asked again
    backend.teardown(NodeHandle(PROJECT, ZONE, "flaky"))
    assert cloud.node("flaky") is None

    cloud.create_node_direct(PROJECT, ZONE, "stuck", labels={"managed-by": "tpu-runner"})
    cloud.delete_fails(ZONE, status="FAILED_PRECONDITION", message="The node cannot be deleted now.")
    t0 = time.monotonic()
    with pytest.raises(BackendError) as caught:
        backend.teardown(NodeHandle(PROJECT, ZONE, "stuck"))
    assert time.monotonic() - t0 < 15, "a failed delete was waited on instead of read"
    assert "cannot be deleted now" in caught.value.message and "still there" in caught.value.message
    assert "gcloud compute tpus tpu-vm delete stuck" in (caught.value.hint or "")


def test_a_second_interrupt_stops_waiting_and_says_what_is_left(cloud) -> None:  # type: ignore[no-untyped-def]
    said: list[str] = []
    backend = TpuVmBackend(say=said.append, timings=FAST, delete_timeout_s=600)
    cloud.create_node_direct(PROJECT, ZONE, "slow-to-go", labels={"managed-by": "tpu-runner"})
    cloud.slow_delete(120, zone=ZONE)
    hurry.set()  # as the second Ctrl-C during teardown does
    try:
        t0 = time.monotonic()
        backend.teardown(NodeHandle(PROJECT, ZONE, "slow-to-go"))
    finally:
        hurry.clear()
    assert time.monotonic() - t0 < 10
    assert cloud.node("slow-to-go").state == "DELETING"  # the request went out before the wait was cut short
    assert any("stopped waiting" in s and "gcloud compute tpus tpu-vm delete slow-to-go" in s for s in said)


@pytest.mark.parametrize(
    ("inject", "words"),
    [
        (lambda e: e.deny("tpu.operations.get"), "permission denied to read operation"),
        (lambda e: e.http_errors(404, count=None, method="GET", path="/operations/"), "not found while trying to read"),
    ],
)
def test_errors_while_polling_the_create_are_one_message(
    cloud, tmp_path: Path, bucket_url: str, inject, words: str
) -> None:  # type: ignore[no-untyped-def]
    inject(cloud)
    result = submit(str(job(tmp_path, bucket_url, QUICK)))
    assert result.exit_code == 5, result.output
    assert words in result.output and "Traceback" not in result.output
    assert "%24alt" not in result.output  # the request URL is for RUNNER_DEBUG, not for the message
    assert not cloud.nodes(), "the half-created node was left behind"


def test_rate_limits_while_polling_are_retried(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    cloud.rate_limit(count=2, method="GET", path="/operations/")
    result = submit(str(job(tmp_path, bucket_url, QUICK)))
    assert result.exit_code == 0, result.output
    assert sum(r.status == 429 for r in cloud.requests) == 2


def test_runner_killed_while_creating_then_down_deletes_the_node(
    cloud, tmp_path: Path, bucket_url: str, runner_home: Path
) -> None:  # type: ignore[no-untyped-def]
    cloud.slow_create(120, zone=ZONE)
    spec = job(tmp_path, bucket_url, QUICK)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "submit", str(spec)],
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        node = wait_for(lambda: next((n for n in cloud.nodes() if n.state == "CREATING"), None), what="CREATING")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    (record,) = [json.loads(p.read_text()) for p in (runner_home / "runs").glob("*.json")]
    assert record["handle"]["node_id"] == node.node_id and record["handle"]["zone"] == ZONE
    run_info = json.loads(open_storage(record["run_dir"]).read_bytes("run.json") or b"{}")
    assert run_info["handle"]["node_id"] == node.node_id  # in the run directory too, for another machine's `down`
    down = CliRunner().invoke(app, ["down", record["run_id"]], catch_exceptions=False)
    assert down.exit_code == 0, down.output
    assert not cloud.nodes()
    status = CliRunner().invoke(app, ["status", record["run_id"], "--json"], catch_exceptions=False)
    assert json.loads(status.output)["state"] == "cancelled"


def test_gc_tries_every_orphan_and_reports_each(cloud) -> None:  # type: ignore[no-untyped-def]
    past = {"managed-by": "tpu-runner", "tpu-runner-deadline": str(int(time.time()) - 60)}
    for name in ("old-a", "old-b", "old-c"):
        cloud.create_node_direct(PROJECT, ZONE, name, labels=past)
    cloud.deny("tpu.nodes.delete", count=1)  # the first delete request is refused
    result = CliRunner().invoke(app, ["gc", "--project", PROJECT, "--zone", ZONE], catch_exceptions=False)
    assert result.exit_code == 5, result.output
    assert result.output.count("could not delete node") == 1 and result.output.count("deleted node") == 2
    assert "1 of 3 deletion(s) failed" in result.output
    assert len(cloud.nodes()) == 1


def test_states_the_api_gives_a_node_are_shown_and_a_stopped_node_ends_the_run_lost(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    """REPAIRING, HIDDEN, UNKNOWN: shown while the run is followed, and the job goes on. STOPPING then STOPPED
    (someone stopped the node): the run is lost, saying why in the API's word of the moment, and the node is
    deleted."""
    import threading

    tick = "import time\\nfor i in range(120): print('tick', i, flush=True); time.sleep(0.5)"
    body = f'command: [python, -c, "{tick}"]\n'
    spec = job(tmp_path, bucket_url, body)

    def meddle() -> None:
        node = wait_for(lambda: next((n.node_id for n in cloud.nodes() if n.state == "READY"), None), what="READY")
        run_dir = open_storage(cloud.node(node).metadata["tpu-runner-run-dir"])
        wait_for(lambda: run_dir.read_bytes("heartbeat"), what="the job's heartbeat", timeout=60)
        for state in ("REPAIRING", "HIDDEN", "UNKNOWN"):
            # Each state lasts until the runner has read the node in it (a read that arrived after the state was
            # set), however long a loaded machine stalls its follower; then the node is READY again.
            name = cloud.maintain(node, state, seconds=None)
            since = time.time()
            wait_for(
                lambda name=name, since=since: any(
                    r.method == "GET" and r.path.endswith(name) and r.time > since for r in cloud.requests
                ),
                what=f"the runner's read of the node while {state}",
            )
            cloud.end_maintenance(node)
        cloud.stop_node(node)

    thread = threading.Thread(target=meddle, daemon=True)
    thread.start()
    result = submit(str(spec))
    thread.join(5)
    assert result.exit_code == 6, result.output
    # The job did not get to its end (its own words: a bare number is also in paths, such as pytest's pytest-119).
    assert "tick 0" in result.output and "tick 119" not in result.output
    for shown in (
        "REPAIRING (Cloud TPU is repairing it; the job may be restarted on it)",
        "HIDDEN (hidden by Cloud TPU; the job does not run while it is)",
        "UNKNOWN (the API does not say what it is doing)",
    ):
        assert shown in result.output, shown
    # The runner reads the node STOPPING (for the emulator's delete_delay_s) or STOPPED: either is the true reason.
    stopped = r"was STOPP(ING|ED) before its job ended \(someone stopped it: `gcloud compute tpus tpu-vm stop`"
    assert re.search(stopped, result.output), result.output
    run_id = run_id_of(result.output)
    status = json.loads(CliRunner().invoke(app, ["status", run_id, "--json"], catch_exceptions=False).output)
    assert status["state"] == "lost"
    record = json.loads((Path(os.environ["RUNNER_HOME"]) / "runs" / f"{run_id}.json").read_text())
    assert re.search(stopped, record["reason"]) and "a stopped machine runs no job" in record["reason"]
    assert not cloud.nodes()


# A command that saves its own progress when SIGTERM comes and then exits 0, as many a hand-written loop does; a
# resumed attempt runs on to tick 20. It prints the stop grace it was given.
TICKS = """\
import json, os, signal, sys, time
from pathlib import Path
ckpt = Path(os.environ["RUNNER_CHECKPOINT_DIR"]) / "tick.json"
resumed = ckpt.exists()
tick = json.loads(ckpt.read_text())["tick"] if resumed else 0
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print(f"starting at tick {tick}, grace {os.environ['RUNNER_GRACE_S']}", flush=True)
while (tick < 20 or not resumed) and not stop:
    tick += 1
    print(f"tick {tick}", flush=True)
    time.sleep(0.2)
if stop:
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_text(json.dumps({"tick": tick}))
    print(f"SIGTERM: saved tick {tick}", flush=True)
    sys.exit(0)
print(f"done at tick {tick}", flush=True)
"""


def test_a_maintenance_notice_stops_the_job_at_once_and_the_run_goes_on_on_a_new_machine(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    """The metadata server's notice that the VM will be terminated for maintenance, while the API still calls the
    node READY: the bootstrap stops the job at once (it saves and exits 0), and the runner does not take that exit
    for the job's end: it recreates the machine, and the job goes on from what it saved."""
    script = tmp_path / "ticks.py"
    script.write_text(TICKS)
    spec = job(tmp_path, bucket_url, f"command: [python, {script}]\n")
    noticed: list[str] = []

    def notice_when_ticking() -> None:
        def ticking() -> bool:
            for node in cloud.nodes():
                run_dir = node.metadata.get("tpu-runner-run-dir")
                log = run_dir and open_storage(run_dir).read_bytes("logs/worker-0.log")
                if node.state == "READY" and log and b"tick 3\n" in log:
                    noticed.append(cloud.maintenance_notice(node.node_id))
                    return True
            return False

        wait_for(ticking, "the job ticking on its first machine", timeout=180, poll_s=0.2)

    thread = threading.Thread(target=notice_when_ticking, daemon=True)
    thread.start()
    result = submit(str(spec))
    thread.join(5)
    assert noticed, "no maintenance notice was given"
    assert result.exit_code == 0, result.output
    assert "a maintenance notice came (the job was stopped at once): recreating the machine" in result.output
    saved = re.search(r"SIGTERM: saved tick (\d+)", result.output)
    assert saved, result.output
    assert f"starting at tick {saved.group(1)}, grace 87" in result.output  # an on-demand VM's 90 s, less 3
    assert "done at tick 20" in result.output
    seen = [e["event"] for e in events(f"{bucket_url}/runs/{run_id_of(result.output)}")]
    assert "maintenance_notice" in seen and "preempted" in seen
