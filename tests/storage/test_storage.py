"""Storage conformance: the same behaviour from a local directory and from Cloud Storage (a real emulator)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.errors import BucketMissing, PreconditionFailed, StorageError, StorageUnreachable
from runner.storage import Storage, open_storage
from runner.worker.mirror import Mirror
from tpu_emulator.flaky_proxy import FlakyProxy


@pytest.fixture(params=["local", "gcs"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return open_storage(str(tmp_path / "store"))
    request.getfixturevalue("gcs")
    return open_storage(f"gs://runner-test/{uuid.uuid4().hex}")


def test_write_read_ranges_and_missing(storage: Storage) -> None:
    assert storage.read_bytes("nope") is None
    storage.write_bytes("a/b.txt", b"hello world")
    assert storage.read_bytes("a/b.txt") == b"hello world"
    assert storage.read_bytes("a/b.txt", start=6) == b"world"
    assert storage.read_bytes("a/b.txt", start=11) == b""
    storage.write_bytes("a/b.txt", b"replaced")
    assert storage.read_bytes("a/b.txt") == b"replaced"


def test_delete_is_idempotent(storage: Storage) -> None:
    storage.write_bytes("exit/worker-0.json", b"{}")
    storage.delete("exit/worker-0.json")
    storage.delete("exit/worker-0.json")
    assert storage.read_bytes("exit/worker-0.json") is None and storage.list("exit/") == []


def test_list_is_sorted_and_filtered_by_prefix(storage: Storage) -> None:
    for key in ["z.txt", "logs/worker-1.log", "logs/worker-0.log"]:
        storage.write_bytes(key, key.encode())
    assert [o.key for o in storage.list()] == ["logs/worker-0.log", "logs/worker-1.log", "z.txt"]
    assert [(o.key, o.size) for o in storage.list("logs/")] == [("logs/worker-0.log", 17), ("logs/worker-1.log", 17)]
    assert storage.list("none/") == []


def test_write_if_is_a_compare_and_swap_on_the_generation(storage: Storage) -> None:
    """Create only if absent (generation 0), then only at the generation read: a writer that read an older one is
    refused, and every write gets a new generation, read back with exactly its bytes."""
    assert storage.read_versioned("owner.json") is None
    first = storage.write_if("owner.json", b"first", generation=0)
    assert first.generation
    with pytest.raises(PreconditionFailed):
        storage.write_if("owner.json", b"rival", generation=0)  # it exists now
    data, info = storage.read_versioned("owner.json") or (b"", None)
    assert data == b"first" and info is not None and info.generation == first.generation and info.updated
    second = storage.write_if("owner.json", b"second", generation=first.generation)
    assert second.generation != first.generation
    with pytest.raises(PreconditionFailed):  # a writer that read `first`, after `second` came between
        storage.write_if("owner.json", b"stale", generation=first.generation)
    assert storage.read_bytes("owner.json") == b"second"
    # A write whose answer was lost and that is sent again finds its own bytes: it is not someone else's.
    again = storage.write_if("owner.json", b"second", generation=first.generation)
    assert again.generation == second.generation
    assert [o.key for o in storage.list()] == ["owner.json"]  # the local disk's lock and counter are hidden


def test_20mb_checkpoint_round_trip(storage: Storage, tmp_path: Path) -> None:
    # A checkpoint is opaque bytes to storage; random bytes make any corruption visible.
    blob = os.urandom(20 * 1024 * 1024 + 123)
    src = tmp_path / "ckpt-000001.keras"
    src.write_bytes(blob)
    storage.upload_file(src, "checkpoints/ckpt-000001.keras")
    dest = tmp_path / "back" / "ckpt.keras"
    assert storage.download_file("checkpoints/ckpt-000001.keras", dest)
    assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(blob).digest()
    assert not storage.download_file("checkpoints/missing.keras", tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def test_mirror_uploads_only_changes_oldest_first(storage: Storage, tmp_path: Path) -> None:
    local = tmp_path / "out"
    (local / "checkpoints").mkdir(parents=True)
    ckpt = local / "checkpoints" / "ckpt-000001.keras"
    ckpt.write_bytes(b"weights")
    manifest = local / "checkpoints" / "latest.json"
    manifest.write_text('{"epoch": 1, "path": "ckpt-000001.keras"}')
    os.utime(ckpt, ns=(1_000_000_000, 1_000_000_000))  # the checkpoint is older than its manifest
    (local / ".tmp-partial").write_bytes(b"half")
    mirror = Mirror(local, storage)
    order = [key for _, key, _, _ in mirror._changed()]
    assert order == ["checkpoints/ckpt-000001.keras", "checkpoints/latest.json"]
    assert mirror.push() == 2
    assert mirror.push() == 0  # nothing changed
    manifest.write_text('{"epoch": 2, "path": "ckpt-000001.keras"}')
    assert mirror.push() == 1
    assert storage.read_bytes(".tmp-partial") is None  # hidden temp files of atomic writes never travel


def test_mirror_pull_restores_what_a_restarted_job_needs(storage: Storage, tmp_path: Path) -> None:
    storage.write_bytes("checkpoints/ckpt-000003.keras", b"w3")
    storage.write_bytes("checkpoints/ckpt-000002.keras", b"w2")
    storage.write_bytes("checkpoints/latest.json", b'{"epoch": 3, "path": "ckpt-000003.keras"}')
    storage.write_bytes("metrics.jsonl", b'{"epoch": 1}\n')
    storage.write_bytes("logs/worker-0.log", b"before\n")
    local = tmp_path / "restart"
    pulled = Mirror(local, storage).pull_resume_state(worker=0)
    assert sorted(pulled) == [
        "checkpoints/ckpt-000003.keras",
        "checkpoints/latest.json",
        "logs/worker-0.log",
        "metrics.jsonl",
    ]
    assert not (local / "checkpoints" / "ckpt-000002.keras").exists()  # only the newest is needed


def test_local_keys_cannot_escape(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="leaves the run directory"):
        open_storage(str(tmp_path)).write_bytes("../x", b"1")


def test_gcs_missing_bucket_is_a_clear_error(gcs: str) -> None:
    storage = open_storage("gs://no-such-bucket-here/p")
    assert storage.read_bytes("k") is None
    with pytest.raises(StorageError, match="bucket 'no-such-bucket-here' does not exist"):
        storage.write_bytes("k", b"1")


def test_bad_gcs_url() -> None:
    with pytest.raises(StorageError):
        open_storage("gs://UPPER")


def test_append_adds_to_the_object_and_refuses_a_wrong_size(storage: Storage) -> None:
    storage.append("logs/worker-0.log", b"hello ", at=0)
    storage.append("logs/worker-0.log", b"world\n", at=6)
    assert storage.read_bytes("logs/worker-0.log") == b"hello world\n"
    assert storage.read_bytes("logs/worker-0.log", start=6) == b"world\n"  # a follower's ranged read, as before
    with pytest.raises(StorageError):
        storage.append("logs/worker-0.log", b"more", at=3)  # not what it holds: the writer uploads it whole
    assert [o.key for o in storage.list("logs/")] == ["logs/worker-0.log"]  # no part object is ever listed


def test_list_says_when_each_object_was_stored_by_the_storage_clock(storage: Storage) -> None:
    import time

    before = time.time()
    storage.write_bytes("heartbeat", b"{}")
    (info,) = storage.list("heartbeat")
    assert info.updated is not None and before - 1 <= info.updated <= time.time() + 1


@pytest.fixture
def proxied(gcs: str) -> Iterator[tuple[FlakyProxy, str]]:
    """A run directory reached through a proxy that can make Cloud Storage unreachable."""
    with FlakyProxy(gcs) as proxy:
        yield proxy, f"gs://runner-test/{uuid.uuid4().hex}"


@pytest.mark.parametrize("mode", ["reset", "blackhole"])
def test_an_unreachable_storage_is_unknown_within_its_patience(
    proxied: tuple[FlakyProxy, str], monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    import time

    proxy, url = proxied
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    store = open_storage(url, patience_s=4)
    store.write_bytes("exit/worker-0.json", b"{}")
    proxy.outage(mode)  # type: ignore[arg-type]
    t0 = time.monotonic()
    with pytest.raises(StorageUnreachable) as caught:
        store.list("exit/")
    assert time.monotonic() - t0 < 4 + 4  # its patience, and one request's timeout (half of it) at most past it
    assert "cannot reach Cloud Storage to list" in caught.value.message
    proxy.heal()
    assert [o.key for o in store.list("exit/")] == ["exit/worker-0.json"]


def test_a_deleted_bucket_is_a_definite_answer(gcs: str) -> None:
    from google.cloud import storage as gcs_client

    name = f"gone-{uuid.uuid4().hex[:8]}"
    gcs_client.Client().create_bucket(name)
    store = open_storage(f"gs://{name}/runs/r")
    store.write_bytes("run.json", b"{}")
    bucket = gcs_client.Client().bucket(name)
    for blob in list(bucket.list_blobs()):
        blob.delete()
    bucket.delete()
    for action in (lambda: store.list("exit/"), lambda: store.write_bytes("x", b"1")):
        with pytest.raises(BucketMissing, match=f"bucket '{name}' does not exist"):
            action()


def test_a_local_listing_reads_only_the_prefix_s_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`logs/` is read without walking checkpoints/ (which a job may be rewriting, and may hold many files); a
    prefix that ends mid-name lists the names it starts, files and directories alike."""
    storage = open_storage(str(tmp_path / "store"))
    for key in ["logs/worker-0.log", "checkpoints/640/state", "heartbeat", "heartbeats/worker-0.json", "metrics.jsonl"]:
        storage.write_bytes(key, b"x")
    read: list[str] = []
    real_scandir = os.scandir

    def scandir(path: str | os.PathLike[str]) -> object:
        read.append(Path(path).relative_to(tmp_path / "store").as_posix())
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert [o.key for o in storage.list("logs/")] == ["logs/worker-0.log"]
    assert read == ["logs"]
    assert [o.key for o in storage.list("heartbeat")] == ["heartbeat", "heartbeats/worker-0.json"]
    assert [o.key for o in storage.list("checkpoints/6")] == ["checkpoints/640/state"]
    assert storage.list("logs/worker-0.log/") == [] and storage.list("nothing/here/") == []
    assert "checkpoints" not in read[:3] and "checkpoints/640" in read


