"""The mirror against a real Cloud Storage emulator: rotation reaches the bucket, and a restarted VM gets back what
the trainer needs to pick the newest checkpoint that verifies, whatever state the bucket is in."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from google.cloud import storage as gcs_client

from runner import contract
from runner.checkpoints import Listing, survey
from runner.storage import Storage, open_storage
from runner.train.checkpoints import CheckpointStore, ResumeChooser, parse_manifest
from runner.worker.mirror import Mirror, checkpoint_keep
from tests.train.test_checkpoints import publish

BUCKET = "runner-test"


@pytest.fixture
def run_dir(gcs: str) -> str:
    return f"gs://{BUCKET}/{uuid.uuid4().hex}/runs/r1"


def bucket_checkpoints(store: Storage) -> list[str]:
    return [o.key for o in store.list(f"{contract.CHECKPOINTS}/")]


def trained(run_dir: str, local: Path, epochs: int = 3, keep: int = 2) -> tuple[Storage, Mirror, CheckpointStore]:
    """A first VM: the trainer publishes a checkpoint per epoch and the mirror pushes after each."""
    store = open_storage(run_dir)
    mirror = Mirror(local, store, keep=keep)
    checkpoints = CheckpointStore(local / contract.CHECKPOINTS, keep=keep)
    for epoch in range(1, epochs + 1):
        publish(checkpoints, epoch)
        mirror.push()
    return store, mirror, checkpoints


def test_rotated_checkpoints_leave_the_bucket_too(run_dir: str, tmp_path: Path) -> None:
    store = open_storage(run_dir)
    foreign = f"{contract.CHECKPOINTS}/ckpt-000000-s000001.keras"
    store.write_bytes(foreign, b"put there by someone else")
    store, mirror, checkpoints = trained(run_dir, tmp_path / "vm1", epochs=3)
    assert bucket_checkpoints(store) == [
        foreign,  # not this mirror's: never deleted
        "checkpoints/ckpt-000002.keras",
        "checkpoints/ckpt-000003.keras",
        "checkpoints/latest.json",
    ]
    # The bucket's manifest names exactly the objects there, with the checksums Cloud Storage computed itself.
    listed = parse_manifest(store.read_bytes(contract.LATEST_CHECKPOINT) or b"")
    bucket = gcs_client.Client().bucket(BUCKET)
    prefix = run_dir.removeprefix(f"gs://{BUCKET}/")
    for entry in listed:
        blob = bucket.get_blob(f"{prefix}/{contract.CHECKPOINTS}/{entry.file}")
        assert blob is not None and (blob.crc32c, blob.size) == (entry.crc32c, entry.size)
    # A mid-epoch save rotates the oldest out as well.
    publish(checkpoints, 3, 2)
    mirror.push()
    assert bucket_checkpoints(store)[1:] == [
        "checkpoints/ckpt-000003-s000002.keras",
        "checkpoints/ckpt-000003.keras",
        "checkpoints/latest.json",
    ]


def test_a_restarted_vm_pulls_every_listed_checkpoint_and_rotation_still_works(run_dir: str, tmp_path: Path) -> None:
    store, _, _ = trained(run_dir, tmp_path / "vm1", epochs=3)
    local = tmp_path / "vm2"
    mirror = Mirror(local, store, keep=2)
    pulled = mirror.pull_resume_state(worker=0)
    assert sorted(k for k in pulled if k.startswith("checkpoints/")) == [
        "checkpoints/ckpt-000002.keras",
        "checkpoints/ckpt-000003.keras",
        "checkpoints/latest.json",
    ]
    chooser = ResumeChooser.open(local / contract.CHECKPOINTS, print)
    chosen = chooser.next_verified()
    assert chosen is not None and chosen.name == "ckpt-000003.keras"
    # The trainer goes on and rotates: what this mirror pulled, it may delete.
    checkpoints = CheckpointStore(local / contract.CHECKPOINTS, keep=2)
    checkpoints.history = chooser.history_for(chosen)
    publish(checkpoints, 4)
    mirror.push()
    assert bucket_checkpoints(store) == [
        "checkpoints/ckpt-000003.keras",
        "checkpoints/ckpt-000004.keras",
        "checkpoints/latest.json",
    ]


def test_a_torn_object_in_the_bucket_falls_back_to_the_older_one(run_dir: str, tmp_path: Path) -> None:
    store, _, _ = trained(run_dir, tmp_path / "vm1", epochs=2)
    newest = "checkpoints/ckpt-000002.keras"
    size = parse_manifest(store.read_bytes(contract.LATEST_CHECKPOINT) or b"")[0].size
    store.write_bytes(newest, (store.read_bytes(newest) or b"")[:1000])  # an upload cut short
    local = tmp_path / "vm2"
    Mirror(local, store).pull_resume_state(worker=0)
    lines: list[str] = []
    chosen = ResumeChooser.open(local / contract.CHECKPOINTS, lines.append).next_verified()
    assert chosen is not None and chosen.name == "ckpt-000001.keras"
    assert lines == [f"[trainer] skipping ckpt-000002.keras: size mismatch (manifest {size} bytes, file 1000 bytes)"]


@pytest.mark.parametrize("damage", ["missing", "unreadable", "names a missing object"])
def test_without_a_usable_manifest_the_newest_checkpoints_are_listed_and_fetched(
    damage: str, run_dir: str, tmp_path: Path
) -> None:
    store, _, _ = trained(run_dir, tmp_path / "vm1", epochs=4, keep=4)
    store.delete("checkpoints/ckpt-000001.keras")
    if damage == "missing":
        store.delete(contract.LATEST_CHECKPOINT)
    elif damage == "unreadable":
        store.write_bytes(contract.LATEST_CHECKPOINT, b'{"checkpoints": [')
    local = tmp_path / "vm2"
    mirror = Mirror(local, store, keep=2)
    pulled = mirror.pull_resume_state(worker=0)  # never raises for a missing or bad object
    # keep + 1 = 3 newest by position; the deleted one is simply not there.
    fetched = sorted(p.name for p in (local / contract.CHECKPOINTS).glob("*.keras"))
    assert fetched == ["ckpt-000002.keras", "ckpt-000003.keras", "ckpt-000004.keras"]
    assert (contract.LATEST_CHECKPOINT in pulled) == (damage != "missing")
    chosen = ResumeChooser.open(local / contract.CHECKPOINTS, print).next_verified()
    assert chosen is not None and chosen.name == "ckpt-000004.keras"


def test_keep_comes_from_the_training_section() -> None:
    assert checkpoint_keep({contract.TRAINING: json.dumps({"checkpoint_keep": 5})}) == 5
    assert checkpoint_keep({contract.TRAINING: "not json"}) == 2
    assert checkpoint_keep({}) == 2


def test_keep_comes_from_the_run_s_checkpoint_setting_first() -> None:
    assert checkpoint_keep({contract.CHECKPOINT_KEEP: "4", contract.TRAINING: json.dumps({"checkpoint_keep": 5})}) == 4


# What a job's own checkpointing leaves in RUNNER_CHECKPOINT_DIR (names as Keras and TensorFlow write them).
JOB_OWN = [
    # keras.callbacks.BackupAndRestore(backup_dir=$RUNNER_CHECKPOINT_DIR/backup, double_checkpoint=True): rewritten
    "checkpoints/backup/latest.weights.h5",
    "checkpoints/backup/latest.weights.h5.bkp",
    "checkpoints/backup/training_metadata.json",
    # ModelCheckpoint("model-{epoch:02d}-{val_loss:.2f}.keras"), one per epoch
    "checkpoints/model-01-0.31.keras",
    "checkpoints/model-02-0.22.keras",
    "checkpoints/model-03-0.18.keras",
    "checkpoints/model-10-0.09.keras",
    # tf.train.CheckpointManager: an index and data file per save, and its `checkpoint` file naming the latest
    "checkpoints/tf/checkpoint",
    "checkpoints/tf/ckpt-4.index",
    "checkpoints/tf/ckpt-4.data-00000-of-00001",
    "checkpoints/tf/ckpt-5.index",
    "checkpoints/tf/ckpt-5.data-00000-of-00001",
    "checkpoints/tf/ckpt-6.index",
    "checkpoints/tf/ckpt-6.data-00000-of-00001",
]


def newest_sets(keys: list[str], keep: int) -> list[str]:
    """What a restart brings back of a job's own checkpoint files (runner.checkpoints: each format's restore)."""
    prefix = f"{contract.CHECKPOINTS}/"
    listing = Listing.of_keys(k.removeprefix(prefix) for k in keys)
    return sorted(prefix + k for k in survey(listing).restore(keep))


def test_the_newest_set_of_a_job_s_own_checkpoints_not_its_history() -> None:
    assert newest_sets(JOB_OWN, keep=2) == sorted(
        [
            "checkpoints/backup/latest.weights.h5",
            "checkpoints/backup/latest.weights.h5.bkp",
            "checkpoints/backup/training_metadata.json",
            "checkpoints/model-03-0.18.keras",  # by epoch, the first number: 10 after 3, not lexical order
            "checkpoints/model-10-0.09.keras",
            "checkpoints/tf/checkpoint",
            "checkpoints/tf/ckpt-5.data-00000-of-00001",  # each save's index and data come back together
            "checkpoints/tf/ckpt-5.index",
            "checkpoints/tf/ckpt-6.data-00000-of-00001",
            "checkpoints/tf/ckpt-6.index",
        ]
    )


def test_a_new_machine_gets_back_a_job_s_own_checkpoints_beside_the_runner_s(run_dir: str, tmp_path: Path) -> None:
    """A preempted command job's files in the bucket reach the recreated VM's RUNNER_CHECKPOINT_DIR: the newest
    `keep` of each series, every file rewritten in place, and the runner's own manifest and checkpoints."""
    store, _, _ = trained(run_dir, tmp_path / "vm1", epochs=3, keep=2)
    for key in JOB_OWN:
        store.write_bytes(key, key.encode())
    local = tmp_path / "vm2"
    pulled = Mirror(local, store, keep=2).pull_resume_state(worker=0)
    on_disk = sorted(p.relative_to(local).as_posix() for p in (local / contract.CHECKPOINTS).rglob("*") if p.is_file())
    ours = ["checkpoints/ckpt-000002.keras", "checkpoints/ckpt-000003.keras", contract.LATEST_CHECKPOINT]
    assert on_disk == sorted(ours + newest_sets(JOB_OWN, keep=2))
    assert set(on_disk) <= set(pulled)
    assert (local / "checkpoints/tf/ckpt-6.index").read_bytes() == b"checkpoints/tf/ckpt-6.index"


