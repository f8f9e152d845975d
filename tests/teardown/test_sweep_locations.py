"""`runner gc` sweeps by each backend's own locations (runner.backends.sweep.Sweep): every sweep of a location kind
lists the same locations (its own, its kind's other sweeps', those of this machine's runs and of gcloud's
configuration), a sweep of another kind (clusters) only its own kind's, and --zone narrows the zones alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from runner.backends.sweep import ZONE, Found, Sweep, ZonalSweep
from runner.cli.teardown import _count as count
from runner.errors import BackendError
from runner.teardown.sweeper import Sweeper, sweeper_for
from runner.watch.state import RunState

PROJECT = "sweep-project"


class Listing:
    """What a fake sweep was asked to list, and a location whose list is refused."""

    def __init__(self, backend: str, own: set[str], refused: str | None = None) -> None:
        self.backend, self.own, self.refused = backend, own, refused
        self.listed: list[str] = []

    def locations(self) -> set[str]:
        return self.own

    def scan(self, project: str, location: str) -> list[Found]:
        self.listed.append(location)
        if location == self.refused:
            raise BackendError(f"permission denied in {location}")
        return []

    def api_now(self) -> float | None:
        return None

    def request_delete(self, project: str, found: Found) -> str | None:
        return None

    def outcome(self, project: str, found: Found, operation: str) -> tuple[bool, str | None]:
        return True, None

    def exists(self, project: str, found: Found) -> bool:
        return False


class Zonal(Listing, ZonalSweep):
    pass


class Clusters(Listing, Sweep):
    location_kind = "cluster"

    def recorded_location(self, handle: Mapping[str, Any]) -> str | None:
        return str(handle["cluster"]) if handle.get("cluster") else None

    def configured_locations(self) -> set[str]:
        return {"kube-context"}


@dataclass
class Record:
    """What sweeper_for reads of a run record."""

    run_id: str
    backend: str
    handle: dict[str, Any] = field(default_factory=dict)
    state: RunState = RunState.RUNNING


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Listing]:
    made: dict[str, Listing] = {
        "vm-a": Zonal("vm-a", {"zone-a1", "zone-shared"}),
        "vm-b": Zonal("vm-b", {"zone-b1", "zone-shared"}),
        "kube": Clusters("kube", {"cluster-1"}),
    }
    from runner import backends
    from runner.watch import runs

    monkeypatch.setattr(backends, "sweeper", lambda name, timings: made[name])
    records = [
        Record("r1", "vm-a", {"zone": "zone-recorded"}),
        Record("r2", "kube", {"cluster": "cluster-recorded"}),
        Record("r3", "vm-b"),  # no handle: nothing recorded
    ]
    monkeypatch.setattr(runs, "list_records", lambda: records)
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", "zone-default")
    return made


def swept(fakes: dict[str, Listing], **kwargs: Any) -> tuple[Sweeper, dict[str, list[str]]]:
    sweeper = sweeper_for(PROJECT, say=lambda s: None, backends=list(fakes), **kwargs)
    sweeper.scan()
    return sweeper, {name: sorted(fake.listed) for name, fake in fakes.items()}


def test_each_kind_of_sweep_lists_its_own_kinds_locations(fakes: dict[str, Listing]) -> None:
    sweeper, listed = swept(fakes, locations=None, everywhere=False)
    zones = ["zone-a1", "zone-b1", "zone-default", "zone-recorded", "zone-shared"]
    assert listed == {"vm-a": zones, "vm-b": zones, "kube": ["cluster-1", "cluster-recorded", "kube-context"]}
    assert sweeper.kind_of("zone-b1") == ZONE and sweeper.kind_of("cluster-1") == "cluster"


def test_zones_given_narrow_the_sweep_to_them_and_everywhere_adds_the_rest(fakes: dict[str, Listing]) -> None:
    _, listed = swept(fakes, locations={ZONE: ["zone-x"]}, everywhere=False)
    assert listed == {"vm-a": ["zone-x"], "vm-b": ["zone-x"], "kube": []}
    for fake in fakes.values():
        fake.listed.clear()
    _, listed = swept(fakes, locations={ZONE: ["zone-x"]}, everywhere=True)
    assert (
        "zone-x" in listed["vm-a"]
        and "zone-a1" in listed["vm-b"]
        and listed["kube"]
        == [
            "cluster-1",
            "cluster-recorded",
            "kube-context",
        ]
    )


def test_a_location_that_cannot_be_listed_is_skipped_with_its_kind() -> None:
    kube = Clusters("kube", {"cluster-1", "cluster-2"}, refused="cluster-2")
    vm = Zonal("vm-a", {"zone-a1"})
    sweeper = Sweeper([vm, kube], PROJECT, {ZONE: ["zone-a1"], "cluster": ["cluster-1", "cluster-2"]})
    assert sweeper.scan() == []
    assert sweeper.skipped == {"cluster-2": "permission denied in cluster-2"}
    assert sweeper.kind_of("cluster-2") == "cluster" and sweeper.swept == ["cluster-1", "cluster-2", "zone-a1"]
    assert (vm.listed, sorted(kube.listed)) == (["zone-a1"], ["cluster-1", "cluster-2"])
    # What `runner gc` says of them: how many of each kind.
    assert count(sorted(sweeper.skipped), sweeper.kind_of, "(s)") == "1 cluster(s)"
    assert count(sweeper.swept, sweeper.kind_of) == "2 clusters, 1 zone"
