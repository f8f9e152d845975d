"""Finding a run and reading its state now: by id from this machine's records, or straight from a run directory
(a run submitted elsewhere), with what the backend says of its machine. The CLI's status, logs, list and down all
come through here; the run's state itself is decided by runner.watch.state.derive_state, nowhere else."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from runner.backends import backend_named
from runner.watch.runs import RunRecord

if TYPE_CHECKING:
    from runner.backends.base import Backend
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


def without_bad_handle(record: RunRecord, warnings: list[str]) -> RunRecord:
    """The record as `current_state` may use it: a handle its backend cannot read (a corrupt or foreign record)
    is dropped with a warning, and the state is then judged from the run directory alone."""
    from runner import contract
    from runner.collect.summary import one_line
    from runner.watch import runs

    if not record.handle or record.state.is_terminal():
        return record  # current_state asks no backend about these
    from runner.errors import StorageError

    try:
        backend_named(record.backend).handle_from_dict(record.handle)
    except StorageError as exc:
        local = runs.runner_home() / "runs" / f"{record.run_id}.json"  # else it came from run.json (resolve)
        source = local if local.is_file() else f"{record.run_dir.rstrip('/')}/{contract.RUN_INFO}"
        warnings.append(
            f"{source}: its {one_line(record.backend, 20)} machine handle cannot be read ({exc}); "
            "the state comes from the run directory alone"
        )
        return record.updated(handle={})
    return record


def current_state(record: RunRecord, snapshot: Snapshot, backend: Backend | None = None) -> RunState:
    """The run's state now. Pass `backend` when asking repeatedly (logs -f, list): one API client for all."""
    from runner.backends.base import MachineState
    from runner.errors import RunnerError
    from runner.watch.state import derive_state

    alive = None
    if record.handle and not record.state.is_terminal():
        backend = backend or backend_named(record.backend)
        try:
            machine = backend.status(backend.handle_from_dict(record.handle))
            alive = (
                None if machine == MachineState.UNKNOWN else machine in (MachineState.RUNNING, MachineState.CREATING)
            )
        except RunnerError:
            alive = None  # no credentials or API unreachable: judge by the run directory alone
    return derive_state(snapshot, record.num_workers, record.state, machine_alive=alive, heartbeat_timeout_s=60)
