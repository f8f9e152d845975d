"""The trainer's checkpoints: publishing, rotation, and the choice of the one to resume from. The files and their
manifest are the runner's Keras format (runner.checkpoints.keras); its names are here too, where the trainer's code
has always found them.

Publishing: Keras writes a hidden temporary file, which is renamed to its final name, then the manifest is rewritten
(atomically), and only then are checkpoints beyond the newest `keep` deleted. A reader thus never finds a manifest
naming a file that was not complete, and the mirror (which uploads oldest first, and deletes what rotation removed
after uploading) gives the bucket the same guarantee.

Resuming: the newest checkpoint that verifies wins (runner.checkpoints.keras.verify_file: size and crc32c against
the manifest, and an intact .keras zip; a file the manifest does not name, its zip only).

No TensorFlow import here: the trainer reads the manifest before it chooses which Keras to import.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from runner import contract
from runner.checkpoints.keras import (
    ARCHIVE_MEMBERS,
    DEFAULT_KEEP,
    MANIFEST,
    MANIFEST_FORMAT,
    NAME_RE,
    NUMPY_SHUFFLE,
    TEMP_SUFFIX,
    TF_SHUFFLE,
    Checkpoint,
    DataOrder,
    ManifestError,
    Position,
    archive_keras,
    archive_problem,
    checkpoint_name,
    describe,
    file_crc32c,
    manifest_bytes,
    parse_manifest,
    parse_name,
    read_manifest,
    scan,
    verify_file,
)
from runner.storage.local import write_atomic

__all__ = [  # the Keras format's names, as the trainer's code and its tests import them
    "ARCHIVE_MEMBERS",
    "DEFAULT_KEEP",
    "MANIFEST",
    "MANIFEST_FORMAT",
    "NAME_RE",
    "NUMPY_SHUFFLE",
    "TEMP_SUFFIX",
    "TF_SHUFFLE",
    "Candidate",
    "Checkpoint",
    "CheckpointPolicy",
    "CheckpointStore",
    "DataOrder",
    "ManifestError",
    "Position",
    "ResumeChooser",
    "archive_keras",
    "archive_problem",
    "checkpoint_name",
    "describe",
    "file_crc32c",
    "manifest_bytes",
    "parse_manifest",
    "parse_name",
    "read_manifest",
    "scan",
    "scratch_dir",
    "verify",
]


class CheckpointStore:
    """Publishes checkpoints into one directory and keeps its manifest and rotation. `history` is what the manifest
    lists, newest first; the trainer seeds it at resume with the checkpoints older than the one it resumed from."""

    def __init__(self, directory: Path, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = directory
        self.keep = keep
        self.history: list[Checkpoint] = []

    def temp_path(self, name: str) -> Path:
        """Hidden, so the mirror never uploads a checkpoint Keras is still writing."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return self.directory / f".{name}{TEMP_SUFFIX}"

    def publish(self, tmp: Path, checkpoint: Checkpoint) -> Checkpoint:
        """Rename the finished temporary file to checkpoint.file, list it in the manifest with its size and crc32c,
        then rotate. Returns the entry as listed."""
        with tmp.open("rb") as f:
            os.fsync(f.fileno())  # the rename must not reach the disk before the data
        entry = replace(
            checkpoint,
            size=tmp.stat().st_size,
            crc32c=file_crc32c(tmp),
            time=round(time.time(), 3) if checkpoint.time is None else checkpoint.time,
        )
        final = self.directory / entry.file
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        # Anything at or after this position belongs to a timeline this run has left (resumed from an older one).
        older = [c for c in self.history if c.position < entry.position and c.file != entry.file]
        self.history = [entry, *older][: self.keep]
        write_atomic(self.directory / MANIFEST, manifest_bytes(self.history))
        self._rotate()
        return entry

    def _rotate(self) -> None:
        """Delete checkpoint files the manifest no longer lists (rotated, torn, or from an abandoned timeline), and
        temporary files a killed save left behind."""
        kept = {c.file for c in self.history}
        for path in list(self.directory.iterdir()):
            stale_temp = path.name.startswith(".ckpt-") and path.name.endswith(TEMP_SUFFIX)
            if (parse_name(path.name) is not None and path.name not in kept) or stale_temp:
                path.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not every platform opens directories; the rename is still atomic
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Candidate:
    """A checkpoint that may be resumed from. `listed`: named by a readable manifest, so its size and crc32c are
    checked too; otherwise found by a directory scan and checked by its zip CRCs only."""

    checkpoint: Checkpoint
    path: Path
    listed: bool

    @property
    def name(self) -> str:
        return self.checkpoint.file

    @property
    def keras(self) -> str | None:
        return self.checkpoint.keras or archive_keras(self.path)

    @property
    def framework(self) -> str | None:
        """The engine that wrote it; None for a checkpoint found by a directory scan (its archive does not say)."""
        return self.checkpoint.framework if self.listed else None


