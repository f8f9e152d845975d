"""Backends: how a machine is provisioned, watched and torn down (local emulation; Cloud TPU VMs).

Each backend implements runner.backends.base.Backend; `backend_named` builds one from the name a run record holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.timings import Timings

if TYPE_CHECKING:
    from runner.backends.base import Backend


def backend_named(name: str, say: Callable[[str], None] = print, timings: Timings | None = None) -> Backend[Any]:
    """The backend a run record names ("tpu-vm", else local). Imports only the one asked for."""
    if name == "tpu-vm":
        from runner.backends.tpu_vm import TpuVmBackend

        return TpuVmBackend(say=say, timings=timings or Timings.from_env())
    from runner.backends.local import LocalBackend

    return LocalBackend(say=say)
