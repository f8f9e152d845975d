"""Every machine a run asked to create stays in its record (RunRecord.machines) until it is confirmed gone: a zone
the run moved away from, a name it had to change, a machine replaced after a preemption. The run's teardown and
`runner down` delete each of them, not only the one the record's `handle` names now, so that no machine of the run
is left billing with nobody told."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner.backends.base import Backend, MachineState
from runner.errors import RunnerError


def added(machines: list[dict[str, Any]], handle: dict[str, Any]) -> list[dict[str, Any]]:
    """`machines` with `handle` at its end (once)."""
    return [m for m in machines if m != handle] + [handle]


def without(machines: list[dict[str, Any]], handle: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in machines if m != handle]


def clear(
    backend: Backend[Any],
    machines: list[dict[str, Any]],
    *,
    keep: dict[str, Any] | None,
    say: Callable[[str], None],
    grace_s: float = 30.0,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each machine of `machines` but `keep` confirmed gone, deleting those still there that carry this run's
    mark (never another run's of that name; attached ones are never deleted: their teardown leaves them). Returns
    the machines not confirmed gone (`keep` among them) and, for each of those, why."""
    left: list[dict[str, Any]] = []
    notes: list[str] = []
    for data in machines:
        if data == keep:
            left.append(data)
            continue
        try:
            handle = backend.handle_from_dict(data)
            if backend.status(handle) == MachineState.GONE or not backend.owns(handle):
                continue  # gone; or another run's, whose name this run's create found taken (it made none there)
            what = backend.describe_handle(handle)
            say(f"{what} of an earlier try of this run is still there: deleting it")
            if backend.teardown(handle, grace_s=grace_s):
                continue
            notes.append(f"{what} is being deleted, but it is not confirmed gone")
        except RunnerError as exc:
            notes.append(f"{data.get('node_id') or data.get('name') or data}: {exc.message}")
        left.append(data)
    return left, notes
