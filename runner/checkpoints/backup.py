"""Keras 3's BackupAndRestore: one backup, rewritten in place at every save, in the job's backup_dir.

    backup/latest.weights.h5          the model's and optimizer's state
    backup/training_metadata.json     {"epoch": 3, "batch": 0}: where fit goes on from
    backup/*.bkp                      the previous save (double_checkpoint=True)

It counts once its weights file is there; every file of it comes back to a new machine. (tf_keras' BackupAndRestore
writes TensorFlow checkpoints in backup_dir/chief/: runner.checkpoints.tensorflow.)
"""

from __future__ import annotations

import json

from runner.checkpoints.base import Format, Found, Listing, Saved, newest_time, total_size

WEIGHTS = "latest.weights.h5"
METADATA = "training_metadata.json"
FILES = (WEIGHTS, METADATA, f"{WEIGHTS}.bkp", f"{METADATA}.bkp")


class KerasBackup(Format):
    label = "BackupAndRestore"

    def find(self, listing: Listing, unclaimed: set[str]) -> Found:
        found = Found()
        backups = {k.removesuffix(WEIGHTS).rstrip("/") for k in unclaimed if k.rpartition("/")[2] == WEIGHTS}
        for directory in sorted(backups):
            base = f"{directory}/" if directory else ""
            keys = [base + name for name in FILES if base + name in unclaimed]
            epoch = _epoch(listing.read(base + METADATA)) if base + METADATA in unclaimed else None
            shown = f"{directory or '.'}/ ({self.label}" + (f", epoch {epoch})" if epoch is not None else ")")
            found.saved.append(
                Saved(
                    format=self.label,
                    path=directory or ".",
                    keys=tuple(keys),
                    committed=True,
                    series=f"{directory}/{WEIGHTS}",
                    epochs_done=epoch,
                    size=total_size(listing, keys),
                    time=newest_time(listing, keys),
                    shown=shown,
                )
            )
        return found


def _epoch(raw: bytes | None) -> int | None:
    """The epochs done, from training_metadata.json (None when it does not say: being rewritten, or unreadable)."""
    try:
        epoch = json.loads(raw or b"")["epoch"]
    except (ValueError, TypeError, KeyError):
        return None
    return epoch if isinstance(epoch, int) else None
