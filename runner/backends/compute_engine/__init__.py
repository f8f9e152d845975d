"""The Compute Engine backend: TPU VMs as Compute Engine instances (google-cloud-compute), multi-host slices as
managed instance groups with a workload policy; the way to TPU7x, which the Cloud TPU API does not serve, and a
second way to v6e and v5p.

The registry's names (runner.backends): INFO, make(), resolve() (the plan target from its catalog slice,
target.py and catalog.yaml), findings() (the same checks for `runner validate`) and sweep() (its part of `runner
gc`). Nothing here imports google-cloud-compute until a backend or a sweep is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.backends import BackendInfo
from runner.backends.compute_engine.target import NAME, findings, resolve
from runner.timings import Timings

if TYPE_CHECKING:
    from runner.backends.base import Backend
    from runner.backends.sweep import Sweep
    from runner.plan.planner import Plan

INFO = BackendInfo(NAME, "TPU VMs on Compute Engine (instances and managed instance groups)", ready="RUNNING")
__all__ = ["INFO", "findings", "machine_metadata", "make", "resolve", "sweep"]


def make(say: Callable[[str], None], timings: Timings, *, process: bool = False) -> Backend[Any]:
    from runner.backends.compute_engine.backend import ComputeEngineBackend

    return ComputeEngineBackend(say=say, timings=timings)


def sweep(timings: Timings) -> Sweep:
    from runner.backends.compute_engine.api import ComputeApi
    from runner.backends.compute_engine.sweeper import ComputeSweep

    return ComputeSweep(ComputeApi(timings=timings))


def machine_metadata(plan: Plan) -> tuple[str, dict[str, str], dict[str, str]]:
    """The machine's name in words, its metadata and its labels, as its create request sends them."""
    from runner.backends.compute_engine.requests import machine_metadata as of

    return of(plan)
