"""What the flows of every cloud backend share. A cloud backend holds one flow per kind of handle (a TPU node, a
queued resource, a Compute Engine instance, an instance group ...); this module is what those flows have in common:

- `Kind`: what the backend asks of the flow of one kind of handle;
- `Context`: what a backend's flows run in (its API, how they poll, how a delete operation is read and how one of
  them deletes, through runner.backends.deletion);
- `ByKind`: the backend's methods that only hand a handle to its kind's flow;
- `create_owned`: send a create and wait for the machine, never touching a machine that is not this run's.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from runner.backends import labels
from runner.backends.base import Backend, Handle, MachineState
from runner.backends.deletion import Deletion, OpResult, delete_and_confirm
from runner.backends.google_api import ApiFailure
from runner.backends.labels import NameTaken
from runner.errors import AlreadyExists, BackendError

K = TypeVar("K", contravariant=True)
T = TypeVar("T")


class CloudHandle(Handle, Protocol):
    @property
    def zone(self) -> str: ...


Z = TypeVar("Z", bound=CloudHandle)


class Kind(Protocol[K]):
    """What the backend asks of the flow of one kind of handle."""

    def observe(self, handle: K) -> tuple[MachineState, str | None]: ...

    def what(self, handle: K) -> str: ...

    def delete_hint(self, handle: K) -> str: ...

    def owns(self, handle: K) -> bool: ...

    def teardown(self, handle: K, *, grace_s: float, wait_s: float) -> bool: ...


class Operation(Protocol):
    """A long-running operation as last read (each API's OperationState)."""

    @property
    def done(self) -> bool: ...

    @property
    def failure(self) -> ApiFailure | None: ...


class OperationsApi(Protocol):
    def get_operation(self, ref: str, *, project: str, zone: str) -> Operation: ...


A = TypeVar("A", bound=OperationsApi)


@dataclass
class Context(Generic[A]):
    api: A
    say: Callable[[str], None]
    poll_s: float  # between reads of what is being created or deleted (a TPU VM takes minutes)
    backoff_s: float  # before the first retry of a zone without capacity
    delete_timeout_s: float
    delete_retries: int

    @abstractmethod
    def explain(self, failure: ApiFailure, action: str, *, project: str, zone: str) -> BackendError:
        """A failure of this backend's API in words (each API says its failures its own way)."""

    def outcome(self, ref: str, what: str, *, project: str, zone: str) -> OpResult:
        """A delete operation as last read, its failure in words."""
        op = self.api.get_operation(ref, project=project, zone=zone)
        if op.failure is None:
            return OpResult(op.done)
        error = self.explain(op.failure, f"delete {what}", project=project, zone=zone)
        return OpResult(True, error, op.failure.transient, op.failure.code)

    def delete(self, deletion: Deletion, *, announce: bool, wait_s: float | None = None) -> bool:
        return delete_and_confirm(
            deletion,
            say=self.say,
            poll_s=self.poll_s,
            wait_s=self.delete_timeout_s if wait_s is None else wait_s,
            retries=self.delete_retries,
            announce=announce,
        )


class ByKind(Backend[Z]):
    """A cloud backend whose reads and deletes of a handle are its kind's flow's (`_kind`)."""

    state_notes: ClassVar[Mapping[str, str]] = {}  # what the provider's states mean for the run

    @abstractmethod
    def _kind(self, handle: Z) -> Kind[Any]: ...

    def status(self, handle: Z) -> MachineState:
        return self.observe(handle)[0]

    def observe(self, handle: Z) -> tuple[MachineState, str | None]:
        return self._kind(handle).observe(handle)

    def state_note(self, native: str) -> str | None:
        return self.state_notes.get(native)

    def describe_handle(self, handle: Z) -> str:
        return f"{self._kind(handle).what(handle)} in {handle.zone}"

    def delete_hint(self, handle: Z) -> str:
        return self._kind(handle).delete_hint(handle)

    def owns(self, handle: Z) -> bool:
        return self._kind(handle).owns(handle)

    def teardown(self, handle: Z, *, grace_s: float = 30.0, wait_s: float = 300.0) -> bool:
        """Delete what the handle names, from the handle alone (what each backend deletes: its class says), and
        whether it is confirmed gone within wait_s."""
        return self._kind(handle).teardown(handle, grace_s=grace_s, wait_s=wait_s)


def owned_or_gone(found_labels: Mapping[str, str] | None, nonce: str | None) -> bool:
    """A machine as read (its labels; None: gone) is the handle's to delete: gone, carrying its nonce, or a handle of
    a record from before nonces (nothing to tell it by)."""
    return found_labels is None or nonce is None or labels.owned(found_labels, nonce)


def labels_of(found: Any | None) -> dict[str, str] | None:
    """A machine's labels as read (None for a machine that is not there), for create_owned's `found_labels`."""
    return None if found is None else dict(found.labels)


def create_owned(
    name: str,
    kind: str,
    *,
    nonce: str | None,
    run_id: str | None = None,
    send: Callable[[], str | None],
    found_labels: Callable[[], Mapping[str, str] | None],
    wait: Callable[[str | None], T],
    discard: Callable[[], None],
) -> T:
    """`send` the create request (its operation, or None) and `wait` for the machine. A 409 is this run's own
    machine only when it carries this submit's `nonce` (a retried request found what its first try created): then
    it is waited for; anyone else's is never touched (NameTaken: the run takes another name), and one another try of
    this same run (`run_id`) made is never answered by a second machine beside it (AlreadyExists). On any failure,
    including one of `send` (the request may have gone through before a dropped answer or a Ctrl-C), whatever of
    this run's machine exists is `discard`ed."""
    operation: str | None = None
    try:
        operation = send()
    except AlreadyExists:
        found = found_labels()
        if found is not None and not labels.owned(found, nonce) and run_id and found.get(labels.RUN) == run_id:
            raise same_run(kind, name, run_id) from None
        if found is None or not labels.owned(found, nonce):
            owner = found.get(labels.RUN, f"not a tpu-runner {kind}") if found is not None else "gone"
            raise NameTaken(name, owner, kind=kind) from None
    except BaseException:
        discard()
        raise
    try:
        return wait(operation)
    except BaseException:
        discard()
        raise


def same_run(kind: str, name: str, run_id: str) -> AlreadyExists:
    """A 409 on a name this run's own machine holds, made by another try of the run (an earlier attempt, another
    runner): one job never gets two machines, so no second one is made under another name."""
    return AlreadyExists(
        f"{kind} {name} exists already, and it is this run's own (made by another try of run {run_id}): no second "
        "one is made beside it",
        hint=f"`runner status {run_id}` shows what runs it; `runner down {run_id}` deletes it",
    )
