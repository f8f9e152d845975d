"""What each cloud backend gives `runner gc` (runner.teardown.sweeper judges and deletes; the backend only lists and
deletes): its own locations (zones for a VM backend; another backend's may be clusters), the runner-labelled
resources it finds in one of them, and how one of them is deleted and confirmed gone."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ZONE = "zone"  # the location kind of a sweep by zones (`runner gc --zone`)


@dataclass(frozen=True)
class Found:
    """A runner-labelled resource as the sweeper needs it to judge it."""

    kind: str  # "node", "queued resource", "instance", "instance group", "instance template", ...
    name: str  # its full resource name: what it is deleted by
    location: str  # where it is: its zone (or region, or "global"), or whatever its backend's locations are
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
    """One backend's part of `runner gc`, location by location. Every sweep of the same `location_kind` is asked
    about the same locations (the union of theirs, of this machine's runs', and of what `runner gc` was given): a
    leftover is found wherever a run put it. Every method may raise RunnerError (a location the project may not
    use)."""

    backend: str
    location_kind: str  # what its locations are, in the singular ("zone"): the word `runner gc` says them by

    @abstractmethod
    def locations(self) -> set[str]:
        """Every location its catalog slice offers an accelerator in: where leftovers can be."""

    @abstractmethod
    def recorded_location(self, handle: Mapping[str, Any]) -> str | None:
        """The location a run record's handle of this backend names (where its run's machine was made), if any."""

    @abstractmethod
    def configured_locations(self) -> set[str]:
        """The locations this machine's configuration names (gcloud's default zone): swept too, offered or not."""

    @abstractmethod
    def scan(self, project: str, location: str) -> list[Found]:
        """Every runner-labelled resource in `location` (and what its region or the project holds for it)."""

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


class ZonalSweep(Sweep, ABC):
    """A sweep whose locations are zones (a TPU VM backend's): a run record's handle names its zone, and gcloud's
    default zone is swept too."""

    location_kind = ZONE

    def recorded_location(self, handle: Mapping[str, Any]) -> str | None:
        zone = handle.get("zone")
        return str(zone) if zone else None

    def configured_locations(self) -> set[str]:
        from runner.plan import gcloud

        return {default} if (default := gcloud.default_zone()) else set()
