"""What a TPU VM run holds, one handle type per kind: a node it created, a queued resource that holds its node (or
its multislice's nodes), a node it attached to (never deleted). Each is what the run record keeps, and what
teardown, `runner down` and the watch work from.

A run record written before the kinds were split has no `kind`: its kind is read from the fields it has
(`queued_resource` set: a queued resource; `created` false: attached).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from runner.backends.base import handle_from
from runner.errors import StorageError


@dataclass(frozen=True)
class NodeHandle:
    """A node this run created; deleted on its own."""

    project: str
    zone: str
    node_id: str
    nonce: str | None = None  # the runner's nonce label on it: tells this run's node from another's of that name
    created: bool = True  # kept for readers of older records, whose one handle type had it
    kind: str = field(default="node", init=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class QueuedHandle:
    """A queued resource this run created, which holds its node (its multislice's nodes): deleted as a whole, with
    force, never through its nodes."""

    project: str
    zone: str
    node_id: str  # its node, or a multislice's prefix
    queued_resource: str  # its id
    nonce: str | None = None
    created: bool = True
    kind: str = field(default="queued resource", init=False)

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.queued_resource}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AttachedHandle:
    """An existing node the run attached to (accelerator.node): the job runs over ssh; the node is never deleted."""

    project: str
    zone: str
    node_id: str
    ssh_pid: int | None = None  # the `gcloud ... ssh` that runs the bootstrap
    created: bool = False
    kind: str = field(default="attached", init=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TpuHandle = NodeHandle | QueuedHandle | AttachedHandle
_KINDS: dict[str, type[NodeHandle] | type[QueuedHandle] | type[AttachedHandle]] = {
    "node": NodeHandle,
    "queued resource": QueuedHandle,
    "attached": AttachedHandle,
}


def handle_of(data: dict[str, Any]) -> TpuHandle:
    """The handle a run record holds, of its kind; StorageError when it is none of them."""
    kind = data.get("kind")
    if kind is None:  # a record from before the kinds: read from its fields
        kind = (
            "attached" if data.get("created") is False else "queued resource" if data.get("queued_resource") else "node"
        )
    cls = _KINDS.get(str(kind))
    if cls is None:
        raise StorageError(f"the run record's machine handle {data!r} is not a TPU VM's (kind {kind!r})")
    return handle_from(cls, data)
