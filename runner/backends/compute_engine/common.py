"""What the compute-engine backend's two flows (an instance, a slice's group) share: the API, how they poll, how
they wait for an operation and how one of them deletes (runner.backends.deletion, with Compute Engine's operations).

Compute Engine has no DELETING status: a deleted instance goes PENDING_STOP or STOPPING (then DEPROVISIONING), then
is gone. Those are the states a deletion may be under way in; one found there is watched, not asked again, and asked
for once it has stopped (TERMINATED) if it has not gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from runner.backends.base import MachineState
from runner.backends.compute_engine.api import ComputeApi, explain
from runner.backends.deletion import Deletion, OpResult, delete_and_confirm
from runner.errors import BackendError

H = TypeVar("H", contravariant=True)
GOING = ("PENDING_STOP", "STOPPING", "DEPROVISIONING")


class Kind(Protocol[H]):
    """What the backend asks of the flow of one kind of handle (an instance, an instance group)."""

    def observe(self, handle: H) -> tuple[MachineState, str | None]: ...

    def what(self, handle: H) -> str: ...

    def delete_hint(self, handle: H) -> str: ...

    def teardown(self, handle: H, *, grace_s: float, wait_s: float) -> bool: ...


@dataclass
class Context:
    api: ComputeApi
    say: Callable[[str], None]
    poll_s: float  # between reads of what is being created or deleted
    backoff_s: float  # before the first retry of a zone without capacity
    delete_timeout_s: float
    delete_retries: int

    def outcome(self, ref: str, what: str, *, project: str, zone: str) -> OpResult:
        """A delete operation as last read, its failure in words."""
        op = self.api.get_operation(ref, project=project, zone=zone)
        if op.failure is None:
            return OpResult(op.done)
        error = explain(op.failure, f"delete {what}", project=project, zone=zone)
        return OpResult(True, error, op.failure.transient, op.failure.code)

    def finish(self, ref: str, action: str, *, project: str, zone: str, deadline: float) -> float | None:
        """Until the operation `ref` is DONE; its failure raised in words, else when it ended (the API's clock)."""
        t0 = time.monotonic()
        while True:
            op = self.api.get_operation(ref, project=project, zone=zone)
            if op.failure is not None:
                raise explain(op.failure, action, project=project, zone=zone)
            if op.done:
                return op.ended_at
            if time.time() > deadline:
                raise BackendError(f"could not {action} before the run's max_runtime ran out (operation {ref})")
            time.sleep(self.pause(t0))

    def pause(self, t0: float) -> float:
        """Every second at first, then every poll_s: a TPU VM takes minutes, an operation on a template a moment."""
        return min(self.poll_s, 0.2 + (time.monotonic() - t0) / 10)

    def delete(self, deletion: Deletion, *, announce: bool, wait_s: float | None = None) -> bool:
        return delete_and_confirm(
            deletion,
            say=self.say,
            poll_s=self.poll_s,
            wait_s=self.delete_timeout_s if wait_s is None else wait_s,
            retries=self.delete_retries,
            announce=announce,
        )
