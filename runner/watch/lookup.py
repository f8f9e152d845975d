"""Finding a run and reading its state now: by id from this machine's records, or straight from a run directory
(a run submitted elsewhere), with what its backend says of its machine (asked by the caller, through the registry:
runner.backends.machine_alive). The CLI's status, logs, list and down all come through here; the run's state itself
is decided by runner.watch.state.derive_state, nowhere else."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from runner.watch.runs import RunRecord

if TYPE_CHECKING:
    from runner.watch.rundir import Snapshot
    from runner.watch.state import RunState


def resolve(run: str) -> RunRecord:
    """A run id from this machine's records, or a run directory read directly (a run submitted elsewhere)."""
    import json
    import stat

    from runner.errors import RunNotFound, StorageError, UsageError
    from runner.spec.loader import shown
    from runner.watch import runs

    if not run.strip():
        raise UsageError("the run id is empty", hint="`runner list` shows the runs submitted here")
    is_dir, not_dir = False, ""  # not_dir: why `run`, as a local path, is no run directory
    if not run.startswith("gs://"):
        try:
            is_dir = stat.S_ISDIR(os.stat(run).st_mode)
            not_dir = "" if is_dir else "is not a directory"
        except (FileNotFoundError, NotADirectoryError):
            not_dir = "no such directory"
        except OSError as exc:  # a name too long, a permission: Path.is_dir() would raise these
            not_dir = exc.strerror or str(exc)
        except ValueError:
            not_dir = "not a valid path"
    if not (run.startswith("gs://") or os.sep in run or is_dir):
        return runs.load(run)

    from pydantic import ValidationError

    from runner import contract
    from runner.spec import check_storage
    from runner.storage import open_storage
    from runner.watch.rundir import json_kind, where

    name = shown(run)
    if run.startswith("gs://"):
        try:
            check_storage(run)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    elif not_dir:
        raise RunNotFound(f"{name}: {not_dir}; give a run id or a run directory (<storage>/runs/<run id>)")
    storage = open_storage(run)
    raw = storage.read_bytes(contract.RUN_INFO)
    if raw is None:
        raise RunNotFound(f"{name}: not a run directory (no {contract.RUN_INFO})")
    info_path = shown(where(storage, contract.RUN_INFO))
    try:
        info = json.loads(raw)
        if not isinstance(info, dict):
            raise ValueError(f"a JSON {json_kind(info)}, not an object")
        record = runs.record_from_run_dir(info, run.rstrip("/"))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise StorageError(f"{info_path} is corrupt: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    except (ValueError, RecursionError) as exc:
        raise StorageError(f"{info_path} is corrupt: {exc}") from None
    if not runs.valid_run_id(record.run_id):  # `down` saves a record named after it: no path in a run id
        raise StorageError(f"{info_path} is corrupt: {record.run_id!r} is not a run id")
    return record


def current_state(record: RunRecord, snapshot: Snapshot, machine_alive: bool | None) -> RunState:
    """The run's state now, from its run directory and whether its machine is up (None: nobody can say)."""
    from runner.watch.state import derive_state

    alive = machine_alive if record.handle and not record.state.is_terminal() else None
    return derive_state(snapshot, record.num_workers, record.state, machine_alive=alive, heartbeat_timeout_s=60)
