"""Reading a run directory when storage is out of reach, and when the machines' clocks disagree: an unreadable run
directory is "unknown" (followed with backoff, said), a missing bucket a definite end; which records belong to the
current attempt is decided by the storage's clock, never a VM's; events from machines whose clocks are off are put
on one clock before anything is measured across them."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from runner.errors import BucketMissing
from runner.storage import open_storage
from runner.watch.events import read_events
from runner.watch.follow import Sight, follow
from runner.watch.rundir import ExitRecord, read_snapshot
from runner.watch.state import RunState
from tests.waiting import wait_for
from tpu_emulator.flaky_proxy import FlakyProxy


def exit_record(finished_at: float) -> bytes:
    return json.dumps(ExitRecord(0, RunState.SUCCEEDED, 0, finished_at, finished_at - 5).to_json()).encode()


def test_following_through_an_outage_waits_says_so_and_ends_on_the_exit_record(
    gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FlakyProxy(gcs) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        url = f"gs://runner-test/{uuid.uuid4().hex}/runs/r"
        store = open_storage(url, patience_s=2)
        store.write_bytes("logs/worker-0.log", b"before\n")
        proxy.outage("blackhole")  # until the follower has said so: however late a loaded machine starts it
        writer = open_storage(url, patience_s=30)  # the machine: it writes once the outage is over
        said: list[str] = []

        def finish_after_outage() -> None:
            wait_for(lambda: any("unknown" in s for s in said), "the follower to say the state is unknown")
            proxy.heal()
            writer.write_bytes("logs/worker-0.log", b"before\nafter\n")
            writer.write_bytes("exit/worker-0.json", exit_record(time.time()))

        threading.Thread(target=finish_after_outage, daemon=True).start()
        output: list[bytes] = []
        stops: list[int] = []
        last = follow(
            store,
            output.append,
            interval_s=0.2,
            sight=Sight(said.append, 0.2),
            stop=lambda s: stops.append(1) and False,
        )
    assert [e.state for e in last.exits] == [RunState.SUCCEEDED]
    assert b"".join(output) == b"before\nafter\n"
    assert any("The run's state is unknown, not over" in s for s in said)
    assert any(s.startswith("the run directory can be read again") for s in said)


def test_a_follower_that_judges_while_blind_is_asked_about_the_last_snapshot(
    gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FlakyProxy(gcs) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r", patience_s=1)
        store.write_bytes("run.json", b"{}")
        proxy.outage("reset")
        asked: list[int] = []
        # the runner's watchdog: its deadlines and the API's word do not wait for storage
        follow(store, lambda _: None, interval_s=0.1, stop=lambda s: asked.append(len(s.exits)) or len(asked) >= 3,
               judge_blind=True)  # fmt: skip
        assert asked == [0, 0, 0]


def test_a_deleted_bucket_ends_following(gcs: str) -> None:
    from google.cloud import storage as gcs_client

    name = f"gone-{uuid.uuid4().hex[:8]}"
    gcs_client.Client().create_bucket(name)
    store = open_storage(f"gs://{name}/runs/r")
    store.write_bytes("run.json", b"{}")
    bucket = gcs_client.Client().bucket(name)
    for blob in list(bucket.list_blobs()):
        blob.delete()
    bucket.delete()
    with pytest.raises(BucketMissing):
        follow(store, lambda _: None, interval_s=0.1)


def test_the_current_attempt_is_told_by_the_storage_clock_not_the_vm_s(tmp_path: Path) -> None:
    store = open_storage(str(tmp_path / "run"))
    store.write_bytes("exit/worker-0.json", exit_record(time.time()))
    stale = tmp_path / "run" / "exit" / "worker-0.json"
    os.utime(stale, (time.time() - 60, time.time() - 60))  # stored a minute before this attempt began
    since = time.time()
    assert read_snapshot(store, since=since).exits == []
    # The new machine's clock is ten minutes behind: what it writes says so, and it is still the current attempt's.
    store.write_bytes("exit/worker-0.json", exit_record(time.time() - 600))
    store.write_bytes("heartbeats/worker-0.json", json.dumps({"time": time.time() - 600, "worker": 0}).encode())
    snapshot = read_snapshot(store, since=since)
    assert [e.state for e in snapshot.exits] == [RunState.SUCCEEDED] and list(snapshot.heartbeats) == [0]


def test_events_of_machines_whose_clocks_are_off_are_put_on_one_clock(tmp_path: Path) -> None:
    run = tmp_path / "run" / "events"
    run.mkdir(parents=True)
    now = time.time()

    def events(name: str, skew: float, *kinds: tuple[float, str], mirrored_late: float = 0.0) -> None:
        path = run / f"{name}.jsonl"
        path.write_text(
            "".join(json.dumps({"time": now + t + skew, "source": name, "event": k}) + "\n" for t, k in kinds)
        )
        stored = now + kinds[-1][0] + mirrored_late  # uploaded as the last event was added (the worker's: later)
        os.utime(path, (stored, stored))

    events("runner", 0.0, (0, "submitted"), (2, "provisioned"), (30, "teardown_requested"))
    events("bootstrap-0", 3600.0, (3, "bootstrap_started"), (20, "container_exited"), (21, "delete_requested"))
    events("worker-0", 3600.0, (5, "worker_started"), (19, "worker_exited"), mirrored_late=4.0)
    read = {e.event: e.time - now for e in read_events(open_storage(str(tmp_path / "run")), one_clock=True)}
    assert read == pytest.approx(
        {"submitted": 0, "provisioned": 2, "bootstrap_started": 3, "worker_started": 5, "worker_exited": 19,
         "container_exited": 20, "delete_requested": 21, "teardown_requested": 30}, abs=0.01
    )  # fmt: skip
    as_written = {e.event: e.time - now for e in read_events(open_storage(str(tmp_path / "run")))}
    assert as_written["delete_requested"] == pytest.approx(3621, abs=0.01)  # followers dedupe on what was written
