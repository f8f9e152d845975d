"""Run records: what this machine's runner knows about the runs it submitted ($RUNNER_HOME/runs/<id>.json).

A record holds where the run directory is and the backend's handle, so `runner status`, `logs` and `list` work
from another shell, or after the submitting process died. Everything else about a run is read from its run
directory; a lost record only costs the shortcut (`runner status <run-dir>` still works).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner.errors import RunNotFound, StorageError
from runner.storage.local import write_atomic
from runner.watch.state import RunState

# What a run id can be (plan.new_run_id writes <name>-<stamp>-<hex>); also a prefix of one, for `runner status`.
# fullmatch, not '$', which would let a trailing newline through; 200 keeps "<id>.json" within a file name's limit.
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def runner_home() -> Path:
    """$RUNNER_HOME, else $XDG_STATE_HOME/tpu-runner, else ~/.local/state/tpu-runner."""
    if os.environ.get("RUNNER_HOME"):
        return Path(os.environ["RUNNER_HOME"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "tpu-runner"


class Attempt(BaseModel):
    """One earlier attempt of a run that `runner resume` continued: how it ended."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    started_at: float
    finished_at: float | None = None
    state: RunState
    reason: str | None = None
    backend: str
    overrides: list[str] = Field(default_factory=list)  # the --set values this attempt was started with


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    run_id: str
    job: str
    backend: str
    run_dir: str
    spec_path: str | None = None
    created_at: float
    deadline: float | None = None
    num_workers: int = 1
    state: RunState = RunState.PENDING
    finished_at: float | None = None
    handle: dict[str, Any] = Field(default_factory=dict)
    reason: str | None = None  # why a run ended as it did, when the runner decided it (a deadline, a silent VM)
    attempts: list[Attempt] = Field(default_factory=list)  # the earlier attempts, oldest first (`runner resume`)
    started_at: float | None = None  # when this attempt began (created_at for the first)
    overrides: list[str] = Field(default_factory=list)  # this attempt's --set values
    # What may still bill, and how to delete it, when a deletion failed or was not confirmed; None once it is gone.
    still_billing: str | None = None
    # Every machine (handle) the run asked to create and that is not confirmed gone, oldest first: `runner down`
    # deletes each of them, whichever one `handle` names now.
    machines: list[dict[str, Any]] = Field(default_factory=list)
    down_at: float | None = None  # when `runner down` stopped the run (its follower then ends it `cancelled`)

    def updated(self, **changes: Any) -> RunRecord:
        return self.model_copy(update=changes)


def _path(run_id: str) -> Path:
    return runner_home() / "runs" / f"{run_id}.json"


def _refused(path: Path, exc: OSError) -> StorageError:
    """This machine's disk refusing a run record, said as what it is: full, read-only, or not ours to write."""
    home = runner_home()
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why, hint = "the disk is full", "free some space on that disk, or point $RUNNER_HOME at another one"
    elif exc.errno == errno.EROFS:
        why, hint = f"{home} is on a read-only file system", "point $RUNNER_HOME at a writable directory"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why, hint = f"{home} is not writable by this user", "point $RUNNER_HOME at a writable directory"
    else:
        why, hint = exc.strerror or str(exc), "point $RUNNER_HOME at another directory"
    said = exc.strerror or str(exc)
    return StorageError(f"cannot save the run record {path}: {said}" + (f" ({why})" if why != said else ""), hint=hint)


def save(record: RunRecord) -> RunRecord:
    """Write the record; StorageError (exit 4) when this machine's disk refuses it (full, read-only)."""
    path = _path(record.run_id)
    try:
        write_atomic(path, record.model_dump_json(indent=1).encode())
    except OSError as exc:
        raise _refused(path, exc) from None
    return record


@contextmanager
def locked(run_id: str) -> Iterator[None]:
    """An exclusive lock on the run's record among this machine's runners (flock on a hidden file beside it): what
    is read under it is not changed by anyone else until it is written back."""
    path = _path(run_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _refused(path, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def update(record: RunRecord, **changes: Any) -> RunRecord:
    """`changes` applied to the record as it is on disk now (`record` when it is not there, or unreadable), under
    the run's lock: what another runner wrote meanwhile (`runner down`'s stop) stays unless changed here."""
    with locked(record.run_id):
        path = _path(record.run_id)
        current = record
        if path.is_file():
            with suppress(StorageError):  # a corrupt record is replaced by this one
                current = _read(path)
        return save(current.updated(**changes))


def _read(path: Path) -> RunRecord:
    """One record file. StorageError (exit 4) naming the file when it cannot be read or is not a record: the run
    it describes may well exist, so "no such run" (exit 3) would send a script the wrong way."""
    try:
        record = RunRecord.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise StorageError(f"run record {path} cannot be read: {exc.strerror}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        reason = first["msg"] if first["type"] == "json_invalid" else f"{where or 'record'}: {first['msg']}"
        raise StorageError(
            f"run record {path} is corrupt: {reason}",
            hint="delete it; the run directory (<storage>/runs/<run id>) still has everything "
            "`runner status <run directory>` needs",
        ) from None
    if not valid_run_id(record.run_id):  # save() names the file after it: a '/' in it would write elsewhere
        raise StorageError(f"run record {path} is corrupt: {record.run_id!r} is not a run id")
    return record


def valid_run_id(text: str) -> bool:
    """Whether `text` can be a run id (or a prefix of one). A record's file name is the run id, so an id read from
    a command line or someone's run.json must pass this before it names a file: no '/', no '..' at the start."""
    return bool(_RUN_ID_RE.fullmatch(text))


def load(run_id: str) -> RunRecord:
    """The record of `run_id`, or of the one run whose id starts with it."""
    if not valid_run_id(run_id):
        raise RunNotFound(
            f"{run_id!r} is not a run id (lowercase letters, digits and '-')",
            hint="`runner list` shows the runs submitted here",
        )
    path = _path(run_id)
    if not path.exists():
        stems = sorted(p.stem for p in _record_files() if p.stem.startswith(run_id))
        if len(stems) > 1:
            raise RunNotFound(f"{run_id!r} matches {len(stems)} runs: " + ", ".join(stems[:5]))
        if not stems:
            raise RunNotFound(
                f"no run {run_id!r} on this machine",
                hint="`runner list` shows the runs submitted here; "
                "`runner status <run directory>` reads any run directory directly",
            )
        path = _path(stems[0])
    return _read(path)


def _record_files() -> list[Path]:
    directory = runner_home() / "runs"
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def list_records(problems: list[str] | None = None) -> list[RunRecord]:
    """Every readable record, newest first. One that cannot be read is skipped, and named in `problems` when it is
    given, so that one corrupt file hides neither the other runs nor itself."""
    out = []
    for path in _record_files():
        try:
            out.append(_read(path))
        except StorageError as exc:
            if problems is not None:
                problems.append(exc.message)
    return sorted(out, key=lambda r: r.created_at, reverse=True)


def record_from_run_dir(run_info: dict[str, Any], run_dir: str) -> RunRecord:
    """A record rebuilt from a run directory's run.json (a run submitted elsewhere)."""
    return RunRecord.model_validate({**run_info, "run_dir": run_dir, "state": RunState.PENDING})


def run_info(record: RunRecord) -> bytes:
    """run.json: the part of the record that belongs in the run directory."""
    fields = record.model_dump(
        mode="json",
        include={"run_id", "job", "backend", "created_at", "deadline", "num_workers", "handle", "attempts", "machines"},
    )
    return json.dumps(fields, indent=1).encode()
