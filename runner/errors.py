"""The runner's one error root. The CLI catches `RunnerError` once, prints message and hint, and exits.

    RunnerError                  exit 1   anything the user can act on
    ├── SpecError                exit 2   the job spec (YAML or its values) is invalid; lists every problem
    ├── UsageError               exit 2   flags or arguments that do not fit together
    │   └── RunBusy              exit 2   another runner holds the run (its lease: who, where, since when)
    ├── PlanError                exit 2   the spec is valid but cannot run where it was sent (pre-flight)
    ├── RunNotFound              exit 3   no run record with that id
    ├── StorageError             exit 4   reading or writing the run directory (or this machine's run records) failed
    │   ├── StorageUnreachable   exit 4   no answer, or only answers that pass (5xx, 429, timeouts): unknown, not gone
    │   ├── BucketMissing        exit 4   the run directory's bucket does not exist (any more): nothing more lands there
    │   └── PreconditionFailed   exit 4   a conditional write found the object changed since it was read
    ├── BackendError             exit 5   a machine could not be provisioned, watched or torn down
    │   ├── NoCapacity           exit 5   the zone has no TPUs of that type right now (stockout): try another
    │   ├── QuotaExceeded        exit 5   the project's quota is used up: no zone of that region helps
    │   ├── AlreadyExists        exit 5   the name is taken (by another run: never deleted, never adopted)
    │   ├── Preempted            exit 5   the machine was taken back while being created (Spot)
    │   └── Vanished             exit 5   what was being created was deleted under the wait (runner down, console)
    └── RunFailed                exit 6   the run ended, but not in success (trainer failed, cancelled)

Code outside the CLI never calls sys.exit; it raises one of these, wrapping the underlying error with
`raise ... from exc` so the cause stays visible with --debug.
"""

from __future__ import annotations


class RunnerError(Exception):
    """Base of every error the runner reports to a user."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class SpecError(RunnerError):
    """The job spec is not valid. `problems` holds one line per problem, already located."""

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.problems = problems or []

    def __str__(self) -> str:
        return "\n".join([self.message, *(f"  {p}" for p in self.problems)])


class UsageError(RunnerError):
    exit_code = 2


class RunBusy(UsageError):
    """Another runner holds the run (submit, resume or its follower): one owner at a time."""


class PlanError(RunnerError):
    exit_code = 2


class RunNotFound(RunnerError):
    exit_code = 3


class StorageError(RunnerError):
    exit_code = 4


class StorageUnreachable(StorageError):
    """Cloud Storage did not answer, or only with errors that pass: what the run directory says is unknown for now.
    Never evidence about the run itself."""


class BucketMissing(StorageError):
    """The run directory's bucket does not exist: a definite answer, and nothing the run writes can land there."""


class PreconditionFailed(StorageError):
    """A write conditioned on the object's generation found another one: someone else wrote it since it was read."""


class BackendError(RunnerError):
    exit_code = 5


class NoCapacity(BackendError):
    """A stockout: not the user's fault, and another zone (or later) may succeed."""


class QuotaExceeded(BackendError):
    """An allocation quota is used up (a QuotaFailure detail, not a rate limit): retrying does not help."""


class AlreadyExists(BackendError):
    """The resource name is taken. What this run did not create is never deleted."""


class Preempted(BackendError):
    """The provider took the machine back before the job could start; the runner counts it as a preemption."""


class Vanished(BackendError):
    """What the run was creating was deleted while it was being created (`runner down`, the console, the platform):
    the wait ends at once; the run's own record says whether it was `runner down`."""


class RunFailed(RunnerError):
    exit_code = 6
