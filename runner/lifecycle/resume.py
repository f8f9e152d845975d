"""`runner resume RUN`: a run that ended before its job did (cancelled, failed, timed out, hung, lost) goes on, in
its own run directory, from its newest checkpoint.

The same run id and run directory; a new attempt, whose predecessor is kept in the run's history (RunRecord.attempts,
and run.json); the spec as the run directory recorded it (spec.yaml, every default filled in), with `--set`
overrides validated like the file's own fields, recorded in the attempt and in spec.yaml; on the backend the run
ran on, or this machine with --local. The job itself finds the checkpoints where it left them: the run directory
on this machine, or restored onto a new TPU VM by its supervisor (runner.worker.mirror). The new attempt gets its
own max_runtime from now on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner import contract
from runner.backends.base import Backend, MachineState
from runner.checkpoints import Listing, survey
from runner.errors import RunnerError, StorageError, UsageError
from runner.spec import JobSpec
from runner.spec.loader import load_spec_text
from runner.storage import Storage, open_storage
from runner.watch.runs import RunRecord
from runner.watch.state import RunState

RESUMABLE = frozenset({RunState.CANCELLED, RunState.FAILED, RunState.TIMED_OUT, RunState.HUNG, RunState.LOST})


def check_resumable(record: RunRecord, state: RunState) -> None:
    """UsageError (exit 2) unless the run has ended short of its end."""
    if state in RESUMABLE:
        return
    if state == RunState.SUCCEEDED:
        raise UsageError(
            f"run {record.run_id} succeeded: it ran to its end, and there is nothing left of it to resume",
            hint="`runner submit` starts a new run; `runner resume` continues one that stopped short",
        )
    raise UsageError(
        f"run {record.run_id} is {state}: it has not ended",
        hint=f"`runner status {record.run_id}` follows it; `runner down {record.run_id}` stops it, and then it can "
        "be resumed",
    )


def resumable_now(run: str, say: Callable[[str], None]) -> tuple[RunRecord, RunState, Storage]:
    """The run (by id or run directory), its state now and its run directory; UsageError unless it can be
    resumed."""
    from runner.backends import run_state
    from runner.watch.lookup import resolve
    from runner.watch.rundir import read_snapshot

    record = resolve(run)
    storage = open_storage(record.run_dir)
    warnings: list[str] = []
    state = run_state(record, read_snapshot(storage, with_metrics=False), warnings)
    for warning in warnings:
        say(f"warning: {warning}")
    check_resumable(record, state)
    return record, state, storage


def no_machines_left(record: RunRecord, backend: Backend[Any]) -> None:
    """UsageError while a machine an earlier attempt created is still there (its record keeps it until it is
    confirmed gone): the next attempt's machine would take its name, or run beside it."""
    for data in record.machines:
        try:
            handle = backend.handle_from_dict(data)
            state = backend.status(handle)
        except RunnerError:
            continue  # a handle this runner cannot read: nothing it could do with it either
        if state != MachineState.GONE:
            raise UsageError(
                f"run {record.run_id}: {backend.describe_handle(handle)} of an earlier attempt is still there "
                f"({state}): a new attempt would run beside it",
                hint=f"`runner down {record.run_id}` deletes it; then resume",
            )


def recorded_spec(storage: Storage, run_dir: str, overrides: list[str]) -> JobSpec:
    """The spec the run directory recorded, with `overrides` (--set) applied and validated like the file's."""
    raw = storage.read_bytes(contract.SPEC)
    if raw is None:
        raise StorageError(f"{run_dir}/{contract.SPEC} is missing: the run's spec cannot be recovered")
    return load_spec_text(raw.decode(errors="replace"), f"{run_dir}/{contract.SPEC}", overrides)


def resume_note(storage: Storage) -> str:
    """What the next attempt continues from, as the run directory shows it (runner.checkpoints: the newest committed
    checkpoint, of any format): a job that wrote no checkpoints is not promised a resume."""
    try:
        newest = survey(Listing.of_storage(storage, contract.CHECKPOINTS + "/")).newest()
    except RunnerError:
        return "the job resumes from its newest checkpoint, if it wrote one (the run directory cannot be read now)"
    if newest is None:
        return (
            f"the job starts over: it wrote no checkpoints to {contract.CHECKPOINT_DIR} "
            "(runner.train.keras_callbacks() writes them)"
        )
    return f"the job resumes from its newest checkpoint, {newest.title}"


# What a checkpoint holds depends on these: another model's weights do not load into this one, and a model built
# for other data has other shapes. A resume that changes one cannot go on from the run's checkpoints.
MEANING = ("model", "data", "dataset")
FRESH_FLAG = "--fresh"


def meaning_changes(before: JobSpec, after: JobSpec) -> list[str]:
    """What the overrides change of what the run's checkpoints mean: ['training.model: mnist_cnn -> mnist_mlp']."""
    if before.training is None or after.training is None:
        return []
    old, new = before.training, after.training
    return [
        f"training.{name}: {getattr(old, name)} -> {getattr(new, name)}"
        for name in MEANING
        if getattr(old, name) != getattr(new, name)
    ]


def check_meaning(record: RunRecord, storage: Storage, spec: JobSpec, overrides: list[str], fresh: bool) -> None:
    """UsageError (exit 2) when `overrides` change what the run's checkpoints mean and it has some, unless the
    caller asked to start over (--fresh)."""
    if fresh or not overrides:
        return
    changes = meaning_changes(recorded_spec(storage, record.run_dir, []), spec)
    if not changes or not storage.list(contract.CHECKPOINTS + "/"):
        return
    raise UsageError(
        f"run {record.run_id}: --set {' '.join(overrides)} changes what its checkpoints mean ({'; '.join(changes)}): "
        "they would not load into the new model, or would train it on data of another shape",
        hint=f"`runner resume {record.run_id} {FRESH_FLAG} --set ...` starts training over, keeping the old "
        f"checkpoints and metrics aside in the run directory (under {ASIDE}/)",
    )


ASIDE = "set-aside"


def set_aside(storage: Storage, attempt: int) -> tuple[str, int]:
    """Move the run's checkpoints and metrics under `set-aside/before-attempt-N/` (each copied, checked, then
    deleted): the next attempt starts over, and nothing it cannot use is lost. Returns (prefix, objects moved)."""
    import tempfile
    from pathlib import Path

    prefix = f"{ASIDE}/before-attempt-{attempt}/"
    objects = [*storage.list(contract.CHECKPOINTS + "/"), *storage.list(contract.METRICS)]
    objects = [o for o in objects if o.key == contract.METRICS or o.key.startswith(contract.CHECKPOINTS + "/")]
    with tempfile.TemporaryDirectory(prefix="runner-aside-") as tmp:
        copy = Path(tmp) / "object"
        for obj in objects:
            if not storage.download_file(obj.key, copy):
                continue  # gone since the listing: nothing to keep
            storage.upload_file(copy, prefix + obj.key)
            kept = storage.list(prefix + obj.key)
            if not kept or kept[0].size != copy.stat().st_size:
                raise StorageError(f"{prefix + obj.key} did not keep {obj.key}: it is left where it was")
            storage.delete(obj.key)
    return prefix.rstrip("/"), len(objects)
