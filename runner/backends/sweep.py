"""What each cloud backend gives `runner gc` (runner.teardown.sweeper judges and deletes; the backend only lists and
deletes): the runner-labelled resources it finds in a zone, and how one of them is deleted and confirmed gone."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Found:
    """A runner-labelled resource as the sweeper needs it to judge it."""

    kind: str  # "node", "queued resource", "instance", "instance group", "instance template", ...
    name: str  # its full resource name: what it is deleted by
    zone: str  # its zone (or region, or "global")
    state: str
    labels: dict[str, str] = field(default_factory=dict)
    created_at: float | None = None  # by the API's clock
    run_dir: str | None = None  # its run's directory (from its metadata), read to judge whether it is needed
    dead: str | None = None  # why it can never run the job again: orphaned, whatever else is true
    judge: bool = True  # its run directory says whether it is needed (a live machine); False: labels alone
    going: bool = False  # its deletion is under way: never asked for again
    follows: str | None = None  # the resource whose fate it shares (a group's template): judged and deleted after it

    @property
    def short_name(self) -> str:
        return self.name.rsplit("/", 1)[-1]


class Sweep(ABC):
    """One backend's part of `runner gc`. Every method may raise RunnerError (a zone the project may not use)."""

    backend: str

    @abstractmethod
    def zones(self) -> set[str]:
        """Every zone its catalog slice offers an accelerator in: where leftovers can be."""

    @abstractmethod
    def scan(self, project: str, zone: str) -> list[Found]:
        """Every runner-labelled resource in `zone` (and what its region or the project holds for it)."""

    @abstractmethod
    def api_now(self) -> float | None:
        """Now by the API's own clock (the Date of its last answer), for the ages of what it found."""

    @abstractmethod
    def request_delete(self, project: str, found: Found) -> str | None:
        """Ask for its deletion: the operation to read, or None when it was gone already."""

    @abstractmethod
    def outcome(self, project: str, found: Found, operation: str) -> tuple[bool, str | None]:
        """(done, why it failed) of a delete operation."""

    @abstractmethod
    def exists(self, project: str, found: Found) -> bool:
        """Whether it is still there."""
