"""The TPU VM backend: Cloud TPU VMs through the Cloud TPU API (google-cloud-tpu), as nodes, queued resources or
an attached node.

The registry's names (runner.backends): INFO, make(), resolve() (the plan target from its catalog slice,
target.py), findings() (the same checks for `runner validate`) and sweep() (its part of `runner gc`). Nothing
here imports google-cloud-tpu until a backend or a sweep is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.backends import BackendInfo
from runner.backends.tpu_vm.target import NAME, findings, resolve
from runner.timings import Timings

if TYPE_CHECKING:
    from runner.backends.base import Backend
    from runner.backends.sweep import Sweep
    from runner.plan.planner import Plan

INFO = BackendInfo(NAME, "Cloud TPU VMs (the Cloud TPU API)")
__all__ = ["INFO", "findings", "machine_metadata", "make", "resolve", "sweep"]


def make(say: Callable[[str], None], timings: Timings, *, process: bool = False) -> Backend[Any]:
    from runner.backends.tpu_vm.backend import TpuVmBackend

    return TpuVmBackend(say=say, timings=timings)


def sweep(timings: Timings) -> Sweep:
    from runner.backends.tpu_vm.api import TpuApi
    from runner.backends.tpu_vm.sweeper import TpuVmSweep

    return TpuVmSweep(TpuApi(timings=timings))


def machine_metadata(plan: Plan) -> tuple[str, dict[str, str], dict[str, str]]:
    """The machine's name in words, its metadata and its labels, as its create request sends them."""
    from runner.backends.tpu_vm.requests import machine_metadata as of

    return of(plan)