class Churn:
    """A job's own writer in a thread: make N.tmp/a/b/c, rename it to N, delete N-2 (Orbax's local save, a
    ModelCheckpoint's rotation, a user's rename), counting its rounds."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.rounds, self.stop = directory, 0, False

    def run(self) -> None:
        import shutil

        while not self.stop:
            n = self.rounds
            tmp = self.directory / f"{n}.tmp"
            (tmp / "a" / "b" / "c").mkdir(parents=True)
            (tmp / "a" / "b" / "c" / "state").write_bytes(b"x")
            os.rename(tmp, self.directory / str(n))
            shutil.rmtree(self.directory / str(n - 2), ignore_errors=True)
            self.rounds += 1


def test_a_local_listing_takes_a_directory_being_renamed_and_deleted_as_it_is(tmp_path: Path) -> None:
    """While a writer renames and deletes whole directory trees, every listing succeeds, and lists only what was
    there at some moment of it: files of whole rounds, never a hidden or vanished one."""
    import threading

    from tests.waiting import wait_for

    storage = open_storage(str(tmp_path / "store"))
    storage.write_bytes("logs/worker-0.log", b"x")
    churn = Churn(tmp_path / "store" / "checkpoints")
    churn.directory.mkdir(parents=True)
    writer = threading.Thread(target=churn.run, daemon=True)
    writer.start()
    try:
        listings = 0
        seen_rounds: set[int] = set()

        def listed_while_it_churns() -> bool:
            nonlocal listings
            start = churn.rounds
            for prefix in ("", "checkpoints/", "checkpoints/1"):
                for info in storage.list(prefix):
                    parts = info.key.split("/")
                    assert info.key == "logs/worker-0.log" or (
                        parts[0] == "checkpoints" and parts[2:] == ["a", "b", "c", "state"]
                    ), info.key
                    if parts[0] == "checkpoints":
                        seen_rounds.add(int(parts[1].removesuffix(".tmp")))
            listings += churn.rounds > start  # a listing the writer overlapped
            return listings >= 200

        wait_for(listed_while_it_churns, "200 listings overlapped by the writer's renames", poll_s=0)
    finally:
        churn.stop = True
        writer.join()
    assert len(seen_rounds) > 10


def test_an_object_listed_and_gone_before_its_read_reads_as_missing(storage: Storage, tmp_path: Path) -> None:
    storage.write_bytes("checkpoints/5/state", b"x")
    (listed,) = storage.list("checkpoints/")
    storage.delete(listed.key)  # the job's rotation, between the listing and the read
    assert storage.read_bytes(listed.key) is None
    assert storage.read_bytes(listed.key, start=1) is None
    assert not storage.download_file(listed.key, tmp_path / "back" / "state")
    assert not (tmp_path / "back" / "state").exists()


def test_a_file_gone_before_its_upload_is_file_not_found(storage: Storage, tmp_path: Path) -> None:
    """What the mirror listed and the job removed since: FileNotFoundError (the mirror skips it), not a storage
    error that would stop the rest of its pass."""
    gone = tmp_path / "gone.bin"
    with pytest.raises(FileNotFoundError):
        storage.upload_file(gone, "checkpoints/gone.bin")
    assert storage.list("checkpoints/") == []
