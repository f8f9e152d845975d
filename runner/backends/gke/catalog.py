"""The gke backend's slice of the catalog (catalog.yaml): what GKE's TPU node pools take for an accelerator type of
the runner's catalog: the node label, the VM's machine type and chips, the slice's topology, and whether a
multi-host node pool needs a workload policy (TPU7x)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runner.errors import PlanError
from runner.plan import catalog

_DATA = Path(__file__).with_name("catalog.yaml")


class NotOffered(PlanError):
    """An accelerator type GKE's TPU node pools do not take (exit 2)."""


@dataclass(frozen=True)
class Offer:
    accelerator: catalog.AcceleratorType
    gke_accelerator: str  # cloud.google.com/gke-tpu-accelerator
    machine_type: str  # one VM (node) of the slice
    topology: str  # cloud.google.com/gke-tpu-topology
    chips_per_vm: int  # google.com/tpu one pod asks for: the whole VM
    workload_policy: bool  # a multi-host node pool needs placementPolicy.policyName

    @property
    def hosts(self) -> int:
        return self.accelerator.hosts


@functools.cache
def _generations() -> dict[str, Any]:
    return dict(yaml.safe_load(_DATA.read_text())["generations"])


def offer(type_name: str) -> Offer:
    """What a node pool of `type_name` is on GKE; NotOffered (with what is) when GKE does not take it."""
    try:
        accel = catalog.accelerator(type_name)
    except catalog.CatalogError as exc:
        raise NotOffered(str(exc)) from None
    entry = _generations().get(accel.generation.name)
    if entry is None:
        offered = ", ".join(sorted(_generations()))
        raise NotOffered(
            f"{accel.generation.title} has no TPU node pools on GKE", hint=f"GKE's TPU generations: {offered}"
        )
    size = int(accel.name.rsplit("-", 1)[1])
    topology = {int(k): str(v) for k, v in entry["topologies"].items()}.get(size)
    if topology is None:
        sizes = ", ".join(f"{accel.generation.name}-{s}" for s in sorted(map(int, entry["topologies"])))
        raise NotOffered(f"{accel.name} is not a GKE TPU slice", hint=f"GKE's {accel.generation.title} slices: {sizes}")
    per_vm = accel.chips if accel.hosts == 1 else accel.generation.chips_per_host
    return Offer(
        accelerator=accel,
        gke_accelerator=str(entry["accelerator"]),
        machine_type=str(entry["machine"]).format(chips=per_vm),
        topology=topology,
        chips_per_vm=per_vm,
        workload_policy=bool(entry.get("workload_policy", False)),
    )
