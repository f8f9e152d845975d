"""Checkpoints in a checkpoint directory (RUNNER_CHECKPOINT_DIR on the machine, checkpoints/ in the run
directory), whoever wrote them, through one interface (runner.checkpoints.base, after Orbax's CheckpointManager:
its checkpoints, whether each is committed, verify one, what brings the newest back onto a new machine), one
small class per format:

    format            what it reads                                         a checkpoint counts once
    Keras             ckpt-*.keras + latest.json (the built-in trainer,     it is there (it appears by a rename);
                      keras_callbacks(): runner.checkpoints.keras)          resumed from when it verifies
    Orbax             <step>/ directories of a CheckpointManager            its commit_success.txt, or on a local
                      (runner.checkpoints.orbax)                            disk the rename of its temporary dir
    TensorFlow        <prefix>-<N>.index + .data-*-of-* shards, `checkpoint` its index and every shard are there
    BackupAndRestore  Keras 3's backup_dir: latest.weights.h5 + metadata    its weights file is there
    files             any other numbered series (ModelCheckpoint's)         it is there

checkpoints/shared/ (RUNNER_SHARED_CHECKPOINT_DIR) is the one location every host of a job writes (a multi-host
Orbax CheckpointManager's): read where it is, in the run directory, and never mirrored or restored per host.

The supervisor's mirror (what it uploads and in what order, what it deletes from the bucket, what it brings back),
`runner status` and the report (what is listed, the newest), the trainer (what it resumes from) and the
supervisor's word on where a command job goes on from all read checkpoints here. Standard library only (and the
storage it reads): the supervisor stays light.

    from runner.checkpoints import Listing, survey

    newest = survey(Listing.of_directory(path)).newest()     # 'step 640 (Orbax)'
"""

from runner.checkpoints.base import Format, Found, Listing, Saved
from runner.checkpoints.orbax import SHARED, committed_steps, newest_step
from runner.checkpoints.survey import FORMATS, RESUMABLE, Survey, resume_point, survey

__all__ = [
    "FORMATS",
    "RESUMABLE",
    "SHARED",
    "Format",
    "Found",
    "Listing",
    "Saved",
    "Survey",
    "committed_steps",
    "newest_step",
    "resume_point",
    "survey",
]
