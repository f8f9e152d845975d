"""GKE's TPU machine types as node pools take them: the node label GKE sets, the chips of one VM, the topology's
dimensions (sources: cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus, xpk src/xpk/core/
system_characteristics.py: gke_accelerator, chips_per_vm, machine types per topology). A machine type of none of
these families is a CPU node pool (its nodes carry no TPU label, taint or resource)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TpuMachine:
    machine_type: str
    accelerator: str  # cloud.google.com/gke-tpu-accelerator
    chips: int  # google.com/tpu on one VM
    dimensions: int  # 2 (v5e, v6e) or 3 (v5p, TPU7x)
    workload_policy: bool = False  # multi-host slices need placementPolicy.policyName (a workload policy): TPU7x


_FAMILIES = {
    "ct5p-hightpu": ("tpu-v5p-slice", 3, False),
    "ct5lp-hightpu": ("tpu-v5-lite-podslice", 2, False),
    "ct6e-standard": ("tpu-v6e-slice", 2, False),
    "tpu7x-standard": ("tpu7x", 3, True),
}


def tpu_machine(machine_type: str) -> TpuMachine | None:
    """The TPU machine `machine_type` names (ct5p-hightpu-4t, ct6e-standard-8t, tpu7x-standard-4t), else None."""
    family, _, size = machine_type.rpartition("-")
    if family not in _FAMILIES or not size.endswith("t") or not size[:-1].isdigit():
        return None
    accelerator, dimensions, policy = _FAMILIES[family]
    return TpuMachine(machine_type, accelerator, int(size[:-1]), dimensions, policy)


def topology_chips(topology: str) -> int | None:
    """Chips in a topology such as 2x2x4; None when it is not one."""
    parts = topology.split("x")
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        return None
    return math.prod(int(p) for p in parts)
