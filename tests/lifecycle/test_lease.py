"""The run's lease (runner.lifecycle.lease) on both storages: one holder at a time, the second refused naming who
holds it; two takers at the same moment (made to race by a barrier, not by luck): exactly one wins; a holder that
died is taken over, known by its pid on this host or by the storage's clock anywhere; a holder taken over knows it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from runner import contract
from runner.errors import RunBusy
from runner.lifecycle.lease import Holder, Lease
from runner.storage import ObjectInfo, Storage, open_storage
from runner.timings import Timings
from tests.conftest import REPO
from tests.waiting import wait_for
from tpu_emulator.gcs import StorageServer

LONG = Timings(lease_refresh_s=3600, lease_ttl_s=3600)  # nothing expires on its own during a test


@pytest.fixture(params=["local", "gcs"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return open_storage(str(tmp_path / "runs" / "r"))
    request.getfixturevalue("gcs")
    return open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r")


def test_a_second_taker_is_refused_naming_the_holder_until_it_releases(storage: Storage) -> None:
    said: list[str] = []
    first = Lease.take(storage, "r", command="submit", timings=LONG, say=said.append)
    with pytest.raises(RunBusy) as busy:
        Lease.take(storage, "r", command="resume", timings=LONG, say=said.append)
    message = busy.value.message
    assert f"`runner submit` on {socket.gethostname()} (pid {first.holder.pid}) since " in message
    assert busy.value.exit_code == 2 and "runner down r" in (busy.value.hint or "")
    first.release()
    second = Lease.take(storage, "r", command="resume", timings=LONG, say=said.append)
    assert second.holder.command == "resume" and said == []  # a released lease is free: nothing to say
    second.release()


class _Barrier:
    """The storage, whose conditional writes wait for each other (two takers that have both read the lease)."""

    def __init__(self, inner: Storage, parties: int) -> None:
        self.inner = inner
        self.barrier = threading.Barrier(parties, timeout=60)
        self.left = parties  # the first `parties` writes of the lease wait; later ones (a release) do not
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def write_if(self, key: str, data: bytes, *, generation: int) -> ObjectInfo:
        with self.lock:
            wait, self.left = self.left > 0 and key == contract.OWNER, self.left - 1
        if wait:
            self.barrier.wait()
        return self.inner.write_if(key, data, generation=generation)


def test_two_takers_at_the_same_moment_exactly_one_wins(storage: Storage, request: pytest.FixtureRequest) -> None:
    """Both read the lease free, both write it: the storage lets one through, the other is told who won. On Cloud
    Storage the emulator's barrier holds both requests until both are in flight; on a local disk a barrier before
    the write holds both takers there."""
    if storage.is_local:
        racing: Storage = _Barrier(storage, 2)  # type: ignore[assignment]
    else:
        server: StorageServer = request.getfixturevalue("storage_emulator")
        hold = server.hold_writes(r"runs/r/owner\.json", parties=2)
        racing = storage
    won: list[Lease] = []
    refused: list[RunBusy] = []

    def take(command: str) -> None:
        try:
            won.append(Lease.take(racing, "r", command=command, timings=LONG, say=lambda _: None))
        except RunBusy as exc:
            refused.append(exc)

    threads = [threading.Thread(target=take, args=(c,)) for c in ("resume", "resume")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    if not storage.is_local:
        assert hold.arrived == 2
    assert len(won) == 1 and len(refused) == 1
    assert "at the same moment" in refused[0].message and f"(pid {won[0].holder.pid})" in refused[0].message
    won[0].release()


def test_a_holder_whose_process_is_gone_is_taken_over_at_once(storage: Storage, tmp_path: Path) -> None:
    """Another process on this host took the lease and died without releasing it (SIGKILL): no process has its
    pid, so the run is free now, not after the ttl."""
    script = (
        "import os, sys; from runner.lifecycle.lease import Lease; from runner.storage import open_storage; "
        "from runner.timings import Timings; "
        "Lease.take(open_storage(sys.argv[1]), 'r', command='submit', timings=Timings(lease_refresh_s=3600)); "
        "os._exit(9)"
    )
    done = subprocess.run([sys.executable, "-c", script, storage.url], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    said: list[str] = []
    lease = Lease.take(storage, "r", command="resume", timings=LONG, say=said.append)
    assert said and "no process has its pid any more" in said[0]
    lease.release()


def test_a_holder_elsewhere_is_taken_over_once_the_storage_stored_no_refresh_for_the_ttl(storage: Storage) -> None:
    """On another host only the lease's own refreshes, as the storage stored them, tell that its holder lives."""
    elsewhere = Holder("t0", "another-host", 4242, "submit")
    storage.write_if(contract.OWNER, elsewhere.encode(0), generation=0)
    with pytest.raises(RunBusy) as busy:
        Lease.take(storage, "r", command="resume", timings=LONG, say=lambda _: None)
    assert "on another-host (pid 4242)" in busy.value.message and "refreshed" in busy.value.message
    said: list[str] = []
    short = Timings(lease_refresh_s=3600, lease_ttl_s=0.5)

    def taken() -> Lease | None:
        try:
            return Lease.take(storage, "r", command="resume", timings=short, say=said.append)
        except RunBusy:
            return None

    lease = wait_for(taken, "the storage's clock to pass the lease's ttl", timeout=60, poll_s=0.2)
    assert "last refreshed" in said[-1] and "another-host" in said[-1]
    lease.release()


def test_a_holder_taken_over_finds_out_at_its_next_refresh(storage: Storage) -> None:
    said: list[str] = []
    first = Lease.take(storage, "r", command="submit", timings=LONG, say=said.append)
    first.refresh()
    assert not first.lost.is_set()
    found = storage.read_versioned(contract.OWNER)
    assert found is not None
    doc = json.loads(found[0])
    assert doc["beat"] == 1 and doc["since"] and not doc["released"]
    # Another runner judged it dead and took it over (a rewrite at the generation it read).
    storage.write_if(contract.OWNER, Holder("t1", "h", 1, "resume").encode(0), generation=found[1].generation or 0)
    first.refresh()
    assert first.lost.is_set() and "took run r over" in said[-1]
    first.release()  # a lease it no longer holds is left alone
    assert json.loads(storage.read_bytes(contract.OWNER) or b"{}")["token"] == "t1"
