"""A run directory read by what changed (runner.watch.view): each request counted by a proxy in front of a real
Cloud Storage emulator, so that what a poll costs is what a poll sends, whatever the number of hosts."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

from runner import contract
from runner.storage import Storage, open_storage
from runner.watch.follow import LogTails, Sight, follow
from runner.watch.rundir import ExitRecord, Heartbeat, Snapshot
from runner.watch.state import RunState
from runner.watch.view import RunDirView
from tpu_emulator.flaky_proxy import FlakyProxy, ProxiedRequest

HOSTS = 16


@pytest.fixture
def proxy(gcs: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlakyProxy]:
    with FlakyProxy(gcs) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        yield proxy


def beat(worker: int, phase: str = "running", at: float = 1.0) -> bytes:
    return json.dumps(Heartbeat(time=at, phase=phase, worker=worker).to_json()).encode()


def event(source: str, kind: str, at: float) -> bytes:
    return json.dumps({"time": at, "source": source, "event": kind}).encode() + b"\n"


def slice_run(store: Storage, hosts: int) -> None:
    """What a slice's hosts have written a minute into a run: each its log, events and heartbeat."""
    now = time.time()
    for w in range(hosts):
        store.write_bytes(contract.log_key(w), f"worker {w} line 1\n".encode())
        store.write_bytes(contract.events_key(f"worker-{w}"), event(f"worker-{w}", "worker_started", now))
        store.write_bytes(contract.heartbeat_key(w), beat(w))
    store.write_bytes(contract.HEARTBEAT, beat(0))


def since(proxy: FlakyProxy, count: int) -> list[ProxiedRequest]:
    return proxy.requests[count:]


def listings(requests: list[ProxiedRequest]) -> list[str]:
    """The prefixes listed."""
    return sorted(
        unquote(r.path).partition("prefix=")[2].split("&")[0].rpartition("/runs/r/")[2]
        for r in requests
        if r.method == "GET" and "/o?" in r.path
    )


def reads(requests: list[ProxiedRequest]) -> list[str]:
    """The objects read (their keys in the run directory)."""
    return sorted(
        unquote(r.path).split("?")[0].rpartition("/runs/r/")[2]
        for r in requests
        if r.method == "GET" and "alt=media" in r.path
    )


def test_a_poll_with_nothing_new_is_its_four_listings_whatever_the_number_of_hosts(proxy: FlakyProxy) -> None:
    store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r")
    slice_run(store, HOSTS)
    view = RunDirView(store, tail=LogTails(store, HOSTS), events=True)
    first = view.poll()
    view.read_streams()
    assert len(first.heartbeats) == HOSTS and first.heartbeat is not None
    events, output = view.drain()
    assert len(events) == HOSTS and output.count(b"line 1") == HOSTS
    before = len(proxy.requests)
    view.poll()
    view.read_streams()
    assert listings(since(proxy, before)) == ["events/", "exit/", "heartbeat", "logs/"]
    assert reads(since(proxy, before)) == []
    assert view.drain() == ([], b"")


def test_a_poll_reads_what_changed_and_logs_and_events_by_their_new_bytes(proxy: FlakyProxy) -> None:
    store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r")
    slice_run(store, HOSTS)
    view = RunDirView(store, tail=LogTails(store, HOSTS), events=True)
    view.poll()
    view.read_streams()
    view.drain()
    store.write_bytes(contract.log_key(3), b"worker 3 line 1\nworker 3 line 2\n")
    old = store.read_bytes(contract.events_key("worker-5")) or b""
    added = event("worker-5", "job_started", time.time())
    store.write_bytes(contract.events_key("worker-5"), old + added)
    store.write_bytes(contract.heartbeat_key(7), beat(7, at=2.0))
    record = ExitRecord(9, RunState.SUCCEEDED, 0, time.time())
    store.write_bytes(contract.exit_key(9), json.dumps(record.to_json()).encode())
    before = len(proxy.requests)
    snapshot = view.poll()
    view.read_streams()
    sent = since(proxy, before)
    assert reads(sent) == [
        "events/worker-5.jsonl",
        "exit/worker-9.json",
        "heartbeats/worker-7.json",
        "logs/worker-3.log",
    ]
    # the log from where the last read ended, the events file from the byte before (the newline it ended with)
    assert sum(r.received for r in sent if "worker-3.log" in r.path) == len(b"worker 3 line 2\n")
    assert sum(r.received for r in sent if "worker-5.jsonl" in r.path) == 1 + len(added)
    assert [e.worker for e in snapshot.exits] == [9] and snapshot.heartbeats[7].time == 2.0
    events, output = view.drain()
    assert [e.event for e in events] == ["job_started"]
    assert output == b"[worker 3] worker 3 line 2\n"


