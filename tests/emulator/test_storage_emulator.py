"""The Cloud Storage emulator the suite runs (tpu_emulator.gcs) honours generation preconditions as Cloud Storage
does, checked with the real google-cloud-storage client: 412 Precondition Failed (conditionNotMet) for a create
whose object exists (ifGenerationMatch=0) and for a write, delete or read at another generation, on simple,
multipart and resumable uploads; and its write barrier makes two conditional writers race by construction."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from tpu_emulator.gcs import StorageServer


@pytest.fixture
def bucket(gcs: str) -> Any:
    from google.cloud import storage  # type: ignore[attr-defined]

    return storage.Client(project="test-project").bucket("runner-test")


def test_a_create_only_if_absent_is_refused_once_the_object_exists(bucket: Any) -> None:
    name = f"{uuid.uuid4().hex}/owner.json"
    first = bucket.blob(name)
    first.upload_from_string(b"mine", if_generation_match=0)
    with pytest.raises(gexc.PreconditionFailed) as refused:
        bucket.blob(name).upload_from_string(b"theirs", if_generation_match=0)
    assert refused.value.code == 412 and "conditionNotMet" in str(refused.value)
    assert bucket.blob(name).download_as_bytes() == b"mine"


def test_writes_deletes_and_reads_at_another_generation_are_refused(bucket: Any) -> None:
    name = f"{uuid.uuid4().hex}/owner.json"
    blob = bucket.blob(name)
    blob.upload_from_string(b"one", if_generation_match=0)
    one = blob.generation
    blob.upload_from_string(b"two", if_generation_match=one)
    two = blob.generation
    assert two != one
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob(name).upload_from_string(b"three", if_generation_match=one)
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob(name).delete(if_generation_match=one)
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob(name).download_as_bytes(if_generation_match=one)
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob(name).upload_from_string(b"x", if_generation_not_match=two)
    with pytest.raises(gexc.PreconditionFailed):  # metageneration too
        bucket.blob(name).upload_from_string(b"x", if_metageneration_match=7)
    assert bucket.get_blob(name).download_as_bytes(if_generation_match=two) == b"two"
    with pytest.raises(gexc.PreconditionFailed):  # a write at a generation, of an object that does not exist
        bucket.blob(f"{name}.absent").upload_from_string(b"x", if_generation_match=two)
    bucket.blob(name).delete(if_generation_match=two)
    assert bucket.get_blob(name) is None


def test_a_resumable_upload_is_checked_when_it_completes(bucket: Any) -> None:
    """google-cloud-storage sends objects over its chunk size as resumable uploads: the condition travels with the
    session and holds at its end."""
    name = f"{uuid.uuid4().hex}/big"
    data = b"z" * (3 * 1024 * 1024)
    first = bucket.blob(name, chunk_size=1024 * 1024)
    first.upload_from_string(data, if_generation_match=0)
    assert first.size == len(data)
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob(name, chunk_size=1024 * 1024).upload_from_string(data, if_generation_match=0)


def test_the_write_barrier_makes_two_creates_race_and_exactly_one_wins(
    bucket: Any, storage_emulator: StorageServer
) -> None:
    name = f"{uuid.uuid4().hex}/owner.json"
    hold = storage_emulator.hold_writes(name.replace(".", r"\."), parties=2)
    outcomes: list[str] = []

    def create(who: str) -> None:
        try:
            bucket.blob(name).upload_from_string(who.encode(), if_generation_match=0)
            outcomes.append("won")
        except gexc.PreconditionFailed:
            outcomes.append("412")

    threads = [threading.Thread(target=create, args=(who,)) for who in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert hold.arrived == 2  # both were in flight together: neither had been answered when the other was sent
    assert sorted(outcomes) == ["412", "won"]
    assert bucket.blob(name).download_as_bytes() in (b"a", b"b")
