"""Checkpoint naming, manifest, publishing, rotation and the choice of what to resume from: no TensorFlow needed.

The archives here are real zip files laid out like Keras' .keras files (metadata.json, config.json,
model.weights.h5, stored uncompressed), which is all the verification looks at.
"""

from __future__ import annotations

import base64
import json
import os
import zipfile
from pathlib import Path

import google_crc32c
import pytest

from runner.train.checkpoints import (
    Candidate,
    Checkpoint,
    CheckpointPolicy,
    CheckpointStore,
    DataOrder,
    ManifestError,
    ResumeChooser,
    archive_keras,
    archive_problem,
    checkpoint_name,
    describe,
    file_crc32c,
    parse_manifest,
    parse_name,
    scan,
    verify,
)

ORDER = DataOrder(seed=0, examples=512, batch_size=128, steps_per_epoch=4)


def make_archive(path: Path, payload: bytes, keras_version: str = "3.15.1") -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("metadata.json", json.dumps({"keras_version": keras_version, "date_saved": "x"}))
        archive.writestr("config.json", json.dumps({"class_name": "Sequential"}))
        archive.writestr("model.weights.h5", payload)
    return path


def publish(store: CheckpointStore, epochs_done: int, step: int = 0, payload: bytes | None = None) -> Checkpoint:
    """What the trainer's Checkpointer does, with a fake model: write the temporary archive, then publish it."""
    name = checkpoint_name(epochs_done, step)
    tmp = make_archive(store.temp_path(name), payload or os.urandom(4096))
    entry = Checkpoint(name, epochs_done, step, global_step=epochs_done * 4 + step, keras="keras3", data=ORDER)
    return store.publish(tmp, entry)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def weights_offset(path: Path) -> int:
    """Where the weights member's bytes start: a flip there keeps the zip structure and breaks only that CRC."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("model.weights.h5")
    header = path.read_bytes()[info.header_offset : info.header_offset + 30]
    name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
    return info.header_offset + 30 + name_len + extra_len + 100


def test_names_encode_positions_and_lexical_order_is_not_position_order(tmp_path: Path) -> None:
    assert checkpoint_name(3) == "ckpt-000003.keras"
    assert checkpoint_name(2, 10) == "ckpt-000002-s000010.keras"
    assert parse_name("ckpt-000002-s000010.keras") == (2, 10)
    assert parse_name("ckpt-000003.keras") == (3, 0)
    for other in ("latest.json", "ckpt-3.keras", ".ckpt-000003.keras.tmp.keras", "ckpt-000003.keras.part"):
        assert parse_name(other) is None
    names = ["ckpt-000002.keras", "ckpt-000002-s000010.keras", "ckpt-000010.keras", "ckpt-000003-s000001.keras"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    # Lexically the mid-epoch checkpoint of epoch 3 sorts before the end of epoch 2; by position it is newer.
    assert sorted(names)[0] == "ckpt-000002-s000010.keras"
    assert [c.file for c in scan(tmp_path)] == [
        "ckpt-000010.keras",
        "ckpt-000003-s000001.keras",
        "ckpt-000002-s000010.keras",
        "ckpt-000002.keras",
    ]
    assert describe((1, 3), 4) == "epoch 2 step 3 of 4"
    assert describe((2, 0), 4) == "epoch 2 step 4 of 4"  # an epoch end reads as that epoch's last step
    assert describe((0, 0), 4) == "epoch 1 step 0 of 4"


def test_publish_lists_size_and_crc32c_and_rotates(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep=2)
    first = publish(store, 1)
    mid = publish(store, 1, 2)
    newest = publish(store, 2)
    directory = store.directory
    assert sorted(p.name for p in directory.iterdir()) == [
        "ckpt-000001-s000002.keras",
        "ckpt-000002.keras",
        "latest.json",
    ]
    assert not (directory / first.file).exists()  # rotated away after the manifest stopped naming it
    doc = json.loads((directory / "latest.json").read_text())
    assert (doc["format"], doc["epoch"], doc["step"], doc["path"]) == (2, 2, 0, "ckpt-000002.keras")
    assert [c["file"] for c in doc["checkpoints"]] == [newest.file, mid.file]
    for entry in doc["checkpoints"]:
        data = (directory / entry["file"]).read_bytes()
        # Cloud Storage's form (blob.crc32c): base64 of the big-endian CRC32C, computed independently here.
        expected = base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()
        assert (entry["size"], entry["crc32c"]) == (len(data), expected)
        assert entry["keras"] == "keras3" and entry["data"]["steps_per_epoch"] == 4
    assert parse_manifest((directory / "latest.json").read_bytes())[0] == newest


def test_a_resumed_timeline_replaces_newer_checkpoints_and_temp_leftovers(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    for epoch in (1, 2, 3):
        publish(store, epoch)
    (tmp_path / ".ckpt-000004.keras.tmp.keras").write_bytes(b"a save killed halfway")
    (tmp_path / "mine.bin").write_bytes(b"a user's file")
    # Resumed from epoch 1 (say 2 and 3 were torn): the first new save drops them from manifest and disk.
    resumed = CheckpointStore(tmp_path, keep=3)
    resumed.history = [c for c in store.history if c.epochs_done == 1]
    publish(resumed, 1, 3)
    assert [c.file for c in parse_manifest((tmp_path / "latest.json").read_bytes())] == [
        "ckpt-000001-s000003.keras",
        "ckpt-000001.keras",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000001-s000003.keras",
        "ckpt-000001.keras",
        "latest.json",
        "mine.bin",
    ]


def test_verify_reports_each_kind_of_damage(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    entry = publish(store, 1)
    path = tmp_path / entry.file
    listed = Candidate(entry, path, listed=True)
    assert verify(listed) is None

    flip_byte(path, weights_offset(path))
    actual = file_crc32c(path)
    assert verify(listed) == f"crc32c mismatch (manifest {entry.crc32c}, file {actual})"
    unlisted = Candidate(Checkpoint(entry.file, 1), path, listed=False)
    assert verify(unlisted) == "not an intact .keras archive (CRC error in model.weights.h5)"

    path.write_bytes(path.read_bytes()[:-100])  # a torn upload: the central directory is gone
    assert verify(listed) == f"size mismatch (manifest {entry.size} bytes, file {entry.size - 100} bytes)"
    problem = verify(unlisted)
    assert problem is not None and problem.startswith("not an intact .keras archive")

    path.unlink()
    assert verify(listed) == "named by latest.json but missing"
    not_keras = tmp_path / "ckpt-000009.keras"
    with zipfile.ZipFile(not_keras, "w") as archive:
        archive.writestr("something.txt", "x")
    assert archive_problem(not_keras) == "not a .keras archive (no metadata.json, config.json)"


def test_resume_takes_the_newest_that_verifies_and_says_why_it_skipped(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    publish(store, 1)
    publish(store, 2)
    torn = publish(store, 2, 3)
    flip_byte(tmp_path / torn.file, weights_offset(tmp_path / torn.file))
    lines: list[str] = []
    chooser = ResumeChooser.open(tmp_path, lines.append)
    chosen = chooser.next_verified()
    assert chosen is not None and chosen.name == "ckpt-000002.keras" and chosen.listed
    assert lines == [
        f"[trainer] skipping ckpt-000002-s000003.keras: crc32c mismatch (manifest {torn.crc32c}, "
        f"file {file_crc32c(tmp_path / torn.file)})"
    ]
    # Training goes on from epoch 2: the manifest keeps it and the older one, not the torn newer one.
    assert [c.file for c in chooser.history_for(chosen)] == ["ckpt-000002.keras", "ckpt-000001.keras"]
    # A checkpoint that verifies but does not load is skipped too, and the next one is offered.
    chooser.skip(chosen, "failed to load (ValueError: boom)")
    fallback = chooser.next_verified()
    assert fallback is not None and fallback.name == "ckpt-000001.keras"
    assert lines[-1] == "[trainer] skipping ckpt-000002.keras: failed to load (ValueError: boom)"


@pytest.mark.parametrize("manifest", [b"{not json", b"[1, 2]", b'{"checkpoints": [{"file": "../x.keras"}]}'])
def test_a_broken_manifest_falls_back_to_a_directory_scan(tmp_path: Path, manifest: bytes) -> None:
    store = CheckpointStore(tmp_path)
    publish(store, 2)
    publish(store, 2, 1)  # newer, though "ckpt-000002-s000001.keras" < "ckpt-000002.keras" lexically
    (tmp_path / "latest.json").write_bytes(manifest)
    lines: list[str] = []
    chooser = ResumeChooser.open(tmp_path, lines.append)
    chosen = chooser.next_verified()
    assert chosen is not None and chosen.name == "ckpt-000002-s000001.keras" and not chosen.listed
    assert chosen.keras == "keras3"  # from the archive's metadata.json, as the manifest cannot say
    assert lines[0].startswith("[trainer] checkpoints/latest.json is unreadable: ")
    assert lines[0].endswith("; scanning checkpoints/ instead")
    assert lines[1] == "[trainer] ckpt-000002-s000001.keras is not in latest.json; its zip CRCs verify"
    # The manifest written next needs facts for what the scan found.
    history = chooser.history_for(chosen)
    assert [c.file for c in history] == ["ckpt-000002-s000001.keras", "ckpt-000002.keras"]
    assert all(c.crc32c == file_crc32c(tmp_path / c.file) for c in history)


def test_a_stale_manifest_naming_missing_files_falls_back_to_the_scan(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    publish(store, 1)
    gone = publish(store, 2)
    (tmp_path / gone.file).unlink()
    make_archive(tmp_path / "ckpt-000001-s000002.keras", b"w")  # saved, then a crash before the manifest
    lines: list[str] = []
    chooser = ResumeChooser.open(tmp_path, lines.append)
    chosen = chooser.next_verified()
    assert chosen is not None and chosen.name == "ckpt-000001-s000002.keras"
    assert lines[:2] == [
        "[trainer] checkpoints/latest.json names missing files; scanning checkpoints/ too",
        "[trainer] skipping ckpt-000002.keras: named by latest.json but missing",
    ]


def test_nothing_verifies_or_nothing_there(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for epoch in (1, 2):
        entry = publish(store, epoch)
        (tmp_path / entry.file).write_bytes(b"garbage")
    lines: list[str] = []
    chooser = ResumeChooser.open(tmp_path, lines.append)
    assert chooser.next_verified() is None
    assert chooser.found_any and [name for name, _ in chooser.skipped] == ["ckpt-000002.keras", "ckpt-000001.keras"]
    assert chooser.history_for(None) == []

    empty: list[str] = []
    fresh = ResumeChooser.open(tmp_path / "none", empty.append)
    assert fresh.next_verified() is None and not fresh.found_any and empty == []


def test_a_format_1_manifest_still_resumes(tmp_path: Path) -> None:
    make_archive(tmp_path / "ckpt-000001.keras", b"w", keras_version="2.20.1")
    (tmp_path / "latest.json").write_text('{"epoch": 1, "path": "ckpt-000001.keras", "keras": "tf_keras"}')
    chooser = ResumeChooser.open(tmp_path, print)
    chosen = chooser.next_verified()
    assert chosen is not None and chosen.listed and chosen.keras == "tf_keras"
    assert archive_keras(tmp_path / "ckpt-000001.keras") == "tf_keras"


def test_manifest_entries_are_validated() -> None:
    with pytest.raises(ManifestError, match="not JSON"):
        parse_manifest(b"")
    with pytest.raises(ManifestError, match="lists no checkpoint"):
        parse_manifest(b"{}")
    with pytest.raises(ManifestError, match="is not a checkpoint file name"):
        parse_manifest(b'{"checkpoints": [{"file": "../../etc/passwd", "epochs_done": 1}]}')
    with pytest.raises(ManifestError, match="malformed"):
        parse_manifest(b'{"checkpoints": [{"file": "ckpt-000001.keras", "epochs_done": "one"}]}')


def test_policy_by_epochs_and_by_wall_clock() -> None:
    by_epochs = CheckpointPolicy(every_epochs=2, every_seconds=None, last_epoch=5, clock=lambda: 0.0)
    assert [by_epochs.due_at_epoch_end(e) for e in range(1, 6)] == [False, True, False, True, True]
    assert not by_epochs.due_mid_epoch()

    now = [100.0]
    timed = CheckpointPolicy(every_epochs=None, every_seconds=10.0, last_epoch=5, clock=lambda: now[0])
    assert not timed.due_mid_epoch() and not timed.due_at_epoch_end(1)
    now[0] += 10.0
    assert timed.due_mid_epoch() and timed.due_at_epoch_end(2)
    timed.saved()
    assert not timed.due_mid_epoch()
    assert timed.due_at_epoch_end(5)  # always at the final epoch
    with pytest.raises(ValueError):
        CheckpointPolicy(every_epochs=1, every_seconds=10.0, last_epoch=5)
