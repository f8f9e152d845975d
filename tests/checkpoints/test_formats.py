"""Checkpoint formats (runner.checkpoints) on what their writers really leave: Orbax's CheckpointManager saving a
small pytree, TensorFlow's CheckpointManager, Keras 3's BackupAndRestore and ModelCheckpoint names, the runner's own
files; a step still being written is never counted, listed as the newest or restored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from runner.checkpoints import Listing, committed_steps, newest_step, survey
from runner.checkpoints.orbax import OrbaxSteps


def orbax_saves(directory: Path, steps: list[int], keep: int = 2) -> dict[int, dict[str, np.ndarray]]:
    """A real CheckpointManager saving a small pytree at each of `steps`; the trees it saved, by step."""
    import orbax.checkpoint as ocp

    trees = {step: {"w": np.arange(6.0).reshape(2, 3) + step, "b": np.full(3, float(step))} for step in steps}
    options = ocp.CheckpointManagerOptions(max_to_keep=keep)
    with ocp.CheckpointManager(directory, options=options) as manager:
        for step in steps:
            manager.save(step, args=ocp.args.StandardSave(trees[step]))
        manager.wait_until_finished()
    return trees


def orbax_latest(directory: Path) -> tuple[int | None, list[int]]:
    """What Orbax itself reads there: its latest step and all steps."""
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(directory) as manager:
        return manager.latest_step(), list(manager.all_steps())


def test_committed_orbax_steps_are_what_orbax_itself_reads(tmp_path: Path) -> None:
    orbax_saves(tmp_path, [10, 20, 30])
    found = survey(Listing.of_directory(tmp_path))
    assert [(s.format, s.path, s.step) for s in found.committed()] == [("Orbax", "30", 30), ("Orbax", "20", 20)]
    assert found.newest() is not None and found.newest().title == "step 30 (Orbax)"  # type: ignore[union-attr]
    assert (newest_step(tmp_path), committed_steps(tmp_path)) == orbax_latest(tmp_path) == (30, [20, 30])
    newest = found.newest()
    assert newest is not None and newest.keys[-1] == "30/commit_success.txt" == newest.markers[0]
    assert OrbaxSteps().verify(newest, tmp_path) is None
    assert found.unfinished() == set() and found.restore(keep=1) == list(newest.keys)


def test_an_orbax_step_being_written_is_never_counted_listed_or_restored(tmp_path: Path) -> None:
    """A save cut short leaves `<step>.orbax-checkpoint-tmp-<n>` (here: a committed step copied under that name, as
    the save would have finished it); on Cloud Storage a step counts by its commit_success.txt alone."""
    orbax_saves(tmp_path, [10, 20])
    shutil.copytree(tmp_path / "20", tmp_path / "30.orbax-checkpoint-tmp-1733312")
    local = survey(Listing.of_directory(tmp_path))
    assert [s.step for s in local.committed()] == [20, 10]
    assert local.newest() is not None and local.newest().step == 20  # type: ignore[union-attr]
    unfinished = [s for s in local.saved if not s.committed]
    assert [(s.path, s.step) for s in unfinished] == [("30.orbax-checkpoint-tmp-1733312", 30)]
    assert {k.split("/")[0] for k in local.unfinished()} == {"30.orbax-checkpoint-tmp-1733312"}
    assert not any(k.startswith("30") for k in local.restore(keep=5))
    assert orbax_latest(tmp_path) == (20, [10, 20])  # Orbax skips it too

    # A step directory without its commit file: in a bucket it is still being written (Orbax writes the file
    # last there); on a local disk, with its items' commit files there, it is being deleted.
    shutil.copytree(tmp_path / "20", tmp_path / "40")
    (tmp_path / "40" / "commit_success.txt").unlink()
    keys = list(Listing.of_directory(tmp_path).objects)
    bucket = survey(Listing.of_keys(keys, local=False))
    assert [s.step for s in bucket.committed()] == [20, 10]
    assert [s.step for s in survey(Listing.of_directory(tmp_path)).committed()] == [20, 10]
    # An Orbax that writes no commit files at all: on a local disk the step's name (the rename) commits it.
    bare = [k for k in keys if not k.endswith("commit_success.txt")]
    assert sorted(s.step for s in survey(Listing.of_keys(bare, local=True)).committed()) == [10, 20, 40]
    assert [s.step for s in survey(Listing.of_keys(bare, local=False)).committed()] == []


def test_orbax_steps_under_a_prefix_or_in_a_subdirectory(tmp_path: Path) -> None:
    keys = [
        "orbax/checkpoint_0640/_CHECKPOINT_METADATA",
        "orbax/checkpoint_0640/state/_METADATA",
        "orbax/checkpoint_0640/commit_success.txt",
        "orbax/checkpoint_0700.orbax-checkpoint-tmp-99/state/_METADATA",
        "2/a/b/c/state",  # a numbered directory of a user's own: not a step
    ]
    found = survey(Listing.of_keys(keys, local=False))
    assert [(s.format, s.path, s.step) for s in found.committed()] == [
        ("Orbax", "orbax/checkpoint_0640", 640),
        ("files", "2/a/b/c/state", None),
    ]
    assert found.unfinished() == {"orbax/checkpoint_0700.orbax-checkpoint-tmp-99/state/_METADATA"}


def test_tensorflow_saves_count_once_their_index_and_every_shard_are_there(tmp_path: Path) -> None:
    import tensorflow as tf

    checkpoint = tf.train.Checkpoint(v=tf.Variable(np.arange(4.0)))
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / "tf"), max_to_keep=2)
    for _ in range(3):
        manager.save()
    found = survey(Listing.of_directory(tmp_path))
    assert [(s.format, s.path) for s in found.committed()][:2] == [
        ("TensorFlow", "tf/ckpt-3"),
        ("TensorFlow", "tf/ckpt-2"),
    ]
    assert found.newest() is not None and found.newest().title == "tf/ckpt-3 (TensorFlow)"  # type: ignore[union-attr]
    assert found.found["TensorFlow"].shared == ["tf/checkpoint"]
    assert found.restore(keep=1)[-1] == "tf/checkpoint" and "tf/ckpt-3.index" in found.restore(keep=1)
    # The index not written yet (TensorFlow writes it after the data): being written.
    (tmp_path / "tf" / "ckpt-3.index").unlink()
    again = survey(Listing.of_directory(tmp_path))
    assert again.newest() is not None and again.newest().path == "tf/ckpt-2"  # type: ignore[union-attr]
    assert any(k.startswith("tf/ckpt-3.data-") for k in again.unfinished())


def test_a_backup_and_restore_backup_is_one_checkpoint_with_its_epoch(tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    backup.mkdir()
    for name in ("latest.weights.h5", "latest.weights.h5.bkp", "training_metadata.json.bkp"):
        (backup / name).write_bytes(b"x")
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": 3, "batch": 0}))
    (tmp_path / "model-03.keras").write_bytes(b"m")
    found = survey(Listing.of_directory(tmp_path))
    (saved,) = found.found["BackupAndRestore"].saved
    assert saved.title == "backup/ (BackupAndRestore, epoch 3)" and len(saved.keys) == 4
    assert [s.format for s in found.saved].count("files") == 1  # model-03.keras, a ModelCheckpoint's


@pytest.mark.parametrize("keep", [1, 2])
def test_every_format_claims_its_own_and_restores_its_newest(keep: int) -> None:
    keys = [
        "latest.json",
        "ckpt-000002.keras",
        "ckpt-000003-s000010.keras",
        "640/_CHECKPOINT_METADATA",
        "640/commit_success.txt",
        "650/_CHECKPOINT_METADATA",
        "650/commit_success.txt",
        "tf/ckpt-5.index",
        "tf/ckpt-5.data-00000-of-00001",
        "model-01.keras",
        "model-02.keras",
        "faiss/vectors.index",  # an index of another kind, with no TensorFlow data beside it
    ]
    found = survey(Listing.of_keys(keys))
    claimed = [k for s in found.saved for k in s.keys] + [k for f in found.found.values() for k in f.shared]
    assert sorted(claimed) == sorted(keys)  # each object by exactly one format
    assert {s.path: s.format for s in found.saved} == {
        "ckpt-000002.keras": "Keras",
        "ckpt-000003-s000010.keras": "Keras",
        "640": "Orbax",
        "650": "Orbax",
        "tf/ckpt-5": "TensorFlow",
        "model-01.keras": "files",
        "model-02.keras": "files",
        "faiss/vectors.index": "files",
    }
    restored = found.restore(keep)
    assert ("650/commit_success.txt" in restored) and (("640/commit_success.txt" in restored) == (keep == 2))
    assert restored.index("650/_CHECKPOINT_METADATA") < restored.index("650/commit_success.txt")  # the marker last
    assert ("model-01.keras" in restored) == (keep == 2) and "model-02.keras" in restored


def test_a_later_fit_s_series_is_its_own_with_its_own_manifest(tmp_path: Path) -> None:
    """keras_callbacks() in a second fit of one process saves in fit-2/: its checkpoints are the runner's own
    (never a numbered series of files), verified against fit-2/latest.json, and restored beside the first fit's."""
    from runner.checkpoints.keras import Checkpoint, KerasFiles, fit_prefix, manifest_bytes

    assert (fit_prefix(0), fit_prefix(1)) == ("", "fit-2/")
    for prefix, epochs in (("", [1, 2]), ("fit-2/", [2, 3])):
        directory = tmp_path / prefix
        directory.mkdir(exist_ok=True)
        entries = []
        for epoch in epochs:
            name = f"ckpt-{epoch:06d}.keras"
            shutil.copy(Path(__file__).with_name("__init__.py"), directory / name)  # bytes; not a zip
            entries.append(Checkpoint(file=name, epochs_done=epoch, global_step=epoch * 8))
        (directory / "latest.json").write_bytes(manifest_bytes(entries))
    found = survey(Listing.of_directory(tmp_path))
    keras = found.found["Keras"]
    assert {s.path: s.series for s in keras.saved} == {
        "ckpt-000001.keras": "Keras",
        "ckpt-000002.keras": "Keras",
        "fit-2/ckpt-000002.keras": "Keras fit-2",
        "fit-2/ckpt-000003.keras": "Keras fit-2",
    }
    assert keras.problem is None and sorted(keras.shared) == ["fit-2/latest.json", "latest.json"]
    assert not found.found["files"].saved  # nothing of it left to the numbered-files format
    assert sorted(found.restore(2)) == sorted(keras.keys)  # both series and both manifests
    later = next(s for s in keras.saved if s.path == "fit-2/ckpt-000003.keras")
    assert later.step == 24  # from fit-2/latest.json, not the first fit's manifest
    assert "not an intact .keras archive" in (KerasFiles().verify(later, tmp_path) or "")  # found, then checked
    (tmp_path / "fit-2" / "latest.json").write_text("{")
    broken = survey(Listing.of_directory(tmp_path)).found["Keras"]
    assert broken.problem is not None and broken.problem.startswith("(fit-2/latest.json) is unreadable")
