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

INFO = BackendInfo(NAME, "Cloud TPU VMs (the Cloud TPU API)")
__all__ = ["INFO", "findings", "make", "resolve", "sweep"]


def make(say: Callable[[str], None], timings: Timings, *, process: bool = False) -> Backend[Any]:
    from runner.backends.tpu_vm.backend import TpuVmBackend

    return TpuVmBackend(say=say, timings=timings)


def sweep(timings: Timings) -> Sweep:
    from runner.backends.tpu_vm.api import TpuApi
    from runner.backends.tpu_vm.sweeper import TpuVmSweep

    return TpuVmSweep(TpuApi(timings=timings))
