"""What Cloud TPU offers, read from runner/plan/tpu_catalog.yaml: types, chips, TensorCores, hosts, zones, runtimes,
prices, and which backends create each generation (the default first).

The planner asks it whether a job can run where it was sent (before any API call); the TPU API emulator asks it
what to accept, so the emulator and the runner never disagree about what exists.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_DATA = Path(__file__).with_name("tpu_catalog.yaml")
_TF_RUNTIME = re.compile(r"tpu-vm-tf-(?P<version>\d+\.\d+\.\d+)(?P<pod>-pod)?(?:-pjrt|-se)?(?P<family>-v[-a-z0-9]+)?")
_TYPE_RE = re.compile(r"^(?P<gen>[a-z][a-z0-9]*)-(?P<size>[0-9]+)$")  # the generations are the catalog's


class CatalogError(ValueError):
    """An accelerator type, zone or runtime the catalog does not know."""


@dataclass(frozen=True)
class Generation:
    name: str
    size_unit: str  # "cores" or "chips": what the number in the type name counts
    cores_per_chip: int  # TensorCores
    chips_per_host: int
    single_host_max_chips: int
    sizes: tuple[int, ...]
    single_host_zones: tuple[str, ...]
    multi_host_zones: tuple[str, ...]
    on_demand_price: float  # USD per chip-hour; 0.0 where the catalog has no price (`priced` is False)
    spot_price: float
    frameworks: dict[str, str | None]  # framework -> None when supported, else why it is refused (with sources)
    backends: tuple[str, ...]  # the runner's backends that create it; the first is the default (`backend: auto`)
    jax_devices_per_chip: int = 1  # what jax.devices() counts per chip: 1 where two TensorCores act as one (megacore)
    priced: bool = True  # False: no public price is known (the plan says so, a budget cannot be applied)
    backends_note: str = ""  # why the backends it is not offered by cannot create it
    topologies: dict[int, str] = field(default_factory=dict)  # size -> chip topology (2x2x2), where the catalog has it
    runtimes: tuple[str, ...] = ()  # regular expressions (the Cloud TPU API's runtime versions)
    default_runtime: str = ""
    tf_family: str = ""  # the chip-family suffix of its TensorFlow >= 2.18 runtimes
    api_type: str = ""  # AcceleratorConfig.Type in the Cloud TPU API (V5LITE_POD, ...)
    quota_prefix: str = ""  # how Cloud TPU names this generation's quotas (TPUV5sLitepod...)
    provisioning: str | None = None  # "node" | "queued" when a source says this generation needs one; None: by hosts
    title: str = ""  # how people name it: "TPU v5e", "TPU7x (Ironwood)"

    @property
    def in_tpu_api(self) -> bool:
        """Whether the Cloud TPU API serves it (it has an AcceleratorConfig.Type there): not TPU7x and later."""
        return bool(self.api_type)


@dataclass(frozen=True)
class AcceleratorType:
    name: str
    generation: Generation
    chips: int
    hosts: int

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def tensorcores(self) -> int:
        return self.chips * self.generation.cores_per_chip

    @property
    def jax_devices(self) -> int:
        """The devices jax.devices() lists on the whole slice (per slice of a multislice)."""
        return self.chips * self.generation.jax_devices_per_chip

    @property
    def topology(self) -> str | None:
        """The chip topology (2x2x2) where the catalog has it."""
        size = self.chips * self.generation.cores_per_chip if self.generation.size_unit == "cores" else self.chips
        return self.generation.topologies.get(size)

    @property
    def zones(self) -> tuple[str, ...]:
        g = self.generation
        return g.multi_host_zones if self.multi_host else g.single_host_zones

    def price_per_hour(self, *, spot: bool) -> float:
        g = self.generation
        return round(self.chips * (g.spot_price if spot else g.on_demand_price), 4)

    def runtime_problem(self, runtime: str) -> str | None:
        """Why `runtime` does not run on this type, or None."""
        g = self.generation
        if not any(re.fullmatch(pattern, runtime) for pattern in g.runtimes):
            return f"{g.name} takes {', '.join(g.runtimes)}"
        tf = _TF_RUNTIME.fullmatch(runtime)
        if tf is None:
            return None
        # TensorFlow runtimes come in a single-host and a pod (-pod-) flavour; the wrong one does not boot.
        if (tf["pod"] is not None) != self.multi_host:
            return f"{self.name} is {'multi' if self.multi_host else 'single'}-host: it needs a " + (
                "-pod- TensorFlow runtime" if self.multi_host else "TensorFlow runtime without -pod"
            )
        family = f"-{g.tf_family}"
        if tf_version(runtime) >= (2, 18) and tf["family"] != family:
            return f"TensorFlow 2.18 and later name the chip family: {g.name} takes ...-pjrt{family}"
        if tf_version(runtime) < (2, 18) and tf["family"]:
            return "chip-family suffixes only exist from TensorFlow 2.18 on"
        return None

    def runtime_ok(self, runtime: str) -> bool:
        return self.runtime_problem(runtime) is None

    @property
    def provisioning(self) -> str:
        """What `accelerator.provisioning: auto` means for this type: the generation's own rule when the catalog
        documents one, else a queued resource for a multi-host slice (the queue waits out a stockout of many hosts
        at once, and Cloud TPU's own multi-host guides create slices that way) and a node otherwise."""
        return self.generation.provisioning or ("queued" if self.multi_host else "node")


@functools.cache
def _raw() -> dict[str, Any]:
    return yaml.safe_load(_DATA.read_text())


@functools.cache
def generations() -> dict[str, Generation]:
    out = {}
    for name, g in _raw()["generations"].items():
        price = g.get("price") or {}
        out[name] = Generation(
            name=name,
            size_unit=g["size_unit"],
            cores_per_chip=g["cores_per_chip"],
            chips_per_host=g["chips_per_host"],
            single_host_max_chips=g.get("single_host_max_chips", g["chips_per_host"]),
            sizes=tuple(g["sizes"]),
            single_host_zones=tuple(g["zones"]["single_host"]),
            multi_host_zones=tuple(g["zones"]["multi_host"]),
            on_demand_price=float(price.get("on_demand") or 0.0),
            spot_price=float(price.get("spot") or 0.0),
            frameworks={k: None if v == "ok" else str(v["refused"]).strip() for k, v in g["frameworks"].items()},
            backends=tuple(g["backends"]),
            jax_devices_per_chip=g["jax_devices_per_chip"],
            priced=bool(price),
            backends_note=" ".join(str(g.get("backends_note") or "").split()),
            topologies={int(k): str(v) for k, v in (g.get("topologies") or {}).items()},
            runtimes=tuple(g.get("runtimes") or ()),
            default_runtime=g.get("default_runtime") or "",
            tf_family=g.get("tf_family") or "",
            api_type=g.get("api_type") or "",
            quota_prefix=g.get("quota_prefix") or "",
            provisioning=g.get("provisioning"),
            title=g.get("title") or f"TPU {name}",
        )
    return out


def tf_version(runtime: str) -> tuple[int, ...]:
    """(major, minor) of a tpu-vm-tf-X.Y.Z runtime; () for any other."""
    match = _TF_RUNTIME.fullmatch(runtime)
    return tuple(int(part) for part in match["version"].split(".")[:2]) if match else ()


def aliases() -> dict[str, str]:
    """What users type for a generation (v5e) -> the catalog's name (v5litepod)."""
    return dict(_raw().get("aliases") or {})


def tensorflow_pod_bug(runtime: str) -> str | None:
    """An open TensorFlow bug of this multi-host runtime's version (the plan warns), or None."""
    version = ".".join(map(str, tf_version(runtime)))
    return (_raw().get("tensorflow_pod_bugs") or {}).get(version)


def prices_info() -> dict[str, str]:
    p = _raw()["prices"]
    return {"currency": p["currency"], "unit": p["unit"], "read_on": str(p["read_on"]), "source": p["source"]}


def accelerator(name: str) -> AcceleratorType:
    """The type named like v2-8, v4-32, v5litepod-8, v6e-16. Raises CatalogError for an unknown one."""
    match = _TYPE_RE.match(name)
    gens = generations()
    if not match or match["gen"] not in gens:
        raise CatalogError(f"unknown TPU type {name!r}; known generations: {', '.join(gens)}")
    g = gens[match["gen"]]
    size = int(match["size"])
    if size not in g.sizes:
        raise CatalogError(f"{name!r}: {g.name} comes in sizes {', '.join(f'{g.name}-{s}' for s in g.sizes)}")
    chips = size // g.cores_per_chip if g.size_unit == "cores" else size
    hosts = 1 if chips <= g.single_host_max_chips else chips // g.chips_per_host
    return AcceleratorType(name, g, chips, hosts)


def all_types() -> list[AcceleratorType]:
    return [accelerator(f"{g.name}-{size}") for g in generations().values() for size in g.sizes]
