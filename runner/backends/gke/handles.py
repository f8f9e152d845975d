"""What a GKE run holds: its JobSet (in a namespace of a cluster) and the node pools the run created for it, each
named fully enough that `runner down` and `runner gc` delete them from the run record alone. An existing node
pool the job ran on is never in a handle: nothing of it is the run's to delete."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from runner.backends.base import handle_from
from runner.errors import StorageError


@dataclass(frozen=True)
class GkeHandle:
    """A JobSet this run created, and the node pools it created (GKE paths, one per slice); `restarts`: the JobSet's
    restarts the runner has followed it through (a later one is a preemption it has not seen yet)."""

    namespace: str
    jobset: str
    cluster: str  # projects/P/locations/L/clusters/N, or context:NAME (a kubeconfig context)
    project: str = ""
    context: str | None = None
    pools: tuple[str, ...] = ()  # the node pools this run created (their full paths); () on an existing pool
    nonce: str | None = None
    restarts: int = 0
    kind: str = field(default="jobset", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pools", tuple(self.pools))  # a list from a run record's JSON

    @property
    def zone(self) -> str:
        """Where it is, for the messages every cloud backend shares: the cluster."""
        return self.cluster

    @property
    def cluster_path(self) -> str | None:
        return None if self.cluster.startswith("context:") else self.cluster

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pools"] = list(self.pools)
        return out


def handle_of(data: dict[str, Any]) -> GkeHandle:
    if data.get("kind") != "jobset":
        raise StorageError(f"the run record's machine handle {data!r} is not a GKE one (kind {data.get('kind')!r})")
    return handle_from(GkeHandle, data)
