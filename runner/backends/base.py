"""What every backend provides. A backend makes a machine run the job's container, and takes it away again.

Each backend maps its native states through one table onto MachineState; the run's own state (runner.status)
comes from the run directory, the machine's state only tells whether anything is still there to pay for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any, Protocol, TypeVar

from runner.errors import StorageError
from runner.plan import Plan

H = TypeVar("H")


class MachineState(str, Enum):
    CREATING = "creating"  # requested, not ready yet
    RUNNING = "running"  # up (the job may or may not have started)
    STOPPED = "stopped"  # exists, but does nothing (process exited, VM stopped)
    PREEMPTED = "preempted"  # taken away by the provider; must be deleted and recreated
    DELETING = "deleting"
    GONE = "gone"  # nothing left: nothing to pay for
    UNKNOWN = "unknown"  # the backend cannot tell (API unreachable)

    def is_terminal(self) -> bool:
        return self in (MachineState.GONE, MachineState.STOPPED, MachineState.PREEMPTED)


class Handle(Protocol):
    """A frozen dataclass naming what a backend created, serializable into the run record."""

    def to_dict(self) -> dict[str, Any]: ...


class Backend(Protocol):
    name: str
    ephemeral: bool  # machines end with their job (local processes): the teardown policy does not apply

    def describe(self, plan: Plan) -> list[tuple[str, str]]:
        """What provision() would do, as (label, value) rows for --dry-run. No side effects, no network."""
        ...

    def provision(self, plan: Plan, on_handle: Callable[[Any], None]) -> Handle:
        """Create (or attach to) the machine and start the job on it. `on_handle` receives the handle of what is
        about to be created BEFORE the request that creates it is sent (and again when that changes: another zone,
        another name), so a runner killed at any moment has recorded what may exist. On failure, whatever this
        call created is torn down before raising BackendError; nothing it did not create is ever touched."""
        ...

    def handle_from_dict(self, data: dict[str, Any]) -> Handle: ...

    def status(self, handle: Handle) -> MachineState:
        """The machine's state. Must not raise for a machine that no longer exists: that is GONE."""
        ...

    def teardown(self, handle: Handle, *, grace_s: float = 30.0) -> None:
        """Stop the job and delete what this run created. Idempotent: safe to call twice, or on a machine that is
        already gone. Attached machines are left running."""
        ...


def handle_from(cls: type[H], data: dict[str, Any]) -> H:
    """A handle dataclass from a run record's dict: fields it does not know are ignored (a newer runner wrote
    them), missing or mistyped ones are a StorageError naming the handle, not a TypeError."""
    assert is_dataclass(cls)
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise StorageError(f"the run record's machine handle {data!r} is not a {cls.__name__}: {exc}") from None
