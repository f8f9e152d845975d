"""Every checkpoint in a checkpoint directory, by format: each format is asked in turn among the objects no
earlier one claimed (the runner's files, Orbax steps, TensorFlow saves, a BackupAndRestore backup, then any other
files)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from runner.checkpoints.backup import KerasBackup
from runner.checkpoints.base import Format, Found, Listing, Saved
from runner.checkpoints.keras import KerasFiles
from runner.checkpoints.orbax import OrbaxSteps
from runner.checkpoints.series import NumberedFiles
from runner.checkpoints.tensorflow import TensorFlowSaves

FORMATS: tuple[Format, ...] = (KerasFiles(), OrbaxSteps(), TensorFlowSaves(), KerasBackup(), NumberedFiles())
# Formats a job resumes from by itself at its start (CheckpointManager.latest_step(), tf.train.CheckpointManager's
# state file, BackupAndRestore): their newest committed checkpoint is where a job that uses them goes on from.
RESUMABLE = ("Orbax", "TensorFlow", "BackupAndRestore")


def format_of(label: str) -> Format:
    return next(f for f in FORMATS if f.label == label)


@dataclass(frozen=True)
class Survey:
    found: dict[str, Found]  # by format label, in FORMATS' order

    @property
    def saved(self) -> list[Saved]:
        return [s for found in self.found.values() for s in found.saved]

    def committed(self) -> list[Saved]:
        """Every committed checkpoint, newest first (by when it was saved, then its rank in its series)."""
        return sorted(
            (s for s in self.saved if s.committed), key=lambda s: (s.time or 0.0, s.order, s.path), reverse=True
        )

    def newest(self, formats: tuple[str, ...] | None = None) -> Saved | None:
        """The newest committed checkpoint (of `formats`, when given); never an unfinished one."""
        return next((s for s in self.committed() if formats is None or s.format in formats), None)

    def unfinished(self) -> set[str]:
        """The objects of checkpoints still being written (or abandoned): never uploaded, restored or counted."""
        return {k for s in self.saved if not s.committed for k in s.keys}

    def markers(self) -> set[str]:
        """What makes a checkpoint count (Orbax's commit_success.txt): uploaded after its data, deleted before it."""
        return {m for s in self.saved for m in s.markers}

    def owner(self, key: str) -> Saved | None:
        return next((s for s in self.saved if key in s.keys), None)

    def restore(self, keep: int) -> list[str]:
        """What a new machine needs to go on, every format's (Format.restore), in the order to fetch it."""
        return [key for label, found in self.found.items() for key in format_of(label).restore(found, keep)]

    def problem(self, label: str) -> str | None:
        return self.found[label].problem if label in self.found else None


def survey(listing: Listing) -> Survey:
    unclaimed = set(listing.objects)
    found: dict[str, Found] = {}
    for fmt in FORMATS:
        found[fmt.label] = fmt.find(listing, unclaimed)
        unclaimed -= found[fmt.label].keys
    return Survey(found)


def resume_point(surveys: Iterable[Survey]) -> Saved | None:
    """Where a job that resumes by itself (RESUMABLE: an Orbax CheckpointManager's latest_step(), ...) goes on
    from: the newest committed checkpoint of those formats in any of `surveys` (RUNNER_CHECKPOINT_DIR's, the shared
    location's), None when there is none."""
    found = [saved for each in surveys if (saved := each.newest(RESUMABLE)) is not None]
    return max(found, key=lambda s: (s.time or 0.0, s.order), default=None)
