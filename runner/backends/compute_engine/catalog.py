"""The compute-engine backend's catalog slice (catalog.yaml beside this file): which TPU generations Compute Engine
offers as VM instances, the machine type of a single-host type, the topology of a multi-host slice, the zones, and
the boot image and disk.

An accelerator type is named as everywhere in the runner (tpu7x-8, v6e-4, v5p-16). Its chips and hosts come from
the runner's catalog (runner.plan.catalog) where that knows the generation, with the zones replaced by Compute
Engine's; a generation only this slice knows (TPU7x, which the Cloud TPU API does not serve) is built from it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from runner.plan import catalog

_DATA = Path(__file__).with_name("catalog.yaml")
CHIPS_PER_MULTI_HOST_VM = 4  # xpk: every multi-host topology is made of 4-chip VMs


@dataclass(frozen=True)
class Offer:
    """One accelerator type as Compute Engine makes it: a VM of `machine_type`, or `hosts` of them in a group whose
    workload policy names `topology`."""

    accelerator: catalog.AcceleratorType
    machine_type: str
    topology: str | None  # None: a single instance
    zones: tuple[str, ...]

    @property
    def multi_host(self) -> bool:
        return self.topology is not None


@dataclass(frozen=True)
class Boot:
    image: str
    disk_type: str
    disk_size_gb: int
    unconfirmed: tuple[str, ...]  # which of these are the catalog's guesses, not overridden by the environment


class NotOffered(ValueError):
    """A type Compute Engine does not make, with why and what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


@functools.cache
def _raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(_DATA.read_text())
    return data


def generations() -> tuple[str, ...]:
    return tuple(_raw()["generations"])


@functools.cache
def generation(name: str) -> catalog.Generation:
    """The runner's catalog entry for `name` with Compute Engine's zones; built from this slice where the runner's
    catalog does not have it."""
    entry = _raw()["generations"][name]
    zones = tuple(entry["zones"])
    known = catalog.generations().get(name)
    if known is not None:
        return replace(known, single_host_zones=zones, multi_host_zones=zones)
    price = entry.get("price") or {}
    chips = sorted(int(c) for c in entry["machine_types"]) + sorted(int(c) for c in entry["topologies"])
    per_chip = int(entry["cores_per_chip"]) if entry["size_unit"] == "cores" else 1
    return catalog.Generation(
        name=name,
        size_unit=entry["size_unit"],
        cores_per_chip=int(entry["cores_per_chip"]),
        chips_per_host=int(entry["chips_per_host"]),
        single_host_max_chips=max(int(c) for c in entry["machine_types"]),
        sizes=tuple(c * per_chip for c in chips),
        single_host_zones=zones,
        multi_host_zones=zones,
        runtimes=(),  # Compute Engine boots an image, not a Cloud TPU runtime version
        default_runtime="",
        on_demand_price=float(price.get("on_demand") or 0.0),
        spot_price=float(price.get("spot") or 0.0),
        frameworks={
            k: None if v == "ok" else " ".join(str(v["refused"]).split()) for k, v in entry["frameworks"].items()
        },
        tf_family="",
        api_type="",
        quota_prefix="",
        title=entry.get("title") or f"TPU {name}",
        backends=("compute-engine",),
    )


def price_known(name: str) -> bool:
    """Whether the slice or the runner's catalog has a list price for the generation (TPU7x's is unconfirmed)."""
    entry = _raw()["generations"][name]
    if "price" not in entry:
        return name in catalog.generations()
    return entry["price"].get("on_demand") is not None


def offer(type_name: str) -> Offer:
    """How Compute Engine makes `type_name`; NotOffered with why for a type it does not."""
    gen_name, _, size_text = type_name.partition("-")
    gen_name = catalog.aliases().get(gen_name, gen_name)
    raw = _raw()
    if gen_name in (raw.get("not_offered") or {}):
        raise NotOffered(
            f"accelerator.type {type_name!r}: {' '.join(raw['not_offered'][gen_name].split())}",
            "use the tpu-vm backend (the Cloud TPU API) for it",
        )
    if gen_name not in raw["generations"] or not size_text.isdigit():
        offered = ", ".join(generations())
        raise NotOffered(f"accelerator.type {type_name!r}: Compute Engine's TPU VMs are {offered}")
    entry, gen = raw["generations"][gen_name], generation(gen_name)
    size = int(size_text)
    chips = size // gen.cores_per_chip if gen.size_unit == "cores" else size
    machine_types = {int(c): str(m) for c, m in entry["machine_types"].items()}
    topologies = {int(c): str(t) for c, t in entry["topologies"].items()}
    if gen.size_unit == "cores" and size % gen.cores_per_chip:
        raise NotOffered(
            f"accelerator.type {type_name!r}: {gen.title} sizes count TensorCores, {gen.cores_per_chip} a chip"
        )
    if chips in machine_types:
        accel = catalog.AcceleratorType(type_name, gen, chips, 1)
        return Offer(accel, machine_types[chips], None, gen.single_host_zones)
    if chips in topologies:
        hosts = chips // CHIPS_PER_MULTI_HOST_VM
        accel = catalog.AcceleratorType(type_name, gen, chips, hosts)
        return Offer(accel, machine_types[CHIPS_PER_MULTI_HOST_VM], topologies[chips], gen.multi_host_zones)
    unit = gen.cores_per_chip if gen.size_unit == "cores" else 1
    sizes = ", ".join(f"{gen_name}-{c * unit}" for c in sorted({*machine_types, *topologies}))
    raise NotOffered(f"accelerator.type {type_name!r}: {gen.title} comes as {sizes} on Compute Engine")


def boot(environ: dict[str, str] | None = None) -> Boot:
    """The boot image and disk, each overridable by its environment variable."""
    env = os.environ if environ is None else environ
    raw = _raw()["boot"]
    image = env.get(raw["image_env"]) or raw["image"]
    disk_type = env.get(raw["disk_type_env"]) or raw["disk_type"]
    unconfirmed = tuple(
        what
        for what, key in (("boot image", raw["image_env"]), ("boot disk type", raw["disk_type_env"]))
        if not env.get(key)
    )
    return Boot(image, disk_type, int(raw["disk_size_gb"]), unconfirmed)


def all_zones() -> set[str]:
    return {z for name in generations() for z in generation(name).single_host_zones}
