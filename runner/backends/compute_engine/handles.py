"""What a Compute Engine run holds, one handle type per kind: an instance (a single-host TPU VM), or an instance group
(a multi-host slice) with the instance template and workload policy made for it. Each names everything its delete
needs, so that `runner down` and `runner gc` work from the run record alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from runner.backends.base import handle_from
from runner.errors import StorageError


@dataclass(frozen=True)
class InstanceHandle:
    """A TPU VM instance this run created; deleted on its own."""

    project: str
    zone: str
    name: str
    nonce: str | None = None  # the runner's nonce label on it: tells this run's instance from another's of that name
    kind: str = field(default="instance", init=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GroupHandle:
    """A managed instance group this run created (a multi-host slice), deleted first (its VMs go with it), then its
    instance template (global) and its workload policy (regional), which a group in use keeps from deletion."""

    project: str
    zone: str
    name: str  # the group's, and its VMs' base instance name
    template: str  # the instance template's name
    policy: str  # the workload policy's name, in the zone's region
    resize_request: str | None = None  # flex-start: the resize request that asks for the slice's VMs
    nonce: str | None = None
    kind: str = field(default="instance group", init=False)

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ComputeHandle = InstanceHandle | GroupHandle
_KINDS: dict[str, type[InstanceHandle] | type[GroupHandle]] = {
    "instance": InstanceHandle,
    "instance group": GroupHandle,
}


def handle_of(data: dict[str, Any]) -> ComputeHandle:
    """The handle a run record holds, of its kind; StorageError when it is none of them."""
    cls = _KINDS.get(str(data.get("kind")))
    if cls is None:
        raise StorageError(
            f"the run record's machine handle {data!r} is not a Compute Engine one (kind {data.get('kind')!r})"
        )
    return handle_from(cls, data)
