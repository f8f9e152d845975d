"""The gke backend: a run's job as one JobSet on a GKE cluster's TPU node pools (an existing pool, or one per slice
made for the run and deleted with it), through the official clients: `kubernetes` for the cluster,
google-cloud-container for clusters and node pools.

The registry's names (runner.backends): INFO, make(), resolve() (the plan target, target.py, from its catalog slice
catalog.yaml), findings() (the same checks for `runner validate`), sweep() (its part of `runner gc`: labelled
JobSets and node pools of the clusters this machine's runs used) and machine_metadata(). Nothing here imports the
clients until a backend or a sweep is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.backends import BackendInfo
from runner.backends.gke.target import NAME, findings, resolve
from runner.timings import Timings

if TYPE_CHECKING:
    from runner.backends.base import Backend
    from runner.backends.sweep import Sweep
    from runner.plan.planner import Plan

INFO = BackendInfo(NAME, "a JobSet on GKE's TPU node pools", ready="RUNNING")
__all__ = ["INFO", "findings", "machine_metadata", "make", "resolve", "sweep"]


def make(say: Callable[[str], None], timings: Timings, *, process: bool = False) -> Backend[Any]:
    from runner.backends.gke.backend import GkeBackend

    return GkeBackend(say=say, timings=timings)


def sweep(timings: Timings) -> Sweep:
    from runner.backends.gke.sweeper import GkeSweep

    return GkeSweep(timings)


def machine_metadata(plan: Plan) -> tuple[str, dict[str, str], dict[str, str]]:
    from runner.backends.gke.requests import machine_metadata as of

    return of(plan)
