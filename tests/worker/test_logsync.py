"""A worker's log reaches Cloud Storage by its new bytes only (compose), up to a cap that its last line states:
measured through a proxy that counts every byte sent, against a real Cloud Storage emulator."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import contract
from runner.storage import open_storage
from runner.worker.logsync import cap_note
from runner.worker.mirror import Mirror
from tpu_emulator.flaky_proxy import FlakyProxy

LOG = contract.log_key(0)


@pytest.fixture
def proxy(gcs: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlakyProxy]:
    with FlakyProxy(gcs) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        yield proxy


def sent(proxy: FlakyProxy) -> int:
    """Bytes uploaded for the log (the object, and the parts composed onto it)."""
    return sum(r.size for r in proxy.requests if r.method in ("POST", "PUT") and LOG in (r.object_name or ""))


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        f.write(data)


def test_each_push_sends_only_the_new_bytes_and_readers_see_the_whole_log(proxy: FlakyProxy, tmp_path: Path) -> None:
    store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r")
    mirror = Mirror(tmp_path / "out", store)
    log = tmp_path / "out" / LOG
    written = b""
    for tick in range(20):  # 20 pushes of 100 KB each: a whole-file upload would send 21 MB
        chunk = b"".join(b"%08d %s\n" % (tick * 1000 + i, b"x" * 90) for i in range(1000))
        write(log, chunk)
        written += chunk
        mirror.push()
        # a follower's ranged read picks up exactly the new bytes, as it always did
        assert store.read_bytes(LOG, start=len(written) - len(chunk)) == chunk
    assert store.read_bytes(LOG) == written
    assert len(written) <= sent(proxy) <= 1.05 * len(written)  # the multipart envelopes on top, nothing more


def test_a_push_with_nothing_new_sends_nothing(proxy: FlakyProxy, tmp_path: Path) -> None:
    """No upload and no compose when the log gained nothing, even when its file was touched."""
    store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r")
    mirror = Mirror(tmp_path / "out", store)
    log = tmp_path / "out" / LOG
    write(log, b"one line\n")
    mirror.push()
    write(log, b"a second\n")
    mirror.push()
    before = len(proxy.requests)
    mirror.push()
    os.utime(log, (time.time() + 5, time.time() + 5))  # its mtime moved, its bytes did not
    mirror.push()
    assert proxy.requests[before:] == []
    assert store.read_bytes(LOG) == b"one line\na second\n"


def test_a_restarted_worker_appends_to_the_log_it_pulled(proxy: FlakyProxy, tmp_path: Path) -> None:
    url = f"gs://runner-test/{uuid.uuid4().hex}/runs/r"
    first = Mirror(tmp_path / "vm1", open_storage(url))
    write(tmp_path / "vm1" / LOG, b"first VM\n")
    first.push()
    second = Mirror(tmp_path / "vm2", open_storage(url))
    assert LOG in second.pull_resume_state(0)
    before = sent(proxy)
    write(tmp_path / "vm2" / LOG, b"second VM\n")
    second.push()
    assert open_storage(url).read_bytes(LOG) == b"first VM\nsecond VM\n"
    assert sent(proxy) - before < 1000  # the new line, in one small multipart upload (no 1 MB log again)


def test_the_log_stops_at_its_cap_and_says_so(gcs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r")
    mirror = Mirror(tmp_path / "out", store, log_cap=1000)
    log = tmp_path / "out" / LOG
    write(log, b"a" * 600 + b"\n")
    mirror.push()
    write(log, b"b" * 600 + b"\n")  # crosses the cap
    mirror.push()
    write(log, b"c" * 600 + b"\n")  # past it: not uploaded
    mirror.push()
    stored = store.read_bytes(LOG) or b""
    assert stored == (b"a" * 600 + b"\n" + b"b" * 399 + b"\n" + cap_note(1000))
    assert stored.decode().splitlines()[-1].startswith("[runner] this log has reached")
    assert "the rest of the job's output is not uploaded" in capsys.readouterr().err
    assert log.stat().st_size == 1803  # the machine keeps all of it


def test_an_object_that_is_not_what_was_written_is_uploaded_whole(gcs: str, tmp_path: Path) -> None:
    store = open_storage(f"gs://runner-test/{uuid.uuid4().hex}/runs/r")
    mirror = Mirror(tmp_path / "out", store)
    log = tmp_path / "out" / LOG
    write(log, b"one\n")
    mirror.push()
    store.write_bytes(LOG, b"someone else's bytes\n")  # the contract has one writer; this one broke it
    write(log, b"two\n")
    mirror.push()
    assert store.read_bytes(LOG) == b"one\ntwo\n"