def test_orbax_steps_reach_the_bucket_committed_and_come_back_whole(run_dir: str, tmp_path: Path) -> None:
    """A job's own Orbax CheckpointManager: a step still being written never travels, a step's commit file goes
    after its data, a step the manager rotates away (even half deleted) leaves the bucket whole, and a new machine
    gets back what Orbax itself restores."""
    import shutil

    import numpy as np
    import orbax.checkpoint as ocp

    from tests.checkpoints.test_formats import orbax_latest, orbax_saves

    store = open_storage(run_dir)
    local = tmp_path / "vm1"
    steps = local / contract.CHECKPOINTS
    orbax_saves(steps, [10, 20])
    shutil.copytree(steps / "20", steps / "30.orbax-checkpoint-tmp-5")  # a save in progress
    mirror = Mirror(local, store, keep=2)
    order = [key for _, key, _, _ in mirror._changed()]
    assert not any("orbax-checkpoint-tmp" in key for key in order)
    assert order[-2:] == ["checkpoints/10/commit_success.txt", "checkpoints/20/commit_success.txt"]
    mirror.push()

    def in_bucket() -> list[int | None]:
        return [s.step for s in survey(Listing.of_storage(store, f"{contract.CHECKPOINTS}/")).committed()]

    assert in_bucket() == [20, 10] and not any("tmp" in key for key in bucket_checkpoints(store))
    shutil.rmtree(steps / "30.orbax-checkpoint-tmp-5")
    saved = orbax_saves(steps, [30])  # the manager keeps 2: step 10 goes
    mirror.push()
    assert in_bucket() == [30, 20]
    assert not any(key.startswith("checkpoints/10/") for key in bucket_checkpoints(store))
    # The manager deleting step 20 file by file, caught half-way by the mirror's scan: gone from the bucket whole.
    (steps / "20" / "commit_success.txt").unlink()
    (steps / "20" / "_CHECKPOINT_METADATA").unlink()
    mirror.push()
    assert in_bucket() == [30]
    assert not any(key.startswith("checkpoints/20/") for key in bucket_checkpoints(store))

    fresh = tmp_path / "vm2"
    pulled = Mirror(fresh, store, keep=2).pull_resume_state(worker=0)
    assert pulled[-1] == "checkpoints/30/commit_success.txt"
    assert orbax_latest(fresh / contract.CHECKPOINTS) == (30, [30])
    with ocp.CheckpointManager(fresh / contract.CHECKPOINTS) as manager:
        restored = manager.restore(30, args=ocp.args.StandardRestore(saved[30]))
    assert all(np.array_equal(restored[k], saved[30][k]) for k in saved[30])
