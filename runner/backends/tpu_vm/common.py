"""What the TPU VM backend's flows share: the API, how they talk and poll, and how one of them deletes what a
handle names (runner.backends.deletion, with the Cloud TPU API's operations)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from runner.backends.base import MachineState
from runner.backends.deletion import Deletion, OpResult, delete_and_confirm
from runner.backends.tpu_vm.api import TpuApi, explain

H = TypeVar("H", contravariant=True)


class Kind(Protocol[H]):
    """What the backend asks of the flow of one kind of handle (a node, a queued resource, an attached node)."""

    def observe(self, handle: H) -> tuple[MachineState, str | None]: ...

    def what(self, handle: H) -> str: ...

    def delete_hint(self, handle: H) -> str: ...

    def teardown(self, handle: H, *, grace_s: float, wait_s: float) -> bool: ...


@dataclass
class Context:
    api: TpuApi
    say: Callable[[str], None]
    poll_s: float  # between reads of what is being created or deleted (a TPU VM takes minutes)
    backoff_s: float  # before the first retry of a zone without capacity
    delete_timeout_s: float
    delete_retries: int

    def operation(self, name: str, what: str, *, project: str, zone: str) -> OpResult:
        """A delete operation as last read, its failure in words."""
        op = self.api.get_operation(name, project=project, zone=zone)
        if op.failure is None:
            return OpResult(op.done)
        error = explain(op.failure, f"delete {what}", project=project, zone=zone)
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
