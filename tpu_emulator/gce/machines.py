"""The TPU machine types the Compute Engine emulator serves, where, and the slice shapes they form.

Facts, each with its source (or "unconfirmed": the emulator needs a value, and these are its guesses; each one is
a constant here, so a rehearsal that needs another can change it):
- Compute Engine offers TPU7x, v6e and v5p machine types, and no other TPU generation
  (cloud.google.com/compute/docs/tpus/tpu-machines: "Compute Engine supports the following TPU versions: TPU7x,
  TPU v6e, TPU v5p"). So v5e (ct5lp-hightpu-*) machine types, which GKE uses, are refused here: they are not
  offered (xpk src/xpk/core/system_characteristics.py names them for GKE only).
- Machine type names and chips per VM: tpu7x-standard-1t (1 chip) and tpu7x-standard-4t (4), ct6e-standard-1t (1)
  and ct6e-standard-4t (4), ct5p-hightpu-4t (4): xpk system_characteristics.py (gce_machine_type). ct6e-standard-8t
  (8 chips on one host): unconfirmed (GKE's single-host v6e 2x4).
- vCPUs and memory of the 4-chip VMs: TPU7x 224 vCPUs / 960 GB, v6e 180 / 720 GB, v5p 208 / 448 GB
  (cloud.google.com/tpu/docs/tpu7x, its comparison table). The 1-chip and 8-chip shapes: unconfirmed (scaled).
- TensorCores per chip: TPU7x 2 (tpu7x doc: "Each TPU7x chip contains two TensorCores"), v5p 2, v6e 1 (xpk's
  tensorcores_per_chip).
- Zones (cloud.google.com/tpu/docs/regions-zones): TPU7x us-central1-c and the AI zone us-central1-ai1a; v6e
  us-central1-b, us-east1-d, us-east5-a, us-east5-b, europe-west4-a; v5p us-central1-a, us-east5-a, europe-west4-b.
  That Compute Engine offers each type in exactly the zones the TPU page lists: unconfirmed.
- Slices: a multi-host slice is a managed instance group of 4-chip VMs whose workload policy names the
  accelerator topology; its VMs are chips / 4 (xpk: chips_per_vm 4 for every multi-host topology). Topologies are
  three-dimensional for TPU7x and v5p (2x2x2, 4x4x8), two-dimensional for v6e (2x4, 4x8) (xpk's lists). Which
  topologies exist exactly: the emulator accepts dimensions of 1, 2 or a multiple of 4, in non-decreasing order
  (every topology in xpk's lists has that form), and refuses the rest; the exact list: unconfirmed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Generation:
    name: str  # tpu7x, v6e, v5p
    title: str
    cores_per_chip: int
    dims: int  # dimensions of its topologies
    zones: tuple[str, ...]
    vcpus_per_chip: int
    memory_mb_per_chip: int


@dataclass(frozen=True)
class MachineType:
    name: str
    generation: Generation
    chips: int  # per VM
    offered: bool = True
    why_not: str = ""

    @property
    def vcpus(self) -> int:
        return self.generation.vcpus_per_chip * self.chips

    @property
    def memory_mb(self) -> int:
        return self.generation.memory_mb_per_chip * self.chips

    @property
    def accelerator(self) -> str:
        """The acceleratorType name the Cloud TPU API would give one VM of it (v6e-4, tpu7x-8, v5p-8)."""
        gen = self.generation
        return f"{gen.name}-{self.chips * gen.cores_per_chip if gen.cores_per_chip > 1 else self.chips}"


TPU7X = Generation("tpu7x", "TPU7x (Ironwood)", 2, 3, ("us-central1-c", "us-central1-ai1a"), 56, 245760)
V6E = Generation(
    "v6e", "TPU v6e (Trillium)", 1, 2, ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
    45, 184320,
)  # fmt: skip
V5P = Generation("v5p", "TPU v5p", 2, 3, ("us-central1-a", "us-east5-a", "europe-west4-b"), 52, 114688)
V5E = Generation("v5litepod", "TPU v5e", 1, 2, (), 0, 0)

_NOT_ON_GCE = (
    "Compute Engine offers TPU7x, v6e and v5p machine types only (cloud.google.com/compute/docs/tpus/tpu-machines)"
)
MACHINE_TYPES: dict[str, MachineType] = {
    m.name: m
    for m in (
        MachineType("tpu7x-standard-1t", TPU7X, 1),
        MachineType("tpu7x-standard-4t", TPU7X, 4),
        MachineType("ct6e-standard-1t", V6E, 1),
        MachineType("ct6e-standard-4t", V6E, 4),
        MachineType("ct6e-standard-8t", V6E, 8),
        MachineType("ct5p-hightpu-4t", V5P, 4),
        MachineType("ct5lp-hightpu-1t", V5E, 1, offered=False, why_not=_NOT_ON_GCE),
        MachineType("ct5lp-hightpu-4t", V5E, 4, offered=False, why_not=_NOT_ON_GCE),
        MachineType("ct5lp-hightpu-8t", V5E, 8, offered=False, why_not=_NOT_ON_GCE),
    )
}
CHIPS_PER_MULTI_HOST_VM = 4
_TOPOLOGY = re.compile(r"^\d+(x\d+){1,2}$")


def offered_in(name: str, zone: str) -> MachineType | None:
    """The machine type when Compute Engine offers it in `zone`, else None."""
    machine = MACHINE_TYPES.get(name)
    if machine is None or not machine.offered or zone not in machine.generation.zones:
        return None
    return machine


def zones() -> list[str]:
    return sorted({z for m in MACHINE_TYPES.values() if m.offered for z in m.generation.zones})


def in_zone(zone: str) -> list[MachineType]:
    return [m for m in MACHINE_TYPES.values() if m.offered and zone in m.generation.zones]


def topology_problem(topology: str, machine: MachineType) -> str | None:
    """Why `topology` is no slice of `machine`'s VMs (None when it is one)."""
    gen = machine.generation
    if not _TOPOLOGY.match(topology):
        return f"'{topology}' is not a topology such as 2x2x2 or 4x4"
    dims = [int(d) for d in topology.split("x")]
    if len(dims) != gen.dims:
        return f"{gen.title} topologies have {gen.dims} dimensions; '{topology}' has {len(dims)}"
    if any(d < 1 or (d > 2 and d % 4) for d in dims) or dims != sorted(dims):
        return f"'{topology}' is not a {gen.title} topology (dimensions 1, 2 or multiples of 4, smallest first)"
    chips = math.prod(dims)
    if machine.chips != CHIPS_PER_MULTI_HOST_VM or chips % machine.chips or chips < 2 * machine.chips:
        return (
            f"a multi-host slice is made of {CHIPS_PER_MULTI_HOST_VM}-chip VMs: {machine.name} cannot form "
            f"'{topology}' ({chips} chips)"
        )
    return None


def hosts(topology: str, machine: MachineType) -> int:
    """VMs in a slice of `topology` (its gang size): chips / chips per VM."""
    return math.prod(int(d) for d in topology.split("x")) // machine.chips
