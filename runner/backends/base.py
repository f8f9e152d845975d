"""What every backend provides. A backend makes a machine run the job's container, and takes it away again.

Each backend maps its native states through one table onto MachineState; the run's own state (runner.watch.state)
comes from the run directory, the machine's state only tells whether anything is still there to pay for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar

from runner.errors import StorageError
from runner.plan.planner import Plan

T = TypeVar("T")


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


H = TypeVar("H", bound=Handle)


class Backend(ABC, Generic[H]):
    """A way to run the job's container on a machine, and to take the machine away again. Each method's docstring
    is its contract; mypy holds every backend to the signatures (runner/backends/<name>/backend.py). The registry
    (runner.backends) builds them by name."""

    name: str
    ephemeral: bool  # machines end with their job (local processes): the teardown policy does not apply
    ready_state: str | None = None  # the provider's word for a machine that is up (READY, RUNNING): not said
    stop_command: str | None = None  # how someone stops its machine by hand (what a run lost to a stop says)
    stopped_states: tuple[str, ...] = ()  # the provider's states of a machine stopped under its job: the run is lost

    @abstractmethod
    def describe(self, plan: Plan) -> list[tuple[str, str]]:
        """What provision() would do, as (label, value) rows for the plan. No side effects, no network."""

    @abstractmethod
    def dry_run(self, plan: Plan) -> str:
        """Everything provision() would send or start, exactly (the request body, the script, the command line,
        the environment), for `submit --dry-run`. No side effects, no network, no credentials."""

    @abstractmethod
    def provision(self, plan: Plan, on_handle: Callable[[H], None]) -> H:
        """Create (or attach to) the machine and start the job on it. `on_handle` receives the handle of what is
        about to be created BEFORE the request that creates it is sent (and again when that changes: another zone,
        another name), so a runner killed at any moment has recorded what may exist. On failure, whatever this
        call created is torn down before raising BackendError; nothing it did not create is ever touched."""

    @abstractmethod
    def handle_from_dict(self, data: dict[str, Any]) -> H:
        """The handle a run record holds (handle_from below); StorageError when it is not one of this backend's."""

    @abstractmethod
    def status(self, handle: H) -> MachineState:
        """The machine's state. Must not raise for a machine that no longer exists: that is GONE. Should return
        at once (one API read at most)."""

    @abstractmethod
    def teardown(self, handle: H, *, grace_s: float = 30.0, wait_s: float = 300.0) -> bool:
        """Stop the job and delete what this run created; True once confirmed gone, False when the deletion was
        requested and is still under way after wait_s (or a second interrupt cut the wait short), having said what
        is left and how to delete it. Idempotent: safe to call twice, or on a machine that is already gone; never
        deletes what the run did not create. Attached machines are left running (True)."""

    def owns(self, handle: H) -> bool:
        """Whether what the handle names is this run's to delete (it carries the handle's nonce, or is gone): a handle
        recorded before a create that found its name taken (409) names another run's machine. Should return at
        once (one API read at most)."""
        return True

    def next_attempt(self, handle: H, *, wait_s: float) -> H | None:
        """Where the platform restarts the job itself after a machine is taken away (a JobSet's failurePolicy), the
        handle of its next attempt once the last one's workers are gone: the run follows it rather than replacing
        the machine. None (the default): nothing restarts by itself, so the machine is deleted and made again."""
        return None

    def console_hint(self, handle: H) -> str | None:
        """Where to read what the machine did at boot, for a machine that never reported in."""
        return None

    def observe(self, handle: H) -> tuple[MachineState, str | None]:
        """status(), with the machine's own state as its provider names it (READY, REPAIRING, HIDDEN ...), for a
        follower to show; None where there is nothing more to say."""
        return self.status(handle), None

    def state_note(self, native: str) -> str | None:
        """What the provider's state `native` means for the run, for a follower to show beside it; None: nothing."""
        return None

    def ready_at(self, handle: H) -> float | None:
        """When the machine provision() just returned became ready by the provider's own clock (a create operation's
        end), where it says: a run bills from there. None where it does not."""
        return None

    def describe_handle(self, handle: H) -> str:
        """What the handle names, in a few words ("TPU node NAME"), for messages."""
        return "the machine"

    def delete_hint(self, handle: H) -> str:
        """How to delete by hand what the handle names, when the runner could not (after `runner down RUN`)."""
        return "`runner gc` finds it"


def handle_from(cls: type[T], data: dict[str, Any]) -> T:
    """A handle dataclass from a run record's dict: fields it does not know are ignored (a newer runner wrote
    them), missing or mistyped ones are a StorageError naming the handle, not a TypeError."""
    assert is_dataclass(cls)
    known = {f.name for f in fields(cls) if f.init}  # `kind` and the like are the class's, not the record's
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise StorageError(f"the run record's machine handle {data!r} is not a {cls.__name__}: {exc}") from None
