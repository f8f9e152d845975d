"""Run records: what this machine's runner knows about the runs it submitted ($RUNNER_HOME/runs/<id>.json).

A record holds where the run directory is and the backend's handle, so `runner status`, `logs` and `list` work
from another shell, or after the submitting process died. Everything else about a run is read from its run
directory; a lost record only costs the shortcut (`runner status <run-dir>` still works).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runner.errors import RunNotFound
from runner.status import RunState
from runner.storage.local import write_atomic


def runner_home() -> Path:
    """$RUNNER_HOME, else $XDG_STATE_HOME/tpu-runner, else ~/.local/state/tpu-runner."""
    if os.environ.get("RUNNER_HOME"):
        return Path(os.environ["RUNNER_HOME"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "tpu-runner"


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
    note: str | None = None

    def updated(self, **changes: Any) -> RunRecord:
        return self.model_copy(update=changes)


def _path(run_id: str) -> Path:
    return runner_home() / "runs" / f"{run_id}.json"


def save(record: RunRecord) -> RunRecord:
    write_atomic(_path(record.run_id), record.model_dump_json(indent=1).encode())
    return record


def load(run_id: str) -> RunRecord:
    path = _path(run_id)
    if not path.is_file():
        matches = [r for r in list_records() if r.run_id.startswith(run_id)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise RunNotFound(f"{run_id!r} matches {len(matches)} runs: " + ", ".join(r.run_id for r in matches[:5]))
        raise RunNotFound(
            f"no run {run_id!r} on this machine",
            hint="`runner list` shows the runs submitted here; "
            "`runner status <run directory>` reads any run directory directly",
        )
    return RunRecord.model_validate_json(path.read_text())


def list_records() -> list[RunRecord]:
    out = []
    for path in (runner_home() / "runs").glob("*.json"):
        try:
            out.append(RunRecord.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: r.created_at, reverse=True)


def record_from_run_dir(run_info: dict[str, Any], run_dir: str) -> RunRecord:
    """A record rebuilt from a run directory's run.json (a run submitted elsewhere)."""
    return RunRecord.model_validate({**run_info, "run_dir": run_dir, "state": RunState.PENDING})


def run_info(record: RunRecord) -> bytes:
    """run.json: the part of the record that belongs in the run directory."""
    fields = record.model_dump(
        mode="json", include={"run_id", "job", "backend", "created_at", "deadline", "num_workers", "handle"}
    )
    return json.dumps(fields, indent=1).encode()