def test_an_events_file_written_anew_is_read_whole_again(tmp_path: Path) -> None:
    store = open_storage(f"{tmp_path}/run")
    store.write_bytes(contract.events_key("bootstrap-0"), event("bootstrap-0", "bootstrap_started", 1e9))
    view = RunDirView(store, events=True)
    view.poll()
    view.read_streams()
    assert [e.event for e in view.drain()[0]] == ["bootstrap_started"]
    # A recreated VM that could not fetch its file starts it over: longer than before, but not what was read.
    fresh = event("bootstrap-0", "started_over", 2e9) + event("bootstrap-0", "container_started", 2e9 + 1)
    store.write_bytes(contract.events_key("bootstrap-0"), fresh)
    view.poll()
    view.read_streams()
    assert [e.event for e in view.drain()[0]] == ["started_over", "container_started"]


def test_a_running_worker_s_heartbeat_is_read_again_only_as_often_as_asked(proxy: FlakyProxy) -> None:
    """That a heartbeat changed is in its listing (heartbeats_at, the storage's clock): its content is read again
    only every beats_every_s once its worker runs, and at once while it starts."""
    store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r")
    store.write_bytes(contract.heartbeat_key(1), beat(1, phase="starting"))
    view = RunDirView(store, beats_every_s=3600)
    assert view.poll().heartbeats[1].phase == "starting"
    store.write_bytes(contract.heartbeat_key(1), beat(1, at=2.0))
    first = view.poll()
    assert first.heartbeats[1].phase == "running"  # it was starting: read at once
    store.write_bytes(contract.heartbeat_key(1), beat(1, at=3.0))
    before = len(proxy.requests)
    second = view.poll()
    assert reads(since(proxy, before)) == []
    assert second.heartbeats[1].time == 2.0  # what was read, not read again
    assert second.heartbeats_at[1] > first.heartbeats_at[1]  # and yet a new beat, by the listing


def test_a_slow_poll_does_not_keep_the_runner_s_own_judgements_waiting(proxy: FlakyProxy) -> None:
    """While a poll waits on storage (its listing of exit/ held back), `stop` judges the last snapshot every interval:
    a deadline or the API's word on the machine ends the following before the held answer comes."""
    store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r", patience_s=4)  # the held poll gives up soon
    store.write_bytes(contract.log_key(0), b"hello\n")
    proxy.slow_answers(r"prefix=[^&]*/exit/", 60)
    judged: list[Snapshot] = []
    last = follow(
        store,
        lambda _: None,
        interval_s=0.1,
        sight=Sight(None, 0.1),
        stop=lambda snap: judged.append(snap) or len(judged) >= 3,
        judge_blind=True,
    )
    assert len(judged) == 3 and last.exits == []
    assert not any("/exit/" in unquote(r.path) for r in proxy.requests if "prefix=" in r.path)  # still held


def test_following_ends_on_the_poll_that_lists_every_exit_record_and_leaves_the_rest_to_read_after(
    proxy: FlakyProxy,
) -> None:
    store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r")
    slice_run(store, 4)
    for w in range(4):
        record = ExitRecord(w, RunState.SUCCEEDED, 0, 1.0)
        store.write_bytes(contract.exit_key(w), json.dumps(record.to_json()).encode())
    tails = LogTails(store, 4)
    view = RunDirView(store, tail=tails, events=True)
    shown: list[bytes] = []
    last = follow(store, shown.append, num_workers=4, interval_s=0.1, tail=tails, view=view, last_read=False)
    assert [e.worker for e in last.exits] == [0, 1, 2, 3]
    view.read_streams(flush=True)  # after the verdict: what following did not show, once
    output = b"".join(shown) + view.drain()[1]
    assert sorted(output.splitlines()) == [f"[worker {w}] worker {w} line 1".encode() for w in range(4)]