def verify(candidate: Candidate) -> str | None:
    """Why the candidate cannot be resumed from, or None when it verifies."""
    return verify_file(candidate.path, candidate.checkpoint if candidate.listed else None)


@dataclass
class ResumeChooser:
    """Walks the checkpoints in `directory` newest first and hands out those that verify, noting why it skipped
    others. Build it with ResumeChooser.open; `say` gets every line meant for the job's log."""

    directory: Path
    candidates: list[Candidate]
    say: Callable[[str], None]
    manifest_problem: str | None = None  # "is missing", "is unreadable: ...", or None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    _next: int = 0

    @property
    def found_any(self) -> bool:
        """Whether there was anything to resume from: a manifest (readable or not) or a checkpoint file."""
        return bool(self.candidates) or self.manifest_problem != "is missing"

    @classmethod
    def open(cls, directory: Path, say: Callable[[str], None] = print) -> ResumeChooser:
        listed: list[Checkpoint] = []
        problem = None
        try:
            listed = read_manifest(directory)
        except FileNotFoundError:
            problem = "is missing"
        except ManifestError as exc:
            problem = f"is unreadable: {exc}"
        on_disk = scan(directory)
        if problem and (on_disk or problem != "is missing"):
            say(f"[trainer] {contract.LATEST_CHECKPOINT} {problem}; scanning {contract.CHECKPOINTS}/ instead")
        elif any(not (directory / c.file).is_file() for c in listed):
            say(f"[trainer] {contract.LATEST_CHECKPOINT} names missing files; scanning {contract.CHECKPOINTS}/ too")
        # Listed entries keep their manifest facts; files the manifest does not name join by their names' positions.
        names = {c.file for c in listed}
        candidates = [Candidate(c, directory / c.file, listed=True) for c in listed]
        candidates += [Candidate(c, directory / c.file, listed=False) for c in on_disk if c.file not in names]
        candidates.sort(key=lambda c: c.checkpoint.position, reverse=True)
        return cls(directory, candidates, say, manifest_problem=problem)

    def skip(self, candidate: Candidate, reason: str) -> None:
        self.skipped.append((candidate.name, reason))
        self.say(f"[trainer] skipping {candidate.name}: {reason}")

    def next_verified(self) -> Candidate | None:
        """The next newest checkpoint that verifies, or None when none is left."""
        while self._next < len(self.candidates):
            candidate = self.candidates[self._next]
            self._next += 1
            problem = verify(candidate)
            if problem is None:
                if not candidate.listed:
                    self.say(f"[trainer] {candidate.name} is not in {MANIFEST}; its zip CRCs verify")
                return candidate
            self.skip(candidate, problem)
        return None

    def history_for(self, chosen: Candidate | None) -> list[Checkpoint]:
        """What the manifest keeps listing once training goes on from `chosen`: it and the older checkpoints still
        on disk, newest first (older ones unverified: a later resume verifies them if it needs them)."""
        if chosen is None:
            return []
        bad = {name for name, _ in self.skipped}
        out = []
        for c in self.candidates:
            if c.checkpoint.position > chosen.checkpoint.position or c.name in bad or not c.path.is_file():
                continue
            entry = c.checkpoint
            if entry.size is None or entry.crc32c is None:  # scanned: the manifest needs its facts
                entry = replace(entry, size=c.path.stat().st_size, crc32c=file_crc32c(c.path), keras=c.keras)
            out.append(entry)
        return out


class CheckpointPolicy:
    """When to save: every `every_epochs` epochs, or once `every_seconds` of wall-clock time have passed since the
    last save (checked at step ends, so mid-epoch too, and at epoch ends); always at the final epoch."""

    def __init__(
        self,
        every_epochs: int | None,
        every_seconds: float | None,
        last_epoch: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (every_epochs is None) == (every_seconds is None):
            raise ValueError("give exactly one of every_epochs and every_seconds")
        self.every_epochs, self.every_seconds, self.last_epoch = every_epochs, every_seconds, last_epoch
        self.clock = clock
        self._last = clock()

    def saved(self) -> None:
        self._last = self.clock()

    def due_mid_epoch(self) -> bool:
        return self.every_seconds is not None and self.clock() - self._last >= self.every_seconds

    def due_at_epoch_end(self, epochs_done: int) -> bool:
        if epochs_done >= self.last_epoch:
            return True
        if self.every_epochs is not None:
            return epochs_done % self.every_epochs == 0
        return self.due_mid_epoch()


def scratch_dir() -> Path:
    """Where a non-chief worker saves its checkpoints. Saving is collective (under MultiWorkerMirroredStrategy; on
    JAX, model.save checks each array is the same on every process), so every worker saves at the same points, all
    but the chief to a temporary directory that is deleted on exit
    (tensorflow.org/tutorials/distribute/multi_worker_with_keras, "Model saving and loading")."""
    path = Path(tempfile.mkdtemp(prefix="runner-worker-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
